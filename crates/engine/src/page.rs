//! Cursor pagination over ordered maps (SPEC §4 pages, §9 cursor rules).
//!
//! A cursor names the boundary item of the page it came from and a direction: `next` pages
//! start after it, `previous` pages end before it. Pages are therefore stable under inserts and
//! deletes between calls (no item repeats, nothing crashes) and exact while nothing changes.
//! Cursors are opaque text with a kind tag and a check value, so a cursor of another listing or
//! one the server never handed out is `INVALIDARG invalid cursor`.

use std::collections::BTreeMap;
use std::ops::Bound;

use bytes::Bytes;

use crate::error::Error;

/// Which listing a cursor belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorKind {
    /// NS.LIST, keyed by namespace name.
    Namespaces,
    /// SEM.LIST, keyed by semaphore name.
    Semaphores,
    /// SEM.HOLDERS, keyed by fencing token (oldest first).
    Holders,
    /// LEASE.LIST, keyed by creation order.
    Leases,
    /// SEM.WAITERS, keyed by arrival order (the waiter id).
    Waiters,
}

impl CursorKind {
    fn tag(self) -> u8 {
        match self {
            CursorKind::Namespaces => b'n',
            CursorKind::Semaphores => b's',
            CursorKind::Holders => b'h',
            CursorKind::Leases => b'l',
            CursorKind::Waiters => b'w',
        }
    }
}

/// Direction of a page relative to its cursor key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// Items after the key.
    Next,
    /// Items before the key.
    Prev,
}

/// A decoded cursor: direction and boundary key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    /// Which side of `key` the page lies on.
    pub dir: Dir,
    /// The boundary item's key bytes (a name, or a big-endian number).
    pub key: Bytes,
}

/// A page request: optional cursor and a page size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// Where to start; `None` is the first page.
    pub cursor: Option<Cursor>,
    /// Items per page, 1..=250.
    pub limit: usize,
}

/// FNV-1a over a fixed key and the payload: a check value that rejects cursors not made here.
fn check(payload: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in b"permitd-cursor-v1".iter().chain(payload) {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &[u8]) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks(2)
        .map(|c| u8::from_str_radix(std::str::from_utf8(c).ok()?, 16).ok())
        .collect()
}

impl Cursor {
    /// The opaque text handed to clients.
    pub fn encode(&self, kind: CursorKind) -> Bytes {
        let mut payload = vec![
            kind.tag(),
            match self.dir {
                Dir::Next => b'n',
                Dir::Prev => b'p',
            },
        ];
        payload.extend_from_slice(&self.key);
        let text = format!("{}{:016x}", hex(&payload), check(&payload));
        Bytes::from(text)
    }

    /// Decodes a client's cursor for listing `kind`.
    pub fn decode(text: &[u8], kind: CursorKind) -> Result<Cursor, Error> {
        let invalid = || Error::InvalidArg("invalid cursor".into());
        if text.len() < 16 + 4 {
            return Err(invalid());
        }
        let (body, sum) = text.split_at(text.len() - 16);
        let payload = unhex(body).ok_or_else(invalid)?;
        let sum = std::str::from_utf8(sum)
            .ok()
            .and_then(|s| u64::from_str_radix(s, 16).ok())
            .ok_or_else(invalid)?;
        if sum != check(&payload) || payload[0] != kind.tag() {
            return Err(invalid());
        }
        let dir = match payload[1] {
            b'n' => Dir::Next,
            b'p' => Dir::Prev,
            _ => return Err(invalid()),
        };
        Ok(Cursor {
            dir,
            key: Bytes::copy_from_slice(&payload[2..]),
        })
    }
}

/// One page taken from an ordered map.
#[derive(Debug)]
pub struct PageOf<K, T> {
    /// The items, in ascending key order.
    pub items: Vec<T>,
    /// Key of the last item when items follow it.
    pub next: Option<K>,
    /// Key of the first item when items precede it.
    pub prev: Option<K>,
}

/// A collection in key order that pages are taken from.
pub trait Ordered {
    /// The key a cursor carries.
    type Key: Ord + Clone;
    /// An item.
    type Item;
    /// The items whose keys are within the bounds, in key order, each with its key.
    fn within<'a>(
        &'a self,
        lower: Bound<&Self::Key>,
        upper: Bound<&Self::Key>,
    ) -> impl DoubleEndedIterator<Item = (&'a Self::Key, &'a Self::Item)>;
}

impl<K: Ord + Clone, V> Ordered for BTreeMap<K, V> {
    type Key = K;
    type Item = V;
    fn within<'a>(
        &'a self,
        lower: Bound<&K>,
        upper: Bound<&K>,
    ) -> impl DoubleEndedIterator<Item = (&'a K, &'a V)> {
        self.range::<K, _>((lower, upper))
    }
}

/// The indexes of a key-sorted sequence of `len` items whose keys are within the bounds.
/// `below(k, inclusive)` counts the items with keys below `k` (or at most `k` when inclusive),
/// as a `partition_point` does.
pub fn index_range<K>(
    len: usize,
    lower: Bound<&K>,
    upper: Bound<&K>,
    below: impl Fn(&K, bool) -> usize,
) -> std::ops::Range<usize> {
    let from = match lower {
        Bound::Unbounded => 0,
        Bound::Included(k) => below(k, false),
        Bound::Excluded(k) => below(k, true),
    };
    let to = match upper {
        Bound::Unbounded => len,
        Bound::Included(k) => below(k, true),
        Bound::Excluded(k) => below(k, false),
    };
    from..to.max(from)
}

/// Takes the page `(dir, from)` of `limit` items of `map` that pass `keep`.
///
/// `from` is `None` for the first page. Items are rendered with `render`.
pub fn take_page<M: Ordered, T>(
    map: &M,
    from: Option<(Dir, M::Key)>,
    limit: usize,
    keep: impl Fn(&M::Item) -> bool,
    render: impl Fn(&M::Key, &M::Item) -> T,
) -> PageOf<M::Key, T> {
    let (dir, lower, upper) = match &from {
        None => (Dir::Next, Bound::Unbounded, Bound::Unbounded),
        Some((Dir::Next, k)) => (Dir::Next, Bound::Excluded(k), Bound::Unbounded),
        Some((Dir::Prev, k)) => (Dir::Prev, Bound::Unbounded, Bound::Excluded(k)),
    };
    let range = map.within(lower, upper).filter(|(_, v)| keep(v));
    let mut picked: Vec<(&M::Key, &M::Item)> = match dir {
        Dir::Next => range.take(limit + 1).collect(),
        Dir::Prev => range.rev().take(limit + 1).collect(),
    };
    let more_beyond = picked.len() > limit;
    picked.truncate(limit);
    if dir == Dir::Prev {
        picked.reverse();
    }
    // Whether anything lies on the cursor's own side (behind the page's start).
    let behind = |k: &M::Key| -> bool {
        match dir {
            Dir::Next => map
                .within(Bound::Unbounded, Bound::Excluded(k))
                .any(|(_, v)| keep(v)),
            Dir::Prev => map
                .within(Bound::Excluded(k), Bound::Unbounded)
                .any(|(_, v)| keep(v)),
        }
    };
    let ends = picked
        .first()
        .zip(picked.last())
        .map(|((f, _), (l, _))| ((*f).clone(), (*l).clone()));
    let (next, prev) = match (dir, ends, from) {
        (_, None, None) => (None, None),
        // An empty page after a cursor: offer the way back (or forward) from the cursor key.
        (Dir::Next, None, Some((_, k))) => (None, behind(&k).then_some(k)),
        (Dir::Prev, None, Some((_, k))) => (behind(&k).then_some(k), None),
        (Dir::Next, Some((f, l)), _) => (more_beyond.then_some(l), behind(&f).then_some(f)),
        (Dir::Prev, Some((f, l)), _) => (behind(&l).then_some(l), more_beyond.then_some(f)),
    };
    PageOf {
        items: picked.into_iter().map(|(k, v)| render(k, v)).collect(),
        next,
        prev,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trip_and_rejection() {
        let c = Cursor {
            dir: Dir::Prev,
            key: Bytes::from("abc"),
        };
        let text = c.encode(CursorKind::Semaphores);
        assert_eq!(Cursor::decode(&text, CursorKind::Semaphores).unwrap(), c);
        assert!(Cursor::decode(&text, CursorKind::Leases).is_err());
        assert!(Cursor::decode(b"garbage", CursorKind::Semaphores).is_err());
        let mut forged = text.to_vec();
        forged[5] ^= 1;
        assert!(Cursor::decode(&forged, CursorKind::Semaphores).is_err());
    }

    #[test]
    fn pages_walk_forward_and_back_exactly() {
        let map: BTreeMap<u32, ()> = (0..10).map(|i| (i, ())).collect();
        let mut pages = Vec::new();
        let mut from = None;
        loop {
            let p = take_page(&map, from, 3, |_| true, |k, _| *k);
            pages.push((p.items.clone(), p.prev));
            match p.next {
                Some(k) => from = Some((Dir::Next, k)),
                None => break,
            }
        }
        let seen: Vec<u32> = pages.iter().flat_map(|(i, _)| i.clone()).collect();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        assert_eq!(pages[0].1, None);
        // Following previous from each page gives exactly the page before.
        for w in 1..pages.len() {
            let back = take_page(
                &map,
                Some((Dir::Prev, pages[w].1.unwrap())),
                3,
                |_| true,
                |k, _| *k,
            );
            assert_eq!(back.items, pages[w - 1].0);
        }
    }
}
