//! The permitd processes of a run: each the test build's binary on its own 127.0.0.1 port and
//! its own `--dir` (through `common::Server`), killed with `kill -9` and restarted on the same
//! directory (or an emptied one), or frozen with SIGSTOP and thawed with SIGCONT.
//!
//! The ports are chosen before any node starts, so that a cluster's nodes can be told each
//! other's addresses ([`Nodes::cluster`]).

use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use super::proxy::Proxy;
use crate::common::cluster::start_cluster;
use crate::common::{free_ports, RawConn, Resp, Server};

pub struct Nodes {
    nodes: Vec<Server>,
    /// Cluster mode: each node's options without `--cluster-init`, which only the first start
    /// of the first node takes (membership then lives in the log).
    cluster_args: Option<Vec<Vec<String>>>,
    /// Cluster mode behind proxies: node `i`'s cluster port is reached through `peers[i]`,
    /// and it dials its peers from `peer_ips[i]`.
    peers: Vec<Proxy>,
    peer_ips: Vec<IpAddr>,
}

impl Nodes {
    /// Starts `count` nodes, with `args` after the harness's own options. A port taken by
    /// another process between choosing and binding fails a start: all are then chosen again.
    pub fn start(count: usize, args: &[&str]) -> Nodes {
        let mut last_err = String::new();
        for _ in 0..3 {
            let ports = free_ports(count);
            let started: Result<Vec<Server>, String> = ports
                .iter()
                .map(|&port| Server::start_at(port, args))
                .collect();
            match started {
                Ok(nodes) => {
                    return Nodes {
                        nodes,
                        cluster_args: None,
                        peers: Vec::new(),
                        peer_ips: Vec::new(),
                    }
                }
                Err(e) => last_err = e,
            }
        }
        panic!("the nodes did not start: {last_err}");
    }

    /// Starts a cluster of `count` nodes (ids 1..=count, each with a cluster port of its own;
    /// the first forms the cluster with `--cluster-init`, after the others started), with
    /// `args` after the harness's own options, and waits until they agree on a leader.
    pub fn cluster(count: usize, args: &[&str]) -> Nodes {
        Nodes::form(count, args, false)
    }

    /// [`Nodes::cluster`] with every node's cluster port behind a proxy of its own, each node
    /// dialing its peers from an address of its own (127.0.0.2, .3, ...: `--cluster-bind`), so
    /// that a node's links can be delayed, partitioned and cut ([`Nodes::isolate`]).
    pub fn cluster_behind_proxies(count: usize, args: &[&str]) -> Nodes {
        Nodes::form(count, args, true)
    }

    fn form(count: usize, args: &[&str], proxied: bool) -> Nodes {
        let mut last_err = String::new();
        for _ in 0..3 {
            let ports = free_ports(2 * count);
            let pairs: Vec<(u16, u16)> = (0..count).map(|i| (ports[i], ports[count + i])).collect();
            let peer_ips: Vec<IpAddr> = match proxied {
                true => (0..count)
                    .map(|i| [127, 0, 0, i as u8 + 2].into())
                    .collect(),
                false => Vec::new(),
            };
            let peers: Vec<Proxy> = peer_ips
                .iter()
                .zip(&pairs)
                .map(|(&ip, &(_, cport))| Proxy::start_on(cport, SocketAddr::new(ip, cport)))
                .collect();
            let extra = |i: usize| {
                let mut a: Vec<String> = args.iter().map(|s| s.to_string()).collect();
                if let Some(ip) = peer_ips.get(i) {
                    a.extend(["--cluster-bind".into(), ip.to_string()]);
                }
                a
            };
            match start_cluster(&pairs, extra) {
                Ok(members) => {
                    let (nodes, own) = members.into_iter().map(|m| (m.server, m.args)).unzip();
                    let nodes = Nodes {
                        nodes,
                        cluster_args: Some(own),
                        peers,
                        peer_ips,
                    };
                    nodes.wait_for_leader();
                    return nodes;
                }
                Err(e) => last_err = e,
            }
        }
        panic!("the cluster did not start: {last_err}");
    }

    /// The proxy in front of node `i`'s cluster port (what its peers send it, and its answers).
    pub fn peer_proxy(&self, i: usize) -> &Proxy {
        &self.peers[i]
    }

    /// Cuts node `i` off from every peer, both ways: its cluster port refuses everyone, and the
    /// others' refuse it. Its clients still reach it.
    pub fn isolate(&self, i: usize) {
        for (j, p) in self.peers.iter().enumerate() {
            p.cut(if j == i { None } else { Some(self.peer_ips[i]) });
        }
    }

    /// Ends every fault of the peer links.
    pub fn heal_peers(&self) {
        for p in &self.peers {
            p.heal();
        }
    }

    /// Every node's client address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(Server::addr).collect()
    }

    /// The node that says it leads (`ROLE` master), if exactly one of those answering does.
    pub fn leader(&self) -> Option<usize> {
        match self.masters()[..] {
            [one] => Some(one),
            _ => None,
        }
    }

    /// The nodes that say they lead (`ROLE` master): one, but a deposed leader that has not
    /// heard of its successor yet says so too.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                let Ok(mut c) = RawConn::try_connect(self.addr(i)) else {
                    return false;
                };
                let _ = c.stream().set_read_timeout(Some(Duration::from_secs(2)));
                let role = c.send_cmd(&[b"ROLE"]).and_then(|()| c.read_reply());
                matches!(role, Ok(Resp::Array(Some(items)))
                    if items.first() == Some(&Resp::Bulk(Some(b"master".to_vec()))))
            })
            .collect()
    }

    /// Waits (up to 30 s) until one node leads; its index.
    pub fn wait_for_leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(l) = self.leader() {
                return l;
            }
            assert!(Instant::now() < deadline, "no leader within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The lines of node `i`'s log that hold one of `words`.
    pub fn log_lines_with(&self, i: usize, words: &[&str]) -> String {
        self.nodes[i].log_lines_with(words)
    }

    /// Node `i`'s client address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].addr()
    }

    /// `kill -9` of node `i`: no chance to flush anything.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
    }

    /// Starts node `i` again on its port and directory, and waits until it answers.
    pub fn restart(&mut self, i: usize) {
        match &self.cluster_args {
            Some(own) => {
                let a: Vec<&str> = own[i].iter().map(String::as_str).collect();
                self.nodes[i].restart_with(&a);
            }
            None => self.nodes[i].restart(),
        }
    }

    /// Node `i`'s data directory.
    pub fn dir(&self, i: usize) -> &std::path::Path {
        self.nodes[i].dir()
    }

    /// Waits up to `timeout` for node `i` to exit by itself; how it exited.
    pub fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<std::process::ExitStatus> {
        self.nodes[i].wait_exit(timeout)
    }

    /// Empties node `i`'s data directory, while it is down: a node that lost its disk.
    pub fn wipe(&mut self, i: usize) {
        let dir = self.nodes[i].dir();
        fs::remove_dir_all(dir).expect("remove the data directory");
        fs::create_dir_all(dir).expect("create the data directory");
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open and nothing answers.
    pub fn pause(&self, i: usize) {
        self.nodes[i].signal(libc::SIGSTOP);
    }

    /// Thaws node `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.nodes[i].signal(libc::SIGCONT);
    }
}
