//! Proof that a run's checks could fail: each rule is broken on purpose in a copy of the
//! recorded history (a token repeated, a holder dropped from a final read, ...), and the
//! checker must catch every one. A run whose history gives a rule nothing to bite on (no hold
//! relied on across a final read, say) fails here, instead of passing with a check that could
//! never have failed.

use super::check::{check, Rule};
use super::history::{Call, History, Holder, Op, Outcome};

/// How many altered copies to try per rule before giving up.
const TRIES: usize = 40;

/// The k-th altered copy of a history that should break a rule; `None` when there are no more.
type Alter = fn(&History, usize) -> Option<History>;

/// Breaks each rule in a copy of `h` (which passed) and panics naming any the checker misses.
pub fn assert_checker_bites(h: &History) {
    let cases: [(Rule, Alter); 7] = [
        (Rule::OverGrant, over_grant),
        (Rule::TokenRepeated, token_repeated),
        (Rule::TokenFell, token_fell),
        (Rule::HoldLost, hold_lost),
        (Rule::ReleaseLost, release_lost),
        (Rule::LeaseRevived, lease_revived),
        (Rule::LeaseLost, lease_lost),
    ];
    for (rule, alter) in cases {
        let caught = (0..TRIES)
            .map_while(|k| alter(h, k))
            .any(|bad| check(&bad).iter().any(|v| v.rule == rule));
        assert!(
            caught,
            "the checker caught no {rule:?} planted in this run's history"
        );
    }
}

/// The indexes of the calls matching `f`.
fn calls(h: &History, f: impl Fn(&Call) -> bool) -> Vec<usize> {
    (0..h.calls.len()).filter(|&i| f(&h.calls[i])).collect()
}

fn token_of(c: &Call) -> Option<i64> {
    match c.outcome {
        Outcome::Acquired(t) => Some(t),
        _ => None,
    }
}

fn sem_of(c: &Call) -> Option<&str> {
    match &c.op {
        Op::Acquire { sem, .. } | Op::Release { sem, .. } | Op::Holders { sem } => Some(sem),
        _ => None,
    }
}

fn lease_of(c: &Call) -> Option<&str> {
    c.op.lease()
}

/// The k-th grant gets a rival: a lease of its own that takes all the permits at the same time.
fn over_grant(h: &History, k: usize) -> Option<History> {
    let a = calls(h, |c| token_of(c).is_some())
        .get(k)
        .map(|&i| &h.calls[i])?;
    let sem = sem_of(a)?.to_string();
    let rival = "ls_planted_rival".to_string();
    let mut bad = h.clone();
    bad.calls.push(Call {
        client: usize::MAX,
        op: Op::CreateLease { ttl: 300 },
        invoke: 0,
        complete: 1,
        outcome: Outcome::Created(rival.clone()),
    });
    bad.calls.push(Call {
        client: usize::MAX,
        op: Op::Acquire {
            lease: rival,
            weight: h.permits(&sem),
            sem,
            timeout_ms: 0,
        },
        invoke: a.invoke,
        complete: a.complete,
        outcome: Outcome::Acquired(i64::MAX),
    });
    Some(bad)
}

/// Pairs of grants on one semaphore, the first completed before the second was invoked.
fn ordered_pairs(h: &History) -> impl Iterator<Item = (usize, usize)> + '_ {
    let grants = calls(h, |c| token_of(c).is_some());
    let later = grants.clone();
    grants.into_iter().flat_map(move |a| {
        later
            .clone()
            .into_iter()
            .filter(move |&b| {
                let (ca, cb) = (&h.calls[a], &h.calls[b]);
                sem_of(ca) == sem_of(cb) && ca.complete < cb.invoke
            })
            .map(move |b| (a, b))
    })
}

/// The k-th ordered pair of grants to different leases gets one token.
fn token_repeated(h: &History, k: usize) -> Option<History> {
    let (a, b) = ordered_pairs(h)
        .filter(|&(a, b)| lease_of(&h.calls[a]) != lease_of(&h.calls[b]))
        .nth(k)?;
    let mut bad = h.clone();
    bad.calls[b].outcome = h.calls[a].outcome.clone();
    Some(bad)
}

/// The later grant of the k-th ordered pair gets a token below the earlier one's.
fn token_fell(h: &History, k: usize) -> Option<History> {
    let (a, b) = ordered_pairs(h).nth(k)?;
    let mut bad = h.clone();
    bad.calls[b].outcome = Outcome::Acquired(token_of(&h.calls[a])? - 1);
    Some(bad)
}

/// The k-th holder listed by a SEM.HOLDERS read (last reads first) is dropped from it.
fn hold_lost(h: &History, k: usize) -> Option<History> {
    let (read, n) = listed(h).nth(k)?;
    let mut bad = h.clone();
    if let Outcome::Holders(list) = &mut bad.calls[read].outcome {
        list.remove(n);
    }
    Some(bad)
}

/// Every (read, position) of a listed holder, the last reads first.
fn listed(h: &History) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut reads = calls(h, |c| matches!(c.outcome, Outcome::Holders(_)));
    reads.reverse();
    reads
        .into_iter()
        .flat_map(move |r| match &h.calls[r].outcome {
            Outcome::Holders(list) => (0..list.len()).map(move |n| (r, n)).collect::<Vec<_>>(),
            _ => Vec::new(),
        })
}

/// The k-th acknowledged release (last first) is undone in the last SEM.HOLDERS read of its
/// semaphore.
fn release_lost(h: &History, k: usize) -> Option<History> {
    let mut releases = calls(h, |c| {
        matches!(c.op, Op::Release { .. }) && c.outcome == Outcome::Ok
    });
    releases.reverse();
    let r = &h.calls[*releases.get(k)?];
    let read = *calls(h, |c| {
        matches!(c.outcome, Outcome::Holders(_)) && sem_of(c) == sem_of(r) && c.invoke > r.complete
    })
    .last()?;
    let mut bad = h.clone();
    if let Outcome::Holders(list) = &mut bad.calls[read].outcome {
        list.push(Holder {
            lease: lease_of(r)?.to_string(),
            weight: 1,
            token: 0,
        });
    }
    Some(bad)
}

/// The k-th LEASE.GET that found no lease (last first) finds it.
fn lease_revived(h: &History, k: usize) -> Option<History> {
    flip(h, k, |c| c.outcome.lease_missing(), Outcome::Ok)
}

/// The k-th LEASE.GET that found its lease (last first) finds none.
fn lease_lost(h: &History, k: usize) -> Option<History> {
    let missing = Outcome::Refused(format!(
        "NOTFOUND lease not found or expired in namespace '{}'",
        h.ns
    ));
    flip(h, k, |c| c.outcome == Outcome::Ok, missing)
}

fn flip(h: &History, k: usize, from: impl Fn(&Call) -> bool, to: Outcome) -> Option<History> {
    let mut gets = calls(h, |c| matches!(c.op, Op::GetLease { .. }) && from(c));
    gets.reverse();
    let mut bad = h.clone();
    bad.calls[*gets.get(k)?].outcome = to;
    Some(bad)
}
