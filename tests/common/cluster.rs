//! Cluster mode's helpers: permitd processes on 127.0.0.1 forming a cluster with
//! `--cluster-init`, and waiting until every live one names the same leader.

use std::time::{Duration, Instant};

use redis::Value;

use super::*;

/// Within this an election settles, with room for a loaded machine.
pub const SETTLE: Duration = Duration::from_secs(30);

pub struct Member {
    pub id: u64,
    pub cluster_port: u16,
    pub server: Server,
    /// Its options without `--cluster-init`: what it restarts with (membership lives in its
    /// log).
    pub args: Vec<String>,
}

/// Starts a cluster: node `i` (id `i + 1`) on client port `ports[i].0` and cluster port
/// `ports[i].1`, with `extra(i)` besides its id and cluster port. Nodes 2 and up start first
/// and wait to be contacted; node 1 then forms the cluster with `--cluster-init` naming all.
/// The error is the first node's that did not start (with its log).
pub fn start_cluster(
    ports: &[(u16, u16)],
    extra: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Member>, String> {
    let named: Vec<u16> = ports.iter().map(|&(p, _)| p).collect();
    start_cluster_naming(ports, &named, extra)
}

/// [`start_cluster`] with `--cluster-init` naming client port `named[i]` for node `i`, which
/// may not be the one it listens on (a mistake in the list, say).
pub fn start_cluster_naming(
    ports: &[(u16, u16)],
    named: &[u16],
    extra: impl Fn(usize) -> Vec<String>,
) -> Result<Vec<Member>, String> {
    let init = ports
        .iter()
        .zip(named)
        .enumerate()
        .map(|(i, ((_, c), p))| format!("{}=127.0.0.1:{p}@{c}", i + 1))
        .collect::<Vec<_>>()
        .join(",");
    let mut members = Vec::new();
    for i in (1..ports.len()).chain([0]) {
        let id = i as u64 + 1;
        let (port, cport) = ports[i];
        let mut own = vec![
            "--cluster-node-id".to_string(),
            id.to_string(),
            "--cluster-port".into(),
            cport.to_string(),
        ];
        own.extend(extra(i));
        let mut a = own.clone();
        if id == 1 {
            a.extend(["--cluster-init".to_string(), init.clone()]);
        }
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let server = Server::start_at(port, &a).map_err(|e| format!("node {id}: {e}"))?;
        members.push(Member {
            id,
            cluster_port: cport,
            server,
            args: own,
        });
    }
    members.sort_by_key(|m| m.id);
    Ok(members)
}

/// Starts a cluster of three nodes ([`start_cluster`]).
pub fn three_nodes() -> Vec<Member> {
    three_nodes_with(&[])
}

/// [`three_nodes`] with `extra` options on every node.
pub fn three_nodes_with(extra: &[&str]) -> Vec<Member> {
    let ports = free_ports(6);
    let pairs: Vec<(u16, u16)> = (0..3).map(|i| (ports[i], ports[3 + i])).collect();
    start_cluster(&pairs, |_| extra.iter().map(|s| s.to_string()).collect())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The client port of the master `CLUSTER SLOTS` names on `server`, if it names one.
pub fn slots_master_port(server: &Server) -> Option<i64> {
    let mut con = server.client().get_connection().ok()?;
    let Ok(Value::Array(ranges)) = call(&mut con, &["CLUSTER", "SLOTS"]) else {
        return None;
    };
    let Some(Value::Array(range)) = ranges.first() else {
        return None;
    };
    match range.get(2) {
        Some(Value::Array(master)) => match master.get(1) {
            Some(Value::Int(port)) => Some(*port),
            _ => None,
        },
        _ => None,
    }
}

pub fn role(server: &Server) -> String {
    // A node may refuse connections for a moment (a restart): not a master, then.
    let Ok(mut con) = server.client().get_connection() else {
        return "unreachable".into();
    };
    match call(&mut con, &["ROLE"]) {
        Ok(Value::Array(items)) => items.first().map(text).unwrap_or_default(),
        other => format!("{other:?}"),
    }
}

/// The leader every live node agrees on, once they do: its index in `members`.
pub fn agreed_leader(members: &[Member], live: &[usize]) -> Option<usize> {
    let masters: Vec<usize> = live
        .iter()
        .copied()
        .filter(|&i| role(&members[i].server) == "master")
        .collect();
    let [leader] = masters[..] else {
        return None;
    };
    let port = i64::from(members[leader].server.port());
    live.iter()
        .all(|&i| slots_master_port(&members[i].server) == Some(port))
        .then_some(leader)
}

pub fn wait_for_leader(members: &[Member], live: &[usize]) -> usize {
    let mut found = None;
    let agreed = wait_until(SETTLE, || {
        found = agreed_leader(members, live);
        found.is_some()
    });
    assert!(
        agreed,
        "no leader all of {live:?} agree on; roles: {:?}",
        live.iter()
            .map(|&i| role(&members[i].server))
            .collect::<Vec<_>>()
    );
    found.expect("found with agreed")
}

/// Runs `args` on `server`, retrying while the node answers TRYAGAIN (a new leader whose
/// shards have not taken over yet: nothing ran), until it answers otherwise, as cluster
/// clients do.
pub fn run_ready(server: &Server, args: &[&str]) -> redis::RedisResult<Value> {
    run_ready_at(server.addr(), args)
}

/// [`run_ready`] on the node at `addr`.
pub fn run_ready_at(addr: std::net::SocketAddr, args: &[&str]) -> redis::RedisResult<Value> {
    let mut con = connect_url(&format!("redis://{addr}"));
    let deadline = Instant::now() + SETTLE;
    loop {
        match call(&mut con, args) {
            Err(e) if e.code() == Some("TRYAGAIN") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            other => return other,
        }
    }
}

/// [`run_ready`] for a command that must succeed.
pub fn ok_ready(server: &Server, args: &[&str]) -> Value {
    run_ready(server, args).unwrap_or_else(|e| panic!("{args:?}: {e:?}"))
}
