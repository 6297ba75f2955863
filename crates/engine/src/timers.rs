//! A shard's deadlines: lease expiries and parked acquires' time-outs.
//!
//! Every live lease has an expiry, so that side is built for size: a binary heap of 16-byte
//! entries that are never removed in place. A refreshed or revoked lease leaves its old entry
//! behind; an entry is acted on only if its lease still expires at exactly that instant (see
//! [`Timers::pop_lease`]), and the heap is rebuilt from the live leases whenever stale entries
//! could outnumber live ones. Time-outs are few and are cancelled on every grant, so they sit
//! in an ordered set.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use super::leases::LeaseRef;
use super::room::{free_if_empty, sparse};
use super::state::WaiterId;
use super::types::Nanos;

/// Size of the heap at which the first rebuild is considered.
const MIN_REBUILD: usize = 1024;

/// A lease's expiry entry: when, the namespace's shard key, the lease's handle.
pub type LeaseDeadline = (Nanos, u32, LeaseRef);

/// Lease expiries and parked-acquire time-outs.
#[derive(Debug)]
pub struct Timers {
    leases: BinaryHeap<Reverse<LeaseDeadline>>,
    /// Heap size that triggers a rebuild: twice the entries left by the last one.
    rebuild_at: usize,
    waiters: BTreeSet<(Nanos, WaiterId)>,
}

impl Default for Timers {
    fn default() -> Timers {
        Timers {
            leases: BinaryHeap::new(),
            rebuild_at: MIN_REBUILD,
            waiters: BTreeSet::new(),
        }
    }
}

impl Timers {
    /// Schedules a lease's expiry. Returns true when the heap should be rebuilt with
    /// [`Timers::rebuild_leases`] (stale entries may be piling up).
    #[must_use]
    pub fn add_lease(&mut self, at: Nanos, ns_key: u32, lease: LeaseRef) -> bool {
        self.leases.push(Reverse((at, ns_key, lease)));
        self.leases.len() >= self.rebuild_at
    }

    /// Replaces every lease entry by those of `live`, dropping the stale ones.
    pub fn rebuild_leases(&mut self, live: impl Iterator<Item = LeaseDeadline>) {
        self.leases = live.map(Reverse).collect();
        self.leases.shrink_to_fit();
        self.rebuild_at = (2 * self.leases.len()).max(MIN_REBUILD);
    }

    /// Gives back the heap's room when it holds a quarter of it or less, and the time-outs'
    /// tree node when there are none.
    pub fn shrink(&mut self) {
        if sparse(self.leases.capacity(), self.leases.len(), MIN_REBUILD) {
            self.leases.shrink_to_fit();
        }
        free_if_empty(&mut self.waiters);
    }

    /// Schedules a parked acquire's time-out.
    pub fn add_waiter(&mut self, at: Nanos, id: WaiterId) {
        self.waiters.insert((at, id));
    }

    /// Cancels a parked acquire's time-out.
    pub fn remove_waiter(&mut self, at: Nanos, id: WaiterId) {
        self.waiters.remove(&(at, id));
    }

    /// Whether this lease expiry is scheduled (a linear scan, for [`super::Shard::check`]).
    pub fn has_lease(&self, entry: LeaseDeadline) -> bool {
        self.leases.iter().any(|Reverse(e)| *e == entry)
    }

    /// Whether this time-out is scheduled.
    pub fn has_waiter(&self, at: Nanos, id: WaiterId) -> bool {
        self.waiters.contains(&(at, id))
    }

    /// The earliest deadline. A lease entry may be stale: waking for it finds nothing to do.
    pub fn next(&self) -> Option<Nanos> {
        let lease = self.leases.peek().map(|Reverse((t, _, _))| *t);
        let waiter = self.waiters.first().map(|(t, _)| *t);
        match (lease, waiter) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest lease entry (possibly stale).
    pub fn peek_lease(&self) -> Option<LeaseDeadline> {
        self.leases.peek().map(|Reverse(e)| *e)
    }

    /// Takes a lease entry due at exactly `t`. The caller expires the lease only if it still
    /// expires at `t`: otherwise the entry is stale (the lease was refreshed, revoked, or its
    /// slot now holds another lease). Expiring whatever lease is due at `t` is right whichever
    /// entry names it.
    pub fn pop_lease(&mut self, t: Nanos) -> Option<(u32, LeaseRef)> {
        match self.leases.peek() {
            Some(Reverse((at, _, _))) if *at == t => {}
            _ => return None,
        }
        self.leases.pop().map(|Reverse((_, k, r))| (k, r))
    }

    /// Takes a time-out due at exactly `t`.
    pub fn pop_waiter(&mut self, t: Nanos) -> Option<WaiterId> {
        match self.waiters.first() {
            Some((at, _)) if *at == t => self.waiters.pop_first().map(|(_, w)| w),
            _ => None,
        }
    }
}
