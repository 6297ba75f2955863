//! The node runtime (replication.md §4.9): one thread with a tokio runtime of its own runs
//! openraft's `Raft` on our log and state machine, and the cluster port's listener that serves
//! peers' RPCs into it. The server reaches it through [`Handle`], a `Send` handle whose calls
//! run on the node's runtime whatever runtime (or none) the caller has.
//!
//! `--cluster-init` (replication.md §4.8): on an empty dir, the node first asks every listed
//! peer whether it already belongs to a cluster, refuses if one does, and only then calls
//! `initialize`. The other nodes start empty and wait to be contacted.

use std::fs;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use openraft::errors::{ClientWriteError, Fatal, ForwardReason, LinearizableReadError};
use openraft::impls::ProgressResponder;
use openraft::raft::ClientWriteResult;
use openraft::type_config::alias::OneshotReceiverOf;
use openraft::{Instant as _, RaftMetrics, ReadPolicy, ServerState, SnapshotPolicy};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};

use super::config::{ClusterConfig, Members};
use super::entry::ShardEntry;
use super::growth::snapshot_by_size;
use super::log::{LogStore, SEGMENT_BYTES};
use super::network::Network;
use super::purge::{purge_after_snapshot, Keep};
use super::serve::{serve, set_client_addr, Heard, Served, ANNOUNCE_WAIT};
use super::stamps::{Stamp, Stamps};
use super::state::{Committed, Raft, StateMachine};
use super::{LeaderId, LogId, Peer, TypeConfig};

/// How long `--cluster-init` waits for every listed peer to answer (they may start after it).
const INIT_WAIT: Duration = Duration::from_secs(30);

/// How often a node whose membership entry does not carry its `--cluster-announce` address
/// asks the leader again.
const ANNOUNCE_RETRY: Duration = Duration::from_millis(500);

/// How soon the status's watchers hear of progress alone (indexes, the followers' lag): every
/// commit makes some, and telling each at once woke every shard thread and the accepting
/// thread of every node for nothing. A change of role, leader, term or membership is told at
/// once.
const PROGRESS_EVERY: Duration = Duration::from_millis(50);

/// Failed attempts at announcing before one is logged as a warning (then every this many):
/// the first ones after a start or an election fail as a matter of course (no leader yet, its
/// first entry not committed).
const ANNOUNCE_QUIET: u32 = 6;

/// A node's part in its cluster now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Runs every command.
    Leader,
    /// Follows a leader (or waits for one).
    Follower,
    /// Stands for election.
    Candidate,
    /// Not a voter (a node not yet in a cluster, too).
    Learner,
    /// Stopped.
    Shutdown,
}

/// The known leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Its node id.
    pub id: u64,
    /// Where clients reach it (what `MOVED` hands out).
    pub client_addr: String,
}

/// What this node knows of a peer (on the leader: its replication).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's node id.
    pub id: u64,
    /// Its cluster port.
    pub raft_addr: String,
    /// Where its clients reach it.
    pub client_addr: String,
    /// The last index it holds, as far as the leader knows (`None` elsewhere).
    pub matched: Option<u64>,
    /// How far behind the leader's log it is (`None` elsewhere).
    pub lag: Option<u64>,
    /// How long ago the last RPC it acknowledged was sent, in ms (on the leader, once it
    /// answered one; `None` elsewhere).
    pub acked_ms_ago: Option<u64>,
    /// On a leader in touch with a quorum, whether the peer answers ([`Liveness`]); `None`
    /// elsewhere (a follower hears only from the leader; a cut-off leader cannot tell).
    pub answering: Option<bool>,
}

/// A node's Raft state, from openraft's metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// This node.
    pub id: u64,
    /// Whether it leads, follows, stands for election, only learns or has stopped, as
    /// openraft's metrics say now.
    pub role: Role,
    /// Where this node's clients reach it, as its membership entry says (`None` before it
    /// belongs to a cluster).
    pub client_addr: Option<String>,
    /// The current term.
    pub term: u64,
    /// The leader, when one is known: this node, or the leader of the committed vote while
    /// this node hears from it ([`Liveness::hears`]: the vote a restarted node read back names
    /// a leader that may be long gone, and one that stopped sending may be dead: until it
    /// hears from one again, it knows none).
    pub leader: Option<Leader>,
    /// The committed leadership this node knows (term and node): a leader's writes name it.
    pub leader_id: Option<LeaderId>,
    /// The last committed index.
    pub committed: Option<u64>,
    /// The last applied index.
    pub applied: Option<u64>,
    /// The last index in this node's log.
    pub last_index: Option<u64>,
    /// The last index the current snapshot includes.
    pub snapshot: Option<u64>,
    /// The last index removed from the log (a follower behind it needs the snapshot).
    pub purged: Option<u64>,
    /// Every other voter.
    pub peers: Vec<PeerStatus>,
}

impl Status {
    fn of(m: &RaftMetrics<TypeConfig>, heard: &Heard, live: &Liveness) -> Status {
        let membership = m.membership_config.membership();
        let trusted = m.state == ServerState::Leader || live.hears(heard, m.vote.leader_id);
        let leader = m.current_leader.filter(|_| trusted).map(|id| Leader {
            id,
            client_addr: membership
                .get_node(&id)
                .map(|p| p.client_addr.clone())
                .unwrap_or_default(),
        });
        let peers = membership
            .nodes()
            .filter(|(id, _)| **id != m.id)
            .map(|(id, p)| {
                // Known on the leader only: the last entry the peer holds, if any.
                let progress = m.replication.as_ref().and_then(|r| r.get(id));
                let count = |last: Option<u64>| last.map_or(0, |i| i + 1);
                // On the leader, when the last RPC the peer acknowledged was sent.
                let acked_ago = m
                    .heartbeat
                    .as_ref()
                    .map(|h| h.get(id).and_then(Option::as_ref).map(|at| at.elapsed()));
                PeerStatus {
                    id: *id,
                    raft_addr: p.raft_addr.clone(),
                    client_addr: p.client_addr.clone(),
                    matched: progress.and_then(|l| l.as_ref().map(|l| l.index)),
                    lag: progress.map(|l| {
                        count(m.last_log_index).saturating_sub(count(l.as_ref().map(|l| l.index)))
                    }),
                    acked_ms_ago: acked_ago
                        .flatten()
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
                    answering: acked_ago
                        .filter(|_| live.in_touch(m))
                        .map(|ago| live.answering(ago)),
                }
            })
            .collect();
        Status {
            id: m.id,
            role: match m.state {
                ServerState::Leader => Role::Leader,
                ServerState::Follower => Role::Follower,
                ServerState::Candidate => Role::Candidate,
                ServerState::Learner => Role::Learner,
                ServerState::Shutdown => Role::Shutdown,
            },
            client_addr: membership.get_node(&m.id).map(|p| p.client_addr.clone()),
            term: m.current_term,
            leader,
            leader_id: m.vote.committed.then_some(m.vote.leader_id),
            committed: m.local_committed.as_ref().map(|l| l.index),
            applied: m.last_applied.map(|l| l.index),
            last_index: m.last_log_index,
            snapshot: m.snapshot.as_ref().map(|l| l.index),
            purged: m.purged.as_ref().map(|l| l.index),
            peers,
        }
    }

    /// What kind of change `other` is from this status.
    fn change(&self, other: &Status) -> Change {
        let ages = |s: &Status| Status {
            peers: s
                .peers
                .iter()
                .map(|p| PeerStatus {
                    acked_ms_ago: None,
                    ..p.clone()
                })
                .collect(),
            ..s.clone()
        };
        let progress = |s: &Status| Status {
            committed: None,
            applied: None,
            last_index: None,
            snapshot: None,
            purged: None,
            peers: s
                .peers
                .iter()
                .map(|p| PeerStatus {
                    matched: None,
                    lag: None,
                    ..p.clone()
                })
                .collect(),
            ..s.clone()
        };
        let (a, b) = (ages(self), ages(other));
        if a == b {
            Change::AckAges
        } else if progress(&a) == progress(&b) {
            Change::Progress
        } else {
            Change::Shape
        }
    }
}

/// How a new [`Status`] differs from the one before, and so when its watchers hear of it.
enum Change {
    /// In the ages of the peers' last answers only: not told (they change at every look).
    AckAges,
    /// In progress (indexes, lag): told at most every [`PROGRESS_EVERY`].
    Progress,
    /// In anything else (role, leader, term, membership, a peer that stopped or started
    /// answering): told at once.
    Shape,
}

/// Why a write did not commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// This node does not lead (or no longer in the leadership the write named): nothing was
    /// written. The leader, if known.
    NotLeader(Option<u64>),
    /// This node leads, but no quorum acknowledged it within the leader lease: just elected (no
    /// follower answered yet) or cut off from the others (CheckQuorum). Nothing was written;
    /// a retry may succeed (`-TRYAGAIN`).
    NoQuorum,
    /// The outcome is unknown: leadership moved (or the node stopped) after the entry was
    /// appended, so it may or may not commit (`-LEADERCHANGED`).
    Unknown,
}

/// Why a linearizable read cannot be served here now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// This node does not lead; the leader, if known.
    NotLeader(Option<u64>),
    /// No quorum confirmed the leadership, or the node stopped; why.
    Unavailable(String),
}

/// The node stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped;

/// The `Send` handle the server uses: every call runs on the node's runtime.
#[derive(Clone)]
pub struct Handle {
    pub(super) raft: Raft,
    sm: StateMachine,
    stamps: Stamps,
    rt: tokio::runtime::Handle,
    status: watch::Receiver<Status>,
}

impl Handle {
    async fn on_node<T: Send + 'static>(
        &self,
        f: impl Future<Output = T> + Send + 'static,
    ) -> Result<T, Stopped> {
        self.rt.spawn(f).await.map_err(|_| Stopped)
    }

    /// A proposer for one shard: several of its proposals may be in flight at once, and they
    /// reach the log in the order made (a later entry's records build on an earlier one's).
    pub fn proposer(&self) -> Proposer {
        let (tx, mut rx) = mpsc::unbounded_channel::<Proposal>();
        let raft = self.raft.clone();
        self.rt.spawn(async move {
            // One submission at a time, in order; each commit awaited on a task of its own.
            while let Some((entry, leader, done)) = rx.recv().await {
                match submit(&raft, entry, leader).await {
                    Ok(commit) => {
                        tokio::spawn(commit.answer(done));
                    }
                    Err(e) => {
                        let _ = done.send(Err(e));
                    }
                }
            }
        });
        Proposer { tx }
    }

    /// The node's state, updated as it changes.
    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.clone()
    }

    /// Returns once the Raft stopped of itself, saying why: a write or sync of its storage
    /// failed for another reason than lack of room (`room.rs`), or it panicked. Never while it
    /// runs, nor once it was shut down on purpose.
    pub async fn failure(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_watched().running_state {
                if !matches!(fatal, Fatal::Stopped) {
                    return fatal.to_string();
                }
            }
            if metrics.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Returns once this node is confirmed leader by a quorum and has applied everything
    /// committed before the call: a read served then is linearizable.
    pub async fn ensure_linearizable(&self) -> Result<(), ReadError> {
        let raft = self.raft.clone();
        let read = self.on_node(async move {
            match raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                Ok(_) => Ok(()),
                Err(e) => Err(match e.api_error() {
                    Some(LinearizableReadError::ForwardToLeader(f)) => {
                        ReadError::NotLeader(f.leader_id)
                    }
                    _ => ReadError::Unavailable(e.to_string()),
                }),
            }
        });
        read.await
            .unwrap_or_else(|_| Err(ReadError::Unavailable("the node stopped".into())))
    }

    /// Shard `shard`'s state as the applied entries left it. After
    /// [`ensure_linearizable`](Self::ensure_linearizable) on a new leader, that is every
    /// change committed before its term.
    pub fn committed(&self, shard: usize) -> Committed {
        self.sm.committed(shard)
    }

    /// The stamps (leader, `now`, when received) that bound best how far this node's clock
    /// runs from each leader's ([`Stamps`]): the clock guard of a new leader.
    pub fn recent_stamps(&self) -> Vec<Stamp> {
        self.stamps.all()
    }

    /// Asks the leader (this node) to hand leadership to node `to`.
    pub async fn transfer_leader(&self, to: u64) -> Result<(), Stopped> {
        let raft = self.raft.clone();
        self.on_node(async move { raft.trigger().transfer_leader(to).await })
            .await?
            .map_err(|_| Stopped)
    }
}

/// What a shard proposes, and where the outcome goes.
type Proposal = (
    ShardEntry,
    LeaderId,
    oneshot::Sender<Result<LogId, WriteError>>,
);

/// The commit of an entry submitted to Raft, to come.
struct Commit {
    /// Told as soon as the leader knows the entry committed, before its state machine applies
    /// it: the shard's replies need no more (the leader evaluated them), and the apply then
    /// runs behind them instead of in front (35 µs a commit on average at P=1, measured on
    /// this 2-core box).
    committed: OneshotReceiverOf<TypeConfig, LogId>,
    /// Told once the entry is applied, or why it never will be (discarded on a leader change).
    completed: OneshotReceiverOf<TypeConfig, ClientWriteResult<TypeConfig>>,
}

impl Commit {
    /// Sends `done` the entry's log id once committed, or why it was not.
    async fn answer(self, done: oneshot::Sender<Result<LogId, WriteError>>) {
        match self.committed.await {
            Ok(log_id) => {
                let _ = done.send(Ok(log_id));
                // Held until the apply answers: openraft warns of a completion nobody awaits.
                let _ = self.completed.await;
            }
            // Never committed: the responder went with its completion, which says why.
            Err(_) => {
                let _ = done.send(outcome(self.completed.await));
            }
        }
    }
}

/// Hands `entry` to Raft as the leader in `leader`; its commit, or its failure, is to come.
async fn submit(raft: &Raft, entry: ShardEntry, leader: LeaderId) -> Result<Commit, WriteError> {
    let (responder, committed, completed) = ProgressResponder::new();
    raft.write(entry)
        .with_leader(leader)
        .responder(responder)
        .await
        .map_err(|_| WriteError::Unknown)?;
    Ok(Commit {
        committed,
        completed,
    })
}

/// A completion as [`WriteError`] tells it: the log id, or why the write failed.
fn outcome<E>(completed: Result<ClientWriteResult<TypeConfig>, E>) -> Result<LogId, WriteError> {
    match completed {
        Ok(Ok(r)) => Ok(r.log_id),
        Ok(Err(ClientWriteError::ForwardToLeader(f))) => Err(match f.reason {
            ForwardReason::LeaseExpired => WriteError::NoQuorum,
            _ => WriteError::NotLeader(f.leader_id),
        }),
        // Discarded on a leader change, or no answer before the node stopped.
        Ok(Err(_)) | Err(_) => Err(WriteError::Unknown),
    }
}

/// A shard's proposer ([`Handle::proposer`]): `Send`, cheap to clone.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::UnboundedSender<Proposal>,
}

impl Proposer {
    /// Proposes `entry` after every entry proposed before through this proposer, and waits
    /// until it is committed (not yet applied, maybe): its log id.
    pub async fn write(&self, entry: ShardEntry, leader: LeaderId) -> Result<LogId, WriteError> {
        let (done, outcome) = oneshot::channel();
        if self.tx.send((entry, leader, done)).is_err() {
            return Err(WriteError::Unknown);
        }
        outcome.await.unwrap_or(Err(WriteError::Unknown))
    }
}

/// A running node; [`Node::shutdown`] (or dropping it) stops it.
pub struct Node {
    handle: Handle,
    raft_addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// What the node thread hands back once it runs.
struct Started {
    handle: Handle,
    raft_addr: SocketAddr,
}

impl Node {
    /// Starts the node's thread: opens its log and state machine in `cfg.dir`, listens on the
    /// cluster port, runs Raft, and with `cfg.init` forms the cluster. Returns once it runs;
    /// the error says why it could not.
    pub fn start(cfg: ClusterConfig) -> Result<Node, String> {
        cfg.check()?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(format!("raft-node-{}", cfg.id))
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("the Raft runtime: {e}")));
                        return;
                    }
                };
                rt.block_on(async move {
                    match boot(cfg).await {
                        Ok((started, raft)) => {
                            let _ = ready_tx.send(Ok(started));
                            // Until asked to stop, or until the `Node` is gone.
                            let _ = stop_rx.await;
                            let _ = raft.shutdown().await;
                        }
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                        }
                    }
                });
                // Dropping the runtime ends the listener and every peer connection.
            })
            .map_err(|e| format!("the Raft thread: {e}"))?;
        let started = ready_rx
            .recv()
            .map_err(|_| "the Raft thread stopped before it ran".to_string())
            .and_then(|r| r);
        match started {
            Ok(s) => Ok(Node {
                handle: s.handle,
                raft_addr: s.raft_addr,
                stop: Some(stop),
                thread: Some(thread),
            }),
            Err(e) => {
                let _ = thread.join();
                Err(e)
            }
        }
    }

    /// The handle the server uses.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Where the cluster port listens.
    pub fn raft_addr(&self) -> SocketAddr {
        self.raft_addr
    }

    /// Stops Raft and the listener, and waits for the thread (and the log's writer) to end.
    pub fn shutdown(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop_now();
    }
}

fn openraft_config(cfg: &ClusterConfig) -> Result<openraft::Config, String> {
    let t = &cfg.timing;
    openraft::Config {
        cluster_name: "permitd".into(),
        election_timeout_min: t.election_min_ms,
        election_timeout_max: t.election_max_ms,
        heartbeat_interval: t.heartbeat_ms,
        // No heartbeat to a follower that acknowledged a write this recently (replication.md
        // §4.7); heartbeat + this + a tick stays below the election timeout.
        heartbeat_min_interval: Some(t.heartbeat_ms),
        enable_pre_vote: Some(true),
        // A leader restarted after a crash runs a new election instead of resuming its term
        // (openraft's default): resumed, its last proposals before the crash could commit after
        // a shard copied the state machine to serve, and the log would then hold two grants of
        // one fencing token (the fault harness's kill -9 class found it: a follower's apply
        // stopped on "fencing tokens are unique").
        enable_leader_restore: Some(false),
        // Entries go to the followers as soon as the leader's log has them in memory, so that
        // the leader's fdatasync and the followers' run at once (a commit still needs a
        // majority that synced them, the leader counted only once its own sync is done).
        broadcast_submitted_on_append: Some(true),
        // A whole snapshot per RPC: its files take longer than a heartbeat's 200 ms.
        install_snapshot_timeout: 30_000,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(t.snapshot_after),
        // Never by openraft's count: `purge.rs` purges after each snapshot, by count and size.
        max_in_snapshot_log_to_keep: u64::MAX,
        ..Default::default()
    }
    .validate()
    .map_err(|e| format!("Raft settings: {e}"))
}

/// Opens the storage, listens, starts Raft, and forms the cluster when asked.
async fn boot(cfg: ClusterConfig) -> Result<(Started, Raft), String> {
    let config = Arc::new(openraft_config(&cfg)?);
    let log = LogStore::open(&cfg.dir.join("log"), SEGMENT_BYTES)?;
    let stamps = Stamps::default();
    let sm_dir = cfg.dir.join("sm");
    let sm = StateMachine::open(&sm_dir, cfg.shards)
        .map_err(|e| format!("the Raft state machine: {e}"))?;
    let incoming = cfg.dir.join("incoming");
    match fs::remove_dir_all(&incoming) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", incoming.display())),
    }
    let listener = TcpListener::bind(cfg.listen)
        .await
        .map_err(|e| format!("the cluster port {}: {e}", cfg.listen))?;
    let raft_addr = listener.local_addr().map_err(|e| e.to_string())?;
    let network = Network::of(&cfg);
    let growth = log.growth();
    let reader = log.clone();
    let raft = Raft::new(cfg.id, config, network, log, sm.clone())
        .await
        .map_err(|e| format!("Raft: {e}"))?;
    tokio::spawn(snapshot_by_size(
        raft.clone(),
        growth,
        cfg.timing.snapshot_after_bytes,
    ));
    let keep = Keep {
        entries: cfg.timing.keep_after_snapshot,
        bytes: cfg.timing.keep_after_snapshot_bytes,
    };
    tokio::spawn(purge_after_snapshot(raft.clone(), reader, sm.built(), keep));
    let (heard, heard_rx) = watch::channel(Heard::default());
    tokio::spawn(serve(
        listener,
        Served {
            raft: raft.clone(),
            id: cfg.id,
            secret: cfg.secret.clone(),
            transport: cfg.transport.clone(),
            incoming,
            heard,
            stamps: stamps.clone(),
        },
    ));
    if let Some(members) = &cfg.init {
        if let Err(e) = initialize(&raft, &cfg, members).await {
            let _ = raft.shutdown().await;
            return Err(e);
        }
    }
    let handle = Handle {
        raft: raft.clone(),
        sm,
        stamps,
        rt: tokio::runtime::Handle::current(),
        status: publish_status(&raft, heard_rx),
    };
    if let Some(addr) = cfg.announce.clone() {
        let network = Network::of(&cfg);
        tokio::spawn(announce(raft.clone(), network, handle.status(), addr));
    }
    Ok((Started { handle, raft_addr }, raft))
}

/// How the leader tells whether a follower answers, and a follower whether its leader still
/// sends: a follower is down once it answered none of the leader's RPCs for two leader leases
/// (`election_timeout_max`: 1.2 s by default), long past a heartbeat's round trip even on a
/// loaded box, and a leader once none of its appends (heartbeats every 100 ms) arrived for as
/// long. The survivor of a majority that died would otherwise send its clients to the dead
/// leader, and say the cluster is fine, for as long as no election could be won.
struct Liveness {
    down_after: Duration,
    /// The term this node leads in, and since when.
    leading: Option<(u64, Instant)>,
}

impl Liveness {
    /// Notes whether, and since when, the node of `m` leads.
    fn observe(&mut self, m: &RaftMetrics<TypeConfig>) {
        self.leading = match (m.state, self.leading) {
            (ServerState::Leader, Some((term, since))) if term == m.current_term => {
                Some((term, since))
            }
            (ServerState::Leader, _) => Some((m.current_term, Instant::now())),
            _ => None,
        };
    }

    /// Whether the leader of `m` heard from a quorum lately: one that did not (cut off, its
    /// lease expired, though openraft keeps it a leader until it hears of another) cannot tell
    /// a dead follower from its own lost link, and the rest of the cluster may be serving
    /// without it; nor can a new leader before its first quorum answered.
    fn in_touch(&self, m: &RaftMetrics<TypeConfig>) -> bool {
        m.last_quorum_acked
            .as_ref()
            .is_some_and(|at| at.elapsed() <= self.down_after)
    }

    /// Whether leadership `leader` (the vote's) is the one this node `heard` from, lately.
    fn hears(&self, heard: &Heard, leader: LeaderId) -> bool {
        heard.leader == Some(leader) && heard.at.is_some_and(|at| at.elapsed() <= self.down_after)
    }

    /// Whether a follower whose last acknowledged RPC was sent `acked_ago` answers. One not
    /// heard from yet in this leadership (openraft starts each with no ack) is given the same
    /// time from the election, so that a new leader does not show every follower down first.
    fn answering(&self, acked_ago: Option<Duration>) -> bool {
        let ago = acked_ago.or_else(|| self.leading.map(|(_, since)| since.elapsed()));
        ago.is_some_and(|d| d <= self.down_after)
    }
}

/// A watch of [`Status`], kept up to date by a task of the runtime from openraft's metrics and
/// the leaderships this node `heard` from. It looks again every heartbeat interval
/// ([`Liveness`]): nothing in the metrics changes when a follower stops answering, or a leader
/// stops sending.
fn publish_status(raft: &Raft, mut heard: watch::Receiver<Heard>) -> watch::Receiver<Status> {
    let config = raft.config();
    let mut live = Liveness {
        down_after: Duration::from_millis(2 * config.election_timeout_max),
        leading: None,
    };
    let mut look_again = tokio::time::interval(Duration::from_millis(config.heartbeat_interval));
    look_again.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut metrics = raft.metrics();
    live.observe(&metrics.borrow_watched());
    let (tx, rx) = watch::channel(Status::of(
        &metrics.borrow_watched(),
        &heard.borrow(),
        &live,
    ));
    tokio::spawn(async move {
        // When the watchers are to hear of progress not yet told (PROGRESS_EVERY).
        let mut due: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                changed = heard.changed() => if changed.is_err() { return },
                _ = look_again.tick() => {}
                () = tokio::time::sleep_until(due.unwrap_or_else(tokio::time::Instant::now)),
                    if due.is_some() =>
                {
                    due = None;
                    tx.send_modify(|_| {});
                    continue;
                }
            }
            live.observe(&metrics.borrow_watched());
            let status = Status::of(&metrics.borrow_watched(), &heard.borrow(), &live);
            // The value is always the newest (INFO reads it); only the telling waits.
            tx.send_if_modified(|now| {
                if *now == status {
                    return false;
                }
                let change = now.change(&status);
                log_liveness(now, &status);
                *now = status;
                match change {
                    Change::AckAges => false,
                    Change::Progress => {
                        due.get_or_insert_with(|| tokio::time::Instant::now() + PROGRESS_EVERY);
                        false
                    }
                    Change::Shape => {
                        due = None;
                        true
                    }
                }
            });
        }
    });
    rx
}

/// Logs what an operator acts on of a change from `was` to `now`: a follower that stopped
/// answering the leader, or answers again (on the leader), and a leader that went silent, or
/// is heard again (on a follower).
fn log_liveness(was: &Status, now: &Status) {
    for p in &now.peers {
        let before = was.peers.iter().find(|b| b.id == p.id);
        match (before.and_then(|b| b.answering), p.answering) {
            (Some(true), Some(false)) => tracing::warn!(
                node = p.id,
                addr = %p.raft_addr,
                "a follower stopped answering: the topology shows it failed"
            ),
            (Some(false), Some(true)) => tracing::info!(node = p.id, "a follower answers again"),
            _ => {}
        }
    }
    if now.role == Role::Follower && was.role == Role::Follower {
        match (&was.leader, &now.leader) {
            // Silent in the same leadership: not a vote for another node (a hand-over).
            (Some(l), None) if now.leader_id.is_some() && now.leader_id == was.leader_id => {
                tracing::warn!(
                    leader = l.id,
                    "the leader went silent: no leader known (CLUSTERDOWN) until one is heard"
                )
            }
            (None, Some(l)) => tracing::info!(leader = l.id, "following the leader"),
            _ => {}
        }
    }
}

/// `--cluster-init`: refuses on a node that already belongs to a cluster, or when a listed
/// peer does; otherwise makes `members` the first membership.
async fn initialize(raft: &Raft, cfg: &ClusterConfig, members: &Members) -> Result<(), String> {
    if raft.is_initialized().await.map_err(|e| e.to_string())? {
        return Err(
            "--cluster-init: this node already belongs to a cluster (--cluster-init forms one \
             on an empty --dir, once)"
                .into(),
        );
    }
    let mut network = Network::of(cfg);
    let deadline = Instant::now() + INIT_WAIT;
    for (&id, peer) in members.iter().filter(|(&id, _)| id != cfg.id) {
        let client = network.client(id, peer);
        loop {
            match client.initialized(Duration::from_secs(2)).await {
                Ok(false) => break,
                Ok(true) => {
                    return Err(format!(
                        "--cluster-init: node {id} at {} already belongs to a cluster",
                        peer.raft_addr
                    ))
                }
                // A wrong secret will not get better by waiting.
                Err(e)
                    if e.kind() != io::ErrorKind::PermissionDenied && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => {
                    return Err(format!(
                        "--cluster-init: node {id} at {}: {e}",
                        peer.raft_addr
                    ))
                }
            }
        }
    }
    // This node's own entry carries its --cluster-announce address from the start.
    let mut members = members.clone();
    if let (Some(addr), Some(me)) = (&cfg.announce, members.get_mut(&cfg.id)) {
        me.client_addr = addr.clone();
    }
    raft.initialize(members)
        .await
        .map_err(|e| format!("--cluster-init: {e}"))
}

/// `--cluster-announce`: for as long as the node runs, whenever its membership entry's client
/// address is not `addr`, asks the leader to change it (itself when it leads), every
/// [`ANNOUNCE_RETRY`] until the membership shows `addr`. A follower forwards nothing: each node
/// asks for its own entry. Nothing waits for it: the node serves meanwhile, announced at the
/// address it had.
async fn announce(
    raft: Raft,
    mut network: Network,
    mut status: watch::Receiver<Status>,
    addr: String,
) {
    // Requests since the membership last showed `addr`.
    let mut attempts = 0u32;
    loop {
        let s = status.borrow_and_update().clone();
        match &s.client_addr {
            // Not a member yet (waiting for --cluster-init).
            None => {}
            Some(now) if *now == addr => {
                if attempts > 0 {
                    tracing::info!(addr = %addr, "cluster: the membership announces this node at its client address");
                }
                attempts = 0;
            }
            Some(now) => {
                if attempts == 0 {
                    tracing::info!(addr = %addr, was = %now, "cluster: asking the leader to announce this node at its client address");
                }
                attempts += 1;
                if let Err(why) = ask_to_announce(&raft, &mut network, &s, &addr).await {
                    if attempts.is_multiple_of(ANNOUNCE_QUIET) {
                        tracing::warn!(addr = %addr, attempts, "cluster: this node's client address is not recorded yet: {why}");
                    } else {
                        tracing::debug!(addr = %addr, "cluster: announcing this node's client address: {why}");
                    }
                }
                tokio::time::sleep(ANNOUNCE_RETRY).await;
                continue;
            }
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// One request for this node's (`s.id`) client address to be `addr`: to the leader, or done
/// here when this node leads.
async fn ask_to_announce(
    raft: &Raft,
    network: &mut Network,
    s: &Status,
    addr: &str,
) -> Result<(), String> {
    let Some(leader) = &s.leader else {
        return Err("no leader known".into());
    };
    if leader.id == s.id {
        return set_client_addr(raft, s.id, addr.to_string()).await;
    }
    let peer = s
        .peers
        .iter()
        .find(|p| p.id == leader.id)
        .ok_or_else(|| format!("the leader, node {}, is not in the membership", leader.id))?;
    let at = Peer {
        raft_addr: peer.raft_addr.clone(),
        client_addr: peer.client_addr.clone(),
    };
    network
        .client(leader.id, &at)
        .announce(s.id, addr, ANNOUNCE_WAIT)
        .await
        .map_err(|e| format!("asking the leader, node {}: {e}", leader.id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_is_down_once_silent_for_down_after_and_before_its_first_answer_once_the_leadership_is_as_old(
    ) {
        let second = Duration::from_secs(1);
        let mut live = Liveness {
            down_after: second,
            leading: Some((3, Instant::now())),
        };
        assert!(live.answering(Some(Duration::from_millis(999))));
        assert!(!live.answering(Some(Duration::from_millis(1001))));
        // Not heard from yet: the leadership is young, then old.
        assert!(live.answering(None));
        live.leading = Some((3, Instant::now() - 2 * second));
        assert!(!live.answering(None));
        // Not leading: nothing is heard.
        live.leading = None;
        assert!(!live.answering(None));
    }

    #[test]
    fn a_follower_knows_its_leader_while_appends_of_its_leadership_arrive() {
        let second = Duration::from_secs(1);
        let live = Liveness {
            down_after: second,
            leading: None,
        };
        let (old, new) = (
            LeaderId {
                term: 3,
                node_id: 1,
            },
            LeaderId {
                term: 4,
                node_id: 2,
            },
        );
        let mut heard = Heard::default();
        assert!(!live.hears(&heard, old), "nothing heard since the start");
        let long_ago = Instant::now() - 2 * second;
        assert!(heard.note(old, long_ago), "a first leadership is told");
        assert!(
            !live.hears(&heard, old),
            "silent for longer than down_after"
        );
        assert!(
            !heard.note(old, Instant::now()),
            "the same one's appends are not told"
        );
        assert!(live.hears(&heard, old));
        assert!(
            !live.hears(&heard, new),
            "the vote names another leadership"
        );
        assert!(heard.note(new, Instant::now()));
        // A late append of the old leadership changes nothing.
        assert!(!heard.note(old, Instant::now()));
        assert_eq!(heard.leader, Some(new));
        assert!(live.hears(&heard, new));
    }

    #[test]
    fn a_status_that_changed_in_ack_ages_only_is_not_told_and_one_in_progress_only_later() {
        let peer = PeerStatus {
            id: 2,
            raft_addr: "127.0.0.1:17002".into(),
            client_addr: "127.0.0.1:7002".into(),
            matched: Some(7),
            lag: Some(0),
            acked_ms_ago: Some(40),
            answering: Some(true),
        };
        let before = Status {
            id: 1,
            role: Role::Leader,
            client_addr: Some("127.0.0.1:7001".into()),
            term: 3,
            leader: None,
            leader_id: None,
            committed: Some(7),
            applied: Some(7),
            last_index: Some(7),
            snapshot: None,
            purged: None,
            peers: vec![peer.clone()],
        };
        let with = |p: PeerStatus| Status {
            peers: vec![p],
            ..before.clone()
        };
        let aged = with(PeerStatus {
            acked_ms_ago: Some(90),
            ..peer.clone()
        });
        assert!(matches!(before.change(&aged), Change::AckAges));
        let on = Status {
            last_index: Some(8),
            ..with(PeerStatus {
                lag: Some(1),
                ..peer.clone()
            })
        };
        assert!(matches!(before.change(&on), Change::Progress));
        let down = with(PeerStatus {
            answering: Some(false),
            acked_ms_ago: Some(1300),
            ..peer.clone()
        });
        assert!(matches!(before.change(&down), Change::Shape));
        let deposed = Status {
            role: Role::Follower,
            ..before.clone()
        };
        assert!(matches!(before.change(&deposed), Change::Shape));
    }
}
