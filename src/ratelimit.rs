//! What a listener does against a flood of connections (issue 40, item 9): a cap on those in
//! flight ([`Cap`]: one more is closed at once), and log lines that a peer can cause at will
//! (one per refused connection, per failed accept) written at most once per interval, each
//! telling how many were left out since the last one ([`RateLimited`]: 4,000 refused handshakes
//! were 4,000 WARN lines). The server's and the cluster's listeners share it, hence its place
//! beside `glob.rs`, below both.

use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a rate-limited line may be written.
pub const EVERY: Duration = Duration::from_secs(1);

/// One kind of log line, written at most once per [`EVERY`] (a `static` per call site).
#[derive(Debug, Default)]
pub struct RateLimited {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When a line was last written.
    last: Option<Instant>,
    /// Lines left out since.
    suppressed: u64,
}

/// How many lines were left out before the one written now; shows as ` (N more since the last
/// such line)`, or nothing when none were.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Suppressed(pub u64);

impl fmt::Display for Suppressed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, " ({n} more since the last such line)"),
        }
    }
}

impl RateLimited {
    /// A kind of line not written yet.
    pub const fn new() -> RateLimited {
        RateLimited {
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// Whether to write the line now (with how many were left out since the last one), or
    /// `None` to leave it out: one was written less than [`EVERY`] ago.
    pub fn allow(&self) -> Option<Suppressed> {
        self.allow_at(Instant::now())
    }

    fn allow_at(&self, now: Instant) -> Option<Suppressed> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.last.is_some_and(|last| now.duration_since(last) < EVERY) {
            s.suppressed += 1;
            return None;
        }
        s.last = Some(now);
        Some(Suppressed(std::mem::take(&mut s.suppressed)))
    }
}

/// A cap on a listener's connections in flight, its refusals logged as [`RateLimited`].
#[derive(Debug)]
pub struct Cap {
    slots: Arc<Semaphore>,
    max: usize,
    refusals: RateLimited,
    /// What the log calls the listener: `metrics port`, `cluster port (handshakes)`.
    what: &'static str,
}

impl Cap {
    /// At most `max` connections at once.
    pub fn new(max: usize, what: &'static str) -> Cap {
        Cap {
            slots: Arc::new(Semaphore::new(max)),
            max,
            refusals: RateLimited::new(),
            what,
        }
    }

    /// A slot for the connection from `from`, free again when dropped; `None` when all are
    /// taken (the refusal logged, rate-limited): the caller closes the connection at once.
    pub fn admit(&self, from: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let slot = self.slots.clone().try_acquire_owned().ok();
        if slot.is_none() {
            if let Some(more) = self.refusals.allow() {
                let (what, max) = (self.what, self.max);
                tracing::warn!("{what}: refused {from}: already {max} in flight{more}");
            }
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_then_the_count_of_those_left_out() {
        let r = RateLimited::new();
        let t0 = Instant::now();
        assert_eq!(r.allow_at(t0), Some(Suppressed(0)));
        for i in 1..=5 {
            assert_eq!(r.allow_at(t0 + Duration::from_millis(100 * i)), None);
        }
        let next = r.allow_at(t0 + EVERY).unwrap();
        assert_eq!(next, Suppressed(5));
        assert_eq!(next.to_string(), " (5 more since the last such line)");
        assert_eq!(Suppressed(0).to_string(), "");
        assert_eq!(r.allow_at(t0 + EVERY * 3), Some(Suppressed(0)));
    }

    #[test]
    fn a_cap_admits_up_to_its_max_and_frees_a_slot_when_dropped() {
        let cap = Cap::new(2, "test");
        let from = SocketAddr::from(([127, 0, 0, 1], 1));
        let (a, b) = (cap.admit(from), cap.admit(from));
        assert!(a.is_some() && b.is_some());
        assert!(cap.admit(from).is_none());
        drop(a);
        assert!(cap.admit(from).is_some());
    }
}
