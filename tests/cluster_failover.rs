//! Cluster mode's data path over the wire (SPEC §10): three permitd processes on 127.0.0.1. The
//! leader runs the namespace commands and acknowledges a change once a majority has it; after
//! `kill -9` of the leader the new one serves every acknowledged change, extends the leases that
//! were alive by the failover grace, and keeps fencing tokens rising; a leader that hands over
//! answers its parked acquires `MOVED` to the new leader; a node whose clock runs ahead refuses
//! to lead, and a write in flight at the leader's death does not look like such a clock. Bounds
//! are generous (elections start 0.9-1.2 s after a leader dies; a loaded 2-core box is slower).

mod common;

use std::io::Write;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::cluster::{ok_ready as ok, run_ready as run};
use common::*;
use redis::Value;

fn lease(server: &Server, process: &str, ttl: &str) -> String {
    text(&field(
        &ok(server, &["LEASE.CREATE", "app", process, ttl]),
        "lease_id",
    ))
}

fn acquire(server: &Server, lease: &str, weight: &str) -> Value {
    ok(server, &["SEM.ACQUIRE", "app", "s", lease, weight, "0"])
}

fn others(first: usize) -> Vec<usize> {
    (0..3).filter(|&i| i != first).collect()
}

#[test]
fn a_new_leader_serves_every_acknowledged_change_and_tokens_keep_rising() {
    let mut members = three_nodes();
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let leader = &members[first].server;
    ok(leader, &["NS.CREATE", "app"]);
    ok(leader, &["SEM.CREATE", "app", "s", "3"]);
    let holder = lease(leader, "holder", "60");
    let short = lease(leader, "short", "2");
    let first_token = int(&field(&acquire(leader, &holder, "2"), "fencing_token"));
    let short_token = int(&field(&acquire(leader, &short, "1"), "fencing_token"));
    assert!(short_token > first_token);
    let short_expiry = int(&field(
        &ok(leader, &["LEASE.GET", "app", &short]),
        "expires_at",
    ));
    // Reads are served by the leader only.
    for i in others(first) {
        let err = call(&mut members[i].server.conn(), &["SEM.GET", "app", "s"]).unwrap_err();
        assert_eq!(err.code(), Some("MOVED"), "{err:?}");
    }

    // The leader dies at once: every change above was acknowledged, so a majority has it.
    members[first].server.kill9();
    let live = others(first);
    let second = wait_for_leader(&members, &live);
    let leader = &members[second].server;
    let sem = ok(leader, &["SEM.GET", "app", "s"]);
    assert_eq!(int(&field(&sem, "active_holds")), 3, "{sem:?}");
    let holders = ok(leader, &["SEM.HOLDERS", "app", "s"]);
    let tokens: Vec<i64> = match field(&holders, "holders") {
        Value::Array(items) => items
            .iter()
            .map(|h| int(&field(h, "fencing_token")))
            .collect(),
        other => panic!("{other:?}"),
    };
    assert_eq!(tokens, vec![first_token, short_token]);
    // The short lease was alive when the log last moved: the new leader extended it by the
    // grace (2 s past its promotion), so the failover itself expired nobody.
    let extended = int(&field(
        &ok(leader, &["LEASE.GET", "app", &short]),
        "expires_at",
    ));
    assert!(extended > short_expiry, "{extended} > {short_expiry}");

    // Tokens keep rising across the failover.
    ok(leader, &["SEM.RELEASE", "app", "s", &holder]);
    let later = lease(leader, "later", "60");
    let token = int(&field(&acquire(leader, &later, "1"), "fencing_token"));
    assert!(token > short_token, "{token} > {short_token}");

    // The old leader comes back, catches up as a follower, and sends clients to the leader.
    let back = members[first].args.clone();
    let back: Vec<&str> = back.iter().map(String::as_str).collect();
    members[first].server.restart_with(&back);
    assert_eq!(wait_for_leader(&members, &[0, 1, 2]), second);
    let err = call(&mut members[first].server.conn(), &["SEM.GET", "app", "s"]).unwrap_err();
    assert_eq!(err.code(), Some("MOVED"), "{err:?}");
}

#[test]
fn a_leader_handing_over_answers_its_parked_acquires_moved_to_the_new_leader() {
    let mut members = three_nodes();
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let leader = &members[first].server;
    ok(leader, &["NS.CREATE", "app"]);
    ok(leader, &["SEM.CREATE", "app", "s", "1"]);
    let holder = lease(leader, "holder", "60");
    let waiter = lease(leader, "waiter", "60");
    acquire(leader, &holder, "1");
    let mut parked = leader.conn();
    let port = leader.port();
    let asked = std::thread::spawn(move || {
        call(
            &mut parked,
            &["SEM.ACQUIRE", "app", "s", &waiter, "1", "30"],
        )
    });
    let mut con = leader.conn();
    let waiting = wait_until(SETTLE, || {
        let sem = call(&mut con, &["SEM.GET", "app", "s"]).unwrap();
        int(&field(&sem, "waiters")) == 1
    });
    assert!(waiting);
    let _ = call(&mut con, &["SHUTDOWN", "NOSAVE"]);
    let err = asked.join().unwrap().unwrap_err();
    assert_eq!(err.code(), Some("MOVED"), "{err:?}");
    let to = err.detail().unwrap().split(' ').nth(1).unwrap().to_string();
    assert_ne!(to, format!("127.0.0.1:{port}"), "sent to another node");
    members[first].server.wait_exit(SETTLE);
    // It was never granted: the new leader holds the first holder only, with nobody queued.
    let second = wait_for_leader(&members, &others(first));
    assert_eq!(to, format!("127.0.0.1:{}", members[second].server.port()));
    let sem = ok(&members[second].server, &["SEM.GET", "app", "s"]);
    assert_eq!(int(&field(&sem, "active_holds")), 1, "{sem:?}");
    assert_eq!(int(&field(&sem, "waiters")), 0, "{sem:?}");
}

#[test]
fn a_node_whose_clock_runs_ahead_refuses_to_lead() {
    let mut members = three_nodes_with(&["--enable-debug-command", "yes"]);
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let leader = &members[first].server;
    ok(leader, &["NS.CREATE", "app"]);
    let holder = lease(leader, "holder", "8");
    // The followers know the leader's clock from its appends' send times, heartbeats included.
    // One follower runs 10 s ahead; the other is frozen while the leader makes one more
    // change, so that it lags and SHUTDOWN hands over to the fast one (to an up-to-date
    // follower), which must refuse to lead.
    let followers = others(first);
    let (fast, slow) = (followers[0], followers[1]);
    ok(&members[fast].server, &["DEBUG", "CLOCK-STEP", "10"]);
    members[slow].server.signal(libc::SIGSTOP);
    ok(
        &members[first].server,
        &["LEASE.REFRESH", "app", &holder, "8"],
    );
    let _ = call(&mut members[first].server.conn(), &["SHUTDOWN", "NOSAVE"]);
    members[first].server.wait_exit(SETTLE);
    let refused = wait_until(SETTLE, || {
        members[fast]
            .server
            .log_contents()
            .contains("refuses to lead")
    });
    members[slow].server.signal(libc::SIGCONT);
    assert!(refused, "{}", members[fast].server.log_tail(30));
    // It hands over: the other one serves, and the 8 s lease, which the fast clock would have
    // expired at once, is alive.
    let live = others(first);
    let handed = wait_until(SETTLE, || agreed_leader(&members, &live) == Some(slow));
    assert!(handed, "{}", members[fast].server.log_tail(30));
    ok(&members[slow].server, &["LEASE.GET", "app", &holder]);
}

#[test]
fn a_read_pending_when_the_leader_loses_its_quorum_is_answered_tryagain_not_leaderchanged() {
    // The read waits for a proposal of its own to commit; the followers stop (SIGSTOP) right
    // after it is appended, so it stays pending until the shard gives up on it (5 s). It
    // changed nothing and showed only committed changes: TRYAGAIN, which cluster clients
    // retry, not LEADERCHANGED, which reaches the application (a review saw that).
    let members = three_nodes();
    let first = wait_for_leader(&members, &[0, 1, 2]);
    let leader = &members[first].server;
    ok(leader, &["NS.CREATE", "app"]);
    let mut con = leader.conn();
    let followers = others(first);
    for &i in &followers {
        members[i].server.signal(libc::SIGSTOP);
    }
    let read = call(&mut con, &["NS.GET", "app"]);
    for &i in &followers {
        members[i].server.signal(libc::SIGCONT);
    }
    let err = read.unwrap_err();
    assert_eq!(err.code(), Some("TRYAGAIN"), "{err:?}");
}

#[test]
fn two_survivors_whose_clocks_run_ahead_both_refuse_to_lead() {
    // The first to be elected refuses and hands over; it must not then be the second's
    // reference: its appends carry no time, as its shards do not serve. Before, the second
    // measured itself against them, found no offset, and served with its fast clock (a review
    // saw a lease lose its permit 10 s early).
    let mut members = three_nodes_with(&["--enable-debug-command", "yes"]);
    let first = wait_for_leader(&members, &[0, 1, 2]);
    ok(&members[first].server, &["NS.CREATE", "app"]);
    let holder = lease(&members[first].server, "holder", "30");
    ok(&members[first].server, &["SEM.CREATE", "app", "s", "1"]);
    acquire(&members[first].server, &holder, "1");
    let live = others(first);
    for &i in &live {
        ok(&members[i].server, &["DEBUG", "CLOCK-STEP", "10"]);
    }
    members[first].server.kill9();
    let killed = Instant::now();
    // Both refuse while the dead leader's stamps are recent (10 s); an election, a hand-over
    // and a second election take 2-4 s.
    let refused = |i: usize| members[i].server.log_contents().contains("refuses to lead");
    let both = wait_until(Duration::from_secs(9), || live.iter().all(|&i| refused(i)));
    assert!(
        both,
        "after {:?}:\n{}\n{}",
        killed.elapsed(),
        members[live[0]].server.log_tail(20),
        members[live[1]].server.log_tail(20)
    );
}

#[test]
fn a_write_in_flight_when_the_leader_dies_does_not_make_a_survivor_refuse_to_lead() {
    // Its entry may reach the followers with its commit only from the next leader, a second
    // later, and on a quiet cluster be the last a survivor has from the dead leader. Taken as
    // evidence of the clocks, such entries made survivors refuse to lead ("ahead_ms=600") in
    // half of the runs of six kills of a release build, the leadership bouncing between them;
    // this debug-build run did not hit the timing in 3 runs of the old code, so the node test
    // `a_follower_knows_the_leaders_clock_from_its_appends_send_times_not_the_entries_now`
    // pins the rule down. This one checks the whole path: every survivor's evidence, from the
    // appends' send times, lets it lead.
    let mut members = three_nodes();
    let all = [0, 1, 2];
    let mut leader = wait_for_leader(&members, &all);
    ok(&members[leader].server, &["NS.CREATE", "app"]);
    for kill in 0..6 {
        let mut raw = std::net::TcpStream::connect(("127.0.0.1", members[leader].server.port()))
            .expect("the leader accepts");
        let create = format!("SEM.CREATE app s{kill} 1\r\n");
        raw.write_all(create.as_bytes()).unwrap();
        std::thread::sleep(Duration::from_millis(2));
        members[leader].server.kill9();
        let live: Vec<usize> = all.iter().copied().filter(|&i| i != leader).collect();
        let next = wait_for_leader(&members, &live);
        let args = members[leader].args.clone();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        members[leader].server.restart_with(&args);
        leader = next;
        // Serving: the take-over is done (a refusal would have handed leadership on by now).
        if let Err(e) = run(&members[leader].server, &["NS.GET", "app"]) {
            panic!("{e:?}\n{}", members[leader].server.log_tail(30));
        }
    }
    for m in &members {
        let log = m.server.log_contents();
        assert!(
            !log.contains("refuses to lead"),
            "{}",
            m.server.log_tail(30)
        );
    }
}
