//! The shard's data and the bookkeeping every command shares: construction and restore, the
//! lease expiry timers, the cross-index check, room given back, what the caller drains (journal,
//! outbox, deadlines), and the look-ups every command starts with.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::Error;
use crate::journal::Record;
use crate::leases::{LeaseRef, Leases};
use crate::page::{Dir, Page};
use crate::protocol::Reply;
use crate::room::{free_if_empty, shrink_map, FastMap};
use crate::state::{Keys, Namespace, Semaphore, WaiterId};
use crate::timers::{LeaseDeadline, Timers};
use crate::types::{FencingToken, LeaseId, Limits, Name, Nanos};

/// What a request did: answered now, or parked until its outbox reply.
#[derive(Debug, PartialEq)]
pub enum Exec {
    /// Answered at once: the reply to send (a grant, UNAVAILABLE, an error, any other
    /// command's reply).
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
#[allow(missing_docs)]
pub struct Counts {
    pub namespaces: u64,
    pub semaphores: u64,
    pub leases: u64,
    pub holders: u64,
    pub waiters: u64,
}

/// Everything of a shard but its namespaces, so that both can be borrowed at once.
#[derive(Debug)]
pub(super) struct Cx {
    pub(super) timers: Timers,
    pub(super) waiter_at: FastMap<WaiterId, (Name, Name)>,
    /// Parked acquires by lease (namespace key, handle), for the leases that have some: kept
    /// here rather than in every lease, since few leases wait at a time.
    pub(super) lease_waits: FastMap<(u32, LeaseRef), Vec<WaiterId>>,
    pub(super) outbox: Vec<(WaiterId, Reply)>,
    pub(super) journal: Vec<Record>,
    pub(super) next_waiter: WaiterId,
    pub(super) token_hwm: FencingToken,
    pub(super) stats: Stats,
    pub(super) limits: Arc<Limits>,
    pub(super) namespace_count: Arc<AtomicUsize>,
    /// Parked acquires on all shards sharing this counter (the server-wide quota).
    pub(super) waiter_count: Arc<AtomicUsize>,
    /// Freed permits wait in their semaphore instead of going to its queue (see
    /// [`Shard::hold_grants`]).
    pub(super) grants_held: bool,
}

/// One shard: the namespaces that hash to it, with all their state.
#[derive(Debug)]
pub struct Shard {
    pub(super) namespaces: BTreeMap<Name, Namespace>,
    /// Namespace names by their timer key.
    pub(super) keys: Keys,
    pub(super) cx: Cx,
}

pub(super) fn ns_missing(ns: &Name) -> Error {
    Error::NotFound(format!("namespace '{ns}' not found"))
}

pub(super) fn sem_missing(ns: &Name, sem: &Name) -> Error {
    Error::NotFound(format!("semaphore '{sem}' not found in namespace '{ns}'"))
}

pub(super) fn lease_missing(ns: &Name) -> Error {
    // The id itself is a capability: it is never echoed back.
    Error::NotFound(format!("lease not found or expired in namespace '{ns}'"))
}

pub(super) fn weight_exceeds() -> Error {
    Error::InvalidArg("weight exceeds semaphore permits".into())
}

/// [`weight_exceeds`] for one semaphore of a SEM.ACQUIREALL, which names it (SPEC §12).
pub(super) fn weight_exceeds_on(sem: &Name) -> Error {
    Error::InvalidArg(format!("weight exceeds semaphore permits of '{sem}'"))
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
                grants_held: false,
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
    pub(super) fn add_lease_timer(&mut self, at: Nanos, ns_key: u32, r: LeaseRef) {
        if self.cx.timers.add_lease(at, ns_key, r) {
            self.rebuild_lease_timers();
        }
    }

    /// Rebuilds the lease expiry heap from the live leases.
    pub(super) fn rebuild_lease_timers(&mut self) {
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
                    let queues = q.queues(sname);
                    assert!(
                        queues.contains(sname),
                        "a waiter in a queue it does not list"
                    );
                    for other in queues {
                        let e = &n.semaphores[other].queue[w];
                        assert_eq!(
                            (e.lease, e.deadline),
                            (q.lease, q.deadline),
                            "entries agree"
                        );
                    }
                    if queues[0] != *sname {
                        continue; // a SEM.ACQUIREALL counts once, at its first queue
                    }
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
    pub(super) fn expiring(&self, (t, key, r): LeaseDeadline) -> Option<&Name> {
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

    /// The namespace and semaphore a parked acquire waits on, read by the server's
    /// per-semaphore figures (`/metrics`).
    pub fn waiter_semaphore(&self, id: WaiterId) -> Option<&(Name, Name)> {
        self.cx.waiter_at.get(&id)
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

    pub(super) fn ns(&self, ns: &Name) -> Result<&Namespace, Error> {
        self.namespaces.get(ns).ok_or_else(|| ns_missing(ns))
    }

    pub(super) fn sem(&self, ns: &Name, sem: &Name) -> Result<&Semaphore, Error> {
        Ok(self.ns_sem(ns, sem)?.1)
    }

    /// Semaphore `sem` with its namespace `ns`, whose leases a listing of holders or waiters
    /// reads.
    pub(super) fn ns_sem(&self, ns: &Name, sem: &Name) -> Result<(&Namespace, &Semaphore), Error> {
        let n = self.ns(ns)?;
        let s = n.semaphores.get(sem).ok_or_else(|| sem_missing(ns, sem))?;
        Ok((n, s))
    }
}

/// Namespace `ns`, to change. The look-ups are free functions over one field, so that a caller
/// holding the namespace can still use the shard's other fields (`cx`) and the namespace's.
pub(super) fn ns_mut<'a>(
    all: &'a mut BTreeMap<Name, Namespace>,
    ns: &Name,
) -> Result<&'a mut Namespace, Error> {
    all.get_mut(ns).ok_or_else(|| ns_missing(ns))
}

/// Semaphore `sem` of namespace `ns`, to change.
pub(super) fn sem_mut<'a>(
    sems: &'a mut BTreeMap<Name, Semaphore>,
    ns: &Name,
    sem: &Name,
) -> Result<&'a mut Semaphore, Error> {
    sems.get_mut(sem).ok_or_else(|| sem_missing(ns, sem))
}

/// The handle of live lease `lease` of namespace `ns`.
pub(super) fn lease_ref(
    leases: &Leases,
    ns: &Name,
    lease: Option<LeaseId>,
) -> Result<LeaseRef, Error> {
    lease
        .and_then(|id| leases.find(&id))
        .ok_or_else(|| lease_missing(ns))
}

/// Where a page of names (namespaces, semaphores) starts.
pub(super) fn name_cursor(page: &Page) -> Option<(Dir, Name)> {
    page.cursor
        .as_ref()
        .map(|c| (c.dir, Name::new_unchecked(c.key.clone())))
}

/// Where a page keyed by a number (holders by fencing token, leases by serial) starts.
pub(super) fn number_cursor(page: &Page) -> Result<Option<(Dir, i64)>, Error> {
    let Some(c) = &page.cursor else {
        return Ok(None);
    };
    let key: [u8; 8] = c.key[..]
        .try_into()
        .map_err(|_| Error::InvalidArg("invalid cursor".into()))?;
    Ok(Some((c.dir, i64::from_be_bytes(key))))
}
