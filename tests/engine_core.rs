//! Deterministic tests of the shard state machine (`permitd::engine::Shard`).
//!
//! Time is a number the tests move by hand: no sleeping, no clock. Commands go through the real
//! parser (`parse_argv`) so the tests read like the wire protocol; leases are created with
//! counter ids (`LeaseId::from_counter`) so every run is the same.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use bytes::Bytes;
use permitd::command::{parse_argv, Request};
use permitd::engine::journal::Record;
use permitd::engine::request::{EngineRequest, LeaseCreate};
use permitd::engine::types::{LeaseId, Limits, Metadata, Name, NANOS_PER_SEC};
use permitd::engine::{Cancel, Counts, Exec, Shard, WaiterId};
use permitd::error::Error;
use permitd::protocol::Reply;

const S: i64 = NANOS_PER_SEC;
/// A start time in the realistic range of "nanoseconds since the epoch".
const T0: i64 = 1_700_000_000 * S;

/// The client the harness's acquires park for.
const CLIENT: u64 = 42;

const ACQUIRED: &str = "ACQUIRE_OUTCOME_ACQUIRED";
const UNAVAILABLE: &str = "ACQUIRE_OUTCOME_UNAVAILABLE";
const TIMED_OUT: &str = "ACQUIRE_OUTCOME_TIMED_OUT";

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

struct Eng {
    shard: Shard,
    limits: Arc<Limits>,
    now: i64,
    next_lease: u64,
}

impl Eng {
    fn new() -> Eng {
        Eng::with_limits(Limits::default())
    }

    fn with_limits(limits: Limits) -> Eng {
        let limits = Arc::new(limits);
        Eng {
            shard: Shard::new(limits.clone(), Arc::new(AtomicUsize::new(0))),
            limits,
            now: T0,
            next_lease: 1,
        }
    }

    /// Parses words into an engine request (panics on a parse error).
    fn req(&self, words: &[&str]) -> EngineRequest {
        match self.parse(words) {
            Ok(r) => r,
            Err(e) => panic!("{words:?} does not parse: {e}"),
        }
    }

    fn parse(&self, words: &[&str]) -> Result<EngineRequest, Error> {
        let argv: Vec<Bytes> = words
            .iter()
            .map(|w| Bytes::copy_from_slice(w.as_bytes()))
            .collect();
        match parse_argv(&argv, &self.limits)?.1 {
            Request::Engine(r) => Ok(r),
            other => panic!("{words:?} is not an engine command: {other:?}"),
        }
    }

    fn exec(&mut self, req: EngineRequest) -> Exec {
        self.shard.execute(self.now, req, Some(CLIENT))
    }

    /// Runs a command; a parse error is returned as an error reply.
    fn run(&mut self, words: &[&str]) -> Exec {
        match self.parse(words) {
            Ok(r) => self.exec(r),
            Err(e) => Exec::Reply(Reply::Error(e)),
        }
    }

    /// Runs a command that must answer at once without an error.
    fn ok(&mut self, words: &[&str]) -> Reply {
        match self.run(words) {
            Exec::Reply(Reply::Error(e)) => panic!("{words:?} failed: {e}"),
            Exec::Reply(r) => r,
            Exec::Parked(_) => panic!("{words:?} parked"),
        }
    }

    /// Runs a command that must answer at once with an error; returns the error.
    fn err(&mut self, words: &[&str]) -> Error {
        match self.run(words) {
            Exec::Reply(Reply::Error(e)) => e,
            other => panic!("{words:?} did not fail: {other:?}"),
        }
    }

    /// Creates a lease with a deterministic id; returns the id's wire form.
    fn lease(&mut self, ns: &str, process: &str, ttl_secs: i64) -> String {
        let id = LeaseId::from_counter(self.next_lease);
        self.next_lease += 1;
        let req = EngineRequest::LeaseCreate(LeaseCreate {
            ns: Name::new_unchecked(Bytes::copy_from_slice(ns.as_bytes())),
            id,
            process_id: Bytes::copy_from_slice(process.as_bytes()),
            ttl: ttl_secs * S,
            meta: Metadata::default(),
        });
        match self.exec(req) {
            Exec::Reply(r) if !r.is_error() => {
                assert_eq!(int(&r, "expires_at"), self.now + ttl_secs * S);
                text(&r, "lease_id")
            }
            other => panic!("LEASE.CREATE failed: {other:?}"),
        }
    }

    /// Moves the clock to `t` and fires what is due.
    fn at(&mut self, t: i64) {
        assert!(t >= self.now, "time only moves forward in these tests");
        self.now = t;
        self.shard.advance(t);
    }

    fn outbox(&mut self) -> Vec<(WaiterId, Reply)> {
        self.shard.take_outbox()
    }

    fn sem(&mut self, ns: &str, sem: &str) -> Reply {
        self.ok(&["SEM.GET", ns, sem])
    }

    /// Holders of a semaphore (first page of up to 250).
    fn holders(&mut self, ns: &str, sem: &str) -> Vec<Reply> {
        let r = self.ok(&["SEM.HOLDERS", ns, sem, "LIMIT", "250"]);
        list(&r, "holders").to_vec()
    }

    /// `(lease_id, weight)` of every holder, oldest first.
    fn hold_list(&mut self, ns: &str, sem: &str) -> Vec<(String, i64)> {
        self.holders(ns, sem)
            .iter()
            .map(|h| (text(h, "lease_id"), int(h, "weight")))
            .collect()
    }

    /// `(lease_id, weight)` of every parked acquire (SEM.WAITERS, first page of up to 250),
    /// in the order they are served.
    fn wait_list(&mut self, sem: &str) -> Vec<(String, i64)> {
        let r = self.ok(&["SEM.WAITERS", "ns", sem, "LIMIT", "250"]);
        list(&r, "waiters")
            .iter()
            .map(|w| (text(w, "lease_id"), int(w, "weight")))
            .collect()
    }

    /// A namespace `ns` with a semaphore `sem` of `permits`.
    fn setup(&mut self, ns: &str, sem: &str, permits: i64) {
        if self.run(&["NS.GET", ns]) == Exec::Reply(Reply::Error(ns_missing(ns))) {
            self.ok(&["NS.CREATE", ns]);
        }
        self.ok(&["SEM.CREATE", ns, sem, &permits.to_string()]);
    }

    fn acquire(&mut self, sem: &str, lease: &str, weight: i64, timeout: &str) -> Exec {
        let w = weight.to_string();
        self.run(&["SEM.ACQUIRE", "ns", sem, lease, &w, timeout])
    }

    /// An acquire that must be answered ACQUIRED at once; returns its fencing token.
    fn got(&mut self, sem: &str, lease: &str, weight: i64) -> i64 {
        match self.acquire(sem, lease, weight, "0") {
            Exec::Reply(r) => {
                assert_eq!(outcome(&r), ACQUIRED, "{r:?}");
                int(&r, "fencing_token")
            }
            other => panic!("acquire parked: {other:?}"),
        }
    }

    fn waiting(&mut self, sem: &str, lease: &str, weight: i64, timeout: &str) -> WaiterId {
        match self.acquire(sem, lease, weight, timeout) {
            Exec::Parked(w) => w,
            Exec::Reply(r) => panic!("acquire did not park: {r:?}"),
        }
    }
}

fn ns_missing(ns: &str) -> Error {
    Error::NotFound(format!("namespace '{ns}' not found"))
}

fn field<'a>(r: &'a Reply, key: &str) -> &'a Reply {
    if !matches!(r, Reply::Map(_)) {
        panic!("not a map: {r:?}");
    }
    r.field(key)
        .unwrap_or_else(|| panic!("no field {key} in {r:?}"))
}

fn int(r: &Reply, key: &str) -> i64 {
    match field(r, key) {
        Reply::Int(i) => *i,
        other => panic!("{key} is not an integer: {other:?}"),
    }
}

fn text(r: &Reply, key: &str) -> String {
    match field(r, key) {
        Reply::Bulk(b) => String::from_utf8(b.to_vec()).expect("utf-8"),
        other => panic!("{key} is not a bulk string: {other:?}"),
    }
}

fn list<'a>(r: &'a Reply, key: &str) -> &'a [Reply] {
    match field(r, key) {
        Reply::Array(items) => items,
        other => panic!("{key} is not an array: {other:?}"),
    }
}

fn has(r: &Reply, key: &str) -> bool {
    matches!(r, Reply::Map(p) if p.iter().any(|(k, _)| matches!(k, Reply::Bulk(b) if b == key.as_bytes())))
}

fn outcome(r: &Reply) -> String {
    text(r, "outcome")
}

fn code(r: &Reply) -> &'static str {
    match r {
        Reply::Error(e) => e.code(),
        other => panic!("not an error: {other:?}"),
    }
}

fn reply(e: Exec) -> Reply {
    match e {
        Exec::Reply(r) => r,
        Exec::Parked(w) => panic!("parked as {w}"),
    }
}

/// The single outbox entry for `w`.
fn only_for(out: &[(WaiterId, Reply)], w: WaiterId) -> &Reply {
    let mine: Vec<&Reply> = out
        .iter()
        .filter(|(id, _)| *id == w)
        .map(|(_, r)| r)
        .collect();
    assert_eq!(mine.len(), 1, "exactly one reply for waiter {w}: {out:?}");
    mine[0]
}

fn secs(t: f64) -> i64 {
    (t * S as f64).round() as i64
}

// ---------------------------------------------------------------------------------------------
// Leases and expiry
// ---------------------------------------------------------------------------------------------

#[test]
fn lease_dies_at_its_exact_nanosecond() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "p1", 10);
    let tok = e.got("s", &a, 1);
    assert_eq!(e.shard.next_deadline(), Some(T0 + 10 * S));

    e.at(T0 + 10 * S - 1);
    let l = e.ok(&["LEASE.GET", "ns", &a]);
    assert_eq!(int(&l, "expires_at"), T0 + 10 * S);
    assert_eq!(int(&e.sem("ns", "s"), "active_holds"), 1);
    let h = e.holders("ns", "s");
    assert_eq!(h.len(), 1);
    assert_eq!(int(&h[0], "expires_at"), T0 + 10 * S);
    assert_eq!(int(&h[0], "fencing_token"), tok);

    e.at(T0 + 10 * S);
    assert_eq!(e.err(&["LEASE.GET", "ns", &a]).code(), "NOTFOUND");
    let s = e.sem("ns", "s");
    assert_eq!(int(&s, "active_holds"), 0);
    assert_eq!(int(&s, "active_holders_count"), 0);
    assert!(e.holders("ns", "s").is_empty());
    assert_eq!(e.err(&["LEASE.REFRESH", "ns", &a, "10"]).code(), "NOTFOUND");
    assert_eq!(code(&reply(e.acquire("s", &a, 1, "0"))), "NOTFOUND");
    assert_eq!(e.err(&["SEM.RELEASE", "ns", "s", &a]).code(), "NOTFOUND");
    assert_eq!(e.err(&["LEASE.REVOKE", "ns", &a]).code(), "NOTFOUND");
    assert_eq!(e.shard.stats().leases_expired, 1);
    assert_eq!(e.shard.counts().leases, 0);
    assert_eq!(e.shard.next_deadline(), None);
}

#[test]
fn expiry_is_seen_by_reads_without_an_explicit_advance() {
    // `execute` itself fires what is due: no read ever sees a dead lease.
    let mut e = Eng::new();
    e.setup("ns", "s", 2);
    let a = e.lease("ns", "p", 3);
    e.got("s", &a, 2);
    e.now = T0 + 3 * S;
    assert_eq!(int(&e.sem("ns", "s"), "active_holds"), 0);
    let l = e.ok(&["LEASE.LIST", "ns"]);
    assert!(list(&l, "leases").is_empty());
}

#[test]
fn refresh_moves_every_holder_and_the_death_time() {
    let mut e = Eng::new();
    e.setup("ns", "s1", 1);
    e.ok(&["SEM.CREATE", "ns", "s2", "1"]);
    let a = e.lease("ns", "p", 10);
    e.got("s1", &a, 1);
    e.got("s2", &a, 1);
    e.at(T0 + 5 * S);
    let l = e.ok(&["LEASE.REFRESH", "ns", &a, "10"]);
    assert_eq!(int(&l, "expires_at"), T0 + 15 * S);
    assert_eq!(int(&l, "created_at"), T0);
    for sem in ["s1", "s2"] {
        let h = e.holders("ns", sem);
        assert_eq!(int(&h[0], "expires_at"), T0 + 15 * S);
    }
    assert_eq!(e.shard.next_deadline(), Some(T0 + 15 * S));
    e.at(T0 + 10 * S);
    assert_eq!(
        e.hold_list("ns", "s1").len(),
        1,
        "the old death time no longer applies"
    );
    e.at(T0 + 15 * S - 1);
    assert_eq!(e.hold_list("ns", "s2").len(), 1);
    e.at(T0 + 15 * S);
    assert!(e.hold_list("ns", "s1").is_empty());
    assert!(e.hold_list("ns", "s2").is_empty());
}

#[test]
fn lease_expiry_ends_its_waiters_and_serves_the_queues() {
    let mut e = Eng::new();
    e.setup("ns", "s", 2);
    let a = e.lease("ns", "a", 10);
    let b = e.lease("ns", "b", 5);
    let c = e.lease("ns", "c", 60);
    e.got("s", &a, 2);
    let wb = e.waiting("s", &b, 1, "30");
    let wc = e.waiting("s", &c, 2, "30");
    e.at(T0 + 5 * S);
    let out = e.outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(code(only_for(&out, wb)), "NOTFOUND");
    e.at(T0 + 10 * S);
    let out = e.outbox();
    let r = only_for(&out, wc);
    assert_eq!(outcome(r), ACQUIRED);
    assert_eq!(int(r, "fencing_token"), 2, "the count after a's 1");
    assert_eq!(e.hold_list("ns", "s"), vec![(c.clone(), 2)]);
    assert_eq!(e.shard.counts().waiters, 0);
}

#[test]
fn revoke_releases_every_hold_ends_its_waiters_and_serves() {
    let mut e = Eng::new();
    e.setup("ns", "s1", 1);
    e.ok(&["SEM.CREATE", "ns", "s2", "1"]);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s1", &a, 1);
    e.got("s2", &b, 1);
    let wa = e.waiting("s2", &a, 1, "30");
    let wb = e.waiting("s1", &b, 1, "30");
    e.at(T0 + S);
    assert_eq!(e.ok(&["LEASE.REVOKE", "ns", &a]), Reply::OK);
    let out = e.outbox();
    assert_eq!(out.len(), 2);
    assert_eq!(code(only_for(&out, wa)), "NOTFOUND");
    assert_eq!(outcome(only_for(&out, wb)), ACQUIRED);
    assert_eq!(e.hold_list("ns", "s1"), vec![(b.clone(), 1)]);
    assert_eq!(e.hold_list("ns", "s2"), vec![(b.clone(), 1)]);
    assert_eq!(e.err(&["LEASE.REVOKE", "ns", &a]).code(), "NOTFOUND");
    assert_eq!(e.err(&["LEASE.GET", "ns", &a]).code(), "NOTFOUND");
    // Its timer is gone too: nothing fires at its old death time.
    assert_eq!(e.shard.next_deadline(), Some(T0 + 60 * S));
}

// ---------------------------------------------------------------------------------------------
// Acquire, re-acquire, time-outs
// ---------------------------------------------------------------------------------------------

#[test]
fn waiter_times_out_at_its_exact_deadline() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    e.at(T0 + S);
    let w = e.waiting("s", &b, 1, "2.5");
    assert_eq!(int(&e.sem("ns", "s"), "last_activity_at"), T0 + S);
    assert_eq!(e.shard.counts().waiters, 1);
    e.at(T0 + S + secs(2.5) - 1);
    assert!(e.outbox().is_empty());
    e.at(T0 + S + secs(2.5));
    let out = e.outbox();
    let r = only_for(&out, w);
    assert_eq!(outcome(r), TIMED_OUT);
    assert!(!has(r, "fencing_token"));
    let s = field(r, "semaphore");
    assert_eq!(int(s, "active_holds"), 1);
    assert_eq!(int(s, "permits"), 1);
    // A time-out does not move last_activity_at.
    assert_eq!(int(s, "last_activity_at"), T0 + S);
    assert_eq!(int(&e.sem("ns", "s"), "last_activity_at"), T0 + S);
    assert_eq!(e.shard.stats().acquire_timed_out, 1);
    assert_eq!(e.shard.counts().waiters, 0);
    assert_eq!(e.hold_list("ns", "s"), vec![(a, 1)]);
}

#[test]
fn unavailable_carries_state_and_moves_last_activity() {
    let mut e = Eng::new();
    e.setup("ns", "s", 3);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 2);
    e.at(T0 + 7);
    let r = reply(e.acquire("s", &b, 2, "0"));
    assert_eq!(outcome(&r), UNAVAILABLE);
    assert!(!has(&r, "fencing_token"));
    let s = field(&r, "semaphore");
    assert_eq!(int(s, "active_holds"), 2);
    assert_eq!(int(s, "active_holders_count"), 1);
    assert_eq!(int(s, "last_activity_at"), T0 + 7);
    assert_eq!(int(s, "version"), 1);
    assert_eq!(int(s, "updated_at"), T0);
    assert_eq!(e.shard.stats().acquire_unavailable, 1);
    // Not parked, and nothing held.
    assert_eq!(e.shard.counts().waiters, 0);
    assert_eq!(e.hold_list("ns", "s"), vec![(a, 2)]);
}

#[test]
fn acquire_inside_multi_never_waits() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    let req = e.req(&["SEM.ACQUIRE", "ns", "s", &b, "1", "5"]);
    let r = reply(e.shard.execute(e.now, req, None));
    assert_eq!(outcome(&r), UNAVAILABLE);
    assert_eq!(e.shard.counts().waiters, 0);
}

#[test]
fn reacquire_down_applies_at_once_keeps_token_and_frees_permits_to_the_queue() {
    let mut e = Eng::new();
    e.setup("ns", "s", 5);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let ta = match e.run(&["SEM.ACQUIRE", "ns", "s", &a, "4", "0", "META", "k", "v"]) {
        Exec::Reply(r) => int(&r, "fencing_token"),
        other => panic!("{other:?}"),
    };
    let wb = e.waiting("s", &b, 3, "10");
    e.at(T0 + S);
    // Smaller re-acquire with waiters queued: applied at once (never waits, even with timeout 0).
    let r = reply(e.acquire("s", &a, 1, "0"));
    assert_eq!(outcome(&r), ACQUIRED);
    assert_eq!(int(&r, "fencing_token"), ta);
    let out = e.outbox();
    let g = only_for(&out, wb);
    assert_eq!(outcome(g), ACQUIRED);
    assert_eq!(int(g, "fencing_token"), ta + 1);
    // The reply shows the state after the command, the freed permits already handed on.
    assert_eq!(int(field(&r, "semaphore"), "active_holds"), 4);
    assert_eq!(int(field(&r, "semaphore"), "active_holders_count"), 2);
    let h = e.holders("ns", "s");
    assert_eq!(text(&h[0], "lease_id"), a);
    assert_eq!(int(&h[0], "weight"), 1);
    assert_eq!(int(&h[0], "fencing_token"), ta);
    assert_eq!(
        int(&h[0], "locked_at"),
        T0,
        "locked_at is the first acquisition"
    );
    assert_eq!(
        field(&h[0], "metadata"),
        &Reply::Map(vec![]),
        "no META clears metadata"
    );
    assert_eq!(int(&h[1], "weight"), 3);
    assert_eq!(int(&h[1], "locked_at"), T0 + S);
    assert_eq!(int(&e.sem("ns", "s"), "active_holds"), 4);
}

#[test]
fn reacquire_up_waits_for_the_difference_keeping_the_old_hold() {
    let mut e = Eng::new();
    e.setup("ns", "s", 5);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let ta = e.got("s", &a, 2);
    e.got("s", &b, 2);
    // Grows by 2 while only 1 is free: waits.
    let w = match e.run(&["SEM.ACQUIRE", "ns", "s", &a, "4", "5", "META", "x", "1"]) {
        Exec::Parked(w) => w,
        other => panic!("{other:?}"),
    };
    assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 2), (b.clone(), 2)]);
    assert_eq!(int(&e.sem("ns", "s"), "active_holds"), 4);
    e.at(T0 + S);
    let r = e.ok(&["SEM.RELEASE", "ns", "s", &b]);
    let out = e.outbox();
    let g = only_for(&out, w);
    assert_eq!(outcome(g), ACQUIRED);
    assert_eq!(int(g, "fencing_token"), ta, "a re-acquire keeps its token");
    assert_eq!(int(&r, "active_holds"), 4);
    assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 4)]);
    let h = e.holders("ns", "s");
    assert_eq!(int(&h[0], "locked_at"), T0);
    assert_eq!(
        field(&h[0], "metadata"),
        &Reply::Map(vec![(Reply::bulk("x"), Reply::bulk("1"))])
    );
}

#[test]
fn growing_reacquire_that_times_out_leaves_the_hold_unchanged() {
    let mut e = Eng::new();
    e.setup("ns", "s", 3);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.run(&["SEM.ACQUIRE", "ns", "s", &a, "1", "0", "META", "m", "old"]);
    e.got("s", &b, 2);
    // Non-blocking growth: UNAVAILABLE, hold unchanged.
    let r = reply(e.acquire("s", &a, 2, "0"));
    assert_eq!(outcome(&r), UNAVAILABLE);
    let w = e.waiting("s", &a, 3, "1");
    e.at(T0 + S);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, w)), TIMED_OUT);
    let h = e.holders("ns", "s");
    assert_eq!(int(&h[0], "weight"), 1);
    assert_eq!(
        field(&h[0], "metadata"),
        &Reply::Map(vec![(Reply::bulk("m"), Reply::bulk("old"))])
    );
    // Growing with enough free and nobody queued: at once.
    e.ok(&["SEM.RELEASE", "ns", "s", &b]);
    let r = reply(e.acquire("s", &a, 3, "0"));
    assert_eq!(outcome(&r), ACQUIRED);
    assert_eq!(e.hold_list("ns", "s"), vec![(a, 3)]);
}

#[test]
fn weight_above_total_permits_is_rejected_at_once() {
    let mut e = Eng::new();
    e.setup("ns", "s", 3);
    let a = e.lease("ns", "a", 60);
    let err = match e.acquire("s", &a, 4, "10") {
        Exec::Reply(Reply::Error(err)) => err,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        err,
        Error::InvalidArg("weight exceeds semaphore permits".into())
    );
    assert_eq!(e.shard.counts().waiters, 0);
    assert_eq!(int(&e.sem("ns", "s"), "last_activity_at"), T0);
}

// ---------------------------------------------------------------------------------------------
// Fairness
// ---------------------------------------------------------------------------------------------

#[test]
fn fifo_with_mixed_weights_and_head_of_line_blocking() {
    let mut e = Eng::new();
    e.setup("ns", "s", 4);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    let x = e.lease("ns", "x", 60);
    e.got("s", &a, 3);
    let w1 = e.waiting("s", &b, 3, "30");
    // Would fit in the free permit, but must not pass the heavy head.
    let w2 = e.waiting("s", &c, 1, "30");
    let w3 = e.waiting("s", &d, 1, "30");
    assert!(e.outbox().is_empty());
    // A non-blocking acquire does not jump the queue either.
    let r = reply(e.acquire("s", &x, 1, "0"));
    assert_eq!(outcome(&r), UNAVAILABLE);
    assert_eq!(int(&e.sem("ns", "s"), "active_holds"), 3);

    e.at(T0 + S);
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    let out = e.outbox();
    let ids: Vec<WaiterId> = out.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        ids,
        vec![w1, w2],
        "served from the head, in order, while it fits"
    );
    let t1 = int(&out[0].1, "fencing_token");
    let t2 = int(&out[1].1, "fencing_token");
    assert!(t1 < t2);
    // Each grant reply carries the state right after that grant.
    assert_eq!(int(field(&out[0].1, "semaphore"), "active_holds"), 3);
    assert_eq!(int(field(&out[1].1, "semaphore"), "active_holds"), 4);
    assert_eq!(e.hold_list("ns", "s"), vec![(b.clone(), 3), (c.clone(), 1)]);

    e.ok(&["SEM.RELEASE", "ns", "s", &c]);
    let out = e.outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(outcome(only_for(&out, w3)), ACQUIRED);
    assert!(int(&out[0].1, "fencing_token") > t2);
}

#[test]
fn sem_waiters_shows_the_queue_in_serving_order_and_drops_who_leaves() {
    let mut e = Eng::new();
    e.setup("ns", "s", 3);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "proc-b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    let f = e.lease("ns", "f", 60);
    e.got("s", &a, 3);
    assert!(e.wait_list("s").is_empty());
    assert_eq!(int(&e.sem("ns", "s"), "waiters"), 0);
    e.at(T0 + S);
    let wb = e.waiting("s", &b, 2, "10");
    e.at(T0 + 2 * S);
    let _wc = e.waiting("s", &c, 1, "30");
    let wd = e.waiting("s", &d, 3, "30");
    let wf = e.waiting("s", &f, 1, "0.5");
    assert_eq!(
        e.wait_list("s"),
        vec![
            (b.clone(), 2),
            (c.clone(), 1),
            (d.clone(), 3),
            (f.clone(), 1)
        ]
    );
    let sem = e.sem("ns", "s");
    assert_eq!(int(&sem, "waiters"), 4);
    // The head's entry, field by field.
    let r = e.ok(&["SEM.WAITERS", "ns", "s"]);
    let head = &list(&r, "waiters")[0];
    assert_eq!(text(head, "process_id"), "proc-b");
    assert_eq!(int(head, "parked_at"), T0 + S);
    assert_eq!(int(head, "deadline"), T0 + 11 * S);
    assert_eq!(int(head, "client_id"), CLIENT as i64);
    // Two at a time: every page but the last full, back again to exactly the first.
    let p1 = e.ok(&["SEM.WAITERS", "ns", "s", "LIMIT", "2"]);
    assert_eq!(list(&p1, "waiters").len(), 2);
    assert_eq!(text(&p1, "previous_cursor"), "");
    let next = text(&p1, "next_cursor");
    let p2 = e.ok(&["SEM.WAITERS", "ns", "s", "CURSOR", &next, "LIMIT", "2"]);
    let leases = |p: &Reply| -> Vec<String> {
        list(p, "waiters")
            .iter()
            .map(|w| text(w, "lease_id"))
            .collect()
    };
    assert_eq!(leases(&p2), vec![d.clone(), f.clone()]);
    assert_eq!(text(&p2, "next_cursor"), "");
    let prev = text(&p2, "previous_cursor");
    let back = e.ok(&["SEM.WAITERS", "ns", "s", "CURSOR", &prev, "LIMIT", "2"]);
    assert_eq!(leases(&back), leases(&p1));
    let bad = e.err(&["SEM.WAITERS", "ns", "s", "CURSOR", "nope"]);
    assert_eq!(bad.code(), "INVALIDARG");

    // Leaving: a time-out, a cancel, a grant.
    e.at(T0 + 2 * S + S / 2);
    assert_eq!(outcome(only_for(&e.outbox(), wf)), TIMED_OUT);
    assert!(e.shard.cancel(e.now, wd, Cancel::Disconnected));
    assert_eq!(e.wait_list("s"), vec![(b.clone(), 2), (c.clone(), 1)]);
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert_eq!(outcome(only_for(&e.outbox(), wb)), ACQUIRED);
    assert!(e.wait_list("s").is_empty());
    assert_eq!(int(&e.sem("ns", "s"), "waiters"), 0);
    assert_eq!(e.err(&["SEM.WAITERS", "ns", "t"]).code(), "NOTFOUND");
}

#[test]
fn when_the_head_leaves_the_queue_moves_on_at_once() {
    for how in [
        "timeout",
        "disconnect",
        "unblock-timeout",
        "unblock-error",
        "revoke",
    ] {
        let mut e = Eng::new();
        e.setup("ns", "s", 2);
        let a = e.lease("ns", "a", 60);
        let b = e.lease("ns", "b", 60);
        let c = e.lease("ns", "c", 60);
        e.got("s", &a, 1);
        let w1 = e.waiting("s", &b, 2, "5");
        let w2 = e.waiting("s", &c, 1, "30");
        e.at(T0 + S);
        match how {
            "timeout" => e.at(T0 + 5 * S),
            "disconnect" => assert!(e.shard.cancel(e.now, w1, Cancel::Disconnected)),
            "unblock-timeout" => assert!(e.shard.cancel(e.now, w1, Cancel::UnblockTimeout)),
            "unblock-error" => assert!(e.shard.cancel(e.now, w1, Cancel::UnblockError)),
            _ => assert_eq!(e.ok(&["LEASE.REVOKE", "ns", &b]), Reply::OK),
        }
        let out = e.outbox();
        assert_eq!(outcome(only_for(&out, w2)), ACQUIRED, "{how}");
        let mine: Vec<&Reply> = out
            .iter()
            .filter(|(w, _)| *w == w1)
            .map(|(_, r)| r)
            .collect();
        match how {
            "disconnect" => assert!(mine.is_empty(), "a gone client gets no reply"),
            "timeout" | "unblock-timeout" => assert_eq!(outcome(mine[0]), TIMED_OUT),
            "unblock-error" => assert_eq!(
                mine[0],
                &Reply::Error(Error::Unblocked(
                    "client unblocked via CLIENT UNBLOCK".into()
                ))
            ),
            _ => assert_eq!(code(mine[0]), "NOTFOUND"),
        }
        assert_eq!(e.shard.counts().waiters, 0, "{how}");
        assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 1), (c.clone(), 1)]);
        // Nobody is left to cancel, and nothing of w1 fires later.
        assert!(!e.shard.cancel(e.now, w1, Cancel::UnblockTimeout));
        assert!(!e.shard.cancel(e.now, w2, Cancel::Disconnected));
        let unblocked = matches!(how, "unblock-timeout" | "unblock-error") as u64;
        assert_eq!(e.shard.stats().clients_unblocked, unblocked, "{how}");
        e.at(T0 + 30 * S);
        assert!(e.outbox().is_empty());
    }
}

#[test]
fn a_disconnected_waiter_is_never_granted() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    assert!(e.shard.cancel(e.now, w, Cancel::Disconnected));
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert!(e.outbox().is_empty());
    assert!(e.hold_list("ns", "s").is_empty());
    assert_eq!(e.shard.stats().acquire_acquired, 1);
}

#[test]
fn cancel_after_the_deadline_is_a_time_out_not_a_cancel() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "1");
    assert!(!e.shard.cancel(T0 + S, w, Cancel::UnblockError));
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, w)), TIMED_OUT);
    assert_eq!(e.shard.stats().clients_unblocked, 0);
}

// ---------------------------------------------------------------------------------------------
// SEM.UPDATE with waiters
// ---------------------------------------------------------------------------------------------

#[test]
fn raising_permits_wakes_waiters() {
    let mut e = Eng::new();
    e.setup("ns", "s", 2);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    e.got("s", &a, 2);
    let w1 = e.waiting("s", &b, 2, "30");
    let w2 = e.waiting("s", &c, 1, "30");
    let w3 = e.waiting("s", &d, 2, "30");
    e.at(T0 + 2 * S);
    let r = e.ok(&[
        "SEM.UPDATE",
        "ns",
        "s",
        "5",
        "VERSION",
        "1",
        "DESC",
        "bigger",
    ]);
    assert_eq!(int(&r, "permits"), 5);
    assert_eq!(int(&r, "version"), 2);
    assert_eq!(int(&r, "updated_at"), T0 + 2 * S);
    assert_eq!(text(&r, "description"), "bigger");
    // The reply is the state after the command: the woken waiters hold already.
    assert_eq!(int(&r, "active_holds"), 5);
    assert_eq!(int(&r, "active_holders_count"), 3);
    let out = e.outbox();
    let ids: Vec<WaiterId> = out.iter().map(|(w, _)| *w).collect();
    assert_eq!(ids, vec![w1, w2]);
    assert_eq!(e.shard.counts().waiters, 1);
    // w3 still waits and is served when room comes.
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert_eq!(outcome(only_for(&e.outbox(), w3)), ACQUIRED);
}

#[test]
fn lowering_permits_ends_waiters_that_can_never_fit() {
    let mut e = Eng::new();
    e.setup("ns", "s", 5);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    e.got("s", &a, 1);
    let w1 = e.waiting("s", &b, 5, "30");
    let w2 = e.waiting("s", &c, 2, "30");
    let w3 = e.waiting("s", &d, 4, "30");
    e.at(T0 + S);
    let r = e.ok(&["SEM.UPDATE", "ns", "s", "3", "VERSION", "1"]);
    let out = e.outbox();
    let too_heavy = Reply::Error(Error::InvalidArg("weight exceeds semaphore permits".into()));
    assert_eq!(only_for(&out, w1), &too_heavy);
    assert_eq!(only_for(&out, w3), &too_heavy);
    // With the heavy head gone, the next one fits.
    assert_eq!(outcome(only_for(&out, w2)), ACQUIRED);
    assert_eq!(out.len(), 3);
    assert_eq!(int(&r, "permits"), 3);
    assert_eq!(int(&r, "active_holds"), 3);
    assert_eq!(e.shard.counts().waiters, 0);
    assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 1), (c.clone(), 2)]);
    // Below the active holds: rejected, nothing changes.
    let before = e.sem("ns", "s");
    let below = e.err(&["SEM.UPDATE", "ns", "s", "2", "VERSION", "2"]);
    assert_eq!(below.code(), "INVALIDARG");
    assert_eq!(e.sem("ns", "s"), before);
    // Down to exactly the active holds is allowed.
    let r = e.ok(&["SEM.UPDATE", "ns", "s", "3", "VERSION", "2"]);
    assert_eq!(int(&r, "version"), 3);
}

#[test]
fn lowering_permits_ends_a_too_heavy_waiter_even_behind_a_blocked_head() {
    let mut e = Eng::new();
    e.setup("ns", "s", 5);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    e.got("s", &a, 3);
    let w1 = e.waiting("s", &b, 3, "30");
    let w2 = e.waiting("s", &c, 5, "30");
    let r = e.ok(&["SEM.UPDATE", "ns", "s", "4", "VERSION", "1"]);
    let out = e.outbox();
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        only_for(&out, w2),
        &Reply::Error(Error::InvalidArg("weight exceeds semaphore permits".into()))
    );
    assert_eq!(int(&r, "active_holds"), 3);
    assert_eq!(e.shard.counts().waiters, 1);
    // w1 (3 of 4) still waits for a's permits.
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert_eq!(outcome(only_for(&e.outbox(), w1)), ACQUIRED);
}

#[test]
fn lowering_permits_below_a_growing_reacquire_ends_it_but_keeps_the_hold() {
    let mut e = Eng::new();
    e.setup("ns", "s", 6);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    e.got("s", &b, 3);
    let w = e.waiting("s", &a, 5, "30");
    let r = e.ok(&["SEM.UPDATE", "ns", "s", "4", "VERSION", "1"]);
    assert_eq!(code(only_for(&e.outbox(), w)), "INVALIDARG");
    assert_eq!(int(&r, "active_holds"), 4);
    assert_eq!(e.hold_list("ns", "s"), vec![(a, 1), (b, 3)]);
}

// ---------------------------------------------------------------------------------------------
// Deleting with waiters; fencing
// ---------------------------------------------------------------------------------------------

#[test]
fn deleting_a_semaphore_ends_its_waiters_and_tokens_keep_rising() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    e.ok(&["SEM.CREATE", "ns", "other", "1"]);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let t1 = e.got("s", &a, 1);
    e.got("other", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    assert_eq!(e.ok(&["SEM.DELETE", "ns", "s"]), Reply::OK);
    let out = e.outbox();
    assert_eq!(
        only_for(&out, w),
        &Reply::Error(Error::NotFound(
            "semaphore 's' not found in namespace 'ns'".into()
        ))
    );
    let c = e.shard.counts();
    assert_eq!((c.semaphores, c.holders, c.waiters), (1, 1, 0));
    assert_eq!(e.err(&["SEM.GET", "ns", "s"]).code(), "NOTFOUND");
    assert_eq!(e.err(&["SEM.HOLDERS", "ns", "s"]).code(), "NOTFOUND");
    assert_eq!(
        e.ok(&["SEM.DELETE", "ns", "s"]),
        Reply::OK,
        "deleting nothing is OK"
    );
    assert_eq!(e.err(&["SEM.DELETE", "nope", "s"]).code(), "NOTFOUND");
    // The waiter's timer is gone with it.
    assert_eq!(e.shard.next_deadline(), Some(T0 + 60 * S));
    // Re-created at the same instant: a fresh semaphore, and tokens still rise.
    let r = e.ok(&["SEM.CREATE", "ns", "s", "1"]);
    assert_eq!(int(&r, "active_holds"), 0);
    let t2 = e.got("s", &a, 1);
    assert!(t2 > t1);
    // The lease still holds `other`; revoking it must not trip over the deleted semaphore.
    assert_eq!(e.ok(&["LEASE.REVOKE", "ns", &a]), Reply::OK);
    assert!(e.hold_list("ns", "other").is_empty());
    assert!(e.hold_list("ns", "s").is_empty());
}

#[test]
fn deleting_a_namespace_ends_everything_inside_and_tokens_keep_rising() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let t1 = e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    assert_eq!(e.ok(&["NS.DELETE", "ns"]), Reply::OK);
    let out = e.outbox();
    assert_eq!(code(only_for(&out, w)), "NOTFOUND");
    assert_eq!(e.shard.counts(), Counts::default());
    assert_eq!(e.shard.next_deadline(), None);
    assert_eq!(e.ok(&["NS.DELETE", "ns"]), Reply::OK);
    assert_eq!(e.err(&["SEM.GET", "ns", "s"]).code(), "NOTFOUND");
    assert_eq!(e.err(&["LEASE.GET", "ns", &a]).code(), "NOTFOUND");
    // Re-create both at the same instant: the token still rises.
    e.setup("ns", "s", 1);
    let c = e.lease("ns", "c", 60);
    assert_eq!(e.err(&["LEASE.GET", "ns", &a]).code(), "NOTFOUND");
    let t2 = e.got("s", &c, 1);
    assert!(t2 > t1, "{t2} > {t1}");
    // Nothing of the old namespace fires later.
    e.at(T0 + 60 * S - 1);
    assert!(e.outbox().is_empty());
    assert_eq!(e.shard.stats().leases_expired, 0);
}

#[test]
fn fencing_tokens_count_up_from_the_high_water_mark() {
    let mut e = Eng::new();
    e.setup("ns", "s", 10);
    e.ok(&["SEM.CREATE", "ns", "t", "10"]);
    let l: Vec<String> = (0..4)
        .map(|i| e.lease("ns", &format!("p{i}"), 60))
        .collect();
    // A fresh shard counts from 1, one above the high-water mark each time.
    assert_eq!(e.got("s", &l[0], 1), 1);
    assert_eq!(e.got("s", &l[1], 1), 2);
    // The mark is the shard's: another semaphore continues above it.
    assert_eq!(e.got("t", &l[0], 1), 3);
    // Re-acquire keeps the token, up or down.
    assert_eq!(e.got("s", &l[0], 3), 1);
    assert_eq!(e.got("s", &l[0], 2), 1);
    // Later: the clock plays no part (a counter stays below 2^53, SPEC §3).
    e.at(T0 + 5 * S);
    assert_eq!(e.got("s", &l[2], 1), 4);
    // Release and re-acquire: a new holder, a new token.
    e.ok(&["SEM.RELEASE", "ns", "s", &l[0]]);
    assert_eq!(e.got("s", &l[0], 1), 5);
    let h = e.holders("ns", "s");
    let tokens: Vec<i64> = h.iter().map(|h| int(h, "fencing_token")).collect();
    assert_eq!(tokens, vec![2, 4, 5], "oldest first");
}

// ---------------------------------------------------------------------------------------------
// Time: everything due at one instant happens at that instant
// ---------------------------------------------------------------------------------------------

#[test]
fn a_forward_clock_step_shifts_every_death_and_deadline_and_expires_nothing() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 10);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    e.at(T0 + 5 * S);
    e.shard.take_journal();
    // The wall clock jumps an hour ahead: the caller shifts before it runs anything there.
    let hour = 3600 * S;
    e.shard.shift_time(T0 + 5 * S + hour, hour);
    assert_eq!(
        e.shard.take_journal(),
        vec![Record::TimeShift {
            by: hour,
            at: T0 + 5 * S + hour
        }],
        "one record for the whole shard"
    );
    e.at(T0 + 5 * S + hour);
    assert!(e.outbox().is_empty(), "nothing expired or timed out");
    assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 1)]);
    assert_eq!(
        int(&e.ok(&["LEASE.GET", "ns", &a]), "expires_at"),
        T0 + 10 * S + hour
    );
    // What was due 5 s after the step is due 5 s after it still: a dies, b is served.
    e.at(T0 + 10 * S + hour - 1);
    assert_eq!(e.hold_list("ns", "s"), vec![(a.clone(), 1)]);
    e.at(T0 + 10 * S + hour);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, w)), ACQUIRED);
    assert_eq!(e.hold_list("ns", "s"), vec![(b.clone(), 1)]);
    // A refresh after the step counts from the new now.
    let r = e.ok(&["LEASE.REFRESH", "ns", &b, "20"]);
    assert_eq!(int(&r, "expires_at"), T0 + 30 * S + hour);
}

#[test]
fn a_new_leaders_grace_extends_the_leases_alive_at_the_floor_and_revives_none() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let dead = e.lease("ns", "dead", 5);
    let short = e.lease("ns", "short", 10);
    let long = e.lease("ns", "long", 60);
    e.got("s", &short, 1);
    e.shard.take_journal();
    // The log's last instant is T0 + 5 s (`dead` died then, unseen); a leader takes over at
    // T0 + 8 s with a grace of 4 s.
    e.shard.extend_leases(T0 + 5 * S, T0 + 12 * S);
    let journal = e.shard.take_journal();
    let extended: Vec<(String, i64)> = journal
        .iter()
        .map(|r| match r {
            Record::LeasePut { id, expires_at, .. } => (
                String::from_utf8(id.to_bytes().to_vec()).unwrap(),
                *expires_at,
            ),
            other => panic!("only LeasePut records: {other:?}"),
        })
        .collect();
    assert_eq!(
        extended,
        vec![(short.clone(), T0 + 12 * S)],
        "one record per extended lease"
    );
    let expires = |e: &mut Eng, l: &str| int(&e.ok(&["LEASE.GET", "ns", l]), "expires_at");
    assert_eq!(expires(&mut e, &long), T0 + 60 * S, "a later death is kept");
    // The holder outlives its own TTL by the grace, then dies; the dead lease stays dead.
    e.at(T0 + 11 * S);
    assert_eq!(e.hold_list("ns", "s"), vec![(short.clone(), 1)]);
    assert_eq!(e.err(&["LEASE.GET", "ns", &dead]).code(), "NOTFOUND");
    e.at(T0 + 12 * S);
    assert!(e.hold_list("ns", "s").is_empty());
}

#[test]
fn a_shifted_waiter_times_out_at_its_shifted_deadline() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 300);
    let b = e.lease("ns", "b", 300);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    e.shard.shift_time(T0 + 100 * S, 100 * S);
    e.at(T0 + 129 * S);
    assert!(e.outbox().is_empty());
    e.at(T0 + 130 * S);
    assert_eq!(outcome(only_for(&e.outbox(), w)), TIMED_OUT);
}

#[test]
fn a_lease_dying_at_the_same_instant_as_the_holder_gets_no_grant() {
    // Holder a and waiter b die at the same nanosecond. b is dead at that instant, so its
    // parked acquire ends NOTFOUND: it must not be granted a's permits first.
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 10);
    let b = e.lease("ns", "b", 10);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "30");
    e.at(T0 + 10 * S);
    let out = e.outbox();
    assert_eq!(code(only_for(&out, w)), "NOTFOUND", "{out:?}");
    assert_eq!(e.shard.stats().acquire_acquired, 1);
    assert!(e.hold_list("ns", "s").is_empty());
    // The next new holder's token follows a's: nothing was burnt on a dead lease.
    let c = e.lease("ns", "c", 10);
    assert_eq!(e.got("s", &c, 1), 2);
}

#[test]
fn a_waiter_at_its_deadline_times_out_even_if_permits_free_then() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 10);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    e.at(T0 + secs(7.5));
    let w = e.waiting("s", &b, 1, "2.5");
    e.at(T0 + 10 * S);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, w)), TIMED_OUT);
    assert!(e.hold_list("ns", "s").is_empty());
}

#[test]
fn grants_during_a_time_jump_happen_at_their_own_instant() {
    // a's lease dies at +10 s; b waits (its own lease dies at +15 s). The clock then jumps to
    // +50 s: b was granted at +10 s (while alive), and lost the hold when its lease died.
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 10);
    let b = e.lease("ns", "b", 15);
    e.got("s", &a, 1);
    let w = e.waiting("s", &b, 1, "100");
    e.now = T0 + 50 * S;
    let s = e.sem("ns", "s");
    assert_eq!(int(&s, "active_holds"), 0);
    assert_eq!(int(&s, "last_activity_at"), T0 + 10 * S);
    let out = e.outbox();
    let g = only_for(&out, w);
    assert_eq!(outcome(g), ACQUIRED);
    assert_eq!(int(g, "fencing_token"), 2, "the count after a's 1");
    assert_eq!(int(field(g, "semaphore"), "last_activity_at"), T0 + 10 * S);
    assert_eq!(e.shard.stats().leases_expired, 2);
}

// ---------------------------------------------------------------------------------------------
// Quotas, NOTFOUND, versions, rejected commands
// ---------------------------------------------------------------------------------------------

#[test]
fn holder_quota_answers_resource_exhausted_at_once() {
    let mut e = Eng::with_limits(Limits {
        max_holders_per_semaphore: 2,
        ..Limits::default()
    });
    e.setup("ns", "s", 3);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    e.got("s", &a, 2);
    let w_b = e.waiting("s", &b, 2, "30");
    let w_c = e.waiting("s", &c, 1, "30");
    e.got("s", &a, 2); // same weight: no change
                       // a shrinks to 1: b fits (2 holders: a, b) and c would be a third: RESOURCEEXHAUSTED.
    e.got("s", &a, 1);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, w_b)), ACQUIRED);
    assert_eq!(code(only_for(&out, w_c)), "RESOURCEEXHAUSTED");
    // At the quota, a new holder is refused at once, even with a timeout.
    let before = e.sem("ns", "s");
    match e.acquire("s", &d, 1, "30") {
        Exec::Reply(r) => assert_eq!(code(&r), "RESOURCEEXHAUSTED"),
        Exec::Parked(_) => panic!("parked at the holder quota"),
    }
    assert_eq!(e.sem("ns", "s"), before);
    // An existing holder can still re-acquire.
    e.ok(&["SEM.RELEASE", "ns", "s", &b]);
    assert_eq!(outcome(&reply(e.acquire("s", &a, 3, "0"))), ACQUIRED);
}

#[test]
fn notfound_everywhere_it_should_be() {
    let mut e = Eng::new();
    let nf = |e: &mut Eng, w: &[&str]| assert_eq!(e.err(w).code(), "NOTFOUND", "{w:?}");
    let fake = String::from_utf8(LeaseId::from_counter(999).to_bytes().to_vec()).unwrap();
    nf(&mut e, &["NS.GET", "ns"]);
    nf(&mut e, &["SEM.GET", "ns", "s"]);
    nf(&mut e, &["SEM.LIST", "ns"]);
    nf(&mut e, &["SEM.CREATE", "ns", "s", "1"]);
    nf(&mut e, &["SEM.DELETE", "ns", "s"]);
    nf(&mut e, &["SEM.RELEASE", "ns", "s", &fake]);
    nf(&mut e, &["SEM.ACQUIRE", "ns", "s", &fake, "1", "0"]);
    nf(&mut e, &["LEASE.CREATE", "ns", "p", "10"]);
    nf(&mut e, &["LEASE.LIST", "ns"]);
    nf(&mut e, &["NS.UPDATE", "ns", "VERSION", "1"]);
    assert_eq!(e.ok(&["NS.DELETE", "ns"]), Reply::OK);
    e.setup("ns", "s", 2);
    nf(&mut e, &["SEM.GET", "ns", "t"]);
    nf(&mut e, &["SEM.GET", "NS", "s"]); // names are case-sensitive
    nf(&mut e, &["SEM.UPDATE", "ns", "t", "1", "VERSION", "1"]);
    nf(&mut e, &["SEM.HOLDERS", "ns", "t"]);
    nf(&mut e, &["SEM.ACQUIRE", "ns", "t", &fake, "1", "0"]);
    for lease in [fake.as_str(), "ls_short", "not-a-lease", ""] {
        nf(&mut e, &["SEM.ACQUIRE", "ns", "s", lease, "1", "0"]);
        nf(&mut e, &["SEM.RELEASE", "ns", "s", lease]);
        nf(&mut e, &["LEASE.GET", "ns", lease]);
        nf(&mut e, &["LEASE.REFRESH", "ns", lease, "10"]);
        nf(&mut e, &["LEASE.REVOKE", "ns", lease]);
    }
    // A lease of another namespace is unknown here.
    e.ok(&["NS.CREATE", "other"]);
    let o = e.lease("other", "p", 60);
    nf(&mut e, &["SEM.ACQUIRE", "ns", "s", &o, "1", "0"]);
    nf(&mut e, &["LEASE.GET", "ns", &o]);
    // Nothing of that moved the semaphore.
    let s = e.sem("ns", "s");
    assert_eq!(int(&s, "last_activity_at"), T0);
    assert_eq!(e.shard.stats().acquire_unavailable, 0);
}

#[test]
fn release_of_nothing_is_a_no_op() {
    let mut e = Eng::new();
    e.setup("ns", "s", 2);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    e.got("s", &a, 1);
    e.at(T0 + S);
    let before = e.sem("ns", "s");
    let r = e.ok(&["SEM.RELEASE", "ns", "s", &b]);
    assert_eq!(r, before);
    assert_eq!(int(&r, "last_activity_at"), T0);
    let r = e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert_eq!(int(&r, "last_activity_at"), T0 + S);
    assert_eq!(int(&r, "active_holds"), 0);
    e.at(T0 + 2 * S);
    let r = e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    assert_eq!(
        int(&r, "last_activity_at"),
        T0 + S,
        "a second release is a no-op"
    );
}

#[test]
fn versions_and_full_replacement_updates() {
    let mut e = Eng::new();
    let r = e.ok(&["NS.CREATE", "ns", "DESC", "d", "META", "k", "v"]);
    assert_eq!(int(&r, "version"), 1);
    assert_eq!(int(&r, "created_at"), int(&r, "updated_at"));
    let r = e.ok(&["SEM.CREATE", "ns", "s", "3", "DESC", "sd", "META", "a", "1"]);
    assert_eq!(int(&r, "version"), 1);
    assert_eq!(int(&r, "created_at"), T0);
    assert_eq!(int(&r, "updated_at"), T0);
    assert_eq!(int(&r, "last_activity_at"), T0);
    e.at(T0 + S);
    let before = e.sem("ns", "s");
    let err = e.err(&["SEM.UPDATE", "ns", "s", "4", "VERSION", "2"]);
    assert_eq!(err.code(), "INVALIDARG");
    assert!(err.message().contains("version mismatch"), "{err}");
    assert_eq!(e.sem("ns", "s"), before);
    let r = e.ok(&["SEM.UPDATE", "ns", "s", "4", "VERSION", "1"]);
    assert_eq!(int(&r, "version"), 2);
    assert_eq!(int(&r, "updated_at"), T0 + S);
    assert_eq!(
        int(&r, "last_activity_at"),
        T0,
        "updates do not move last_activity_at"
    );
    assert_eq!(
        text(&r, "description"),
        "",
        "DESC left out is written as empty"
    );
    assert_eq!(field(&r, "metadata"), &Reply::Map(vec![]));
    assert_eq!(
        e.err(&["SEM.UPDATE", "ns", "s", "4", "VERSION", "1"])
            .code(),
        "INVALIDARG"
    );

    let err = e.err(&["NS.UPDATE", "ns", "VERSION", "7"]);
    assert_eq!(err.code(), "INVALIDARG");
    let n = e.ok(&["NS.GET", "ns"]);
    assert_eq!(int(&n, "version"), 1);
    assert_eq!(text(&n, "description"), "d");
    let n = e.ok(&["NS.UPDATE", "ns", "VERSION", "1", "META", "x", "y"]);
    assert_eq!(int(&n, "version"), 2);
    assert_eq!(int(&n, "updated_at"), T0 + S);
    assert_eq!(int(&n, "created_at"), T0);
    assert_eq!(text(&n, "description"), "");
    assert_eq!(
        field(&n, "metadata"),
        &Reply::Map(vec![(Reply::bulk("x"), Reply::bulk("y"))])
    );
    // Acquire and release do not touch version or updated_at.
    let a = e.lease("ns", "a", 60);
    e.at(T0 + 2 * S);
    e.got("s", &a, 1);
    e.ok(&["SEM.RELEASE", "ns", "s", &a]);
    let s = e.sem("ns", "s");
    assert_eq!(int(&s, "version"), 2);
    assert_eq!(int(&s, "updated_at"), T0 + S);
    assert_eq!(int(&s, "last_activity_at"), T0 + 2 * S);
}

/// Everything a client could see of one namespace.
fn snapshot(e: &mut Eng) -> Vec<Reply> {
    let mut v = vec![
        e.ok(&["NS.GET", "ns"]),
        e.ok(&["SEM.LIST", "ns", "LIMIT", "250"]),
        e.ok(&["LEASE.LIST", "ns", "LIMIT", "250"]),
    ];
    for s in ["s", "t"] {
        v.push(e.ok(&["SEM.HOLDERS", "ns", s, "LIMIT", "250"]));
    }
    v
}

#[test]
fn rejected_commands_change_nothing() {
    let mut e = Eng::with_limits(Limits {
        max_holders_per_semaphore: 2,
        max_semaphores_per_namespace: 2,
        max_leases_per_namespace: 4,
        ..Limits::default()
    });
    e.setup("ns", "s", 3);
    e.ok(&["SEM.CREATE", "ns", "t", "1"]);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let c = e.lease("ns", "c", 60);
    let d = e.lease("ns", "d", 60);
    e.got("s", &a, 2);
    e.got("s", &b, 1);
    e.got("t", &c, 1);
    let w = e.waiting("t", &d, 1, "30");
    e.at(T0 + S);
    let before = snapshot(&mut e);
    let counts = e.shard.counts();
    let stats = e.shard.stats();
    let deadline = e.shard.next_deadline();
    let fake = String::from_utf8(LeaseId::from_counter(999).to_bytes().to_vec()).unwrap();
    let rejected: Vec<Vec<&str>> = vec![
        vec!["SEM.ACQUIRE", "ns", "s", &c, "4", "10"], // weight exceeds
        vec!["SEM.ACQUIRE", "ns", "s", &c, "1", "10"], // holder quota
        vec!["SEM.ACQUIRE", "ns", "s", &fake, "1", "10"], // unknown lease
        vec!["SEM.ACQUIRE", "ns", "s", &a, "0", "10"], // weight 0
        vec!["SEM.ACQUIRE", "ns", "s", &a, "1", "-1"], // bad timeout
        vec!["SEM.ACQUIRE", "ns", "s", &a, "1", "301"], // timeout above max
        vec!["SEM.ACQUIRE", "ns", "zz", &a, "1", "0"],
        vec!["SEM.UPDATE", "ns", "s", "2", "VERSION", "1"], // below active holds
        vec!["SEM.UPDATE", "ns", "s", "9", "VERSION", "5"], // version mismatch
        vec!["SEM.UPDATE", "ns", "s", "9"],                 // no VERSION
        vec!["SEM.CREATE", "ns", "s", "9"],                 // exists
        vec!["SEM.CREATE", "ns", "u", "9"],                 // semaphore quota
        vec!["SEM.CREATE", "ns", "bad name", "9"],
        vec!["NS.CREATE", "ns"],
        vec!["NS.UPDATE", "ns", "VERSION", "3"],
        vec!["LEASE.REFRESH", "ns", &fake, "10"],
        vec!["LEASE.REFRESH", "ns", &a, "0"],
        vec!["LEASE.REFRESH", "ns", &a, "301"],
        vec!["LEASE.REVOKE", "ns", &fake],
        vec!["SEM.RELEASE", "ns", "s", &fake],
        vec!["SEM.RELEASE", "ns", "zz", &a],
        vec!["SEM.RELEASE", "ns", "s", &d], // holds nothing there: a no-op
        vec!["SEM.HOLDERS", "ns", "s", "CURSOR", "bogus"],
        vec!["SEM.LIST", "ns", "LIMIT", "0"],
    ];
    for words in &rejected {
        match e.run(words) {
            Exec::Reply(_) => {}
            Exec::Parked(_) => panic!("{words:?} parked"),
        }
    }
    // The lease quota: a fifth lease is refused.
    let req = EngineRequest::LeaseCreate(LeaseCreate {
        ns: Name::new_unchecked(Bytes::from_static(b"ns")),
        id: LeaseId::from_counter(500),
        process_id: Bytes::from_static(b"p"),
        ttl: 10 * S,
        meta: Metadata::default(),
    });
    assert_eq!(code(&reply(e.exec(req))), "RESOURCEEXHAUSTED");
    assert_eq!(snapshot(&mut e), before);
    assert_eq!(e.shard.counts(), counts);
    assert_eq!(e.shard.stats(), stats);
    assert_eq!(e.shard.next_deadline(), deadline);
    assert!(e.outbox().is_empty());
    // The waiter is still there, unharmed.
    e.ok(&["SEM.RELEASE", "ns", "t", &c]);
    assert_eq!(outcome(only_for(&e.outbox(), w)), ACQUIRED);
}

#[test]
fn last_activity_moves_only_on_acquire_and_effective_release() {
    let mut e = Eng::new();
    e.setup("ns", "s", 1);
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    let la = |e: &mut Eng| int(&e.sem("ns", "s"), "last_activity_at");
    e.at(T0 + 1);
    e.got("s", &a, 1);
    assert_eq!(la(&mut e), T0 + 1);
    e.at(T0 + 2);
    reply(e.acquire("s", &b, 1, "0")); // UNAVAILABLE
    assert_eq!(la(&mut e), T0 + 2);
    e.at(T0 + 3);
    let w = e.waiting("s", &b, 1, "1"); // parking
    assert_eq!(la(&mut e), T0 + 3);
    e.at(T0 + 4);
    e.ok(&["SEM.HOLDERS", "ns", "s"]);
    e.ok(&["SEM.LIST", "ns"]);
    e.ok(&["LEASE.REFRESH", "ns", &a, "60"]);
    assert_eq!(la(&mut e), T0 + 3);
    e.at(T0 + 3 + S); // time-out
    assert_eq!(outcome(only_for(&e.outbox(), w)), TIMED_OUT);
    assert_eq!(la(&mut e), T0 + 3);
    e.at(T0 + 5 * S);
    let w = e.waiting("s", &b, 1, "10");
    e.at(T0 + 6 * S);
    e.ok(&["SEM.RELEASE", "ns", "s", &a]); // release + grant to b
    assert_eq!(outcome(only_for(&e.outbox(), w)), ACQUIRED);
    assert_eq!(la(&mut e), T0 + 6 * S);
    e.at(T0 + 7 * S);
    let w = e.waiting("s", &a, 1, "10");
    assert!(e.shard.cancel(e.now, w, Cancel::Disconnected));
    assert_eq!(
        la(&mut e),
        T0 + 7 * S,
        "parking moved it; the cancel did not"
    );
    e.at(T0 + 8 * S);
    e.ok(&["SEM.UPDATE", "ns", "s", "1", "VERSION", "1"]);
    assert_eq!(la(&mut e), T0 + 7 * S);
}

// ---------------------------------------------------------------------------------------------
// Pagination
// ---------------------------------------------------------------------------------------------

struct PageSeen {
    keys: Vec<String>,
    next: String,
    prev: String,
}

/// Reads one page: the list's item keys and both cursors.
fn page(
    e: &mut Eng,
    base: &[&str],
    list_key: &str,
    item_key: &str,
    cursor: &str,
    limit: usize,
) -> PageSeen {
    let mut w: Vec<String> = base.iter().map(|s| s.to_string()).collect();
    if !cursor.is_empty() {
        w.push("CURSOR".into());
        w.push(cursor.into());
    }
    w.push("LIMIT".into());
    w.push(limit.to_string());
    let words: Vec<&str> = w.iter().map(String::as_str).collect();
    let r = e.ok(&words);
    let keys = list(&r, list_key)
        .iter()
        .map(|item| match field(item, item_key) {
            Reply::Bulk(b) => String::from_utf8(b.to_vec()).unwrap(),
            Reply::Int(i) => format!("{i:020}"),
            other => panic!("{other:?}"),
        })
        .collect();
    PageSeen {
        keys,
        next: text(&r, "next_cursor"),
        prev: text(&r, "previous_cursor"),
    }
}

/// Walks a listing forward, then back from the last page, checking every page.
fn walk_exactly(e: &mut Eng, base: &[&str], list_key: &str, item_key: &str, all: &[String]) {
    for limit in [1, 2, 5, 7, all.len(), all.len() + 3] {
        let mut pages = vec![page(e, base, list_key, item_key, "", limit)];
        while !pages.last().unwrap().next.is_empty() {
            let c = pages.last().unwrap().next.clone();
            pages.push(page(e, base, list_key, item_key, &c, limit));
            assert!(pages.len() <= all.len() + 1, "the walk does not end");
        }
        let seen: Vec<String> = pages.iter().flat_map(|p| p.keys.clone()).collect();
        assert_eq!(seen, all, "limit {limit}: every item once, in order");
        for (i, p) in pages.iter().enumerate() {
            if i + 1 < pages.len() {
                assert_eq!(p.keys.len(), limit, "every page but the last is full");
            }
            assert_eq!(
                p.prev.is_empty(),
                i == 0,
                "previous_cursor only after the first page"
            );
        }
        // Back from every page: exactly the page before, whose own cursors are those pages'.
        for i in 1..pages.len() {
            let back = page(e, base, list_key, item_key, &pages[i].prev, limit);
            assert_eq!(
                back.keys,
                pages[i - 1].keys,
                "limit {limit}, back from page {i}"
            );
            assert_eq!(back.prev.is_empty(), i == 1);
            let fwd = page(e, base, list_key, item_key, &back.next, limit);
            assert_eq!(
                fwd.keys, pages[i].keys,
                "forward again from the page before"
            );
        }
        // A full walk backwards from the last page sees everything once, in reverse.
        let mut back_keys: Vec<String> = pages.last().unwrap().keys.clone();
        let mut c = pages.last().unwrap().prev.clone();
        while !c.is_empty() {
            let p = page(e, base, list_key, item_key, &c, limit);
            let mut k = p.keys.clone();
            k.extend(back_keys);
            back_keys = k;
            c = p.prev;
        }
        assert_eq!(back_keys, all);
    }
}

#[test]
fn pagination_walks_every_item_once_forward_and_back() {
    let mut e = Eng::new();
    let n = 23;
    let mut ns_names: Vec<String> = (0..n).map(|i| format!("ns{i:02}")).collect();
    for name in &ns_names {
        e.ok(&["NS.CREATE", name]);
    }
    ns_names.sort();
    walk_exactly(&mut e, &["NS.LIST"], "namespaces", "name", &ns_names);

    e.ok(&["NS.CREATE", "ns"]);
    // Created out of order: listed by name.
    let mut sems: Vec<String> = (0..n).map(|i| format!("s{:02}", (i * 7) % n)).collect();
    for s in &sems {
        e.ok(&["SEM.CREATE", "ns", s, "100"]);
    }
    sems.sort();
    walk_exactly(&mut e, &["SEM.LIST", "ns"], "semaphores", "name", &sems);

    // Leases are listed in creation order; holders oldest first.
    let mut leases = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..n {
        e.at(T0 + i as i64 * 1000);
        let l = e.lease("ns", if i % 2 == 0 { "even" } else { "odd" }, 60);
        tokens.push(format!("{:020}", e.got("s00", &l, 1)));
        leases.push(l);
    }
    walk_exactly(&mut e, &["LEASE.LIST", "ns"], "leases", "lease_id", &leases);
    let even: Vec<String> = leases.iter().step_by(2).cloned().collect();
    walk_exactly(
        &mut e,
        &["LEASE.LIST", "ns", "PROCESS", "even"],
        "leases",
        "lease_id",
        &even,
    );
    walk_exactly(
        &mut e,
        &["SEM.HOLDERS", "ns", "s00"],
        "holders",
        "fencing_token",
        &tokens,
    );

    // Empty listings: no cursors at all.
    let p = page(
        &mut e,
        &["SEM.HOLDERS", "ns", "s01"],
        "holders",
        "fencing_token",
        "",
        5,
    );
    assert!(p.keys.is_empty() && p.next.is_empty() && p.prev.is_empty());
    // The default page is 100 items.
    let r = e.ok(&["SEM.LIST", "ns"]);
    assert_eq!(list(&r, "semaphores").len(), n);
    // Cursors belong to their listing.
    let c = page(&mut e, &["SEM.LIST", "ns"], "semaphores", "name", "", 2).next;
    assert_eq!(
        e.err(&["LEASE.LIST", "ns", "CURSOR", &c]).code(),
        "INVALIDARG"
    );
    assert_eq!(
        e.err(&["SEM.LIST", "ns", "CURSOR", "xyz"]).code(),
        "INVALIDARG"
    );
    assert_eq!(
        e.err(&["SEM.LIST", "ns", "LIMIT", "251"]).code(),
        "INVALIDARG"
    );
}

#[test]
fn pagination_under_inserts_and_deletes_never_repeats_or_crashes() {
    let mut e = Eng::new();
    e.ok(&["NS.CREATE", "ns"]);
    let initial: Vec<String> = (0..30).map(|i| format!("s{:03}", i * 10)).collect();
    for s in &initial {
        e.ok(&["SEM.CREATE", "ns", s, "1"]);
    }
    let base = ["SEM.LIST", "ns"];
    // Forward, changing the listing around the cursor between pages.
    let mut seen: Vec<String> = Vec::new();
    let mut deleted: Vec<String> = Vec::new();
    let mut p = page(&mut e, &base, "semaphores", "name", "", 4);
    let mut step = 0;
    loop {
        seen.extend(p.keys.clone());
        if p.next.is_empty() {
            break;
        }
        step += 1;
        let last = p.keys.last().unwrap().clone();
        let n: usize = last[1..].parse().unwrap();
        // Delete the cursor item itself and the item right after it; insert one just after
        // the cursor (must be seen), one before it (must not be), and one far ahead.
        for d in [format!("s{n:03}"), format!("s{:03}", n + 10)] {
            e.ok(&["SEM.DELETE", "ns", &d]);
            deleted.push(d);
        }
        for ins in [n + 1, n.saturating_sub(1), n + 55] {
            let name = format!("s{ins:03}");
            if !seen.contains(&name) && !deleted.contains(&name) {
                let _ = e.run(&["SEM.CREATE", "ns", &name, "1"]);
            }
        }
        p = page(&mut e, &base, "semaphores", "name", &p.next, 4);
        assert!(step < 100, "the walk does not end");
    }
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, seen, "strictly increasing: no repeats");
    // Everything present from start to end was seen.
    for s in &initial {
        if !deleted.contains(s) {
            assert!(seen.contains(s), "{s} missed");
        }
    }

    // Backward from the end, deleting the cursor item between pages.
    let last = page(&mut e, &base, "semaphores", "name", "", 250);
    let all_now = last.keys.clone();
    let mut p = page(&mut e, &base, "semaphores", "name", "", 3);
    while !p.next.is_empty() {
        p = page(&mut e, &base, "semaphores", "name", &p.next, 3);
    }
    let mut back: Vec<String> = p.keys.clone();
    let mut removed = Vec::new();
    while !p.prev.is_empty() {
        let first = p.keys.first().cloned();
        if let Some(f) = first {
            e.ok(&["SEM.DELETE", "ns", &f]);
            removed.push(f);
        }
        p = page(&mut e, &base, "semaphores", "name", &p.prev, 3);
        let mut k = p.keys.clone();
        k.extend(back);
        back = k;
    }
    let mut sorted = back.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, back, "no repeats backwards either");
    for s in &all_now {
        assert!(
            back.contains(s) || removed.contains(s),
            "{s} missed going back"
        );
    }

    // Holders and leases: the cursor's own item released / revoked between pages.
    e.ok(&["SEM.CREATE", "ns", "h", "100"]);
    let mut leases = Vec::new();
    for i in 0..12 {
        e.at(T0 + i);
        let l = e.lease("ns", "p", 60);
        e.got("h", &l, 1);
        leases.push(l);
    }
    let hb = ["SEM.HOLDERS", "ns", "h"];
    let mut p = page(&mut e, &hb, "holders", "lease_id", "", 5);
    let mut seen = p.keys.clone();
    e.ok(&["SEM.RELEASE", "ns", "h", p.keys.last().unwrap()]);
    let late = e.lease("ns", "late", 60);
    e.got("h", &late, 1); // a new holder: newest, so at the end
    p = page(&mut e, &hb, "holders", "lease_id", &p.next, 5);
    seen.extend(p.keys.clone());
    let lb = ["LEASE.LIST", "ns"];
    let mut q = page(&mut e, &lb, "leases", "lease_id", "", 4);
    e.ok(&["LEASE.REVOKE", "ns", q.keys.last().unwrap()]);
    let back_cursor = q.next.clone();
    q = page(&mut e, &lb, "leases", "lease_id", &back_cursor, 4);
    assert_eq!(q.keys, leases[4..8].to_vec());
    let r = page(&mut e, &lb, "leases", "lease_id", &q.prev, 4);
    assert_eq!(
        r.keys,
        leases[0..3].to_vec(),
        "the revoked lease is gone, no crash"
    );
    while !p.next.is_empty() {
        p = page(&mut e, &hb, "holders", "lease_id", &p.next, 5);
        seen.extend(p.keys.clone());
    }
    // leases[3] and leases[4] were seen before they let go; `late` came in at the end.
    let mut expected: Vec<String> = leases.clone();
    expected.push(late.clone());
    assert_eq!(seen, expected);
}

// ---------------------------------------------------------------------------------------------
// SEM.ACQUIREALL (SPEC §12)
// ---------------------------------------------------------------------------------------------

impl Eng {
    /// `SEM.ACQUIREALL ns lease timeout sem weight ...` over `parts`; the shard's indexes are
    /// checked after it.
    fn acquire_all(&mut self, lease: &str, timeout: &str, parts: &[(&str, i64)]) -> Exec {
        let weights: Vec<String> = parts.iter().map(|(_, w)| w.to_string()).collect();
        let mut words = vec!["SEM.ACQUIREALL", "ns", lease, timeout];
        for ((sem, _), w) in parts.iter().zip(&weights) {
            words.push(sem);
            words.push(w);
        }
        let r = self.run(&words);
        self.shard.check();
        r
    }

    fn waiting_all(&mut self, lease: &str, timeout: &str, parts: &[(&str, i64)]) -> WaiterId {
        match self.acquire_all(lease, timeout, parts) {
            Exec::Parked(w) => w,
            Exec::Reply(r) => panic!("SEM.ACQUIREALL did not park: {r:?}"),
        }
    }

    fn release(&mut self, sem: &str, lease: &str) {
        self.ok(&["SEM.RELEASE", "ns", sem, lease]);
        self.shard.check();
    }
}

/// `(semaphore name, fencing token if any)` of each of a SEM.ACQUIREALL reply's holds.
fn holds_of(r: &Reply) -> Vec<(String, Option<i64>)> {
    list(r, "holds")
        .iter()
        .map(|h| {
            let token = has(h, "fencing_token").then(|| int(h, "fencing_token"));
            (text(field(h, "semaphore"), "name"), token)
        })
        .collect()
}

fn two_sems(a: i64, b: i64) -> Eng {
    let mut e = Eng::new();
    e.setup("ns", "a", a);
    e.setup("ns", "b", b);
    e
}

#[test]
fn acquireall_takes_every_semaphore_or_none() {
    let mut e = two_sems(2, 1);
    let x = e.lease("ns", "x", 60);
    let y = e.lease("ns", "y", 60);
    let r = reply(e.run(&[
        "SEM.ACQUIREALL",
        "ns",
        &x,
        "0",
        "b",
        "1",
        "a",
        "2",
        "META",
        "job",
        "7",
    ]));
    assert_eq!(outcome(&r), ACQUIRED);
    let holds = holds_of(&r);
    assert_eq!(holds.len(), 2);
    assert_eq!(
        (holds[0].0.as_str(), holds[1].0.as_str()),
        ("b", "a"),
        "in the order asked"
    );
    let (tb, ta) = (holds[0].1.unwrap(), holds[1].1.unwrap());
    assert!(tb < ta, "tokens given in the order asked");
    for sem in ["a", "b"] {
        let h = &e.holders("ns", sem)[0];
        assert_eq!(text(h, "lease_id"), x);
        assert_eq!(
            field(h, "metadata"),
            &Reply::Map(vec![(Reply::text("job"), Reply::text("7"))])
        );
    }
    // y fits a (after x lets one go) but not b: it gets nothing.
    e.ok(&["SEM.ACQUIRE", "ns", "a", &x, "1", "0"]);
    let r = reply(e.acquire_all(&y, "0", &[("a", 1), ("b", 1)]));
    assert_eq!(outcome(&r), UNAVAILABLE);
    assert_eq!(holds_of(&r), vec![("a".into(), None), ("b".into(), None)]);
    assert!(e.hold_list("ns", "a").iter().all(|(l, _)| *l == x));
    assert_eq!(
        int(&e.sem("ns", "a"), "last_activity_at"),
        e.now,
        "an acquire, held or not"
    );
    // A re-acquire of both keeps the tokens and updates the weights.
    let r = reply(e.acquire_all(&x, "0", &[("a", 2), ("b", 1)]));
    assert_eq!(
        holds_of(&r),
        vec![("a".into(), Some(ta)), ("b".into(), Some(tb))]
    );
    assert_eq!(e.hold_list("ns", "a"), vec![(x.clone(), 2)]);
}

#[test]
fn acquireall_rejections_name_the_semaphore_and_change_nothing() {
    // snapshot() reads semaphores s and t.
    let mut e = Eng::new();
    e.setup("ns", "s", 2);
    e.setup("ns", "t", 1);
    let x = e.lease("ns", "x", 60);
    e.got("s", &x, 1);
    let before = snapshot(&mut e);
    let cases: Vec<(Vec<String>, Error)> = vec![
        (
            vec!["s".into(), "1".into(), "t".into(), "2".into()],
            Error::InvalidArg("weight exceeds semaphore permits of 't'".into()),
        ),
        (
            vec!["s".into(), "2".into(), "zz".into(), "1".into()],
            Error::NotFound("semaphore 'zz' not found in namespace 'ns'".into()),
        ),
        (
            vec!["s".into(), "1".into(), "s".into(), "1".into()],
            Error::InvalidArg("semaphore 's' is listed more than once".into()),
        ),
        (
            vec!["s".into(), "0".into()],
            Error::InvalidArg("weight must be greater than 0".into()),
        ),
        (vec!["s".into(), "1".into(), "t".into()], Error::syntax()),
        (vec!["s".into(), "x".into()], Error::not_integer()),
        (
            (0..17)
                .flat_map(|i| [format!("s{i}"), "1".into()])
                .collect(),
            Error::InvalidArg("at most 16 semaphores per SEM.ACQUIREALL".into()),
        ),
    ];
    for (parts, want) in cases {
        let mut words = vec!["SEM.ACQUIREALL", "ns", &x, "5"];
        words.extend(parts.iter().map(String::as_str));
        assert_eq!(e.err(&words), want, "{parts:?}");
    }
    assert_eq!(
        e.err(&["SEM.ACQUIREALL", "ns", "ls_nope", "5", "s", "1"])
            .code(),
        "NOTFOUND"
    );
    assert_eq!(snapshot(&mut e), before);
    assert_eq!(e.shard.counts().waiters, 0);
}

#[test]
fn acquireall_in_opposite_orders_never_deadlocks() {
    let mut e = two_sems(1, 1);
    let h = e.lease("ns", "h", 60);
    let p = e.lease("ns", "p", 60);
    let q = e.lease("ns", "q", 60);
    e.got("a", &h, 1);
    e.got("b", &h, 1);
    let wp = e.waiting_all(&p, "30", &[("a", 1), ("b", 1)]);
    let wq = e.waiting_all(&q, "30", &[("b", 1), ("a", 1)]);
    e.at(T0 + S);
    e.release("a", &h);
    assert!(
        e.outbox().is_empty(),
        "p still lacks b, and q is behind p on a"
    );
    assert!(
        e.hold_list("ns", "a").is_empty(),
        "nobody holds a part while waiting"
    );
    e.release("b", &h);
    let out = e.outbox();
    assert_eq!(out.len(), 1);
    let r = only_for(&out, wp);
    assert_eq!(outcome(r), ACQUIRED);
    assert_eq!(holds_of(r).iter().filter(|(_, t)| t.is_some()).count(), 2);
    e.release("b", &p);
    assert!(e.outbox().is_empty(), "q still lacks a");
    e.release("a", &p);
    let out = e.outbox();
    let r = only_for(&out, wq);
    assert_eq!(
        holds_of(r)
            .iter()
            .map(|(s, _)| s.as_str())
            .collect::<Vec<_>>(),
        ["b", "a"]
    );
    assert_eq!(e.hold_list("ns", "a"), vec![(q.clone(), 1)]);
    assert_eq!(e.hold_list("ns", "b"), vec![(q.clone(), 1)]);
    assert_eq!(e.shard.counts().waiters, 0);
}

#[test]
fn a_multi_waiter_at_the_head_blocks_later_singles_and_is_served_when_the_last_permit_frees() {
    let mut e = two_sems(2, 1);
    let ha = e.lease("ns", "ha", 60);
    let hb = e.lease("ns", "hb", 60);
    let w = e.lease("ns", "w", 60);
    let x = e.lease("ns", "x", 60);
    let y = e.lease("ns", "y", 60);
    e.got("a", &ha, 1);
    e.got("b", &hb, 1);
    let ww = e.waiting_all(&w, "30", &[("a", 2), ("b", 1)]);
    // One permit of a is free, but w came first: x waits, and does not jump it at timeout 0.
    assert_eq!(outcome(&reply(e.acquire("a", &x, 1, "0"))), UNAVAILABLE);
    let wx = e.waiting("a", &x, 1, "30");
    let wy = e.waiting("b", &y, 1, "30");
    e.at(T0 + S);
    e.release("a", &ha);
    assert!(e.outbox().is_empty(), "w still lacks b and blocks x");
    assert_eq!(int(&e.sem("ns", "a"), "active_holds"), 0);
    e.at(T0 + 2 * S);
    e.release("b", &hb);
    let out = e.outbox();
    assert_eq!(out.len(), 1, "w alone, the moment b frees: {out:?}");
    let r = only_for(&out, ww);
    assert_eq!(outcome(r), ACQUIRED);
    for h in list(r, "holds") {
        assert_eq!(int(field(h, "semaphore"), "last_activity_at"), T0 + 2 * S);
    }
    assert_eq!(e.hold_list("ns", "a"), vec![(w.clone(), 2)]);
    assert_eq!(e.hold_list("ns", "b"), vec![(w.clone(), 1)]);
    // LEASE.REVOKE releases both; each queue moves on.
    e.ok(&["LEASE.REVOKE", "ns", &w]);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, wx)), ACQUIRED);
    assert_eq!(outcome(only_for(&out, wy)), ACQUIRED);
}

#[test]
fn a_multi_waiter_is_served_after_an_earlier_waiter_on_one_of_its_semaphores() {
    let mut e = two_sems(1, 1);
    let h = e.lease("ns", "h", 60);
    let x = e.lease("ns", "x", 60);
    let w = e.lease("ns", "w", 60);
    e.got("a", &h, 1);
    let wx = e.waiting("a", &x, 1, "30");
    let ww = e.waiting_all(&w, "30", &[("b", 1), ("a", 1)]);
    // b is free, but w waits for a behind x, and holds nothing of b meanwhile.
    assert!(e.hold_list("ns", "b").is_empty());
    e.release("a", &h);
    let out = e.outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(outcome(only_for(&out, wx)), ACQUIRED);
    e.release("a", &x);
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, ww)), ACQUIRED);
}

#[test]
fn acquireall_timeouts_release_nothing_and_the_queues_move_on() {
    let mut e = two_sems(2, 1);
    let h = e.lease("ns", "h", 60);
    let w = e.lease("ns", "w", 60);
    let y = e.lease("ns", "y", 60);
    e.got("a", &h, 1);
    let tw = e.got("a", &w, 1);
    // w holds 1 of a and asks for 2 of a and 1 of b; a lacks a permit.
    let ww = e.waiting_all(&w, "5", &[("a", 2), ("b", 1)]);
    let wy = e.waiting("b", &y, 1, "30");
    e.at(T0 + 5 * S - 1);
    assert!(e.outbox().is_empty());
    e.at(T0 + 5 * S);
    e.shard.check();
    let out = e.outbox();
    let r = only_for(&out, ww);
    assert_eq!(outcome(r), TIMED_OUT);
    assert_eq!(holds_of(r), vec![("a".into(), None), ("b".into(), None)]);
    assert_eq!(
        outcome(only_for(&out, wy)),
        ACQUIRED,
        "b's queue moves on at once"
    );
    assert_eq!(
        e.hold_list("ns", "a"),
        vec![(h.clone(), 1), (w.clone(), 1)],
        "w's hold kept"
    );
    assert_eq!(int(&e.holders("ns", "a")[1], "fencing_token"), tw);
    assert_eq!(e.hold_list("ns", "b"), vec![(y.clone(), 1)]);
    assert_eq!(e.shard.stats().acquire_timed_out, 1);
}

#[test]
fn every_end_of_a_parked_acquireall_leaves_all_its_queues() {
    for how in [
        "disconnect",
        "unblock-timeout",
        "unblock-error",
        "revoke",
        "expiry",
        "sem-delete",
        "ns-delete",
        "too-heavy",
    ] {
        let mut e = two_sems(2, 1);
        let h = e.lease("ns", "h", 60);
        let w = e.lease("ns", "w", 10);
        let y = e.lease("ns", "y", 60);
        e.got("a", &h, 2);
        let ww = e.waiting_all(&w, "30", &[("a", 2), ("b", 1)]);
        let wy = e.waiting("b", &y, 1, "30");
        e.at(T0 + S);
        match how {
            "disconnect" => assert!(e.shard.cancel(e.now, ww, Cancel::Disconnected)),
            "unblock-timeout" => assert!(e.shard.cancel(e.now, ww, Cancel::UnblockTimeout)),
            "unblock-error" => assert!(e.shard.cancel(e.now, ww, Cancel::UnblockError)),
            "revoke" => assert_eq!(e.ok(&["LEASE.REVOKE", "ns", &w]), Reply::OK),
            "expiry" => e.at(T0 + 10 * S),
            "sem-delete" => assert_eq!(e.ok(&["SEM.DELETE", "ns", "a"]), Reply::OK),
            "ns-delete" => assert_eq!(e.ok(&["NS.DELETE", "ns"]), Reply::OK),
            _ => {
                let v = int(&e.sem("ns", "a"), "version").to_string();
                e.ok(&["SEM.UPDATE", "ns", "a", "2", "VERSION", &v]);
                e.ok(&["SEM.ACQUIRE", "ns", "a", &h, "1", "0"]);
                e.ok(&[
                    "SEM.UPDATE",
                    "ns",
                    "a",
                    "1",
                    "VERSION",
                    &(v.parse::<i64>().unwrap() + 1).to_string(),
                ]);
            }
        }
        e.shard.check();
        let out = e.outbox();
        let mine: Vec<&Reply> = out
            .iter()
            .filter(|(i, _)| *i == ww)
            .map(|(_, r)| r)
            .collect();
        match how {
            "disconnect" => assert!(mine.is_empty(), "a gone client gets no reply"),
            "unblock-timeout" => assert_eq!(outcome(mine[0]), TIMED_OUT),
            "unblock-error" => assert_eq!(code(mine[0]), "UNBLOCKED"),
            "too-heavy" => assert_eq!(
                mine[0],
                &Reply::Error(Error::InvalidArg(
                    "weight exceeds semaphore permits of 'a'".into()
                ))
            ),
            _ => assert_eq!(code(mine[0]), "NOTFOUND", "{how}"),
        }
        assert_eq!(e.shard.counts().waiters, 0, "{how}");
        if how != "ns-delete" {
            assert_eq!(
                outcome(only_for(&out, wy)),
                ACQUIRED,
                "{how}: b's queue moves on"
            );
            assert_eq!(e.hold_list("ns", "b"), vec![(y.clone(), 1)], "{how}");
        }
        assert!(!e.shard.cancel(e.now, ww, Cancel::UnblockTimeout), "{how}");
        e.at(T0 + 40 * S);
        assert!(
            e.outbox().iter().all(|(i, _)| *i != ww),
            "{how}: nothing of w fires later"
        );
    }
}

#[test]
fn a_parked_acquireall_keeps_its_place_in_every_queue_even_where_it_shrinks() {
    let mut e = two_sems(3, 1);
    let w = e.lease("ns", "w", 60);
    let h = e.lease("ns", "h", 60);
    let x = e.lease("ns", "x", 60);
    let y = e.lease("ns", "y", 60);
    e.got("a", &w, 3);
    e.got("b", &h, 1);
    let wx = e.waiting("a", &x, 2, "5");
    // w lowers a to 1 and wants b: it parks (b is taken), keeping its hold of 3 meanwhile.
    let ww = e.waiting_all(&w, "30", &[("a", 1), ("b", 1)]);
    assert_eq!(e.hold_list("ns", "a"), vec![(w.clone(), 3)]);
    let wy = e.waiting("a", &y, 1, "30");
    // x came first on a: w waits for its turn there too (SPEC §12), even with b free.
    e.release("b", &h);
    assert!(e.outbox().is_empty());
    // x, which waits for the permits w holds, times out; then w is served at once, and the 2
    // permits its smaller hold lets go of a go to y in the same step.
    e.at(T0 + 5 * S);
    e.shard.check();
    let out = e.outbox();
    assert_eq!(outcome(only_for(&out, wx)), TIMED_OUT);
    assert_eq!(outcome(only_for(&out, ww)), ACQUIRED);
    assert_eq!(outcome(only_for(&out, wy)), ACQUIRED);
    assert_eq!(e.hold_list("ns", "a"), vec![(w.clone(), 1), (y.clone(), 1)]);
    assert_eq!(e.hold_list("ns", "b"), vec![(w.clone(), 1)]);
}

#[test]
fn acquireall_inside_multi_never_waits() {
    let mut e = two_sems(1, 1);
    let h = e.lease("ns", "h", 60);
    let x = e.lease("ns", "x", 60);
    e.got("b", &h, 1);
    let req = e.req(&["SEM.ACQUIREALL", "ns", &x, "30", "a", "1", "b", "1"]);
    let r = reply(e.shard.execute(e.now, req, None));
    assert_eq!(outcome(&r), UNAVAILABLE);
    assert_eq!(e.shard.counts().waiters, 0);
}

/// What the engine keeps of a request (its state, and the journal records, which the Raft log
/// holds in memory until a snapshot) is its own copy: the connection parses arguments as
/// slices of its read buffer, and a kept slice pins the whole buffer. A leader's records
/// holding request names made its memory grow by 100 MB/s at P=1 until the next snapshot.
#[test]
fn nothing_the_engine_keeps_holds_a_slice_of_a_request() {
    let mut e = Eng::new();
    let mut journal = Vec::new();
    let mut run = |e: &mut Eng, words: &[&str]| -> Exec {
        // The words as one read buffer, the arguments slices of it, as `conn.rs` parses them.
        let buf = Bytes::from(words.concat().into_bytes());
        let mut at = 0;
        let argv: Vec<Bytes> = words
            .iter()
            .map(|w| {
                at += w.len();
                buf.slice(at - w.len()..at)
            })
            .collect();
        let req = match parse_argv(&argv, &e.limits) {
            Ok((_, Request::Engine(r))) => r,
            other => panic!("{words:?} does not parse to an engine request: {other:?}"),
        };
        drop(argv);
        let exec = e.exec(req);
        assert!(
            !matches!(&exec, Exec::Reply(r) if r.is_error()),
            "{words:?} failed: {exec:?}"
        );
        let made = e.shard.take_journal();
        assert!(!made.is_empty(), "{words:?} journaled nothing");
        journal.extend(made);
        assert!(buf.is_unique(), "{words:?} kept a slice of its request");
        exec
    };
    let meta = ["META", "k", "v"];
    let with_meta = |words: &[&'static str]| [words, &meta].concat();
    run(&mut e, &with_meta(&["NS.CREATE", "ns", "DESC", "d"]));
    run(
        &mut e,
        &with_meta(&["NS.UPDATE", "ns", "VERSION", "1", "DESC", "e"]),
    );
    for sem in ["s", "t"] {
        run(
            &mut e,
            &with_meta(&["SEM.CREATE", "ns", sem, "2", "DESC", "d"]),
        );
    }
    let upd = ["SEM.UPDATE", "ns", "s", "1", "VERSION", "1", "DESC", "e"];
    run(&mut e, &with_meta(&upd));
    let a = e.lease("ns", "a", 60);
    let b = e.lease("ns", "b", 60);
    run(&mut e, &["LEASE.CREATE", "ns", "p", "60", "META", "k", "v"]);
    run(&mut e, &["LEASE.REFRESH", "ns", &a, "30"]);
    let acquired = run(
        &mut e,
        &["SEM.ACQUIRE", "ns", "s", &a, "1", "0", "META", "k", "v"],
    );
    assert!(matches!(acquired, Exec::Reply(r) if outcome(&r) == ACQUIRED));
    let unavailable = run(&mut e, &["SEM.ACQUIRE", "ns", "s", &b, "1", "0"]);
    assert!(matches!(unavailable, Exec::Reply(r) if outcome(&r) == UNAVAILABLE));
    let parked = [
        "SEM.ACQUIREALL",
        "ns",
        &b,
        "5",
        "s",
        "1",
        "t",
        "1",
        "META",
        "k",
        "v",
    ];
    assert!(matches!(run(&mut e, &parked), Exec::Parked(_)));
    // The release serves the parked acquire: its grants are journaled too.
    run(&mut e, &["SEM.RELEASE", "ns", "s", &a]);
    let unavailable = run(
        &mut e,
        &["SEM.ACQUIREALL", "ns", &a, "0", "s", "1", "t", "1"],
    );
    assert!(matches!(unavailable, Exec::Reply(r) if outcome(&r) == UNAVAILABLE));
    run(&mut e, &["SEM.RELEASE", "ns", "t", &b]);
    let acquired = run(&mut e, &["SEM.ACQUIREALL", "ns", &a, "0", "t", "1"]);
    assert!(matches!(acquired, Exec::Reply(r) if outcome(&r) == ACQUIRED));
    run(&mut e, &["LEASE.REVOKE", "ns", &a]);
    run(&mut e, &["SEM.DELETE", "ns", "t"]);
    run(&mut e, &["NS.DELETE", "ns"]);
    let granted_b =
        |r: &Record| matches!(r, Record::HoldSet { lease, .. } if lease.to_bytes() == b.as_bytes());
    assert_eq!(journal.iter().filter(|r| granted_b(r)).count(), 2);
    assert!(matches!(journal.last(), Some(Record::NsDel { .. })));
}
