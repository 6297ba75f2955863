//! What the log keeps of a snapshot's entries, and the purges that drop the rest.
//!
//! After a snapshot, the log keeps the last `Timing::keep_after_snapshot` entries it holds (a
//! follower behind by no more catches up from the log; one further behind is sent the
//! snapshot), and of those at most `Timing::keep_after_snapshot_bytes` of frames. openraft
//! keeps a count of them only; at P=16 its 1,000 were some 40 MiB of frames (115 MiB of a
//! follower's memory), more than the log grew between two snapshots by size (`growth.rs`).
//! So [`purge_after_snapshot`] purges instead, after each snapshot built here. It is the
//! node's only purge policy: openraft's own is turned off, as it could fall below a purge of
//! ours still pending (a leader waits for its replication streams), which openraft's debug
//! assertions forbid.

use std::time::Duration;

use openraft::metrics::Metric;
use tokio::sync::watch;

use super::log::LogStore;
use super::state::Raft;
use super::LogId;

/// How long a purge waits for openraft to take the snapshot it follows (it purges only what a
/// snapshot it knows of holds); openraft takes one a few ms after it was built.
const TAKEN_WAIT: Duration = Duration::from_secs(10);

/// What the log keeps of a snapshot's entries: the last `entries` of them, and of those at
/// most `bytes` of frames.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    pub entries: u64,
    pub bytes: u64,
}

/// After each snapshot `built` names, purges the log of what the snapshot holds but what
/// `keep` keeps; it ends with the node's runtime.
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
