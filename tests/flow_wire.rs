//! Kills and unblocks over real sockets (issue 17 F7, F8): `CLIENT KILL`, `ACL DELUSER` and
//! `CLIENT UNBLOCK` end a parked acquire before they are answered, so that a release right
//! behind them in the same write never grants it.
//!
//! Every wait is bounded.

mod common;

use std::thread;

use common::*;
use permitd::server::conn::MOVE_AFTER;

const ACQUIRED: &str = "ACQUIRE_OUTCOME_ACQUIRED";
const TIMED_OUT: &str = "ACQUIRE_OUTCOME_TIMED_OUT";

// ---------------------------------------------------------------------------------------------
// F7, F8: ending a parked acquire synchronously
// ---------------------------------------------------------------------------------------------

/// A connection whose commands run inline on the shard of `ns`: it sent enough commands there to
/// move to that shard's thread (conn.rs), so that a release it sends runs with no hop.
fn conn_on_shard_of(server: &Server, ns: &str) -> redis::Connection {
    let mut c = server.conn();
    for _ in 0..MOVE_AFTER + 2 {
        ok(&mut c, &["NS.GET", ns]);
    }
    c
}

fn outcome(reply: &redis::Value) -> String {
    text(&field(reply, "outcome"))
}

/// A semaphore `sem` of 1 permit in namespace `ns`, held by `holder`, and a client parked on it
/// (its connection, in a thread, gives back the acquire's result).
struct ParkedWaiter {
    ns: String,
    sem: String,
    holder: String,
    id: String,
    result: thread::JoinHandle<redis::RedisResult<redis::Value>>,
}

/// Creates `sem` in `ns` (which exists) and parks a client on it, logged in as `user` (password
/// `pw`) when given.
fn park_waiter(
    server: &Server,
    admin: &mut redis::Connection,
    ns: &str,
    sem: &str,
    user: Option<&str>,
) -> ParkedWaiter {
    ok(admin, &["SEM.CREATE", ns, sem, "1"]);
    let holder = lease(admin, ns, "holder", 60);
    acquire_now(admin, ns, sem, &holder, 1);
    let waiting = lease(admin, ns, "waiter", 60);
    let mut wc = server.conn();
    if let Some(u) = user {
        ok(&mut wc, &["AUTH", u, "pw"]);
    }
    let id = int(&ok(&mut wc, &["CLIENT", "ID"])).to_string();
    let (ns2, sem2) = (ns.to_string(), sem.to_string());
    let result =
        thread::spawn(move || call(&mut wc, &["SEM.ACQUIRE", &ns2, &sem2, &waiting, "1", "30"]));
    wait_parked(admin, 1);
    ParkedWaiter {
        ns: ns.to_string(),
        sem: sem.to_string(),
        holder,
        id,
        result,
    }
}

/// Parks a client (logged in as `user` when given) on semaphore `sem` of namespace `ns`, which
/// shard `shard` owns, then sends the commands `end` makes in one write from a connection served
/// on that shard's thread, so that a release among them runs right after the command before it,
/// with no hop. Returns their replies and the waiter.
fn park_then_send(
    server: &Server,
    admin: &mut redis::Connection,
    (ns, sem): (&str, &str),
    user: Option<&str>,
    end: impl Fn(&ParkedWaiter) -> Vec<Vec<String>>,
) -> (Vec<redis::Value>, ParkedWaiter) {
    if call(admin, &["NS.GET", ns]).is_err() {
        ok(admin, &["NS.CREATE", ns]);
    }
    let mut sender = conn_on_shard_of(server, ns);
    let w = park_waiter(server, admin, ns, sem, user);
    let mut pipe = redis::pipe();
    for c in end(&w) {
        let cmd = pipe.cmd(&c[0]);
        for a in &c[1..] {
            cmd.arg(a);
        }
    }
    (pipe.query(&mut sender).unwrap(), w)
}

fn words(w: &[&str]) -> Vec<String> {
    w.iter().map(|s| s.to_string()).collect()
}

/// The release of the waiter's semaphore by its holder.
fn release(w: &ParkedWaiter) -> Vec<String> {
    words(&["SEM.RELEASE", &w.ns, &w.sem, &w.holder])
}

/// The killed waiter got no reply (its connection closed), and the release behind the kill
/// granted nobody: the semaphore is free and nobody waits.
fn assert_killed_and_nothing_granted(admin: &mut redis::Connection, w: ParkedWaiter, how: &str) {
    let got = w.result.join().unwrap();
    assert!(got.is_err(), "{how}: the killed client got {got:?}");
    let s = ok(admin, &["SEM.GET", &w.ns, &w.sem]);
    let holds = int(&field(&s, "active_holds"));
    assert_eq!(holds, 0, "{how}: the killed waiter was granted");
    wait_parked(admin, 0);
}

/// The waiter's acquire was answered with outcome `want`, and its semaphore has `holds` permits held
/// and nobody waiting.
fn assert_answered(
    admin: &mut redis::Connection,
    w: ParkedWaiter,
    want: &str,
    holds: i64,
    how: &str,
) {
    let got = w.result.join().unwrap().expect("the acquire's reply");
    assert_eq!(outcome(&got), want, "{how}: {got:?}");
    let s = ok(admin, &["SEM.GET", &w.ns, &w.sem]);
    assert_eq!(int(&field(&s, "active_holds")), holds, "{how}");
    wait_parked(admin, 0);
}

/// CLIENT KILL ID of a parked client, then a release in the same write: the killed waiter is
/// out of the queue before the kill is answered, so the release grants nobody. Run with waiters
/// served by either thread, parked on either shard.
#[test]
fn a_client_killed_while_parked_is_never_granted_by_a_release_behind_the_kill() {
    let server = Server::start();
    let mut admin = server.conn();
    for (round, shard) in [0, 1, 0, 1].into_iter().enumerate() {
        let ns = namespace_on(shard, "kill");
        let (replies, w) = park_then_send(
            &server,
            &mut admin,
            (&ns, &format!("s{round}")),
            None,
            |w| vec![words(&["CLIENT", "KILL", "ID", &w.id]), release(w)],
        );
        assert_eq!(int(&replies[0]), 1, "round {round}");
        assert_killed_and_nothing_granted(&mut admin, w, &format!("CLIENT KILL, round {round}"));
    }
}

/// The same with the kill queued in MULTI and run by EXEC (the release right after it), and
/// with ACL DELUSER of the waiter's user.
#[test]
fn a_waiter_killed_by_exec_or_acl_deluser_is_never_granted_by_a_release_behind() {
    let server = Server::start();
    let mut admin = server.conn();
    for shard in [0, 1] {
        let ns = namespace_on(shard, "multikill");
        let (replies, w) = park_then_send(&server, &mut admin, (&ns, "s"), None, |w| {
            vec![
                words(&["MULTI"]),
                words(&["CLIENT", "KILL", "ID", &w.id]),
                words(&["EXEC"]),
                release(w),
            ]
        });
        assert_eq!(int(&items(&replies[2])[0]), 1, "{replies:?}");
        assert_killed_and_nothing_granted(&mut admin, w, "CLIENT KILL in MULTI");

        let ns = namespace_on(shard, "deluser");
        let user = format!("doomed{shard}");
        let rules = ["ACL", "SETUSER", &user, "on", ">pw", "~*", "+@all"];
        ok(&mut admin, &rules);
        let (replies, w) = park_then_send(&server, &mut admin, (&ns, "s"), Some(&user), |w| {
            vec![words(&["ACL", "DELUSER", &user]), release(w)]
        });
        assert_eq!(int(&replies[0]), 1);
        assert_killed_and_nothing_granted(&mut admin, w, "ACL DELUSER");
    }
}

/// CLIENT UNBLOCK id TIMEOUT then a release in the same write: `1`, and the waiter gets the
/// time-out, never the grant. A release then an unblock: the waiter is granted, and the
/// unblock answers 0 (there was no parked acquire left to end).
#[test]
fn client_unblock_answers_one_only_for_the_waiter_it_ended() {
    let server = Server::start();
    let mut admin = server.conn();
    for (round, shard) in [0, 1, 0, 1].into_iter().enumerate() {
        let ns = namespace_on(shard, "unblock");
        let sem = format!("t{round}");
        let (replies, w) = park_then_send(&server, &mut admin, (&ns, &sem), None, |w| {
            vec![words(&["CLIENT", "UNBLOCK", &w.id, "TIMEOUT"]), release(w)]
        });
        assert_eq!(int(&replies[0]), 1, "round {round}");
        assert_answered(
            &mut admin,
            w,
            TIMED_OUT,
            0,
            &format!("unblocked, round {round}"),
        );

        // Released first: granted, and the unblock behind finds nothing to end.
        let sem = format!("g{round}");
        let (replies, w) = park_then_send(&server, &mut admin, (&ns, &sem), None, |w| {
            vec![release(w), words(&["CLIENT", "UNBLOCK", &w.id, "ERROR"])]
        });
        assert_eq!(
            int(&replies[1]),
            0,
            "round {round}: unblocked a granted waiter"
        );
        assert_answered(
            &mut admin,
            w,
            ACQUIRED,
            1,
            &format!("granted, round {round}"),
        );
    }
}
