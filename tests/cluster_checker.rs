//! The history checker of the cluster harness on synthetic histories: a correct history
//! passes, unknown outcomes never raise an alarm, and each kind of violation is caught (a
//! double grant, a repeated or falling token, a lost acknowledged hold, an acknowledged
//! release undone, a revoked or expired lease alive again, a live lease lost).

mod cluster_harness;
mod common;

use cluster_harness::check::{check, Rule};
use cluster_harness::history::{At, Call, History, Holder, Op, Outcome};

/// A history built call by call, instants in milliseconds.
struct Script(History);

const A: &str = "ls_aaaa";
const B: &str = "ls_bbbb";
const NOTFOUND: &str = "NOTFOUND lease not found or expired in namespace 'chaos'";

fn ms(t: f64) -> At {
    (t * 1e6) as At
}

impl Script {
    fn new() -> Script {
        Script(History::new("chaos", &[("s2", 2), ("s3", 3)]))
    }

    fn call(mut self, op: Op, invoke: f64, complete: f64, outcome: Outcome) -> Script {
        self.0.calls.push(Call {
            client: 0,
            op,
            invoke: ms(invoke),
            complete: ms(complete),
            outcome,
        });
        self
    }

    /// LEASE.CREATE answered with `lease`, TTL `ttl` s, over `[t, t + 1 ms]`.
    fn create(self, lease: &str, ttl: u64, t: f64) -> Script {
        self.call(
            Op::CreateLease { ttl },
            t,
            t + 1.0,
            Outcome::Created(lease.into()),
        )
    }

    fn acquire(self, lease: &str, sem: &str, weight: u32, span: (f64, f64), o: Outcome) -> Script {
        let op = Op::Acquire {
            lease: lease.into(),
            sem: sem.into(),
            weight,
            timeout_ms: 2000,
        };
        self.call(op, span.0, span.1, o)
    }

    fn release(self, lease: &str, sem: &str, span: (f64, f64), o: Outcome) -> Script {
        let op = Op::Release {
            lease: lease.into(),
            sem: sem.into(),
        };
        self.call(op, span.0, span.1, o)
    }

    fn refresh(self, lease: &str, ttl: u64, span: (f64, f64), o: Outcome) -> Script {
        let op = Op::Refresh {
            lease: lease.into(),
            ttl,
        };
        self.call(op, span.0, span.1, o)
    }

    fn revoke(self, lease: &str, span: (f64, f64), o: Outcome) -> Script {
        self.call(
            Op::Revoke {
                lease: lease.into(),
            },
            span.0,
            span.1,
            o,
        )
    }

    fn holders(self, sem: &str, span: (f64, f64), list: &[(&str, u32, i64)]) -> Script {
        let list = list
            .iter()
            .map(|&(lease, weight, token)| Holder {
                lease: lease.into(),
                weight,
                token,
            })
            .collect();
        let op = Op::Holders { sem: sem.into() };
        self.call(op, span.0, span.1, Outcome::Holders(list))
    }

    fn get(self, lease: &str, span: (f64, f64), o: Outcome) -> Script {
        let op = Op::GetLease {
            lease: lease.into(),
        };
        self.call(op, span.0, span.1, o)
    }

    /// The rules the checker says are broken, in order, one per violation.
    fn broken(&self) -> Vec<Rule> {
        let v = check(&self.0);
        for x in &v {
            eprintln!("{x}");
        }
        v.into_iter().map(|v| v.rule).collect()
    }
}

fn refused() -> Outcome {
    Outcome::Refused(NOTFOUND.into())
}

fn lost() -> Outcome {
    Outcome::Unknown("connection reset".into())
}

/// Two leases taking turns on `s2` (a waiter granted as the holder releases), overlapping
/// grants whose tokens come in either order, a refresh, a revoke, and final reads that show
/// exactly what is left.
#[test]
fn a_correct_history_passes() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s2", 2, (2.0, 3.0), Outcome::Acquired(1))
        // B parks and is granted when A's release lands.
        .acquire(B, "s2", 1, (4.0, 8.0), Outcome::Acquired(2))
        .release(A, "s2", (6.0, 7.0), Outcome::Ok)
        .refresh(A, 10, (9.0, 10.0), Outcome::Ok)
        .revoke(B, (12.0, 13.0), Outcome::Ok)
        // Two grants in flight at once may carry their tokens in either order.
        .acquire(A, "s3", 1, (14.0, 17.0), Outcome::Acquired(4))
        .create("ls_cccc", 10, 13.0)
        .acquire("ls_cccc", "s3", 2, (15.0, 16.0), Outcome::Acquired(3))
        .holders("s2", (20.0, 21.0), &[])
        .holders("s3", (20.0, 21.0), &[(A, 1, 4), ("ls_cccc", 2, 3)])
        .get(A, (22.0, 23.0), Outcome::Ok)
        .get(B, (24.0, 25.0), refused());
    assert_eq!(s.broken(), vec![]);
}

/// A re-acquire of a held semaphore returns the hold's token: not a repeated token.
#[test]
fn a_reacquire_may_repeat_its_token() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .acquire(A, "s3", 1, (2.0, 3.0), Outcome::Acquired(5))
        .acquire(A, "s3", 2, (4.0, 5.0), Outcome::Acquired(5))
        .holders("s3", (6.0, 7.0), &[(A, 2, 5)]);
    assert_eq!(s.broken(), vec![]);
}

/// What a client never heard back about may have happened, at any time after: an unknown
/// release ends the hold at its invoke, an unknown acquire is never relied on, an unknown
/// refresh may extend the lease, and a request held in a link may land after later calls.
#[test]
fn unknown_outcomes_never_raise_an_alarm() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s2", 2, (2.0, 3.0), Outcome::Acquired(1))
        // A's release landed though its reply was lost: B may take both permits.
        .release(A, "s2", (4.0, 5.0), lost())
        .acquire(B, "s2", 2, (6.0, 7.0), Outcome::Acquired(2))
        .release(B, "s2", (8.0, 9.0), Outcome::Ok)
        // A's acquire landed too: the final read may show it.
        .acquire(A, "s2", 1, (10.0, 11.0), lost())
        .refresh(B, 10, (12.0, 13.0), lost())
        .holders("s2", (20.0, 21.0), &[(A, 1, 3)])
        .get(A, (22.0, 23.0), Outcome::Ok);
    assert_eq!(s.broken(), vec![]);
}

/// A lease that expired frees its permits: a new holder may take them once it surely died.
#[test]
fn an_expired_lease_frees_its_permits() {
    let s = Script::new()
        .create(A, 1, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s2", 2, (1.0, 2.0), Outcome::Acquired(1))
        .acquire(B, "s2", 2, (500.0, 1100.0), Outcome::Acquired(2))
        .holders("s2", (1200.0, 1201.0), &[(B, 2, 2)])
        .refresh(A, 1, (1300.0, 1301.0), refused());
    assert_eq!(s.broken(), vec![]);
}

#[test]
fn a_double_grant_is_caught() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s2", 2, (2.0, 3.0), Outcome::Acquired(1))
        .acquire(B, "s2", 1, (4.0, 5.0), Outcome::Acquired(2));
    assert_eq!(s.broken(), vec![Rule::OverGrant]);
}

#[test]
fn holders_above_the_permits_are_caught() {
    let s = Script::new().holders("s2", (1.0, 2.0), &[(A, 2, 1), (B, 1, 2)]);
    assert_eq!(s.broken(), vec![Rule::OverGrant]);
}

#[test]
fn a_repeated_token_is_caught() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s3", 1, (2.0, 3.0), Outcome::Acquired(7))
        .acquire(B, "s3", 1, (2.5, 5.0), Outcome::Acquired(7));
    assert_eq!(s.broken(), vec![Rule::TokenRepeated]);
}

/// Once released, the same lease's next grant is a new hold: its token must be new, and higher.
#[test]
fn a_falling_or_reused_token_is_caught() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .create(B, 10, 0.0)
        .acquire(A, "s3", 1, (2.0, 3.0), Outcome::Acquired(7))
        .acquire(B, "s3", 1, (4.0, 5.0), Outcome::Acquired(6));
    assert_eq!(s.broken(), vec![Rule::TokenFell]);
    let s = Script::new()
        .create(A, 10, 0.0)
        .acquire(A, "s3", 1, (2.0, 3.0), Outcome::Acquired(7))
        .release(A, "s3", (4.0, 5.0), Outcome::Ok)
        .acquire(A, "s3", 1, (6.0, 7.0), Outcome::Acquired(7));
    assert_eq!(s.broken(), vec![Rule::TokenRepeated, Rule::TokenFell]);
}

#[test]
fn a_lost_acknowledged_hold_is_caught() {
    let base = || {
        Script::new()
            .create(A, 10, 0.0)
            .acquire(A, "s3", 2, (2.0, 3.0), Outcome::Acquired(1))
            .refresh(A, 10, (4.0, 5.0), Outcome::Ok)
    };
    assert_eq!(
        base().holders("s3", (10.0, 11.0), &[]).broken(),
        vec![Rule::HoldLost]
    );
    assert_eq!(
        base().holders("s3", (10.0, 11.0), &[(A, 1, 1)]).broken(),
        vec![Rule::HoldLost]
    );
}

#[test]
fn an_acknowledged_release_undone_is_caught() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .acquire(A, "s3", 2, (2.0, 3.0), Outcome::Acquired(1))
        .release(A, "s3", (4.0, 5.0), Outcome::Ok)
        .holders("s3", (10.0, 11.0), &[(A, 2, 1)]);
    assert_eq!(s.broken(), vec![Rule::ReleaseLost]);
}

#[test]
fn a_revived_revoked_lease_is_caught() {
    let revoked = || {
        Script::new()
            .create(A, 10, 0.0)
            .acquire(A, "s3", 2, (2.0, 3.0), Outcome::Acquired(1))
            .revoke(A, (4.0, 5.0), Outcome::Ok)
    };
    assert_eq!(
        revoked().get(A, (10.0, 11.0), Outcome::Ok).broken(),
        vec![Rule::LeaseRevived]
    );
    assert_eq!(
        revoked().holders("s3", (10.0, 11.0), &[(A, 2, 1)]).broken(),
        vec![Rule::LeaseRevived]
    );
}

#[test]
fn an_expired_lease_alive_again_is_caught() {
    let s = Script::new()
        .create(A, 1, 0.0)
        .refresh(A, 1, (1500.0, 1501.0), Outcome::Ok);
    assert_eq!(s.broken(), vec![Rule::LeaseRevived]);
}

#[test]
fn a_lost_live_lease_is_caught() {
    let s = Script::new()
        .create(A, 10, 0.0)
        .refresh(A, 10, (3000.0, 3001.0), Outcome::Ok)
        .get(A, (9000.0, 9001.0), refused());
    assert_eq!(s.broken(), vec![Rule::LeaseLost]);
}
