//! What travels between the server's threads: the messages of a shard thread's inbox
//! (connections to serve, requests for its engine shard) and the answers they carry back.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::sync::oneshot;

use super::acl::User;
use super::clients::Seat;
use super::parking::Parking;
use super::semstats::{Busiest, SemKey, WaitHist};
use super::session::Session;
use super::stats::CommandStats;
use crate::command::CommandSpec;
use crate::engine::page::{Page, PageOf};
use crate::engine::request::EngineRequest;
use crate::engine::types::Name;
use crate::engine::{Cancel, Counts, Stats, WaiterId};
use crate::error::Error;
use crate::persist::PersistStats;
use crate::protocol::{Proto, Reply};

/// A shard's part of an NS.LIST page: its candidates, each with its reply.
pub type NsPart = PageOf<Name, (Name, Reply)>;

/// A shard's NS.LIST part, or why it has none now (cluster mode: it does not serve).
pub type NsAnswer = Result<NsPart, Error>;

/// A transaction's results on its shard, one per item, or why none of them ran (cluster mode:
/// the shard does not serve).
pub type TxAnswer = Result<Vec<TxDone>, Error>;

/// A shard thread's inbox message.
#[derive(Debug)]
pub enum ThreadMsg {
    /// A connection the listener accepted, to serve on this thread.
    Accepted {
        /// The socket, off the listener's event loop.
        stream: std::net::TcpStream,
        /// It came on the TLS port: the thread does the handshake first.
        tls: bool,
        /// Its place under `--maxclients`.
        seat: Seat,
    },
    /// A connection moving here from another shard thread (see `conn.rs`).
    Moving(Box<Moving>),
    /// A request for this thread's engine shard.
    Shard(ShardMsg),
}

/// A connection between two shard threads, taken off the old one between two requests.
#[derive(Debug)]
pub struct Moving {
    // Declared first, so that it drops first: the client leaves the registry before the
    // socket closes. The socket is also detached from the registry meanwhile (clients.rs).
    /// Who is logged in, the protocol, the registered client.
    pub session: Session,
    /// The socket, off the old thread's event loop.
    pub stream: std::net::TcpStream,
}

/// A result, and the LSN of its shard's log that must be durable before the client sees it.
#[derive(Debug)]
pub struct Durable<T> {
    /// The result.
    pub value: T,
    /// The LSN to wait for (see `Conn::note`).
    pub lsn: u64,
}

/// An engine request with the table entry of the command it came from: what runs it, and
/// whatever ends it parked (a grant, a time-out, CLIENT UNBLOCK, an error, a failover), counts
/// it under that entry's name, never one restated by hand (issue 32).
#[derive(Debug)]
pub struct Call {
    /// The command's table entry.
    pub spec: &'static CommandSpec,
    /// What it asks of the engine.
    pub req: EngineRequest,
}

/// The result of one engine request run by a shard.
#[derive(Debug)]
pub enum Done {
    /// Answered.
    Reply(Reply),
    /// Parked: the reply comes on the receiver; the id cancels it.
    Parked(oneshot::Receiver<Durable<Reply>>, WaiterId),
    /// Not run, or taken out of its queue as it parked: its client was killed meanwhile.
    Killed,
}

/// What a shard ran of a batch: the replies, encoded, and the requests left for another trip.
#[derive(Debug)]
pub struct Ran {
    /// The replies of the requests run, in order, in the connection's protocol.
    pub out: BytesMut,
    /// Where each reply ends in `out` (the connection's durability gate marks each one).
    pub ends: Vec<usize>,
    /// The requests not run yet, because the replies reached the batch's budget.
    pub rest: VecDeque<Call>,
}

/// A request for a shard thread's engine shard; each carries the channel of its answer.
#[derive(Debug)]
pub enum ShardMsg {
    /// Run requests in order (stopping after one that parks); answer with their results.
    Exec {
        /// Requests, all for namespaces of this shard.
        reqs: Vec<Call>,
        /// The client an acquire may park for (`None` inside MULTI: acquires never wait).
        parker: Option<Arc<Parking>>,
        /// Results, one per request run.
        reply: oneshot::Sender<Durable<Vec<Done>>>,
    },
    /// Run non-blocking requests in order until their encoded replies reach `budget` bytes (at
    /// least one runs), so that what a batch builds before the connection writes is bounded.
    Batch {
        /// Requests, all for namespaces of this shard; none may park.
        reqs: VecDeque<Call>,
        /// The connection's protocol, to encode the replies in.
        proto: Proto,
        /// Bytes of replies after which the shard stops.
        budget: usize,
        /// What ran.
        reply: oneshot::Sender<Durable<Ran>>,
    },
    /// Run a transaction's items in order, at one instant (see [`TxItem`]).
    Txn {
        /// Items, their requests all for namespaces of this shard.
        items: Vec<TxItem>,
        /// Results, one per item.
        reply: oneshot::Sender<Durable<TxAnswer>>,
    },
    /// Take a parked acquire out of its queue.
    Cancel {
        /// The parked acquire.
        waiter: WaiterId,
        /// Why: a disconnect drops its reply, an unblock answers it.
        why: Cancel,
        /// Whether it was still parked.
        reply: oneshot::Sender<bool>,
    },
    /// This shard's part of an NS.LIST page.
    NsList {
        /// The page asked for.
        page: Page,
        /// Only namespaces this user may access (`None`: all).
        visible_to: Option<Arc<User>>,
        /// This shard's candidates.
        reply: oneshot::Sender<Durable<NsAnswer>>,
    },
    /// Start the per-command statistics again from zero (CONFIG RESETSTAT).
    ResetStats {
        /// Told once done.
        reply: oneshot::Sender<()>,
    },
    /// Counters and sizes for INFO.
    Info {
        /// Whether to include the latency histograms (INFO latencystats).
        latency: bool,
        /// Where the figures go.
        reply: oneshot::Sender<ShardInfo>,
    },
    /// Everything `/metrics` shows of this shard, its namespaces and semaphores capped.
    Metrics {
        /// Most namespaces and semaphores to report (the busiest).
        cap: usize,
        /// The user whose key patterns limit the namespaces reported (`None`: all).
        visible_to: Option<Arc<User>>,
        /// Where the figures go.
        reply: oneshot::Sender<ShardMetrics>,
    },
}

/// One item of a transaction run on its namespace's shard. A transaction's NS.LIST, INFO,
/// CLIENT UNBLOCK and kills see or change that shard's state, so their part there runs at its
/// place in the queue, between the engine commands before and after it (SPEC §7: the queue runs
/// in order, atomically). Other shards' parts run outside: the transaction changes none of them.
#[derive(Debug)]
pub enum TxItem {
    /// An engine command; an acquire does not wait.
    Engine(Call),
    /// This shard's part of an NS.LIST page, for this user (`None`: all).
    NsList(Page, Option<Arc<User>>),
    /// This shard's INFO figures (with the latency histograms if true).
    Info(bool),
    /// End a parked acquire (an unblock, or the kill of its client).
    Cancel(WaiterId, Cancel),
}

/// The result of a [`TxItem`], of the same kind.
#[derive(Debug)]
pub enum TxDone {
    /// Of an engine command.
    Engine(Done),
    /// This shard's NS.LIST part.
    NsList(NsAnswer),
    /// This shard's INFO figures (boxed: they hold every command's statistics).
    Info(Box<ShardInfo>),
    /// Whether the acquire was still parked.
    Cancel(bool),
}

/// One shard's INFO figures.
#[derive(Debug, Clone, Default)]
pub struct ShardInfo {
    /// Namespaces, semaphores, leases, holders, waiters.
    pub counts: Counts,
    /// Engine counters.
    pub stats: Stats,
    /// Persistence counters.
    pub persist: PersistStats,
    /// Commands run by the connections of this thread.
    pub commands: u64,
    /// The per-command figures of the commands run on this thread.
    pub command_stats: CommandStats,
}

/// One shard's figures for `/metrics`.
#[derive(Debug)]
pub struct ShardMetrics {
    /// What INFO shows, latency histograms included.
    pub info: ShardInfo,
    /// The busiest namespaces and semaphores, at most the cap of each.
    pub busiest: Busiest,
    /// The semaphores that granted most waiters, with their waits.
    pub waits: Vec<(SemKey, WaitHist)>,
}
