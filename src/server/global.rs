//! State shared by every thread of the server: the options, the shard threads' inboxes, the
//! client registry, the users, and how far each shard's log is durable. What only one party may
//! change (the shutdown flag, the durable LSNs, the engine's server-wide counters) is private,
//! behind the methods of that party.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::futures::Notified;
use tokio::sync::{mpsc, oneshot, watch, Notify};

use super::acl::Acl;
use super::clients::Registry;
use super::msg::{ShardMsg, ThreadMsg};
use super::topology::Topology;
use crate::config::Config;
use crate::engine::types::{Limits, Name};
use crate::protocol::RequestLimits;

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
    /// The port listened on (`--port 0` picks one).
    pub port: u16,
    /// The cluster as this node knows it.
    pub topology: Topology,
    /// When the server was ready to serve (after loading its data).
    pub started: Instant,
    inboxes: Vec<mpsc::UnboundedSender<ThreadMsg>>,
    shutdown: watch::Sender<bool>,
    /// Per shard: the LSN up to which its log is durable (written, and under `--fsync always`
    /// also synced).
    durable: Vec<watch::Sender<u64>>,
    /// Namespaces on all shards (the quota is server-wide).
    namespace_count: Arc<AtomicUsize>,
    /// Parked acquires on all shards (the `--max-waiters` quota).
    waiter_count: Arc<AtomicUsize>,
    /// Set by a shard after its trim: the accepting thread then trims too. Its memory of the
    /// connections it handed over (socket registrations, messages) is freed by the shards or on
    /// its own next turn, and an idle thread would keep those pages.
    trim_acceptor: Notify,
}

impl Global {
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
            config,
            clients: Registry::default(),
            acl,
            tls,
            port,
            topology,
            started: Instant::now(),
            durable: inboxes.iter().map(|_| watch::channel(0).0).collect(),
            inboxes,
            shutdown: watch::channel(false).0,
            namespace_count: Arc::new(AtomicUsize::new(0)),
            waiter_count: Arc::new(AtomicUsize::new(0)),
            trim_acceptor: Notify::new(),
        }
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

    /// Whether the server is shutting down.
    pub fn shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// A watch of the shutdown flag, to wait for it.
    pub fn watch_shutdown(&self) -> watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// Waits until shard `shard`'s log is durable up to `lsn`.
    pub async fn wait_durable(&self, shard: usize, lsn: u64) {
        let durable = &self.durable[shard];
        if *durable.borrow() < lsn {
            let _ = durable.subscribe().wait_for(|d| *d >= lsn).await;
        }
    }

    /// Shard `shard`'s log is durable up to `lsn` now (called by that shard alone).
    pub fn mark_durable(&self, shard: usize, lsn: u64) {
        self.durable[shard].send_replace(lsn);
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
