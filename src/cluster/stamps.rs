//! The clock guard's evidence (SPEC §10, replication.md §4.2): every append a serving leader
//! sends, heartbeats included, carries its wall clock's reading at the send, and a follower notes
//! when it received each, so that `received - sent_at` is the offset of its clock from that
//! leader's plus the append's transit, and the least of the recent ones bounds the offset from
//! above. Heartbeats every 100 ms keep the evidence fresh on a quiet cluster too.
//!
//! Only a leader whose shards serve, having passed the guard themselves, stamps its appends
//! ([`Wall::vouch`]): the guard measures a node against the clocks that made the cluster's log.
//! A leader that refuses to lead, its clock too far ahead, says no time: otherwise, when the
//! two survivors of a leader's death both ran ahead (a review stepped both 10 s), the first
//! refused and handed over, and the second measured itself against the first's appends, found
//! no offset, and served with its fast clock (a lease lost its permit 10 s early).
//!
//! Two earlier choices took the `now` of the entries instead, and made a follower read its
//! clock as ahead by the time it had waited for them, and refuse to lead (measured with
//! `kill -9` of the leader 2 ms after a write, six kills a run, each node restarted; a review saw
//! "ahead_ms=875" and the leadership bounce):
//! - the instant an entry was applied: a follower applies it once it hears of its commit, and
//!   the last entries of a leader that dies are committed only by the next, a second late
//!   (refusals in 2 runs of 4);
//! - the instant a live entry arrived (one its sender made and had not committed): on a quiet
//!   cluster the last of those may be a take-over's, which reached a node restarted meanwhile
//!   late (refusals in 4 runs of 4, "ahead_ms=863").

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::engine::types::Nanos;

/// How many stamps are kept per leader at most.
const PER_LEADER: usize = 16;

/// This node's wall clock, in nanoseconds since the Unix epoch: the system's, moved by an
/// offset that only `DEBUG CLOCK-STEP` sets (to test clock steps). The shards' clocks and the
/// appends' send times read the same one.
#[derive(Debug, Clone, Default)]
pub struct Wall {
    offset: Arc<AtomicI64>,
    /// The last term in which this node's shards took over as leader (0: none).
    vouched: Arc<AtomicU64>,
}

impl Wall {
    /// Its reading.
    pub fn now(&self) -> Nanos {
        let system = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as Nanos);
        system + self.offset.load(Ordering::Relaxed)
    }

    /// Moves it `by`, as an NTP step moves the system's.
    pub fn step(&self, by: Nanos) {
        self.offset.fetch_add(by, Ordering::Relaxed);
    }

    /// Says that this node's shards serve as leader in `term`, the clock guard passed: its
    /// appends of that term carry its clock from now on.
    pub fn vouch(&self, term: u64) {
        self.vouched.fetch_max(term, Ordering::Relaxed);
    }

    /// The send time of an append of this node's leadership in `term`: the reading, once the
    /// node vouched for its clock in that term.
    pub fn stamp(&self, term: u64) -> Option<Nanos> {
        (self.vouched.load(Ordering::Relaxed) == term).then(|| self.now())
    }
}

/// An append's send time as this node received it.
#[derive(Debug, Clone, Copy)]
pub struct Stamp {
    /// The leader that sent it.
    pub leader: u64,
    /// Its wall clock at the send.
    pub now: Nanos,
    /// When the append reached this node.
    pub received: Instant,
}

impl Stamp {
    /// How far a clock that reads `wall` now runs ahead of the leader's at most: the offset
    /// plus the append's transit.
    pub fn ahead_at(&self, wall: Nanos) -> Nanos {
        wall - self.received.elapsed().as_nanos() as Nanos - self.now
    }

    /// Whether `self`, received no earlier than `before`, says no less of the clock offset: it
    /// came as soon or sooner after its `now` (both stamped by the same leader).
    fn as_close_as(&self, before: &Stamp) -> bool {
        let stamped = i128::from(self.now) - i128::from(before.now);
        let received = self
            .received
            .saturating_duration_since(before.received)
            .as_nanos();
        i128::try_from(received).unwrap_or(i128::MAX) <= stamped
    }
}

/// Per leader, the stamps that still bound the offset best: each is the one received soonest
/// after its `now` of those received since the one before it (a sliding minimum), so that a
/// run of late ones (a slow moment, a busy box) does not push out the prompt ones before it.
/// Shared by the peer listener, which notes, and the node's handle, which reads.
#[derive(Clone, Default)]
pub struct Stamps(Arc<Mutex<BTreeMap<u64, VecDeque<Stamp>>>>);

impl Stamps {
    /// Notes `stamp`.
    pub fn note(&self, stamp: Stamp) {
        let mut all = self.0.lock().expect("no panic while the stamps are locked");
        let mine = all.entry(stamp.leader).or_default();
        while mine.back().is_some_and(|b| stamp.as_close_as(b)) {
            mine.pop_back();
        }
        if mine.len() == PER_LEADER {
            // The front is the least delay of all kept: the next one goes.
            mine.remove(1);
        }
        mine.push_back(stamp);
    }

    /// Every stamp kept: per leader a sliding minimum of at most 16 (after 16 ever later ones,
    /// the second oldest goes, so the least delay kept stays).
    pub fn all(&self) -> Vec<Stamp> {
        let all = self.0.lock().expect("no panic while the stamps are locked");
        all.values().flatten().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The least `received - now` among `stamps` of `leader`, in ms, `received` counted from
    /// `origin` (what the clock guard takes for the offset).
    fn least_delay_ms(stamps: &Stamps, leader: u64, origin: Instant) -> i128 {
        stamps
            .all()
            .iter()
            .filter(|s| s.leader == leader)
            .map(|s| (s.received - origin).as_millis() as i128 - i128::from(s.now) / 1_000_000)
            .min()
            .unwrap()
    }

    #[test]
    fn a_burst_of_late_stamps_does_not_hide_the_prompt_ones_before_it() {
        let origin = Instant::now();
        let stamp = |leader, now_ms: u64, received_ms: u64| Stamp {
            leader,
            now: Nanos::try_from(now_ms * 1_000_000).unwrap(),
            received: origin + Duration::from_millis(received_ms),
        };
        let stamps = Stamps::default();
        // Leader 1's entries, each received 2 ms after its `now` ...
        for i in 0..10 {
            stamps.note(stamp(1, 100 + i, 102 + i));
        }
        // ... then 40 received a second late (a slow moment).
        for i in 0..40 {
            stamps.note(stamp(1, 110 + i, 1_150 + i));
        }
        assert!(stamps.all().len() <= PER_LEADER);
        assert_eq!(least_delay_ms(&stamps, 1, origin), 2);
        // A later stamp as prompt makes the ones before it worth nothing more.
        stamps.note(stamp(1, 1_300, 1_301));
        assert_eq!(stamps.all().len(), 1);
        assert_eq!(least_delay_ms(&stamps, 1, origin), 1);
        // Each leader's clock is its own.
        stamps.note(stamp(2, 5_000, 1_400));
        assert_eq!(least_delay_ms(&stamps, 1, origin), 1);
        assert_eq!(least_delay_ms(&stamps, 2, origin), -3_600);
    }
}
