//! The holds clients may rely on, and which grants are fresh (the rules are in the module doc
//! of `check`).

use super::super::history::{At, Call, Op, Outcome};
use super::leases::Lives;
use super::Index;

/// A hold the server surely had over `[from, until)`.
#[derive(Debug, Clone)]
pub struct Relied {
    /// The acquire that granted it.
    pub call: usize,
    pub lease: String,
    pub sem: String,
    pub weight: u32,
    pub token: i64,
    pub from: At,
    pub until: At,
}

/// The lease, semaphore and weight of an acquire.
pub fn acquire_of(c: &Call) -> Option<(&str, &str, u32)> {
    match &c.op {
        Op::Acquire {
            lease, sem, weight, ..
        } => Some((lease, sem, *weight)),
        _ => None,
    }
}

/// Whether a call may have changed a hold: not a known no-op (an error reply, a non-acquired
/// acquire).
fn may_change(c: &Call) -> bool {
    !matches!(c.outcome, Outcome::Refused(_) | Outcome::NotAcquired)
}

/// Every acknowledged grant's window of reliance, where it is not empty.
pub fn relied(ix: &Index, lives: &Lives) -> Vec<Relied> {
    let mut out = Vec::new();
    for (i, a) in ix.h.calls.iter().enumerate() {
        let (Some((lease, sem, weight)), Outcome::Acquired(token)) = (acquire_of(a), &a.outcome)
        else {
            continue;
        };
        // A lease never seen created has no known TTL: nothing about it is relied on.
        let Some(life) = lives.get(lease) else {
            continue;
        };
        let until = ix
            .on_hold(lease, sem)
            .filter(|&(j, x)| j != i && may_change(x) && x.effect_until() > a.invoke)
            .map(|(_, x)| x.invoke)
            .fold(life.alive_until, At::min);
        if until > a.complete {
            out.push(Relied {
                call: i,
                lease: lease.to_string(),
                sem: sem.to_string(),
                weight,
                token: *token,
                from: a.complete,
                until,
            });
        }
    }
    out
}

/// Whether acknowledged grant `i` is surely a fresh grant, not a re-acquire of a hold that an
/// earlier acquire of the same lease on the same semaphore may have left.
pub fn is_fresh(ix: &Index, i: usize) -> bool {
    let a2 = ix.call(i);
    let Some((lease, sem, _)) = acquire_of(a2) else {
        return false;
    };
    let ended = |a: &Call| {
        ix.on_hold(lease, sem).any(|(_, r)| {
            r.outcome == Outcome::Ok
                && r.complete <= a2.invoke
                && match r.op {
                    Op::Release { .. } => r.invoke >= a.effect_until(),
                    Op::Revoke { .. } => true,
                    _ => false,
                }
        })
    };
    ix.on_hold(lease, sem).all(|(j, a)| {
        j == i
            || !matches!(a.op, Op::Acquire { .. })
            || !matches!(a.outcome, Outcome::Acquired(_) | Outcome::Unknown(_))
            || a.invoke >= a2.complete
            || ended(a)
    })
}
