//! SEM.ACQUIRE and SEM.RELEASE: grant at once, answer UNAVAILABLE, or park in the FIFO queue.

use std::sync::atomic::Ordering;

use super::base::{lease_ref, ns_mut, sem_mut, weight_exceeds, Exec, Shard};
use super::queue::{grant, serve, touch, Want};
use crate::error::Error;
use crate::journal::Record;
use crate::protocol::Reply;
use crate::request::{SemAcquire, SemRelease};
use crate::state::{ClientId, Waiter};
use crate::types::Nanos;
use crate::view::{self, Outcome};

impl Shard {
    /// SEM.ACQUIRE: grants at once when the hold does not grow or nobody waits and the permits
    /// are free; else answers UNAVAILABLE (`timeout` 0, or no `client` to park for) or parks
    /// the request at the queue's tail for `client`.
    pub(super) fn acquire(
        &mut self,
        now: Nanos,
        req: SemAcquire,
        client: Option<ClientId>,
    ) -> Result<Exec, Error> {
        let SemAcquire {
            ns,
            sem,
            lease,
            weight,
            timeout,
            meta,
        } = req;
        // Copied out: the limits are shared by every shard, so no per-acquire refcount traffic.
        let (max_holders, max_sem_waiters, max_waiters) = (
            self.cx.limits.max_holders_per_semaphore,
            self.cx.limits.max_waiters_per_semaphore,
            self.cx.limits.max_waiters,
        );
        let n = ns_mut(&mut self.namespaces, &ns)?;
        let s = sem_mut(&mut n.semaphores, &ns, &sem)?;
        let r = lease_ref(&n.leases, &ns, lease)?;
        let l = &mut n.leases[r];
        if weight > s.permits {
            return Err(weight_exceeds());
        }
        let held = s.held_by(l);
        let needed = weight - held.unwrap_or(0);
        // A hold that does not grow needs nothing from anyone: it never waits.
        let grantable = needed <= 0 || (s.queue.is_empty() && s.available() >= needed);
        if held.is_none() && s.holders.len() >= max_holders {
            return Err(Error::ResourceExhausted(format!(
                "holder quota reached on semaphore '{sem}' ({} holders)",
                max_holders
            )));
        }
        if grantable {
            let want = Want {
                lease: r,
                weight,
                meta,
            };
            let token = grant(&ns, s, l, want, now, &mut self.cx);
            self.cx.stats.acquire_acquired += 1;
            if needed < 0 {
                serve(n, &sem, now, &mut self.cx);
            }
            // The state after the command: permits a smaller hold freed are handed on already.
            let s = &n.semaphores[&sem];
            return Ok(Exec::Reply(view::acquire(
                Outcome::Acquired,
                s,
                Some(token),
            )));
        }
        let Some(client) = client.filter(|_| timeout > 0) else {
            touch(&ns, s, now, &mut self.cx.journal);
            self.cx.stats.acquire_unavailable += 1;
            return Ok(Exec::Reply(view::acquire(Outcome::Unavailable, s, None)));
        };
        if s.queue.len() >= max_sem_waiters {
            return Err(Error::ResourceExhausted(format!(
                "waiter quota reached on semaphore '{sem}' ({} waiters)",
                max_sem_waiters
            )));
        }
        if self.cx.waiter_count.load(Ordering::Acquire) >= max_waiters {
            return Err(Error::ResourceExhausted(format!(
                "waiter quota reached on the server ({} waiters)",
                max_waiters
            )));
        }
        touch(&ns, s, now, &mut self.cx.journal);
        let id = self.cx.next_waiter;
        self.cx.next_waiter += 1;
        let deadline = now.saturating_add(timeout);
        s.queue.insert(
            id,
            Waiter {
                lease: r,
                weight,
                metadata: meta,
                deadline,
                parked_at: now,
                client,
            },
        );
        self.cx.lease_waits.entry((n.key, r)).or_default().push(id);
        self.cx.timers.add_waiter(deadline, id);
        self.cx
            .waiter_at
            .insert(id, (ns.detached(), sem.detached()));
        self.cx.waiter_count.fetch_add(1, Ordering::AcqRel);
        Ok(Exec::Parked(id))
    }

    /// SEM.RELEASE: drops the lease's hold and serves the queue with the permits it freed.
    pub(super) fn release(&mut self, now: Nanos, req: SemRelease) -> Result<Reply, Error> {
        let SemRelease { ns, sem, lease } = req;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        let s = sem_mut(&mut n.semaphores, &ns, &sem)?;
        let r = lease_ref(&n.leases, &ns, lease)?;
        let l = &mut n.leases[r];
        // A lease that holds nothing here: a no-op, nothing moves.
        if s.remove_hold(l).is_none() {
            return Ok(view::semaphore(s));
        }
        s.last_activity_at = now;
        self.cx.journal.push(Record::HoldDel {
            ns: ns.clone(),
            sem: sem.clone(),
            lease: l.id,
            at: now,
        });
        serve(n, &sem, now, &mut self.cx);
        Ok(view::semaphore(&n.semaphores[&sem]))
    }
}
