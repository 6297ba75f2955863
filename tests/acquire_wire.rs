//! SEM.ACQUIRE over real sockets (SPEC §2, §3, §7 MULTI/EXEC, §9): parking and every way a parked
//! acquire ends (release, lease expiry, permits raise, timeout, CLIENT UNBLOCK, disconnect,
//! deletes, revoke, lowered permits), FIFO fairness, pipelining behind a parked acquire,
//! transactions, RESP3 replies, namespaces spread over several shards, and state kept exact
//! across bursts of connections.
//!
//! Timing checks are deliberately loose: they tell "woken promptly" from "never woken" or
//! "woken only at the timeout", not milliseconds.

mod common;

use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use permitd::server::conn::MOVE_AFTER;
use redis::Value;

const ACQUIRED: &str = "ACQUIRE_OUTCOME_ACQUIRED";
const UNAVAILABLE: &str = "ACQUIRE_OUTCOME_UNAVAILABLE";
const TIMED_OUT: &str = "ACQUIRE_OUTCOME_TIMED_OUT";

/// How long a test waits for something that should happen "at once" (a wake-up, a waiter
/// showing up in INFO). Generous on purpose.
const PROMPT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn acquire(
    con: &mut redis::Connection,
    ns: &str,
    sem: &str,
    lease: &str,
    weight: u32,
    timeout: &str,
) -> redis::RedisResult<Value> {
    call(
        con,
        &["SEM.ACQUIRE", ns, sem, lease, &weight.to_string(), timeout],
    )
}

fn token(reply: &Value) -> i64 {
    int(&field(reply, "fencing_token"))
}

fn sem_get(con: &mut redis::Connection, ns: &str, sem: &str) -> Value {
    ok(con, &["SEM.GET", ns, sem])
}

fn sem_int(con: &mut redis::Connection, ns: &str, sem: &str, name: &str) -> i64 {
    int(&field(&sem_get(con, ns, sem), name))
}

/// Lease ids of the current holders of ns/sem (first page, LIMIT 250).
fn holder_leases(con: &mut redis::Connection, ns: &str, sem: &str) -> Vec<String> {
    let page = ok(con, &["SEM.HOLDERS", ns, sem, "LIMIT", "250"]);
    items(&field(&page, "holders"))
        .iter()
        .map(|h| text(&field(h, "lease_id")))
        .collect()
}

/// Joins a waiter that must have been granted; returns the reply and elapsed time.
fn join_acquired(h: Parked) -> (Value, Duration) {
    let (r, el) = join(h);
    let v = r.unwrap_or_else(|e| panic!("parked acquire failed: {}", err_text(&e)));
    assert_eq!(outcome(&v), ACQUIRED, "parked acquire reply: {v:?}");
    (v, el)
}

/// Joins a waiter that must have ended with an error; returns it as `CODE detail`.
fn join_err(h: Parked) -> (String, Duration) {
    let (r, el) = join(h);
    match r {
        Ok(v) => panic!("parked acquire should have failed, got {v:?}"),
        Err(e) => (err_text(&e), el),
    }
}

// ---------------------------------------------------------------------------------------------
// Wake-ups
// ---------------------------------------------------------------------------------------------

#[test]
fn parked_acquire_is_woken_by_a_release_with_a_higher_fencing_token() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    let t_holder = acquire_now(&mut c, "team", "db", &holder, 1);

    let h = park(&server, "team", "db", &waiter, 1, "10");
    wait_parked(&mut c, 1);
    let released = ok(&mut c, &["SEM.RELEASE", "team", "db", &holder]);
    assert!(
        is_map_like(&released),
        "SEM.RELEASE replies a semaphore: {released:?}"
    );

    let (v, el) = join_acquired(h);
    assert!(
        el < Duration::from_secs(8),
        "woken by release only after {el:?}"
    );
    let t_waiter = token(&v);
    assert!(
        t_waiter > t_holder,
        "fencing token must rise: holder {t_holder}, waiter {t_waiter}"
    );
    let s = field(&v, "semaphore");
    assert_eq!(int(&field(&s, "active_holds")), 1, "{v:?}");
    assert_eq!(int(&field(&s, "active_holders_count")), 1, "{v:?}");
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![waiter.clone()]);
    wait_parked(&mut c, 0);
}

#[test]
fn parked_acquire_is_woken_by_the_holders_lease_expiry_without_any_command() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 1);
    let waiter = lease(&mut c, "team", "waiter", 60);
    let t_holder = acquire_now(&mut c, "team", "db", &holder, 1);

    // Only the waiter's connection talks to the server from here on.
    let h = park(&server, "team", "db", &waiter, 1, "10");
    let (v, el) = join_acquired(h);
    assert!(
        el < Duration::from_secs(5),
        "holder's lease (ttl 1 s) expired, but the waiter was granted only after {el:?}"
    );
    assert!(token(&v) > t_holder, "fencing token must rise: {v:?}");
    let s = field(&v, "semaphore");
    assert_eq!(int(&field(&s, "active_holds")), 1, "{v:?}");
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![waiter.clone()]);
    let e = fails(&mut c, &["LEASE.GET", "team", &holder]);
    assert!(e.starts_with("NOTFOUND"), "expired lease: {e}");
}

#[test]
fn parked_acquire_is_woken_by_raising_permits() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 2);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 2);

    let h = park(&server, "team", "db", &waiter, 2, "10");
    wait_parked(&mut c, 1);
    let version = sem_int(&mut c, "team", "db", "version");
    let updated = ok(
        &mut c,
        &[
            "SEM.UPDATE",
            "team",
            "db",
            "4",
            "VERSION",
            &version.to_string(),
        ],
    );
    assert_eq!(int(&field(&updated, "permits")), 4);

    let (v, el) = join_acquired(h);
    assert!(
        el < Duration::from_secs(8),
        "woken by permits raise after {el:?}"
    );
    let s = field(&v, "semaphore");
    assert_eq!(int(&field(&s, "permits")), 4, "{v:?}");
    assert_eq!(int(&field(&s, "active_holds")), 4, "{v:?}");
    assert_eq!(sem_int(&mut c, "team", "db", "active_holders_count"), 2);
    wait_parked(&mut c, 0);
}

// ---------------------------------------------------------------------------------------------
// Timeouts
// ---------------------------------------------------------------------------------------------

fn check_timeout(timeout: &str, secs: f64) {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 2);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 2);
    let before = sem_get(&mut c, "team", "db");

    let h = park(&server, "team", "db", &waiter, 1, timeout);
    let (r, el) = join(h);
    let v = r.unwrap_or_else(|e| panic!("timed-out acquire is a reply, not {}", err_text(&e)));
    assert_eq!(outcome(&v), TIMED_OUT, "timeout {timeout}: {v:?}");
    assert!(
        !to_map(&v).contains_key("fencing_token"),
        "no fencing_token unless acquired: {v:?}"
    );
    let min = Duration::from_secs_f64(secs * 0.8);
    let max = Duration::from_secs_f64(secs + 4.0);
    assert!(
        el >= min && el <= max,
        "timeout {timeout}: replied after {el:?}, expected roughly {secs} s"
    );
    // The reply carries the current state, and nothing was held.
    let s = field(&v, "semaphore");
    assert_eq!(int(&field(&s, "active_holds")), 2, "{v:?}");
    assert_eq!(int(&field(&s, "active_holders_count")), 1, "{v:?}");
    let after = sem_get(&mut c, "team", "db");
    for f in ["active_holds", "active_holders_count", "permits", "version"] {
        assert_eq!(
            field(&before, f),
            field(&after, f),
            "{f} changed by a timeout"
        );
    }
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![holder.clone()]);
    wait_parked(&mut c, 0);
}

#[test]
fn integer_timeout_times_out_and_changes_no_holds() {
    check_timeout("1", 1.0);
}

#[test]
fn decimal_timeout_times_out_and_changes_no_holds() {
    check_timeout("0.3", 0.3);
}

// ---------------------------------------------------------------------------------------------
// Fairness
// ---------------------------------------------------------------------------------------------

#[test]
fn waiters_are_granted_first_in_first_out() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 3);
    let holders: Vec<String> = (0..3)
        .map(|i| lease(&mut c, "team", &format!("holder-{i}"), 60))
        .collect();
    for h in &holders {
        acquire_now(&mut c, "team", "db", h, 1);
    }

    let (tx, rx) = mpsc::channel::<(usize, redis::RedisResult<Value>)>();
    let mut threads = Vec::new();
    for i in 0..3 {
        let l = lease(&mut c, "team", &format!("waiter-{i}"), 60);
        let mut con = server.conn();
        let tx = tx.clone();
        threads.push(thread::spawn(move || {
            let r = acquire(&mut con, "team", "db", &l, 1, "20");
            tx.send((i, r)).unwrap();
        }));
        // Park them strictly one after the other.
        wait_parked(&mut c, i as i64 + 1);
    }

    let mut last_token = 0;
    for (i, h) in holders.iter().enumerate() {
        ok(&mut c, &["SEM.RELEASE", "team", "db", h]);
        let (who, r) = rx
            .recv_timeout(PROMPT)
            .unwrap_or_else(|_| panic!("no waiter granted after releasing holder {i}"));
        assert_eq!(who, i, "waiter {who} was granted before waiter {i}");
        let v = r.unwrap_or_else(|e| panic!("waiter {who}: {}", err_text(&e)));
        assert_eq!(outcome(&v), ACQUIRED, "waiter {who}: {v:?}");
        assert!(token(&v) > last_token, "fencing tokens rise in grant order");
        last_token = token(&v);
        // The others are still parked.
        wait_parked(&mut c, 2 - i as i64);
    }
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(sem_int(&mut c, "team", "db", "active_holds"), 3);
}

#[test]
fn a_heavy_waiter_at_the_head_blocks_a_light_one_behind_it() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 3);
    let holder = lease(&mut c, "team", "holder", 60);
    let heavy = lease(&mut c, "team", "heavy", 60);
    let light = lease(&mut c, "team", "light", 60);
    let sneaky = lease(&mut c, "team", "sneaky", 60);
    acquire_now(&mut c, "team", "db", &holder, 2); // 1 permit free

    let h_heavy = park(&server, "team", "db", &heavy, 2, "20");
    wait_parked(&mut c, 1);
    let h_light = park(&server, "team", "db", &light, 1, "20");
    wait_parked(&mut c, 2);

    // One permit is free, but the light waiter must stay behind the heavy one.
    thread::sleep(Duration::from_millis(500));
    assert!(
        !h_light.is_finished(),
        "light waiter jumped ahead of the heavy one"
    );
    assert_eq!(info_int(&mut c, "waiters"), 2);
    assert_eq!(sem_int(&mut c, "team", "db", "active_holds"), 2);
    // A non-blocking acquire does not jump the queue either.
    let r = acquire(&mut c, "team", "db", &sneaky, 1, "0").unwrap();
    assert_eq!(
        outcome(&r),
        UNAVAILABLE,
        "non-blocking acquire jumped the queue: {r:?}"
    );

    ok(&mut c, &["SEM.RELEASE", "team", "db", &holder]);
    let (v_heavy, _) = join_acquired(h_heavy);
    let (v_light, _) = join_acquired(h_light);
    assert!(token(&v_light) > token(&v_heavy), "heavy was served first");
    assert_eq!(sem_int(&mut c, "team", "db", "active_holds"), 3);
    wait_parked(&mut c, 0);
}

// ---------------------------------------------------------------------------------------------
// Leaving the queue
// ---------------------------------------------------------------------------------------------

#[test]
fn a_waiter_that_disconnects_is_removed_and_never_granted() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let gone = lease(&mut c, "team", "gone", 60);
    let next = lease(&mut c, "team", "next", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);

    // The first waiter parks on a raw socket, then hangs up.
    let mut raw = server.raw();
    raw.send_cmd(&[b"SEM.ACQUIRE", b"team", b"db", gone.as_bytes(), b"1", b"20"])
        .unwrap();
    wait_parked(&mut c, 1);
    let h_next = park(&server, "team", "db", &next, 1, "20");
    wait_parked(&mut c, 2);
    drop(raw);
    wait_parked(&mut c, 1);

    ok(&mut c, &["SEM.RELEASE", "team", "db", &holder]);
    let (v, el) = join_acquired(h_next);
    assert!(
        el < Duration::from_secs(15),
        "next waiter granted after {el:?}"
    );
    assert_eq!(int(&field(&field(&v, "semaphore"), "active_holds")), 1);
    assert_eq!(
        holder_leases(&mut c, "team", "db"),
        vec![next.clone()],
        "the permit must go to the waiter still connected"
    );
    wait_parked(&mut c, 0);

    // A lone waiter that disconnects leaves nothing behind either.
    let mut raw = server.raw();
    raw.send_cmd(&[b"SEM.ACQUIRE", b"team", b"db", gone.as_bytes(), b"1", b"20"])
        .unwrap();
    wait_parked(&mut c, 1);
    drop(raw);
    wait_parked(&mut c, 0);
    ok(&mut c, &["SEM.RELEASE", "team", "db", &next]);
    thread::sleep(Duration::from_millis(300));
    assert_eq!(sem_int(&mut c, "team", "db", "active_holds"), 0);
    assert!(holder_leases(&mut c, "team", "db").is_empty());
}

#[test]
fn client_unblock_timeout_and_error() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);

    // TIMEOUT -> the acquire ends with outcome TIMED_OUT.
    let mut wc = server.conn();
    let id = int(&ok(&mut wc, &["CLIENT", "ID"])).to_string();
    let h = park_on(wc, "team", "db", &waiter, 1, "20");
    wait_parked(&mut c, 1);
    assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &id, "TIMEOUT"])), 1);
    let (r, el) = join(h);
    let v = r.unwrap_or_else(|e| panic!("UNBLOCK TIMEOUT gave an error: {}", err_text(&e)));
    assert_eq!(outcome(&v), TIMED_OUT, "{v:?}");
    assert!(el < Duration::from_secs(15), "unblocked only after {el:?}");
    wait_parked(&mut c, 0);
    // Not blocked any more: 0.
    assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &id, "TIMEOUT"])), 0);

    // ERROR -> -UNBLOCKED ...
    let mut wc = server.conn();
    let id = int(&ok(&mut wc, &["CLIENT", "ID"])).to_string();
    let h = park_on(wc, "team", "db", &waiter, 1, "20");
    wait_parked(&mut c, 1);
    assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &id, "ERROR"])), 1);
    let (e, _) = join_err(h);
    assert!(e.starts_with("UNBLOCKED"), "UNBLOCK ERROR gave {e:?}");
    wait_parked(&mut c, 0);
    assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &id, "ERROR"])), 0);

    // A client that is not blocked at all (this one) -> 0.
    let me = int(&ok(&mut c, &["CLIENT", "ID"])).to_string();
    assert_eq!(int(&ok(&mut c, &["CLIENT", "UNBLOCK", &me])), 0);
    // Nothing was ever granted to the unblocked waiter.
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![holder.clone()]);
}

#[test]
fn commands_pipelined_behind_a_parked_acquire_wait_for_it() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);

    let mut raw = server.raw();
    let mut bytes = encode(&[
        b"SEM.ACQUIRE",
        b"team",
        b"db",
        waiter.as_bytes(),
        b"1",
        b"5",
    ]);
    bytes.extend(encode(&[b"PING"]));
    raw.send(&bytes).unwrap();
    wait_parked(&mut c, 1);

    // Nothing is answered while the acquire is parked, not even the PING behind it.
    raw.stream()
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let early = raw.read_reply();
    assert!(
        early.is_err(),
        "got a reply while the acquire was parked: {early:?}"
    );
    raw.stream().set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();

    ok(&mut c, &["SEM.RELEASE", "team", "db", &holder]);
    let first = raw.read_reply().unwrap();
    assert_eq!(
        resp_field(&first, "outcome"),
        &Resp::Bulk(Some(ACQUIRED.as_bytes().to_vec())),
        "first reply must be the acquire's: {first:?}"
    );
    assert!(matches!(resp_field(&first, "fencing_token"), Resp::Int(_)));
    let second = raw.read_reply().unwrap();
    assert_eq!(second, Resp::Simple("PONG".into()), "then PING's");
}

// ---------------------------------------------------------------------------------------------
// Parked acquires ended with an error
// ---------------------------------------------------------------------------------------------

/// Parks a waiter on team/db (held in full by another lease), runs `end`, and returns the
/// waiter's error.
fn park_then(end: impl FnOnce(&mut redis::Connection, &str, &str)) -> String {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);
    let h = park(&server, "team", "db", &waiter, 1, "20");
    wait_parked(&mut c, 1);
    end(&mut c, &holder, &waiter);
    let (e, el) = join_err(h);
    assert!(el < Duration::from_secs(15), "ended only after {el:?}");
    wait_parked(&mut c, 0);
    e
}

#[test]
fn sem_delete_ends_a_parked_acquire_with_notfound() {
    let e = park_then(|c, _, _| {
        assert_eq!(text(&ok(c, &["SEM.DELETE", "team", "db"])), "OK");
    });
    assert!(e.starts_with("NOTFOUND"), "waiter got {e:?}");
}

#[test]
fn ns_delete_ends_a_parked_acquire_with_notfound() {
    let e = park_then(|c, _, _| {
        assert_eq!(text(&ok(c, &["NS.DELETE", "team"])), "OK");
    });
    assert!(e.starts_with("NOTFOUND"), "waiter got {e:?}");
}

#[test]
fn revoking_the_waiters_lease_ends_its_parked_acquire_with_notfound() {
    let mut holder_seen = String::new();
    let e = park_then(|c, holder, waiter| {
        assert_eq!(text(&ok(c, &["LEASE.REVOKE", "team", waiter])), "OK");
        // The holder keeps its hold; the revoked waiter got nothing.
        assert_eq!(holder_leases(c, "team", "db"), vec![holder.to_string()]);
        holder_seen = holder.to_string();
    });
    assert!(e.starts_with("NOTFOUND"), "waiter got {e:?}");
    assert!(!holder_seen.is_empty());
}

#[test]
fn expiry_of_the_waiters_own_lease_ends_its_parked_acquire_with_notfound() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 1);
    acquire_now(&mut c, "team", "db", &holder, 1);
    let h = park(&server, "team", "db", &waiter, 1, "10");
    let (e, el) = join_err(h);
    assert!(e.starts_with("NOTFOUND"), "waiter got {e:?}");
    assert!(
        el < Duration::from_secs(6),
        "waiter's lease (ttl 1 s) expired, but the acquire ended after {el:?}"
    );
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![holder.clone()]);
}

#[test]
fn lowering_permits_below_a_parked_weight_ends_it_with_invalidarg() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 5);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);
    let h = park(&server, "team", "db", &waiter, 5, "20");
    wait_parked(&mut c, 1);

    let updated = ok(&mut c, &["SEM.UPDATE", "team", "db", "3", "VERSION", "1"]);
    assert_eq!(int(&field(&updated, "permits")), 3);
    let (e, el) = join_err(h);
    assert!(
        e.starts_with("INVALIDARG") && e.contains("weight exceeds semaphore permits"),
        "waiter got {e:?}"
    );
    assert!(el < Duration::from_secs(15), "ended only after {el:?}");
    wait_parked(&mut c, 0);
    assert_eq!(sem_int(&mut c, "team", "db", "active_holds"), 1);
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![holder.clone()]);
}

// ---------------------------------------------------------------------------------------------
// MULTI / EXEC
// ---------------------------------------------------------------------------------------------

#[test]
fn multi_exec_in_one_namespace_returns_every_reply() {
    let server = Server::start();
    let mut c = server.conn();
    ok(&mut c, &["NS.CREATE", "team"]);
    let l = lease(&mut c, "team", "worker", 60);

    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("SEM.CREATE")
        .arg("team")
        .arg("a")
        .arg(2)
        .cmd("SEM.CREATE")
        .arg("team")
        .arg("b")
        .arg(3)
        .cmd("SEM.ACQUIRE")
        .arg("team")
        .arg("a")
        .arg(&l)
        .arg(1)
        .arg(0)
        .cmd("SEM.GET")
        .arg("team")
        .arg("a")
        .query(&mut c)
        .unwrap_or_else(|e| panic!("EXEC failed: {}", err_text(&e)));
    assert_eq!(replies.len(), 4, "{replies:?}");
    assert_eq!(text(&field(&replies[0], "name")), "a");
    assert_eq!(int(&field(&replies[1], "permits")), 3);
    assert_eq!(outcome(&replies[2]), ACQUIRED, "{:?}", replies[2]);
    assert_eq!(int(&field(&replies[3], "active_holds")), 1);
    assert_eq!(sem_int(&mut c, "team", "b", "permits"), 3);
}

#[test]
fn multi_exec_across_namespaces_is_crossslot_and_runs_nothing() {
    let server = Server::start();
    let mut c = server.conn();
    ok(&mut c, &["NS.CREATE", "ns1"]);
    ok(&mut c, &["NS.CREATE", "ns2"]);

    assert_eq!(text(&ok(&mut c, &["MULTI"])), "OK");
    for cmd in [
        &["SEM.CREATE", "ns1", "x", "1"][..],
        &["NS.CREATE", "ns3"][..],
        &["SEM.CREATE", "ns2", "y", "1"][..],
    ] {
        // Queueing succeeds; EXEC is what rejects the batch (SPEC §7).
        assert_eq!(text(&ok(&mut c, cmd)), "QUEUED", "{cmd:?}");
    }
    let e = match call(&mut c, &["EXEC"]) {
        Ok(v) => panic!("EXEC across namespaces should fail, got {v:?}"),
        Err(e) => err_text(&e),
    };
    assert!(e.starts_with("CROSSSLOT"), "EXEC gave {e:?}");

    // Nothing ran.
    let e = fails(&mut c, &["SEM.GET", "ns1", "x"]);
    assert!(e.starts_with("NOTFOUND"), "{e}");
    let e = fails(&mut c, &["SEM.GET", "ns2", "y"]);
    assert!(e.starts_with("NOTFOUND"), "{e}");
    let e = fails(&mut c, &["NS.GET", "ns3"]);
    assert!(e.starts_with("NOTFOUND"), "{e}");
    // And the connection is out of the transaction.
    assert_eq!(text(&ok(&mut c, &["PING"])), "PONG");
}

#[test]
fn sem_acquire_inside_multi_never_waits() {
    let server = Server::start();
    let mut c = server.conn();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);
    acquire_now(&mut c, "team", "db", &holder, 1);

    let t0 = Instant::now();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg("team")
        .arg("db")
        .arg(&waiter)
        .arg(1)
        .arg(10)
        .cmd("SEM.GET")
        .arg("team")
        .arg("db")
        .query(&mut c)
        .unwrap_or_else(|e| panic!("EXEC failed: {}", err_text(&e)));
    let el = t0.elapsed();
    assert!(
        el < Duration::from_secs(5),
        "SEM.ACQUIRE inside MULTI waited {el:?}"
    );
    assert_eq!(replies.len(), 2);
    assert_eq!(outcome(&replies[0]), UNAVAILABLE, "{:?}", replies[0]);
    assert_eq!(int(&field(&replies[1], "active_holds")), 1);
    assert_eq!(info_int(&mut c, "waiters"), 0);
    assert_eq!(holder_leases(&mut c, "team", "db"), vec![holder.clone()]);
}

#[test]
fn a_queued_unknown_command_aborts_exec_and_discard_drops_the_queue() {
    let server = Server::start();
    let mut c = server.conn();
    ok(&mut c, &["NS.CREATE", "team"]);

    assert_eq!(text(&ok(&mut c, &["MULTI"])), "OK");
    assert_eq!(
        text(&ok(&mut c, &["SEM.CREATE", "team", "q", "1"])),
        "QUEUED"
    );
    let e = fails(&mut c, &["NO.SUCH.COMMAND", "team"]);
    assert!(e.starts_with("ERR"), "unknown command while queueing: {e}");
    let e = match call(&mut c, &["EXEC"]) {
        Ok(v) => panic!("EXEC should abort, got {v:?}"),
        Err(e) => err_text(&e),
    };
    assert!(e.starts_with("EXECABORT"), "EXEC gave {e:?}");
    let e = fails(&mut c, &["SEM.GET", "team", "q"]);
    assert!(e.starts_with("NOTFOUND"), "aborted transaction ran: {e}");

    assert_eq!(text(&ok(&mut c, &["MULTI"])), "OK");
    assert_eq!(
        text(&ok(&mut c, &["SEM.CREATE", "team", "d", "1"])),
        "QUEUED"
    );
    assert_eq!(text(&ok(&mut c, &["DISCARD"])), "OK");
    let e = fails(&mut c, &["SEM.GET", "team", "d"]);
    assert!(e.starts_with("NOTFOUND"), "discarded transaction ran: {e}");
    let e = fails(&mut c, &["EXEC"]);
    assert!(e.starts_with("ERR"), "EXEC without MULTI: {e}");
    assert_eq!(text(&ok(&mut c, &["PING"])), "PONG");
}

// ---------------------------------------------------------------------------------------------
// RESP3
// ---------------------------------------------------------------------------------------------

#[test]
fn resp3_acquire_replies_are_maps() {
    let server = Server::start();
    let mut c = server.conn_resp3();
    setup(&mut c, "team", "db", 1);
    let holder = lease(&mut c, "team", "holder", 60);
    let waiter = lease(&mut c, "team", "waiter", 60);

    let r = acquire(&mut c, "team", "db", &holder, 1, "0").unwrap();
    assert!(matches!(r, Value::Map(_)), "RESP3 acquire reply: {r:?}");
    assert_eq!(outcome(&r), ACQUIRED);
    assert!(matches!(field(&r, "fencing_token"), Value::Int(_)), "{r:?}");
    let s = field(&r, "semaphore");
    assert!(matches!(s, Value::Map(_)), "nested semaphore: {s:?}");
    assert!(matches!(field(&s, "metadata"), Value::Map(_)), "{s:?}");

    let r = acquire(&mut c, "team", "db", &waiter, 1, "0").unwrap();
    assert!(matches!(r, Value::Map(_)), "{r:?}");
    assert_eq!(outcome(&r), UNAVAILABLE);

    let r = acquire(&mut c, "team", "db", &waiter, 1, "0.2").unwrap();
    assert!(matches!(r, Value::Map(_)), "{r:?}");
    assert_eq!(outcome(&r), TIMED_OUT);

    // A parked acquire over RESP3, woken by a release.
    let wc = server.conn_resp3();
    let h = park_on(wc, "team", "db", &waiter, 1, "10");
    wait_parked(&mut c, 1);
    ok(&mut c, &["SEM.RELEASE", "team", "db", &holder]);
    let (v, _) = join_acquired(h);
    assert!(matches!(v, Value::Map(_)), "{v:?}");
}

// ---------------------------------------------------------------------------------------------
// Several shards
// ---------------------------------------------------------------------------------------------

fn ns_page(c: &mut redis::Connection, cursor: Option<&str>) -> (Vec<String>, String, String) {
    let mut args = vec!["NS.LIST", "LIMIT", "3"];
    if let Some(cur) = cursor {
        args.push("CURSOR");
        args.push(cur);
    }
    let page = ok(c, &args);
    let names = items(&field(&page, "namespaces"))
        .iter()
        .map(|n| text(&field(n, "name")))
        .collect();
    (
        names,
        text(&field(&page, "next_cursor")),
        text(&field(&page, "previous_cursor")),
    )
}

#[test]
fn namespaces_on_every_shard_work_and_ns_list_pages_exactly() {
    let server = Server::start_with(&["--shards", "2"]);
    let mut c = server.conn();
    let names: Vec<String> = (0..10).map(|i| format!("shard-ns-{i:02}")).collect();

    // Each namespace works end to end, including a parked acquire woken by a release.
    for ns in &names {
        setup(&mut c, ns, "db", 1);
        let a = lease(&mut c, ns, "a", 60);
        let b = lease(&mut c, ns, "b", 60);
        let t_a = acquire_now(&mut c, ns, "db", &a, 1);
        let h = park(&server, ns, "db", &b, 1, "10");
        wait_parked(&mut c, 1);
        ok(&mut c, &["SEM.RELEASE", ns, "db", &a]);
        let (v, _) = join_acquired(h);
        assert!(token(&v) > t_a, "{ns}: fencing token must rise");
        assert_eq!(holder_leases(&mut c, ns, "db"), vec![b.clone()], "{ns}");
        wait_parked(&mut c, 0);
    }

    // Forward: every namespace exactly once, full pages but the last.
    let mut pages: Vec<(Vec<String>, String, String)> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = ns_page(&mut c, cursor.as_deref());
        let next = page.1.clone();
        pages.push(page);
        assert!(pages.len() <= 10, "NS.LIST does not end: {pages:?}");
        if next.is_empty() {
            break;
        }
        cursor = Some(next);
    }
    let sizes: Vec<usize> = pages.iter().map(|p| p.0.len()).collect();
    assert_eq!(
        sizes,
        vec![3, 3, 3, 1],
        "page sizes with LIMIT 3: {pages:?}"
    );
    let mut seen: Vec<String> = pages.iter().flat_map(|p| p.0.clone()).collect();
    seen.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(seen, expected, "every namespace exactly once");
    assert_eq!(pages[0].2, "", "first page has no previous_cursor");

    // Backward: previous_cursor returns exactly the page before, down to the first.
    let mut prev = pages.last().unwrap().2.clone();
    for i in (0..pages.len() - 1).rev() {
        assert!(!prev.is_empty(), "page {} has no previous_cursor", i + 1);
        let page = ns_page(&mut c, Some(&prev));
        assert_eq!(page.0, pages[i].0, "walking back to page {i}");
        prev = page.2;
    }
    assert_eq!(prev, "", "walking back ends at the first page");
}

/// Bursts of connections switch the server's allocation heap (src/alloc.rs: at 16 connections,
/// again after they fell below 8). Leases and holders made before a burst, during it and
/// between bursts stay exact, an acquire parked before the bursts is served after them, and the
/// server serves throughout.
#[test]
fn state_stays_exact_across_bursts_of_connections() {
    const BURST: usize = 100;
    let server = Server::start();
    let mut admin = server.conn();
    setup(&mut admin, "burst", "s", 10_000);
    ok(&mut admin, &["SEM.CREATE", "burst", "gate", "1"]);
    let first = lease(&mut admin, "burst", "before", 300);
    let first_token = acquire_now(&mut admin, "burst", "s", &first, 3);
    acquire_now(&mut admin, "burst", "gate", &first, 1);
    // A waiter parked on the gate for the whole test.
    let mut waiter = server.conn();
    let waiting = lease(&mut waiter, "burst", "waiter", 300);
    let (tx, rx) = mpsc::channel();
    let parked = thread::spawn(move || {
        let r = acquire(&mut waiter, "burst", "gate", &waiting, 1, "120");
        tx.send(r.map(|v| outcome(&v))).unwrap();
    });
    wait_parked(&mut admin, 1);
    // One lease and hold kept per round, made while the round's burst is connected.
    let mut kept: Vec<(String, i64)> = Vec::new();
    for round in 0..3 {
        let mut conns: Vec<redis::Connection> = (0..BURST).map(|_| server.conn()).collect();
        let mut taken = Vec::new();
        for (i, c) in conns.iter_mut().enumerate() {
            let id = lease(c, "burst", &format!("r{round}-{i}"), 300);
            acquire_now(c, "burst", "s", &id, 1);
            taken.push(id);
        }
        assert_eq!(
            sem_int(&mut admin, "burst", "s", "active_holds"),
            3 + BURST as i64 + kept.len() as i64
        );
        let keep = lease(&mut conns[0], "burst", &format!("kept-{round}"), 300);
        let keep_token = acquire_now(&mut conns[0], "burst", "s", &keep, 1);
        kept.push((keep, keep_token));
        for (id, c) in taken.iter().zip(conns.iter_mut()) {
            ok(c, &["SEM.RELEASE", "burst", "s", id]);
            ok(c, &["LEASE.REVOKE", "burst", id]);
        }
        drop(conns);
        // Let the shards see the burst end (they trim a second after their connections halve).
        let gone = wait_until(PROMPT, || info_int(&mut admin, "connected_clients") == 2);
        assert!(gone, "the burst's connections closed");
        thread::sleep(Duration::from_millis(1500));
    }
    assert_eq!(
        sem_int(&mut admin, "burst", "s", "active_holds"),
        3 + kept.len() as i64
    );
    let mut expected = vec![(first.clone(), first_token)];
    expected.extend(kept.iter().cloned());
    let page = ok(&mut admin, &["SEM.HOLDERS", "burst", "s", "LIMIT", "250"]);
    let holders: Vec<(String, i64)> = items(&field(&page, "holders"))
        .iter()
        .map(|h| (text(&field(h, "lease_id")), int(&field(h, "fencing_token"))))
        .collect();
    assert_eq!(
        holders, expected,
        "holders oldest first, with their tokens: the first lease, then one kept per burst"
    );
    let l = ok(&mut admin, &["LEASE.GET", "burst", &first]);
    assert_eq!(text(&field(&l, "process_id")), "before");
    // 1 + kept + the waiter's lease.
    assert_eq!(info_int(&mut admin, "leases"), 2 + kept.len() as i64);
    // The acquire parked before the bursts is served by a release after them.
    ok(&mut admin, &["SEM.RELEASE", "burst", "gate", &first]);
    let served = rx.recv_timeout(PROMPT).expect("the parked acquire ends");
    assert_eq!(served.expect("acquire reply"), ACQUIRED);
    parked.join().unwrap();
}

#[test]
fn a_connection_moves_to_the_shard_of_its_namespace_and_keeps_its_state() {
    let server = Server::start_with(&["--shards", "2"]);
    let mut con = server.conn();
    let start = clients_per_shard(&mut con);
    let home = start
        .iter()
        .position(|&n| n == 1)
        .unwrap_or_else(|| panic!("one client: {start:?}"));
    let (away, home_ns) = (namespace_on(1 - home, "mv"), namespace_on(home, "mv"));
    // Its commands keep going to the other shard: it moves there.
    setup(&mut con, &away, "s", 1);
    ok(&mut con, &["CLIENT", "SETNAME", "mover"]);
    for _ in 0..MOVE_AFTER {
        sem_get(&mut con, &away, "s");
    }
    let mut on_away = vec![0, 0];
    on_away[1 - home] = 1;
    assert_eq!(
        clients_per_shard(&mut con),
        on_away,
        "moved to the shard of {away}"
    );
    // Its name, its replies and their order came along.
    let list = text(&ok(&mut con, &["CLIENT", "LIST"]));
    assert!(list.contains("name=mover"), "{list}");
    // A pipeline that makes a fresh connection move halfway is answered in full, in order.
    let mut p = server.conn();
    let id = lease(&mut p, &away, "piped", 60);
    let mut pipe = redis::pipe();
    let pairs = MOVE_AFTER as usize; // twice as many commands as it takes to move
    for _ in 0..pairs {
        pipe.cmd("SEM.ACQUIRE")
            .arg(&away)
            .arg("s")
            .arg(&id)
            .arg(1)
            .arg(0);
        pipe.cmd("SEM.RELEASE").arg(&away).arg("s").arg(&id);
    }
    let replies: Vec<Value> = pipe.query(&mut p).unwrap();
    assert_eq!(replies.len(), 2 * pairs);
    for pair in replies.chunks(2) {
        assert_eq!(outcome(&pair[0]), ACQUIRED, "{pair:?}");
        assert_eq!(int(&to_map(&pair[1])["active_holds"]), 0, "{pair:?}");
    }
    assert_eq!(
        clients_per_shard(&mut p)[1 - home],
        2,
        "the pipelining client moved too"
    );
    // A moved connection parks and is woken as any other.
    let holder = lease(&mut p, &away, "holder", 60);
    acquire_now(&mut p, &away, "s", &holder, 1);
    let waiting = lease(&mut con, &away, "waiter", 60);
    let (tx, rx) = mpsc::channel();
    let away2 = away.clone();
    let parked = thread::spawn(move || {
        let r = acquire(&mut con, &away2, "s", &waiting, 1, "30");
        tx.send(r.map(|v| outcome(&v))).unwrap();
        con
    });
    wait_parked(&mut p, 1);
    ok(&mut p, &["SEM.RELEASE", &away, "s", &holder]);
    let got = rx.recv_timeout(PROMPT).expect("woken by the release");
    assert_eq!(got.unwrap(), ACQUIRED);
    let mut con = parked.join().unwrap();
    // Back home when its commands go there; CLIENT KILL still finds it.
    setup(&mut con, &home_ns, "s", 1);
    for _ in 0..MOVE_AFTER {
        sem_get(&mut con, &home_ns, "s");
    }
    let back = clients_per_shard(&mut con);
    assert_eq!((back[home], back[1 - home]), (1, 1), "{back:?}");
    let con_id = int(&ok(&mut con, &["CLIENT", "ID"])).to_string();
    assert_eq!(int(&ok(&mut p, &["CLIENT", "KILL", "ID", &con_id])), 1);
    assert!(call(&mut con, &["PING"]).is_err(), "killed");
    assert!(wait_until(PROMPT, || clients_per_shard(&mut p) == on_away));
}

/// Every token a run hands out stays below 2^53, where JavaScript and Lua clients read them
/// exactly: tokens from one MULTI, from parked acquires woken by releases, from SEM.HOLDERS,
/// and after a restart with another shard count, all distinct where they must be and rising.
#[test]
fn every_fencing_token_of_a_run_is_below_2_pow_53() {
    const EXACT: i64 = 1 << 53;
    let mut s = Server::start_with(&["--shards", "2"]);
    let mut con = s.conn();
    setup(&mut con, "tok", "a", 2);
    ok(&mut con, &["SEM.CREATE", "tok", "b", "2"]);
    ok(&mut con, &["SEM.CREATE", "tok", "m", "1"]);
    let mut seen = Vec::new();
    // Two acquires in one MULTI: two tokens that must differ as numbers.
    let l1 = lease(&mut con, "tok", "w1", 60);
    let (ra, rb): (Value, Value) = redis::pipe()
        .atomic()
        .cmd("SEM.ACQUIRE")
        .arg("tok")
        .arg("a")
        .arg(&l1)
        .arg(1)
        .arg(0)
        .cmd("SEM.ACQUIRE")
        .arg("tok")
        .arg("b")
        .arg(&l1)
        .arg(1)
        .arg(0)
        .query(&mut con)
        .expect("MULTI/EXEC");
    let (ta, tb) = (
        int(&field(&ra, "fencing_token")),
        int(&field(&rb, "fencing_token")),
    );
    assert_ne!(
        ta as f64, tb as f64,
        "two tokens of one MULTI as doubles: {ta} {tb}"
    );
    seen.extend([ta, tb]);
    // Hand-offs on a mutex: a parked acquire woken by a release on another connection.
    let holder = lease(&mut con, "tok", "w2", 60);
    seen.push(acquire_now(&mut con, "tok", "m", &holder, 1));
    for round in 0..5 {
        let waiter = lease(&mut con, "tok", "w3", 60);
        let mut other = s.conn();
        let w = waiter.clone();
        let parked = thread::spawn(move || {
            let r = ok(&mut other, &["SEM.ACQUIRE", "tok", "m", &w, "1", "10"]);
            int(&field(&r, "fencing_token"))
        });
        assert!(
            wait_until(Duration::from_secs(10), || info_int(
                &mut con,
                "blocked_clients"
            ) == 1),
            "round {round}: the waiter parks"
        );
        ok(&mut con, &["SEM.RELEASE", "tok", "m", &holder]);
        seen.push(parked.join().expect("the parked acquire is granted"));
        ok(&mut con, &["SEM.RELEASE", "tok", "m", &waiter]);
        seen.push(acquire_now(&mut con, "tok", "m", &holder, 1));
    }
    for sem in ["a", "b", "m"] {
        seen.extend(
            holders_with_tokens(&mut con, "tok", sem)
                .iter()
                .map(|h| h.2),
        );
    }
    // A restart with another shard count keeps counting from where the run was.
    drop(con);
    s.restart_with(&["--shards", "3"]);
    let mut con = s.conn();
    let before = *seen.iter().max().unwrap();
    let l4 = lease(&mut con, "tok", "w4", 60);
    let after = acquire_now(&mut con, "tok", "b", &l4, 1);
    assert!(after > before, "after the restart: {after} > {before}");
    seen.push(after);
    assert!(
        seen.iter().all(|&t| (1..EXACT).contains(&t)),
        "every token in 1..2^53: {seen:?}"
    );
}

/// A positive timeout too small for a nanosecond still waits (1 ns) and times out, as Redis
/// rounds the timeouts of blocking commands up: it once rounded to 0, "do not wait", and
/// answered UNAVAILABLE.
#[test]
fn a_positive_timeout_below_a_nanosecond_waits_and_times_out() {
    let s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "tiny", "s", 1);
    let holder = lease(&mut con, "tiny", "h", 60);
    acquire_now(&mut con, "tiny", "s", &holder, 1);
    let waiter = lease(&mut con, "tiny", "w", 60);
    for timeout in ["1e-10", "0.0000000001", "4e-10"] {
        let r = ok(
            &mut con,
            &["SEM.ACQUIRE", "tiny", "s", &waiter, "1", timeout],
        );
        assert_eq!(
            text(&field(&r, "outcome")),
            "ACQUIRE_OUTCOME_TIMED_OUT",
            "timeout {timeout}: {r:?}"
        );
    }
    let r = ok(&mut con, &["SEM.ACQUIRE", "tiny", "s", &waiter, "1", "0"]);
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_UNAVAILABLE");
}
