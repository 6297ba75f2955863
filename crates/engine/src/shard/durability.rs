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
        let queued: Vec<(Name, Name)> = self
            .cx
            .waiter_at
            .keys()
            .flat_map(|w| self.queues_of(*w))
            .collect();
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
            let queues = n.semaphores[&sem].queue[&id].queues(&sem).to_vec();
            let entries: Vec<(Name, Waiter)> = queues
                .into_iter()
                .map(|q| {
                    let w = n.semaphores.get_mut(&q).and_then(|s| s.queue.remove(&id));
                    (q, w.expect("waiter index is exact"))
                })
                .collect();
            let lease = n.leases[entries[0].1.lease].id;
            let placed = keep(id) && self.place(id, ns, lease, entries);
            if !placed {
                self.cx.waiter_count.fetch_sub(1, Ordering::AcqRel);
                dropped.push(id);
            }
        }
        dropped
    }

    /// Parks waiter `id` at the tail of the queues of `entries` in namespace `ns`, for the
    /// lease with id `lease`; false (nothing parked) when one of them is missing.
    fn place(
        &mut self,
        id: WaiterId,
        ns: Name,
        lease: LeaseId,
        entries: Vec<(Name, Waiter)>,
    ) -> bool {
        let Some(n) = self.namespaces.get_mut(&ns) else {
            return false;
        };
        let Some(r) = n.leases.find(&lease) else {
            return false;
        };
        if !entries.iter().all(|(q, _)| n.semaphores.contains_key(q)) {
            return false;
        }
        let (first, deadline) = (entries[0].0.clone(), entries[0].1.deadline);
        for (q, w) in entries {
            let s = n.semaphores.get_mut(&q).expect("checked above");
            s.queue.insert(id, Waiter { lease: r, ..w });
        }
        self.cx.timers.add_waiter(deadline, id);
        self.cx.lease_waits.entry((n.key, r)).or_default().push(id);
        self.cx.waiter_at.insert(id, (ns, first));
        true
    }

    /// The queues parked acquire `id` waits in, with their namespace.
    fn queues_of(&self, id: WaiterId) -> Vec<(Name, Name)> {
        let (ns, sem) = &self.cx.waiter_at[&id];
        let w = &self.namespaces[ns].semaphores[sem].queue[&id];
        w.queues(sem)
            .iter()
            .map(|q| (ns.clone(), q.clone()))
            .collect()
    }
}
