//! Holds given and queues served: what every change that frees permits runs, whichever command
//! or deadline made it (SEM.RELEASE, LEASE.REVOKE, an expiry, a smaller re-acquire, SEM.UPDATE).

use std::sync::atomic::Ordering;

use super::base::{lease_missing, weight_exceeds, Cx};
use crate::error::Error;
use crate::journal::Record;
use crate::leases::{Lease, LeaseRef};
use crate::protocol::Reply;
use crate::state::{Namespace, Semaphore, WaiterId};
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
/// fit blocks those behind it. Nothing is served while grants are held.
pub(super) fn serve(n: &mut Namespace, sem: &Name, now: Nanos, cx: &mut Cx) {
    if cx.grants_held {
        return;
    }
    let Some(s) = n.semaphores.get_mut(sem) else {
        return;
    };
    while let Some((&id, w)) = s.queue.first_key_value() {
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
    for w in &cx.lease_waits.remove(&(n.key, r)).unwrap_or_default() {
        let (_, sem) = cx.waiter_at.get(w).cloned().expect("waiter index is exact");
        let s = n.semaphores.get_mut(&sem).expect("waiter index is exact");
        let waiter = s.queue.remove(w).expect("waiter index is exact");
        forget_waiter(cx, (n.key, r), *w, waiter.deadline);
        cx.outbox.push((*w, Reply::Error(lease_missing(&n.name))));
        touched.push(sem);
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
