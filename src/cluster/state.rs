//! The Raft state machine: every shard's replicated state (namespaces and the fencing-token
//! high-water mark), rebuilt from the entries' records by the engine's clock-free replay, and
//! its snapshots in `persist`'s per-shard encoding.
//!
//! A snapshot is a folder `snap-<n>/` in the state machine's folder: `meta` (one frame: the
//! last entry in it, the membership, the highest stamped `now`, the shard count) and
//! `shard-<i>.snap` per shard, each tagged with the Raft index it includes. `CURRENT` names the
//! snapshot in use; it is replaced atomically, so a crash leaves the old snapshot or the new
//! one. The applied id and the membership are what the current snapshot holds: after a
//! restart openraft re-applies the committed entries after it (the log store keeps the
//! committed id).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, TryStreamExt};
use openraft::storage::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use tokio::sync::watch;

use super::{codec, room};
use super::{LogId, Payload, SnapshotMeta, StoredMembership, TypeConfig};
use crate::engine::journal::apply;
use crate::engine::state::Namespace;
use crate::engine::types::{FencingToken, Name, Nanos};
use crate::persist::codec::{Dec, DecodeError, Enc};
use crate::persist::log::{frame_with, single_frame};
use crate::persist::{save_snapshot, snapshot, sync_dir, write_file_synced};

/// One shard's replicated state.
#[derive(Default)]
struct Replica {
    namespaces: BTreeMap<Name, Namespace>,
    hwm: FencingToken,
}

/// One shard's committed state, copied out of the state machine.
pub struct Committed {
    /// Its namespaces.
    pub namespaces: BTreeMap<Name, Namespace>,
    /// Its fencing-token high-water mark.
    pub hwm: FencingToken,
    /// The highest `now` of every shard's applied entries: the cluster's last instant.
    pub floor: Nanos,
}

/// A snapshot's files, as openraft hands them from the node that built it to the one that
/// installs it.
#[derive(Debug, Clone)]
pub struct SnapshotFiles {
    /// The snapshot's folder (`meta` and `shard-<i>.snap`).
    pub dir: PathBuf,
}

/// openraft's Raft on our log and this state machine.
pub type Raft = openraft::Raft<TypeConfig, StateMachine>;

/// A snapshot as openraft hands it around: its meta and its files.
pub type Snapshot = openraft::type_config::alias::SnapshotOf<TypeConfig, SnapshotFiles>;

/// What a snapshot's `meta` file holds.
struct Head {
    last: Option<LogId>,
    membership: StoredMembership,
    floor: Nanos,
    shards: usize,
}

impl Head {
    fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        frame_with(&mut out, |out| {
            let mut e = Enc(out);
            codec::opt_log_id(&mut e, self.last.as_ref());
            codec::stored_membership(&mut e, &self.membership);
            e.i64(self.floor);
            e.u64(self.shards as u64);
        });
        out.freeze()
    }

    fn decode(d: &mut Dec) -> Result<Head, DecodeError> {
        Ok(Head {
            last: codec::dec_opt_log_id(d)?,
            membership: codec::dec_stored_membership(d)?,
            floor: d.i64()?,
            shards: d.u64()? as usize,
        })
    }
}

struct Machine {
    dir: PathBuf,
    shards: Vec<Replica>,
    applied: Option<LogId>,
    membership: StoredMembership,
    /// The highest `now` an applied entry carried: a new leader's clock starts at least there.
    floor: Nanos,
    /// The snapshot in use, and its folder.
    current: Option<(SnapshotMeta, PathBuf)>,
    /// The number of the next snapshot folder.
    next: u64,
}

/// The state machine; clones share it (a clone is also its snapshot builder).
#[derive(Clone)]
pub struct StateMachine {
    machine: Arc<Mutex<Machine>>,
    /// The last log id of the newest snapshot built here (`purge.rs` purges after it).
    built: Arc<watch::Sender<Option<LogId>>>,
}

fn io_err(path: &Path) -> impl Fn(io::Error) -> io::Error + '_ {
    move |e| io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// A snapshot read from its folder.
struct Loaded {
    head: Head,
    shards: Vec<Replica>,
}

/// Reads and checks a snapshot folder.
fn load(dir: &Path) -> io::Result<Loaded> {
    let meta_path = dir.join("meta");
    let bytes = fs::read(&meta_path).map_err(io_err(&meta_path))?;
    let head = single_frame(Bytes::from(bytes), Head::decode)
        .ok_or_else(|| invalid(format!("{}: corrupt", meta_path.display())))?;
    let mut shards = Vec::with_capacity(head.shards);
    for i in 0..head.shards {
        let path = shard_path(dir, i);
        let bytes = fs::read(&path).map_err(io_err(&path))?;
        let snap = snapshot::decode(Bytes::from(bytes))
            .map_err(|e| invalid(format!("{}: corrupt snapshot: {e}", path.display())))?;
        shards.push(Replica {
            namespaces: snap.namespaces,
            hwm: snap.hwm,
        });
    }
    Ok(Loaded { head, shards })
}

fn shard_path(dir: &Path, shard: usize) -> PathBuf {
    dir.join(format!("shard-{shard}.snap"))
}

/// The number of a snapshot folder's name.
fn snap_number(name: &str) -> Option<u64> {
    name.strip_prefix("snap-")?.parse().ok()
}

impl StateMachine {
    /// Opens the state machine of `shards` shards in `dir`: empty, or the current snapshot.
    pub fn open(dir: &Path, shards: usize) -> io::Result<StateMachine> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let current_path = dir.join("CURRENT");
        let current = match fs::read_to_string(&current_path) {
            Ok(name) => Some(name.trim().to_string()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&current_path)(e)),
        };
        let mut next = 0;
        for item in fs::read_dir(dir).map_err(io_err(dir))? {
            let name = item.map_err(io_err(dir))?.file_name();
            let Some(n) = name.to_str().and_then(snap_number) else {
                continue;
            };
            next = next.max(n + 1);
            if current.as_deref() != name.to_str() {
                // Left by a snapshot a crash cut short, or one replaced: not in use.
                fs::remove_dir_all(dir.join(&name)).map_err(io_err(dir))?;
            }
        }
        let mut m = Machine {
            dir: dir.to_path_buf(),
            shards: (0..shards).map(|_| Replica::default()).collect(),
            applied: None,
            membership: StoredMembership::default(),
            floor: 0,
            current: None,
            next,
        };
        if let Some(name) = current {
            let snap_dir = dir.join(name);
            let loaded = load(&snap_dir)?;
            m.take(loaded, snap_dir)?;
        }
        Ok(StateMachine {
            machine: Arc::new(Mutex::new(m)),
            built: Arc::new(watch::Sender::new(None)),
        })
    }

    /// The last log id of each snapshot built here, as it is built.
    pub fn built(&self) -> watch::Receiver<Option<LogId>> {
        self.built.subscribe()
    }

    /// A copy of shard `shard`'s committed state (through the snapshot encoding, the one
    /// serialization the state has), and the highest `now` any applied entry carried: what a
    /// new leader's shard starts from.
    pub fn committed(&self, shard: usize) -> Committed {
        let bytes = {
            let m = self.machine();
            let r = &m.shards[shard];
            (snapshot::to_bytes(&r.namespaces, r.hwm, 0), m.floor)
        };
        let snap = snapshot::decode(bytes.0).expect("a state reads back as encoded");
        Committed {
            namespaces: snap.namespaces,
            hwm: snap.hwm,
            floor: bytes.1,
        }
    }

    /// Each shard's state in the snapshot encoding: equal bytes, equal states.
    #[cfg(test)]
    pub(super) fn shard_states(&self) -> Vec<Bytes> {
        self.machine()
            .shards
            .iter()
            .map(|r| crate::persist::snapshot::to_bytes(&r.namespaces, r.hwm, 0))
            .collect()
    }

    fn machine(&self) -> MutexGuard<'_, Machine> {
        self.machine
            .lock()
            .expect("no panic while the state machine is locked")
    }
}

impl Machine {
    /// Makes a loaded snapshot, in `dir`, the state and the current snapshot.
    fn take(&mut self, loaded: Loaded, dir: PathBuf) -> io::Result<()> {
        if loaded.head.shards != self.shards.len() {
            return Err(invalid(format!(
                "{}: a snapshot of {} shards, but this node runs {}: every node of a cluster \
                 runs the same --shards",
                dir.display(),
                loaded.head.shards,
                self.shards.len()
            )));
        }
        self.shards = loaded.shards;
        self.applied = loaded.head.last;
        self.membership = loaded.head.membership.clone();
        self.floor = loaded.head.floor;
        let meta = SnapshotMeta {
            last_log_id: loaded.head.last,
            last_membership: loaded.head.membership,
        };
        self.current = Some((meta, dir));
        Ok(())
    }

    /// A new snapshot folder, empty.
    fn new_snapshot_dir(&mut self) -> io::Result<PathBuf> {
        let dir = self.dir.join(format!("snap-{}", self.next));
        self.next += 1;
        fs::create_dir(&dir).map_err(io_err(&dir))?;
        Ok(dir)
    }

    /// Makes the complete snapshot folder `dir` the one in use, and removes the one before.
    fn switch_to(&mut self, dir: &Path) -> io::Result<()> {
        sync_dir(dir).map_err(io_err(dir))?;
        let name = dir.file_name().and_then(|n| n.to_str()).expect("snap-<n>");
        let current_path = self.dir.join("CURRENT");
        write_file_synced(&current_path, format!("{name}\n").as_bytes())
            .map_err(io_err(&current_path))?;
        if let Some((_, old)) = &self.current {
            fs::remove_dir_all(old).map_err(io_err(old))?;
        }
        Ok(())
    }

    /// Applies one entry.
    fn apply(&mut self, payload: Payload, log_id: LogId) -> io::Result<()> {
        match payload {
            Payload::Blank => {}
            Payload::Normal(entry) => {
                let count = self.shards.len();
                let replica = self.shards.get_mut(entry.shard as usize).ok_or_else(|| {
                    invalid(format!(
                        "entry {log_id} is for shard {}, but this node runs {count} shards",
                        entry.shard
                    ))
                })?;
                for rec in entry.records {
                    apply(&mut replica.namespaces, &mut replica.hwm, rec)
                        .map_err(|e| invalid(format!("entry {log_id}: {}", e.0)))?;
                }
                self.floor = self.floor.max(entry.now);
            }
            Payload::Membership(m) => {
                self.membership = StoredMembership::new(Some(log_id), m);
            }
        }
        self.applied = Some(log_id);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFiles;

    /// A snapshot that finds no room on the disk is built again, of the state then, until
    /// there is room (`room.rs`); openraft would stop for good on the error.
    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut waiting = room::Waiting::of("a snapshot");
        loop {
            let built = self.try_build_snapshot();
            if !waiting.again(&built) {
                return built;
            }
            tokio::time::sleep(room::RETRY).await;
        }
    }
}

impl StateMachine {
    fn try_build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let mut m = self.machine();
        let dir = m.new_snapshot_dir()?;
        let head = Head {
            last: m.applied,
            membership: m.membership.clone(),
            floor: m.floor,
            shards: m.shards.len(),
        };
        let written = (|| {
            let index = m.applied.map_or(0, |id| id.index);
            for (i, r) in m.shards.iter().enumerate() {
                let path = shard_path(&dir, i);
                save_snapshot(&path, &r.namespaces, r.hwm, index).map_err(|e| {
                    io::Error::new(e.io().kind(), format!("{}: {e}", path.display()))
                })?;
            }
            let meta_path = dir.join("meta");
            write_file_synced(&meta_path, &head.encode()).map_err(io_err(&meta_path))
        })();
        if let Err(e) = written {
            // Not in use: the next try writes a folder of its own.
            let _ = fs::remove_dir_all(&dir);
            return Err(e);
        }
        m.switch_to(&dir)?;
        let meta = SnapshotMeta {
            last_log_id: head.last,
            last_membership: head.membership,
        };
        m.current = Some((meta.clone(), dir.clone()));
        self.built.send_replace(head.last);
        Ok(Snapshot {
            meta,
            snapshot: SnapshotFiles { dir },
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotData = SnapshotFiles;
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let m = self.machine();
        Ok((m.applied, m.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            self.machine().apply(entry.payload, entry.log_id)?;
            if let Some(r) = responder {
                r.send(());
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.clone()
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotFiles,
    ) -> Result<(), io::Error> {
        let loaded = load(&snapshot.dir)?;
        if loaded.head.last != meta.last_log_id || loaded.head.membership != meta.last_membership {
            return Err(invalid(format!(
                "{}: the snapshot's files are not of {meta}",
                snapshot.dir.display()
            )));
        }
        let mut m = self.machine();
        // A copy of our own: the sender's folder is its to replace.
        let dir = m.new_snapshot_dir()?;
        for name in (0..loaded.head.shards)
            .map(|i| shard_path(Path::new(""), i))
            .chain([PathBuf::from("meta")])
        {
            let to = dir.join(&name);
            fs::copy(snapshot.dir.join(&name), &to)
                .and_then(|_| fs::File::open(&to)?.sync_all())
                .map_err(io_err(&to))?;
        }
        m.switch_to(&dir)?;
        m.take(loaded, dir)
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let m = self.machine();
        Ok(m.current.as_ref().map(|(meta, dir)| Snapshot {
            meta: meta.clone(),
            snapshot: SnapshotFiles { dir: dir.clone() },
        }))
    }
}
