//! The Raft log on our own files (replication.md §4.10): entries in append-only segments of
//! `persist::log`'s frames, a `meta` file with the vote and the purged id, and a `committed`
//! file with the committed id.
//!
//! In the log's folder: `meta` (one frame, replaced atomically and fsynced), `committed` (one
//! frame padded to [`COMMITTED_BYTES`], overwritten in place and fdatasync'd) and
//! `log-<first index>.seg` (frames, one entry each, consecutive indexes; the last segment then
//! has zeros written ahead, which its next appends overwrite: `writer.rs` says why). An append
//! is written and fdatasync'd on the writer thread before its `IOFlushed` fires; the vote,
//! truncations and purges are on disk before their calls return.
//!
//! The committed id is written in its turn on the writer but not waited for: openraft applies
//! a commit only once it was saved, and with the meta's fsync, rename and folder fsync awaited
//! the leader's apply started 2.7-3.3 ms after the quorum had answered (measured on this 2-core
//! box; hand-off p50 5.6 ms before, 3.6 ms after). An older committed id is always a true one,
//! which openraft then advances again, so a crash that loses the last write, or tears it (the
//! file then reads as no committed id), only makes the restart apply less at first. A write is
//! queued at most every [`COMMITTED_EVERY`]: one per commit on every node had cost the 3-node
//! cluster 10-25% of its P=1 throughput and most of its hand-off p99 (4.6-12.5 ms, 1.9-4.8 ms
//! without; measured, runs alternating). Each writes the id it was queued for, never a newer
//! one: a follower is told of a commit once its entries are queued, not yet written, and a
//! newer id could reach the disk ahead of its entries (a restart would then look for entries
//! the log never got; the review found it). The newest id is written when the store is dropped,
//! after everything queued before.
//!
//! At open, zeros after a segment's last frame are its end. A frame a crash cut short (the file
//! ends inside it, or a sector of it reads as zeros: [`cut_short`]) past the committed id on
//! disk ends the log and is cut off: nothing after it was acknowledged, since callbacks fire
//! only after the sync of every earlier write. In the last segment holding anything (empty
//! ones after it were made at a roll-over before its sync) this holds with intact frames after
//! it too: a power loss during a sync may keep some sectors of the appends over the zeros ahead
//! and lose others. An empty last segment that does not follow is dropped. Any other bad frame
//! (a flipped bit, or any damage before the committed id), or a gap between indexes, refuses to
//! open, as a shard log's corruption stops the start. Every segment is synced at open: what a
//! process killed before its sync left in the page cache is served from then on.
//!
//! Every entry after the purged one is also kept in memory, where readers take it from; the
//! purges after each snapshot bound it: snapshots come by count and by the bytes appended, and
//! the entries kept of one by count and by bytes (`growth.rs`, `purge.rs`).

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::RangeBounds;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};

use super::codec;
use super::growth::Growth;
use super::writer::{stopped, Append, Op, Writer};
use super::{Entry, LogId, TypeConfig, Vote};
use crate::persist::codec::{Dec, DecodeError, Enc};
use crate::persist::log::{frame_payload_len, frame_with, scan_with, single_frame, FRAME_HEADER};
use crate::persist::{sync_dir, truncate_log, write_file_synced};

/// A segment grows past this many bytes before the next append starts a new one.
pub const SEGMENT_BYTES: u64 = 64 << 20;

/// How far past its entries the last segment is zeroed: once less than half of it is left,
/// the next append writes this much more. An fdatasync with 1 MiB more to write took 1.6 ms
/// on this box, against 0.2 ms for a page: one slower group commit per MiB of log.
const ZEROS_AHEAD: u64 = 1 << 20;

/// The size of the `committed` file: its frame (at most 40 bytes) and zeros, so that each
/// write overwrites the same bytes and leaves none of a longer one behind.
const COMMITTED_BYTES: usize = 64;

/// How often a write of the committed id is queued at most.
const COMMITTED_EVERY: Duration = Duration::from_millis(100);

/// What the `meta` file holds.
#[derive(Debug, Clone, Default, PartialEq)]
struct Meta {
    vote: Option<Vote>,
    purged: Option<LogId>,
}

impl Meta {
    fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        frame_with(&mut out, |out| {
            let mut e = Enc(out);
            codec::opt_vote(&mut e, self.vote.as_ref());
            codec::opt_log_id(&mut e, self.purged.as_ref());
        });
        out.freeze()
    }

    fn decode(d: &mut Dec) -> Result<Meta, DecodeError> {
        Ok(Meta {
            vote: codec::dec_opt_vote(d)?,
            purged: codec::dec_opt_log_id(d)?,
        })
    }
}

/// The `committed` file's contents for `id`.
fn encode_committed(id: Option<&LogId>) -> Bytes {
    let mut out = BytesMut::new();
    frame_with(&mut out, |out| codec::opt_log_id(&mut Enc(out), id));
    debug_assert!(out.len() <= COMMITTED_BYTES, "a committed id fits its file");
    out.resize(COMMITTED_BYTES, 0);
    out.freeze()
}

/// The committed id the `committed` file holds: none when it is missing, empty or torn.
fn read_committed(path: &Path) -> Result<Option<LogId>, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    Ok(scan_with(Bytes::from(bytes), false, codec::dec_opt_log_id)
        .ok()
        .and_then(|s| s.records.into_iter().next())
        .flatten())
}

/// One segment file: its first index and where each of its entries' frames ends.
struct Segment {
    first: u64,
    path: PathBuf,
    file: Arc<File>,
    ends: Vec<u64>,
    /// The file's size once the writes queued are done: its entries, then the zeros written
    /// ahead of them (`writer::Append::zeros`; only the last segment keeps any).
    allocated: u64,
}

impl Segment {
    /// The index after its last entry.
    fn end(&self) -> u64 {
        self.first + self.ends.len() as u64
    }

    /// Its size.
    fn len(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("log-{first:020}.seg"))
}

/// The first index a segment's file name gives.
pub(super) fn segment_first(name: &str) -> Option<u64> {
    name.strip_prefix("log-")?
        .strip_suffix(".seg")?
        .parse()
        .ok()
}

struct Log {
    dir: PathBuf,
    segment_bytes: u64,
    meta: Meta,
    committed: Option<LogId>,
    /// When the last write of the committed id was queued.
    committed_queued: Option<Instant>,
    segments: Vec<Segment>,
    entries: BTreeMap<u64, Entry>,
}

impl Log {
    fn last_log_id(&self) -> Option<LogId> {
        match self.entries.last_key_value() {
            Some((_, e)) => Some(e.log_id),
            None => self.meta.purged,
        }
    }

    /// The write of the meta file as it is now.
    fn save_meta(&self) -> Op {
        let path = self.dir.join("meta");
        let bytes = self.meta.encode();
        Box::new(move || write_file_synced(&path, &bytes))
    }
}

/// An append's frames for one segment.
struct Part {
    seg_no: usize,
    /// The segment's size before them.
    base: u64,
    bytes: BytesMut,
    /// The folder to sync with them, when the segment is new.
    new_in: Option<PathBuf>,
    /// The segment before, to cut to its entries first, when the segment is new.
    closes: Option<(Arc<File>, u64)>,
}

/// Resolves once everything queued before it on the writer is done.
type Barrier = tokio::sync::oneshot::Receiver<io::Result<()>>;

struct Shared {
    log: Mutex<Log>,
    writer: Writer,
    /// The `committed` file.
    committed: Arc<File>,
    /// The newest committed id's `committed` contents, written last when the store is dropped.
    newest: Mutex<Option<Bytes>>,
    /// The bytes appended, for snapshots by size (`growth.rs`).
    growth: Arc<Growth>,
}

impl Shared {
    /// Queues the write of `bytes` to the `committed` file (not waited for: the module's
    /// comment says why; a failed write fails every later one, as any failed write of the log
    /// does).
    fn write_committed(&self, bytes: Bytes) {
        let file = self.committed.clone();
        let write: Op =
            Box::new(move || file.write_all_at(&bytes, 0).and_then(|()| file.sync_data()));
        drop(self.writer.run(write));
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // After every write queued before, whose entries the newest id covers; the writer
        // drains its queue as it stops.
        if let Some(bytes) = lock(&self.newest).take() {
            self.write_committed(bytes);
        }
    }
}

/// The Raft log storage; clones share it (a clone is also its reader).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// Opens (or creates) the log in `dir`; a segment is closed once it passes
    /// `segment_bytes`. The error names the file, and the offset of a corrupt frame.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<LogStore, String> {
        let at = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
        fs::create_dir_all(dir).map_err(|e| at(dir, e))?;
        let meta = read_meta(&dir.join("meta"))?;
        let committed_path = dir.join("committed");
        let committed = read_committed(&committed_path)?;
        let committed_file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&committed_path)
            .map_err(|e| at(&committed_path, e))?;
        let mut firsts = Vec::new();
        for item in fs::read_dir(dir).map_err(|e| at(dir, e))? {
            let item = item.map_err(|e| at(dir, e))?;
            if let Some(first) = item.file_name().to_str().and_then(segment_first) {
                firsts.push(first);
            }
        }
        firsts.sort_unstable();
        let mut log = Log {
            dir: dir.to_path_buf(),
            segment_bytes,
            meta,
            committed,
            committed_queued: None,
            segments: Vec::new(),
            entries: BTreeMap::new(),
        };
        let mut files = Vec::with_capacity(firsts.len());
        for first in firsts {
            let path = segment_path(dir, first);
            let bytes = Bytes::from(fs::read(&path).map_err(|e| at(&path, e))?);
            files.push((first, path, bytes));
        }
        // The segments after the last one holding anything: made at a roll-over, their first
        // writes lost (a segment's file exists before the one before it is synced).
        let holding = files
            .iter()
            .rposition(|(_, _, b)| b.iter().any(|&b| b != 0));
        let synced = committed.map(|c| c.index);
        let mut torn = false;
        for (i, (first, path, bytes)) in files.into_iter().enumerate() {
            if torn {
                // After a torn frame: written by the same unfinished sync, never acknowledged.
                fs::remove_file(&path).map_err(|e| at(&path, e))?;
                continue;
            }
            let last = holding.is_none_or(|h| i >= h);
            torn = log.load_segment(first, path, bytes, last, synced)?;
        }
        sync_dir(dir).map_err(|e| at(dir, e))?;
        let writer = Writer::start().map_err(|e| format!("the Raft log's writer thread: {e}"))?;
        Ok(LogStore {
            shared: Arc::new(Shared {
                log: Mutex::new(log),
                writer,
                committed: Arc::new(committed_file),
                newest: Mutex::default(),
                growth: Arc::default(),
            }),
        })
    }

    /// What the log appends, counted in bytes (`growth.rs`).
    pub fn growth(&self) -> Arc<Growth> {
        self.shared.growth.clone()
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        lock(&self.shared.log)
    }

    /// The index to purge up to so that the entries kept up to `last` (those after it) take at
    /// most `bytes` of frames; `None` when those not purged yet already do.
    pub fn purge_point(&self, last: u64, bytes: u64) -> Option<u64> {
        let log = self.log();
        let purged = log.meta.purged.map(|id| id.index);
        let mut kept = 0;
        for seg in log.segments.iter().rev().filter(|s| s.first <= last) {
            for index in (seg.first..seg.end().min(last + 1)).rev() {
                if purged.is_some_and(|p| index <= p) {
                    return None;
                }
                let j = (index - seg.first) as usize;
                let start = if j == 0 { 0 } else { seg.ends[j - 1] };
                kept += seg.ends[j] - start;
                if kept > bytes {
                    return Some(index);
                }
            }
        }
        None
    }

    /// Puts `entries` in memory and queues their frames. An append of nothing hands back its
    /// callback with a barrier to wait for: it is flushed once what was queued before is.
    #[allow(clippy::type_complexity)]
    fn queue_append(
        &self,
        log: &mut Log,
        entries: impl IntoIterator<Item = Entry>,
        done: IOFlushed<TypeConfig>,
    ) -> io::Result<Option<(IOFlushed<TypeConfig>, Barrier)>> {
        // Frames for one segment at a time: an append that fills one goes on in a new one.
        let mut parts: Vec<Part> = Vec::new();
        for ent in entries {
            let next = log.last_log_id().map_or(0, |id| id.index + 1);
            if ent.log_id.index != next && log.last_log_id().is_some() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "appending entry {} where entry {next} is next would leave a gap",
                        ent.log_id.index
                    ),
                ));
            }
            let index = ent.log_id.index;
            let full = log
                .segments
                .last()
                .is_none_or(|s| s.len() >= log.segment_bytes || s.end() != index);
            // The segment before is cut to its entries and synced before the next one gets any:
            // only the last segment keeps zeros, and a later segment's entries on disk mean the
            // earlier one's are whole (a power loss may lose an unsynced write's sectors in any
            // order: `cut_short`).
            let mut closes = None;
            if full {
                if let Some(prev) = log.segments.last_mut() {
                    prev.allocated = prev.len();
                    closes = Some((prev.file.clone(), prev.len()));
                }
                let path = segment_path(&log.dir, index);
                // Emptied: a file of that name left by a truncation holds older entries.
                let file = OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(true)
                    .open(&path)?;
                log.segments.push(Segment {
                    first: index,
                    path,
                    file: Arc::new(file),
                    ends: Vec::new(),
                    allocated: 0,
                });
            }
            let seg_no = log.segments.len() - 1;
            let seg = &mut log.segments[seg_no];
            if parts.last().is_none_or(|p| p.seg_no != seg_no) {
                parts.push(Part {
                    seg_no,
                    base: seg.len(),
                    bytes: BytesMut::new(),
                    new_in: full.then(|| log.dir.clone()),
                    closes,
                });
            }
            let part = parts.last_mut().expect("just pushed");
            frame_with(&mut part.bytes, |out| codec::entry(out, &ent));
            seg.ends.push(part.base + part.bytes.len() as u64);
            log.entries.insert(index, ent);
        }
        let Some(last) = parts.pop() else {
            return Ok(Some((done, self.shared.writer.run(Box::new(|| Ok(()))))));
        };
        let bytes = parts.iter().chain([&last]).map(|p| p.bytes.len() as u64);
        self.shared.growth.add(bytes.sum());
        // Only the last part tells: the writer syncs the earlier ones before it fires.
        for part in parts
            .into_iter()
            .map(|p| (p, IOFlushed::noop()))
            .chain([(last, done)])
        {
            let (p, callback) = part;
            if let Some((file, len)) = p.closes {
                drop(
                    self.shared
                        .writer
                        .run(Box::new(move || truncate_log(&file, len))),
                );
            }
            let open = p.seg_no + 1 == log.segments.len();
            let seg = &mut log.segments[p.seg_no];
            let end = p.base + p.bytes.len() as u64;
            // Zeros ahead of the last segment's entries only (the others were cut, or are).
            let zeros = (open && end + ZEROS_AHEAD / 2 > seg.allocated).then(|| {
                let to = end.next_multiple_of(ZEROS_AHEAD) + ZEROS_AHEAD;
                let from = seg.allocated.max(end);
                seg.allocated = to;
                from..to
            });
            let append = Append {
                file: seg.file.clone(),
                at: p.base,
                bytes: p.bytes.freeze(),
                zeros,
                new_in: p.new_in,
            };
            self.shared.writer.append(append, callback);
        }
        Ok(None)
    }

    /// Queues `op` on the writer and waits for it.
    async fn run(&self, op: Op) -> io::Result<()> {
        let done = self.shared.writer.run(op);
        done.await.unwrap_or_else(|_| Err(stopped()))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().expect("no panic while the log is locked")
}

/// Reads the meta file; none yet is the empty meta.
fn read_meta(path: &Path) -> Result<Meta, String> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Meta::default()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    single_frame(Bytes::from(bytes), Meta::decode).ok_or_else(|| {
        format!(
            "{}: corrupt Raft meta file (vote and purged id)",
            path.display()
        )
    })
}

impl Log {
    /// Loads one segment (its file's `bytes`), in order, and syncs it: what a process killed
    /// before its sync left in the page cache is served from now on. True when it ends the log
    /// (a torn frame, cut off, or a last segment that holds nothing and does not follow: what
    /// comes after was never acknowledged). `last`: no later segment holds anything; `synced`:
    /// the committed id read at open (its entries were synced before it was written).
    fn load_segment(
        &mut self,
        first: u64,
        path: PathBuf,
        bytes: Bytes,
        last: bool,
        synced: Option<u64>,
    ) -> Result<bool, String> {
        let at = |e: io::Error| format!("{}: {e}", path.display());
        let corrupt = |offset: usize| {
            format!(
                "{}: corrupt Raft log entry at offset {offset} (damaged after it was written \
                 whole, not cut short by a crash): refusing to open. Wipe this node and add it \
                 back under a new id (docs/design.md, \"Cluster mode\")",
                path.display(),
            )
        };
        let scan =
            scan_with(bytes.clone(), true, codec::dec_entry).map_err(|c| corrupt(c.offset))?;
        let gap = || {
            format!(
                "{}: the Raft log has a gap before it (a segment is missing): refusing to open",
                path.display()
            )
        };
        // Segments follow each other; the first reaches back to the purged entry, if any.
        let follows = match self.segments.last() {
            Some(prev) => first == prev.end(),
            None => self.meta.purged.is_none_or(|p| first <= p.index + 1),
        };
        if !follows && last && scan.records.is_empty() {
            // Made at a roll-over, before the segment before it had its last entries written.
            tracing::warn!(file = %path.display(), "dropped an empty last Raft log segment that does not follow the one before (crash at a segment roll-over)");
            fs::remove_file(&path).map_err(at)?;
            return Ok(true);
        }
        if !follows {
            return Err(gap());
        }
        for (i, ent) in scan.records.iter().enumerate() {
            if ent.log_id.index != first + i as u64 {
                return Err(gap());
            }
        }
        // A bad frame past the entries known synced may be a write a crash cut short; before
        // them it is damage. With intact frames after it, only in the last segment (a segment
        // is synced before the next one gets any entry).
        let unsynced = synced.is_none_or(|s| first + scan.records.len() as u64 > s);
        let cut = match scan.torn_at.or(scan.repaired_at) {
            None => None,
            // Nothing but zeros after the entries: the zeros written ahead of them, the end.
            Some(bad) if bytes[bad..].iter().all(|&b| b == 0) => None,
            Some(bad) if unsynced && (scan.torn_at.is_some() || last) && cut_short(&bytes, bad) => {
                Some(bad)
            }
            Some(bad) => return Err(corrupt(bad)),
        };
        let file = OpenOptions::new().write(true).open(&path).map_err(at)?;
        let end = scan.ends.last().map_or(0, |&e| e as u64);
        let allocated = match cut {
            Some(cut) => {
                tracing::warn!(file = %path.display(), offset = cut, "dropped a torn Raft log entry and everything after it (crash during a write)");
                truncate_log(&file, cut as u64).map_err(at)?;
                cut as u64
            }
            // Zeros ahead of a segment another follows: a kill -9 came before the roll-over
            // cut them. Cut now, so that only the last segment keeps any.
            None if !last && bytes.len() as u64 > end => {
                truncate_log(&file, end).map_err(at)?;
                end
            }
            None => {
                file.sync_data().map_err(at)?;
                bytes.len() as u64
            }
        };
        let purged = self.meta.purged.map_or(0, |p| p.index + 1);
        for ent in scan.records {
            if ent.log_id.index >= purged {
                self.entries.insert(ent.log_id.index, ent);
            }
        }
        self.segments.push(Segment {
            first,
            path,
            file: Arc::new(file),
            ends: scan.ends.iter().map(|&e| e as u64).collect(),
            allocated,
        });
        Ok(cut.is_some())
    }
}

/// The unit a disk writes whole or loses whole when the power goes.
pub(super) const SECTOR: usize = 512;

/// Whether the bad frame at `at` is a write a crash cut short rather than one damaged after it
/// was written whole: the file ends inside it (a segment that grew with its writes), or it
/// lost a sector, some sector's share of it (from `at` to the frame's end, or to the next
/// sector when its header is gone) reading as zeros. An append overwrites zeros written ahead,
/// so a crash before its sync may keep any of its sectors and lose the others, in any order,
/// and the lost ones read as those zeros. A flipped bit leaves no zeroed sector behind (a frame
/// starts with its magic byte, and no entry holds a sector of zeros), unless the few bytes of
/// the damaged frame past its last sector boundary happen to be zeros: that one reads as cut
/// short, and is dropped with a warning.
fn cut_short(bytes: &[u8], at: usize) -> bool {
    let Some(head) = bytes.get(at..at + FRAME_HEADER) else {
        return true;
    };
    let end = match frame_payload_len(head.try_into().expect("a header's length")) {
        Some(len) if at + FRAME_HEADER + len > bytes.len() => return true,
        Some(len) => at + FRAME_HEADER + len,
        None => (at / SECTOR + 1) * SECTOR,
    }
    .min(bytes.len());
    let mut from = at;
    while from < end {
        let to = ((from / SECTOR + 1) * SECTOR).min(end);
        if bytes[from..to].iter().all(|&b| b == 0) {
            return true;
        }
        from = to;
    }
    false
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, io::Error> {
        Ok(self
            .log()
            .entries
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, io::Error> {
        Ok(self.log().meta.vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let log = self.log();
        Ok(LogState {
            last_purged_log_id: log.meta.purged,
            last_log_id: log.last_log_id(),
        })
    }

    async fn get_log_reader(&mut self) -> LogStore {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), io::Error> {
        let op = {
            let mut log = self.log();
            log.meta.vote = Some(*vote);
            log.save_meta()
        };
        self.run(op).await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), io::Error> {
        // Under the log's lock, so that the newest id is the one left to write.
        let mut log = self.log();
        log.committed = committed;
        let bytes = encode_committed(committed.as_ref());
        *lock(&self.shared.newest) = Some(bytes.clone());
        if log
            .committed_queued
            .is_none_or(|at| at.elapsed() >= COMMITTED_EVERY)
        {
            log.committed_queued = Some(Instant::now());
            self.shared.write_committed(bytes);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, io::Error> {
        Ok(self.log().committed)
    }

    async fn append<I>(&mut self, entries: I, done: IOFlushed<TypeConfig>) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let flushed = {
            let mut log = self.log();
            self.queue_append(&mut log, entries, done)?
        };
        if let Some((done, rx)) = flushed {
            done.io_completed(rx.await.unwrap_or_else(|_| Err(stopped())));
        }
        Ok(())
    }

    async fn truncate_after(&mut self, last: Option<LogId>) -> Result<(), io::Error> {
        let op = {
            let mut log = self.log();
            let keep = last.map_or(0, |id| id.index + 1);
            log.entries.split_off(&keep);
            let mut gone = Vec::new();
            while log.segments.last().is_some_and(|s| s.first >= keep) {
                gone.push(log.segments.pop().expect("just checked").path);
            }
            let cut = log.segments.last_mut().and_then(|s| {
                let kept = (keep - s.first) as usize;
                (kept < s.ends.len()).then(|| {
                    s.ends.truncate(kept);
                    s.allocated = s.len();
                    (s.file.clone(), s.len())
                })
            });
            let dir = log.dir.clone();
            // From the end backward, so that a crash midway leaves no gap.
            Box::new(move || {
                remove_all(&gone)?;
                sync_dir(&dir)?;
                match &cut {
                    Some((file, len)) => truncate_log(file, *len),
                    None => Ok(()),
                }
            }) as Op
        };
        self.run(op).await
    }

    async fn purge(&mut self, upto: LogId) -> Result<(), io::Error> {
        let (meta, remove) = {
            let mut log = self.log();
            log.meta.purged = Some(upto);
            log.entries = log.entries.split_off(&(upto.index + 1));
            let whole = log
                .segments
                .iter()
                .take_while(|s| s.end() <= upto.index + 1)
                .count();
            let gone: Vec<PathBuf> = log.segments.drain(..whole).map(|s| s.path).collect();
            let dir = log.dir.clone();
            let remove: Op = Box::new(move || {
                remove_all(&gone)?;
                sync_dir(&dir)
            });
            (log.save_meta(), remove)
        };
        // The purged id first: with the files gone before it, a restart would see a gap.
        let saved = self.shared.writer.run(meta);
        let removed = self.shared.writer.run(remove);
        saved.await.unwrap_or_else(|_| Err(stopped()))?;
        removed.await.unwrap_or_else(|_| Err(stopped()))
    }
}

/// Removes the segment files `gone`; one already gone is fine (an operation that found no
/// room is run again whole: `room.rs`).
fn remove_all(gone: &[PathBuf]) -> io::Result<()> {
    for path in gone {
        match fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use openraft::storage::RaftLogStorageExt;
    use openraft::type_config::TypeConfigExt;

    use super::*;
    use crate::cluster::tests::{log_id, TempDir};
    use crate::cluster::Payload;

    fn blank(range: std::ops::Range<u64>) -> Vec<Entry> {
        range
            .map(|index| Entry {
                log_id: log_id(1, index),
                payload: Payload::Blank,
            })
            .collect()
    }

    /// Holds the writer thread until the sender is dropped or sends.
    fn hold(log: &LogStore) -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        drop(log.shared.writer.run(Box::new(move || {
            let _ = rx.recv();
            Ok(())
        })));
        tx
    }

    /// A follower hears of a commit once its entries are queued: the committed id on disk must
    /// never run ahead of the entries on disk, whatever a crash interrupts.
    #[test]
    fn the_committed_id_on_disk_never_runs_ahead_of_the_entries_on_disk() {
        TypeConfig::run(async {
            let (dir, crashed) = (TempDir::new("ahead"), TempDir::new("ahead-crash"));
            let mut log = LogStore::open(&dir.0, SEGMENT_BYTES).unwrap();
            let ents = blank(0..6);
            log.blocking_append(ents[..3].to_vec()).await.unwrap();
            let first = hold(&log);
            log.save_committed(Some(ents[1].log_id)).await.unwrap();
            // The committed write ran; the next job waits.
            let second = hold(&log);
            log.append(ents[3..].to_vec(), IOFlushed::noop())
                .await
                .unwrap();
            log.save_committed(Some(ents[5].log_id)).await.unwrap();
            first.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(200));
            // A kill -9 now: the files as they are.
            for f in fs::read_dir(&dir.0).unwrap() {
                let f = f.unwrap();
                fs::copy(f.path(), crashed.0.join(f.file_name())).unwrap();
            }
            drop(second);
            let mut reopened = LogStore::open(&crashed.0, SEGMENT_BYTES).unwrap();
            let committed = reopened.read_committed().await.unwrap();
            let last = reopened.get_log_state().await.unwrap().last_log_id;
            assert!(
                committed <= last,
                "committed {committed:?} past the log's end {last:?}"
            );
            assert_eq!(committed, Some(ents[1].log_id));
        });
    }
}
