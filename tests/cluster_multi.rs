//! MULTI/EXEC in cluster mode (SPEC §10; issue 40, item 7): EXEC on a node that no longer
//! leads checks its queued commands as Redis Cluster does, and answers one redirect, `MOVED`
//! to the new leader, instead of an array of per-command errors; the transaction is discarded.
//! (A command queued on a follower is refused `MOVED` as it is queued, and EXEC then answers
//! `EXECABORT`, as in Redis Cluster: cluster_topology.rs checks that.)

mod common;

use common::cluster::*;
use common::*;

#[test]
fn exec_on_a_deposed_leader_answers_one_moved_and_ends_the_transaction() {
    let members = three_nodes();
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let old = &members[first].server;
    ok_ready(old, &["NS.CREATE", "team"]);
    ok_ready(old, &["SEM.CREATE", "team", "s", "1"]);
    let slot = int(&ok(&mut old.conn(), &["CLUSTER", "KEYSLOT", "team"]));
    // A raw socket: the redis crate reads an error inside EXEC's array as a failed EXEC.
    let mut raw = old.raw();
    assert_eq!(raw.cmd(&["MULTI"]), Resp::Simple("OK".into()));
    for queued in [&["SEM.GET", "team", "s"][..], &["NS.GET", "team"]] {
        assert_eq!(raw.cmd(queued), Resp::Simple("QUEUED".into()));
    }
    // Frozen until the others elect a leader, it is deposed; thawed, it follows the new one.
    old.signal(libc::SIGSTOP);
    let live: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    let second = wait_for_leader(&members, &live);
    old.signal(libc::SIGCONT);
    let port = i64::from(members[second].server.port());
    let follows = wait_until(SETTLE, || slots_master_port(old) == Some(port));
    assert!(
        follows,
        "the old leader does not name node {} leader",
        second + 1
    );

    let moved = format!("MOVED {slot} 127.0.0.1:{port}");
    assert_eq!(raw.cmd(&["EXEC"]), Resp::Error(moved));
    // The transaction is over, as after any EXEC: commands run (and redirect) at once again.
    assert_eq!(
        raw.cmd(&["EXEC"]),
        Resp::Error("ERR EXEC without MULTI".into())
    );
    assert_eq!(raw.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let moved = format!("MOVED {slot} 127.0.0.1:{port}");
    assert_eq!(raw.cmd(&["NS.GET", "team"]), Resp::Error(moved));
}
