//! The entities a shard owns (SPEC §1), with the invariants of one semaphore kept here.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

use super::types::{FencingToken, LeaseId, Metadata, Name, Nanos, Weight};

/// Parked-acquire identity, unique per shard and rising in arrival order.
pub type WaiterId = u64;

/// A hash map with the fast, DoS-resistant ahash hasher.
pub type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// A namespace and everything inside it.
#[derive(Debug)]
pub struct Namespace {
    /// Name.
    pub name: Name,
    /// Description (may be empty).
    pub description: Bytes,
    /// Metadata.
    pub metadata: Metadata,
    /// Bumped by NS.UPDATE.
    pub version: i64,
    /// Creation time.
    pub created_at: Nanos,
    /// Last NS.UPDATE time.
    pub updated_at: Nanos,
    /// Semaphores by name.
    pub semaphores: BTreeMap<Name, Semaphore>,
    /// Live leases by id. Boxed: the map's buckets stay small (the table runs half empty, and
    /// a lease is far larger than its key).
    pub leases: FastMap<LeaseId, Box<Lease>>,
    /// Lease ids in creation order (the LEASE.LIST order; cursors carry serials, not ids).
    pub lease_order: BTreeMap<u64, LeaseId>,
    /// Next lease serial.
    pub next_lease_serial: u64,
}

impl Namespace {
    /// A new, empty namespace.
    pub fn new(name: Name, description: Bytes, metadata: Metadata, now: Nanos) -> Namespace {
        Namespace {
            name,
            description,
            metadata,
            version: 1,
            created_at: now,
            updated_at: now,
            semaphores: BTreeMap::new(),
            leases: FastMap::default(),
            lease_order: BTreeMap::new(),
            next_lease_serial: 0,
        }
    }
}

/// A pool of permits with its holders and its FIFO queue of parked acquires.
#[derive(Debug)]
pub struct Semaphore {
    /// Name.
    pub name: Name,
    /// Description.
    pub description: Bytes,
    /// Metadata.
    pub metadata: Metadata,
    /// Total permits (> 0).
    pub permits: Weight,
    /// Sum of holder weights; never above `permits`.
    pub active_holds: Weight,
    /// Bumped by SEM.UPDATE.
    pub version: i64,
    /// Creation time.
    pub created_at: Nanos,
    /// Last SEM.UPDATE time.
    pub updated_at: Nanos,
    /// Last SEM.ACQUIRE or SEM.RELEASE.
    pub last_activity_at: Nanos,
    /// Holders by fencing token: oldest first.
    pub holders: BTreeMap<FencingToken, Holder>,
    /// Each holding lease's fencing token.
    pub by_lease: FastMap<LeaseId, FencingToken>,
    /// Parked acquires, first come first served.
    pub queue: BTreeMap<WaiterId, Waiter>,
}

impl Semaphore {
    /// A new semaphore with no holders.
    pub fn new(
        name: Name,
        permits: Weight,
        description: Bytes,
        metadata: Metadata,
        now: Nanos,
    ) -> Semaphore {
        Semaphore {
            name,
            description,
            metadata,
            permits,
            active_holds: 0,
            version: 1,
            created_at: now,
            updated_at: now,
            last_activity_at: now,
            holders: BTreeMap::new(),
            by_lease: FastMap::default(),
            queue: BTreeMap::new(),
        }
    }

    /// Permits free now.
    pub fn available(&self) -> Weight {
        self.permits - self.active_holds
    }

    /// The weight `lease` holds here, if any.
    pub fn held_by(&self, lease: &LeaseId) -> Option<Weight> {
        self.by_lease.get(lease).map(|t| self.holders[t].weight)
    }

    /// Adds a holder or changes an existing one; returns its fencing token.
    ///
    /// `new_token` is called only when a new holder is created.
    pub fn set_hold(
        &mut self,
        lease: &Lease,
        weight: Weight,
        metadata: Metadata,
        now: Nanos,
        new_token: impl FnOnce() -> FencingToken,
    ) -> FencingToken {
        let token = match self.by_lease.get(&lease.id) {
            Some(&token) => {
                let h = self
                    .holders
                    .get_mut(&token)
                    .expect("by_lease mirrors holders");
                self.active_holds += weight - h.weight;
                h.weight = weight;
                h.metadata = metadata;
                token
            }
            None => {
                let token = new_token();
                self.holders.insert(
                    token,
                    Holder {
                        lease: lease.id,
                        process_id: lease.process_id.clone(),
                        weight,
                        locked_at: now,
                        metadata,
                    },
                );
                self.by_lease.insert(lease.id, token);
                self.active_holds += weight;
                token
            }
        };
        self.last_activity_at = now;
        self.check();
        token
    }

    /// Removes `lease`'s hold; returns the weight it had.
    pub fn remove_hold(&mut self, lease: &LeaseId) -> Option<Weight> {
        let token = self.by_lease.remove(lease)?;
        let h = self
            .holders
            .remove(&token)
            .expect("by_lease mirrors holders");
        self.active_holds -= h.weight;
        self.check();
        Some(h.weight)
    }

    /// The semaphore's invariants, checked in debug builds after every change.
    pub fn check(&self) {
        debug_assert!(self.permits > 0);
        debug_assert!(self.active_holds >= 0 && self.active_holds <= self.permits);
        debug_assert_eq!(
            self.active_holds,
            self.holders.values().map(|h| h.weight).sum::<Weight>()
        );
        debug_assert_eq!(self.holders.len(), self.by_lease.len());
    }
}

/// One lease's hold on one semaphore. Its `expires_at` is always its lease's.
#[derive(Debug)]
pub struct Holder {
    /// The holding lease.
    pub lease: LeaseId,
    /// The lease's process.
    pub process_id: Bytes,
    /// Permits held.
    pub weight: Weight,
    /// When the hold was first taken.
    pub locked_at: Nanos,
    /// Holder metadata (replaced by each re-acquire).
    pub metadata: Metadata,
}

/// A server-side TTL token.
#[derive(Debug)]
pub struct Lease {
    /// Id (a capability).
    pub id: LeaseId,
    /// Creation order within the namespace.
    pub serial: u64,
    /// Owner process, free-form.
    pub process_id: Bytes,
    /// Creation time.
    pub created_at: Nanos,
    /// Death time: the lease is dead from this instant on.
    pub expires_at: Nanos,
    /// Metadata.
    pub metadata: Metadata,
    /// Semaphores this lease holds.
    pub holds: Vec<Name>,
    /// Parked acquires under this lease.
    pub waits: Vec<WaiterId>,
}

impl Lease {
    /// Records a new hold. Leases usually hold one or two semaphores, so the list grows one
    /// slot at a time instead of by doubling from four.
    pub fn add_hold(&mut self, sem: Name) {
        self.holds.reserve_exact(1);
        self.holds.push(sem);
    }
}

/// A parked acquire.
#[derive(Debug)]
pub struct Waiter {
    /// Lease it acquires for.
    pub lease: LeaseId,
    /// Total weight wanted.
    pub weight: Weight,
    /// Holder metadata to set when granted.
    pub metadata: Metadata,
    /// When it times out.
    pub deadline: Nanos,
}
