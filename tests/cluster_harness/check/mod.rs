//! The history checker: from a [`History`] alone, proves that the server never let clients
//! rely on more permits than exist, handed out fencing tokens in order, and lost no
//! acknowledged change. It must never raise a false alarm on a correct server, so every rule
//! reads the client's instants on the safe side.
//!
//! # What the instants mean
//!
//! A call's effect happens at one server instant `s`, between its client's `invoke` and
//! `complete` (one machine, so the server's clock and the run's monotonic clock agree up to
//! [`slack`]). A call with an unknown outcome (no reply: timeout, lost connection) may take effect
//! at any instant after its invoke, also after the client's later calls: a request held in a
//! partitioned link can arrive late. Its effect window is `[invoke, NEVER)`
//! ([`Call::effect_until`]). An error reply changed nothing (SPEC §5), nor did a non-acquired
//! acquire (a growing re-acquire that times out keeps its hold unchanged, SPEC §9).
//!
//! # When a lease is surely alive, surely dead ([`leases`])
//!
//! - **Surely alive** from its create's completion until the earlier of `alive_until` and the
//!   invoke of any revoke of it (judging that revoke itself, any other: a revoke cannot end the
//!   lease before it lands). `alive_until` is the latest invoke of an acknowledged create or
//!   refresh plus the lease's shortest TTL, minus the slack: the server set
//!   `expires_at = now + ttl` with its `now` at or after that invoke, and a lease alive then was
//!   alive before (a dead lease never comes back).
//! - **Surely dead** after `dead_after`: an acknowledged revoke's completion, or the end of the
//!   expiry chain: the create's completion plus TTL, pushed further by every create or refresh
//!   that was invoked before the bound so far ran out (by its completion plus TTL; forever for
//!   an unknown one), plus the slack. In cluster mode only a revoke does: a new leader extends
//!   every lease alive at the log's last instant by the failover grace, and failovers may
//!   chain ([`History::leases_extended`]).
//!
//! # When a client may rely on a hold ([`holds`])
//!
//! An ACQUIRED reply to acquire `A` of lease `L` on semaphore `S` is relied on from `A`'s
//! completion until the earliest of: the lease's `alive_until`, and the invoke of any other call
//! that may change that hold after `A` did: a release of `(L, S)`, an acquire of `(L, S)` (a
//! re-acquire changes the weight) or a revoke of `L`, that could take effect after `A` (its
//! effect window ends after `A`'s invoke), except the known no-ops (error replies, non-acquired
//! acquires). A lost connection does not end a hold (holds belong to leases, not connections),
//! but a later unknown release ends it at its invoke, as it may land at any time after.
//! Within that window the server surely has the hold with `A`'s weight and token: it granted at
//! or before `A`'s completion, and nothing that could end or change the hold can have landed.
//!
//! # The rules
//!
//! - **(a) [`Rule::OverGrant`]** ([`permits`]): at no instant do the weights of the holds relied
//!   on in a semaphore sum above its permits. Two relied windows that overlap are holds the
//!   server had at the same instant, so a sum above the permits is a real double grant. A
//!   SEM.HOLDERS reply whose weights sum above the permits is one too.
//! - **(b) Tokens** ([`tokens`]): an acquire is a *fresh grant* when every earlier acquire of
//!   the same lease on the same semaphore that may have left a hold was surely ended before it
//!   was invoked (an acknowledged release invoked after that acquire's effect window, or an
//!   acknowledged revoke); anything else may be a re-acquire, which returns the existing hold's
//!   token. [`Rule::TokenFell`]: a fresh grant that completed before another fresh grant was
//!   invoked has the lower token. [`Rule::TokenRepeated`]: no fresh grant repeats the token of
//!   an earlier grant on its semaphore, and no two leases get the same token.
//! - **(c) Nothing acknowledged is lost** ([`reads`]), checked on every read (the final reads
//!   after the faults heal, at least):
//!   - [`Rule::HoldLost`]: a SEM.HOLDERS read lists every hold relied on across the whole read,
//!     with its weight and token.
//!   - [`Rule::ReleaseLost`]: it lists no hold whose acknowledged release completed before the
//!     read, unless an acquire that may have re-created it could have landed after the release
//!     and before the read.
//!   - [`Rule::LeaseRevived`]: no call invoked after its lease was surely dead (revoked, or
//!     expired) succeeds on it, and no read lists it.
//!   - [`Rule::LeaseLost`]: no call that ran while its lease was surely alive is told the lease
//!     (or its namespace, which no call of a run deletes) is not found.

mod holds;
mod leases;
mod permits;
mod reads;
mod tokens;

use std::collections::HashMap;
use std::fmt;

use super::history::{At, Call, History, Op, Outcome, NEVER};

/// Which rule a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// (a) more permits relied on than exist.
    OverGrant,
    /// (b) a fresh grant's token at or below one granted before it.
    TokenFell,
    /// (b) one token for two grants.
    TokenRepeated,
    /// (c) a read misses an acknowledged hold.
    HoldLost,
    /// (c) a read shows an acknowledged release undone.
    ReleaseLost,
    /// (c) a revoked or expired lease is alive again.
    LeaseRevived,
    /// (c) a lease acknowledged alive is missing.
    LeaseLost,
}

/// One broken rule, with what shows it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: Rule,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.rule, self.detail)
    }
}

/// Every violation the history shows; empty for a correct run.
pub fn check(h: &History) -> Vec<Violation> {
    let ix = Index::new(h);
    let lives = leases::Lives::new(&ix);
    let relied = holds::relied(&ix, &lives);
    let mut out = permits::check(h, &relied);
    out.extend(tokens::check(&ix));
    out.extend(reads::check(&ix, &lives, &relied));
    out
}

/// How far the server's clock may run ahead of the run's monotonic clock over a TTL of `ttl_s`
/// seconds: the server times leases on the wall clock, which NTP may slew by up to 500 ppm;
/// 0.1% of the TTL plus 100 ms covers that and the server's timer granularity.
pub fn slack(ttl_s: u64) -> At {
    100_000_000 + ttl_s * 1_000_000
}

/// The history's calls, looked up by the lease they name.
pub struct Index<'h> {
    pub h: &'h History,
    /// Call indexes naming each lease (its create included), in invoke order.
    by_lease: HashMap<&'h str, Vec<usize>>,
}

impl<'h> Index<'h> {
    fn new(h: &'h History) -> Index<'h> {
        let mut by_lease: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, c) in h.calls.iter().enumerate() {
            let named = match (&c.op, &c.outcome) {
                (Op::CreateLease { .. }, Outcome::Created(id)) => Some(id.as_str()),
                (op, _) => op.lease(),
            };
            if let Some(l) = named {
                by_lease.entry(l).or_default().push(i);
            }
        }
        for calls in by_lease.values_mut() {
            calls.sort_by_key(|&i| h.calls[i].invoke);
        }
        Index { h, by_lease }
    }

    pub fn call(&self, i: usize) -> &'h Call {
        &self.h.calls[i]
    }

    /// Every lease the history names.
    pub fn leases(&self) -> impl Iterator<Item = &'h str> + '_ {
        self.by_lease.keys().copied()
    }

    /// The calls naming `lease`, in invoke order, with their indexes.
    pub fn on_lease(&self, lease: &str) -> impl Iterator<Item = (usize, &'h Call)> + '_ {
        self.by_lease
            .get(lease)
            .into_iter()
            .flatten()
            .map(|&i| (i, &self.h.calls[i]))
    }

    /// The acquires and releases of `lease` on `sem`, and the revokes of `lease`: the calls that
    /// can change that hold.
    pub fn on_hold<'a>(
        &'a self,
        lease: &'a str,
        sem: &'a str,
    ) -> impl Iterator<Item = (usize, &'h Call)> + 'a {
        self.on_lease(lease).filter(move |(_, c)| match &c.op {
            Op::Acquire { sem: s, .. } | Op::Release { sem: s, .. } => s == sem,
            Op::Revoke { .. } => true,
            _ => false,
        })
    }
}

/// A lease id short enough for a violation's text.
pub fn short(lease: &str) -> &str {
    &lease[..lease.len().min(9)]
}

/// An instant as milliseconds into the run, for a violation's text.
pub fn ms(t: At) -> String {
    if t == NEVER {
        "never".to_string()
    } else {
        format!("{:.3}ms", t as f64 / 1e6)
    }
}
