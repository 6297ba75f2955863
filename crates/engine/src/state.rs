//! The entities a shard owns (SPEC §1), with the invariants of one semaphore kept here.

use std::collections::{BTreeMap, VecDeque};
use std::ops::Bound;
use std::sync::Arc;

use bytes::Bytes;

use super::leases::{Lease, LeaseRef, Leases};
use super::page::{index_range, Ordered};
use super::room::{free_if_empty, FastMap};
use super::types::{FencingToken, Metadata, Name, Nanos, Weight};

/// Parked-acquire identity, unique per shard and rising in arrival order.
pub type WaiterId = u64;

/// The client a parked acquire waits for (its `CLIENT ID`), shown by SEM.WAITERS.
pub type ClientId = u64;

/// Names by small integer keys, handed out so that no two live names share one. Keys stand in
/// for names where one is stored per lease (its holds, its expiry timer).
#[derive(Debug, Default)]
pub struct Keys {
    names: FastMap<u32, Name>,
    next: u32,
}

impl Keys {
    /// A key for `name`, not used by any live name.
    pub fn add(&mut self, name: &Name) -> u32 {
        while self.names.contains_key(&self.next) {
            self.next = self.next.wrapping_add(1);
        }
        let key = self.next;
        self.next = self.next.wrapping_add(1);
        self.names.insert(key, name.clone());
        key
    }

    /// Frees `key`.
    pub fn remove(&mut self, key: u32) {
        self.names.remove(&key);
    }

    /// The name behind `key`.
    pub fn get(&self, key: u32) -> Option<&Name> {
        self.names.get(&key)
    }
}

/// A namespace and everything inside it.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Namespace {
    pub name: Name,
    pub description: Bytes,
    pub metadata: Metadata,
    /// Bumped by NS.UPDATE.
    pub version: i64,
    pub created_at: Nanos,
    /// Last NS.UPDATE time.
    pub updated_at: Nanos,
    /// Semaphores by name (add and remove them with the methods, which keep their keys).
    pub semaphores: BTreeMap<Name, Semaphore>,
    /// Semaphore names by key.
    pub sem_keys: Keys,
    pub leases: Leases,
    /// The shard's short handle for this namespace in its timers (set by the shard).
    pub key: u32,
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
            sem_keys: Keys::default(),
            leases: Leases::default(),
            key: 0,
        }
    }

    /// Adds semaphore `s` under a fresh key; returns it in place.
    pub fn add_semaphore(&mut self, mut s: Semaphore) -> &mut Semaphore {
        s.key = self.sem_keys.add(&s.name);
        self.semaphores.entry(s.name.clone()).or_insert(s)
    }

    /// Removes semaphore `name` (its holders' leases still list it: the caller's to clean).
    pub fn remove_semaphore(&mut self, name: &Name) -> Option<Semaphore> {
        let s = self.semaphores.remove(name)?;
        self.sem_keys.remove(s.key);
        Some(s)
    }
}

/// A pool of permits with its holders and its FIFO queue of parked acquires.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Semaphore {
    pub name: Name,
    /// Its key in the namespace's `sem_keys` (how leases' holds name it).
    pub key: u32,
    pub description: Bytes,
    pub metadata: Metadata,
    /// Total permits (> 0).
    pub permits: Weight,
    /// Sum of holder weights; never above `permits`.
    pub active_holds: Weight,
    /// Bumped by SEM.UPDATE.
    pub version: i64,
    pub created_at: Nanos,
    /// Last SEM.UPDATE time.
    pub updated_at: Nanos,
    /// Last SEM.ACQUIRE or SEM.RELEASE.
    pub last_activity_at: Nanos,
    /// Holders by fencing token: oldest first. A lease finds its own holder through the token
    /// in its `holds`.
    pub holders: Holders,
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
            key: 0,
            description,
            metadata,
            permits,
            active_holds: 0,
            version: 1,
            created_at: now,
            updated_at: now,
            last_activity_at: now,
            holders: Holders::default(),
            queue: BTreeMap::new(),
        }
    }

    /// Permits free now.
    pub fn available(&self) -> Weight {
        self.permits - self.active_holds
    }

    /// The weight `lease` holds here, if any.
    pub fn held_by(&self, lease: &Lease) -> Option<Weight> {
        lease
            .hold_on(self.key)
            .and_then(|t| self.holders.get(t))
            .map(|h| h.weight)
    }

    /// Gives `lease` (behind handle `r`) a hold of `weight`, or changes the one it has; returns
    /// its fencing token. `new_token` is called only when a new holder is created.
    pub fn set_hold(
        &mut self,
        r: LeaseRef,
        lease: &mut Lease,
        weight: Weight,
        metadata: Metadata,
        now: Nanos,
        new_token: impl FnOnce() -> FencingToken,
    ) -> FencingToken {
        let token = match lease.hold_on(self.key) {
            Some(token) => {
                let h = self
                    .holders
                    .get_mut(token)
                    .expect("a lease's holds mirror the holders");
                self.active_holds += weight - h.weight;
                h.weight = weight;
                h.metadata = metadata;
                token
            }
            None => {
                let token = new_token();
                self.holders.insert(Holder {
                    token,
                    lease: r,
                    weight,
                    locked_at: now,
                    metadata,
                });
                lease.holds.add(self.key, token);
                self.active_holds += weight;
                token
            }
        };
        self.last_activity_at = now;
        self.check();
        token
    }

    /// Removes `lease`'s hold; returns the weight it had.
    pub fn remove_hold(&mut self, lease: &mut Lease) -> Option<Weight> {
        let token = lease.holds.remove(self.key)?;
        self.remove_holder(token)
    }

    /// Removes the holder with `token` (its lease's `holds` entry is the caller's to drop);
    /// returns the weight it had.
    pub fn remove_holder(&mut self, token: FencingToken) -> Option<Weight> {
        let h = self.holders.remove(token)?;
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
            self.holders.iter().map(|h| h.weight).sum::<Weight>()
        );
    }
}

/// A semaphore's holders in fencing-token order, oldest first.
///
/// A deque sorted by token rather than a B-tree map: new holders always get the highest token
/// (they go at the back) and the oldest tend to leave first (at the front), and a holder costs
/// its 40 bytes instead of the ~90 of a map whose nodes stay half full under rising keys. A
/// semaphore has at most `max_holders_per_semaphore` (1,000) of them, so the moves of an
/// insert or removal in the middle stay small.
#[derive(Debug, Default)]
pub struct Holders(VecDeque<Holder>);

impl Holders {
    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position(&self, token: FencingToken) -> Result<usize, usize> {
        self.0.binary_search_by_key(&token, |h| h.token)
    }

    /// The holder with `token`.
    pub fn get(&self, token: FencingToken) -> Option<&Holder> {
        self.position(token).ok().map(|i| &self.0[i])
    }

    /// The holder with `token`, to change.
    pub fn get_mut(&mut self, token: FencingToken) -> Option<&mut Holder> {
        self.position(token).ok().map(|i| &mut self.0[i])
    }

    /// Adds a holder whose token no holder has.
    pub fn insert(&mut self, h: Holder) {
        match self.position(h.token) {
            Ok(_) => debug_assert!(false, "fencing tokens are unique"),
            Err(i) => {
                if self.0.len() == self.0.capacity() {
                    // Grow by a quarter, not double: spare room averages about 12% of the
                    // length instead of about 39%, and copies stay amortised O(1) per insert.
                    self.0.reserve_exact((self.0.len() / 4).max(4));
                }
                self.0.insert(i, h)
            }
        }
    }

    /// Removes the holder with `token`.
    pub fn remove(&mut self, token: FencingToken) -> Option<Holder> {
        let i = self.position(token).ok()?;
        let h = self.0.remove(i);
        // The room of a semaphore that once had many holders goes back.
        free_if_empty(&mut self.0);
        h
    }

    /// Oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Holder> {
        self.0.iter()
    }
}

impl Ordered for Holders {
    type Key = FencingToken;
    type Item = Holder;
    fn within<'a>(
        &'a self,
        lower: Bound<&FencingToken>,
        upper: Bound<&FencingToken>,
    ) -> impl DoubleEndedIterator<Item = (&'a FencingToken, &'a Holder)> {
        let range = index_range(self.0.len(), lower, upper, |t, inclusive| {
            self.0
                .partition_point(|h| h.token < *t || (inclusive && h.token == *t))
        });
        self.0.range(range).map(|h| (&h.token, h))
    }
}

/// One lease's hold on one semaphore. Its `expires_at` is always its lease's.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Holder {
    pub token: FencingToken,
    /// The holding lease (its id and process are read from there).
    pub lease: LeaseRef,
    pub weight: Weight,
    /// When the hold was first taken.
    pub locked_at: Nanos,
    /// Holder metadata (replaced by each re-acquire).
    pub metadata: Metadata,
}

/// A parked acquire, in one semaphore's queue. A SEM.ACQUIREALL waits in the queue of each
/// semaphore it asks for, with one entry in each (the same id, lease and deadline).
#[derive(Debug)]
pub struct Waiter {
    /// Lease it acquires for.
    pub lease: LeaseRef,
    /// Total weight wanted on this semaphore.
    pub weight: Weight,
    /// Holder metadata to set when granted.
    pub metadata: Metadata,
    /// When it times out.
    pub deadline: Nanos,
    /// For a SEM.ACQUIREALL, every semaphore it asks for, in the order asked (shared by its
    /// entries); `None` for a SEM.ACQUIRE.
    pub all: Option<Arc<[Name]>>,
    /// When it parked.
    pub parked_at: Nanos,
    /// The client it waits for.
    pub client: ClientId,
}

impl Waiter {
    /// The semaphores whose queues hold this waiter, `sem` being the one it was found in.
    pub fn queues<'a>(&'a self, sem: &'a Name) -> &'a [Name] {
        match &self.all {
            Some(all) => all,
            None => std::slice::from_ref(sem),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_stays_small() {
        // A million holders: every byte here is a megabyte (docs/design.md, "State layout").
        assert_eq!(std::mem::size_of::<Holder>(), 40);
    }
}
