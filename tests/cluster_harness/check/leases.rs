//! When each lease is surely alive and when surely dead, from its create, refresh and revoke
//! calls (the rules are in the module doc of `check`).

use std::collections::HashMap;

use super::super::history::{At, Call, Op, Outcome, NEVER};
use super::{slack, Index};

/// The bounds of one lease's life.
#[derive(Debug, Clone, Copy)]
pub struct Life {
    /// When its create completed: the id is known, and the lease exists, from then on.
    pub created: At,
    /// Until when its creates and refreshes surely keep it alive (exclusive), revokes aside.
    pub alive_until: At,
    /// After when it is surely dead.
    pub dead_after: At,
}

/// The [`Life`] of every lease whose create was acknowledged.
pub struct Lives(HashMap<String, Life>);

impl Lives {
    pub fn new(ix: &Index) -> Lives {
        let lives = ix
            .leases()
            .filter_map(|l| life(ix, l).map(|life| (l.to_string(), life)))
            .collect();
        Lives(lives)
    }

    /// The lease's life; `None` for a lease the history never saw created.
    pub fn get(&self, lease: &str) -> Option<&Life> {
        self.0.get(lease)
    }
}

/// The TTL a create or refresh asked for.
fn ttl(c: &Call) -> Option<u64> {
    match c.op {
        Op::CreateLease { ttl } | Op::Refresh { ttl, .. } => Some(ttl),
        _ => None,
    }
}

fn secs(s: u64) -> At {
    s * 1_000_000_000
}

fn life(ix: &Index, lease: &str) -> Option<Life> {
    let calls: Vec<&Call> = ix.on_lease(lease).map(|(_, c)| c).collect();
    let create = calls
        .iter()
        .find(|c| matches!(c.outcome, Outcome::Created(_)))?;
    let min_ttl = calls.iter().filter_map(|c| ttl(c)).min()?;

    // Surely alive: the latest acknowledged create or refresh invoke plus the shortest TTL.
    let last_ack = calls
        .iter()
        .filter(|c| ttl(c).is_some() && c.succeeded())
        .map(|c| c.invoke)
        .max()?;
    let alive_until = (last_ack + secs(min_ttl)).saturating_sub(slack(min_ttl));

    // Surely dead: the expiry chain, each create or refresh that may have landed while the
    // lease may still have been alive pushing it on (in invoke order).
    let mut dead_after = create.complete;
    for c in calls
        .iter()
        .filter(|c| !matches!(c.outcome, Outcome::Refused(_)))
    {
        let Some(t) = ttl(c) else { continue };
        if c.invoke > dead_after {
            break;
        }
        let end = c.effect_until().saturating_add(secs(t) + slack(t));
        dead_after = dead_after.max(end);
    }
    let revoked = calls
        .iter()
        .filter(|c| matches!(c.op, Op::Revoke { .. }) && c.outcome == Outcome::Ok)
        .map(|c| c.complete)
        .min()
        .unwrap_or(NEVER);
    if ix.h.leases_extended {
        dead_after = NEVER;
    }
    Some(Life {
        created: create.complete,
        alive_until,
        dead_after: dead_after.min(revoked),
    })
}
