//! MULTI/EXEC in cluster mode (SPEC §10; issue 40, item 7): EXEC on a node that no longer
//! leads checks its queued commands as Redis Cluster does, and answers one redirect, `MOVED`
//! to the new leader, instead of an array of per-command errors; the transaction is discarded.
//! A leader that does not serve yet (leadership moving) answers EXEC one `TRYAGAIN`. (A command
//! queued on a follower is refused `MOVED` as it is queued, and EXEC then answers `EXECABORT`,
//! as in Redis Cluster: cluster_topology.rs checks that.)

mod common;

use std::time::{Duration, Instant};

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

/// Two survivors whose clocks run 10 s ahead refuse to lead while the dead leader's clock is
/// recent (cluster_failover.rs): each, elected, stands by and hands over. A transaction sent
/// meanwhile gets one error for EXEC (`TRYAGAIN` from the leader, or `EXECABORT` after the
/// follower's `MOVED`), never an array of errors.
#[test]
fn exec_on_a_leader_that_does_not_serve_answers_one_tryagain() {
    let mut members = three_nodes_with(&["--enable-debug-command", "yes"]);
    let first = wait_for_leader(&members, &[0, 1, 2]);
    ok_ready(&members[first].server, &["NS.CREATE", "team"]);
    let live: Vec<usize> = (0..3).filter(|&i| i != first).collect();
    for &i in &live {
        ok(
            &mut members[i].server.conn(),
            &["DEBUG", "CLOCK-STEP", "10"],
        );
    }
    members[first].server.kill9();
    let mut tryagain = 0;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until && tryagain < 3 {
        for &i in &live {
            let mut raw = members[i].server.raw();
            raw.cmd(&["MULTI"]);
            raw.cmd(&["NS.GET", "team"]);
            match raw.cmd(&["EXEC"]) {
                Resp::Error(e) if e.starts_with("TRYAGAIN") => tryagain += 1,
                Resp::Error(_) => {}
                other => assert!(
                    other.items().is_none_or(|r| !matches!(r, [Resp::Error(_)])),
                    "node {}: {other:?}",
                    i + 1
                ),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(tryagain > 0, "no EXEC met a leader that did not serve");
}
