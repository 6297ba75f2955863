//! Durability (SPEC §8): a per-shard append-only log with group commit, snapshots, and the
//! start-up load that replays them (re-sharding when `--shards` changed).
//!
//! Layout in `--dir`: `MANIFEST` names the current generation and its shard count; the
//! generation's folder `gen-G/` holds `shard-I.snap` and `shard-I.log` per shard. Each start
//! loads generation G, then writes generation G+1 (one fresh snapshot per new shard), switches
//! `MANIFEST` to it atomically and removes G. A crash at any point leaves either G or G+1 whole.

pub mod codec;
pub mod log;
pub mod snapshot;

use std::collections::BTreeMap;
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

fn sync_dir(dir: &Path) -> std::io::Result<()> {
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

/// Loads one old shard: its snapshot, then the log records after it.
fn load_shard(
    gdir: &Path,
    shard: usize,
    repair: bool,
    into: &mut BTreeMap<Name, Namespace>,
    hwm: &mut FencingToken,
) -> Result<u64, String> {
    let sp = snap_path(gdir, shard);
    let mut snap_lsn = 0;
    match fs::read(&sp) {
        Ok(bytes) => {
            let snap = snapshot::decode(Bytes::from(bytes))
                .map_err(|e| format!("{}: corrupt snapshot: {e}", sp.display()))?;
            snap_lsn = snap.lsn;
            *hwm = (*hwm).max(snap.hwm);
            into.extend(snap.namespaces);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", sp.display())),
    }
    let lp = log_path(gdir, shard);
    let bytes = match fs::read(&lp) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", lp.display())),
    };
    let scan = log::scan(Bytes::from(bytes), repair).map_err(|c| {
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
    let mut replayed = 0;
    for (lsn, rec) in scan.records {
        if lsn <= snap_lsn {
            continue;
        }
        apply(into, hwm, rec).map_err(|e| format!("{}: lsn {lsn}: {}", lp.display(), e.0))?;
        replayed += 1;
    }
    Ok(replayed)
}

/// Loads the current generation from `dir`, spreads it over `shards` new shards, and makes a
/// new generation of it on disk.
pub fn load(dir: &Path, shards: usize, repair: bool) -> Result<Loaded, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (old_gen, old_shards) = manifest(dir)?.unwrap_or((0, 0));
    let old_dir = gen_dir(dir, old_gen);
    let mut all = BTreeMap::new();
    let mut hwm = 0;
    let mut replayed = 0;
    for i in 0..old_shards {
        replayed += load_shard(&old_dir, i, repair, &mut all, &mut hwm)?;
    }
    let mut states: Vec<ShardState> = (0..shards)
        .map(|_| ShardState {
            namespaces: BTreeMap::new(),
            hwm,
        })
        .collect();
    for (name, ns) in all {
        states[shard_for(&name, shards)].namespaces.insert(name, ns);
    }
    let new_gen = old_gen + 1;
    let new_dir = gen_dir(dir, new_gen);
    let io = |e: std::io::Error| format!("{}: {e}", new_dir.display());
    if new_dir.exists() {
        // Left by a start that crashed before switching the manifest: not in use.
        fs::remove_dir_all(&new_dir).map_err(io)?;
    }
    fs::create_dir_all(&new_dir).map_err(io)?;
    for (i, st) in states.iter().enumerate() {
        save_snapshot(&snap_path(&new_dir, i), &st.namespaces, st.hwm, 0).map_err(io)?;
        File::create(log_path(&new_dir, i))
            .and_then(|f| f.sync_all())
            .map_err(io)?;
    }
    sync_dir(&new_dir).map_err(io)?;
    let text = format!("permitd-manifest 1\ngeneration {new_gen}\nshards {shards}\n");
    write_file_synced(&dir.join("MANIFEST"), text.as_bytes()).map_err(io)?;
    sync_dir(dir).map_err(io)?;
    if old_shards > 0 {
        let _ = fs::remove_dir_all(&old_dir);
    }
    Ok(Loaded {
        shards: states,
        gen_dir: new_dir,
        replayed,
    })
}

/// Writes `bytes` to `path` atomically: a temporary file, fsync, rename, directory fsync.
pub fn write_file_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    replace_synced(path, |f| f.write_all(bytes))
}

/// Replaces `path` atomically by what `fill` writes: a temporary file, fsync, rename,
/// directory fsync.
fn replace_synced(
    path: &Path,
    fill: impl FnOnce(&mut File) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = File::create(&tmp)?;
        fill(&mut f)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(parent) = path.parent() {
        sync_dir(parent)?;
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
pub fn write_snapshot(path: &Path, pieces: impl IntoIterator<Item = Piece>) -> std::io::Result<()> {
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
) -> std::io::Result<()> {
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
    last_lsn: u64,
    /// Log size that triggers a snapshot.
    pub snapshot_threshold: u64,
    /// INFO counters.
    pub stats: PersistStats,
}

/// A batch taken for writing.
#[allow(missing_docs)]
pub struct Batch {
    pub bytes: Bytes,
    /// LSN of the last record in it.
    pub lsn: u64,
}

impl Store {
    /// Opens shard `shard`'s log in the generation folder for appending.
    pub fn open(
        gen_dir: &Path,
        shard: usize,
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
            last_lsn: 0,
            snapshot_threshold,
            stats: PersistStats {
                log_bytes: size,
                ..PersistStats::default()
            },
        })
    }

    /// Frames records into the pending batch; returns the LSN of the last one.
    pub fn append(&mut self, records: Vec<Record>) -> u64 {
        for r in &records {
            self.last_lsn += 1;
            log::frame(self.last_lsn, r, &mut self.pending);
        }
        self.last_lsn
    }

    /// LSN of the last record appended.
    pub fn last_lsn(&self) -> u64 {
        self.last_lsn
    }

    /// Whether records wait to be written.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
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
}

/// Writes a batch to the log (blocking), then fdatasyncs when `sync`.
pub fn write_batch(file: &File, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let mut f = file;
    f.write_all(bytes)?;
    if sync {
        f.sync_data()?;
    }
    Ok(())
}

/// Installs a snapshot (blocking) and empties the log it makes redundant. A crash between the
/// two leaves log records at or below the snapshot's LSN, which replay skips.
pub fn install_snapshot(
    path: &Path,
    pieces: impl IntoIterator<Item = Piece>,
    log: &File,
) -> std::io::Result<()> {
    write_snapshot(path, pieces)?;
    log.set_len(0)?;
    log.sync_all()
}

#[cfg(test)]
mod tests;
