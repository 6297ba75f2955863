//! One shard's deterministic state machine: requests and `now` in, replies out.
//!
//! The shard never reads a clock or a socket. Its caller passes `now` to every call, calls
//! [`Shard::advance`] when [`Shard::next_deadline`] comes, and delivers the replies of parked
//! acquires that [`Shard::take_outbox`] hands back (grants, time-outs, errors).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;

use super::journal::{self, Record};
use super::leases::LeaseRef;
use super::page::{take_page, CursorKind, Dir, Page, PageOf};
use super::process_id::ProcessId;
use super::state::{
    free_if_empty, shrink_map, FastMap, Holds, Keys, Lease, Namespace, Semaphore, Waiter, WaiterId,
};
use super::timers::{LeaseDeadline, Timers};
use super::types::{FencingToken, LeaseId, Limits, Metadata, Name, Nanos, Weight};
use super::view::{self, Outcome};
use crate::command::EngineRequest;
use crate::error::Error;
use crate::protocol::Reply;

/// What a request did: answered now, or parked until its outbox reply.
#[derive(Debug, PartialEq)]
pub enum Exec {
    /// The reply.
    Reply(Reply),
    /// The acquire waits; its reply will come through the outbox under this id.
    Parked(WaiterId),
}

/// Why a parked acquire is being taken out of its queue from outside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cancel {
    /// Its client went away: no reply.
    Disconnected,
    /// `CLIENT UNBLOCK id TIMEOUT`: answered as a time-out.
    UnblockTimeout,
    /// `CLIENT UNBLOCK id ERROR`: answered `-UNBLOCKED`.
    UnblockError,
}

/// Counters reported by INFO's `# Stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Acquires answered ACQUIRED.
    pub acquire_acquired: u64,
    /// Acquires answered UNAVAILABLE.
    pub acquire_unavailable: u64,
    /// Acquires answered TIMED_OUT.
    pub acquire_timed_out: u64,
    /// Leases that died of old age.
    pub leases_expired: u64,
    /// Parked acquires ended by CLIENT UNBLOCK.
    pub clients_unblocked: u64,
}

/// Sizes reported by INFO's `# Semaphores`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Namespaces.
    pub namespaces: u64,
    /// Semaphores.
    pub semaphores: u64,
    /// Live leases.
    pub leases: u64,
    /// Holders.
    pub holders: u64,
    /// Parked acquires.
    pub waiters: u64,
}

/// How a parked acquire taken out of its queue is answered.
enum Ending {
    /// Not at all (its client is gone).
    Silent,
    /// With an outcome and the semaphore's state.
    Outcome(Outcome),
    /// With an error.
    Error(Error),
}

/// Everything of a shard but its namespaces, so that both can be borrowed at once.
#[derive(Debug)]
struct Cx {
    timers: Timers,
    waiter_at: FastMap<WaiterId, (Name, Name)>,
    /// Parked acquires by lease (namespace key, handle), for the leases that have some: kept
    /// here rather than in every lease, since few leases wait at a time.
    lease_waits: FastMap<(u32, LeaseRef), Vec<WaiterId>>,
    outbox: Vec<(WaiterId, Reply)>,
    journal: Vec<Record>,
    next_waiter: WaiterId,
    token_hwm: FencingToken,
    stats: Stats,
    limits: Arc<Limits>,
    namespace_count: Arc<AtomicUsize>,
    /// Parked acquires on all shards sharing this counter (the server-wide quota).
    waiter_count: Arc<AtomicUsize>,
}

/// One shard: the namespaces that hash to it, with all their state.
#[derive(Debug)]
pub struct Shard {
    namespaces: BTreeMap<Name, Namespace>,
    /// Namespace names by their timer key.
    keys: Keys,
    cx: Cx,
}

fn ns_missing(ns: &Name) -> Error {
    Error::NotFound(format!("namespace '{ns}' not found"))
}

fn sem_missing(ns: &Name, sem: &Name) -> Error {
    Error::NotFound(format!("semaphore '{sem}' not found in namespace '{ns}'"))
}

fn lease_missing(ns: &Name) -> Error {
    // The id itself is a capability: it is never echoed back.
    Error::NotFound(format!("lease not found or expired in namespace '{ns}'"))
}

fn weight_exceeds() -> Error {
    Error::InvalidArg("weight exceeds semaphore permits".into())
}

impl Shard {
    /// An empty shard. `namespace_count` is shared by all shards to enforce the server-wide
    /// namespace quota.
    pub fn new(limits: Arc<Limits>, namespace_count: Arc<AtomicUsize>) -> Shard {
        Shard {
            namespaces: BTreeMap::new(),
            keys: Keys::default(),
            cx: Cx {
                timers: Timers::default(),
                waiter_at: FastMap::default(),
                lease_waits: FastMap::default(),
                outbox: Vec::new(),
                journal: Vec::new(),
                next_waiter: 1,
                token_hwm: 0,
                stats: Stats::default(),
                limits,
                namespace_count,
                waiter_count: Arc::new(AtomicUsize::new(0)),
            },
        }
    }

    /// A shard holding restored state (from a snapshot and log). Leases that died while the
    /// server was down die at the first [`Shard::advance`], freeing their permits.
    pub fn restore(
        limits: Arc<Limits>,
        namespace_count: Arc<AtomicUsize>,
        namespaces: BTreeMap<Name, Namespace>,
        token_hwm: FencingToken,
    ) -> Shard {
        namespace_count.fetch_add(namespaces.len(), Ordering::AcqRel);
        let mut shard = Shard::new(limits, namespace_count);
        for (name, mut n) in namespaces {
            n.key = shard.keys.add(&name);
            shard.namespaces.insert(name, n);
        }
        shard.rebuild_lease_timers();
        shard.cx.token_hwm = token_hwm;
        shard
    }

    /// Schedules lease `r`'s expiry at `at`, rebuilding the expiry heap when stale entries may
    /// be piling up (refreshes leave one each).
    fn add_lease_timer(&mut self, at: Nanos, ns_key: u32, r: LeaseRef) {
        if self.cx.timers.add_lease(at, ns_key, r) {
            self.rebuild_lease_timers();
        }
    }

    /// Rebuilds the lease expiry heap from the live leases.
    fn rebuild_lease_timers(&mut self) {
        let live = self
            .namespaces
            .values()
            .flat_map(|n| n.leases.iter().map(move |(r, l)| (l.expires_at, n.key, r)));
        self.cx.timers.rebuild_leases(live);
    }

    /// Checks that the shard's indexes agree with each other (handles, keys, holds, waiter
    /// lists, expiry timers); panics on the first disagreement. The fuzzer and the property
    /// tests call it after every step; it walks the whole state, so the server does not.
    pub fn check(&self) {
        let mut queued = 0;
        for (name, n) in &self.namespaces {
            assert_eq!(self.keys.get(n.key), Some(name), "namespace key");
            for (r, l) in n.leases.iter() {
                assert_eq!(n.leases.find(&l.id), Some(r), "lease index");
                assert!(
                    self.cx.timers.has_lease((l.expires_at, n.key, r)),
                    "a live lease without its expiry timer"
                );
                let mut keys: Vec<u32> = l.holds.iter().map(|(k, _)| k).collect();
                keys.sort();
                keys.dedup();
                assert_eq!(keys.len(), l.holds.len(), "a lease lists a hold twice");
                for (key, token) in l.holds.iter() {
                    let sem = n.sem_keys.get(key).expect("a hold on a missing semaphore");
                    let h = n.semaphores[sem].holders.get(token);
                    assert_eq!(h.map(|h| h.lease), Some(r), "a hold without its holder");
                }
            }
            for (sname, s) in &n.semaphores {
                s.check();
                assert_eq!(n.sem_keys.get(s.key), Some(sname), "semaphore key");
                let tokens: Vec<FencingToken> = s.holders.iter().map(|h| h.token).collect();
                assert!(
                    tokens.windows(2).all(|w| w[0] < w[1]),
                    "holders out of order"
                );
                for h in s.holders.iter() {
                    let l = n
                        .leases
                        .get(h.lease)
                        .expect("a holder of a lease that is gone");
                    assert_eq!(l.hold_on(s.key), Some(h.token), "a holder its lease misses");
                }
                for (w, q) in &s.queue {
                    queued += 1;
                    assert!(n.leases.get(q.lease).is_some(), "a waiter of a gone lease");
                    assert_eq!(
                        self.cx.waiter_at.get(w),
                        Some(&(name.clone(), sname.clone())),
                        "waiter index"
                    );
                    assert!(
                        self.cx.lease_waits[&(n.key, q.lease)].contains(w),
                        "a waiter its lease misses"
                    );
                    assert!(self.cx.timers.has_waiter(q.deadline, *w), "waiter timer");
                }
            }
        }
        assert_eq!(self.cx.waiter_at.len(), queued, "waiter index size");
        let listed: usize = self.cx.lease_waits.values().map(Vec::len).sum();
        assert_eq!(listed, queued, "lease waiter lists");
    }

    /// Gives back the room of indexes that grew in a load peak and are mostly empty now
    /// (parked acquires, lease tables, expiry timers, emptied wait queues). It walks every
    /// namespace and semaphore, so the server calls it only after many of its connections
    /// closed, at most once a second.
    pub fn shrink_sparse(&mut self) {
        shrink_map(&mut self.cx.waiter_at);
        shrink_map(&mut self.cx.lease_waits);
        self.cx.timers.shrink();
        for n in self.namespaces.values_mut() {
            n.leases.shrink();
            for sem in n.semaphores.values_mut() {
                free_if_empty(&mut sem.queue);
            }
        }
    }

    /// Shares the count of parked acquires with other shards, so that `max_waiters` holds for
    /// the whole server (by default a shard counts only its own).
    pub fn share_waiter_count(&mut self, count: Arc<AtomicUsize>) {
        count.fetch_add(self.cx.waiter_at.len(), Ordering::AcqRel);
        self.cx.waiter_count = count;
    }

    /// The namespaces and the fencing-token high-water mark (what a snapshot saves).
    pub fn state(&self) -> (&BTreeMap<Name, Namespace>, FencingToken) {
        (&self.namespaces, self.cx.token_hwm)
    }

    /// State changes made since the last call, in order.
    pub fn take_journal(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.cx.journal)
    }

    /// The earliest instant at which [`Shard::advance`] has work (a lease expiry or a time-out).
    ///
    /// Stale expiry entries at the head (refreshed or gone leases) are dropped first, so the
    /// answer is exact and the caller never wakes for nothing.
    pub fn next_deadline(&mut self) -> Option<Nanos> {
        while let Some(entry) = self.cx.timers.peek_lease() {
            if self.expiring(entry).is_some() {
                break;
            }
            self.cx.timers.pop_lease(entry.0);
        }
        self.cx.timers.next()
    }

    /// The namespace of the lease an expiry entry names, if that lease is live and dies at the
    /// entry's instant; `None` for a stale entry (the lease was refreshed or revoked, or its
    /// namespace deleted).
    fn expiring(&self, (t, key, r): LeaseDeadline) -> Option<&Name> {
        let ns = self.keys.get(key)?;
        let lease = self.namespaces.get(ns)?.leases.get(r)?;
        (lease.expires_at == t).then_some(ns)
    }

    /// Replies for parked acquires produced since the last call.
    pub fn take_outbox(&mut self) -> Vec<(WaiterId, Reply)> {
        std::mem::take(&mut self.cx.outbox)
    }

    /// INFO counters.
    pub fn stats(&self) -> Stats {
        self.cx.stats
    }

    /// INFO sizes.
    pub fn counts(&self) -> Counts {
        let mut c = Counts {
            namespaces: self.namespaces.len() as u64,
            waiters: self.cx.waiter_at.len() as u64,
            ..Counts::default()
        };
        for ns in self.namespaces.values() {
            c.semaphores += ns.semaphores.len() as u64;
            c.leases += ns.leases.len() as u64;
            c.holders += ns
                .semaphores
                .values()
                .map(|s| s.holders.len() as u64)
                .sum::<u64>();
        }
        c
    }

    /// Fires every deadline up to and including `now`: leases die at their `expires_at`,
    /// parked acquires time out at their deadline.
    ///
    /// Everything due at one instant `t` happens at `t`, together: first every lease whose
    /// `expires_at` is `t` dies (holds released, its parked acquires end NOTFOUND), then every
    /// parked acquire whose deadline is `t` times out, and only then are the queues served. So
    /// no permit is ever granted at `t` to a lease that is dead at `t` or to an acquire whose
    /// time is up at `t`, whatever the order of the timers. Grants made then carry `t` as
    /// their time (`locked_at`, `last_activity_at`, fencing token floor), also when `now` is
    /// later (the caller ran late).
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
    fn serve_all(&mut self, mut touched: Vec<(Name, Name)>, now: Nanos) {
        touched.sort();
        touched.dedup();
        for (ns, sem) in touched {
            if let Some(n) = self.namespaces.get_mut(&ns) {
                serve(n, &sem, now, &mut self.cx);
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
        self.serve_all(touched.into_iter().collect(), now);
        true
    }

    /// Removes a parked acquire and answers it as `ending` says. Returns the queue it left,
    /// which the caller must serve.
    fn end_waiter(&mut self, waiter: WaiterId, ending: Ending) -> Option<(Name, Name)> {
        let (ns, sem) = self.cx.waiter_at.get(&waiter).cloned()?;
        let n = self.namespaces.get_mut(&ns).expect("waiter index is exact");
        let s = n.semaphores.get_mut(&sem).expect("waiter index is exact");
        let w = s.queue.remove(&waiter).expect("waiter index is exact");
        forget_waiter(&mut self.cx, (n.key, w.lease), waiter, w.deadline);
        let reply = match ending {
            Ending::Silent => None,
            Ending::Outcome(o) => {
                if o == Outcome::TimedOut {
                    self.cx.stats.acquire_timed_out += 1;
                }
                Some(view::acquire(o, s, None))
            }
            Ending::Error(e) => Some(Reply::Error(e)),
        };
        if let Some(r) = reply {
            self.cx.outbox.push((waiter, r));
        }
        Some((ns, sem))
    }

    /// Runs one request at `now`. `may_wait` is false inside MULTI: acquires never park there.
    pub fn execute(&mut self, now: Nanos, req: EngineRequest, may_wait: bool) -> Exec {
        self.advance(now);
        use EngineRequest as R;
        let result = match req {
            R::NsCreate { ns, desc, meta } => self.ns_create(now, ns, desc, meta),
            R::NsGet { ns } => self.ns(&ns).map(view::namespace),
            R::NsList { page } => {
                let part = self.ns_list_part(&page);
                Ok(ns_page_reply(merge_ns_pages(vec![part], &page)))
            }
            R::NsUpdate {
                ns,
                version,
                desc,
                meta,
            } => self.ns_update(now, ns, version, desc, meta),
            R::NsDelete { ns } => Ok(self.ns_delete(now, &ns)),
            R::SemCreate {
                ns,
                sem,
                permits,
                desc,
                meta,
            } => self.sem_create(now, ns, sem, permits, desc, meta),
            R::SemGet { ns, sem } => self.sem(&ns, &sem).map(view::semaphore),
            R::SemList { ns, page } => self.sem_list(&ns, &page),
            R::SemUpdate {
                ns,
                sem,
                permits,
                version,
                desc,
                meta,
            } => self.sem_update(now, ns, sem, permits, version, desc, meta),
            R::SemDelete { ns, sem } => self.sem_delete(&ns, &sem),
            R::SemAcquire {
                ns,
                sem,
                lease,
                weight,
                timeout,
                meta,
            } => {
                let timeout = if may_wait { timeout } else { 0 };
                return match self.acquire(now, &ns, &sem, lease, weight, timeout, meta) {
                    Ok(exec) => exec,
                    Err(e) => Exec::Reply(Reply::Error(e)),
                };
            }
            R::SemRelease { ns, sem, lease } => self.release(now, &ns, &sem, lease),
            R::SemHolders { ns, sem, page } => self.holders(&ns, &sem, &page),
            R::LeaseCreate {
                ns,
                id,
                process_id,
                ttl,
                meta,
            } => self.lease_create(now, &ns, id, process_id, ttl, meta),
            R::LeaseGet { ns, lease } => self
                .ns(&ns)
                .and_then(|n| find_lease(n, lease))
                .map(view::lease),
            R::LeaseList { ns, process, page } => self.lease_list(&ns, process, &page),
            R::LeaseRefresh { ns, lease, ttl } => self.lease_refresh(now, &ns, lease, ttl),
            R::LeaseRevoke { ns, lease } => self.lease_revoke(now, &ns, lease),
        };
        Exec::Reply(result.into())
    }

    fn ns(&self, ns: &Name) -> Result<&Namespace, Error> {
        self.namespaces.get(ns).ok_or_else(|| ns_missing(ns))
    }

    fn sem(&self, ns: &Name, sem: &Name) -> Result<&Semaphore, Error> {
        self.ns(ns)?
            .semaphores
            .get(sem)
            .ok_or_else(|| sem_missing(ns, sem))
    }

    fn ns_create(
        &mut self,
        now: Nanos,
        ns: Name,
        desc: Bytes,
        meta: Metadata,
    ) -> Result<Reply, Error> {
        if self.namespaces.contains_key(&ns) {
            return Err(Error::AlreadyExists(format!(
                "namespace '{ns}' already exists"
            )));
        }
        let max = self.cx.limits.max_namespaces;
        let count = &self.cx.namespace_count;
        if count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < max).then_some(c + 1)
            })
            .is_err()
        {
            return Err(Error::ResourceExhausted(format!(
                "namespace quota reached ({max} namespaces)"
            )));
        }
        let ns = ns.detached();
        let mut n = Namespace::new(ns.clone(), desc, meta, now);
        n.key = self.keys.add(&ns);
        let reply = view::namespace(&n);
        self.cx.journal.push(journal::ns_put(&n));
        self.namespaces.insert(ns, n);
        Ok(reply)
    }

    fn ns_update(
        &mut self,
        now: Nanos,
        ns: Name,
        version: i64,
        desc: Bytes,
        meta: Metadata,
    ) -> Result<Reply, Error> {
        let n = self
            .namespaces
            .get_mut(&ns)
            .ok_or_else(|| ns_missing(&ns))?;
        check_version(version, n.version)?;
        n.description = desc;
        n.metadata = meta;
        n.version += 1;
        n.updated_at = now;
        self.cx.journal.push(journal::ns_put(n));
        Ok(view::namespace(n))
    }

    fn ns_delete(&mut self, _now: Nanos, ns: &Name) -> Reply {
        if let Some(n) = self.namespaces.remove(ns) {
            self.cx.journal.push(Record::NsDel { name: ns.clone() });
            self.cx.namespace_count.fetch_sub(1, Ordering::AcqRel);
            // Its leases' expiry entries stay behind, stale (their key names no namespace).
            self.keys.remove(n.key);
            for s in n.semaphores.values() {
                for (&w, waiter) in &s.queue {
                    forget_waiter(&mut self.cx, (n.key, waiter.lease), w, waiter.deadline);
                    self.cx.outbox.push((w, Reply::Error(ns_missing(ns))));
                }
            }
        }
        Reply::OK
    }

    /// This shard's share of an NS.LIST page (merged with the other shards' by the caller).
    pub fn ns_list_part(&self, page: &Page) -> PageOf<Name, (Name, Reply)> {
        self.ns_list_part_where(page, |_| true)
    }

    /// [`Shard::ns_list_part`] over the namespaces `visible` lets through.
    pub fn ns_list_part_where(
        &self,
        page: &Page,
        visible: impl Fn(&Name) -> bool,
    ) -> PageOf<Name, (Name, Reply)> {
        let from = page
            .cursor
            .as_ref()
            .map(|c| (c.dir, Name::new_unchecked(c.key.clone())));
        take_page(
            &self.namespaces,
            from,
            page.limit,
            |n| visible(&n.name),
            |k, n| (k.clone(), view::namespace(n)),
        )
    }

    fn sem_create(
        &mut self,
        now: Nanos,
        ns: Name,
        sem: Name,
        permits: Weight,
        desc: Bytes,
        meta: Metadata,
    ) -> Result<Reply, Error> {
        let max = self.cx.limits.max_semaphores_per_namespace;
        let n = self
            .namespaces
            .get_mut(&ns)
            .ok_or_else(|| ns_missing(&ns))?;
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
        self.cx.journal.push(journal::sem_put(&ns, &s));
        n.add_semaphore(s);
        Ok(reply)
    }

    fn sem_list(&self, ns: &Name, page: &Page) -> Result<Reply, Error> {
        let n = self.ns(ns)?;
        let from = page
            .cursor
            .as_ref()
            .map(|c| (c.dir, Name::new_unchecked(c.key.clone())));
        let p = take_page(
            &n.semaphores,
            from,
            page.limit,
            |_| true,
            |_, s| view::semaphore(s),
        );
        Ok(view::page("semaphores", CursorKind::Semaphores, p, |k| {
            k.bytes().clone()
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn sem_update(
        &mut self,
        now: Nanos,
        ns: Name,
        sem: Name,
        permits: Weight,
        version: i64,
        desc: Bytes,
        meta: Metadata,
    ) -> Result<Reply, Error> {
        let n = self
            .namespaces
            .get_mut(&ns)
            .ok_or_else(|| ns_missing(&ns))?;
        let s = n
            .semaphores
            .get_mut(&sem)
            .ok_or_else(|| sem_missing(&ns, &sem))?;
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
        self.cx.journal.push(journal::sem_put(&ns, s));
        // Waiters that can never fit any more end now; the rest may fit now.
        let too_heavy: Vec<WaiterId> = s
            .queue
            .iter()
            .filter(|(_, w)| w.weight > permits)
            .map(|(id, _)| *id)
            .collect();
        for w in too_heavy {
            self.end_waiter(w, Ending::Error(weight_exceeds()));
        }
        let n = self.namespaces.get_mut(&ns).expect("checked above");
        serve(n, &sem, now, &mut self.cx);
        // The reply is the state after the command, woken waiters included (as SEM.RELEASE).
        Ok(view::semaphore(&n.semaphores[&sem]))
    }

    fn sem_delete(&mut self, ns: &Name, sem: &Name) -> Result<Reply, Error> {
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        if let Some(s) = n.remove_semaphore(sem) {
            self.cx.journal.push(Record::SemDel {
                ns: ns.clone(),
                name: sem.clone(),
            });
            for h in s.holders.iter() {
                n.leases[h.lease].holds.remove(s.key);
            }
            for (&w, waiter) in &s.queue {
                forget_waiter(&mut self.cx, (n.key, waiter.lease), w, waiter.deadline);
                self.cx.outbox.push((w, Reply::Error(sem_missing(ns, sem))));
            }
        }
        Ok(Reply::OK)
    }

    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &mut self,
        now: Nanos,
        ns: &Name,
        sem: &Name,
        lease: Option<LeaseId>,
        weight: Weight,
        timeout: Nanos,
        meta: Metadata,
    ) -> Result<Exec, Error> {
        // Copied out: the limits are shared by every shard, so no per-acquire refcount traffic.
        let (max_holders, max_sem_waiters, max_waiters) = (
            self.cx.limits.max_holders_per_semaphore,
            self.cx.limits.max_waiters_per_semaphore,
            self.cx.limits.max_waiters,
        );
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        let s = n
            .semaphores
            .get_mut(sem)
            .ok_or_else(|| sem_missing(ns, sem))?;
        let r = lease
            .and_then(|id| n.leases.find(&id))
            .ok_or_else(|| lease_missing(ns))?;
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
            let token = grant(ns, s, r, l, weight, meta, now, &mut self.cx);
            self.cx.stats.acquire_acquired += 1;
            if needed < 0 {
                serve(n, sem, now, &mut self.cx);
            }
            // The state after the command: permits a smaller hold freed are handed on already.
            let s = &n.semaphores[sem];
            return Ok(Exec::Reply(view::acquire(
                Outcome::Acquired,
                s,
                Some(token),
            )));
        }
        if timeout == 0 {
            touch(ns, s, now, &mut self.cx.journal);
            self.cx.stats.acquire_unavailable += 1;
            return Ok(Exec::Reply(view::acquire(Outcome::Unavailable, s, None)));
        }
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
        touch(ns, s, now, &mut self.cx.journal);
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

    fn release(
        &mut self,
        now: Nanos,
        ns: &Name,
        sem: &Name,
        lease: Option<LeaseId>,
    ) -> Result<Reply, Error> {
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        let s = n
            .semaphores
            .get_mut(sem)
            .ok_or_else(|| sem_missing(ns, sem))?;
        let l = lease
            .and_then(|id| n.leases.find(&id))
            .map(|r| &mut n.leases[r])
            .ok_or_else(|| lease_missing(ns))?;
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
        serve(n, sem, now, &mut self.cx);
        Ok(view::semaphore(&n.semaphores[sem]))
    }

    fn holders(&self, ns: &Name, sem: &Name, page: &Page) -> Result<Reply, Error> {
        let n = self.ns(ns)?;
        let s = n.semaphores.get(sem).ok_or_else(|| sem_missing(ns, sem))?;
        let from = match &page.cursor {
            None => None,
            Some(c) => Some((c.dir, token_key(&c.key)?)),
        };
        let p = take_page(
            &s.holders,
            from,
            page.limit,
            |_| true,
            |t, h| view::holder(*t, h, &n.leases[h.lease]),
        );
        Ok(view::page("holders", CursorKind::Holders, p, |t| {
            Bytes::copy_from_slice(&t.to_be_bytes())
        }))
    }

    fn lease_create(
        &mut self,
        now: Nanos,
        ns: &Name,
        id: LeaseId,
        process_id: Bytes,
        ttl: Nanos,
        meta: Metadata,
    ) -> Result<Reply, Error> {
        let max = self.cx.limits.max_leases_per_namespace;
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        if n.leases.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "lease quota reached in namespace '{ns}' ({max} leases)"
            )));
        }
        if n.leases.find(&id).is_some() {
            // 166 random bits: only a broken random source gets here.
            return Err(Error::AlreadyExists("lease id collision, retry".into()));
        }
        let serial = n.leases.take_serial();
        let expires_at = now.saturating_add(ttl);
        let lease = Lease {
            id,
            serial,
            process_id: ProcessId::new(&process_id),
            created_at: now,
            expires_at,
            metadata: meta,
            holds: Holds::None,
        };
        let reply = view::lease(&lease);
        self.cx.journal.push(journal::lease_put(ns, &lease));
        let (key, r) = (n.key, n.leases.insert(lease));
        self.add_lease_timer(expires_at, key, r);
        Ok(reply)
    }

    fn lease_list(&self, ns: &Name, process: Option<Bytes>, page: &Page) -> Result<Reply, Error> {
        let n = self.ns(ns)?;
        let from = match &page.cursor {
            None => None,
            Some(c) => Some((c.dir, token_key(&c.key)? as u64)),
        };
        let keep = |r: &LeaseRef| match &process {
            Some(p) => n.leases[*r].process_id[..] == p[..],
            None => true,
        };
        let p = take_page(n.leases.order(), from, page.limit, keep, |_, r| {
            view::lease(&n.leases[*r])
        });
        Ok(view::page("leases", CursorKind::Leases, p, |s| {
            Bytes::copy_from_slice(&s.to_be_bytes())
        }))
    }

    fn lease_refresh(
        &mut self,
        now: Nanos,
        ns: &Name,
        lease: Option<LeaseId>,
        ttl: Nanos,
    ) -> Result<Reply, Error> {
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        let r = lease
            .and_then(|id| n.leases.find(&id))
            .ok_or_else(|| lease_missing(ns))?;
        let l = &mut n.leases[r];
        let before = l.expires_at;
        l.expires_at = now.saturating_add(ttl);
        self.cx.journal.push(journal::lease_put(ns, l));
        let (reply, at, key) = (view::lease(l), l.expires_at, n.key);
        // The old expiry entry stays behind, stale.
        if at != before {
            self.add_lease_timer(at, key, r);
        }
        Ok(reply)
    }

    fn lease_revoke(
        &mut self,
        now: Nanos,
        ns: &Name,
        lease: Option<LeaseId>,
    ) -> Result<Reply, Error> {
        let n = self.namespaces.get_mut(ns).ok_or_else(|| ns_missing(ns))?;
        let r = lease
            .and_then(|id| n.leases.find(&id))
            .ok_or_else(|| lease_missing(ns))?;
        for sem in drop_lease(n, r, &mut self.cx) {
            serve(n, &sem, now, &mut self.cx);
        }
        Ok(Reply::OK)
    }
}

fn check_version(expected: i64, current: i64) -> Result<(), Error> {
    if expected != current {
        return Err(Error::InvalidArg(format!(
            "version mismatch: expected {expected}, current {current}"
        )));
    }
    Ok(())
}

/// A numeric cursor key (fencing token or lease serial).
fn token_key(key: &[u8]) -> Result<i64, Error> {
    let arr: [u8; 8] = key
        .try_into()
        .map_err(|_| Error::InvalidArg("invalid cursor".into()))?;
    Ok(i64::from_be_bytes(arr))
}

fn find_lease(n: &Namespace, lease: Option<LeaseId>) -> Result<&Lease, Error> {
    lease
        .and_then(|id| n.leases.by_id(&id))
        .ok_or_else(|| lease_missing(&n.name))
}

/// Gives `lease` (behind `r`) a hold of `weight` on `s`; new holders get the next fencing
/// token.
#[allow(clippy::too_many_arguments)]
fn grant(
    ns: &Name,
    s: &mut Semaphore,
    r: LeaseRef,
    lease: &mut Lease,
    weight: Weight,
    meta: Metadata,
    now: Nanos,
    cx: &mut Cx,
) -> FencingToken {
    let hwm = &mut cx.token_hwm;
    let token = s.set_hold(r, lease, weight, meta, now, || {
        // Above every token this shard has issued, and at least the clock: tokens keep rising
        // across delete + re-create, restarts and re-sharding (the high-water mark is carried).
        let t = (*hwm + 1).max(now);
        *hwm = t;
        t
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
fn touch(ns: &Name, s: &mut Semaphore, now: Nanos, journal: &mut Vec<Record>) {
    s.last_activity_at = now;
    journal.push(Record::Touch {
        ns: ns.clone(),
        sem: s.name.clone(),
        at: now,
    });
}

/// Drops a parked acquire's bookkeeping outside its semaphore's queue.
fn forget_waiter(cx: &mut Cx, lease: (u32, LeaseRef), w: WaiterId, deadline: Nanos) {
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
/// fit blocks those behind it.
fn serve(n: &mut Namespace, sem: &Name, now: Nanos, cx: &mut Cx) {
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
            let token = grant(&n.name, s, r, l, w.weight, w.metadata, now, cx);
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
fn drop_lease(n: &mut Namespace, r: LeaseRef, cx: &mut Cx) -> Vec<Name> {
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

/// Merges shards' NS.LIST parts into one page in name order.
pub fn merge_ns_pages(
    parts: Vec<PageOf<Name, (Name, Reply)>>,
    page: &Page,
) -> PageOf<Name, (Name, Reply)> {
    let dir = page.cursor.as_ref().map_or(Dir::Next, |c| c.dir);
    let mut beyond = false;
    let mut behind = false;
    let mut items: Vec<(Name, Reply)> = Vec::new();
    for p in parts {
        match dir {
            Dir::Next => {
                beyond |= p.next.is_some();
                behind |= p.prev.is_some();
            }
            Dir::Prev => {
                beyond |= p.prev.is_some();
                behind |= p.next.is_some();
            }
        }
        items.extend(p.items);
    }
    items.sort_by(|a, b| a.0.cmp(&b.0));
    if items.len() > page.limit {
        beyond = true;
        match dir {
            Dir::Next => items.truncate(page.limit),
            Dir::Prev => {
                items.drain(..items.len() - page.limit);
            }
        }
    }
    let cursor_key = page
        .cursor
        .as_ref()
        .map(|c| Name::new_unchecked(c.key.clone()));
    let first = items.first().map(|i| i.0.clone());
    let last = items.last().map(|i| i.0.clone());
    let (next, prev) = match dir {
        Dir::Next => (
            if beyond { last } else { None },
            if behind { first.or(cursor_key) } else { None },
        ),
        Dir::Prev => (
            if behind { last.or(cursor_key) } else { None },
            if beyond { first } else { None },
        ),
    };
    PageOf { items, next, prev }
}

/// The NS.LIST reply of a merged page.
pub fn ns_page_reply(p: PageOf<Name, (Name, Reply)>) -> Reply {
    let p = PageOf {
        items: p.items.into_iter().map(|(_, r)| r).collect(),
        next: p.next,
        prev: p.prev,
    };
    view::page("namespaces", CursorKind::Namespaces, p, |k| {
        k.bytes().clone()
    })
}
