//! A namespace's live leases, addressed by small handles.
//!
//! Leases live in a slab; holders, parked acquires and expiry timers refer to a lease by its
//! 4-byte [`LeaseRef`] instead of its 28-byte id, and the id index stores only handles (the id
//! is read from the slab). With a million leases this is what keeps a lease's bookkeeping
//! around a hundred bytes instead of several hundred.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use hashbrown::HashTable;

use super::creation::{CreationOrder, Slot};
use super::process_id::ProcessId;
use super::room::sparse;
use super::types::{FencingToken, LeaseId, Metadata, Nanos};

/// A live lease's slot in its namespace's [`Leases`]. A slot is reused once its lease is gone,
/// so a handle is only meaningful while the lease it was taken from is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LeaseRef(u32);

impl LeaseRef {
    /// A handle no lease has: a slab never reaches 2^32 - 1 slots.
    pub const NONE: LeaseRef = LeaseRef(u32::MAX);
}

impl Slot for LeaseRef {
    const GONE: LeaseRef = LeaseRef::NONE;
}

/// The live leases of one namespace.
#[derive(Debug, Default)]
pub struct Leases {
    /// Leases by slot; `None` is a free slot.
    slots: Vec<Option<Lease>>,
    /// Free slots, reused lowest first: live leases gather at the start of the slab, so that
    /// after a peak [`Leases::shrink`] finds the free slots at its end and gives them back.
    free: BinaryHeap<Reverse<u32>>,
    /// Slot numbers, found by the id of the lease in the slot.
    index: HashTable<u32>,
    hasher: ahash::RandomState,
    /// Slots by serial: creation order, the LEASE.LIST order.
    order: CreationOrder<LeaseRef>,
    /// The next lease's serial.
    next_serial: u64,
}

impl Leases {
    /// Live leases.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The handle of the live lease `id`.
    pub fn find(&self, id: &LeaseId) -> Option<LeaseRef> {
        let slots = &self.slots;
        self.index
            .find(self.hasher.hash_one(id), |s| slot_has(slots, s, id))
            .map(|&s| LeaseRef(s))
    }

    /// The live lease `id`.
    pub fn by_id(&self, id: &LeaseId) -> Option<&Lease> {
        self.find(id).map(|r| &self[r])
    }

    /// The lease behind `r`, if its slot is in use.
    pub fn get(&self, r: LeaseRef) -> Option<&Lease> {
        self.slots.get(r.0 as usize)?.as_ref()
    }

    /// A serial for a new lease: creation order.
    pub fn take_serial(&mut self) -> u64 {
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    /// Adds a lease whose id is not live yet; returns its handle. Its serial must not be in use
    /// (replay passes the journaled one; later serials are allocated above it).
    pub fn insert(&mut self, lease: Lease) -> LeaseRef {
        debug_assert!(self.find(&lease.id).is_none(), "lease ids are unique");
        self.next_serial = self.next_serial.max(lease.serial + 1);
        let hash = self.hasher.hash_one(lease.id);
        let serial = lease.serial;
        let slot = match self.free.pop() {
            Some(Reverse(s)) => {
                self.slots[s as usize] = Some(lease);
                s
            }
            None => {
                self.slots.push(Some(lease));
                u32::try_from(self.slots.len() - 1)
                    .ok()
                    .filter(|&s| s != LeaseRef::NONE.0)
                    .expect("fewer than 2^32 - 1 leases")
            }
        };
        self.index
            .insert_unique(hash, slot, slot_hash(&self.slots, &self.hasher));
        self.order.insert(serial, LeaseRef(slot));
        LeaseRef(slot)
    }

    /// Takes the lease behind `r` out.
    pub fn remove(&mut self, r: LeaseRef) -> Option<Lease> {
        let lease = self.slots.get_mut(r.0 as usize)?.take()?;
        let hash = self.hasher.hash_one(lease.id);
        // The slot is empty now: its index entry is the one that names it.
        if let Ok(e) = self.index.find_entry(hash, |&s| s == r.0) {
            e.remove();
        }
        self.order.remove(lease.serial);
        if self.index.is_empty() {
            // A namespace that once had many leases gives their room back when it has none.
            *self = Leases {
                next_serial: self.next_serial,
                ..Leases::default()
            };
        } else {
            self.free.push(Reverse(r.0));
        }
        Some(lease)
    }

    /// Gives back room left by a peak: free slots at the end of the slab go (a slot in the
    /// middle stays, its neighbours' handles must not move), and the slab, the free list and
    /// the id index shrink when they hold a quarter of their capacity or less.
    pub fn shrink(&mut self) {
        while self.slots.last().is_some_and(Option::is_none) {
            self.slots.pop();
        }
        let len = self.slots.len();
        self.free.retain(|&Reverse(s)| (s as usize) < len);
        if sparse(self.slots.capacity(), len, 16) {
            self.slots.shrink_to_fit();
            self.free.shrink_to_fit();
        }
        self.order.shrink();
        if sparse(self.index.capacity(), self.index.len(), 16) {
            self.index
                .shrink_to_fit(slot_hash(&self.slots, &self.hasher));
        }
    }

    /// Handles in creation order (LEASE.LIST pages through this).
    pub fn order(&self) -> &CreationOrder<LeaseRef> {
        &self.order
    }

    /// Live leases in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (LeaseRef, &Lease)> {
        self.order.iter().map(|(_, &r)| (r, &self[r]))
    }

    /// Moves every lease's death time `by` later (a forward step of the wall clock; see
    /// [`crate::journal::Record::TimeShift`]).
    pub fn shift_expiries(&mut self, by: Nanos) {
        for lease in self.slots.iter_mut().flatten() {
            lease.expires_at = lease.expires_at.saturating_add(by);
        }
    }
}

/// How the id index hashes slot `s` when it grows or shrinks: by the id of the lease in it.
fn slot_hash<'a>(
    slots: &'a [Option<Lease>],
    hasher: &'a ahash::RandomState,
) -> impl Fn(&u32) -> u64 + 'a {
    move |&s| {
        let lease = slots[s as usize].as_ref().expect("indexed slots are used");
        hasher.hash_one(lease.id)
    }
}

fn slot_has(slots: &[Option<Lease>], s: &u32, id: &LeaseId) -> bool {
    slots[*s as usize].as_ref().is_some_and(|l| l.id == *id)
}

impl std::ops::Index<LeaseRef> for Leases {
    type Output = Lease;

    /// The live lease behind `r`; panics on a free slot (a handle outliving its lease).
    fn index(&self, r: LeaseRef) -> &Lease {
        self.slots[r.0 as usize]
            .as_ref()
            .expect("a handle names a live lease")
    }
}

impl std::ops::IndexMut<LeaseRef> for Leases {
    fn index_mut(&mut self, r: LeaseRef) -> &mut Lease {
        self.slots[r.0 as usize]
            .as_mut()
            .expect("a handle names a live lease")
    }
}

/// A server-side TTL token.
#[derive(Debug)]
#[allow(missing_docs)]
pub struct Lease {
    pub id: LeaseId,
    pub serial: u64,
    pub process_id: ProcessId,
    pub created_at: Nanos,
    /// Death time: the lease is dead from this instant on.
    pub expires_at: Nanos,
    pub metadata: Metadata,
    /// Semaphores this lease holds.
    pub holds: Holds,
}

impl Lease {
    /// The fencing token of this lease's holder on the semaphore with key `sem`, if any.
    pub fn hold_on(&self, sem: u32) -> Option<FencingToken> {
        self.holds.iter().find(|(s, _)| *s == sem).map(|(_, t)| t)
    }
}

/// The semaphores a lease holds, as (semaphore key in the namespace's `sem_keys`, fencing
/// token of the lease's holder there). Most leases hold one, which is kept inline: no
/// allocation. Two or more sit behind one pointer, so the enum takes 16 bytes, not the 24 of a
/// Vec: 8 MB less with a million leases.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Holds {
    /// The lease holds nothing (a new lease, or one whose holds were all released).
    #[default]
    None,
    /// The usual single hold, inline: (semaphore key, token).
    One(u32, FencingToken),
    /// Two or more holds (a SEM.ACQUIREALL, or acquires on several semaphores), behind a
    /// pointer.
    Many(Box<Vec<(u32, FencingToken)>>),
}

impl Holds {
    /// The holds.
    pub fn iter(&self) -> impl Iterator<Item = (u32, FencingToken)> + '_ {
        let (one, many) = match self {
            Holds::None => (None, &[][..]),
            Holds::One(k, t) => (Some((*k, *t)), &[][..]),
            Holds::Many(v) => (None, v.as_slice()),
        };
        one.into_iter().chain(many.iter().copied())
    }

    /// How many.
    pub fn len(&self) -> usize {
        match self {
            Holds::None => 0,
            Holds::One(..) => 1,
            Holds::Many(v) => v.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records a hold on a semaphore the lease does not hold yet.
    pub fn add(&mut self, sem: u32, token: FencingToken) {
        debug_assert!(self.iter().all(|(k, _)| k != sem), "one hold per semaphore");
        *self = match std::mem::take(self) {
            Holds::None => Holds::One(sem, token),
            Holds::One(k, t) => Holds::Many(Box::new(vec![(k, t), (sem, token)])),
            Holds::Many(mut v) => {
                v.push((sem, token));
                Holds::Many(v)
            }
        };
    }

    /// Drops the hold on semaphore `sem`; returns its token.
    pub fn remove(&mut self, sem: u32) -> Option<FencingToken> {
        match self {
            Holds::None => None,
            Holds::One(k, t) => {
                let t = *t;
                (*k == sem).then(|| *self = Holds::None).map(|_| t)
            }
            Holds::Many(v) => {
                let at = v.iter().position(|(k, _)| *k == sem)?;
                let (_, t) = v.swap_remove(at);
                if let [(k, t)] = v[..] {
                    *self = Holds::One(k, t);
                }
                Some(t)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(n: u64, serial: u64) -> Lease {
        Lease {
            id: LeaseId::from_counter(n),
            serial,
            process_id: ProcessId::new(b"p"),
            created_at: 0,
            expires_at: 1,
            metadata: Metadata::default(),
            holds: Holds::None,
        }
    }

    #[test]
    fn slots_are_reused_and_ids_found() {
        let mut t = Leases::default();
        let refs: Vec<LeaseRef> = (0..100).map(|i| t.insert(lease(i, i))).collect();
        assert_eq!(t.len(), 100);
        for (i, r) in refs.iter().enumerate() {
            assert_eq!(t.find(&LeaseId::from_counter(i as u64)), Some(*r));
        }
        for r in refs.iter().step_by(2) {
            assert!(t.remove(*r).is_some());
            assert!(t.remove(*r).is_none(), "removed once");
        }
        assert_eq!(t.len(), 50);
        assert_eq!(t.find(&LeaseId::from_counter(0)), None);
        assert_eq!(t.find(&LeaseId::from_counter(1)), Some(refs[1]));
        let serial = t.take_serial();
        assert_eq!(serial, 100);
        let again = t.insert(lease(1000, serial));
        assert!(
            refs.iter().step_by(2).any(|r| *r == again),
            "a free slot is reused"
        );
        let order: Vec<u64> = t.iter().map(|(_, l)| l.serial).collect();
        let mut sorted = order.clone();
        sorted.sort();
        assert_eq!(order, sorted, "creation order");
        assert_eq!(order.len(), 51);
        let live: Vec<LeaseRef> = t.iter().map(|(r, _)| r).collect();
        for r in live {
            t.remove(r);
        }
        assert!(t.is_empty());
        assert_eq!(t.slots.capacity(), 0, "room given back");
        assert_eq!(t.take_serial(), 101, "serials keep rising");
    }

    #[test]
    fn leases_made_after_a_peak_leave_its_room_free() {
        let mut t = Leases::default();
        let refs: Vec<LeaseRef> = (0..1000).map(|i| t.insert(lease(i, i))).collect();
        // The peak ends oldest first; the slot freed last is the slab's last one.
        for r in &refs[10..] {
            t.remove(*r);
        }
        let later: Vec<LeaseRef> = (0..5)
            .map(|i| t.insert(lease(2000 + i, 1000 + i)))
            .collect();
        assert!(later.iter().all(|r| (10..15).contains(&r.0)), "{later:?}");
        t.shrink();
        assert_eq!(t.slots.len(), 15);
        assert!(t.slots.capacity() < 1000, "the peak's room is given back");
    }

    #[test]
    fn shrink_gives_back_the_tail_and_keeps_handles() {
        let mut t = Leases::default();
        let refs: Vec<LeaseRef> = (0..1000).map(|i| t.insert(lease(i, i))).collect();
        // Keep 0..10 and 200; free the rest.
        for (i, r) in refs.iter().enumerate() {
            if i >= 10 && i != 200 {
                t.remove(*r);
            }
        }
        t.shrink();
        assert_eq!(
            t.slots.len(),
            201,
            "free slots after the last live one are gone"
        );
        assert!(t.slots.capacity() < 1000);
        assert!(t.free.iter().all(|&Reverse(s)| s < 201));
        for i in (0..10).chain([200]) {
            let r = t.find(&LeaseId::from_counter(i)).expect("still found");
            assert_eq!(r, refs[i as usize], "handles do not move");
        }
        let r = t.insert(lease(5000, t.next_serial));
        assert_eq!(r.0, 10, "the lowest free slot is reused");
        assert_eq!(
            t.by_id(&LeaseId::from_counter(5000)).map(|l| l.serial),
            Some(1000)
        );
    }

    #[test]
    fn a_lease_slot_stays_small() {
        // A million leases: every byte here is a megabyte (docs/design.md, "State layout").
        assert_eq!(std::mem::size_of::<Option<Lease>>(), 80);
    }

    #[test]
    fn holds_go_from_inline_to_heap_and_back() {
        assert_eq!(std::mem::size_of::<Holds>(), 16);
        let mut h = Holds::default();
        assert!(h.is_empty());
        h.add(7, 70);
        assert_eq!(h, Holds::One(7, 70));
        h.add(8, 80);
        h.add(9, 90);
        assert_eq!(h.len(), 3);
        assert_eq!(h.remove(7), Some(70));
        assert_eq!(h.remove(7), None);
        assert_eq!(h.remove(9), Some(90));
        assert_eq!(h, Holds::One(8, 80), "back inline at one");
        assert_eq!(h.iter().collect::<Vec<_>>(), vec![(8, 80)]);
        assert_eq!(h.remove(1), None);
        assert_eq!(h.remove(8), Some(80));
        assert!(h.is_empty());
    }
}
