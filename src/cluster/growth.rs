//! Snapshots by the log's size as well as by its count of entries.
//!
//! The log keeps every entry in memory until a snapshot lets it be purged (`purge.rs`), and
//! openraft asks for a snapshot by count only (`Timing::snapshot_after` entries): a node's
//! memory then grows with the size of its entries. At P=16 (50 clients, some 380 commands an
//! entry) the followers grew to 577 MiB in 12 s, and would have gone on to 10,000 entries
//! (some 22 s). So the log counts the bytes it appends, and once they pass
//! `Timing::snapshot_after_bytes` since the last ask, [`snapshot_by_size`] asks openraft for a
//! snapshot, as a single node replaces its snapshot once its shard log passes
//! `--snapshot-threshold`. openraft drops an ask that comes while a snapshot is being built, so
//! between two snapshots the log may grow by the bytes once more for each such ask. With 32 MiB
//! the same run's followers stayed at 220-250 MiB.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

use super::state::Raft;

/// The bytes appended to the log, and the mark past which the node is told.
#[derive(Debug)]
pub struct Growth {
    appended: AtomicU64,
    /// `appended` at which [`Growth::passed`] resolves; `u64::MAX` until armed.
    mark: AtomicU64,
    passed: Notify,
}

impl Default for Growth {
    fn default() -> Growth {
        Growth {
            appended: AtomicU64::new(0),
            mark: AtomicU64::new(u64::MAX),
            passed: Notify::new(),
        }
    }
}

impl Growth {
    /// Counts `bytes` appended; tells the waiter once they pass the mark.
    pub fn add(&self, bytes: u64) {
        let before = self.appended.fetch_add(bytes, Ordering::Relaxed);
        let mark = self.mark.load(Ordering::Relaxed);
        if before < mark && before.saturating_add(bytes) >= mark {
            // Kept until waited for, if nobody waits now.
            self.passed.notify_one();
        }
    }

    /// Sets the mark `bytes` past what was appended so far.
    fn arm(&self, bytes: u64) {
        let mark = self
            .appended
            .load(Ordering::Relaxed)
            .saturating_add(bytes.max(1));
        self.mark.store(mark, Ordering::SeqCst);
        // Only the runtime's thread appends today; were it another, an append passing the
        // mark between the load and the store would have seen the old one.
        if self.appended.load(Ordering::SeqCst) >= mark {
            self.passed.notify_one();
        }
    }

    /// Resolves once the appends passed the mark.
    async fn passed(&self) {
        self.passed.notified().await
    }
}

/// Asks `raft` for a snapshot each time its log grew by `bytes` since the last ask; it ends
/// with the node's runtime. A snapshot openraft made by count meanwhile does not move the
/// mark: at most one more snapshot than needed, where watching for it would wake this task at
/// every entry.
pub async fn snapshot_by_size(raft: Raft, growth: Arc<Growth>, bytes: u64) {
    loop {
        growth.arm(bytes);
        growth.passed().await;
        if raft.trigger().snapshot().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn the_waiter_is_told_once_the_appends_pass_the_mark_and_not_before() {
        let g = Growth::default();
        g.add(500);
        g.arm(1_000);
        g.add(999);
        let early = tokio::time::timeout(Duration::from_millis(20), g.passed()).await;
        assert!(early.is_err(), "told 1 byte short of the mark");
        // Told when nobody waits: kept for the next wait.
        g.add(1);
        let told = tokio::time::timeout(Duration::from_millis(20), g.passed()).await;
        assert!(told.is_ok(), "not told at the mark");
        // Once: past the mark, more appends tell nothing until it is set again.
        g.add(5_000);
        let again = tokio::time::timeout(Duration::from_millis(20), g.passed()).await;
        assert!(again.is_err(), "told twice for one mark");
        g.arm(100);
        g.add(100);
        let rearmed = tokio::time::timeout(Duration::from_millis(20), g.passed()).await;
        assert!(rearmed.is_ok(), "not told at the new mark");
    }
}
