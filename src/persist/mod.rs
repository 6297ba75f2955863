//! Durability (SPEC §8): a per-shard append-only log with group commit, snapshots, and the
//! start-up load that replays them (re-sharding when `--shards` changed).
//!
//! Layout in `--dir`: `MANIFEST` names the current generation and its shard count; the
//! generation's folder `gen-G/` holds `shard-I.snap` and `shard-I.log` per shard. Each start
//! loads generation G, then writes generation G+1 (one fresh snapshot per new shard), switches
//! `MANIFEST` to it atomically and removes G. A crash at any point leaves either G or G+1 whole.
//! When G+1 cannot be written for lack of room, the start goes on with G (same shard count).
//!
//! Lack of room (`ENOSPC`, `EDQUOT`) on a write is told apart from every other failure
//! ([`WriteError`]): the server survives the first and rolls its changes back, and stops on
//! the others, as on any failed fsync, after which a file's state is unknown (SPEC §8).

pub mod codec;
pub mod lock;
pub mod log;
pub mod snapshot;

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::engine::journal::{apply, Record};
use crate::engine::route::shard_for;
use crate::engine::state::Namespace;
use crate::engine::types::{FencingToken, Name};
use snapshot::Piece;

/// When the log is flushed to disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Fsync {
    /// Replies wait until their changes are on disk (fdatasync per group commit).
    Always,
    /// Written at once, fdatasync'd about once a second: a power loss may lose ~1 s of changes.
    Everysec,
    /// Written at once, flushed when the OS decides: a power loss may lose ~30 s of changes.
    No,
}

impl Fsync {
    /// The option's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Fsync::Always => "always",
            Fsync::Everysec => "everysec",
            Fsync::No => "no",
        }
    }
}

/// One new shard's restored state.
#[allow(missing_docs)]
pub struct ShardState {
    pub namespaces: BTreeMap<Name, Namespace>,
    /// Fencing-token high-water mark (the maximum over all old shards).
    pub hwm: FencingToken,
    /// The last LSN in the shard's files: 0 in a new generation; in an old one kept for lack of
    /// room, new records follow it (replay skips those at or below its snapshot's LSN).
    pub lsn: u64,
    /// Why the shard starts refusing changes: the data directory had no room for the new
    /// generation.
    pub full: Option<std::io::Error>,
}

/// What start-up loaded.
pub struct Loaded {
    /// One state per new shard.
    pub shards: Vec<ShardState>,
    /// The generation now in use (its folder).
    pub gen_dir: PathBuf,
    /// Log records replayed.
    pub replayed: u64,
}

fn manifest(dir: &Path) -> Result<Option<(u64, usize)>, String> {
    let path = dir.join("MANIFEST");
    let text = match fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut gen = None;
    let mut shards = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("generation", v)) => gen = v.trim().parse().ok(),
            Some(("shards", v)) => shards = v.trim().parse().ok(),
            _ => {}
        }
    }
    match (gen, shards) {
        (Some(g), Some(s)) => Ok(Some((g, s))),
        _ => Err(format!("{}: malformed manifest", path.display())),
    }
}

/// fsyncs a folder, so that the files created, renamed or removed in it stay so after a crash.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

fn gen_dir(dir: &Path, gen: u64) -> PathBuf {
    dir.join(format!("gen-{gen}"))
}

fn snap_path(gen_dir: &Path, shard: usize) -> PathBuf {
    gen_dir.join(format!("shard-{shard}.snap"))
}

fn log_path(gen_dir: &Path, shard: usize) -> PathBuf {
    gen_dir.join(format!("shard-{shard}.log"))
}

/// What loading one old shard found besides its state.
struct ShardFiles {
    /// Log records replayed.
    replayed: u64,
    /// The last LSN in its snapshot and log.
    lsn: u64,
    /// Where the log's intact records end (a torn or cut tail starts there).
    log_end: u64,
}

/// Reads a file that MANIFEST names. A missing one is an error, never an empty file: the start
/// would otherwise write a new generation without its data and remove the old one.
/// `named` says who names it (`MANIFEST names generation 3 with 2 shards`).
fn read_named(path: &Path, named: &str) -> Result<Vec<u8>, String> {
    fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            format!(
                "{} is missing, but {named}: refusing to start without its data. Put the file \
                 back (from a backup: docs/operations.md)",
                path.display()
            )
        } else {
            format!("{}: {e}", path.display())
        }
    })
}

/// Loads one old shard: its snapshot, then the log records after it.
fn load_shard(
    gdir: &Path,
    (named, shard): (&str, usize),
    repair: bool,
    into: &mut BTreeMap<Name, Namespace>,
    hwm: &mut FencingToken,
) -> Result<ShardFiles, String> {
    let sp = snap_path(gdir, shard);
    let snap = snapshot::decode(Bytes::from(read_named(&sp, named)?)).map_err(|e| {
        format!(
            "{}: corrupt snapshot: {e}. The log cannot rebuild it (it holds only the changes \
             after the snapshot). Restore the data directory from a backup, or move it aside to \
             start empty (docs/operations.md)",
            sp.display()
        )
    })?;
    *hwm = (*hwm).max(snap.hwm);
    into.extend(snap.namespaces);
    let lp = log_path(gdir, shard);
    let bytes = Bytes::from(read_named(&lp, named)?);
    let size = bytes.len() as u64;
    let scan = log::scan(bytes, repair).map_err(|c| {
        format!(
            "{}: corrupt record at offset {} (damaged after it was written whole, not cut short by \
             a crash); start with --repair-log to truncate the log there, losing the records \
             from that offset on (docs/operations.md)",
            lp.display(),
            c.offset
        )
    })?;
    if let Some(at) = scan.torn_at {
        tracing::warn!(file = %lp.display(), offset = at, "dropped a torn final log record (crash during a write)");
    }
    if let Some(at) = scan.repaired_at {
        tracing::warn!(file = %lp.display(), offset = at, "--repair-log: truncated the log at a corrupt record");
    }
    let log_end = scan
        .torn_at
        .or(scan.repaired_at)
        .map_or(size, |at| at as u64);
    let mut files = ShardFiles {
        replayed: 0,
        lsn: snap.lsn,
        log_end,
    };
    for (lsn, recs) in scan.records {
        files.lsn = files.lsn.max(lsn);
        if lsn <= snap.lsn {
            continue;
        }
        for rec in recs {
            apply(into, hwm, rec).map_err(|e| format!("{}: lsn {lsn}: {}", lp.display(), e.0))?;
            files.replayed += 1;
        }
    }
    Ok(files)
}

/// The state of shard `shard` that is on disk in generation folder `gdir` (the server's own
/// files, after a failed write was cut off them): what a roll-back returns to.
pub fn load_saved(
    gdir: &Path,
    shard: usize,
) -> Result<(BTreeMap<Name, Namespace>, FencingToken), String> {
    let (mut namespaces, mut hwm) = (BTreeMap::new(), 0);
    let named = "the server wrote it";
    load_shard(gdir, (named, shard), false, &mut namespaces, &mut hwm)?;
    Ok((namespaces, hwm))
}

/// Loads the current generation from `dir`, spreads it over `shards` new shards, and makes a
/// new generation of it on disk. Without room for the new generation, it goes on with the
/// current one when the shard count is the same, its shards refusing changes at first.
pub fn load(dir: &Path, shards: usize, repair: bool) -> Result<Loaded, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (old_gen, old_shards) = manifest(dir)?.unwrap_or((0, 0));
    let old_dir = gen_dir(dir, old_gen);
    if old_shards > 0 && !old_dir.is_dir() {
        return Err(format!(
            "{} is missing, but MANIFEST names generation {old_gen} with {old_shards} shards: \
             refusing to start without its data. Put it back (from a backup: docs/operations.md)",
            old_dir.display()
        ));
    }
    let mut all = BTreeMap::new();
    let mut hwm = 0;
    let mut replayed = 0;
    let mut old = Vec::with_capacity(old_shards);
    let named = format!("MANIFEST names generation {old_gen} with {old_shards} shards");
    for i in 0..old_shards {
        let files = load_shard(&old_dir, (&named, i), repair, &mut all, &mut hwm)?;
        replayed += files.replayed;
        old.push(files);
    }
    let mut states: Vec<ShardState> = (0..shards)
        .map(|_| ShardState {
            namespaces: BTreeMap::new(),
            hwm,
            lsn: 0,
            full: None,
        })
        .collect();
    for (name, ns) in all {
        states[shard_for(&name, shards)].namespaces.insert(name, ns);
    }
    let new_gen = old_gen + 1;
    let new_dir = gen_dir(dir, new_gen);
    match write_generation(dir, new_gen, &new_dir, &states) {
        Ok(()) => {
            if old_shards > 0 {
                let _ = fs::remove_dir_all(&old_dir);
            }
            Ok(Loaded {
                shards: states,
                gen_dir: new_dir,
                replayed,
            })
        }
        Err(WriteError::Full(e)) => {
            let _ = fs::remove_dir_all(&new_dir);
            if old_shards != shards {
                return Err(format!(
                    "{}: {e}: no room for the new generation, which re-sharding from {old_shards} \
                     to {shards} shards needs. Free some space, or start with --shards \
                     {old_shards} to serve the current one",
                    new_dir.display()
                ));
            }
            keep_generation(&old_dir, &old, &mut states, &e)?;
            tracing::warn!(dir = %dir.display(), error = %e, "no room for a new generation: going on with the current one, refusing changes until there is room");
            Ok(Loaded {
                shards: states,
                gen_dir: old_dir,
                replayed,
            })
        }
        Err(WriteError::Failed(e)) => Err(format!("{}: {e}", new_dir.display())),
    }
}

/// Writes generation `gen` in `gen_dir` (a snapshot and an empty log per shard) and switches
/// `MANIFEST` to it. `Full` only while `MANIFEST` still names the current generation.
fn write_generation(
    dir: &Path,
    gen: u64,
    gen_dir: &Path,
    states: &[ShardState],
) -> Result<(), WriteError> {
    let create = || -> std::io::Result<()> {
        if gen_dir.exists() {
            // Left by a start that crashed before switching the manifest: not in use.
            fs::remove_dir_all(gen_dir)?;
        }
        fs::create_dir_all(gen_dir)
    };
    create().map_err(WriteError::of_write)?;
    for (i, st) in states.iter().enumerate() {
        save_snapshot(&snap_path(gen_dir, i), &st.namespaces, st.hwm, 0)?;
        File::create(log_path(gen_dir, i))
            .and_then(|f| f.sync_all())
            .map_err(WriteError::of_write)?;
    }
    sync_dir(gen_dir).map_err(WriteError::of_write)?;
    let text = format!(
        "permitd-manifest 1\ngeneration {gen}\nshards {}\n",
        states.len()
    );
    replace_synced(&dir.join("MANIFEST"), |f| f.write_all(text.as_bytes()))
}

/// Readies the current generation to be written on (the new one had no room): each log loses
/// its torn or cut tail, which later records must not follow, and each shard continues its
/// LSNs and starts out refusing changes with `why`.
fn keep_generation(
    gdir: &Path,
    old: &[ShardFiles],
    states: &mut [ShardState],
    why: &std::io::Error,
) -> Result<(), String> {
    for (i, (files, st)) in old.iter().zip(states.iter_mut()).enumerate() {
        let lp = log_path(gdir, i);
        let cut = OpenOptions::new()
            .write(true)
            .open(&lp)
            .and_then(|f| truncate_log(&f, files.log_end));
        cut.map_err(|e| format!("{}: {e}", lp.display()))?;
        st.lsn = files.lsn;
        st.full = Some(std::io::Error::from_raw_os_error(
            why.raw_os_error().unwrap_or(libc::ENOSPC),
        ));
    }
    Ok(())
}

/// Why a write did not reach the disk.
#[derive(Debug)]
pub enum WriteError {
    /// The file system had no room (`ENOSPC`, `EDQUOT`) for a write: the files are as they
    /// were before it once its partial bytes are cut off (a log) or removed (a new file).
    Full(std::io::Error),
    /// Anything else, and every failed fsync: after one, a file's state is unknown.
    Failed(std::io::Error),
}

impl WriteError {
    /// A failed `write` (or create): `Full` when it lacked room.
    fn of_write(e: std::io::Error) -> WriteError {
        if is_full(&e) {
            WriteError::Full(e)
        } else {
            WriteError::Failed(e)
        }
    }

    /// The OS error underneath.
    pub fn io(&self) -> &std::io::Error {
        match self {
            WriteError::Full(e) | WriteError::Failed(e) => e,
        }
    }
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.io().fmt(f)
    }
}

/// Whether `e` says the file system has no room: no space left, or the user's quota spent
/// (by its kind too, which an error re-made to name its file keeps).
pub fn is_full(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
        || matches!(e.kind(), StorageFull | QuotaExceeded)
}

/// Writes `bytes` to `path` atomically: a temporary file, fsync, rename, directory fsync.
pub fn write_file_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_synced(path, |f| f.write_all(bytes)).map_err(|e| match e {
        WriteError::Full(e) | WriteError::Failed(e) => e,
    })
}

/// Replaces `path` atomically by what `fill` writes: a temporary file, fsync, rename,
/// directory fsync. Until the rename, a failure leaves `path` as it was and removes the
/// temporary file (it must not keep the room that was lacking); so a lack of room while
/// writing or syncing it is `Full`, even from the fsync: the file it concerns is gone.
fn replace_synced(
    path: &Path,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> Result<(), WriteError> {
    let tmp = path.with_extension("tmp");
    let written = File::create(&tmp).and_then(|mut f| {
        fill(&mut f)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(WriteError::of_write(e));
    }
    fs::rename(&tmp, path).map_err(WriteError::of_write)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent).map_err(WriteError::Failed)?;
    }
    Ok(())
}

/// Pieces of a snapshot on their way from the encoding thread to its writer. The bound keeps
/// a few MiB in flight: the encoder waits for the disk rather than buffer the whole state.
pub fn snapshot_channel() -> (SyncSender<Piece>, Receiver<Piece>) {
    std::sync::mpsc::sync_channel(4)
}

/// Writes a snapshot file from its pieces (blocking): room for the header, the body as it
/// arrives, then the header in its place. Fails, leaving `path` as it was, when the pieces end
/// without a header (the encoder stopped).
pub fn write_snapshot(
    path: &Path,
    pieces: impl IntoIterator<Item = Piece>,
) -> Result<(), WriteError> {
    replace_synced(path, |f| {
        f.write_all(&[0; snapshot::HEADER_LEN])?;
        for p in pieces {
            match p {
                Piece::Body(b) => f.write_all(&b)?,
                Piece::Header(h) => return f.write_all_at(&h, 0),
            }
        }
        Err(std::io::Error::other(
            "the snapshot's encoding stopped early",
        ))
    })
}

/// Encodes a snapshot on this thread while a scoped thread writes it (used at start-up).
pub fn save_snapshot(
    path: &Path,
    namespaces: &BTreeMap<Name, Namespace>,
    hwm: FencingToken,
    lsn: u64,
) -> Result<(), WriteError> {
    let (tx, rx) = snapshot_channel();
    std::thread::scope(|s| {
        let writer = s.spawn(|| write_snapshot(path, rx));
        snapshot::encode(namespaces, hwm, lsn, |p| tx.send(p).is_ok());
        drop(tx);
        writer.join().expect("the snapshot writer does not panic")
    })
}

/// Counters reported by INFO's `# Persistence`.
#[derive(Debug, Clone, Copy, Default)]
pub struct PersistStats {
    /// Wall-clock nanoseconds of the last completed fsync (0: none yet).
    pub last_fsync_at: i64,
    /// fsyncs done.
    pub fsyncs: u64,
    /// Bytes in the current log.
    pub log_bytes: u64,
    /// Snapshots written since start.
    pub snapshots: u64,
    /// Duration of the last snapshot, microseconds (serialize + write + sync).
    pub last_snapshot_us: u64,
    /// How long the last snapshot paused the shard (serializing), microseconds.
    pub last_snapshot_pause_us: u64,
    /// Whether the last write of the log failed (changes are refused until one succeeds).
    pub write_failing: bool,
    /// The OS error of the last failed write of the log (0: none since start).
    pub last_write_errno: i32,
    /// Whether the last snapshot failed (for lack of room: the previous one stays in use).
    pub snapshot_failing: bool,
}

/// The most room the pending batch keeps between batches (see [`Store::take`]).
const PENDING_KEEP: usize = 64 * 1024;

/// One shard's log writer: records are framed into a pending buffer as commands run; a flusher
/// writes each batch with one write (and one fdatasync under `always`).
pub struct Store {
    /// Flush policy.
    pub policy: Fsync,
    gen_dir: PathBuf,
    shard: usize,
    file: Arc<File>,
    pending: BytesMut,
    /// Cluster mode: what the shard proposes next as one Raft entry instead of framing it for
    /// its own log, which it then never writes.
    unproposed: Option<Unproposed>,
    /// Cluster mode: of the proposals taken and not known committed, those that carry
    /// changes, as (their first change's LSN, their last LSN), oldest first. The LSNs above
    /// the saved ones and below the first entry's first change are reads' only: replies that
    /// changed nothing and showed only what was saved.
    proposed_changes: VecDeque<(u64, u64)>,
    last_lsn: u64,
    /// The LSN up to which the log (or the snapshot) holds every record.
    saved_lsn: u64,
    /// Log size that triggers a snapshot.
    pub snapshot_threshold: u64,
    /// INFO counters. `log_bytes` is also where the log's saved records end.
    pub stats: PersistStats,
}

/// Cluster mode: the records of the next proposal, and whether replies that changed nothing
/// wait for it (a read is linearizable once a proposal made after it commits: SPEC §10).
#[derive(Default)]
struct Unproposed {
    records: Vec<Record>,
    read: bool,
    /// The LSN of its first change (a read's LSN may come before).
    first_change: Option<u64>,
}

/// A batch taken for writing.
#[allow(missing_docs)]
pub struct Batch {
    pub bytes: Bytes,
    /// LSN of the last record in it.
    pub lsn: u64,
}

impl Store {
    /// Opens shard `shard`'s log in the generation folder for appending; its last LSN is `lsn`.
    pub fn open(
        gen_dir: &Path,
        shard: usize,
        lsn: u64,
        policy: Fsync,
        snapshot_threshold: u64,
    ) -> std::io::Result<Store> {
        let path = log_path(gen_dir, shard);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(Store {
            policy,
            gen_dir: gen_dir.to_path_buf(),
            shard,
            file: Arc::new(file),
            pending: BytesMut::new(),
            unproposed: None,
            proposed_changes: VecDeque::new(),
            last_lsn: lsn,
            saved_lsn: lsn,
            snapshot_threshold,
            stats: PersistStats {
                log_bytes: size,
                ..PersistStats::default()
            },
        })
    }

    /// Frames the records of one change into the pending batch, as one frame under one new LSN
    /// (a crash keeps all of them or none); returns the LSN of the last change.
    pub fn append(&mut self, records: Vec<Record>) -> u64 {
        if !records.is_empty() {
            self.last_lsn += 1;
            match &mut self.unproposed {
                Some(u) => {
                    u.first_change.get_or_insert(self.last_lsn);
                    u.records.extend(records);
                }
                None => log::frame(self.last_lsn, &records, &mut self.pending),
            }
        }
        self.last_lsn
    }

    /// Cluster mode from now on: records are kept for [`Store::take_proposal`], and the log
    /// file is never written.
    pub fn propose_instead(&mut self) {
        self.unproposed = Some(Unproposed::default());
    }

    /// Cluster mode: a reply that changed nothing is about to be made; it is to wait for the
    /// next proposal (given an LSN of its own when none is pending).
    pub fn note_read(&mut self) {
        if let Some(u) = &mut self.unproposed {
            if u.records.is_empty() && !u.read {
                self.last_lsn += 1;
                u.read = true;
            }
        }
    }

    /// Cluster mode: the records to propose (maybe none, for reads alone) and the LSN the
    /// proposal covers; `None` when nothing waits.
    pub fn take_proposal(&mut self) -> Option<(Vec<Record>, u64)> {
        let u = self.unproposed.as_mut()?;
        if u.records.is_empty() && !u.read {
            return None;
        }
        let taken = std::mem::take(u);
        if let Some(first) = taken.first_change {
            self.proposed_changes.push_back((first, self.last_lsn));
        }
        Some((taken.records, self.last_lsn))
    }

    /// Cluster mode: a proposal up to `lsn` committed.
    pub fn committed(&mut self, lsn: u64) {
        self.saved_lsn = self.saved_lsn.max(lsn);
        while self
            .proposed_changes
            .front()
            .is_some_and(|&(_, last)| last <= lsn)
        {
            self.proposed_changes.pop_front();
        }
    }

    /// Cluster mode: the LSN of the first change not known committed, proposed or not; the
    /// replies up to the LSN before it changed nothing and showed only committed changes.
    pub fn first_unsaved_change(&self) -> Option<u64> {
        let next = self.unproposed.as_ref().and_then(|u| u.first_change);
        self.proposed_changes
            .front()
            .map(|&(first, _)| first)
            .or(next)
    }

    /// LSN of the last record appended.
    pub fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// The LSN up to which every record is on disk.
    pub fn saved_lsn(&self) -> u64 {
        self.saved_lsn
    }

    /// Whether records wait to be written (or, in cluster mode, proposed, maybe with no
    /// records: replies that changed nothing wait for a proposal).
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
            || self
                .unproposed
                .as_ref()
                .is_some_and(|u| u.read || !u.records.is_empty())
    }

    /// Takes the pending batch. The buffer's room is reused for the next batch, unless a burst
    /// of records grew it past [`PENDING_KEEP`]: then the batch takes the whole buffer, which
    /// is freed once written, so that a burst does not leave the log holding its peak.
    pub fn take(&mut self) -> Batch {
        let bytes = if self.pending.capacity() > PENDING_KEEP {
            std::mem::take(&mut self.pending)
        } else {
            self.pending.split()
        };
        Batch {
            bytes: bytes.freeze(),
            lsn: self.last_lsn,
        }
    }

    /// Puts a batch whose write failed back before what is pending, to be written again.
    pub fn untake(&mut self, batch: Batch) {
        let mut bytes = BytesMut::with_capacity(batch.bytes.len() + self.pending.len());
        bytes.extend_from_slice(&batch.bytes);
        bytes.extend_from_slice(&self.pending);
        self.pending = bytes;
    }

    /// Drops every pending record (a roll-back: they are not to be saved), and forgets the
    /// proposals in flight (their replies are answered by the roll-back). The LSNs they had are
    /// not handed out again.
    pub fn drop_pending(&mut self) {
        self.pending = BytesMut::new();
        if let Some(u) = &mut self.unproposed {
            *u = Unproposed::default();
        }
        self.proposed_changes.clear();
    }

    /// A batch of `len` bytes up to `lsn` is in the log now.
    pub fn written(&mut self, lsn: u64, len: u64) {
        self.stats.log_bytes += len;
        self.saved_lsn = self.saved_lsn.max(lsn);
    }

    /// A snapshot up to `lsn` is installed and the log emptied.
    pub fn snapshot_installed(&mut self, lsn: u64) {
        self.stats.log_bytes = 0;
        self.saved_lsn = self.saved_lsn.max(lsn);
    }

    /// The log file, for a blocking write or sync.
    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }

    /// Whether the log has grown past the snapshot threshold.
    pub fn wants_snapshot(&self) -> bool {
        self.stats.log_bytes >= self.snapshot_threshold
    }

    /// Where this shard's snapshot goes.
    pub fn snapshot_path(&self) -> PathBuf {
        snap_path(&self.gen_dir, self.shard)
    }

    /// The generation folder and shard index, to read the shard's saved state back.
    pub fn files(&self) -> (PathBuf, usize) {
        (self.gen_dir.clone(), self.shard)
    }
}

/// Writes a batch to the log (blocking), then fdatasyncs when `sync`. A write that lacks room
/// may leave part of the batch in the file: [`truncate_log`] cuts it off.
pub fn write_batch(file: &File, bytes: &[u8], sync: bool) -> Result<(), WriteError> {
    let mut f = file;
    f.write_all(bytes).map_err(WriteError::of_write)?;
    if sync {
        f.sync_data().map_err(WriteError::Failed)?;
    }
    Ok(())
}

/// Cuts the log back to `len` bytes, where its saved records end, and syncs that: the part of a
/// batch whose write failed must not come back at the next start, since its clients were told
/// that it did not happen. Shrinking a file needs no room.
pub fn truncate_log(file: &File, len: u64) -> std::io::Result<()> {
    file.set_len(len)?;
    file.sync_all()
}

/// Whether the log's file system has room for `len` more bytes, which it then keeps for the
/// log: they are allocated past the log's end without changing its size (`fallocate` with
/// `FALLOC_FL_KEEP_SIZE`), so the next writes cannot lack room until they used them, and a crash
/// leaves no zeros in the log. A file system without `fallocate` is asked by writing that many
/// bytes to a file beside the log instead, removed at once.
pub fn reserve(file: &File, beside: &Path, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let end = file.metadata()?.len();
    // SAFETY: fallocate reads no memory of ours; the descriptor is open for writing while
    // `file` lives.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_KEEP_SIZE,
            end as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
        return Err(e);
    }
    probe_room(beside, len)
}

/// Writes `len` bytes to `path` and removes it: whether the file system has that much room.
fn probe_room(path: &Path, len: u64) -> std::io::Result<()> {
    let written = File::create(path).and_then(|mut f| {
        f.write_all(&vec![0; len as usize])?;
        f.sync_all()
    });
    let _ = fs::remove_file(path);
    written
}

/// Installs a snapshot (blocking) and empties the log it makes redundant. A crash between the
/// two leaves log records at or below the snapshot's LSN, which replay skips. `Full` leaves
/// the previous snapshot and the log in place.
pub fn install_snapshot(
    path: &Path,
    pieces: impl IntoIterator<Item = Piece>,
    log: &File,
) -> Result<(), WriteError> {
    write_snapshot(path, pieces)?;
    truncate_log(log, 0).map_err(WriteError::Failed)
}

#[cfg(test)]
pub(crate) mod tests;
