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
            "{}: corrupt record at offset {} (not at the end of the log); start with --repair-log \
             to truncate the log there, losing the records from that offset on",
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
mod tests {
    use super::*;
    use crate::command::{parse_argv, Request};
    use crate::engine::request::EngineRequest;
    use crate::engine::types::{LeaseId, Limits, NANOS_PER_SEC};
    use crate::engine::{Exec, Shard};
    use crate::protocol::Reply;
    use std::sync::atomic::AtomicUsize;

    fn request(words: &str) -> EngineRequest {
        let argv: Vec<Bytes> = words
            .split(' ')
            .map(|w| Bytes::from(w.to_string()))
            .collect();
        let Ok((_, Request::Engine(req))) = parse_argv(&argv, &Limits::default()) else {
            panic!("bad test command {words}");
        };
        req
    }

    fn run(shard: &mut Shard, now: i64, words: &str) -> Exec {
        shard.execute(now, request(words), true)
    }

    fn lease(shard: &mut Shard, now: i64, n: u64, ttl: i64) -> String {
        let id = LeaseId::from_counter(n);
        let req = EngineRequest::LeaseCreate(crate::engine::request::LeaseCreate {
            ns: Name::new_unchecked(Bytes::from("team")),
            id,
            process_id: Bytes::from("p"),
            ttl: ttl * NANOS_PER_SEC,
            meta: Default::default(),
        });
        shard.execute(now, req, true);
        String::from_utf8(id.to_bytes().to_vec()).unwrap()
    }

    /// A workload touching every record type, with expiry, waiters and deletes.
    fn workload(shard: &mut Shard) -> Vec<Record> {
        let s = NANOS_PER_SEC;
        let mut journal = Vec::new();
        run(shard, s, "NS.CREATE team DESC d META k v");
        run(shard, s, "SEM.CREATE team db 5");
        run(shard, s, "SEM.CREATE team gone 1");
        let a = lease(shard, s, 1, 10);
        let b = lease(shard, s, 2, 2);
        let c = lease(shard, s, 3, 100);
        run(
            shard,
            2 * s,
            &format!("SEM.ACQUIRE team db {a} 3 0 META host x"),
        );
        run(shard, 2 * s, &format!("SEM.ACQUIRE team db {b} 2 0"));
        run(shard, 2 * s, &format!("SEM.ACQUIRE team db {c} 4 10"));
        run(shard, 2 * s, &format!("SEM.ACQUIRE team gone {c} 1 0"));
        run(shard, 3 * s, &format!("LEASE.REFRESH team {a} 20"));
        run(shard, 3 * s, "SEM.DELETE team gone");
        // b expires at 3 s: c (waiting for 4) still does not fit beside a's 3.
        run(shard, 4 * s, &format!("SEM.ACQUIRE team db {a} 1 0"));
        run(shard, 5 * s, "SEM.UPDATE team db 6 VERSION 1 DESC more");
        run(shard, 5 * s, "NS.UPDATE team VERSION 1");
        run(shard, 6 * s, &format!("SEM.RELEASE team db {a}"));
        run(shard, 6 * s, &format!("LEASE.REVOKE team {a}"));
        run(shard, 7 * s, "NS.CREATE tmp");
        run(shard, 7 * s, "NS.DELETE tmp");
        journal.extend(shard.take_journal());
        journal
    }

    #[test]
    fn replaying_the_journal_rebuilds_the_live_state() {
        let count = Arc::new(AtomicUsize::new(0));
        let mut live = Shard::new(Arc::new(Limits::default()), count);
        let journal = workload(&mut live);
        let kinds: std::collections::BTreeSet<String> = journal
            .iter()
            .map(|r| {
                format!("{r:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap()
                    .to_string()
            })
            .collect();
        assert!(
            kinds.len() >= 9,
            "every record type is exercised: {kinds:?}"
        );
        let mut replayed = BTreeMap::new();
        let mut hwm = 0;
        for r in journal {
            apply(&mut replayed, &mut hwm, r).unwrap();
        }
        let (nss, live_hwm) = live.state();
        assert_eq!(hwm, live_hwm);
        assert_eq!(
            snapshot::to_bytes(&replayed, hwm, 7),
            snapshot::to_bytes(nss, live_hwm, 7)
        );
    }

    #[test]
    fn snapshot_plus_log_survives_restart_and_resharding() {
        let dir = std::env::temp_dir().join(format!("permitd-persist-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = load(&dir, 2, false).unwrap();
        assert!(first.shards.iter().all(|s| s.namespaces.is_empty()));
        let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
        let journal = workload(&mut live);
        let home = shard_for(&Name::new_unchecked(Bytes::from("team")), 2);
        let mut store = Store::open(&first.gen_dir, home, Fsync::Always, 1 << 20).unwrap();
        // Half the journal goes into a snapshot, the rest into the log after it.
        let (head, tail) = journal.split_at(journal.len() / 2);
        let mut snap_state = BTreeMap::new();
        let mut hwm = 0;
        for r in head {
            apply(&mut snap_state, &mut hwm, r.clone()).unwrap();
        }
        let snap_lsn = store.append(head.to_vec());
        let _ = store.take();
        let mut pieces = Vec::new();
        snapshot::encode(&snap_state, hwm, snap_lsn, |p| {
            pieces.push(p);
            true
        });
        install_snapshot(&store.snapshot_path(), pieces, &store.file()).unwrap();
        store.append(tail.to_vec());
        let batch = store.take();
        write_batch(&store.file(), &batch.bytes, true).unwrap();
        drop(store);
        for shards in [3, 1, 2] {
            let again = load(&dir, shards, false).unwrap();
            let home = shard_for(&Name::new_unchecked(Bytes::from("team")), shards);
            let (nss, live_hwm) = live.state();
            assert_eq!(again.shards[home].hwm, live_hwm);
            assert_eq!(
                snapshot::to_bytes(&again.shards[home].namespaces, 0, 0),
                snapshot::to_bytes(nss, 0, 0),
                "state after reloading with {shards} shards"
            );
        }
        let _ = fs::remove_dir_all(&dir);
    }

    /// The fencing token in an acquire's reply (RESP3 map form of the engine's reply).
    fn token_of(reply: &Reply) -> i64 {
        let Reply::Map(fields) = reply else {
            panic!("an acquire answers a map: {reply:?}");
        };
        fields
            .iter()
            .find_map(|(k, v)| match (k, v) {
                (Reply::Bulk(k), Reply::Int(t)) if &k[..] == b"fencing_token" => Some(*t),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no fencing_token in {reply:?}"))
    }

    /// A server's shards over a data directory, reduced to what tokens need: each request runs
    /// on its namespace's shard and its journal is written before the next one.
    struct Node {
        shards: Vec<(Shard, Store)>,
    }

    impl Node {
        fn start(dir: &Path, count: usize) -> Node {
            let loaded = load(dir, count, false).unwrap();
            let namespaces = Arc::new(AtomicUsize::new(0));
            let shards = loaded
                .shards
                .into_iter()
                .enumerate()
                .map(|(id, st)| {
                    let limits = Arc::new(Limits::default());
                    let shard = Shard::restore(limits, namespaces.clone(), st.namespaces, st.hwm);
                    let store = Store::open(&loaded.gen_dir, id, Fsync::No, 1 << 30).unwrap();
                    (shard, store)
                })
                .collect();
            Node { shards }
        }

        fn run(&mut self, words: &str) -> Reply {
            let req = request(words);
            let home = shard_for(req.namespace().expect("one namespace"), self.shards.len());
            let (shard, store) = &mut self.shards[home];
            let Exec::Reply(reply) = shard.execute(NANOS_PER_SEC, req, false) else {
                panic!("{words} parked");
            };
            store.append(shard.take_journal());
            let batch = store.take();
            write_batch(&store.file(), &batch.bytes, false).unwrap();
            reply
        }

        /// A fresh lease's id in namespace `ns`.
        fn lease(&mut self, ns: &str) -> String {
            let reply = self.run(&format!("LEASE.CREATE {ns} worker 300"));
            let Reply::Map(fields) = &reply else {
                panic!("{reply:?}");
            };
            match &fields[0] {
                (_, Reply::Bulk(id)) => String::from_utf8(id.to_vec()).unwrap(),
                other => panic!("{other:?}"),
            }
        }

        /// Acquires `sem` of `ns` under a new lease and releases it; returns the token.
        fn token(&mut self, ns: &str, sem: &str) -> i64 {
            let id = self.lease(ns);
            let token = token_of(&self.run(&format!("SEM.ACQUIRE {ns} {sem} {id} 1 0")));
            self.run(&format!("SEM.RELEASE {ns} {sem} {id}"));
            token
        }
    }

    #[test]
    fn fencing_tokens_count_up_across_restart_recreate_and_resharding() {
        let dir = std::env::temp_dir().join(format!("permitd-tokens-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut node = Node::start(&dir, 2);
        node.run("NS.CREATE team");
        node.run("SEM.CREATE team db 1");
        let mut tokens = vec![node.token("team", "db"), node.token("team", "db")];
        assert_eq!(tokens, [1, 2], "a fresh data directory counts from 1");
        node.run("SEM.DELETE team db");
        node.run("SEM.CREATE team db 1");
        tokens.push(node.token("team", "db"));
        node.run("NS.DELETE team");
        node.run("NS.CREATE team");
        node.run("SEM.CREATE team db 1");
        tokens.push(node.token("team", "db"));
        // Restarts: with the same shard count, then re-sharded to 3 and to 1.
        for count in [2, 3, 1] {
            drop(node);
            node = Node::start(&dir, count);
            tokens.push(node.token("team", "db"));
        }
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "strictly rising on team/db: {tokens:?}"
        );
        assert!(
            tokens.iter().all(|&t| t < 1 << 53),
            "below 2^53: {tokens:?}"
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn tokens_of_a_data_directory_from_clock_tokens_keep_rising() {
        // An earlier permitd's tokens were nanosecond clock readings; the mark never goes down.
        let old = 1_796_037_003_305_164_005;
        let mut shard = Shard::restore(
            Arc::new(Limits::default()),
            Arc::new(AtomicUsize::new(0)),
            BTreeMap::new(),
            old,
        );
        run(&mut shard, NANOS_PER_SEC, "NS.CREATE team");
        run(&mut shard, NANOS_PER_SEC, "SEM.CREATE team db 1");
        let id = lease(&mut shard, NANOS_PER_SEC, 1, 60);
        let acquire = format!("SEM.ACQUIRE team db {id} 1 0");
        let Exec::Reply(reply) = run(&mut shard, NANOS_PER_SEC, &acquire) else {
            panic!("{acquire} parked");
        };
        assert_eq!(token_of(&reply), old + 1);
    }

    #[test]
    fn a_burst_of_records_does_not_keep_its_room() {
        let dir = std::env::temp_dir().join(format!("permitd-pending-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let loaded = load(&dir, 1, false).unwrap();
        let mut store = Store::open(&loaded.gen_dir, 0, Fsync::No, 1 << 30).unwrap();
        let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
        let journal = workload(&mut live);
        store.append(journal.clone());
        let small = store.take().bytes.len();
        assert!(small > 0 && small < PENDING_KEEP);
        // A burst grows the buffer past the limit: the batch takes all of it.
        while store.pending.len() <= PENDING_KEEP {
            store.append(journal.clone());
        }
        let framed = store.pending.len();
        let batch = store.take();
        assert_eq!(batch.bytes.len(), framed);
        assert_eq!(
            store.pending.capacity(),
            0,
            "the burst's room goes with its batch"
        );
        write_batch(&store.file(), &batch.bytes, false).unwrap();
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_log_stops_the_start_with_file_and_offset() {
        let dir = std::env::temp_dir().join(format!("permitd-corrupt-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let first = load(&dir, 1, false).unwrap();
        let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
        let journal = workload(&mut live);
        let mut store = Store::open(&first.gen_dir, 0, Fsync::Always, 1 << 20).unwrap();
        store.append(journal);
        let batch = store.take();
        write_batch(&store.file(), &batch.bytes, true).unwrap();
        let path = log_path(&first.gen_dir, 0);
        let mut bytes = fs::read(&path).unwrap();
        bytes[40] ^= 0xff;
        fs::write(&path, &bytes).unwrap();
        let err = load(&dir, 1, false)
            .err()
            .expect("corruption stops the start");
        assert!(
            err.contains("shard-0.log") && err.contains("offset"),
            "{err}"
        );
        let repaired = load(&dir, 1, true).unwrap();
        assert!(
            repaired.shards[0].namespaces.is_empty(),
            "cut before the first record"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
