//! SEM.CREATE, SEM.GET's look-up aside, SEM.LIST, SEM.UPDATE, SEM.DELETE, SEM.HOLDERS and
//! SEM.WAITERS.

use bytes::Bytes;

use super::base::{
    name_cursor, ns_mut, number_cursor, sem_missing, sem_mut, weight_exceeds, weight_exceeds_on,
    Shard,
};
use super::namespaces::check_version;
use super::queue::{serve_many, unpark};
use super::time::Ending;
use crate::error::Error;
use crate::journal::{self, Record};
use crate::page::{take_page, CursorKind, Page};
use crate::protocol::Reply;
use crate::request::{SemCreate, SemUpdate};
use crate::state::{Semaphore, WaiterId};
use crate::types::{Name, Nanos};
use crate::view;

impl Shard {
    pub(super) fn sem_create(&mut self, now: Nanos, req: SemCreate) -> Result<Reply, Error> {
        let SemCreate {
            ns,
            sem,
            permits,
            desc,
            meta,
        } = req;
        let max = self.cx.limits.max_semaphores_per_namespace;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        if n.semaphores.contains_key(&sem) {
            return Err(Error::AlreadyExists(format!(
                "semaphore '{sem}' already exists in namespace '{ns}'"
            )));
        }
        if n.semaphores.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "semaphore quota reached in namespace '{ns}' ({max} semaphores)"
            )));
        }
        let sem = sem.detached();
        let s = Semaphore::new(sem.clone(), permits, desc, meta, now);
        let reply = view::semaphore(&s);
        self.cx.journal.push(journal::sem_put(&n.name, &s));
        n.add_semaphore(s);
        Ok(reply)
    }

    pub(super) fn sem_list(&self, ns: &Name, page: &Page) -> Result<Reply, Error> {
        let n = self.ns(ns)?;
        let p = take_page(
            &n.semaphores,
            name_cursor(page),
            page.limit,
            |_| true,
            |_, s| view::semaphore(s),
        );
        Ok(view::page("semaphores", CursorKind::Semaphores, p, |k| {
            k.bytes().clone()
        }))
    }

    /// SEM.UPDATE: waiters that can no longer fit end INVALIDARG, and raised permits serve the
    /// queue.
    pub(super) fn sem_update(&mut self, now: Nanos, req: SemUpdate) -> Result<Reply, Error> {
        let SemUpdate {
            ns,
            sem,
            permits,
            version,
            desc,
            meta,
        } = req;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        let s = sem_mut(&mut n.semaphores, &ns, &sem)?;
        check_version(version, s.version)?;
        if permits < s.active_holds {
            return Err(Error::InvalidArg(format!(
                "permits {permits} below active holds {}",
                s.active_holds
            )));
        }
        s.permits = permits;
        s.description = desc;
        s.metadata = meta;
        s.version += 1;
        s.updated_at = now;
        s.check();
        self.cx.journal.push(journal::sem_put(&n.name, s));
        // Waiters that can never fit any more end now; the rest may fit now.
        let too_heavy: Vec<(WaiterId, Error)> = s
            .queue
            .iter()
            .filter(|(_, w)| w.weight > permits)
            .map(|(id, w)| match w.all {
                Some(_) => (*id, weight_exceeds_on(&sem)),
                None => (*id, weight_exceeds()),
            })
            .collect();
        let mut touched = vec![(ns.clone(), sem.clone())];
        for (w, e) in too_heavy {
            touched.extend(self.end_waiter(w, Ending::Error(e)));
        }
        self.serve_all(touched, now);
        let n = self.namespaces.get_mut(&ns).expect("checked above");
        // The reply is the state after the command, woken waiters included (as SEM.RELEASE).
        Ok(view::semaphore(&n.semaphores[&sem]))
    }

    /// SEM.DELETE: its holds go, and its parked acquires end NOTFOUND.
    /// A SEM.ACQUIREALL parked on it leaves its other queues too, which move on.
    pub(super) fn sem_delete(&mut self, now: Nanos, ns: &Name, sem: &Name) -> Result<Reply, Error> {
        let n = ns_mut(&mut self.namespaces, ns)?;
        let Some(s) = n.semaphores.get(sem) else {
            return Ok(Reply::OK);
        };
        let parked: Vec<WaiterId> = s.queue.keys().copied().collect();
        let mut touched = Vec::new();
        for w in parked {
            let u = unpark(n, w, &mut self.cx).expect("a queued waiter is parked");
            self.cx.outbox.push((w, Reply::Error(sem_missing(ns, sem))));
            touched.extend(u.queues.into_iter().filter(|q| q != sem));
        }
        let s = n.remove_semaphore(sem).expect("found above");
        self.cx.journal.push(Record::SemDel {
            ns: n.name.clone(),
            name: s.name.clone(),
        });
        for h in s.holders.iter() {
            n.leases[h.lease].holds.remove(s.key);
        }
        serve_many(n, touched, now, &mut self.cx);
        Ok(Reply::OK)
    }

    pub(super) fn holders(&self, ns: &Name, sem: &Name, page: &Page) -> Result<Reply, Error> {
        let (n, s) = self.ns_sem(ns, sem)?;
        let p = take_page(
            &s.holders,
            number_cursor(page)?,
            page.limit,
            |_| true,
            |t, h| view::holder(*t, h, &n.leases[h.lease]),
        );
        Ok(view::page("holders", CursorKind::Holders, p, |t| {
            Bytes::copy_from_slice(&t.to_be_bytes())
        }))
    }

    /// SEM.WAITERS: the parked acquires in the order they are served.
    pub(super) fn waiters(&self, ns: &Name, sem: &Name, page: &Page) -> Result<Reply, Error> {
        let (n, s) = self.ns_sem(ns, sem)?;
        // Waiter ids are below 2^63 (one a request), so the cursor's number is one.
        let from = number_cursor(page)?.map(|(dir, id)| (dir, id as WaiterId));
        let p = take_page(
            &s.queue,
            from,
            page.limit,
            |_| true,
            |_, w| view::waiter(w, &n.leases[w.lease]),
        );
        Ok(view::page("waiters", CursorKind::Waiters, p, |id| {
            Bytes::copy_from_slice(&id.to_be_bytes())
        }))
    }
}
