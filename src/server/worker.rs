//! A shard's runtime: it owns one engine shard on its thread and runs it. It runs the requests
//! of its namespaces (inline for this thread's connections, or sent by other threads), fires
//! the engine's deadlines with a timer (no periodic sweep), and delivers the replies of parked
//! acquires; disk.rs writes the engine's journal to the log behind the replies, and handles a
//! full data directory. The engine decides, these files carry the decisions out (openraft's
//! engine/runtime split); they know nothing of connections, which thread.rs serves on the same
//! thread.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::sync::{oneshot, Notify};

use super::acl::User;
use super::background::Background;
use super::clock::{Clock, Reading};
use super::global::Global;
use super::msg::{
    Call, Done, Durable, NsAnswer, Ran, ShardInfo, ShardMsg, TxAnswer, TxDone, TxItem,
};
use super::parking::Parking;
use super::semstats::{SemKey, Waits};
use super::stats::{CommandStats, Outcome};
use crate::cluster::LeaderId;
use crate::command::CommandSpec;
use crate::engine::page::Page;
use crate::engine::room::{shrink_map, FastMap};
use crate::engine::types::{Name, Nanos};
use crate::engine::view::is_acquired;
use crate::engine::{Cancel, Exec, Shard, WaiterId};
use crate::error::Error;
use crate::persist::{Fsync, ShardState, Store};
use crate::protocol::{Proto, Reply};

mod disk;
mod replica;
mod scrape;

/// Whether the shard's changes can be written.
enum Disk {
    /// They are written as they come.
    Writing,
    /// A write lacked room: changes are refused with the error while those not yet written are
    /// rolled back; replies that may show them wait, then get the error.
    RollingBack(Error),
    /// The data directory is full: changes are refused with the error, and the log is tried
    /// again every second (disk.rs). Grants are held, so what changes meanwhile is expiries
    /// alone, which a restart makes again: replies may show them at once.
    Full(Error),
    /// A write or sync failed otherwise: the server is stopping, and every change not written
    /// before gets the error.
    Failed(Error),
}

impl Disk {
    /// The error a change gets now, if it is refused.
    fn refusal(&self) -> Option<&Error> {
        match self {
            Disk::Writing => None,
            Disk::RollingBack(e) | Disk::Full(e) | Disk::Failed(e) => Some(e),
        }
    }
}

/// Whether the shard serves.
enum Leading {
    /// A single node: it always does.
    Alone,
    /// Cluster mode, this node does not lead, is taking over, or leads but may not serve (a
    /// change of unknown fate in this leadership, its clock ahead): nothing is served.
    Standby,
    /// Cluster mode, this node leads in this leadership, and the shard's state is the
    /// committed state of the cluster plus its own proposals.
    Serving(LeaderId),
}

/// A parked acquire's reply channel.
struct Parked {
    tx: oneshot::Sender<Durable<Reply>>,
    /// Its command's table entry, which counts how the wait ends.
    spec: &'static CommandSpec,
    /// The LSN of the change it parked with (it moves the semaphore's `last_activity_at`): it
    /// stays parked through a roll-back only if that change was saved.
    lsn: u64,
    /// When it parked, and on which semaphore (with `--metrics-port` only): `/metrics` shows
    /// the oldest wait and the waits that ended in a grant.
    since: Instant,
    sem: Option<SemKey>,
}

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
    disk: RefCell<Disk>,
    parked: RefCell<FastMap<WaiterId, Parked>>,
    /// The acquire that parked in the request being run, whose LSN `settle` learns.
    just_parked: Cell<Option<WaiterId>>,
    /// No snapshot is tried before then (the last one had no room).
    snapshot_after: Cell<Option<Instant>>,
    timer_wake: Notify,
    flush_wake: Notify,
    /// The deadline the timer task sleeps until (None: no deadline).
    scheduled: Cell<Option<Nanos>>,
    /// The engine's `now`, and the wall clock's forward steps.
    clock: Clock,
    /// The last `now` read: what a cluster proposal is stamped with.
    last_now: Cell<Nanos>,
    /// Whether the shard serves (replica.rs: cluster mode serves on the leader only).
    leading: RefCell<Leading>,
    /// Cluster mode: the proposals in flight, and the LSN the last one made covers.
    in_flight: Cell<usize>,
    proposed: Cell<u64>,
    /// Cluster mode: a leadership the shard stood by from with a proposal of unknown fate
    /// (replica.rs: it does not serve under it again).
    tainted: Cell<Option<LeaderId>>,
    /// Cluster mode: the LSN up to which a stand-by answered every waiting reply. The next
    /// one's answers start above it: a later roll-back of the same LSNs would relabel them
    /// (the newest wins), and a take-over does not move `saved_lsn` or `proposed`.
    answered: Cell<u64>,
    /// Cluster mode: the shard stood by; whether to take over again is to be decided.
    leadership_wake: Notify,
    /// Commands run by this thread's connections (per thread: no shared counter to contend on).
    commands: Cell<u64>,
    /// Per-command figures of the commands run on this thread (stats.rs).
    stats: RefCell<CommandStats>,
    /// Waits from park to grant per semaphore, counted only with `--metrics-port`.
    waits: RefCell<Waits>,
}

impl ShardCtx {
    /// Builds shard `id`'s runtime over its loaded state and starts its tasks (the timer, the
    /// log's flushing and, under `everysec`, its syncs) on the current `LocalSet`. In cluster
    /// mode the state is empty and the shard stands by until its node leads; its changes are
    /// proposed to the cluster instead of written (replica.rs).
    pub fn start(
        id: usize,
        global: Arc<Global>,
        state: ShardState,
        mut store: Store,
        background: Background,
    ) -> Rc<ShardCtx> {
        let node = global.cluster().cloned();
        if node.is_some() {
            store.propose_instead();
        }
        let mut engine = Shard::restore(
            global.limits.clone(),
            global.namespace_count(),
            state.namespaces,
            state.hwm,
        );
        engine.share_waiter_count(global.waiter_count());
        global.mark_durable(id, store.saved_lsn());
        let policy = store.policy;
        let ctx = Rc::new(ShardCtx {
            id,
            global,
            engine: RefCell::new(engine),
            store: RefCell::new(store),
            background,
            disk: RefCell::new(Disk::Writing),
            parked: RefCell::new(FastMap::default()),
            just_parked: Cell::new(None),
            snapshot_after: Cell::new(None),
            timer_wake: Notify::new(),
            flush_wake: Notify::new(),
            scheduled: Cell::new(None),
            clock: Clock::default(),
            last_now: Cell::new(0),
            leading: RefCell::new(match node {
                Some(_) => Leading::Standby,
                None => Leading::Alone,
            }),
            in_flight: Cell::new(0),
            proposed: Cell::new(0),
            tainted: Cell::new(None),
            answered: Cell::new(0),
            leadership_wake: Notify::new(),
            commands: Cell::new(0),
            stats: RefCell::new(CommandStats::default()),
            waits: RefCell::new(Waits::default()),
        });
        // In cluster mode the shard's own files are not written (the Raft log is).
        if let (Some(e), false) = (state.full, ctx.clustered()) {
            ctx.start_full(&e);
        }
        tokio::task::spawn_local(ctx.clone().timer_loop());
        match node {
            Some(node) => {
                tokio::task::spawn_local(ctx.clone().replicate_loop(node.clone()));
                tokio::task::spawn_local(ctx.clone().follow_leadership(node));
            }
            None => {
                tokio::task::spawn_local(ctx.clone().flush_loop());
                if policy == Fsync::Everysec {
                    tokio::task::spawn_local(ctx.clone().everysec_loop());
                }
            }
        }
        ctx
    }

    /// Counts a command a connection of this thread runs (INFO's `total_commands_processed`).
    pub fn count_command(&self) {
        self.commands.set(self.commands.get() + 1);
    }

    /// Counts a call of `name` in this thread's command statistics, and its error, if any.
    pub fn record(
        &self,
        name: &'static str,
        took: Duration,
        outcome: Outcome,
        error: Option<&Error>,
    ) {
        let mut stats = self.stats.borrow_mut();
        stats.record(name, took, outcome);
        if let Some(e) = error {
            stats.error(e);
        }
    }

    /// Counts a call of `name` that ran and answered `reply`.
    pub fn record_reply(&self, name: &'static str, took: Duration, reply: &Reply) {
        let (outcome, error) = Outcome::of(reply);
        self.record(name, took, outcome, error);
    }

    /// Counts an error reply that belongs to no command (an unknown one).
    pub fn count_error(&self, e: &Error) {
        self.stats.borrow_mut().error(e);
    }

    /// The engine's `now` (see clock.rs). After a forward step of the wall clock, the engine's
    /// lease deaths and deadlines move with it before anything runs at the new `now`; every
    /// caller settles, which journals the shift.
    fn now(&self) -> Nanos {
        let Reading { now, step } = self.clock.read(self.global.wall_nanos());
        // A shard that does not serve (cluster mode) holds nothing to shift, and must journal
        // nothing: its next leadership starts from the state machine.
        if let (Some(by), None) = (step, self.standby_refusal()) {
            tracing::warn!(
                shard = self.id,
                step_ms = by / 1_000_000,
                "the wall clock stepped forward: every lease and acquire time-out moves with it"
            );
            self.engine.borrow_mut().shift_time(now, by);
        }
        self.last_now.set(now);
        now
    }

    /// Runs one request of this shard's namespaces; an acquire may park for `parker`.
    pub fn exec(&self, call: Call, parker: Option<&Arc<Parking>>) -> Done {
        let done = self.exec_at(self.now(), call, parker);
        self.settle();
        done
    }

    /// Runs one request at `now`; the caller settles. A change is refused while the disk
    /// cannot take it. An acquire parks only for a `parker`, and one whose client was killed
    /// (by another thread, which then cancels what it finds parked) runs nothing, or leaves the
    /// queue at once if the kill came as it parked.
    fn exec_at(&self, now: Nanos, call: Call, parker: Option<&Arc<Parking>>) -> Done {
        if parker.is_some_and(|p| p.is_killed()) {
            return Done::Killed;
        }
        let Call { spec, req } = call;
        let name = spec.name;
        if let Some(e) = self.standby_refusal() {
            self.record(name, Duration::ZERO, Outcome::Rejected, Some(&e));
            return Done::Reply(Reply::Error(e));
        }
        if req.is_write() {
            if let Some(e) = self.disk.borrow().refusal() {
                self.record(name, Duration::ZERO, Outcome::Rejected, Some(e));
                return Done::Reply(Reply::Error(e.clone()));
            }
        }
        self.store.borrow_mut().note_read();
        let started = Instant::now();
        let exec = self
            .engine
            .borrow_mut()
            .execute(now, req, parker.map(|p| p.client()));
        match &exec {
            Exec::Reply(r) => self.record_reply(name, started.elapsed(), r),
            Exec::Parked(_) => self.record(name, started.elapsed(), Outcome::Ok, None),
        }
        match exec {
            Exec::Reply(r) => Done::Reply(r),
            Exec::Parked(id) => {
                if !parker.is_some_and(|p| p.park(self.id, id)) {
                    self.engine
                        .borrow_mut()
                        .cancel(now, id, Cancel::Disconnected);
                    return Done::Killed;
                }
                let (tx, rx) = oneshot::channel();
                // Only the wait histograms of `/metrics` need it (answer_parked).
                let sem = self
                    .global
                    .config
                    .metrics_port
                    .and_then(|_| self.engine.borrow().waiter_semaphore(id).cloned());
                let since = Instant::now();
                let p = Parked {
                    tx,
                    spec,
                    lsn: 0,
                    since,
                    sem,
                };
                self.parked.borrow_mut().insert(id, p);
                self.just_parked.set(Some(id));
                Done::Parked(rx, id)
            }
        }
    }

    /// Runs requests in order, stopping after the first that parks. They all run at one
    /// instant: nothing (an expiry, a time-out) happens between two of them, which is what makes
    /// a MULTI/EXEC atomic.
    pub fn exec_batch(&self, reqs: Vec<Call>, parker: Option<&Arc<Parking>>) -> Vec<Done> {
        let now = self.now();
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            let d = self.exec_at(now, r, parker);
            let parked = matches!(d, Done::Parked(..));
            out.push(d);
            if parked {
                break;
            }
        }
        self.settle();
        out
    }

    /// Runs non-blocking requests from the front of `reqs`, encoding their replies in `proto`,
    /// until the replies reach `budget` bytes (at least one runs); the rest are sent back. A
    /// pipeline of large replies (SEM.HOLDERS of big holders) is thus built a piece at a time,
    /// each piece written (or found past the client's output limit) before the next is built.
    pub fn run_batch(&self, mut reqs: VecDeque<Call>, proto: Proto, budget: usize) -> Ran {
        let now = self.now();
        let mut out = BytesMut::new();
        let mut ends = Vec::new();
        while let Some(r) = reqs.pop_front() {
            let reply = match self.exec_at(now, r, None) {
                Done::Reply(reply) => reply,
                // Without a parker nothing is left parked (exec_at takes it out at once).
                Done::Parked(..) | Done::Killed => {
                    Reply::Error(Error::Err("this acquire cannot wait here".into()))
                }
            };
            reply.encode(proto, &mut out);
            ends.push(out.len());
            if out.len() >= budget {
                break;
            }
        }
        self.settle();
        Ran {
            out,
            ends,
            rest: reqs,
        }
    }

    /// Runs a transaction's items in order, at one instant, as [`exec_batch`](Self::exec_batch)
    /// runs its requests (acquires do not wait). A shard that does not serve (cluster mode,
    /// leadership moving) runs none: EXEC answers its one refusal, as Redis Cluster answers a
    /// transaction whose slot moved.
    pub fn exec_txn(&self, items: Vec<TxItem>) -> TxAnswer {
        if let Some(e) = self.standby_refusal() {
            return Err(e);
        }
        let now = self.now();
        let done = items
            .into_iter()
            .map(|item| match item {
                TxItem::Engine(r) => TxDone::Engine(self.exec_at(now, r, None)),
                TxItem::NsList(page, visible_to) => {
                    TxDone::NsList(self.ns_list_part(now, &page, visible_to.as_deref()))
                }
                TxItem::Info(latency) => TxDone::Info(Box::new(self.info_part(now, latency))),
                TxItem::Cancel(waiter, why) => TxDone::Cancel(self.cancel_at(now, waiter, why)),
            })
            .collect();
        self.settle();
        Ok(done)
    }

    /// Takes a parked acquire of this shard out of its queue.
    pub fn cancel(&self, waiter: WaiterId, why: Cancel) -> bool {
        let was = self.cancel_at(self.now(), waiter, why);
        self.settle();
        was
    }

    /// Takes a parked acquire out of its queue at `now`; the caller settles.
    fn cancel_at(&self, now: Nanos, waiter: WaiterId, why: Cancel) -> bool {
        let was = self.engine.borrow_mut().cancel(now, waiter, why);
        if why == Cancel::Disconnected {
            self.parked.borrow_mut().remove(&waiter);
        }
        was
    }

    /// This shard's part of an NS.LIST page at `now`, of the namespaces `visible_to` may access
    /// (`None`: all), or the refusal of a shard that does not serve; the caller settles.
    fn ns_list_part(&self, now: Nanos, page: &Page, visible_to: Option<&User>) -> NsAnswer {
        if let Some(e) = self.standby_refusal() {
            return Err(e);
        }
        self.store.borrow_mut().note_read();
        let mut engine = self.engine.borrow_mut();
        engine.advance(now);
        let visible = |ns: &Name| visible_to.is_none_or(|u| u.can_access(ns.bytes()));
        Ok(engine.ns_list_part_where(page, visible))
    }

    /// This shard's INFO figures at `now` (expiries due are fired first), the latency
    /// histograms only when asked for; the caller settles.
    fn info_part(&self, now: Nanos, latency: bool) -> ShardInfo {
        let mut engine = self.engine.borrow_mut();
        engine.advance(now);
        ShardInfo {
            counts: engine.counts(),
            stats: engine.stats(),
            persist: self.store.borrow().stats,
            commands: self.commands.get(),
            command_stats: self.stats.borrow().copy(latency),
        }
    }

    /// LSN of the last change this shard made that a crash (or, in cluster mode, a failover)
    /// could take back, or of the proposal a read waits for: a reply written after it is
    /// durable shows no such state. With a full disk, that is the last one saved (see
    /// [`Disk::Full`]); on a shard that does not serve (cluster mode), too: its refusals show
    /// nothing.
    pub fn last_lsn(&self) -> u64 {
        let store = self.store.borrow();
        if self.standby_refusal().is_some() || matches!(*self.disk.borrow(), Disk::Full(_)) {
            return store.saved_lsn();
        }
        store.last_lsn()
    }

    /// Journals the engine's changes, delivers its replies to parked clients, and re-arms the
    /// timer if needed.
    fn settle(&self) {
        let (outbox, journal) = {
            let mut engine = self.engine.borrow_mut();
            (engine.take_outbox(), engine.take_journal())
        };
        if !journal.is_empty() {
            self.store.borrow_mut().append(journal);
        }
        if self.store.borrow().has_pending() {
            self.flush_wake.notify_one();
        }
        let lsn = self.last_lsn();
        let mut parked = self.parked.borrow_mut();
        if let Some(id) = self.just_parked.take() {
            if let Some(p) = parked.get_mut(&id) {
                p.lsn = self.store.borrow().last_lsn();
            }
        }
        for (id, reply) in outbox {
            if let Some(p) = parked.remove(&id) {
                self.answer_parked(p, reply, lsn);
            }
        }
        drop(parked);
        let next = self.engine.borrow_mut().next_deadline();
        if let Some(n) = next {
            if self.scheduled.get().is_none_or(|s| n < s) {
                self.timer_wake.notify_one();
            }
        }
    }

    /// Answers a parked acquire, however its wait ended, and counts how under its own command:
    /// an error as a failed call (its call was counted when it parked), a grant in its
    /// semaphore's wait histogram (with `--metrics-port`).
    fn answer_parked(&self, p: Parked, reply: Reply, lsn: u64) {
        if let Reply::Error(e) = &reply {
            self.stats.borrow_mut().failed_later(p.spec.name, e);
        } else if let Some(sem) = &p.sem {
            if is_acquired(&reply) {
                let cap = self.global.config.metrics_max_semaphores;
                let waited = p.since.elapsed().as_secs_f64();
                self.waits.borrow_mut().observe(sem, waited, cap);
            }
        }
        // A client that left meanwhile drops the reply; the engine moved on.
        let _ = p.tx.send(Durable { value: reply, lsn });
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
    pub fn handle(self: &Rc<Self>, msg: ShardMsg) {
        match msg {
            ShardMsg::Exec {
                reqs,
                parker,
                reply,
            } => {
                let done = self.exec_batch(reqs, parker.as_ref());
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value: done, lsn });
            }
            ShardMsg::Batch {
                reqs,
                proto,
                budget,
                reply,
            } => {
                let value = self.run_batch(reqs, proto, budget);
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value, lsn });
            }
            ShardMsg::Cancel { waiter, why, reply } => {
                let _ = reply.send(self.cancel(waiter, why));
            }
            ShardMsg::Txn { items, reply } => {
                let done = self.exec_txn(items);
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value: done, lsn });
            }
            ShardMsg::NsList {
                page,
                visible_to,
                reply,
            } => {
                let part = self.ns_list_part(self.now(), &page, visible_to.as_deref());
                let lsn = self.last_lsn();
                let _ = reply.send(Durable { value: part, lsn });
                self.settle();
            }
            ShardMsg::ResetStats { reply } => {
                self.stats.replace(CommandStats::default());
                let _ = reply.send(());
            }
            ShardMsg::Info { latency, reply } => {
                let _ = reply.send(self.info_part(self.now(), latency));
                self.settle();
            }
            ShardMsg::Metrics {
                cap,
                visible_to,
                reply,
            } => {
                tokio::task::spawn_local(self.clone().scrape(cap, visible_to, reply));
            }
        }
    }

    /// Gives back room after connections went away: the parked-acquire map and the engine's
    /// indexes shrink if they are mostly empty.
    pub fn shrink(&self) {
        shrink_map(&mut self.parked.borrow_mut());
        self.engine.borrow_mut().shrink_sparse();
    }
}
