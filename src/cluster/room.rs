//! A full disk is waited out on a cluster node (SPEC §8's rule): a write of the Raft log or of
//! a snapshot that finds no room (`ENOSPC`, `EDQUOT`) is redone, whole, every [`RETRY`] until
//! it succeeds, and the node goes on from there. Failing it instead would stop openraft for
//! good: the node would stay up, out of the cluster, until restarted by hand. Any other failure
//! is final (the server then exits non-zero: `server/cluster.rs`).

use std::io;
use std::time::Duration;

use crate::persist::is_full;

/// How often a write that found no room is tried again: writes resume within this once there
/// is room.
pub const RETRY: Duration = Duration::from_millis(250);

/// One write's wait for room, logged once when it starts and once when it ends.
pub struct Waiting {
    what: &'static str,
    since: Option<std::time::Instant>,
}

impl Waiting {
    /// The wait of a write of `what`.
    pub fn of(what: &'static str) -> Waiting {
        Waiting { what, since: None }
    }

    /// Whether `result` is a lack of room to wait out; its end is logged.
    pub fn again<T>(&mut self, result: &io::Result<T>) -> bool {
        match result {
            Err(e) if is_full(e) => {
                if self.since.is_none() {
                    tracing::warn!(
                        "cluster: no room on the disk for {} ({e}): waiting for room, trying \
                         again every {RETRY:?}",
                        self.what
                    );
                    self.since = Some(std::time::Instant::now());
                }
                true
            }
            _ => {
                if let Some(since) = self.since.take() {
                    tracing::warn!(
                        "cluster: room on the disk again for {} after {:?}",
                        self.what,
                        since.elapsed()
                    );
                }
                false
            }
        }
    }
}

/// Runs `write` until it finds room (blocking: the Raft log's writer thread).
pub fn blocking<T>(what: &'static str, mut write: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    let mut waiting = Waiting::of(what);
    loop {
        let result = write();
        if !waiting.again(&result) {
            return result;
        }
        std::thread::sleep(RETRY);
    }
}
