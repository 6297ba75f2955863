//! What the log keeps of a snapshot's entries, and the purges that drop the rest.
//!
//! After a snapshot, the log keeps the last `Timing::keep_after_snapshot` entries it holds (a
//! follower behind by no more catches up from the log; one further behind is sent the
//! snapshot), and of those at most `Timing::keep_after_snapshot_bytes` of frames. openraft
//! keeps a count of them only; at P=16 its 1,000 were some 40 MiB of frames (115 MiB of a
//! follower's memory), more than the log grew between two snapshots by size (`growth.rs`).
//! So [`purge_after_snapshot`] purges instead, after each snapshot built here; on a leader
//! the bytes count only once every follower has the entries they would drop. It is the
//! node's only purge policy: openraft's own is turned off, as it could fall below a purge of
//! ours still pending (a leader waits for its replication streams), which openraft's debug
//! assertions forbid.

use std::time::Duration;

use openraft::metrics::Metric;
use openraft::RaftMetrics;
use tokio::sync::watch;

use super::log::LogStore;
use super::state::Raft;
use super::{LogId, TypeConfig};

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
        let Ok(metrics) = taken else {
            continue;
        };
        let by_size = log.purge_point(last.index, keep.bytes);
        if let Some(upto) = purge_upto(last.index, keep, by_size, &metrics) {
            if raft.trigger().purge_log(upto).await.is_err() {
                return;
            }
        }
    }
}

/// Where to purge up to after the snapshot that ends at `last`: the entries `keep` counts
/// out, and those the bytes do (`by_size`, `LogStore::purge_point`) but, on a leader, none a
/// follower still lacks. One behind, or one being sent a snapshot (it goes on from the log
/// after it), catches up within the count kept, as before sizes were counted; one that is
/// down holds the log to that count until it is back.
fn purge_upto(
    last: u64,
    keep: Keep,
    by_size: Option<u64>,
    metrics: &RaftMetrics<TypeConfig>,
) -> Option<u64> {
    let by_count = last.checked_sub(keep.entries);
    let all_have = match &metrics.replication {
        // Not a leader: sends no entries.
        None => Some(u64::MAX),
        Some(followers) => followers
            .values()
            .map(|matched| matched.as_ref().map(|id| id.index))
            .min()
            .unwrap_or(Some(u64::MAX)),
    };
    let by_size = by_size.and_then(|upto| Some(upto.min(all_have?)));
    by_count.max(by_size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::tests::log_id;

    #[test]
    fn a_leader_purges_by_size_only_what_every_follower_has() {
        let keep = Keep {
            entries: 1_000,
            bytes: 4 << 20,
        };
        let mut m = RaftMetrics::<TypeConfig>::new_initial(1);
        // A follower: by size alone (below the count).
        assert_eq!(purge_upto(300, keep, Some(279), &m), Some(279));
        assert_eq!(purge_upto(300, keep, None, &m), None);
        let leader = |followers: &[(u64, Option<u64>)]| {
            let r = followers
                .iter()
                .map(|&(id, m)| (id, m.map(|i| log_id(1, i))));
            Some(r.collect())
        };
        m.replication = leader(&[(1, Some(300)), (2, Some(300)), (3, Some(290))]);
        assert_eq!(purge_upto(300, keep, Some(279), &m), Some(279));
        m.replication = leader(&[(1, Some(300)), (2, Some(250)), (3, Some(300))]);
        assert_eq!(purge_upto(300, keep, Some(279), &m), Some(250));
        m.replication = leader(&[(1, Some(300)), (2, None), (3, Some(300))]);
        assert_eq!(purge_upto(300, keep, Some(279), &m), None);
        // The count goes on whatever a follower lacks.
        m.replication = leader(&[(1, Some(1_500)), (2, Some(100)), (3, Some(1_500))]);
        assert_eq!(purge_upto(1_500, keep, Some(1_479), &m), Some(500));
        m.replication = leader(&[(1, Some(1_500)), (2, Some(1_490)), (3, Some(1_500))]);
        assert_eq!(purge_upto(1_500, keep, Some(1_479), &m), Some(1_479));
    }
}
