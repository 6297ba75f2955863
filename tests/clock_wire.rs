//! The wall clock stepping forward (an NTP step, a VM resumed after a pause) must not expire
//! every lease at once: a step of more than a second beyond what the monotonic clock saw moves
//! every lease's death and every parked acquire's deadline with it, in one journaled change.
//! `DEBUG CLOCK-STEP` moves the server's wall clock as such a step moves the system's.

mod common;

use std::thread;
use std::time::Duration;

use common::*;

const S: i64 = 1_000_000_000;

fn expires_at(con: &mut redis::Connection, lease: &str) -> i64 {
    int(&field(&ok(con, &["LEASE.GET", "clk", lease]), "expires_at"))
}

#[test]
fn a_forward_clock_step_expires_no_lease_and_times_out_no_acquire() {
    let mut s = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut con = s.conn();
    setup(&mut con, "clk", "m", 1);
    let a = lease(&mut con, "clk", "a", 10);
    acquire_now(&mut con, "clk", "m", &a, 1);
    let b = lease(&mut con, "clk", "b", 60);
    let before = expires_at(&mut con, &a);
    let mut other = s.conn();
    let waiter = b.clone();
    let parked = thread::spawn(move || {
        let r = ok(&mut other, &["SEM.ACQUIRE", "clk", "m", &waiter, "1", "30"]);
        text(&field(&r, "outcome"))
    });
    assert!(wait_until(Duration::from_secs(10), || info_int(
        &mut con,
        "blocked_clients"
    ) == 1));

    // An hour ahead: nothing dies, nothing times out; every death moved by the step.
    ok(&mut con, &["DEBUG", "CLOCK-STEP", "3600"]);
    let shifted = expires_at(&mut con, &a);
    assert!(
        (3599 * S..=3601 * S).contains(&(shifted - before)),
        "moved by the step: {before} -> {shifted}"
    );
    assert_eq!(holders(&mut con, "clk", "m"), vec![(a.clone(), 1)]);
    assert_eq!(
        info_int(&mut con, "blocked_clients"),
        1,
        "the waiter still waits"
    );
    // A refresh counts from the new now.
    let refreshed = int(&field(
        &ok(&mut con, &["LEASE.REFRESH", "clk", &a, "20"]),
        "expires_at",
    ));
    assert!(
        refreshed > shifted && refreshed < shifted + 20 * S,
        "{shifted} -> {refreshed}"
    );

    // Under a second: drift, not a step; nothing moves.
    ok(&mut con, &["DEBUG", "CLOCK-STEP", "0.5"]);
    assert_eq!(expires_at(&mut con, &a), refreshed);

    // The queue still works: a release hands the permit to the waiter.
    ok(&mut con, &["SEM.RELEASE", "clk", "m", &a]);
    assert_eq!(parked.join().unwrap(), "ACQUIRE_OUTCOME_ACQUIRED");
    let b_expires = expires_at(&mut con, &b);
    assert!(
        s.log_contents().contains("the wall clock stepped forward"),
        "the step is logged"
    );

    // The shift is journaled: after a crash, b's death is where the shifted clock put it.
    drop(con);
    s.restart();
    let mut con = s.conn();
    assert_eq!(expires_at(&mut con, &b), b_expires);
    assert_eq!(holders(&mut con, "clk", "m"), vec![(b.clone(), 1)]);
}
