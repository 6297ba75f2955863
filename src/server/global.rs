//! State shared by every thread of the server: the options, the shard threads' inboxes, the
//! client registry, the users, and how far each shard's log is durable. What only one party may
//! change (the shutdown flag, the durable LSNs, the engine's server-wide counters) is private,
//! behind the methods of that party.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::Instant;

use tokio::sync::futures::Notified;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::acl::Acl;
use super::clients::Registry;
use super::latency::LatencyMonitor;
use super::memory::MemoryLimit;
use super::monitor::Monitors;
use super::msg::{ShardMsg, ThreadMsg};
use super::slowlog::SlowLog;
use super::topology::Topology;
use crate::cluster::node::Handle;
use crate::cluster::stamps::Wall;
use crate::config::Config;
use crate::engine::types::{Limits, Name, Nanos};
use crate::error::Error;
use crate::protocol::RequestLimits;

/// How many roll-backs a shard's [`Saved`] remembers one by one; older ones are merged, and an
/// LSN between two merged ones counts as rolled back too. A connection checks its replies'
/// LSNs when it writes them, and each roll-back after the first needs a write that succeeded
/// in between (a second or more of retrying), so only a reply held back across many of them
/// could be misjudged, and then as failed rather than saved. In cluster mode a stand-by rolls
/// back up to three ranges at once, with no write between stand-bys: a merge keeps the
/// answer that says less ("it may have taken effect" over "nothing was changed").
const LOST_KEPT: usize = 16;

/// How far a shard's log is saved, and which of its LSNs never will be: the changes rolled
/// back because they could not be written, each with the error their clients get.
#[derive(Debug, Clone, Default)]
pub struct Saved {
    /// Every LSN up to this one is on disk, but the rolled-back ones.
    pub lsn: u64,
    /// None until a roll-back: a connection keeps one of these per shard, made without an
    /// allocation.
    lost: Option<Arc<Vec<Lost>>>,
}

/// LSNs `after + 1 ..= upto`, rolled back.
#[derive(Debug, Clone)]
struct Lost {
    after: u64,
    upto: u64,
    error: Error,
}

impl Saved {
    /// The error of a rolled-back change, if `lsn` is one.
    pub fn lost(&self, lsn: u64) -> Option<&Error> {
        self.lost
            .as_deref()?
            .iter()
            .rev()
            .find(|l| l.after < lsn && lsn <= l.upto)
            .map(|l| &l.error)
    }

    /// Whether `lsn`'s change is on disk.
    pub fn has(&self, lsn: u64) -> bool {
        lsn <= self.lsn && self.lost(lsn).is_none()
    }

    /// Whether `lsn`'s fate is known: on disk, or rolled back.
    fn settles(&self, lsn: u64) -> bool {
        lsn <= self.lsn || self.lost(lsn).is_some()
    }
}

/// See the module docs.
pub struct Global {
    /// The options the server runs with.
    pub config: Config,
    /// The engine limits of `config`.
    pub limits: Arc<Limits>,
    /// The request limits of `config`.
    pub request_limits: RequestLimits,
    /// The registry of connected clients.
    pub clients: Registry,
    /// Users and their permissions.
    pub acl: Acl,
    /// TLS settings of `--tls-port`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `--maxmemory`, and whether it is exceeded.
    pub memory: MemoryLimit,
    /// The port listened on (`--port 0` picks one).
    pub port: u16,
    /// The cluster as this node knows it (replaced when the cluster's leader or members
    /// change).
    topology: RwLock<Topology>,
    /// Cluster mode: the node's handle, set once it runs.
    cluster: OnceLock<Handle>,
    /// When the server was ready to serve (after loading its data).
    pub started: Instant,
    /// The clients in MONITOR mode.
    pub monitors: Monitors,
    /// SLOWLOG's entries.
    pub slowlog: SlowLog,
    /// LATENCY's events.
    pub latency: LatencyMonitor,
    inboxes: Vec<mpsc::UnboundedSender<ThreadMsg>>,
    shutdown: watch::Sender<bool>,
    /// SHUTDOWN was asked: the accepting thread stops taking connections, hands leadership
    /// over in cluster mode (connections are still served meanwhile), then shuts down.
    stop_asked: watch::Sender<bool>,
    /// Per shard: the LSN up to which its log is durable (written, and under `--fsync always`
    /// also synced), and the LSNs rolled back.
    durable: Vec<watch::Sender<Saved>>,
    /// A shard stopped the server after a write failed (it then exits non-zero).
    failed: AtomicBool,
    /// Namespaces on all shards (the quota is server-wide).
    namespace_count: Arc<AtomicUsize>,
    /// Parked acquires on all shards (the `--max-waiters` quota).
    waiter_count: Arc<AtomicUsize>,
    /// Set by a shard after its trim: the accepting thread then trims too. Its memory of the
    /// connections it handed over (socket registrations, messages) is freed by the shards or on
    /// its own next turn, and an idle thread would keep those pages.
    trim_acceptor: Notify,
    /// The wall clock, shared with cluster mode's peer links.
    wall: Wall,
    /// Acquires parked on this node as leader that wait to be sent to the next one (cluster
    /// mode): a stopping node keeps its Raft running until they are answered.
    redirecting: Arc<AtomicUsize>,
}

impl Global {
    /// The cluster as this node knows it now. Drop the guard before asking again: a second
    /// read on a thread that holds one may wait forever behind a writer (std's `RwLock`).
    pub fn topology(&self) -> RwLockReadGuard<'_, Topology> {
        self.topology.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cluster mode: the node's handle (`None` on a single node).
    pub fn cluster(&self) -> Option<&Handle> {
        self.cluster.get()
    }

    /// Cluster mode: the node runs (set once, at start).
    pub fn set_cluster(&self, node: Handle) {
        let _ = self.cluster.set(node);
    }

    /// Replaces the topology: the cluster elected another leader, or its members changed.
    pub fn set_topology(&self, topology: Topology) {
        *self
            .topology
            .write()
            .unwrap_or_else(PoisonError::into_inner) = topology;
    }

    /// The shared state of a server with one shard thread per inbox.
    pub fn new(
        config: Config,
        acl: Acl,
        tls: Option<Arc<rustls::ServerConfig>>,
        port: u16,
        topology: Topology,
        inboxes: Vec<mpsc::UnboundedSender<ThreadMsg>>,
    ) -> Global {
        Global {
            limits: Arc::new(config.limits()),
            request_limits: config.request_limits(),
            memory: MemoryLimit::new(config.maxmemory),
            monitors: Monitors::default(),
            slowlog: SlowLog::new(config.slowlog_log_slower_than, config.slowlog_max_len),
            latency: LatencyMonitor::new(config.latency_monitor_threshold),
            config,
            clients: Registry::default(),
            acl,
            tls,
            port,
            topology: RwLock::new(topology),
            cluster: OnceLock::new(),
            started: Instant::now(),
            durable: inboxes
                .iter()
                .map(|_| watch::channel(Saved::default()).0)
                .collect(),
            failed: AtomicBool::new(false),
            inboxes,
            shutdown: watch::channel(false).0,
            stop_asked: watch::channel(false).0,
            namespace_count: Arc::new(AtomicUsize::new(0)),
            waiter_count: Arc::new(AtomicUsize::new(0)),
            trim_acceptor: Notify::new(),
            wall: Wall::default(),
            redirecting: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The wall clock, in nanoseconds since the Unix epoch: what the shards' clocks read.
    pub fn wall_nanos(&self) -> Nanos {
        self.wall.now()
    }

    /// The wall clock itself (cluster mode stamps its appends with it).
    pub fn wall(&self) -> Wall {
        self.wall.clone()
    }

    /// Counts parked acquires on their way to the next leader until the guard drops.
    pub fn redirecting(&self, count: usize) -> Redirecting {
        self.redirecting.fetch_add(count, Ordering::SeqCst);
        Redirecting {
            count,
            of: self.redirecting.clone(),
        }
    }

    /// How many parked acquires wait to be sent to the next leader.
    pub fn redirects_pending(&self) -> usize {
        self.redirecting.load(Ordering::SeqCst)
    }

    /// Moves the server's wall clock `by` (`DEBUG CLOCK-STEP`), as an NTP step moves the
    /// system's.
    pub fn step_clock(&self, by: Nanos) {
        self.wall.step(by);
    }

    /// How many shards (and shard threads) the server runs.
    pub fn shard_count(&self) -> usize {
        self.inboxes.len()
    }

    /// The shard owning namespace `ns`.
    pub fn shard_of(&self, ns: &Name) -> usize {
        crate::engine::route::shard_for(ns, self.shard_count())
    }

    /// Puts `msg` in shard thread `shard`'s inbox; it comes back if that thread has stopped.
    pub fn send(&self, shard: usize, msg: ThreadMsg) -> Result<(), ThreadMsg> {
        self.inboxes[shard].send(msg).map_err(|e| e.0)
    }

    /// Sends shard `shard` a request carrying a reply channel and waits for the answer (`None`
    /// when the shard is gone, at shutdown).
    pub async fn ask<T>(
        &self,
        shard: usize,
        msg: impl FnOnce(oneshot::Sender<T>) -> ShardMsg,
    ) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.inboxes[shard].send(ThreadMsg::Shard(msg(tx))).ok()?;
        rx.await.ok()
    }

    /// Asks every shard at once, then gathers the answers with their shard's index.
    pub async fn ask_all<T>(
        &self,
        msg: impl Fn(oneshot::Sender<T>) -> ShardMsg,
    ) -> Vec<(usize, T)> {
        let mut waits = Vec::with_capacity(self.inboxes.len());
        for (shard, inbox) in self.inboxes.iter().enumerate() {
            let (tx, rx) = oneshot::channel();
            if inbox.send(ThreadMsg::Shard(msg(tx))).is_ok() {
                waits.push((shard, rx));
            }
        }
        let mut answers = Vec::with_capacity(waits.len());
        for (shard, rx) in waits {
            if let Ok(a) = rx.await {
                answers.push((shard, a));
            }
        }
        answers
    }

    /// Starts a graceful shutdown: no new connections, and every connection stops reading,
    /// writes the replies it owes, and closes.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
        self.clients.stop_reading_all();
    }

    /// SHUTDOWN: the server stops as SIGTERM stops it (listener.rs).
    pub fn ask_stop(&self) {
        self.stop_asked.send_replace(true);
    }

    /// A watch of [`Global::ask_stop`], to wait for it.
    pub fn watch_stop_asked(&self) -> watch::Receiver<bool> {
        self.stop_asked.subscribe()
    }

    /// Whether the server is shutting down.
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// A watch of the shutdown flag, to wait for it.
    pub fn watch_shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Waits until shard `shard`'s log is durable up to `lsn`, or `lsn` is rolled back; returns
    /// what is known then.
    pub async fn wait_durable(&self, shard: usize, lsn: u64) -> Saved {
        let durable = &self.durable[shard];
        {
            let now = durable.borrow();
            if now.settles(lsn) {
                return now.clone();
            }
        }
        let mut rx = durable.subscribe();
        // The sender lives as long as `self`: the wait ends with an answer.
        let saved = rx.wait_for(|d| d.settles(lsn)).await.map(|d| d.clone());
        saved.unwrap_or_default()
    }

    /// Shard `shard`'s log is durable up to `lsn` now (called by that shard alone).
    pub fn mark_durable(&self, shard: usize, lsn: u64) {
        self.durable[shard].send_modify(|d| d.lsn = d.lsn.max(lsn));
    }

    /// Shard `shard`'s changes after `after` up to `upto` are rolled back: the replies that may
    /// show them go out as `error` (called by that shard alone).
    pub fn roll_back(&self, shard: usize, after: u64, upto: u64, error: Error) {
        self.durable[shard].send_modify(|d| {
            let mut lost = d.lost.as_deref().cloned().unwrap_or_default();
            lost.push(Lost { after, upto, error });
            if lost.len() > LOST_KEPT {
                let oldest = lost.remove(0);
                lost[0].after = oldest.after;
                if !matches!(oldest.error, Error::TryAgain(_)) {
                    lost[0].error = oldest.error;
                }
            }
            d.lost = Some(Arc::new(lost));
        });
    }

    /// Stops the server because a shard's write failed: connections write what they owe and
    /// close, and the process exits non-zero.
    pub fn stop_failed(&self) {
        self.failed.store(true, Ordering::Release);
        self.begin_shutdown();
    }

    /// Whether a failed write stopped the server.
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The server-wide namespace count, which the engine shards keep.
    pub fn namespace_count(&self) -> Arc<AtomicUsize> {
        self.namespace_count.clone()
    }

    /// The server-wide count of parked acquires, which the engine shards keep.
    pub fn waiter_count(&self) -> Arc<AtomicUsize> {
        self.waiter_count.clone()
    }

    /// Asks the accepting thread to trim its memory too (after a shard trimmed).
    pub fn trim_acceptor(&self) {
        self.trim_acceptor.notify_one();
    }

    /// Resolves when a shard asked the accepting thread to trim.
    pub fn acceptor_trim_asked(&self) -> Notified<'_> {
        self.trim_acceptor.notified()
    }
}

/// Parked acquires counted by [`Global::redirecting`] until this drops.
pub struct Redirecting {
    count: usize,
    of: Arc<AtomicUsize>,
}

impl Drop for Redirecting {
    fn drop(&mut self) {
        self.of.fetch_sub(self.count, Ordering::SeqCst);
    }
}
