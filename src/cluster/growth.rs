//! The log's size in memory: snapshots by the bytes appended as well as by the count of
//! entries, and purges that keep a bounded size of entries before a snapshot.
//!
//! The log keeps every entry in memory until a snapshot lets openraft purge it, and openraft
//! asks for a snapshot by count only (`Timing::snapshot_after` entries): a node's memory then
//! grows with the size of its entries. At P=16 (50 clients, some 380 commands an entry) the
//! followers grew to 577 MiB in 12 s, and would have gone on to 10,000 entries (some 22 s).
//! So the log counts the bytes it appends, and once they pass `Timing::snapshot_after_bytes`
//! since the last ask, [`snapshot_by_size`] asks openraft for a snapshot, as a single node
//! replaces its snapshot once its shard log passes `--snapshot-threshold`. openraft drops an
//! ask that comes while a snapshot is being built, so between two snapshots the log may grow
//! by the bytes once more for each such ask. With 32 MiB the same run's followers stayed at
//! 220-250 MiB.
//!
//! After a snapshot, the log keeps the last `Timing::keep_after_snapshot` entries it holds (a
//! follower behind by no more catches up from the log; one further behind is sent the
//! snapshot). openraft counts them; at P=16 its 1,000 were some 40 MiB of frames, more than
//! the log grew between two snapshots. So [`purge_after_snapshot`] purges instead, after each
//! snapshot built here: all but those entries, and of them all but the last
//! `Timing::keep_after_snapshot_bytes` of frames.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use openraft::metrics::Metric;
use tokio::sync::{watch, Notify};

use super::log::LogStore;
use super::state::Raft;
use super::LogId;

/// How long a purge waits for openraft to take the snapshot it follows (it purges only what a
/// snapshot it knows of holds); openraft takes one a few ms after it was built.
const TAKEN_WAIT: Duration = Duration::from_secs(10);

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

/// What the log keeps of a snapshot's entries: the last `entries` of them, and of those at
/// most `bytes` of frames.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    pub entries: u64,
    pub bytes: u64,
}

/// After each snapshot `built` names, purges the log of what the snapshot holds but what
/// `keep` keeps; it ends with the node's runtime. The node's only purge policy: openraft's
/// own (a count) is turned off, as it could fall below a purge of ours still pending (a
/// leader waits for its replication streams), which openraft's debug assertions forbid.
pub async fn purge_after_snapshot(
    raft: Raft,
    log: LogStore,
    mut built: watch::Receiver<Option<LogId>>,
    keep: Keep,
) {
    while built.changed().await.is_ok() {
        let Some(last) = *built.borrow_and_update() else {
            continue;
        };
        let taken = raft
            .wait(Some(TAKEN_WAIT))
            .ge(Metric::Snapshot(Some(last)), "the snapshot built")
            .await;
        if taken.is_err() {
            continue;
        }
        let by_count = last.index.checked_sub(keep.entries);
        let by_size = log.purge_point(last.index, keep.bytes);
        if let Some(upto) = by_count.max(by_size) {
            if raft.trigger().purge_log(upto).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
