//! Rule (c): no acknowledged change lost. Every read is checked against what was acknowledged
//! before it; a run's final reads, after its faults heal, are where a lost change shows.

use super::super::history::{Call, Holder, Op, Outcome, NEVER};
use super::holds::Relied;
use super::leases::Lives;
use super::{ms, short, Index, Rule, Violation};

pub fn check(ix: &Index, lives: &Lives, relied: &[Relied]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (i, c) in ix.h.calls.iter().enumerate() {
        if let (Op::Holders { sem }, Outcome::Holders(list)) = (&c.op, &c.outcome) {
            holds_listed(i, c, sem, list, relied, &mut out);
            releases_kept(ix, i, c, sem, list, &mut out);
            for h in list {
                if lives.get(&h.lease).is_some_and(|l| c.invoke > l.dead_after) {
                    out.push(revived(i, c, &h.lease, lives));
                }
            }
        }
    }
    leases_kept(ix, lives, &mut out);
    out
}

/// [`Rule::HoldLost`]: the read lists every hold relied on across it, unchanged.
fn holds_listed(
    i: usize,
    read: &Call,
    sem: &str,
    list: &[Holder],
    relied: &[Relied],
    out: &mut Vec<Violation>,
) {
    let across = relied
        .iter()
        .filter(|r| r.sem == sem && r.from <= read.invoke && read.complete < r.until);
    for r in across {
        let listed = list.iter().find(|h| h.lease == r.lease);
        if listed.map(|h| (h.weight, h.token)) != Some((r.weight, r.token)) {
            out.push(Violation {
                rule: Rule::HoldLost,
                detail: format!(
                    "SEM.HOLDERS {sem} (call {i}, {}..{}) shows {listed:?} for {} (weight {}, \
                     token {}, granted by call {}, relied on {}..{})",
                    ms(read.invoke),
                    ms(read.complete),
                    short(&r.lease),
                    r.weight,
                    r.token,
                    r.call,
                    ms(r.from),
                    ms(r.until)
                ),
            });
        }
    }
}

/// [`Rule::ReleaseLost`]: no listed hold was released, acknowledged, before the read, unless an
/// acquire that may have re-created it could have landed between the release and the read.
fn releases_kept(
    ix: &Index,
    i: usize,
    read: &Call,
    sem: &str,
    list: &[Holder],
    out: &mut Vec<Violation>,
) {
    for h in list {
        let calls: Vec<&Call> = ix.on_hold(&h.lease, sem).map(|(_, c)| c).collect();
        let undone = calls.iter().find(|r| {
            matches!(r.op, Op::Release { .. })
                && r.outcome == Outcome::Ok
                && r.complete < read.invoke
                && !calls.iter().any(|a| {
                    matches!(a.op, Op::Acquire { .. })
                        && matches!(a.outcome, Outcome::Acquired(_) | Outcome::Unknown(_))
                        && a.effect_until() > r.invoke
                        && a.invoke < read.complete
                })
        });
        if let Some(r) = undone {
            out.push(Violation {
                rule: Rule::ReleaseLost,
                detail: format!(
                    "SEM.HOLDERS {sem} (call {i}, invoked {}) lists {} released at {}..{}",
                    ms(read.invoke),
                    short(&h.lease),
                    ms(r.invoke),
                    ms(r.complete)
                ),
            });
        }
    }
}

/// [`Rule::LeaseRevived`] and [`Rule::LeaseLost`] over every call naming a lease.
fn leases_kept(ix: &Index, lives: &Lives, out: &mut Vec<Violation>) {
    for lease in ix.leases() {
        let Some(life) = lives.get(lease) else {
            continue;
        };
        for (i, c) in ix.on_lease(lease) {
            let alive = matches!(c.outcome, Outcome::Ok | Outcome::Acquired(_));
            if alive && !matches!(c.op, Op::CreateLease { .. }) && c.invoke > life.dead_after {
                out.push(revived(i, c, lease, lives));
            }
            // A revoke may end the lease at any time after its invoke; not before itself.
            let revoked_from = ix
                .on_lease(lease)
                .filter(|&(j, r)| j != i && matches!(r.op, Op::Revoke { .. }))
                .map(|(_, r)| r.invoke)
                .min()
                .unwrap_or(NEVER);
            if c.outcome.lease_missing() && c.complete < life.alive_until.min(revoked_from) {
                out.push(Violation {
                    rule: Rule::LeaseLost,
                    detail: format!(
                        "{:?} (call {i}, {}..{}) found no lease {}, alive from {} to {}",
                        c.op,
                        ms(c.invoke),
                        ms(c.complete),
                        short(lease),
                        ms(life.created),
                        ms(life.alive_until)
                    ),
                });
            }
        }
    }
}

fn revived(i: usize, c: &Call, lease: &str, lives: &Lives) -> Violation {
    let dead = lives.get(lease).map_or(0, |l| l.dead_after);
    Violation {
        rule: Rule::LeaseRevived,
        detail: format!(
            "{:?} (call {i}, invoked {}) saw lease {} alive, dead since {}",
            c.op,
            ms(c.invoke),
            short(lease),
            ms(dead)
        ),
    }
}
