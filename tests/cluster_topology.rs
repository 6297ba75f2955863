//! Cluster mode's topology over the wire (SPEC §10): three permitd processes on 127.0.0.1 form
//! a cluster with `--cluster-init`, elect a leader, and every node's `ROLE` and `CLUSTER SLOTS`
//! name the same leader; after the leader is killed the survivors name a new one, a restarted
//! node follows it with its usual options only, and `SHUTDOWN` on the leader hands leadership
//! over. Bounds are generous (elections start 0.9-1.2 s after a leader dies; a loaded 2-core box is slower).

mod common;

use common::cluster::*;
use common::*;

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
