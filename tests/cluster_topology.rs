//! Cluster mode's topology over the wire (SPEC §10): three permitd processes on 127.0.0.1 form
//! a cluster with `--cluster-init`, elect a leader, and every node's `ROLE` and `CLUSTER SLOTS`
//! name the same leader; after the leader is killed the survivors name a new one, a restarted
//! node follows it with its usual options only, and `SHUTDOWN` on the leader hands leadership
//! over; a node behind a port mapping is announced everywhere at its `--cluster-announce`
//! address; a node restarted while its peers are down knows no leader, nor does one whose
//! leader and other peer stopped; the leader shows a follower that stopped answering as
//! failed, and lists it again once it answers; a node's `--dir` is refused to a single node
//! and to another node id; a follower past `--maxmemory` redirects. Bounds are generous
//! (elections start 0.9-1.2 s after a leader dies; a loaded 2-core box is slower).

mod cluster_harness;
mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cluster_harness::proxy::Proxy;
use common::cluster::*;
use common::*;
use redis::Value;

#[test]
fn three_nodes_agree_on_one_leader_and_follow_a_new_one_after_it_dies() {
    let mut members = three_nodes();
    let all = [0, 1, 2];
    let first = wait_for_leader(&members, &all);

    // Each node has its own stable 40-hex id, and the followers say `slave`.
    let ids: Vec<String> = members
        .iter()
        .map(|m| text(&call(&mut m.server.conn(), &["CLUSTER", "MYID"]).unwrap()))
        .collect();
    assert!(ids.iter().all(|id| id.len() == 40), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
    assert_ne!(ids[1], ids[2]);
    for i in all.iter().filter(|&&i| i != first) {
        assert_eq!(role(&members[*i].server), "slave");
        let info = text(&call(&mut members[*i].server.conn(), &["CLUSTER", "INFO"]).unwrap());
        assert!(info.contains("cluster_state:ok"), "{info}");
    }

    // INFO # Raft tells the same story on every node.
    let leader_id = members[first].id.to_string();
    for (i, m) in members.iter().enumerate() {
        let info = text(&call(&mut m.server.conn(), &["INFO", "raft"]).unwrap());
        let want_role = if i == first { "leader" } else { "follower" };
        assert!(
            info.contains(&format!("raft_node_id:{}\r\n", m.id)),
            "{info}"
        );
        assert!(
            info.contains(&format!("raft_role:{want_role}\r\n")),
            "{info}"
        );
        assert!(
            info.contains(&format!("raft_leader_id:{leader_id}\r\n")),
            "{info}"
        );
        assert!(info.contains("raft_peers:2\r\n"), "{info}");
        for other in members.iter().filter(|o| o.id != m.id) {
            let line = format!(
                "raft_peer{}:addr=127.0.0.1:{},",
                other.id, other.cluster_port
            );
            assert!(info.contains(&line), "{line} in {info}");
        }
    }
    let info = text(&call(&mut members[first].server.conn(), &["INFO", "raft"]).unwrap());
    assert!(info.contains(",match="), "{info}");

    // Namespace commands: a follower sends them to the leader with their key's slot (as
    // CLUSTER KEYSLOT computes it; 0 for keyless NS.LIST) and runs nothing, also inside MULTI;
    // the leader runs them; the Redis surface is served everywhere.
    let leader_addr = format!("127.0.0.1:{}", members[first].server.port());
    for i in all.iter().copied().filter(|&i| i != first) {
        let mut con = members[i].server.conn();
        let slot: i64 =
            redis::from_redis_value(call(&mut con, &["CLUSTER", "KEYSLOT", "team"]).unwrap())
                .unwrap();
        let err = call(&mut con, &["NS.CREATE", "team"]).unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err:?}");
        assert_eq!(err.detail(), Some(format!("{slot} {leader_addr}").as_str()));
        let err = call(&mut con, &["NS.LIST"]).unwrap_err();
        assert_eq!(err.detail(), Some(format!("0 {leader_addr}").as_str()));
        assert_eq!(text(&call(&mut con, &["MULTI"]).unwrap()), "OK");
        let err = call(&mut con, &["SEM.GET", "team", "s"]).unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err:?}");
        let err = call(&mut con, &["EXEC"]).unwrap_err();
        assert_eq!(err.code(), Some("EXECABORT"), "{err:?}");
        assert_eq!(text(&call(&mut con, &["PING"]).unwrap()), "PONG");
    }
    // The leader runs them.
    let mut con = members[first].server.conn();
    let created = wait_until(SETTLE, || call(&mut con, &["NS.CREATE", "team"]).is_ok());
    assert!(created, "{:?}", call(&mut con, &["NS.CREATE", "team"]));

    // The leader dies: the other two agree on a new one.
    members[first].server.kill9();
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != first).collect();
    let second = wait_for_leader(&members, &live);
    assert_ne!(second, first);

    // The old leader comes back with its usual options only (no --cluster-init: membership
    // lives in its log) and follows the new leader.
    let back = members[first].args.clone();
    let back: Vec<&str> = back.iter().map(String::as_str).collect();
    members[first].server.restart_with(&back);
    assert_eq!(wait_for_leader(&members, &all), second);
}

#[test]
fn a_node_restarted_while_its_peers_are_down_knows_no_leader_until_one_is_elected() {
    let mut members = three_nodes();
    let all = [0, 1, 2];
    let first = wait_for_leader(&members, &all);
    let mut con = members[first].server.conn();
    let created = wait_until(SETTLE, || call(&mut con, &["NS.CREATE", "team"]).is_ok());
    assert!(created, "{:?}", call(&mut con, &["NS.CREATE", "team"]));
    for m in members.iter_mut() {
        m.server.kill9();
    }
    // One node comes back alone: the vote in its log names the old leader, which is gone.
    let (alone, second) = ((first + 1) % 3, (first + 2) % 3);
    let restart = |m: &mut Member| {
        let args = m.args.clone();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        m.server.restart_with(&args);
    };
    restart(&mut members[alone]);
    for _ in 0..2 {
        let mut con = members[alone].server.conn();
        let err = call(&mut con, &["NS.GET", "team"]).unwrap_err();
        assert_eq!(err.code(), Some("CLUSTERDOWN"), "{err:?}");
        let info = text(&call(&mut con, &["CLUSTER", "INFO"]).unwrap());
        assert!(info.contains("cluster_state:fail"), "{info}");
        // Longer than an election timeout: it stood for election and could not win alone.
        std::thread::sleep(Duration::from_millis(1200));
    }
    // A second node back: a quorum elects a leader, which serves what was committed before.
    restart(&mut members[second]);
    let leader = wait_for_leader(&members, &[alone, second]);
    let mut con = members[leader].server.conn();
    let served = wait_until(SETTLE, || call(&mut con, &["NS.GET", "team"]).is_ok());
    assert!(served, "{:?}", call(&mut con, &["NS.GET", "team"]));
}

#[test]
fn shutdown_on_the_leader_hands_leadership_to_another_node() {
    let mut members = three_nodes();
    let all = [0, 1, 2];
    let first = wait_for_leader(&members, &all);
    let mut con = members[first].server.conn();
    // The connection closes as the server stops, without a reply.
    let _ = call(&mut con, &["SHUTDOWN", "NOSAVE"]);
    let exited = members[first].server.wait_exit(SETTLE);
    assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
    // It stopped only once another node led: it handed leadership over, it did not leave the
    // cluster to an election.
    let log = members[first].server.log_contents();
    assert!(log.contains("handing leadership over"), "{log}");
    assert!(!log.contains("stopping anyway"), "{log}");
    let live: Vec<usize> = all.iter().copied().filter(|&i| i != first).collect();
    let second = wait_for_leader(&members, &live);
    assert_ne!(second, first);
}

#[test]
fn a_single_node_has_no_raft_section_and_refuses_cluster_options_without_a_node_id() {
    let server = Server::start();
    let info = text(&call(&mut server.conn(), &["INFO", "everything"]).unwrap());
    assert!(!info.contains("# Raft"), "{info}");
    let (status, log) = Server::refused(&["--cluster-init", "1=127.0.0.1:7001"]);
    assert!(!status.success());
    assert!(
        log.contains("--cluster-init needs --cluster-node-id"),
        "{log}"
    );
}

/// Every path under `dir` with its size and modification time: what a start wrote there.
fn tree(dir: &std::path::Path) -> Vec<(std::path::PathBuf, u64, std::time::SystemTime)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for item in std::fs::read_dir(&d).unwrap() {
            let path = item.unwrap().path();
            let meta = std::fs::metadata(&path).unwrap();
            if meta.is_dir() {
                todo.push(path.clone());
            }
            out.push((path, meta.len(), meta.modified().unwrap()));
        }
    }
    out.sort();
    out
}

/// A cluster node's `--dir` is that node's (SPEC §10: ids are unique, never reused). Started
/// without its cluster options it is refused, naming the node, instead of serving as an empty
/// single node whose writes never reach the cluster; started under another id it is refused;
/// both before anything is written to it, and the node then starts with its usual options, its
/// data there. A `raft/` made before nodes recorded their id (no `raft/node-id`) is taken as the
/// id given, which is then recorded.
#[test]
fn a_cluster_nodes_dir_is_refused_without_its_cluster_options_and_under_another_id() {
    let ports = free_ports(2);
    let mut members =
        start_cluster(&[(ports[0], ports[1])], |_| Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    wait_for_leader(&members, &[0]);
    ok_ready(&members[0].server, &["NS.CREATE", "kept"]);
    let args = members[0].args.clone();
    let own: Vec<&str> = args.iter().map(String::as_str).collect();
    let five: Vec<&str> = own
        .iter()
        .map(|&a| if a == "1" { "5" } else { a })
        .collect();
    assert_eq!(five[..2], ["--cluster-node-id", "5"]);
    let id_file = members[0].server.dir().join("raft").join("node-id");
    assert!(id_file.is_file(), "node 1 did not record its id");
    let refused = |server: &mut Server, args: &[&str], why: &str| {
        server.kill9();
        let before = tree(server.dir());
        let (status, err) = server.refused_restart_with(args);
        assert!(!status.success(), "{args:?}: {status}");
        assert!(err.contains(why), "{args:?}: {err}");
        assert_eq!(
            tree(server.dir()),
            before,
            "{args:?}: the refused start wrote to its --dir"
        );
    };
    let server = &mut members[0].server;
    refused(
        server,
        &[],
        "belongs to cluster node 1 (its Raft log is in ",
    );
    refused(
        server,
        &[],
        "start it with its cluster options (--cluster-node-id 1 ...)",
    );
    refused(server, &five, "belongs to cluster node 1, not 5");
    server.restart_with(&own);
    wait_for_leader(&members, &[0]);
    // The leader is known before its shards serve (TRYAGAIN until they took over).
    ok_ready(&members[0].server, &["NS.GET", "kept"]);
    // A node's dir from before ids were recorded.
    let server = &mut members[0].server;
    server.kill9();
    std::fs::remove_file(&id_file).unwrap();
    refused(
        server,
        &[],
        "belongs to a cluster node (its Raft log is in ",
    );
    server.restart_with(&own);
    assert!(
        id_file.is_file(),
        "node 1 did not record its id in its old dir"
    );
    wait_for_leader(&members, &[0]);
    // The leader is known before its shards serve (TRYAGAIN until they took over).
    ok_ready(&members[0].server, &["NS.GET", "kept"]);
    refused(
        &mut members[0].server,
        &five,
        "belongs to cluster node 1, not 5",
    );
}

/// A single node's `--dir` started with cluster options is refused (its data would be set
/// aside) and left a single node's: it starts again without them, its data there.
#[test]
fn a_single_nodes_dir_refused_to_cluster_mode_stays_a_single_nodes() {
    let mut server = Server::start();
    ok(&mut server.conn(), &["NS.CREATE", "kept"]);
    let (status, err) = server.refused_restart_with(&["--cluster-node-id", "1"]);
    assert!(!status.success());
    assert!(err.contains("holds a single node's data"), "{err}");
    assert!(
        !server.dir().join("raft").exists(),
        "the refused start left a raft/"
    );
    server.restart();
    ok(&mut server.conn(), &["NS.GET", "kept"]);
}

#[test]
fn the_leader_shows_a_follower_that_stopped_answering_as_failed_until_it_answers_again() {
    let members = three_nodes();
    let all = [0, 1, 2];
    let first = wait_for_leader(&members, &all);
    let (up, frozen) = ((first + 1) % 3, (first + 2) % 3);
    let leader = &members[first].server;
    let frozen_id = text(&call(&mut members[frozen].server.conn(), &["CLUSTER", "MYID"]).unwrap());
    let frozen_at = format!("127.0.0.1:{}", members[frozen].server.port());
    let up_at = format!("127.0.0.1:{}", members[up].server.port());
    let replicas = || -> Vec<String> {
        slots_nodes(leader)
            .into_iter()
            .skip(1)
            .map(|(at, _)| at)
            .collect()
    };
    let raft_peer = |m: &Member| {
        let info = text(&call(&mut leader.conn(), &["INFO", "raft"]).unwrap());
        let key = format!("raft_peer{}:", m.id);
        info.lines()
            .find_map(|l| l.strip_prefix(&key).map(str::to_string))
            .unwrap_or_default()
    };
    let both = wait_until(SETTLE, || replicas().len() == 2);
    assert!(both, "{:?}", replicas());
    assert!(raft_peer(&members[frozen]).ends_with(",state=up"));

    // Frozen (SIGSTOP) past two leader leases, it answers no RPC: the leader leaves it out of
    // CLUSTER SLOTS, ROLE and INFO replication, and flags it in CLUSTER NODES and INFO raft
    // (read before SIGCONT).
    members[frozen].server.signal(libc::SIGSTOP);
    let dropped = wait_until(SETTLE, || replicas() == [up_at.clone()]);
    let nodes = cluster_nodes(leader);
    let peer = raft_peer(&members[frozen]);
    let roles = call(&mut leader.conn(), &["ROLE"]);
    let repl = text(&call(&mut leader.conn(), &["INFO", "replication"]).unwrap());
    members[frozen].server.signal(libc::SIGCONT);
    assert!(dropped, "{:?}", replicas());
    let line = nodes.lines().find(|l| l.starts_with(&frozen_id));
    assert!(
        line.is_some_and(|l| l.contains(" slave,fail ") && l.contains(" disconnected")),
        "{nodes}"
    );
    assert!(nodes.contains(&frozen_at), "{nodes}");
    assert!(peer.ends_with(",state=down"), "{peer}");
    let roles = items(&roles.unwrap());
    assert_eq!(text(&roles[0]), "master");
    assert_eq!(items(&roles[2]).len(), 1, "{roles:?}");
    assert!(repl.contains("connected_slaves:1\r\n"), "{repl}");

    // Running again, it answers, and the leader (still leading: pre-vote keeps the woken node
    // from deposing it) lists it again.
    assert_eq!(role(leader), "master");
    let back = wait_until(SETTLE, || replicas().len() == 2);
    assert!(back, "{:?}", replicas());
    let peer = raft_peer(&members[frozen]);
    assert!(peer.ends_with(",state=up"), "{peer}");
    assert!(!cluster_nodes(leader).contains("fail"));
}

#[test]
fn the_survivor_of_a_majority_that_stopped_knows_no_leader_until_it_hears_from_one() {
    let members = three_nodes();
    let all = [0, 1, 2];
    let first = wait_for_leader(&members, &all);
    let (other, alone) = ((first + 1) % 3, (first + 2) % 3);
    let survivor = &members[alone].server;
    let refusal = || {
        survivor
            .client()
            .get_connection()
            .ok()
            .and_then(|mut con| call(&mut con, &["NS.GET", "team"]).err())
            .and_then(|e| e.code().map(str::to_string))
    };
    assert_eq!(refusal().as_deref(), Some("MOVED"));

    // The leader and the other follower stop (SIGSTOP): no election can be won, and the
    // survivor, which hears from no leader, no longer sends its clients to the silent one
    // (read before SIGCONT).
    members[first].server.signal(libc::SIGSTOP);
    members[other].server.signal(libc::SIGSTOP);
    let down = wait_until(SETTLE, || refusal().as_deref() == Some("CLUSTERDOWN"));
    let info = text(&call(&mut survivor.conn(), &["CLUSTER", "INFO"]).unwrap());
    let raft = text(&call(&mut survivor.conn(), &["INFO", "raft"]).unwrap());
    members[first].server.signal(libc::SIGCONT);
    members[other].server.signal(libc::SIGCONT);
    assert!(down, "{:?}", refusal());
    assert!(info.contains("cluster_state:fail"), "{info}");
    assert!(raft.contains("raft_leader_id:-\r\n"), "{raft}");

    // Running again, a leader is known everywhere, and the survivor sends its clients to it.
    wait_for_leader(&members, &all);
    let moved = wait_until(SETTLE, || refusal().as_deref() == Some("MOVED"));
    assert!(moved, "{:?}", refusal());
}

/// The nodes `CLUSTER SLOTS` names on `server` (master first), each as `(ip:port, id)`.
fn slots_nodes(server: &Server) -> Vec<(String, String)> {
    let Ok(mut con) = server.client().get_connection() else {
        return Vec::new();
    };
    let Ok(Value::Array(ranges)) = call(&mut con, &["CLUSTER", "SLOTS"]) else {
        return Vec::new();
    };
    let Some(Value::Array(range)) = ranges.first() else {
        return Vec::new();
    };
    range[2..]
        .iter()
        .map(|n| {
            let f = items(n);
            (format!("{}:{}", text(&f[0]), int(&f[1])), text(&f[2]))
        })
        .collect()
}

/// `CLUSTER NODES` on `server`, or nothing while it does not answer.
fn cluster_nodes(server: &Server) -> String {
    server
        .client()
        .get_connection()
        .ok()
        .and_then(|mut con| call(&mut con, &["CLUSTER", "NODES"]).ok())
        .map(|v| text(&v))
        .unwrap_or_default()
}

#[test]
fn a_node_is_announced_at_its_bind_address_and_port_whatever_cluster_init_named() {
    // SPEC §10: --cluster-announce defaults to the node's --bind and --port. The list names
    // wrong client ports for nodes 1 and 2 (a typo), which clients could not reach.
    let ports = free_ports(8);
    let pairs: Vec<(u16, u16)> = (0..3).map(|i| (ports[i], ports[3 + i])).collect();
    let named = [ports[6], ports[7], pairs[2].0];
    let members =
        start_cluster_naming(&pairs, &named, |_| Vec::new()).unwrap_or_else(|e| panic!("{e}"));
    let all = [0, 1, 2];
    wait_for_leader(&members, &all);
    let listed = |i: usize| {
        let mut got: Vec<String> = slots_nodes(&members[i].server)
            .into_iter()
            .map(|(at, _)| at)
            .collect();
        got.sort();
        got
    };
    let mut real: Vec<String> = pairs
        .iter()
        .map(|(p, _)| format!("127.0.0.1:{p}"))
        .collect();
    real.sort();
    let everywhere = wait_until(SETTLE, || all.iter().all(|&i| listed(i) == real));
    assert!(
        everywhere,
        "{:?} {:?} {:?}",
        listed(0),
        listed(1),
        listed(2)
    );
}

#[test]
fn a_node_behind_a_port_mapping_is_announced_at_its_cluster_announce_address() {
    let started = Instant::now();
    let ports = free_ports(6);
    let pairs: Vec<(u16, u16)> = (0..3).map(|i| (ports[i], ports[3 + i])).collect();
    // Node 2 is reached by its clients through a port mapping (the proxy) only.
    let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], pairs[1].0)));
    let announced = proxy.addr().to_string();
    let mut members = start_cluster(&pairs, |i| match i {
        1 => vec!["--cluster-announce".into(), announced.clone()],
        _ => Vec::new(),
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let all = [0, 1, 2];
    let addr_of = |i: usize| match i {
        1 => announced.clone(),
        _ => format!("127.0.0.1:{}", pairs[i].0),
    };
    let mut con = members[1].server.conn();
    let id2 = text(&call(&mut con, &["CLUSTER", "MYID"]).unwrap());
    let config = call(&mut con, &["CONFIG", "GET", "cluster-announce"]).unwrap();
    assert_eq!(strings(&config), ["cluster-announce", announced.as_str()]);

    // Every node, node 2 included, lists node 2 at the announced address in CLUSTER SLOTS and
    // CLUSTER NODES, within a generous bound.
    let line = format!("{id2} {announced}@0 ");
    let everywhere = |members: &[Member], live: &[usize]| {
        live.iter().all(|&i| {
            let s = &members[i].server;
            slots_nodes(s).contains(&(announced.clone(), id2.clone()))
                && cluster_nodes(s).lines().any(|l| l.starts_with(&line))
        })
    };
    let shown = wait_until(Duration::from_secs(15), || everywhere(&members, &all));
    assert!(
        shown,
        "node 2 at {announced}: {:?}\n{}",
        all.map(|i| slots_nodes(&members[i].server)),
        cluster_nodes(&members[0].server)
    );
    eprintln!("announced everywhere after {:?}", started.elapsed());

    // The leader every live node names, at the address it is announced at.
    let leader_of = |members: &[Member], live: &[usize]| -> Option<usize> {
        let masters: Vec<usize> = live
            .iter()
            .copied()
            .filter(|&i| role(&members[i].server) == "master")
            .collect();
        let [l] = masters[..] else { return None };
        live.iter()
            .all(|&i| slots_nodes(&members[i].server).first().map(|n| &n.0) == Some(&addr_of(l)))
            .then_some(l)
    };
    let wait_leader = |members: &[Member], live: &[usize]| -> usize {
        let mut found = None;
        let agreed = wait_until(SETTLE, || {
            found = leader_of(members, live);
            found.is_some()
        });
        assert!(agreed, "no leader all of {live:?} agree on");
        found.unwrap()
    };

    // Node 2 becomes the leader: SHUTDOWN on the leader hands over to an up-to-date follower
    // (the lowest id among equals), and the stopped node comes back as a follower.
    let mut moved = false;
    for _ in 0..4 {
        let leader = wait_leader(&members, &all);
        if leader == 1 && moved {
            break;
        }
        eprintln!("node {} leads: SHUTDOWN", leader + 1);
        let _ = call(&mut members[leader].server.conn(), &["SHUTDOWN", "NOSAVE"]);
        let exited = members[leader].server.wait_exit(SETTLE);
        assert!(exited.is_some_and(|s| s.success()), "{exited:?}");
        let live: Vec<usize> = all.iter().copied().filter(|&i| i != leader).collect();
        wait_leader(&members, &live);
        let back = members[leader].args.clone();
        let back: Vec<&str> = back.iter().map(String::as_str).collect();
        members[leader].server.restart_with(&back);
        moved = true;
    }
    assert_eq!(wait_leader(&members, &all), 1, "node 2 leads");
    // Still announced everywhere, the restarted node too (the membership is in its log).
    assert!(everywhere(&members, &all));

    // A follower sends clients to the announced address, and a client following it through
    // the port mapping is served.
    for i in [0, 2] {
        let err = call(&mut members[i].server.conn(), &["NS.CREATE", "team"]).unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err:?}");
        let to = err.detail().unwrap().split(' ').nth(1).unwrap().to_string();
        assert_eq!(to, announced, "{err:?}");
    }
    let mut through = connect_url(&format!("redis://{announced}"));
    let served = wait_until(SETTLE, || {
        call(&mut through, &["NS.CREATE", "team"]).is_ok()
    });
    assert!(served, "{:?}", call(&mut through, &["NS.CREATE", "team"]));
    ok(&mut through, &["SEM.CREATE", "team", "s", "2"]);
    let l = lease(&mut through, "team", "p1", 30);
    let got = ok(&mut through, &["SEM.ACQUIRE", "team", "s", &l, "1", "0"]);
    assert_eq!(outcome(&got), "ACQUIRE_OUTCOME_ACQUIRED");
    let elapsed = started.elapsed();
    eprintln!("done after {elapsed:?}");
    assert!(elapsed < Duration::from_secs(60), "{elapsed:?}");
}

/// As Redis Cluster: a follower past `--maxmemory` sends a command for the leader's slots there
/// (`MOVED`) instead of refusing it `OOM`; the leader, which would run it, refuses it.
#[test]
fn a_follower_past_maxmemory_redirects_and_only_the_leader_refuses_oom() {
    let members = three_nodes_with(&["--maxmemory", "1mb"]);
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let err = run_ready(&members[first].server, &["NS.CREATE", "team"]).unwrap_err();
    assert_eq!(err.code(), Some("OOM"), "{err:?}");
    for m in members.iter().enumerate().filter(|(i, _)| *i != first) {
        let err = call(&mut m.1.server.conn(), &["NS.CREATE", "team"]).unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err:?}");
    }
}
