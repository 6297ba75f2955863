//! Time and cancellation: deadlines fire (leases die, parked acquires time out) and parked
//! acquires are taken out from outside (a client gone, CLIENT UNBLOCK).

use super::base::{Cancel, Shard};
use super::queue::{drop_lease, serve_many, unpark};
use crate::error::Error;
use crate::journal::{lease_put, Record};
use crate::protocol::Reply;
use crate::state::WaiterId;
use crate::types::{Name, Nanos};
use crate::view::Outcome;

/// How a parked acquire taken out of its queue is answered.
pub(super) enum Ending {
    /// Not at all (its client is gone).
    Silent,
    /// With an outcome and the semaphore's state.
    Outcome(Outcome),
    /// With an error.
    Error(Error),
}

impl Shard {
    /// Fires every deadline up to and including `now`: leases die at their `expires_at`,
    /// parked acquires time out at their deadline.
    ///
    /// Everything due at one instant `t` happens at `t`, together: first every lease whose
    /// `expires_at` is `t` dies (holds released, its parked acquires end NOTFOUND), then every
    /// parked acquire whose deadline is `t` times out, and only then are the queues served. So
    /// no permit is ever granted at `t` to a lease that is dead at `t` or to an acquire whose
    /// time is up at `t`, whatever the order of the timers. Grants made then carry `t` as
    /// their time (`locked_at`, `last_activity_at`), also when `now` is later (the caller ran
    /// late).
    pub fn advance(&mut self, now: Nanos) {
        while let Some(t) = self.cx.timers.next() {
            if t > now {
                break;
            }
            let mut touched: Vec<(Name, Name)> = Vec::new();
            // Leases due at t die before the time-outs due at t.
            while let Some((key, r)) = self.cx.timers.pop_lease(t) {
                let Some(ns) = self.expiring((t, key, r)).cloned() else {
                    continue; // a stale entry
                };
                let n = self.namespaces.get_mut(&ns).expect("just found");
                self.cx.stats.leases_expired += 1;
                for sem in drop_lease(n, r, &mut self.cx) {
                    touched.push((ns.clone(), sem));
                }
            }
            while let Some(w) = self.cx.timers.pop_waiter(t) {
                touched.extend(self.end_waiter(w, Ending::Outcome(Outcome::TimedOut)));
            }
            self.serve_all(touched, t);
        }
    }

    /// Serves the queues of the `(namespace, semaphore)` pairs in `touched` at `now`.
    pub(super) fn serve_all(&mut self, mut touched: Vec<(Name, Name)>, now: Nanos) {
        touched.sort();
        touched.dedup();
        for group in touched.chunk_by(|a, b| a.0 == b.0) {
            if let Some(n) = self.namespaces.get_mut(&group[0].0) {
                serve_many(n, group.iter().map(|(_, s)| s.clone()), now, &mut self.cx);
            }
        }
    }

    /// Takes a parked acquire out of its queue (client gone, or CLIENT UNBLOCK). Returns false
    /// when it was no longer parked (already answered).
    pub fn cancel(&mut self, now: Nanos, waiter: WaiterId, why: Cancel) -> bool {
        self.advance(now);
        if !self.cx.waiter_at.contains_key(&waiter) {
            return false;
        }
        let ending = match why {
            Cancel::Disconnected => Ending::Silent,
            Cancel::UnblockTimeout => Ending::Outcome(Outcome::TimedOut),
            Cancel::UnblockError => Ending::Error(Error::Unblocked(
                "client unblocked via CLIENT UNBLOCK".into(),
            )),
        };
        if why != Cancel::Disconnected {
            self.cx.stats.clients_unblocked += 1;
        }
        let touched = self.end_waiter(waiter, ending);
        self.serve_all(touched, now);
        true
    }

    /// Removes a parked acquire and answers it as `ending` says. Returns the queues it left,
    /// which the caller must serve.
    pub(super) fn end_waiter(&mut self, waiter: WaiterId, ending: Ending) -> Vec<(Name, Name)> {
        let Some((ns, _)) = self.cx.waiter_at.get(&waiter).cloned() else {
            return Vec::new();
        };
        let n = self.namespaces.get_mut(&ns).expect("waiter index is exact");
        let u = unpark(n, waiter, &mut self.cx).expect("just found");
        let reply = match ending {
            Ending::Silent => None,
            Ending::Outcome(o) => {
                if o == Outcome::TimedOut {
                    self.cx.stats.acquire_timed_out += 1;
                }
                Some(u.reply(n, o))
            }
            Ending::Error(e) => Some(Reply::Error(e)),
        };
        if let Some(r) = reply {
            self.cx.outbox.push((waiter, r));
        }
        u.queues.into_iter().map(|s| (ns.clone(), s)).collect()
    }

    /// The wall clock stepped forward `by` (more than the caller's threshold beyond what the
    /// monotonic clock saw): every lease dies `by` later and every parked acquire times out `by`
    /// later, in one journaled change, so that the step itself expires nothing (Hazelcast's CP
    /// subsystem shifts session expiries the same way). Call it before running anything at the
    /// new `now`.
    pub fn shift_time(&mut self, now: Nanos, by: Nanos) {
        for n in self.namespaces.values_mut() {
            n.leases.shift_expiries(by);
            for s in n.semaphores.values_mut() {
                for (&id, w) in s.queue.iter_mut() {
                    self.cx.timers.remove_waiter(w.deadline, id);
                    w.deadline = w.deadline.saturating_add(by);
                    self.cx.timers.add_waiter(w.deadline, id);
                }
            }
        }
        self.rebuild_lease_timers();
        self.cx.journal.push(Record::TimeShift { by, at: now });
    }

    /// A new cluster leader takes over (SPEC §10, failover lease grace): every lease still
    /// alive at `alive_at`, the last instant the cluster's log shows, that would die before
    /// `until` lives until `until` instead, each journaled as a `LeasePut` of the one change
    /// the caller makes of them. The time no leader ran then expires no lease; a lease dead at
    /// `alive_at` stays dead (the first `advance` ends it).
    pub fn extend_leases(&mut self, alive_at: Nanos, until: Nanos) {
        let mut records = Vec::new();
        for n in self.namespaces.values_mut() {
            let due: Vec<_> = n
                .leases
                .iter()
                .filter(|(_, l)| l.expires_at > alive_at && l.expires_at < until)
                .map(|(r, _)| r)
                .collect();
            for r in due {
                n.leases[r].expires_at = until;
                records.push(lease_put(&n.name, &n.leases[r]));
            }
        }
        if !records.is_empty() {
            self.rebuild_lease_timers();
            self.cx.journal.extend(records);
        }
    }
}
