//! `--maxmemory`: whether the process uses more memory than it may, for the commands that would
//! add state (flag `denyoom`). The resident set is read from /proc at most once a millisecond,
//! so that asking costs a clock read, and nothing is read when there is no limit.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// Redis's reply to a command refused past `maxmemory`.
pub const OOM: &str = "command not allowed when used memory > 'maxmemory'.";

/// The limit and what was last read of the memory in use.
#[derive(Debug)]
pub struct MemoryLimit {
    /// Bytes; 0 is no limit.
    limit: u64,
    started: Instant,
    /// The millisecond (since `started`) of the last reading.
    read_at: AtomicU64,
    over: AtomicBool,
}

impl MemoryLimit {
    /// A limit of `limit` bytes (0: none).
    pub fn new(limit: u64) -> MemoryLimit {
        MemoryLimit {
            limit,
            started: Instant::now(),
            read_at: AtomicU64::new(u64::MAX),
            over: AtomicBool::new(false),
        }
    }

    /// The limit, in bytes (0: none).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether the memory in use is above the limit (never, without one). The reading is at most
    /// a millisecond old: a burst of adds may pass the limit by what it adds in that time.
    pub fn exceeded(&self) -> bool {
        if self.limit == 0 {
            return false;
        }
        let ms = self.started.elapsed().as_millis() as u64;
        if self.read_at.swap(ms, Ordering::Relaxed) != ms {
            self.over.store(rss_bytes() > self.limit, Ordering::Relaxed);
        }
        self.over.load(Ordering::Relaxed)
    }
}

/// The process's resident set, in bytes (INFO's `used_memory`, and what the limit is held to:
/// the memory the machine actually gives the server).
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limit_is_never_exceeded_and_a_tiny_one_always() {
        assert!(!MemoryLimit::new(0).exceeded());
        let tiny = MemoryLimit::new(1);
        assert!(tiny.exceeded());
        assert!(
            tiny.exceeded(),
            "within the same millisecond: the reading is kept"
        );
        assert!(!MemoryLimit::new(u64::MAX).exceeded());
    }
}
