//! Holds given and queues served: what every change that frees permits runs, whichever command
//! or deadline made it (SEM.RELEASE, LEASE.REVOKE, an expiry, a smaller re-acquire, SEM.UPDATE).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use super::base::{lease_missing, weight_exceeds, weight_exceeds_on, Cx};
use crate::error::Error;
use crate::journal::Record;
use crate::leases::{Lease, LeaseRef};
use crate::protocol::Reply;
use crate::state::{Namespace, Semaphore, Waiter, WaiterId};
use crate::types::{FencingToken, Metadata, Name, Nanos, Weight};
use crate::view::{self, Outcome};

/// A hold to give: `weight` permits in all for the lease behind `lease`, with `meta` as the
/// holder's metadata (a grantable SEM.ACQUIRE, or the head of a queue).
pub(super) struct Want {
    pub lease: LeaseRef,
    pub weight: Weight,
    pub meta: Metadata,
}

/// Gives `lease` (the one `want` names) its hold on `s` of namespace `ns`; new holders get the
/// next fencing token.
pub(super) fn grant(
    ns: &Name,
    s: &mut Semaphore,
    lease: &mut Lease,
    want: Want,
    now: Nanos,
    cx: &mut Cx,
) -> FencingToken {
    let hwm = &mut cx.token_hwm;
    let Want {
        lease: r,
        weight,
        meta,
    } = want;
    let token = s.set_hold(r, lease, weight, meta, now, || {
        // One above every token this shard has issued: tokens keep rising across delete +
        // re-create, restarts and re-sharding (the high-water mark is journaled and carried). A
        // counter, not the clock: the tokens stay far below 2^53, where JavaScript and Lua 5.1
        // clients, which read integers as doubles, would see two tokens as one (SPEC §3).
        *hwm += 1;
        *hwm
    });
    let h = s.holders.get(token).expect("just set");
    cx.journal.push(Record::HoldSet {
        ns: ns.clone(),
        sem: s.name.clone(),
        lease: lease.id,
        weight,
        token,
        locked_at: h.locked_at,
        metadata: h.metadata.clone(),
        at: now,
    });
    token
}

/// Moves `s`'s last_activity_at without a hold changing.
pub(super) fn touch(ns: &Name, s: &mut Semaphore, now: Nanos, journal: &mut Vec<Record>) {
    s.last_activity_at = now;
    journal.push(Record::Touch {
        ns: ns.clone(),
        sem: s.name.clone(),
        at: now,
    });
}

/// Drops a parked acquire's bookkeeping outside its semaphore's queue.
pub(super) fn forget_waiter(cx: &mut Cx, lease: (u32, LeaseRef), w: WaiterId, deadline: Nanos) {
    cx.timers.remove_waiter(deadline, w);
    if cx.waiter_at.remove(&w).is_some() {
        cx.waiter_count.fetch_sub(1, Ordering::AcqRel);
    }
    if let Some(waits) = cx.lease_waits.get_mut(&lease) {
        waits.retain(|x| *x != w);
        if waits.is_empty() {
            cx.lease_waits.remove(&lease);
        }
    }
}

/// Serves `sem`'s queue from its head while the head fits: strict FIFO, so a head that does not
/// fit blocks those behind it. A SEM.ACQUIREALL at the head is served only once it is also the
/// head of each of its other queues and all of them can grant it; when it
/// leaves, each queue it left is served in turn. Nothing is served while grants are held.
pub(super) fn serve(n: &mut Namespace, sem: &Name, now: Nanos, cx: &mut Cx) {
    if cx.grants_held {
        return;
    }
    // Queues to serve again, filled only when a SEM.ACQUIREALL leaves its queues (an empty
    // set allocates nothing, so a plain queue pays nothing for it).
    let mut more = BTreeSet::new();
    serve_queue(n, sem, now, cx, &mut more);
    drain(n, more, now, cx);
}

/// Serves the queues of `sems` as [`serve`] does, all in one worklist.
pub(super) fn serve_many(
    n: &mut Namespace,
    sems: impl IntoIterator<Item = Name>,
    now: Nanos,
    cx: &mut Cx,
) {
    if !cx.grants_held {
        drain(n, sems.into_iter().collect(), now, cx);
    }
}

/// Serves the queues of `todo` and those that SEM.ACQUIREALLs leaving them add, the first name
/// first: one order whatever the way in, so that a reference model can follow the fencing
/// tokens exactly.
fn drain(n: &mut Namespace, mut todo: BTreeSet<Name>, now: Nanos, cx: &mut Cx) {
    while let Some(sem) = todo.pop_first() {
        serve_queue(n, &sem, now, cx, &mut todo);
    }
}

fn serve_queue(n: &mut Namespace, sem: &Name, now: Nanos, cx: &mut Cx, more: &mut BTreeSet<Name>) {
    let Some(s) = n.semaphores.get_mut(sem) else {
        return;
    };
    while let Some((&id, w)) = s.queue.first_key_value() {
        if let Some(all) = w.all.clone() {
            serve_all_head(n, id, &all, now, cx, more);
            return;
        }
        let r = w.lease;
        let l = &mut n.leases[r];
        let held = s.held_by(l);
        let reply = if w.weight > s.permits {
            Reply::Error(weight_exceeds())
        } else if held.is_none() && s.holders.len() >= cx.limits.max_holders_per_semaphore {
            Reply::Error(Error::ResourceExhausted(format!(
                "holder quota reached on semaphore '{sem}'"
            )))
        } else if s.available() >= w.weight - held.unwrap_or(0) {
            let w = s.queue.remove(&id).expect("head exists");
            forget_waiter(cx, (n.key, r), id, w.deadline);
            let want = Want {
                lease: r,
                weight: w.weight,
                meta: w.metadata,
            };
            let token = grant(&n.name, s, l, want, now, cx);
            cx.stats.acquire_acquired += 1;
            cx.outbox
                .push((id, view::acquire(Outcome::Acquired, s, Some(token))));
            continue;
        } else {
            break;
        };
        let w = s.queue.remove(&id).expect("head exists");
        forget_waiter(cx, (n.key, r), id, w.deadline);
        cx.outbox.push((id, reply));
    }
}

/// What a parked SEM.ACQUIREALL at the head of one of its queues is to do now.
enum Verdict {
    Grant,
    Wait,
    Fail(Error),
}

/// Judges SEM.ACQUIREALL `id` over its semaphores `all`: it fails if one of them can never
/// grant it (weight above permits, holder quota reached), waits while it is not the head of
/// each of its queues (SPEC §12: no earlier waiter in any of them still waits) or one where its
/// hold grows has too few free permits, and is granted otherwise. Being the head everywhere,
/// nothing can change its lot but a change to one of its queues, which serves that queue.
fn verdict(n: &Namespace, id: WaiterId, all: &[Name], max_holders: usize) -> Verdict {
    let mut wait = false;
    for sem in all {
        let s = &n.semaphores[sem];
        let w = &s.queue[&id];
        let held = s.held_by(&n.leases[w.lease]);
        if w.weight > s.permits {
            return Verdict::Fail(weight_exceeds_on(sem));
        }
        if held.is_none() && s.holders.len() >= max_holders {
            return Verdict::Fail(Error::ResourceExhausted(format!(
                "holder quota reached on semaphore '{sem}'"
            )));
        }
        let needed = w.weight - held.unwrap_or(0);
        let first = s.queue.first_key_value().map(|(k, _)| *k);
        wait |= first != Some(id) || s.available() < needed;
    }
    if wait {
        Verdict::Wait
    } else {
        Verdict::Grant
    }
}

/// Serves SEM.ACQUIREALL `id`, the head of one of its queues, if [`verdict`] lets it: granted
/// on every semaphore at once, or ended with the error. Either way it leaves all its queues,
/// which go onto `more` to be served.
fn serve_all_head(
    n: &mut Namespace,
    id: WaiterId,
    all: &[Name],
    now: Nanos,
    cx: &mut Cx,
    more: &mut BTreeSet<Name>,
) {
    let verdict = verdict(n, id, all, cx.limits.max_holders_per_semaphore);
    if let Verdict::Wait = verdict {
        return;
    }
    let u = unpark(n, id, cx).expect("a queue's head is parked");
    let reply = match verdict {
        Verdict::Wait => unreachable!("returned above"),
        Verdict::Fail(e) => Reply::Error(e),
        Verdict::Grant => {
            let mut tokens = Vec::with_capacity(u.queues.len());
            for (sem, w) in u.queues.iter().zip(u.entries) {
                let s = n.semaphores.get_mut(sem).expect("checked by verdict");
                let want = Want {
                    lease: w.lease,
                    weight: w.weight,
                    meta: w.metadata,
                };
                tokens.push(grant(&n.name, s, &mut n.leases[w.lease], want, now, cx));
            }
            cx.stats.acquire_acquired += 1;
            let holds = u.queues.iter().map(|s| &n.semaphores[s]);
            view::acquire_all(Outcome::Acquired, holds.zip(tokens.into_iter().map(Some)))
        }
    };
    cx.outbox.push((id, reply));
    more.extend(u.queues);
}

/// A parked acquire taken out of its queues.
pub(super) struct Unparked {
    /// Whether it is a SEM.ACQUIREALL (answered with `holds`).
    pub all: bool,
    /// The semaphores whose queues it left, in the order asked; the caller must serve them.
    pub queues: Vec<Name>,
    /// Its entries, one per queue, in the same order.
    pub entries: Vec<Waiter>,
}

impl Unparked {
    /// Its reply when it ends with `outcome`, not acquired: the state of what it asked for.
    pub fn reply(&self, n: &Namespace, outcome: Outcome) -> Reply {
        let sems = self.queues.iter().map(|s| &n.semaphores[s]);
        if self.all {
            view::acquire_all(outcome, sems.map(|s| (s, None)))
        } else {
            view::acquire(outcome, sems.last().expect("one queue"), None)
        }
    }
}

/// Takes parked acquire `id` out of every queue it waits in (one, or each of a SEM.ACQUIREALL's)
/// and drops its bookkeeping; `None` when it is not parked.
pub(super) fn unpark(n: &mut Namespace, id: WaiterId, cx: &mut Cx) -> Option<Unparked> {
    let (_, sem) = cx.waiter_at.get(&id)?;
    let sem = sem.clone();
    let first = &n.semaphores[&sem].queue[&id];
    let all = first.all.is_some();
    let queues = first.queues(&sem).to_vec();
    let entries: Vec<Waiter> = queues
        .iter()
        .map(|q| {
            let s = n.semaphores.get_mut(q).expect("waiter index is exact");
            s.queue.remove(&id).expect("waiter index is exact")
        })
        .collect();
    forget_waiter(cx, (n.key, entries[0].lease), id, entries[0].deadline);
    Some(Unparked {
        all,
        queues,
        entries,
    })
}

/// Removes a lease (expired or revoked): its holds are released and its parked acquires end
/// with NOTFOUND. Returns the semaphores it touched, whose queues the caller must serve.
pub(super) fn drop_lease(n: &mut Namespace, r: LeaseRef, cx: &mut Cx) -> Vec<Name> {
    let Some(lease) = n.leases.remove(r) else {
        return Vec::new();
    };
    cx.journal.push(Record::LeaseDel {
        ns: n.name.clone(),
        id: lease.id,
    });
    let mut touched: Vec<Name> = Vec::new();
    for w in cx.lease_waits.get(&(n.key, r)).cloned().unwrap_or_default() {
        let u = unpark(n, w, cx).expect("waiter index is exact");
        cx.outbox.push((w, Reply::Error(lease_missing(&n.name))));
        touched.extend(u.queues);
    }
    for (key, token) in lease.holds.iter() {
        let sem = n
            .sem_keys
            .get(key)
            .expect("holds name live semaphores")
            .clone();
        n.semaphores
            .get_mut(&sem)
            .expect("keys name live semaphores")
            .remove_holder(token);
        touched.push(sem);
    }
    touched.sort();
    touched.dedup();
    touched
}
