//! The Raft storage against openraft's conformance suite, and what restarts, crashes and
//! damage leave of it; the state machine against the single-node replay; the log filter.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use futures_util::stream;
use openraft::storage::{
    RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::testing::log::{StoreBuilder, Suite};
use openraft::type_config::TypeConfigExt;
use openraft::StorageError;

use super::codec;
use super::entry::ShardEntry;
use super::log::{segment_first, LogStore, SECTOR, SEGMENT_BYTES};
use super::state::StateMachine;
use super::{Entry, LeaderId, LogId, Membership, Payload, Peer, TypeConfig, Vote};
use crate::engine::journal::Record;
use crate::engine::types::Limits;
use crate::engine::Shard;
use crate::persist::log::{frame_with, scan_with};
use crate::persist::snapshot;

/// A fresh folder, removed when dropped.
pub(super) struct TempDir(pub(super) PathBuf);

impl TempDir {
    pub(super) fn new(what: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("permitd-raft-{what}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Builds our log and state machine on a fresh folder, with segments of `segment_bytes`.
struct Builder {
    segment_bytes: u64,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<TypeConfig>> {
        let dir = TempDir::new("suite");
        let log = LogStore::open(&dir.0.join("log"), self.segment_bytes).expect("log opens");
        let sm = StateMachine::open(&dir.0.join("sm"), 2).expect("state machine opens");
        Ok((dir, log, sm))
    }
}

#[test]
fn openraft_storage_conformance_suite() {
    TypeConfig::run(async {
        Suite::test_all(Builder {
            segment_bytes: SEGMENT_BYTES,
        })
        .await
        .unwrap();
    });
}

#[test]
fn openraft_storage_conformance_suite_one_entry_per_segment() {
    // Every append, truncation and purge crosses segment files.
    TypeConfig::run(async {
        Suite::test_all(Builder { segment_bytes: 1 }).await.unwrap();
    });
}

pub(super) fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(LeaderId { term, node_id: 1 }, index)
}

/// The workload of the single-node tests, as the engine journaled it.
pub(super) fn journal() -> (Shard, Vec<Record>) {
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = crate::persist::tests::workload(&mut live);
    (live, journal)
}

/// The journal cut into entries of up to three records of `shard` from index `first` on, in
/// term `term`, each stamped one second after the last.
fn entries(records: &[Record], shard: u16, term: u64, first: u64) -> Vec<Entry> {
    records
        .chunks(3)
        .enumerate()
        .map(|(i, recs)| Entry {
            log_id: log_id(term, first + i as u64),
            payload: Payload::Normal(ShardEntry {
                shard,
                now: (i as i64 + 1) * 1_000_000_000,
                records: recs.to_vec(),
            }),
        })
        .collect()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    out.sort();
    out
}

async fn all(log: &mut LogStore) -> Vec<Entry> {
    log.try_get_log_entries(..).await.unwrap()
}

/// Writes `ents` to a new log in `dir` with segments of `segment_bytes`, closes it, and lists
/// its segments.
async fn written(dir: &Path, segment_bytes: u64, ents: &[Entry]) -> Vec<PathBuf> {
    let mut log = LogStore::open(dir, segment_bytes).unwrap();
    log.blocking_append(ents.to_vec()).await.unwrap();
    drop(log);
    segments(dir)
}

/// Empties `file`, as a segment made at a roll-over whose writes a crash lost.
fn empty(file: &Path) {
    let f = fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(0).unwrap();
}

#[test]
fn a_restart_keeps_the_vote_the_committed_id_and_the_entries() {
    TypeConfig::run(async {
        let dir = TempDir::new("reopen");
        let (_, journal) = journal();
        let ents = entries(&journal, 0, 1, 0);
        assert!(ents.len() >= 8, "{} entries", ents.len());
        let vote = Vote::new_committed(3, 2);
        {
            // Small segments: the entries span several files.
            let mut log = LogStore::open(&dir.0, 200).unwrap();
            log.blocking_append(ents[..3].to_vec()).await.unwrap();
            log.blocking_append(ents[3..].to_vec()).await.unwrap();
            log.save_vote(&vote).await.unwrap();
            log.save_committed(Some(ents[6].log_id)).await.unwrap();
            log.purge(ents[1].log_id).await.unwrap();
            // Dropped: what the calls made durable, and the committed id, written before the
            // writer thread ends.
        }
        assert!(segments(&dir.0).len() > 2, "{:?}", segments(&dir.0));
        let mut log = LogStore::open(&dir.0, 200).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(log.read_committed().await.unwrap(), Some(ents[6].log_id));
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(ents[1].log_id));
        assert_eq!(state.last_log_id, Some(ents.last().unwrap().log_id));
        assert_eq!(all(&mut log).await, ents[2..].to_vec());
    });
}

#[test]
fn the_committed_id_is_the_newest_written_and_a_torn_one_reads_as_none() {
    TypeConfig::run(async {
        let dir = TempDir::new("committed");
        let ents = entries(&journal().1, 0, 1, 0);
        let vote = Vote::new_committed(1, 1);
        let reopen = || LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
        {
            let mut log = reopen();
            log.blocking_append(ents.clone()).await.unwrap();
            log.save_vote(&vote).await.unwrap();
            // Many commits at once: at most one write is queued, and the newest id is written
            // when the store is dropped.
            for e in &ents {
                log.save_committed(Some(e.log_id)).await.unwrap();
            }
        }
        let last = ents.last().unwrap().log_id;
        assert_eq!(reopen().read_committed().await.unwrap(), Some(last));
        // A write a crash tore: no committed id (openraft finds it again), the rest is intact.
        let path = dir.0.join("committed");
        let mut bytes = fs::read(&path).unwrap();
        bytes[6] ^= 0x10;
        fs::write(&path, &bytes).unwrap();
        let mut log = reopen();
        assert_eq!(log.read_committed().await.unwrap(), None);
        assert_eq!(log.read_vote().await.unwrap(), Some(vote));
        assert_eq!(all(&mut log).await, ents);
        // And the next write replaces it whole.
        log.save_committed(Some(ents[0].log_id)).await.unwrap();
        drop(log);
        assert_eq!(
            reopen().read_committed().await.unwrap(),
            Some(ents[0].log_id)
        );
    });
}

#[test]
fn truncation_and_purge_survive_a_restart() {
    TypeConfig::run(async {
        let (_, journal) = journal();
        let ents = entries(&journal, 0, 1, 0);
        let n = ents.len() as u64;
        // One entry per segment (whole files go), and one segment (cut in place).
        for segment_bytes in [1, SEGMENT_BYTES] {
            let dir = TempDir::new("truncate");
            let files = |want: u64| {
                let got = segments(&dir.0).len() as u64;
                assert_eq!(got, if segment_bytes == 1 { want } else { 1 });
            };
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            log.blocking_append(ents.clone()).await.unwrap();
            files(n);
            // A new leader's entries replace the last three.
            log.truncate_after(Some(log_id(1, n - 4))).await.unwrap();
            files(n - 3);
            let newer: Vec<Entry> = (n - 3..n + 1)
                .map(|i| Entry {
                    log_id: log_id(2, i),
                    payload: Payload::Blank,
                })
                .collect();
            log.blocking_append(newer.clone()).await.unwrap();
            log.purge(log_id(1, 2)).await.unwrap();
            files(n + 1 - 3);
            drop(log);
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            let mut expected = ents[3..(n - 3) as usize].to_vec();
            expected.extend(newer);
            assert_eq!(all(&mut log).await, expected, "segments of {segment_bytes}");
            assert_eq!(
                log.get_log_state().await.unwrap().last_purged_log_id,
                Some(log_id(1, 2))
            );
        }
    });
}

#[test]
fn the_purge_point_keeps_at_most_the_bytes_asked_across_segments_and_restarts() {
    TypeConfig::run(async {
        let (_, journal) = journal();
        let ents = entries(&journal, 0, 1, 0);
        let size = |i: usize| {
            let mut out = BytesMut::new();
            frame_with(&mut out, |out| codec::entry(out, &ents[i]));
            out.len() as u64
        };
        // The frames of entries from..=to.
        let frames = |from: usize, to: usize| (from..=to).map(size).sum::<u64>();
        let last = ents.len() - 2;
        let dir = TempDir::new("purge-point");
        // Segments of a few entries each.
        let mut log = LogStore::open(&dir.0, 2 * size(0)).unwrap();
        log.blocking_append(ents.clone()).await.unwrap();
        for reopened in [false, true] {
            let at = |bytes| log.purge_point(last as u64, bytes);
            assert_eq!(at(0), Some(last as u64), "nothing kept");
            assert_eq!(at(size(last)), Some(last as u64 - 1), "reopened {reopened}");
            assert_eq!(at(size(last) - 1), Some(last as u64));
            assert_eq!(at(frames(0, last)), None, "everything up to last fits");
            assert_eq!(at(frames(1, last)), Some(0));
            // Five entries' worth across segment files: the sixth goes.
            assert_eq!(at(frames(last - 4, last)), Some(last as u64 - 5));
            assert_eq!(at(frames(last - 4, last) - 1), Some(last as u64 - 4));
            if !reopened {
                drop(log);
                // The last six entries span segment files.
                let firsts: Vec<u64> = segments(&dir.0)
                    .iter()
                    .filter_map(|p| segment_first(p.file_name()?.to_str()?))
                    .collect();
                let within = (last - 5) as u64..=last as u64;
                assert!(
                    firsts.iter().filter(|f| within.contains(f)).count() >= 2,
                    "{firsts:?}"
                );
                log = LogStore::open(&dir.0, 2 * size(0)).unwrap();
            }
        }
        // What is purged already is not purged again.
        log.purge(log_id(1, last as u64 - 5)).await.unwrap();
        assert_eq!(log.purge_point(last as u64, frames(last - 4, last)), None);
        assert_eq!(
            log.purge_point(last as u64, size(last)),
            Some(last as u64 - 1)
        );
    });
}

/// Where a segment's intact frames end (the zeros ahead follow them).
fn frames_end(seg: &Path) -> u64 {
    frame_ends(seg).last().map_or(0, |&end| end as u64)
}

#[test]
fn a_torn_final_entry_is_dropped_and_the_log_goes_on_after_it() {
    TypeConfig::run(async {
        // A crash during the last write left a prefix of its frame: the file ends inside it
        // (as a file system that had not grown it yet leaves it), or its last sector reads as
        // the zeros written ahead.
        for zeroed in [false, true] {
            let dir = TempDir::new("torn");
            let (_, journal) = journal();
            let ents = entries(&journal, 0, 1, 0);
            let seg = &written(&dir.0, SEGMENT_BYTES, &ents).await[0];
            let end = frames_end(seg);
            let file = fs::OpenOptions::new().write(true).open(seg).unwrap();
            match zeroed {
                true => {
                    let ends = frame_ends(seg);
                    let from = ((end - 1) / SECTOR as u64 * SECTOR as u64)
                        .max(ends[ends.len() - 2] as u64);
                    file.write_all_at(&vec![0; (end - from) as usize], from)
                        .unwrap()
                }
                false => file.set_len(end - 5).unwrap(),
            }
            let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
            let kept = ents.len() - 1;
            assert_eq!(
                all(&mut log).await,
                ents[..kept].to_vec(),
                "zeroed: {zeroed}"
            );
            // The torn bytes were cut: a new entry at that index reads back after a restart.
            let replaced = Entry {
                log_id: log_id(2, kept as u64),
                payload: Payload::Blank,
            };
            log.blocking_append([replaced.clone()]).await.unwrap();
            drop(log);
            let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
            let mut expected = ents[..kept].to_vec();
            expected.push(replaced);
            assert_eq!(all(&mut log).await, expected, "zeroed: {zeroed}");
        }
    });
}

/// Appends overwrite zeros written ahead of them; a restart reads those zeros as the end of
/// the log, not as a torn entry (which it would cut off), and only the last segment has any.
#[test]
fn the_zeros_ahead_end_the_log_and_only_the_last_segment_keeps_them() {
    TypeConfig::run(async {
        for segment_bytes in [SEGMENT_BYTES, 300] {
            let dir = TempDir::new("ahead");
            let (_, journal) = journal();
            let ents = entries(&journal, 0, 1, 0);
            let half = ents.len() / 2;
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            log.blocking_append(ents[..half].to_vec()).await.unwrap();
            drop(log);
            let last = segments(&dir.0).pop().unwrap();
            let size = fs::metadata(&last).unwrap().len();
            assert!(size > frames_end(&last), "zeros ahead of the frames");
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            assert_eq!(all(&mut log).await, ents[..half].to_vec());
            assert_eq!(fs::metadata(&last).unwrap().len(), size, "nothing cut");
            log.blocking_append(ents[half..].to_vec()).await.unwrap();
            drop(log);
            let mut segs = segments(&dir.0);
            let last = segs.pop().unwrap();
            assert!(fs::metadata(&last).unwrap().len() > frames_end(&last));
            assert_eq!(segs.is_empty(), segment_bytes == SEGMENT_BYTES);
            for seg in &segs {
                let len = fs::metadata(seg).unwrap().len();
                assert_eq!(len, frames_end(seg), "{} ends at its frames", seg.display());
            }
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            assert_eq!(all(&mut log).await, ents, "segments of {segment_bytes}");
        }
    });
}

/// Where each intact frame of a segment ends.
fn frame_ends(seg: &Path) -> Vec<usize> {
    scan_with(fs::read(seg).unwrap().into(), false, codec::dec_entry)
        .unwrap()
        .ends
}

/// Zeros the frame of `seg` that starts at `start` from there to the next sector boundary, as
/// a power loss that lost that sector of an unsynced write leaves it; a whole frame must be
/// left after the boundary.
fn lose_sector_at(seg: &Path, start: usize) {
    let ends = frame_ends(seg);
    let boundary = (start / SECTOR + 1) * SECTOR;
    assert!(
        ends[ends.len() - 2] >= boundary,
        "a whole frame after the lost sector"
    );
    let file = fs::OpenOptions::new().write(true).open(seg).unwrap();
    file.write_all_at(&vec![0; boundary - start], start as u64)
        .unwrap();
}

/// A power loss during a sync may keep some sectors of the appends it was writing and lose
/// others (they overwrite zeros written ahead, so the lost ones read as zeros): past the
/// entries known synced, the log ends at the first frame that lost one; before, the same
/// damage refuses to open.
#[test]
fn a_sector_lost_out_of_order_ends_the_log_unless_it_was_synced() {
    TypeConfig::run(async {
        for committed in [false, true] {
            let dir = TempDir::new("lost-sector");
            let ents = entries(&journal().1, 0, 1, 0);
            let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
            log.blocking_append(ents[..4].to_vec()).await.unwrap();
            log.blocking_append(ents[4..].to_vec()).await.unwrap();
            if committed {
                let last = ents.last().unwrap().log_id;
                log.save_committed(Some(last)).await.unwrap();
            }
            drop(log);
            let seg = &segments(&dir.0)[0];
            // The fifth entry's first sector lost; entries after the boundary kept.
            lose_sector_at(seg, frame_ends(seg)[3]);
            match LogStore::open(&dir.0, SEGMENT_BYTES) {
                Ok(mut log) => {
                    assert!(!committed, "a synced entry's damage must refuse to open");
                    assert_eq!(all(&mut log).await, ents[..4].to_vec());
                }
                Err(e) => {
                    assert!(committed, "{e}");
                    assert!(e.contains("corrupt Raft log entry at offset"), "{e}");
                }
            }
        }
    });
}

/// A power loss at a segment roll-over: the next segment's file exists, empty, while the sync
/// of the one before had kept some sectors of its last appends and lost others. The empty
/// file does not make the one before a middle segment: its lost sector still ends the log.
#[test]
fn a_sector_lost_before_an_empty_next_segment_ends_the_log() {
    TypeConfig::run(async {
        let dir = TempDir::new("rollover-lost");
        let ents = entries(&journal().1, 0, 1, 0);
        let segs = written(&dir.0, 1200, &ents).await;
        assert!(segs.len() >= 2, "{} segments", segs.len());
        let (before, last) = (&segs[segs.len() - 2], &segs[segs.len() - 1]);
        // Its second frame's first sector lost, a whole frame after the sector kept.
        lose_sector_at(before, frame_ends(before)[0]);
        empty(last);
        let first = segment_first(before.file_name().unwrap().to_str().unwrap()).unwrap();
        let mut log = LogStore::open(&dir.0, 1200).unwrap();
        assert_eq!(all(&mut log).await, ents[..first as usize + 1].to_vec());
        assert!(!last.exists(), "the empty segment was removed");
    });
}

/// A crash at a segment roll-over: the next segment's file exists, empty, before the last
/// entries of the one before were written. The empty file is dropped, not taken for a gap.
#[test]
fn an_empty_segment_made_before_its_predecessor_was_written_is_dropped() {
    TypeConfig::run(async {
        let dir = TempDir::new("rollover");
        let ents = entries(&journal().1, 0, 1, 0);
        let mut segs = written(&dir.0, 300, &ents).await;
        let last = segs.pop().unwrap();
        let before = segs.pop().unwrap();
        // The last entry of the one before and every entry of the last were never written.
        let kept = ents.len() - frame_ends(&last).len() - 1;
        let ends = frame_ends(&before);
        let file = fs::OpenOptions::new().write(true).open(&before).unwrap();
        file.set_len(ends[ends.len() - 2] as u64).unwrap();
        empty(&last);
        let mut log = LogStore::open(&dir.0, 300).unwrap();
        assert_eq!(all(&mut log).await, ents[..kept].to_vec());
        assert!(!last.exists(), "the empty segment was removed");
        // A segment that holds entries and does not follow is still a gap.
        drop(log);
        let dir = TempDir::new("gap-kept");
        let segs = written(&dir.0, 300, &ents).await;
        fs::remove_file(&segs[segs.len() - 2]).unwrap();
        let err = LogStore::open(&dir.0, 300).err().expect("refused");
        assert!(err.contains("gap"), "{err}");
    });
}

#[test]
fn damage_before_the_end_refuses_to_open() {
    TypeConfig::run(async {
        let write = |segment_bytes| async move {
            let dir = TempDir::new("corrupt");
            let mut log = LogStore::open(&dir.0, segment_bytes).unwrap();
            log.blocking_append(entries(&journal().1, 0, 1, 0))
                .await
                .unwrap();
            dir
        };
        // A flipped bit in an entry that intact ones follow.
        let dir = write(SEGMENT_BYTES).await;
        let seg = segments(&dir.0)[0].clone();
        let mut bytes = fs::read(&seg).unwrap();
        bytes[20] ^= 0x08;
        fs::write(&seg, &bytes).unwrap();
        let err = LogStore::open(&dir.0, SEGMENT_BYTES)
            .err()
            .expect("refused");
        assert!(
            err.contains(&seg.display().to_string())
                && err.contains("corrupt Raft log entry at offset 0"),
            "{err}"
        );
        // A flipped bit in the last entry, which the zeros written ahead follow: damage too.
        let dir = write(SEGMENT_BYTES).await;
        let seg = segments(&dir.0)[0].clone();
        let ends = frame_ends(&seg);
        let mut bytes = fs::read(&seg).unwrap();
        bytes[ends[ends.len() - 2] + 12] ^= 0x08;
        fs::write(&seg, &bytes).unwrap();
        let err = LogStore::open(&dir.0, SEGMENT_BYTES)
            .err()
            .expect("refused");
        assert!(err.contains("corrupt Raft log entry"), "{err}");
        // A segment missing between others: a gap in the indexes.
        let dir = write(1).await;
        fs::remove_file(&segments(&dir.0)[2]).unwrap();
        let err = LogStore::open(&dir.0, 1).err().expect("refused");
        assert!(err.contains("gap"), "{err}");
        // A damaged meta file (the vote).
        let dir = write(SEGMENT_BYTES).await;
        let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
        log.save_vote(&Vote::new(1, 1)).await.unwrap();
        drop(log);
        let meta = dir.0.join("meta");
        let mut bytes = fs::read(&meta).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x01;
        fs::write(&meta, &bytes).unwrap();
        let err = LogStore::open(&dir.0, SEGMENT_BYTES)
            .err()
            .expect("refused");
        assert!(err.contains("corrupt Raft meta file"), "{err}");
    });
}

/// A shard's state in a snapshot folder, as bytes that compare states.
fn shard_state(dir: &Path, shard: usize) -> bytes::Bytes {
    let bytes = fs::read(dir.join(format!("shard-{shard}.snap"))).unwrap();
    let s = snapshot::decode(bytes.into()).unwrap();
    snapshot::to_bytes(&s.namespaces, s.hwm, 0)
}

#[test]
fn applied_entries_rebuild_the_state_the_single_node_replay_does() {
    TypeConfig::run(async {
        let dir = TempDir::new("apply");
        let (live, journal) = journal();
        let (nss, hwm) = live.state();
        let expected = snapshot::to_bytes(nss, hwm, 0);
        let empty = snapshot::to_bytes(&Default::default(), 0, 0);
        let voters = Membership::new_with_defaults(vec![[1, 2, 3].into()], []);
        let mut ents = vec![
            Entry {
                log_id: log_id(1, 0),
                payload: Payload::Membership(voters.clone()),
            },
            Entry {
                log_id: log_id(1, 1),
                payload: Payload::Blank,
            },
        ];
        ents.extend(entries(&journal, 1, 1, 2));
        let last = ents.last().unwrap().log_id;
        let mut sm = StateMachine::open(&dir.0.join("a"), 2).unwrap();
        sm.apply(stream::iter(ents.into_iter().map(|e| Ok((e, None)))))
            .await
            .unwrap();
        let (applied, membership) = sm.applied_state().await.unwrap();
        assert_eq!(applied, Some(last));
        assert_eq!(membership.membership(), &voters);
        assert_eq!(membership.log_id(), &Some(log_id(1, 0)));
        let snap = sm.build_snapshot().await.unwrap();
        assert_eq!(snap.meta.last_log_id, Some(last));
        assert_eq!(shard_state(&snap.snapshot.dir, 1), expected);
        assert_eq!(shard_state(&snap.snapshot.dir, 0), empty);

        // A restart comes back to the snapshot: state, applied id and membership.
        drop(sm);
        let mut again = StateMachine::open(&dir.0.join("a"), 2).unwrap();
        assert_eq!(
            again.applied_state().await.unwrap(),
            (Some(last), membership.clone())
        );
        let snap2 = again.build_snapshot().await.unwrap();
        assert_eq!(shard_state(&snap2.snapshot.dir, 1), expected);
        assert!(
            !snap.snapshot.dir.exists(),
            "the replaced snapshot is removed"
        );

        // Another node installs it and holds the same state.
        let mut other = StateMachine::open(&dir.0.join("b"), 2).unwrap();
        other
            .install_snapshot(&snap2.meta, snap2.snapshot.clone())
            .await
            .unwrap();
        assert_eq!(
            other.applied_state().await.unwrap(),
            (Some(last), membership)
        );
        let current = other.get_current_snapshot().await.unwrap().unwrap();
        assert_ne!(current.snapshot.dir, snap2.snapshot.dir, "its own copy");
        assert_eq!(shard_state(&current.snapshot.dir, 1), expected);

        // A node with another shard count refuses it.
        let mut three = StateMachine::open(&dir.0.join("c"), 3).unwrap();
        let err = three
            .install_snapshot(&snap2.meta, snap2.snapshot)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("same --shards"), "{err}");
    });
}

#[test]
fn an_entry_the_state_does_not_fit_stops_the_apply() {
    TypeConfig::run(async {
        let dir = TempDir::new("misfit");
        let (_, journal) = journal();
        let mut sm = StateMachine::open(&dir.0, 2).unwrap();
        // For a shard this node does not run.
        let wrong_shard = entries(&journal[..1], 5, 1, 0);
        let err = sm
            .apply(stream::iter(wrong_shard.into_iter().map(|e| Ok((e, None)))))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("shard 5"), "{err}");
        // A record about a namespace the state does not hold (its creation was skipped).
        let orphan = entries(&journal[1..2], 0, 1, 0);
        let err = sm
            .apply(stream::iter(orphan.into_iter().map(|e| Ok((e, None)))))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
        assert_eq!(sm.applied_state().await.unwrap().0, None);
    });
}

#[test]
fn a_membership_with_addresses_survives_the_log() {
    TypeConfig::run(async {
        let dir = TempDir::new("members");
        let peer = |n: u16| Peer {
            raft_addr: format!("127.0.0.1:{}", 17000 + n),
            client_addr: format!("127.0.0.1:{}", 7000 + n),
        };
        let m = Membership::new(
            vec![[1, 2].into(), [2, 3].into()],
            [(1, peer(1)), (2, peer(2)), (3, peer(3))]
                .into_iter()
                .collect::<std::collections::BTreeMap<_, _>>(),
        )
        .unwrap();
        let ent = Entry {
            log_id: log_id(4, 0),
            payload: Payload::Membership(m),
        };
        let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
        log.blocking_append([ent.clone()]).await.unwrap();
        drop(log);
        let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
        assert_eq!(all(&mut log).await, vec![ent]);
    });
}

#[test]
fn the_log_filter_quietens_openraft_retries_unless_it_is_named() {
    for level in ["info", "debug", "warn,permitd=trace"] {
        let filter = super::log_filter(level);
        assert!(filter.starts_with(level), "{filter}");
        assert!(
            filter.contains("openraft::core::heartbeat=error"),
            "{filter}"
        );
        assert!(
            tracing_subscriber::EnvFilter::try_new(&filter).is_ok(),
            "{filter}"
        );
    }
    assert_eq!(super::log_filter("openraft=debug"), "openraft=debug");
    assert_eq!(super::log_filter("off"), "off");
}
