//! A shard's clock: the engine's `now`, which never runs backwards, and the forward steps of the
//! wall clock, which must not pass for elapsed time.
//!
//! `now` is the wall clock, or, when that is behind, the last `now` plus the time the monotonic
//! clock saw pass since: after a backward step the engine keeps time at the monotonic rate
//! instead of standing still until the wall clock catches up. A wall clock that gets ahead of
//! that by more than [`STEP`] (plus what slewing can add) has stepped forward (an NTP step, a VM
//! resumed after a pause): the reading says by how much, and the shard moves every lease's
//! death and every deadline by as much, so that the step expires nothing.

use std::cell::Cell;
use std::time::Instant;

use crate::engine::types::{Nanos, NANOS_PER_SEC};

/// A forward jump of the wall clock beyond the monotonic clock larger than this is a step.
pub const STEP: Nanos = NANOS_PER_SEC;

/// How fast a disciplined clock may run ahead of the monotonic one by slewing: Linux's limit,
/// 500 µs a second. Without it, drift over a long idle spell would read as a step.
const SLEW_PER_SEC: Nanos = 500_000;

/// One reading of the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// The engine's `now`.
    pub now: Nanos,
    /// How far the wall clock stepped forward since the last reading, if it did.
    pub step: Option<Nanos>,
}

/// The clock of one shard (its thread alone reads it).
#[derive(Debug)]
pub struct Clock {
    started: Instant,
    /// The last `now` and the monotonic time it was read at.
    last: Cell<Option<(Nanos, Nanos)>>,
}

impl Default for Clock {
    fn default() -> Clock {
        Clock {
            started: Instant::now(),
            last: Cell::new(None),
        }
    }
}

impl Clock {
    /// Reads the clock, given the wall clock's time now.
    pub fn read(&self, wall: Nanos) -> Reading {
        self.read_at(wall, self.mono())
    }

    /// What [`Clock::read`] would answer now, without taking a reading (to know how long to
    /// sleep until a deadline).
    pub fn peek(&self, wall: Nanos) -> Nanos {
        self.expected(self.mono()).map_or(wall, |e| wall.max(e))
    }

    /// Cluster mode, on promotion: `now` reads `floor` at least from here on (the last instant
    /// of the cluster's log, which another node's clock may have set ahead of this one), and
    /// runs on from there at the monotonic rate while the wall clock is behind. Not a step.
    pub fn raise_to(&self, floor: Nanos, wall: Nanos) {
        self.raise_at(floor, wall, self.mono());
    }

    fn raise_at(&self, floor: Nanos, wall: Nanos, mono: Nanos) {
        let now = self.expected(mono).map_or(wall, |e| wall.max(e)).max(floor);
        self.last.set(Some((now, mono)));
    }

    fn mono(&self) -> Nanos {
        self.started.elapsed().as_nanos() as Nanos
    }

    /// The last `now` moved on by the monotonic time since.
    fn expected(&self, mono: Nanos) -> Option<Nanos> {
        self.last.get().map(|(now, at)| now + (mono - at))
    }

    fn read_at(&self, wall: Nanos, mono: Nanos) -> Reading {
        let step = self.last.get().and_then(|(_, at)| {
            let ahead = wall - self.expected(mono)?;
            let slew = (mono - at) / NANOS_PER_SEC * SLEW_PER_SEC;
            (ahead > STEP + slew).then_some(ahead)
        });
        let now = self.expected(mono).map_or(wall, |e| wall.max(e));
        self.last.set(Some((now, mono)));
        Reading { now, step }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;
    const T0: Nanos = 1_800_000_000 * S;

    #[test]
    fn the_wall_clock_is_now_and_a_forward_step_is_told() {
        let c = Clock::default();
        let read = |wall, mono| c.read_at(wall, mono);
        assert_eq!(
            read(T0, 0),
            Reading {
                now: T0,
                step: None
            }
        );
        assert_eq!(
            read(T0 + S, S),
            Reading {
                now: T0 + S,
                step: None
            }
        );
        // Within a second of the monotonic clock: drift, not a step.
        assert_eq!(read(T0 + 2 * S + S / 2, 2 * S).step, None);
        // An hour ahead of what passed: a step, by that much.
        let r = read(T0 + 3 * S + 3600 * S, 3 * S);
        assert_eq!(r.now, T0 + 3603 * S);
        assert!((3599 * S..=3600 * S).contains(&r.step.unwrap()), "{r:?}");
        // From there on, the stepped clock is the reference: no second step.
        assert_eq!(read(T0 + 3604 * S, 4 * S).step, None);
    }

    #[test]
    fn after_a_backward_step_time_runs_on_at_the_monotonic_rate() {
        let c = Clock::default();
        let read = |wall, mono| c.read_at(wall, mono);
        read(T0, 0);
        // The wall clock goes an hour back: now does not, and it keeps moving.
        assert_eq!(
            read(T0 - 3600 * S, S),
            Reading {
                now: T0 + S,
                step: None
            }
        );
        assert_eq!(read(T0 - 3599 * S, 2 * S).now, T0 + 2 * S);
        // The wall clock set right again is no step: it only caught up.
        assert_eq!(
            read(T0 + 3 * S, 3 * S),
            Reading {
                now: T0 + 3 * S,
                step: None
            }
        );
    }

    #[test]
    fn a_floor_ahead_of_the_wall_clock_holds_now_up_without_a_step() {
        let c = Clock::default();
        c.read_at(T0, 0);
        // The cluster's log last showed T0 + 5 s, on a faster clock than this node's.
        c.raise_at(T0 + 5 * S, T0 + S, S);
        assert_eq!(
            c.read_at(T0 + 2 * S, 2 * S),
            Reading {
                now: T0 + 6 * S,
                step: None
            }
        );
        // A floor behind the clock changes nothing.
        c.raise_at(T0, T0 + 3 * S, 3 * S);
        assert_eq!(c.read_at(T0 + 4 * S, 4 * S).now, T0 + 8 * S);
    }

    #[test]
    fn slewing_over_a_long_idle_spell_is_not_a_step() {
        let c = Clock::default();
        c.read_at(T0, 0);
        // Ten hours idle, the wall clock 400 µs a second ahead: 14.4 s, within the slew bound.
        let hours = 10 * 3600 * S;
        let r = c.read_at(T0 + hours + 10 * 3600 * 400_000, hours);
        assert_eq!(r.step, None);
    }
}
