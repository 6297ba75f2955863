//! The shard's log: writing it behind the replies (group commit), its syncs under `everysec`,
//! its snapshots, the flush at shutdown, and what happens when the data directory is full.
//!
//! When a write of the log finds the data directory full (SPEC §8), the shard refuses every
//! change with `MISCONF`, rolls back the changes not yet written (it rebuilds its state from its
//! files; the replies that may show those changes get the error instead, through the durable
//! LSNs of `Global`), holds grants, and tries again every second until the log has room. Any
//! other failed write or sync stops the server.

use std::fmt::Display;
use std::fs::File;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Disk, ShardCtx};
use crate::error::Error;
use crate::persist::{self, Batch, Fsync, WriteError};
use crate::protocol::Reply;
use crate::server::global::Global;

/// How often a shard whose data directory is full tries its log again.
const RETRY: Duration = Duration::from_secs(1);

/// The room a full shard must get for its log before it takes changes again; the file system
/// keeps it for the log (see [`persist::reserve`]).
const ROOM: u64 = 1 << 20;

/// How long after a snapshot that had no room the next one is tried (the log keeps every
/// change meanwhile; a snapshot encodes the whole state, too much to retry after each write).
const SNAPSHOT_RETRY: Duration = Duration::from_secs(10);

impl ShardCtx {
    /// The shard starts with its data directory full (its last run found it so): changes are
    /// refused and grants held until the log has room.
    pub(super) fn start_full(&self, e: &std::io::Error) {
        tracing::warn!(shard = self.id, error = %e, "starting with a full data directory: changes are refused until there is room");
        self.engine.borrow_mut().hold_grants();
        let mut store = self.store.borrow_mut();
        store.stats.write_failing = true;
        store.stats.last_write_errno = e.raw_os_error().unwrap_or(0);
        *self.disk.borrow_mut() = Disk::Full(refusal(&self.global, e));
    }

    /// Writes the log behind the commands: each pass takes every record framed since the last
    /// one and writes it with one write (and one fdatasync under `always`): group commit. With a
    /// full disk it tries again every [`RETRY`] instead.
    pub(super) async fn flush_loop(self: Rc<Self>) {
        loop {
            let full = match *self.disk.borrow() {
                Disk::Writing => false,
                Disk::Full(_) => true,
                // Never entered between two passes: rolling back runs inside one.
                Disk::RollingBack(_) | Disk::Failed(_) => return,
            };
            if full {
                tokio::time::sleep(RETRY).await;
                self.try_resume().await;
                continue;
            }
            if !self.store.borrow().has_pending() {
                self.flush_wake.notified().await;
                continue;
            }
            self.flush_once().await;
            let due = self
                .snapshot_after
                .get()
                .is_none_or(|t| Instant::now() >= t);
            if due && self.writing() && self.store.borrow().wants_snapshot() {
                self.snapshot().await;
            }
        }
    }

    fn writing(&self) -> bool {
        matches!(*self.disk.borrow(), Disk::Writing)
    }

    /// Writes the pending batch. Replies wait at least for the write (so a process crash loses
    /// nothing acknowledged under any policy); under `always` also for the fdatasync, which runs
    /// on the background thread while the shard keeps serving. Without a sync, the write only
    /// copies to the page cache and is done in place.
    async fn flush_once(&self) {
        let (batch, file, sync) = self.take_batch();
        match self.write(file, batch.bytes.clone(), sync).await {
            Ok(()) => self.written(&batch, sync),
            Err(WriteError::Full(e)) => self.roll_back(e).await,
            Err(WriteError::Failed(e)) => self.fail("write the log", &e),
        }
    }

    /// The pending batch, the log file, and whether the policy syncs each batch.
    fn take_batch(&self) -> (Batch, Arc<File>, bool) {
        let mut store = self.store.borrow_mut();
        (store.take(), store.file(), store.policy == Fsync::Always)
    }

    /// Writes `bytes` to the log, synced on the background thread when `sync`.
    async fn write(&self, file: Arc<File>, bytes: Bytes, sync: bool) -> Result<(), WriteError> {
        if !sync {
            return persist::write_batch(&file, &bytes, false);
        }
        self.background
            .run(move || persist::write_batch(&file, &bytes, true))
            .await
            .unwrap_or_else(|gone| Err(WriteError::Failed(std::io::Error::other(gone.to_string()))))
    }

    /// `batch` is in the log.
    fn written(&self, batch: &Batch, synced: bool) {
        let mut store = self.store.borrow_mut();
        store.written(batch.lsn, batch.bytes.len() as u64);
        if synced {
            store.stats.fsyncs += 1;
            store.stats.last_fsync_at = self.global.wall_nanos();
        }
        self.global.mark_durable(self.id, batch.lsn);
    }

    /// A write found the data directory full: refuses changes from now on, cuts the failed
    /// batch off the log, rebuilds the shard from its files (the engine is deterministic and
    /// the log holds results, so that is the state without the changes not written), and has
    /// the replies that may show those changes answered with the error. Acquires parked before
    /// stay parked; those that parked since get the error too.
    async fn roll_back(&self, e: std::io::Error) {
        let refusal = refusal(&self.global, &e);
        tracing::warn!(shard = self.id, error = %e, "the data directory is full: rolling back the changes not written, refusing changes until there is room");
        *self.disk.borrow_mut() = Disk::RollingBack(refusal.clone());
        self.engine.borrow_mut().hold_grants();
        let (file, len, (gdir, shard)) = {
            let store = self.store.borrow();
            (store.file(), store.stats.log_bytes, store.files())
        };
        let saved = self
            .background
            .run(move || {
                persist::truncate_log(&file, len)
                    .map_err(|e| format!("cut the log back to {len} bytes: {e}"))?;
                persist::load_saved(&gdir, shard)
            })
            .await;
        let (namespaces, hwm) = match saved {
            Ok(Ok(state)) => state,
            Ok(Err(why)) => return self.fail("roll back to the saved state", &why),
            Err(gone) => return self.fail("roll back to the saved state", &gone),
        };
        let (after, upto) = {
            let mut store = self.store.borrow_mut();
            store.drop_pending();
            store.stats.write_failing = true;
            store.stats.last_write_errno = e.raw_os_error().unwrap_or(0);
            (store.saved_lsn(), store.last_lsn())
        };
        let dropped = {
            let parked = self.parked.borrow();
            let keep = |id| parked.get(&id).is_some_and(|p| p.lsn <= after);
            self.engine.borrow_mut().roll_back(namespaces, hwm, keep)
        };
        {
            let mut parked = self.parked.borrow_mut();
            for id in dropped {
                if let Some(p) = parked.remove(&id) {
                    self.answer_parked(p, Reply::Error(refusal.clone()), after);
                }
            }
        }
        self.global.roll_back(self.id, after, upto, refusal.clone());
        *self.disk.borrow_mut() = Disk::Full(refusal);
        self.settle();
    }

    /// With a full disk: once the log has room again (it is reserved for it), writes what
    /// waits (expiries) and takes changes again, serving the queues that grants were held
    /// from.
    async fn try_resume(&self) {
        let (file, beside) = {
            let store = self.store.borrow();
            let (gdir, shard) = store.files();
            (store.file(), gdir.join(format!("shard-{shard}.room")))
        };
        let room = self
            .background
            .run(move || persist::reserve(&file, &beside, ROOM))
            .await;
        match room {
            Ok(Ok(())) => {}
            Ok(Err(e)) if persist::is_full(&e) => return,
            Ok(Err(e)) => return self.fail("reserve room for the log", &e),
            Err(gone) => return self.fail("reserve room for the log", &gone),
        }
        if self.store.borrow().has_pending() {
            let (batch, file, sync) = self.take_batch();
            match self.write(file.clone(), batch.bytes.clone(), sync).await {
                Ok(()) => self.written(&batch, sync),
                Err(WriteError::Full(_)) => {
                    // Still no room for all of it: cut it off again and keep it for later.
                    let len = self.store.borrow().stats.log_bytes;
                    let cut = self
                        .background
                        .run(move || persist::truncate_log(&file, len))
                        .await;
                    match cut {
                        Ok(Ok(())) => return self.store.borrow_mut().untake(batch),
                        Ok(Err(e)) => return self.fail("cut the log back", &e),
                        Err(gone) => return self.fail("cut the log back", &gone),
                    }
                }
                Err(WriteError::Failed(e)) => return self.fail("write the log", &e),
            }
        }
        *self.disk.borrow_mut() = Disk::Writing;
        self.store.borrow_mut().stats.write_failing = false;
        tracing::info!(
            shard = self.id,
            "the data directory has room again: changes are taken again"
        );
        let now = self.now();
        self.engine.borrow_mut().resume_grants(now);
        self.settle();
    }

    /// A write or sync failed otherwise than for lack of room: the file's state is unknown, so
    /// the server stops (SPEC §8) after answering every reply that waits for a change not
    /// written with an error, and the next start recovers from what is on disk.
    fn fail(&self, what: &str, e: &dyn Display) {
        tracing::error!(shard = self.id, error = %e, "could not {what}; stopping so that no unsaved change is acknowledged");
        let error = Error::Err(format!(
            "permitd could not {what} in {}: {e}; it is stopping, and whether this change was \
             saved is known once it has restarted",
            self.global.config.dir.display()
        ));
        let after = {
            let mut store = self.store.borrow_mut();
            store.drop_pending();
            store.stats.write_failing = true;
            store.saved_lsn()
        };
        self.global
            .roll_back(self.id, after, u64::MAX, error.clone());
        *self.disk.borrow_mut() = Disk::Failed(error);
        self.global.stop_failed();
    }

    /// Replaces the log by a snapshot of the shard's state. The shard pauses only while its
    /// state is serialized; writing and syncing happen on the background thread. A snapshot
    /// that has no room leaves the previous one and the log in place, and is tried again after
    /// [`SNAPSHOT_RETRY`].
    async fn snapshot(&self) {
        let started = Instant::now();
        self.settle();
        let (lsn, batch, path, file) = {
            let mut store = self.store.borrow_mut();
            // Everything pending is inside the snapshot.
            (
                store.last_lsn(),
                store.take(),
                store.snapshot_path(),
                store.file(),
            )
        };
        let (tx, rx) = persist::snapshot_channel();
        let writer = self
            .background
            .run(move || persist::install_snapshot(&path, rx, &file));
        let mut size = persist::snapshot::HEADER_LEN;
        {
            let engine = self.engine.borrow();
            let (namespaces, hwm) = engine.state();
            persist::snapshot::encode(namespaces, hwm, lsn, |p| {
                if let persist::snapshot::Piece::Body(b) = &p {
                    size += b.len();
                }
                tx.send(p).is_ok()
            });
        }
        drop(tx);
        let pause = started.elapsed();
        match writer.await {
            Ok(Ok(())) => {}
            Ok(Err(WriteError::Full(e))) => {
                tracing::warn!(shard = self.id, error = %e, "no room for a snapshot: the previous one stays, with the log; trying again later");
                let mut store = self.store.borrow_mut();
                store.untake(batch);
                store.stats.snapshot_failing = true;
                self.snapshot_after
                    .set(Some(Instant::now() + SNAPSHOT_RETRY));
                self.flush_wake.notify_one();
                return;
            }
            Ok(Err(WriteError::Failed(e))) => return self.fail("write a snapshot", &e),
            Err(gone) => return self.fail("write a snapshot", &gone),
        }
        let mut store = self.store.borrow_mut();
        store.snapshot_installed(lsn);
        store.stats.snapshots += 1;
        store.stats.snapshot_failing = false;
        store.stats.last_snapshot_us = started.elapsed().as_micros() as u64;
        store.stats.last_snapshot_pause_us = pause.as_micros() as u64;
        store.stats.last_fsync_at = self.global.wall_nanos();
        self.global.mark_durable(self.id, lsn);
        tracing::info!(
            shard = self.id,
            bytes = size,
            pause_us = pause.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "snapshot written"
        );
    }

    /// Under `everysec`, syncs the log about once a second.
    pub(super) async fn everysec_loop(self: Rc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            if matches!(*self.disk.borrow(), Disk::Failed(_)) {
                return;
            }
            let file = self.store.borrow().file();
            match self.background.run(move || file.sync_data()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return self.fail("sync the log", &e),
                Err(gone) => return self.fail("sync the log", &gone),
            }
            let mut store = self.store.borrow_mut();
            store.stats.fsyncs += 1;
            store.stats.last_fsync_at = self.global.wall_nanos();
        }
    }

    /// Writes and syncs whatever is pending (at shutdown). Nothing while changes are refused:
    /// what waits then is rolled back, or failed, or expiries that the next start makes again.
    pub fn final_flush(&self) {
        self.settle();
        // In cluster mode the log is the cluster's: what was not committed is not saved.
        if !self.writing() || self.clustered() {
            return;
        }
        let mut store = self.store.borrow_mut();
        let batch = store.take();
        if let Err(e) = persist::write_batch(&store.file(), &batch.bytes, true) {
            tracing::error!(shard = self.id, error = %e, "could not flush the log at shutdown");
        }
    }
}

/// The `MISCONF` error of changes refused because the data directory is full (Redis's code;
/// the sentence names the directory and the OS error, as Redis's AOF error names its error).
fn refusal(g: &Global, e: &std::io::Error) -> Error {
    Error::Misconf(format!(
        "permitd cannot write to its data directory {}: {e}; changes are refused until there is \
         room",
        g.config.dir.display()
    ))
}
