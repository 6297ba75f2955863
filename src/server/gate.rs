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
use crate::protocol::{Proto, Reply};

/// The bytes `start..end` of the output buffer are one reply, which may show the change at
/// `lsn` of shard `shard`.
#[derive(Debug, Clone, Copy)]
struct Mark {
    start: usize,
    end: usize,
    shard: usize,
    lsn: u64,
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

/// See the module docs.
#[derive(Debug)]
pub struct Gate {
    /// Per shard (one allocation: a connection makes it at once, and there may be 10,000).
    shards: Vec<Of>,
    /// Notes that no buffered reply took yet.
    notes: Vec<(usize, u64)>,
    /// The buffered replies that may show changes not known to be saved.
    marks: Vec<Mark>,
}

impl Gate {
    /// A gate for a server of `shards` shards.
    pub fn new(shards: usize) -> Gate {
        Gate {
            shards: vec![Of::default(); shards],
            notes: Vec::new(),
            marks: Vec::new(),
        }
    }

    /// The next reply buffered may show changes of `shard` up to `lsn`.
    pub fn note(&mut self, shard: usize, lsn: u64) {
        let of = &mut self.shards[shard];
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
        self.marks.extend(self.notes.drain(..).map(mark));
        if let Some(s) = shard {
            let of = &self.shards[s];
            if !of.known.has(of.last) {
                self.marks.push(mark((s, of.last)));
            }
        }
    }

    /// Waits until the fate of every change the buffered replies in `out` may show is known,
    /// then turns each reply that may show a rolled-back change into that change's error,
    /// encoded in `proto`.
    pub async fn settle(&mut self, g: &Global, out: &mut BytesMut, proto: Proto) {
        for (shard, of) in self.shards.iter_mut().enumerate() {
            if of.need > 0 {
                of.known = g.wait_durable(shard, of.need).await;
                of.need = 0;
            }
        }
        self.notes.clear();
        if self.marks.is_empty() {
            return;
        }
        let marks = std::mem::take(&mut self.marks);
        let mut failed = marks.iter().filter_map(|m| {
            let error = self.shards[m.shard].known.lost(m.lsn)?;
            Some((m.start, m.end, error))
        });
        let Some(first) = failed.next() else {
            return;
        };
        let mut fixed = BytesMut::with_capacity(out.len());
        let mut done = 0;
        for (start, end, error) in std::iter::once(first).chain(failed) {
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
}
