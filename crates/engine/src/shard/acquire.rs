//! SEM.ACQUIRE, SEM.ACQUIREALL and SEM.RELEASE: grant at once, answer UNAVAILABLE, or park in
//! the FIFO queue (a SEM.ACQUIREALL in the queue of each semaphore it asks for).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::base::{
    lease_ref, ns_mut, sem_missing, sem_mut, weight_exceeds, weight_exceeds_on, Cx, Exec, Shard,
};
use super::queue::{grant, serve, serve_many, touch, Want};
use crate::error::Error;
use crate::journal::Record;
use crate::leases::LeaseRef;
use crate::protocol::Reply;
use crate::request::{SemAcquire, SemAcquireAll, SemRelease};
use crate::state::{ClientId, Namespace, Semaphore, Waiter, WaiterId};
use crate::types::{Limits, Metadata, Name, Nanos, Weight};
use crate::view::{self, Outcome};

/// Whether a hold of `weight` on `s`, where the lease holds `held`, is given without waiting:
/// a hold that does not grow needs nothing from anyone, and one that grows needs the permits
/// free and nobody waiting before it.
fn grantable_now(s: &Semaphore, held: Option<Weight>, weight: Weight) -> bool {
    let needed = weight - held.unwrap_or(0);
    needed <= 0 || (s.queue.is_empty() && s.available() >= needed)
}

/// RESOURCEEXHAUSTED at once when a new holder would pass the holders-per-semaphore quota.
fn holder_room(s: &Semaphore, held: Option<Weight>, max: usize) -> Result<(), Error> {
    if held.is_none() && s.holders.len() >= max {
        return Err(Error::ResourceExhausted(format!(
            "holder quota reached on semaphore '{}' ({max} holders)",
            s.name
        )));
    }
    Ok(())
}

/// RESOURCEEXHAUSTED when `s`'s queue is full.
fn waiter_room(s: &Semaphore, max: usize) -> Result<(), Error> {
    if s.queue.len() >= max {
        return Err(Error::ResourceExhausted(format!(
            "waiter quota reached on semaphore '{}' ({max} waiters)",
            s.name
        )));
    }
    Ok(())
}

/// RESOURCEEXHAUSTED when the server-wide count of parked acquires is at its quota.
fn server_waiter_room(cx: &Cx) -> Result<(), Error> {
    let max = cx.limits.max_waiters;
    if cx.waiter_count.load(Ordering::Acquire) >= max {
        return Err(Error::ResourceExhausted(format!(
            "waiter quota reached on the server ({max} waiters)"
        )));
    }
    Ok(())
}

/// A parked acquire to be, the same in each of its queues.
struct Parking {
    lease: LeaseRef,
    meta: Metadata,
    deadline: Nanos,
    /// For a SEM.ACQUIREALL, the semaphores it asks for ([`Waiter::all`]).
    all: Option<Arc<[Name]>>,
    /// The client it waits for.
    client: ClientId,
}

/// Parks `p` at the tail of each queue in `parts` (semaphore and weight; their
/// last_activity_at moves), under one new id.
fn park(
    n: &mut Namespace,
    p: Parking,
    parts: &[(Name, Weight)],
    now: Nanos,
    cx: &mut Cx,
) -> WaiterId {
    let id = cx.next_waiter;
    cx.next_waiter += 1;
    for (sem, weight) in parts {
        let s = n.semaphores.get_mut(sem).expect("checked by the caller");
        touch(&n.name, s, now, &mut cx.journal);
        let entry = Waiter {
            lease: p.lease,
            weight: *weight,
            metadata: p.meta.clone(),
            deadline: p.deadline,
            all: p.all.clone(),
            parked_at: now,
            client: p.client,
        };
        s.queue.insert(id, entry);
    }
    cx.lease_waits.entry((n.key, p.lease)).or_default().push(id);
    cx.timers.add_waiter(p.deadline, id);
    cx.waiter_at
        .insert(id, (n.name.detached(), parts[0].0.detached()));
    cx.waiter_count.fetch_add(1, Ordering::AcqRel);
    id
}

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
        let (max_holders, max_sem_waiters) = (
            self.cx.limits.max_holders_per_semaphore,
            self.cx.limits.max_waiters_per_semaphore,
        );
        let n = ns_mut(&mut self.namespaces, &ns)?;
        let s = sem_mut(&mut n.semaphores, &ns, &sem)?;
        let r = lease_ref(&n.leases, &ns, lease)?;
        let l = &mut n.leases[r];
        if weight > s.permits {
            return Err(weight_exceeds());
        }
        let held = s.held_by(l);
        holder_room(s, held, max_holders)?;
        if grantable_now(s, held, weight) {
            let want = Want {
                lease: r,
                weight,
                meta,
            };
            let token = grant(&n.name, s, l, want, now, &mut self.cx);
            self.cx.stats.acquire_acquired += 1;
            if held.is_some_and(|h| h > weight) {
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
            touch(&n.name, s, now, &mut self.cx.journal);
            self.cx.stats.acquire_unavailable += 1;
            return Ok(Exec::Reply(view::acquire(Outcome::Unavailable, s, None)));
        };
        waiter_room(s, max_sem_waiters)?;
        server_waiter_room(&self.cx)?;
        let p = Parking {
            lease: r,
            meta,
            deadline: now.saturating_add(timeout),
            all: None,
            client,
        };
        let id = park(n, p, &[(sem, weight)], now, &mut self.cx);
        Ok(Exec::Parked(id))
    }

    /// SEM.ACQUIREALL: SEM.ACQUIRE's rules over each asked semaphore, all or none. Granted at
    /// once when every part is (see [`grantable_now`]); else UNAVAILABLE (`timeout` 0, or no
    /// `client` to park for) or parked for `client` at the tail of every asked queue, to be
    /// served by [`super::queue::serve`].
    pub(super) fn acquire_all(
        &mut self,
        now: Nanos,
        req: SemAcquireAll,
        client: Option<ClientId>,
    ) -> Result<Exec, Error> {
        let SemAcquireAll {
            ns,
            lease,
            timeout,
            parts,
            meta,
        } = req;
        let Limits {
            max_holders_per_semaphore: max_holders,
            max_waiters_per_semaphore: max_sem_waiters,
            ..
        } = *self.cx.limits;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        // Every check comes before any change: a rejected call changes nothing.
        for p in &parts {
            if !n.semaphores.contains_key(&p.sem) {
                return Err(sem_missing(&ns, &p.sem));
            }
        }
        let r = lease_ref(&n.leases, &ns, lease)?;
        let mut grantable = true;
        for p in &parts {
            let s = &n.semaphores[&p.sem];
            if p.weight > s.permits {
                return Err(weight_exceeds_on(&p.sem));
            }
            let held = s.held_by(&n.leases[r]);
            holder_room(s, held, max_holders)?;
            grantable &= grantable_now(s, held, p.weight);
        }
        let sems: Vec<Name> = parts.iter().map(|p| p.sem.detached()).collect();
        if grantable {
            let mut tokens = Vec::with_capacity(parts.len());
            let mut shrunk = Vec::new();
            for p in parts {
                let s = n.semaphores.get_mut(&p.sem).expect("checked above");
                let l = &mut n.leases[r];
                if s.held_by(l).is_some_and(|h| h > p.weight) {
                    shrunk.push(p.sem.clone());
                }
                let want = Want {
                    lease: r,
                    weight: p.weight,
                    meta: meta.clone(),
                };
                tokens.push(Some(grant(&n.name, s, l, want, now, &mut self.cx)));
            }
            self.cx.stats.acquire_acquired += 1;
            serve_many(n, shrunk, now, &mut self.cx);
            let holds = sems.iter().map(|s| &n.semaphores[s]).zip(tokens);
            return Ok(Exec::Reply(view::acquire_all(Outcome::Acquired, holds)));
        }
        let Some(client) = client.filter(|_| timeout > 0) else {
            for sem in &sems {
                let s = n.semaphores.get_mut(sem).expect("checked above");
                touch(&n.name, s, now, &mut self.cx.journal);
            }
            self.cx.stats.acquire_unavailable += 1;
            let holds = sems.iter().map(|s| (&n.semaphores[s], None));
            return Ok(Exec::Reply(view::acquire_all(Outcome::Unavailable, holds)));
        };
        for sem in &sems {
            waiter_room(&n.semaphores[sem], max_sem_waiters)?;
        }
        server_waiter_room(&self.cx)?;
        let weights: Vec<(Name, Weight)> = sems
            .iter()
            .cloned()
            .zip(parts.iter().map(|p| p.weight))
            .collect();
        let p = Parking {
            lease: r,
            meta,
            deadline: now.saturating_add(timeout),
            all: Some(sems.into()),
            client,
        };
        let id = park(n, p, &weights, now, &mut self.cx);
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
            ns: n.name.clone(),
            sem: s.name.clone(),
            lease: l.id,
            at: now,
        });
        serve(n, &sem, now, &mut self.cx);
        Ok(view::semaphore(&n.semaphores[&sem]))
    }
}
