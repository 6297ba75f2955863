//! A namespace's leases in creation order: what LEASE.LIST pages through.
//!
//! Two parallel vectors sorted by serial, instead of a `BTreeMap<u64, LeaseRef>`: an entry
//! costs 12 bytes, where the map's nodes, left about half full by rising keys, cost about 25.
//! New leases have the highest serial, so an insert is a push. A removal leaves a tombstone
//! (binary search, no move), and the tombstones go in one sweep once they are as many as the
//! live entries, so each removal pays for at most one move later.

use std::ops::{Bound, Range};

use super::page::{index_range, Ordered};
use super::room::sparse;

/// What the order holds per serial: a small handle with one value set aside to mark a removed
/// entry (a tombstone), so that an entry stays as small as the handle.
pub trait Slot: Copy + Eq {
    /// The tombstone: no live entry has it.
    const GONE: Self;
}

/// Handles by serial, oldest first.
#[derive(Debug)]
pub struct CreationOrder<V> {
    /// Serials, strictly rising (tombstones keep theirs, so the search stays exact).
    serials: Vec<u64>,
    /// The handle with the serial at the same index, or [`Slot::GONE`].
    slots: Vec<V>,
    /// Tombstones among them.
    gone: usize,
}

impl<V> Default for CreationOrder<V> {
    fn default() -> Self {
        CreationOrder {
            serials: Vec::new(),
            slots: Vec::new(),
            gone: 0,
        }
    }
}

impl<V: Slot> CreationOrder<V> {
    /// Records handle `r` with a serial no live entry has.
    pub fn insert(&mut self, serial: u64, r: V) {
        match self.serials.last() {
            // The usual case: the newest lease.
            None => self.push(serial, r),
            Some(&last) if last < serial => self.push(serial, r),
            // Replay may bring an older serial back (its tombstone, if any, is reused).
            Some(_) => match self.serials.binary_search(&serial) {
                Ok(i) => {
                    debug_assert!(self.slots[i] == V::GONE, "serials are unique");
                    self.slots[i] = r;
                    self.gone -= 1;
                }
                Err(i) => {
                    self.serials.insert(i, serial);
                    self.slots.insert(i, r);
                }
            },
        }
    }

    fn push(&mut self, serial: u64, r: V) {
        self.serials.push(serial);
        self.slots.push(r);
    }

    /// Forgets the entry with `serial`.
    pub fn remove(&mut self, serial: u64) {
        let Ok(i) = self.serials.binary_search(&serial) else {
            debug_assert!(false, "a live entry's serial is recorded");
            return;
        };
        debug_assert!(self.slots[i] != V::GONE, "removed once");
        self.slots[i] = V::GONE;
        self.gone += 1;
        if 2 * self.gone >= self.serials.len() {
            self.sweep();
        }
    }

    /// Drops the tombstones.
    fn sweep(&mut self) {
        let mut keep = self.slots.iter().map(|&r| r != V::GONE);
        self.serials.retain(|_| keep.next().unwrap_or(false));
        self.slots.retain(|&r| r != V::GONE);
        self.gone = 0;
    }

    /// Gives back room left by a peak (the vectors hold a quarter of it or less).
    pub fn shrink(&mut self) {
        if sparse(self.serials.capacity(), self.serials.len(), 16) {
            self.serials.shrink_to_fit();
            self.slots.shrink_to_fit();
        }
    }

    /// Live entries, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.range(0..self.serials.len())
    }

    fn range(&self, r: Range<usize>) -> impl DoubleEndedIterator<Item = (&u64, &V)> {
        self.serials[r.clone()]
            .iter()
            .zip(&self.slots[r])
            .filter(|(_, &r)| r != V::GONE)
    }
}

impl<V: Slot> Ordered for CreationOrder<V> {
    type Key = u64;
    type Item = V;
    fn within<'a>(
        &'a self,
        lower: Bound<&u64>,
        upper: Bound<&u64>,
    ) -> impl DoubleEndedIterator<Item = (&'a u64, &'a V)> {
        self.range(index_range(
            self.serials.len(),
            lower,
            upper,
            |s, inclusive| {
                self.serials
                    .partition_point(|x| x < s || (inclusive && x == s))
            },
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    impl Slot for u32 {
        const GONE: u32 = u32::MAX;
    }

    type LeaseRef = u32;

    fn live(o: &CreationOrder<LeaseRef>) -> Vec<(u64, LeaseRef)> {
        o.iter().map(|(&s, &r)| (s, r)).collect()
    }

    #[test]
    fn keeps_creation_order_through_removals_sweeps_and_replay() {
        let mut o = CreationOrder::default();
        let mut model = BTreeMap::new();
        for s in 0..1000u64 {
            let r = (s % 97) as u32;
            o.insert(s, r);
            model.insert(s, r);
        }
        // Remove most, in an order unlike creation: sweeps happen on the way.
        for s in (0..1000u64).filter(|s| s % 7 != 0) {
            o.remove(s);
            model.remove(&s);
            if s % 50 == 0 {
                assert_eq!(
                    live(&o),
                    model.iter().map(|(&s, &r)| (s, r)).collect::<Vec<_>>()
                );
            }
        }
        assert!(
            o.serials.len() < 2 * model.len() + 2,
            "tombstones were swept"
        );
        // Replay brings back an older serial; a new one goes at the end.
        for s in [3u64, 500, 1500] {
            o.insert(s, 1);
            model.insert(s, 1);
        }
        assert_eq!(
            live(&o),
            model.iter().map(|(&s, &r)| (s, r)).collect::<Vec<_>>()
        );
        // Ranges match the map's, both ways, with every kind of bound.
        let bounds = [
            Bound::Unbounded,
            Bound::Included(&14u64),
            Bound::Excluded(&14u64),
            Bound::Included(&499u64),
            Bound::Excluded(&500u64),
            Bound::Excluded(&2000u64),
        ];
        for lo in bounds {
            for hi in bounds {
                if matches!((lo, hi), (Bound::Excluded(a), Bound::Excluded(b)) if a == b) {
                    continue; // a range the map refuses
                }
                let want: Vec<(u64, LeaseRef)> = if matches!((lo, hi), (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) if a > b)
                {
                    Vec::new()
                } else {
                    model
                        .range::<u64, _>((lo, hi))
                        .map(|(&s, &r)| (s, r))
                        .collect()
                };
                let got: Vec<(u64, LeaseRef)> = o.within(lo, hi).map(|(&s, &r)| (s, r)).collect();
                assert_eq!(got, want, "{lo:?}..{hi:?}");
                let back: Vec<(u64, LeaseRef)> =
                    o.within(lo, hi).rev().map(|(&s, &r)| (s, r)).collect();
                assert_eq!(back, want.into_iter().rev().collect::<Vec<_>>());
            }
        }
        for s in model.keys().copied().collect::<Vec<_>>() {
            o.remove(s);
        }
        assert!(o.iter().next().is_none());
        assert_eq!(o.serials.len(), 0, "the last removal sweeps everything");
        o.shrink();
        assert_eq!(o.serials.capacity(), 0);
    }
}
