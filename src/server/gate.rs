//! A connection's durability gate. The replies a connection buffers go out only once every change
//! they may show is on disk (SPEC §8); a reply that may show a change that was rolled back
//! instead (its write found the disk full) goes out as that change's error (`MISCONF`), since
//! what it told is not what the shard holds.
//!
//! The shards say how far their logs are saved with LSNs ([`Saved`]). The connection notes, for
//! each reply, the LSNs it may show: `note` comes before the reply is buffered, and the next
//! reply buffered takes the notes made since the one before; the replies of engine requests
//! (`Conn::answer`) also take the latest note of their shard, as a batch of them is noted once.

use bytes::BytesMut;

use super::global::{Global, Saved};
use crate::error::Error;
use crate::protocol::{Proto, Reply};

/// The bytes `start..end` of the output buffer are one reply, which may show the change at
/// `lsn` of shard `shard`.
#[derive(Debug, Clone, Copy, Default)]
struct Mark {
    start: usize,
    end: usize,
    shard: usize,
    lsn: u64,
}

/// A list whose first `N` items are kept inline: the few notes and marks of a usual write need
/// no allocation, and a cleared list holds no room. Allocating them for each write (or keeping
/// their room) left `scripts/soak`'s RSS after its load above its bound in most runs
/// (docs/design.md, "Memory after a burst"): the blocks that outlive a burst, the engine's,
/// land among more pages that the burst's traffic filled, and keep them resident. `N` stays
/// small: each connection's task carries the lists, and a larger one raised the soak's peak.
#[derive(Debug)]
struct Few<T, const N: usize> {
    head: [T; N],
    len: usize,
    rest: Vec<T>,
}

impl<T: Copy + Default, const N: usize> Few<T, N> {
    fn new() -> Self {
        Few {
            head: [T::default(); N],
            len: 0,
            rest: Vec::new(),
        }
    }

    fn push(&mut self, t: T) {
        match self.head.get_mut(self.len) {
            Some(slot) => *slot = t,
            None => self.rest.push(t),
        }
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.head[..self.len.min(N)].iter().chain(&self.rest)
    }

    fn clear(&mut self) {
        self.len = 0;
        self.rest = Vec::new();
    }
}

/// What a gate tracks of one shard.
#[derive(Debug, Clone, Default)]
struct Of {
    /// What was known of its log when this connection last waited on it. An LSN it has saved
    /// stays saved, so a note of one needs nothing more.
    known: Saved,
    /// The highest LSN the buffered replies may show (0: none).
    need: u64,
    /// The latest LSN noted.
    last: u64,
}

/// Shards whose state a gate keeps inline; more go to a vector.
const INLINE_SHARDS: usize = 2;

/// A gate's state of each shard, the first [`INLINE_SHARDS`] inline, for the same reason as
/// [`Few`]: a burst of 10,000 connections made a block each for it otherwise.
#[derive(Debug)]
struct PerShard {
    head: [Of; INLINE_SHARDS],
    rest: Vec<Of>,
}

impl PerShard {
    fn new(shards: usize) -> PerShard {
        PerShard {
            head: Default::default(),
            rest: vec![Of::default(); shards.saturating_sub(INLINE_SHARDS)],
        }
    }

    fn get(&self, shard: usize) -> &Of {
        match self.head.get(shard) {
            Some(of) => of,
            None => &self.rest[shard - INLINE_SHARDS],
        }
    }

    fn get_mut(&mut self, shard: usize) -> &mut Of {
        match self.head.get_mut(shard) {
            Some(of) => of,
            None => &mut self.rest[shard - INLINE_SHARDS],
        }
    }

    /// Every shard's state with its index (the inline ones beyond the shard count stay idle:
    /// nothing is noted for them).
    fn iter_mut(&mut self) -> impl Iterator<Item = (usize, &mut Of)> {
        self.head.iter_mut().chain(&mut self.rest).enumerate()
    }
}

/// See the module docs.
#[derive(Debug)]
pub struct Gate {
    shards: PerShard,
    /// Notes that no buffered reply took yet.
    notes: Few<(usize, u64), 2>,
    /// The buffered replies that may show changes not known to be saved.
    marks: Few<Mark, 4>,
}

impl Gate {
    /// A gate for a server of `shards` shards.
    pub fn new(shards: usize) -> Gate {
        Gate {
            shards: PerShard::new(shards),
            notes: Few::new(),
            marks: Few::new(),
        }
    }

    /// The next reply buffered may show changes of `shard` up to `lsn`.
    pub fn note(&mut self, shard: usize, lsn: u64) {
        let of = self.shards.get_mut(shard);
        of.last = lsn;
        if of.known.has(lsn) {
            return;
        }
        of.need = of.need.max(lsn);
        self.notes.push((shard, lsn));
    }

    /// The bytes `start..end` of the output buffer are a reply: it takes the notes made since
    /// the reply before, and the latest one of `shard` if it answers a request of that shard.
    pub fn buffered(&mut self, start: usize, end: usize, shard: Option<usize>) {
        let mark = |(shard, lsn)| Mark {
            start,
            end,
            shard,
            lsn,
        };
        for &note in self.notes.iter() {
            self.marks.push(mark(note));
        }
        self.notes.clear();
        if let Some(s) = shard {
            let of = self.shards.get(s);
            if !of.known.has(of.last) {
                self.marks.push(mark((s, of.last)));
            }
        }
    }

    /// Waits until the fate of every change the buffered replies in `out` may show is known,
    /// then turns each reply that may show a rolled-back change into that change's error,
    /// encoded in `proto`.
    pub async fn settle(&mut self, g: &Global, out: &mut BytesMut, proto: Proto) {
        for (shard, of) in self.shards.iter_mut() {
            if of.need > 0 {
                of.known = g.wait_durable(shard, of.need).await;
                of.need = 0;
            }
        }
        self.notes.clear();
        let shards = &self.shards;
        let failed: Vec<(usize, usize, &Error)> = self
            .marks
            .iter()
            .filter_map(|m| Some((m.start, m.end, shards.get(m.shard).known.lost(m.lsn)?)))
            .collect();
        if failed.is_empty() {
            self.marks.clear();
            return;
        }
        let mut fixed = BytesMut::with_capacity(out.len());
        let mut done = 0;
        for (start, end, error) in failed {
            // Several marks of one reply (it showed several shards' changes): one error.
            if start < done {
                continue;
            }
            fixed.extend_from_slice(&out[done..start]);
            Reply::Error(error.clone()).encode(proto, &mut fixed);
            done = end;
        }
        fixed.extend_from_slice(&out[done..]);
        *out = fixed;
        self.marks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_noted_once_marks_each_of_its_replies_and_nothing_after() {
        let mut gate = Gate::new(2);
        gate.note(1, 7);
        gate.buffered(0, 5, Some(1));
        gate.buffered(5, 9, Some(1));
        gate.buffered(9, 16, None);
        let spans: Vec<(usize, usize)> = gate.marks.iter().map(|m| (m.start, m.end)).collect();
        assert_eq!(spans, vec![(0, 5), (0, 5), (5, 9)]);
        assert!(gate.marks.iter().all(|m| m.shard == 1 && m.lsn == 7));
    }

    #[test]
    fn a_few_spills_past_its_inline_room_and_clears_all() {
        let mut few: Few<u64, 2> = Few::new();
        for i in 1..=5 {
            few.push(i);
        }
        assert_eq!(few.iter().copied().collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        few.clear();
        assert_eq!(few.iter().count(), 0);
        assert_eq!(few.rest.capacity(), 0);
        few.push(9);
        assert_eq!(few.iter().copied().collect::<Vec<_>>(), vec![9]);
    }

    #[test]
    fn per_shard_state_beyond_the_inline_ones() {
        let mut shards = PerShard::new(INLINE_SHARDS + 2);
        shards.get_mut(INLINE_SHARDS + 1).need = 7;
        assert_eq!(shards.get(INLINE_SHARDS + 1).need, 7);
        let needs: Vec<(usize, u64)> = shards.iter_mut().map(|(i, of)| (i, of.need)).collect();
        assert_eq!(needs.len(), INLINE_SHARDS + 2);
        assert_eq!(needs[INLINE_SHARDS + 1], (INLINE_SHARDS + 1, 7));
    }
}
