//! What a caller that cannot make the shard's changes durable (its disk is full) asks of it:
//! to hold grants while no change can be saved, and to roll back to the state that is saved,
//! keeping the parked acquires in their places.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use super::base::Shard;
use crate::state::{Namespace, Waiter, WaiterId};
use crate::types::{FencingToken, LeaseId, Name, Nanos};

impl Shard {
    /// Holds handing freed permits to parked acquires, until [`Shard::resume_grants`]. A grant
    /// is a change, and a parked client must never be told ACQUIRED for a hold that a crash
    /// could take back; so while its caller cannot save changes, the permits that an expiry or
    /// a time-out frees stay free, and the parked acquires keep their places and time out as
    /// usual.
    pub fn hold_grants(&mut self) {
        self.cx.grants_held = true;
    }

    /// Hands freed permits to parked acquires again: serves every queue at `now`, as the frees
    /// made while grants were held would have.
    pub fn resume_grants(&mut self, now: Nanos) {
        self.cx.grants_held = false;
        self.advance(now);
        let queued: Vec<(Name, Name)> = self.cx.waiter_at.values().cloned().collect();
        self.serve_all(queued, now);
    }

    /// Replaces the shard's state by `namespaces` and `token_hwm`, the state its caller could
    /// save (a write of later changes failed), and moves the parked acquires that `keep`
    /// accepts into it, in their order, with their ids and deadlines. Returns the ids of the
    /// other parked acquires, which are no longer parked: their caller answers them.
    ///
    /// A kept acquire's namespace, semaphore and lease are in `namespaces` when it parked
    /// before the saved state was saved (nothing that ends them leaves a waiter behind), which
    /// is what callers keep; one whose lease is missing all the same is returned too.
    pub fn roll_back(
        &mut self,
        namespaces: BTreeMap<Name, Namespace>,
        token_hwm: FencingToken,
        keep: impl Fn(WaiterId) -> bool,
    ) -> Vec<WaiterId> {
        let limits = self.cx.limits.clone();
        let count = self.cx.namespace_count.clone();
        count.fetch_sub(self.namespaces.len(), Ordering::AcqRel);
        // Never below a token already handed out, even one whose grant is rolled back.
        let hwm = token_hwm.max(self.cx.token_hwm);
        let mut old = std::mem::replace(self, Shard::restore(limits, count, namespaces, hwm));
        self.cx.waiter_count = old.cx.waiter_count.clone();
        self.cx.next_waiter = old.cx.next_waiter;
        self.cx.stats = old.cx.stats;
        self.cx.grants_held = old.cx.grants_held;
        let mut ids: Vec<WaiterId> = old.cx.waiter_at.keys().copied().collect();
        ids.sort_unstable();
        let mut dropped = Vec::new();
        for id in ids {
            let (ns, sem) = old.cx.waiter_at[&id].clone();
            let n = old.namespaces.get_mut(&ns).expect("waiter index is exact");
            let w = n
                .semaphores
                .get_mut(&sem)
                .and_then(|s| s.queue.remove(&id))
                .expect("waiter index is exact");
            let lease = n.leases[w.lease].id;
            let placed = keep(id) && self.place(id, ns, sem, lease, w);
            if !placed {
                self.cx.waiter_count.fetch_sub(1, Ordering::AcqRel);
                dropped.push(id);
            }
        }
        dropped
    }

    /// Parks waiter `id` at the tail of `sem`'s queue in namespace `ns`, for the lease with id
    /// `lease`; false when one of them is missing.
    fn place(&mut self, id: WaiterId, ns: Name, sem: Name, lease: LeaseId, w: Waiter) -> bool {
        let Some(n) = self.namespaces.get_mut(&ns) else {
            return false;
        };
        let Some(r) = n.leases.find(&lease) else {
            return false;
        };
        let Some(s) = n.semaphores.get_mut(&sem) else {
            return false;
        };
        self.cx.timers.add_waiter(w.deadline, id);
        self.cx.lease_waits.entry((n.key, r)).or_default().push(id);
        s.queue.insert(id, Waiter { lease: r, ..w });
        self.cx.waiter_at.insert(id, (ns, sem));
        true
    }
}
