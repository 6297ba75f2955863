//! A server frozen with SIGSTOP past its leases' deaths, then resumed with SIGCONT: the time it
//! missed is caught up at once and in order. Holders whose leases died while it was stopped are
//! gone, their permits go to the parked acquires first come first served (a waiter that does
//! not fit yet still blocks those behind it), a parked acquire whose deadline passed before
//! permits were freed for it times out instead of being granted, and fencing tokens keep rising.

mod common;

use std::process::Command;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use common::{
    acquire_now, call, err_text, field, holders_with_tokens, info_int, int, now_ns, ok, resp_field,
    text, Resp, Server,
};

/// How soon after SIGCONT the catch-up must be visible to the waiters.
const PROMPT: Duration = Duration::from_millis(1000);

fn signal(pid: u32, sig: &str) {
    let status = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{sig} {pid} failed");
}

/// Resumes the server if the test stops half-way, so the harness can kill it cleanly.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-CONT")
            .arg(self.0.to_string())
            .status();
    }
}

fn new_lease(con: &mut redis::Connection, process: &str, ttl: i64) -> String {
    let l = ok(con, &["LEASE.CREATE", "st", process, &ttl.to_string()]);
    text(&field(&l, "lease_id"))
}

fn resp_text(r: &Resp) -> String {
    match r {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("expected a bulk string, got {other:?}"),
    }
}

fn resp_int(r: &Resp) -> i64 {
    match r {
        Resp::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// A parked SEM.ACQUIRE on its own connection; its reply arrives on `rx`.
struct Waiter {
    name: &'static str,
    lease: String,
    rx: mpsc::Receiver<(Instant, Resp)>,
}

impl Waiter {
    /// Sends the acquire, then waits until the server shows one more parked acquire, so that
    /// waiters queue in the order they are created.
    fn park(
        server: &Server,
        admin: &mut redis::Connection,
        name: &'static str,
        sem: &str,
        weight: i64,
        timeout: &str,
    ) -> Waiter {
        let lease = new_lease(admin, name, 120);
        let before = info_int(admin, "waiters");
        let mut raw = server.raw();
        let args = [
            "SEM.ACQUIRE",
            "st",
            sem,
            &lease,
            &weight.to_string(),
            timeout,
        ];
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        raw.send_cmd(&a).expect("send SEM.ACQUIRE");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            if let Ok(r) = raw.read_reply() {
                let _ = tx.send((Instant::now(), r));
            }
        });
        let parked = common::wait_until(Duration::from_secs(10), || {
            info_int(admin, "waiters") == before + 1
        });
        assert!(parked, "{name}: SEM.ACQUIRE did not park");
        Waiter { name, lease, rx }
    }

    /// The reply, which must come within `within` from `since`.
    fn reply_by(&self, since: Instant, within: Duration) -> Resp {
        let wait = (since + within).saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(wait) {
            Ok((at, r)) => {
                assert!(
                    at.duration_since(since) <= within,
                    "{}: answered {:?} after the event, allowed {within:?}",
                    self.name,
                    at.duration_since(since)
                );
                r
            }
            Err(_) => panic!("{}: no reply within {within:?}", self.name),
        }
    }

    /// The reply must be ACQUIRED; returns its fencing token.
    fn granted_by(&self, since: Instant, within: Duration) -> i64 {
        let r = self.reply_by(since, within);
        assert_eq!(
            resp_text(resp_field(&r, "outcome")),
            "ACQUIRE_OUTCOME_ACQUIRED",
            "{}: {r:?}",
            self.name
        );
        resp_int(resp_field(&r, "fencing_token"))
    }

    fn still_parked(&self) {
        if let Ok((_, r)) = self.rx.try_recv() {
            panic!("{} should still wait (FIFO), got {r:?}", self.name);
        }
    }
}

#[test]
fn leases_that_die_during_sigstop_hand_their_permits_to_fifo_waiters_on_sigcont() {
    let server = Server::start();
    let pid = server.pid().expect("running");
    let mut admin = server.conn();
    ok(&mut admin, &["NS.CREATE", "st"]);
    ok(&mut admin, &["SEM.CREATE", "st", "a", "4"]);
    ok(&mut admin, &["SEM.CREATE", "st", "b", "1"]);

    // Holders: A holds 2 of a; B holds 2 of a and the only permit of b. Created with a long
    // ttl, shortened to 1 s and 2 s right before the stop.
    let la = new_lease(&mut admin, "holder-a", 120);
    let lb = new_lease(&mut admin, "holder-b", 120);
    let ta = acquire_now(&mut admin, "st", "a", &la, 2);
    let tb = acquire_now(&mut admin, "st", "a", &lb, 2);
    let tb_b = acquire_now(&mut admin, "st", "b", &lb, 1);
    assert!(ta < tb);

    // Queue on a: w1 (2), w2 (1), w3 (3), w4 (1), all with a long timeout.
    let w1 = Waiter::park(&server, &mut admin, "w1", "a", 2, "60");
    let w2 = Waiter::park(&server, &mut admin, "w2", "a", 1, "60");
    let w3 = Waiter::park(&server, &mut admin, "w3", "a", 3, "60");
    let w4 = Waiter::park(&server, &mut admin, "w4", "a", 1, "60");
    // Queue on b: x gives up at 1.5 s, before B dies (2 s); y waits long.
    let x = Waiter::park(&server, &mut admin, "x", "b", 1, "1.5");
    let y = Waiter::park(&server, &mut admin, "y", "b", 1, "60");

    let ra = ok(&mut admin, &["LEASE.REFRESH", "st", &la, "1"]);
    let rb = ok(&mut admin, &["LEASE.REFRESH", "st", &lb, "2"]);
    let a_dies = int(&field(&ra, "expires_at"));
    let b_dies = int(&field(&rb, "expires_at"));
    let _resume = Resume(pid);
    signal(pid, "STOP");
    let stopped_at = now_ns();
    assert!(
        stopped_at < a_dies,
        "setup too slow: the server was stopped {} ms after lease A died",
        (stopped_at - a_dies) / 1_000_000
    );

    // Stopped well past both deaths and x's deadline.
    thread::sleep(Duration::from_millis(3500));
    assert!(now_ns() > b_dies + 1_000_000_000);
    for w in [&w1, &w2, &w3, &w4, &x, &y] {
        w.still_parked();
    }
    signal(pid, "CONT");
    let resumed = Instant::now();

    // At A's death (1 s) w1 got A's 2 permits; at B's death (2 s) w2 got 1 of B's 2, and w3
    // (3) does not fit, so w4 (1) waits behind it although a permit is free.
    let t1 = w1.granted_by(resumed, PROMPT);
    let t2 = w2.granted_by(resumed, PROMPT);
    // x's deadline (1.5 s) came before b's permit was freed (2 s): timed out, not granted.
    let rx = x.reply_by(resumed, PROMPT);
    assert_eq!(
        resp_text(resp_field(&rx, "outcome")),
        "ACQUIRE_OUTCOME_TIMED_OUT",
        "x: {rx:?}"
    );
    let ty = y.granted_by(resumed, PROMPT);

    assert!(ta < tb && tb < t1 && t1 < t2, "tokens {ta} {tb} {t1} {t2}");
    assert!(tb_b < ty, "b: token {ty} not above {tb_b}");

    // The dead leases and their holds are gone; the state is exactly the hand-over.
    for l in [&la, &lb] {
        let e = call(&mut admin, &["LEASE.GET", "st", l]).expect_err("dead lease");
        assert!(err_text(&e).starts_with("NOTFOUND"), "{}", err_text(&e));
    }
    assert_eq!(
        holders_with_tokens(&mut admin, "st", "a"),
        vec![(w1.lease.clone(), 2, t1), (w2.lease.clone(), 1, t2)]
    );
    assert_eq!(
        holders_with_tokens(&mut admin, "st", "b"),
        vec![(y.lease.clone(), 1, ty)]
    );
    let a = ok(&mut admin, &["SEM.GET", "st", "a"]);
    assert_eq!(int(&field(&a, "active_holds")), 3);

    // w3 and w4 still wait, in order, although w4 would fit.
    thread::sleep(Duration::from_millis(300));
    w3.still_parked();
    w4.still_parked();
    assert_eq!(info_int(&mut admin, "waiters"), 2);
    assert_eq!(info_int(&mut admin, "blocked_clients"), 2);

    // Releasing w1 frees 2 (3 free): w3 goes first; then w2's release lets w4 in.
    ok(&mut admin, &["SEM.RELEASE", "st", "a", &w1.lease]);
    let released = Instant::now();
    let t3 = w3.granted_by(released, PROMPT);
    thread::sleep(Duration::from_millis(200));
    w4.still_parked();
    ok(&mut admin, &["SEM.RELEASE", "st", "a", &w2.lease]);
    let released = Instant::now();
    let t4 = w4.granted_by(released, PROMPT);
    assert!(t2 < t3 && t3 < t4, "tokens {t2} {t3} {t4}");

    assert_eq!(info_int(&mut admin, "waiters"), 0);
    assert_eq!(info_int(&mut admin, "blocked_clients"), 0);
    assert_eq!(
        holders_with_tokens(&mut admin, "st", "a"),
        vec![(w3.lease.clone(), 3, t3), (w4.lease.clone(), 1, t4)]
    );
}
