//! Room kept and given back: the helpers that let the engine's collections shrink after a
//! load peak (docs/design.md, "Memory after a burst").

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// A hash map with the fast, DoS-resistant ahash hasher.
pub type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// Whether a collection holding `len` items in room for `capacity` should give room back after
/// a peak: it fills a quarter of it or less (counting `len` as at least `floor`, so that small
/// collections are left alone).
pub fn sparse(capacity: usize, len: usize, floor: usize) -> bool {
    capacity > 4 * len.max(floor)
}

/// Shrinks `m` when it is [`sparse`].
pub fn shrink_map<K: std::hash::Hash + Eq, V>(m: &mut FastMap<K, V>) {
    if sparse(m.capacity(), m.len(), 16) {
        m.shrink_to_fit();
    }
}

/// A collection that keeps room once emptied, and can tell whether it is empty.
pub trait Collection: Default {
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool;
}

impl<K, V> Collection for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<T> Collection for BTreeSet<T> {
    fn is_empty(&self) -> bool {
        BTreeSet::is_empty(self)
    }
}

impl<T> Collection for VecDeque<T> {
    fn is_empty(&self) -> bool {
        VecDeque::is_empty(self)
    }
}

/// Gives back the room an emptied collection keeps (a B-tree's root node, a deque's buffer):
/// a new, empty one has none.
pub fn free_if_empty<T: Collection>(t: &mut T) {
    if t.is_empty() {
        *t = T::default();
    }
}
