//! A shard's runtime: it owns one engine shard on its thread and runs it. It runs the requests
//! of its namespaces (inline for this thread's connections, or sent by other threads), fires
//! the engine's deadlines with a timer (no periodic sweep), delivers the replies of parked
//! acquires, and writes the engine's journal to the log behind the replies. The engine decides,
//! this file carries the decisions out (openraft's engine/runtime split); it knows nothing of
//! connections, which thread.rs serves on the same thread.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use super::background::{Background, Gone};
use super::clock::{Clock, Reading};
use super::global::Global;
use super::msg::{Done, Durable, ShardInfo, ShardMsg};
use crate::engine::request::EngineRequest;
use crate::engine::room::{shrink_map, FastMap};
use crate::engine::types::{Name, Nanos};
use crate::engine::{Cancel, Exec, Shard, WaiterId};
use crate::persist::{self, Fsync, ShardState, Store};
use crate::protocol::Reply;

/// A shard's runtime (see the module docs), shared by its thread's tasks through an `Rc`.
pub struct ShardCtx {
    /// This shard's index.
    pub id: usize,
    /// Server-wide state.
    pub global: Arc<Global>,
    engine: RefCell<Shard>,
    store: RefCell<Store>,
    /// The thread of the log's blocking writes and syncs.
    background: Background,
    parked: RefCell<FastMap<WaiterId, oneshot::Sender<Durable<Reply>>>>,
    timer_wake: Notify,
    flush_wake: Notify,
    /// The deadline the timer task sleeps until (None: no deadline).
    scheduled: Cell<Option<Nanos>>,
    /// The engine's `now`, and the wall clock's forward steps.
    clock: Clock,
    /// Commands run by this thread's connections (per thread: no shared counter to contend on).
    commands: Cell<u64>,
}

impl ShardCtx {
    /// Builds shard `id`'s runtime over its loaded state and starts its tasks (the timer, the
    /// log's flushing and, under `everysec`, its syncs) on the current `LocalSet`.
    pub fn start(
        id: usize,
        global: Arc<Global>,
        state: ShardState,
        store: Store,
        background: Background,
    ) -> Rc<ShardCtx> {
        let mut engine = Shard::restore(
            global.limits.clone(),
            global.namespace_count(),
            state.namespaces,
            state.hwm,
        );
        engine.share_waiter_count(global.waiter_count());
        let policy = store.policy;
        let ctx = Rc::new(ShardCtx {
            id,
            global,
            engine: RefCell::new(engine),
            store: RefCell::new(store),
            background,
            parked: RefCell::new(FastMap::default()),
            timer_wake: Notify::new(),
            flush_wake: Notify::new(),
            scheduled: Cell::new(None),
            clock: Clock::default(),
            commands: Cell::new(0),
        });
        tokio::task::spawn_local(ctx.clone().timer_loop());
        tokio::task::spawn_local(ctx.clone().flush_loop());
        if policy == Fsync::Everysec {
            tokio::task::spawn_local(ctx.clone().everysec_loop());
        }
        ctx
    }

    /// Counts a command a connection of this thread runs (INFO's `total_commands_processed`).
    pub fn count_command(&self) {
        self.commands.set(self.commands.get() + 1);
    }

    /// The engine's `now` (see clock.rs). After a forward step of the wall clock, the engine's
    /// lease deaths and deadlines move with it before anything runs at the new `now`; every
    /// caller settles, which journals the shift.
    fn now(&self) -> Nanos {
        let Reading { now, step } = self.clock.read(self.global.wall_nanos());
        if let Some(by) = step {
            tracing::warn!(
                shard = self.id,
                step_ms = by / 1_000_000,
                "the wall clock stepped forward: every lease and acquire time-out moves with it"
            );
            self.engine.borrow_mut().shift_time(now, by);
        }
        now
    }

    /// Runs one request of this shard's namespaces.
    pub fn exec(&self, req: EngineRequest, may_wait: bool) -> Done {
        let done = self.exec_at(self.now(), req, may_wait);
        self.settle();
        done
    }

    /// Runs one request at `now`; the caller settles.
    fn exec_at(&self, now: Nanos, req: EngineRequest, may_wait: bool) -> Done {
        match self.engine.borrow_mut().execute(now, req, may_wait) {
            Exec::Reply(r) => Done::Reply(r),
            Exec::Parked(id) => {
                let (tx, rx) = oneshot::channel();
                self.parked.borrow_mut().insert(id, tx);
                Done::Parked(rx, id)
            }
        }
    }

    /// Runs requests in order, stopping after the first that parks. They all run at one
    /// instant: nothing (an expiry, a time-out) happens between two of them, which is what makes
    /// a MULTI/EXEC atomic.
    pub fn exec_batch(&self, reqs: Vec<EngineRequest>, may_wait: bool) -> Vec<Done> {
        let now = self.now();
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            let d = self.exec_at(now, r, may_wait);
            let parked = matches!(d, Done::Parked(..));
            out.push(d);
            if parked {
                break;
            }
        }
        self.settle();
        out
    }

    /// Takes a parked acquire of this shard out of its queue.
    pub fn cancel(&self, waiter: WaiterId, why: Cancel) -> bool {
        let now = self.now();
        let was = self.engine.borrow_mut().cancel(now, waiter, why);
        if why == Cancel::Disconnected {
            self.parked.borrow_mut().remove(&waiter);
        }
        self.settle();
        was
    }

    /// LSN of the last change this shard made: a reply written after it is durable shows no
    /// state that a crash could take back.
    pub fn last_lsn(&self) -> u64 {
        self.store.borrow().last_lsn()
    }

    /// Journals the engine's changes, delivers its replies to parked clients, and re-arms the
    /// timer if needed.
    fn settle(&self) {
        let (outbox, journal) = {
            let mut engine = self.engine.borrow_mut();
            (engine.take_outbox(), engine.take_journal())
        };
        let lsn = if journal.is_empty() {
            self.last_lsn()
        } else {
            let lsn = self.store.borrow_mut().append(journal);
            self.flush_wake.notify_one();
            lsn
        };
        if !outbox.is_empty() {
            let mut parked = self.parked.borrow_mut();
            for (id, reply) in outbox {
                if let Some(tx) = parked.remove(&id) {
                    // A client that left meanwhile drops the reply; the engine moved on.
                    let _ = tx.send(Durable { value: reply, lsn });
                }
            }
        }
        let next = self.engine.borrow_mut().next_deadline();
        if let Some(n) = next {
            if self.scheduled.get().is_none_or(|s| n < s) {
                self.timer_wake.notify_one();
            }
        }
    }

    /// Fires deadlines on time: sleeps until the engine's next one, or until woken because an
    /// earlier one appeared.
    async fn timer_loop(self: Rc<Self>) {
        loop {
            let next = self.engine.borrow_mut().next_deadline();
            self.scheduled.set(next);
            match next {
                None => self.timer_wake.notified().await,
                Some(t) => {
                    let wait = t - self.clock.peek(self.global.wall_nanos());
                    if wait > 0 {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_nanos(wait as u64)) => {}
                            _ = self.timer_wake.notified() => {}
                        }
                    }
                }
            }
            let now = self.now();
            self.engine.borrow_mut().advance(now);
            self.settle();
        }
    }

    /// Answers a request of a connection of this or another thread.
    pub fn handle(&self, msg: ShardMsg) {
        match msg {
            ShardMsg::Exec {
                reqs,
                may_wait,
                reply,
            } => {
                let done = self.exec_batch(reqs, may_wait);
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value: done, lsn });
            }
            ShardMsg::Cancel { waiter, why, reply } => {
                let _ = reply.send(self.cancel(waiter, why));
            }
            ShardMsg::NsList {
                page,
                visible_to,
                reply,
            } => {
                let now = self.now();
                let mut engine = self.engine.borrow_mut();
                engine.advance(now);
                let visible =
                    |ns: &Name| visible_to.as_ref().is_none_or(|u| u.can_access(ns.bytes()));
                let part = engine.ns_list_part_where(&page, visible);
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value: part, lsn });
                drop(engine);
                self.settle();
            }
            ShardMsg::Info { reply } => {
                let now = self.now();
                let mut engine = self.engine.borrow_mut();
                engine.advance(now);
                let _ = reply.send(ShardInfo {
                    counts: engine.counts(),
                    stats: engine.stats(),
                    persist: self.store.borrow().stats,
                    commands: self.commands.get(),
                });
                drop(engine);
                self.settle();
            }
        }
    }

    /// Gives back room after connections went away: the parked-acquire map and the engine's
    /// indexes shrink if they are mostly empty.
    pub fn shrink(&self) {
        shrink_map(&mut self.parked.borrow_mut());
        self.engine.borrow_mut().shrink_sparse();
    }

    /// Writes the log behind the commands: each pass takes every record framed since the last
    /// one and writes it with one write (and one fdatasync under `always`): group commit.
    async fn flush_loop(self: Rc<Self>) {
        loop {
            if !self.store.borrow().has_pending() {
                self.flush_wake.notified().await;
                continue;
            }
            self.flush_once().await;
            if self.store.borrow().wants_snapshot() {
                self.snapshot().await;
            }
        }
    }

    /// Writes the pending batch. Replies wait at least for the write (so a process crash loses
    /// nothing acknowledged under any policy); under `always` also for the fdatasync, which runs
    /// on the background thread while the shard keeps serving. Without a sync, the write only
    /// copies to the page cache and is done in place.
    async fn flush_once(&self) {
        let (batch, file, policy) = {
            let mut store = self.store.borrow_mut();
            (store.take(), store.file(), store.policy)
        };
        let sync = policy == Fsync::Always;
        let len = batch.bytes.len() as u64;
        let bytes = batch.bytes;
        let res = if sync {
            self.background
                .run(move || persist::write_batch(&file, &bytes, true))
                .await
        } else {
            Ok(persist::write_batch(&file, &bytes, false))
        };
        fatal_if_failed(res, "write the log");
        let mut store = self.store.borrow_mut();
        store.stats.log_bytes += len;
        if sync {
            store.stats.fsyncs += 1;
            store.stats.last_fsync_at = self.global.wall_nanos();
        }
        self.global.mark_durable(self.id, batch.lsn);
    }

    /// Replaces the log by a snapshot of the shard's state. The shard pauses only while its
    /// state is serialized; writing and syncing happen on the background thread.
    async fn snapshot(&self) {
        let started = Instant::now();
        self.settle();
        let lsn = self.last_lsn();
        let (path, file) = {
            let mut store = self.store.borrow_mut();
            // Everything pending is inside the snapshot.
            let _ = store.take();
            (store.snapshot_path(), store.file())
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
        fatal_if_failed(writer.await, "write a snapshot");
        let mut store = self.store.borrow_mut();
        store.stats.log_bytes = 0;
        store.stats.snapshots += 1;
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
    async fn everysec_loop(self: Rc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let file = self.store.borrow().file();
            let res = self.background.run(move || file.sync_data()).await;
            fatal_if_failed(res, "sync the log");
            let mut store = self.store.borrow_mut();
            store.stats.fsyncs += 1;
            store.stats.last_fsync_at = self.global.wall_nanos();
        }
    }

    /// Writes and syncs whatever is pending (at shutdown).
    pub fn final_flush(&self) {
        self.settle();
        let mut store = self.store.borrow_mut();
        let batch = store.take();
        if let Err(e) = persist::write_batch(&store.file(), &batch.bytes, true) {
            tracing::error!(shard = self.id, error = %e, "could not flush the log at shutdown");
        }
    }
}

/// A failed log write cannot be acknowledged: stop rather than answer as if it had succeeded.
fn fatal_if_failed(res: Result<std::io::Result<()>, Gone>, what: &str) {
    let err = match res {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    };
    tracing::error!(error = %err, "could not {what}; stopping so that no unsaved change is acknowledged");
    std::process::exit(1);
}
