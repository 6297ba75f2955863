//! The permitd processes of a run: each the test build's binary on its own 127.0.0.1 port and
//! its own `--dir` (through `common::Server`), killed with `kill -9` and restarted on the same
//! directory (or an emptied one), or frozen with SIGSTOP and thawed with SIGCONT.
//!
//! The ports are chosen before any node starts, so that a cluster's nodes can be told each
//! other's addresses: the cluster version adds its options (node id, peers) to `args` from
//! [`Nodes::start`]'s port list, and nothing else changes.

use std::fs;
use std::net::SocketAddr;

use crate::common::{free_port, Server};

pub struct Nodes {
    nodes: Vec<Server>,
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
                Ok(nodes) => return Nodes { nodes },
                Err(e) => last_err = e,
            }
        }
        panic!("the nodes did not start: {last_err}");
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
        self.nodes[i].restart();
    }

    /// Empties node `i`'s data directory, while it is down: a node that lost its disk.
    pub fn wipe(&mut self, i: usize) {
        let dir = self.nodes[i].dir();
        fs::remove_dir_all(dir).expect("remove the data directory");
        fs::create_dir_all(dir).expect("create the data directory");
    }

    /// Freezes node `i` (SIGSTOP): its sockets stay open and nothing answers.
    pub fn pause(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    /// Thaws node `i` (SIGCONT).
    pub fn resume(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    fn signal(&self, i: usize, sig: libc::c_int) {
        let pid = self.nodes[i].pid().expect("node is not running");
        // SAFETY: kill(2) with a pid this harness spawned and still owns (not reaped).
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }
}

/// `count` distinct ports that were free a moment ago.
fn free_ports(count: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(count);
    while ports.len() < count {
        let p = free_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}
