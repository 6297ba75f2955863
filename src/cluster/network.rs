//! The peer network: openraft's `RaftNetworkFactory`/`RaftNetworkV2` over the cluster port's
//! connections (TCP, in mutual TLS off loopback: `tls.rs`), and the listener that serves
//! peers' RPCs into the local Raft.
//!
//! Connections are persistent: each peer has a pool of authenticated connections (`auth.rs`),
//! and an RPC takes an idle one (or dials), sends its request frame, reads the answer frame and
//! puts the connection back. openraft runs replication, heartbeats and snapshots as separate
//! tasks, so a peer usually holds two or three connections, and a heartbeat never waits behind
//! a snapshot on the same socket. A connection that fails or times out is dropped (its stream
//! may be out of step); dialing a peer that failed waits a backoff doubling from 50 ms to 1 s.
//! A snapshot travels as its request, then its folder's files in pieces of 1 MiB, then the
//! answer once the receiver installed it.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use openraft::async_runtime::WatchReceiver;
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, VoteRequest, VoteResponse,
};
use openraft::{ChangeMembers, OptionalSend, ServerState};
use tokio::io::AsyncWrite;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::OwnedSemaphorePermit;

use super::auth::{accept, dial, Secret};
use super::coalesce::Coalesced;
use super::config::ClusterConfig;
use super::stamps::{Stamp, Stamps, Wall};
use super::state::{Raft, Snapshot, SnapshotFiles};
use super::tls::{is_tls_error, PeerConn, Transport};
use super::wire::{
    recv, send, Piece, Request, Response, TransferLeaderResponse, MAX_FRAME, PIECE_BYTES,
};
use super::{LeaderId, Peer, TypeConfig, Vote};
use crate::ratelimit::{Cap, RateLimited};

/// How long a peer may take over its side of the handshake.
const HANDSHAKE: Duration = Duration::from_secs(5);

/// Caps on the cluster port (issue 40, item 9): dialers that never finish hold at most 16
/// descriptors (shared with the client ports), for [`HANDSHAKE`] each, and 16 still let a
/// cluster's peers, two or three connections each, reconnect at once; 256 connections in all
/// leave room for clusters far larger than Raft suits.
const MAX_HANDSHAKES: usize = 16;
const MAX_PEER_CONNECTIONS: usize = 256;

/// Refused handshakes and failed accepts, each logged at most once a second: a stranger
/// could otherwise write a line per connection it opens.
static REFUSED: RateLimited = RateLimited::new();
static ACCEPT_FAILED: RateLimited = RateLimited::new();

/// The delays between dials of a peer that keeps failing: doubling from the first, bounded.
#[derive(Debug, Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

const FIRST_DELAY: Duration = Duration::from_millis(50);
const MOST_DELAY: Duration = Duration::from_secs(1);

impl Backoff {
    /// Whether a dial may be tried at `now`.
    fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|at| now >= at)
    }

    /// A dial failed at `now`: the delay before the next one.
    fn failed(&mut self, now: Instant) -> Duration {
        let delay = FIRST_DELAY
            .saturating_mul(1 << self.failures.min(16))
            .min(MOST_DELAY);
        self.failures += 1;
        self.retry_at = Some(now + delay);
        delay
    }

    fn succeeded(&mut self) {
        *self = Backoff::default();
    }
}

/// What this node presents to the peers it dials.
struct Local {
    id: u64,
    secret: Secret,
    /// How its connections are carried.
    transport: Transport,
    /// What its appends are stamped with.
    wall: Wall,
    /// The address it dials from: its cluster port's (unless that is the unspecified address),
    /// so that peers, firewalls and the test harness's proxies can tell the nodes apart.
    source: IpAddr,
}

/// The least time an append is given. openraft gives replication RPCs its heartbeat interval
/// (100 ms), but a follower's answer waits for its fdatasync, which a busy disk stretches past
/// that; a time-out then drops the connection and sends everything again. Measured by
/// scripts/bench-cluster: 6-27 time-outs per hand-off round and a hand-off p99 of 18 ms with
/// three nodes on one disk. Heartbeats (appends of no entry) keep openraft's: a dead follower
/// is still noticed as soon.
const APPEND_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);

/// How long the leader may take to commit an announced address (a membership entry); the
/// asker waits as long.
pub const ANNOUNCE_WAIT: Duration = Duration::from_secs(5);

/// Connects to `addr` from `source` (any local address when it is unspecified).
async fn connect_from(addr: &str, source: IpAddr) -> io::Result<TcpStream> {
    if source.is_unspecified() {
        return TcpStream::connect(addr).await;
    }
    let to = tokio::net::lookup_host(addr)
        .await?
        .find(|a| a.is_ipv4() == source.is_ipv4())
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("{addr}: no address to reach from {source}"),
            )
        })?;
    let socket = if source.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.bind(SocketAddr::new(source, 0))?;
    socket.connect(to).await
}

/// One peer's connections.
struct Pool {
    target: u64,
    addr: String,
    idle: Mutex<Vec<PeerConn>>,
    backoff: Mutex<Backoff>,
}

/// Why an RPC did not get its answer.
enum CallError {
    /// No connection could be made (or the peer refused us): openraft backs off.
    Unreachable(io::Error),
    /// The connection failed during the call.
    Network(io::Error),
    /// No answer within the RPC's time.
    Timeout(Duration),
}

impl Pool {
    fn new(target: u64, addr: &str) -> Pool {
        Pool {
            target,
            addr: addr.to_string(),
            idle: Mutex::new(Vec::new()),
            backoff: Mutex::new(Backoff::default()),
        }
    }

    /// An idle connection, or a new authenticated one.
    async fn take(&self, local: &Local) -> Result<PeerConn, CallError> {
        if let Some(conn) = self.idle.lock().expect("pool lock").pop() {
            return Ok(conn);
        }
        if !self
            .backoff
            .lock()
            .expect("backoff lock")
            .ready(Instant::now())
        {
            return Err(CallError::Unreachable(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "node {} at {}: waiting before dialing again",
                    self.target, self.addr
                ),
            )));
        }
        match self.dial(local).await {
            Ok(conn) => {
                self.backoff.lock().expect("backoff lock").succeeded();
                Ok(conn)
            }
            Err(e) => {
                let first = {
                    let mut b = self.backoff.lock().expect("backoff lock");
                    b.failed(Instant::now());
                    b.failures == 1
                };
                if e.kind() == io::ErrorKind::PermissionDenied || first {
                    tracing::warn!("cluster: node {} at {}: {e}", self.target, self.addr);
                }
                Err(CallError::Unreachable(e))
            }
        }
    }

    async fn dial(&self, local: &Local) -> io::Result<PeerConn> {
        let tcp = connect_from(&self.addr, local.source).await?;
        tcp.set_nodelay(true)?;
        let shake = async {
            let mut conn = local.transport.dial(tcp, &self.addr).await?;
            dial(&mut conn, &local.secret, self.target).await?;
            Ok(conn)
        };
        tokio::time::timeout(HANDSHAKE, shake)
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "handshake timed out"))?
    }

    fn put(&self, conn: PeerConn) {
        self.idle.lock().expect("pool lock").push(conn);
    }

    /// Sends the request `req` makes and reads the answer within `ttl`; `body` sends what
    /// follows the request. The request is made once a connection is there, so that an
    /// append's send time (the clock guard's evidence, `stamps.rs`) leaves out a dial.
    async fn call_with<F>(
        &self,
        local: &Local,
        req: impl FnOnce() -> Request,
        ttl: Duration,
        body: F,
    ) -> Result<Response, CallError>
    where
        F: AsyncFnOnce(&mut PeerConn) -> io::Result<()>,
    {
        let call = async {
            let mut conn = self.take(local).await?;
            let req = req();
            let answer = async {
                send(&mut conn, &req).await?;
                body(&mut conn).await?;
                recv::<Response>(&mut conn, MAX_FRAME).await
            }
            .await
            .map_err(CallError::Network)?;
            self.put(conn);
            Ok(answer)
        };
        tokio::time::timeout(ttl, call)
            .await
            .unwrap_or(Err(CallError::Timeout(ttl)))
    }

    async fn call(
        &self,
        local: &Local,
        req: impl FnOnce() -> Request,
        ttl: Duration,
    ) -> Result<Response, CallError> {
        self.call_with(local, req, ttl, async |_| Ok(())).await
    }
}

/// openraft's network factory: the pools of this node's peers.
pub struct Network {
    local: Arc<Local>,
    pools: HashMap<u64, Arc<Pool>>,
}

impl Network {
    /// The network of the node `cfg` sets up.
    pub fn of(cfg: &ClusterConfig) -> Network {
        Network::new(
            cfg.id,
            cfg.secret.clone(),
            cfg.transport.clone(),
            cfg.listen.ip(),
            cfg.wall.clone(),
        )
    }

    /// The network of node `id`, dialing peers with `secret` over `transport`.
    pub fn new(
        id: u64,
        secret: Secret,
        transport: Transport,
        source: IpAddr,
        wall: Wall,
    ) -> Network {
        Network {
            local: Arc::new(Local {
                id,
                secret,
                transport,
                source,
                wall,
            }),
            pools: HashMap::new(),
        }
    }

    /// The client of node `target` at `peer`'s Raft address (one pool per node and address).
    pub fn client(&mut self, target: u64, peer: &Peer) -> PeerClient {
        let pool = self
            .pools
            .entry(target)
            .and_modify(|p| {
                if p.addr != peer.raft_addr {
                    *p = Arc::new(Pool::new(target, &peer.raft_addr));
                }
            })
            .or_insert_with(|| Arc::new(Pool::new(target, &peer.raft_addr)))
            .clone();
        PeerClient {
            local: self.local.clone(),
            pool,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &Peer) -> PeerClient {
        self.client(target, node)
    }
}

/// openraft's client of one peer.
pub struct PeerClient {
    local: Arc<Local>,
    pool: Arc<Pool>,
}

type RpcError = RPCError<TypeConfig>;

/// One answer of an append stream.
type StreamItem = Result<StreamAppendResult<TypeConfig>, RpcError>;

fn wrong_answer(got: &Response) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("unexpected answer {got:?}"),
    )
}

/// An answer of another kind than the request's: the peer is out of step.
fn out_of_step(got: &Response) -> RpcError {
    RPCError::Network(NetworkError::new(&wrong_answer(got)))
}

impl PeerClient {
    fn rpc_error(&self, e: CallError, action: RPCTypes) -> RpcError {
        match e {
            CallError::Unreachable(e) => RPCError::Unreachable(Unreachable::new(&e)),
            CallError::Network(e) => RPCError::Network(NetworkError::new(&e)),
            CallError::Timeout(timeout) => RPCError::Timeout(Timeout {
                action,
                id: self.local.id,
                target: self.pool.target,
                timeout,
            }),
        }
    }

    /// The answer to the request `req` makes, or the error openraft acts on; a peer that could
    /// not serve it is unreachable for now.
    async fn ask(
        &self,
        req: impl FnOnce() -> Request,
        action: RPCTypes,
        ttl: Duration,
    ) -> Result<Response, RpcError> {
        match self.pool.call(&self.local, req, ttl).await {
            Ok(Response::Failed(why)) => Err(RPCError::Unreachable(Unreachable::new(
                &io::Error::other(why),
            ))),
            Ok(answer) => Ok(answer),
            Err(e) => Err(self.rpc_error(e, action)),
        }
    }

    /// The peer's answer to one of this node's own requests (not openraft's): a failure it
    /// answered is an error with its reason.
    async fn request(&self, req: Request, ttl: Duration) -> io::Result<Response> {
        match self.pool.call(&self.local, || req, ttl).await {
            Ok(Response::Failed(why)) => Err(io::Error::other(why)),
            Ok(answer) => Ok(answer),
            Err(CallError::Unreachable(e) | CallError::Network(e)) => Err(e),
            Err(CallError::Timeout(t)) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {t:?}"),
            )),
        }
    }

    /// Whether the peer already belongs to a cluster; a refused handshake is
    /// `PermissionDenied`.
    pub async fn initialized(&self, ttl: Duration) -> io::Result<bool> {
        match self.request(Request::Initialized, ttl).await? {
            Response::Initialized(b) => Ok(b),
            other => Err(wrong_answer(&other)),
        }
    }

    /// Asks the peer, the leader, to make voter `id`'s client address `client_addr` in the
    /// membership ([`set_client_addr`]); returns once the membership carries it.
    pub async fn announce(&self, id: u64, client_addr: &str, ttl: Duration) -> io::Result<()> {
        let req = Request::Announce {
            id,
            client_addr: client_addr.to_string(),
        };
        match self.request(req, ttl).await? {
            Response::Announced => Ok(()),
            other => Err(wrong_answer(&other)),
        }
    }
}

/// Sends the files of a snapshot folder as pieces, then [`Piece::Done`]. Every file is opened
/// before the first piece goes: a snapshot built meanwhile removes the folder (`state.rs`
/// `switch_to`), and an open file still reads to its end, where one opened later would be gone
/// and the transfer would start over. Under load a node snapshots every few seconds
/// (`growth.rs`), and a large state might then never get across.
async fn send_files(conn: &mut (impl AsyncWrite + Unpin), dir: &Path) -> io::Result<()> {
    let mut files = fs::read_dir(dir)?
        .map(|e| {
            let name = e?.file_name().to_string_lossy().into_owned();
            let file = fs::File::open(dir.join(&name))?;
            Ok((name, file))
        })
        .collect::<io::Result<Vec<_>>>()?;
    files.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, mut file) in files {
        loop {
            let mut buf = vec![0u8; PIECE_BYTES];
            let n = file.read(&mut buf)?;
            if n == 0 {
                break;
            }
            buf.truncate(n);
            let piece = Piece::Data {
                name: name.clone(),
                bytes: Bytes::from(buf),
            };
            send(conn, &piece).await?;
        }
    }
    send(conn, &Piece::Done).await
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotFiles;

    /// openraft's sequential stream (one append at a time, each answered before the next
    /// goes, stopping at the first that is refused or only partly taken), over requests whose
    /// commits of no entries ride on the entries that follow (`coalesce.rs`).
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, StreamItem>, RpcError>>
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let answers =
            futures_util::stream::unfold(Some((self, Coalesced::new(input))), move |state| {
                let option = option.clone();
                async move {
                    let (client, mut requests) = state?;
                    let req = requests.next().await?;
                    let prev = req.prev_log_id;
                    let last = req.entries.last().map(|e| e.log_id).or(prev);
                    match client.append_entries(req, option).await {
                        Ok(answer) => {
                            let whole = match &answer {
                                AppendEntriesResponse::Success => true,
                                AppendEntriesResponse::PartialSuccess(matched) => *matched == last,
                                _ => false,
                            };
                            let result = answer.into_stream_result(prev, last);
                            let go_on = whole && result.is_ok();
                            Some((Ok(result), go_on.then_some((client, requests))))
                        }
                        Err(e) => Some((Err(e), None)),
                    }
                }
            });
        let answers: BoxStream<'s, StreamItem> = Box::pin(answers);
        Box::pin(async move { Ok(answers) })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RpcError> {
        let ttl = match rpc.entries.is_empty() {
            // A heartbeat.
            true => option.hard_ttl(),
            false => option.hard_ttl().max(APPEND_TIMEOUT_FLOOR),
        };
        let term = rpc.vote.leader_id.term;
        match self
            .ask(
                || Request::Append {
                    rpc,
                    sent_at: self.local.wall.stamp(term),
                },
                RPCTypes::AppendEntries,
                ttl,
            )
            .await?
        {
            Response::Append(r) => Ok(r),
            other => Err(out_of_step(&other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        match self
            .ask(|| Request::Vote(rpc), RPCTypes::Vote, option.hard_ttl())
            .await?
        {
            Response::Vote(r) => Ok(r),
            other => Err(out_of_step(&other)),
        }
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RpcError> {
        match self
            .ask(|| Request::PreVote(rpc), RPCTypes::Vote, option.hard_ttl())
            .await?
        {
            Response::Vote(r) => Ok(r),
            other => Err(out_of_step(&other)),
        }
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse, RpcError> {
        match self
            .ask(
                || Request::TransferLeader(req),
                RPCTypes::TransferLeader,
                option.hard_ttl(),
            )
            .await?
        {
            Response::TransferLeader(r) => Ok(r),
            other => Err(out_of_step(&other)),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let req = Request::Snapshot {
            vote,
            meta: snapshot.meta.clone(),
        };
        let dir = snapshot.snapshot.dir.clone();
        let call = self.pool.call_with(
            &self.local,
            || req,
            option.hard_ttl(),
            async |conn| send_files(conn, &dir).await,
        );
        let answer = tokio::select! {
            answer = call => answer,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        match answer {
            Ok(Response::Snapshot(r)) => Ok(r),
            Ok(Response::Failed(why)) => Err(StreamingError::Unreachable(Unreachable::new(
                &io::Error::other(why),
            ))),
            Ok(other) => Err(StreamingError::Network(NetworkError::new(&wrong_answer(
                &other,
            )))),
            Err(e) => Err(match self.rpc_error(e, RPCTypes::InstallSnapshot) {
                RPCError::Unreachable(e) => StreamingError::Unreachable(e),
                RPCError::Network(e) => StreamingError::Network(e),
                RPCError::Timeout(e) => StreamingError::Timeout(e),
                RPCError::RemoteError(e) => match e.source {},
            }),
        }
    }
}

/// What the listener needs to serve peers.
pub struct Served {
    /// The local Raft.
    pub raft: Raft,
    /// This node's id (a hello for another is refused).
    pub id: u64,
    /// The cluster secret.
    pub secret: Secret,
    /// How the cluster port's connections are carried.
    pub transport: Transport,
    /// Where received snapshots are put together before the state machine installs (copies)
    /// them; emptied at start.
    pub incoming: PathBuf,
    /// The leadership this node last had an append from, and when.
    pub heard: tokio::sync::watch::Sender<Heard>,
    /// Where each append's send time is noted (the clock guard's evidence).
    pub stamps: Stamps,
}

/// The last leadership (term and leader) this node had an append from since it started, and
/// when the last append of it arrived: a follower knows the leader only while it hears from it
/// (`node::Liveness::hears`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heard {
    /// The leadership.
    pub leader: Option<LeaderId>,
    /// When its last append arrived.
    pub at: Option<Instant>,
}

impl Heard {
    /// Notes an append of leadership `from` that arrived `at`; whether the leadership is new
    /// (the watchers are told then only: the time of every append is kept, untold). A late
    /// append of an older leadership changes nothing: the newer one stays.
    pub fn note(&mut self, from: LeaderId, at: Instant) -> bool {
        let newer = Some(from) > self.leader;
        if newer || self.leader == Some(from) {
            *self = Heard {
                leader: Some(from),
                at: Some(at),
            };
        }
        newer
    }
}

/// Serves peers on `listener` until the runtime stops; a connection over a cap is closed at
/// once.
pub async fn serve(listener: TcpListener, served: Served) {
    let served = Arc::new(served);
    let (connections, handshakes) = (
        Cap::new(MAX_PEER_CONNECTIONS, "cluster port"),
        Cap::new(MAX_HANDSHAKES, "cluster port (handshakes)"),
    );
    loop {
        match listener.accept().await {
            Ok((conn, from)) => {
                let admitted = connections.admit(from);
                let Some(slots) = admitted.and_then(|c| Some((c, handshakes.admit(from)?))) else {
                    continue;
                };
                let served = served.clone();
                tokio::spawn(async move {
                    if let Err(e) = serve_peer(conn, &served, slots.1).await {
                        tracing::debug!("cluster: peer {from}: {e}");
                    }
                    drop(slots.0);
                });
            }
            Err(e) => {
                // Out of descriptors, say: a pause, then go on.
                if let Some(more) = ACCEPT_FAILED.allow() {
                    tracing::warn!("cluster: accept: {e}{more}");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one peer's connection: the handshake (holding `shaking`, a slot of
/// [`MAX_HANDSHAKES`]), then its RPCs.
async fn serve_peer(
    tcp: TcpStream,
    served: &Served,
    shaking: OwnedSemaphorePermit,
) -> io::Result<()> {
    let from = tcp.peer_addr()?;
    tcp.set_nodelay(true)?;
    let shake = async {
        let mut conn = served.transport.accept(tcp).await?;
        accept(&mut conn, &served.secret, served.id).await?;
        Ok::<_, io::Error>(conn)
    };
    let timed_out = |_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "handshake timed out",
        ))
    };
    let shaken = tokio::time::timeout(HANDSHAKE, shake)
        .await
        .unwrap_or_else(timed_out);
    drop(shaking);
    let mut conn = match shaken {
        Ok(conn) => conn,
        // The dialer gave up before the end (it timed out while this node was frozen, say):
        // nothing was refused. A burst of them followed each SIGCONT in the fault harness.
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::debug!("cluster: peer {from} left during the handshake");
            return Ok(());
        }
        Err(e) => {
            if let Some(more) = REFUSED.allow() {
                tracing::warn!("cluster: refused peer {from}: {e}{more}");
            }
            return Err(e);
        }
    };
    loop {
        let req = match recv::<Request>(&mut conn, MAX_FRAME).await {
            Ok(req) => req,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            // A record altered on the way (or a peer speaking TLS wrongly): worth an
            // operator's eye, unlike a peer that went away.
            Err(e) if is_tls_error(&e) => {
                tracing::warn!("cluster: peer {from}: {e}: connection reset");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let raft = &served.raft;
        let answer = match req {
            Request::Append { rpc: r, sent_at } => {
                let received = Instant::now();
                let from = r.vote.committed.then_some(r.vote.leader_id);
                if let Some(from) = from {
                    served.heard.send_if_modified(|h| h.note(from, received));
                }
                let appended = raft.append_entries(r).await;
                if let (Some(leader), Some(sent_at), Ok(AppendEntriesResponse::Success)) =
                    (from, sent_at, &appended)
                {
                    served.stamps.note(Stamp {
                        leader: leader.node_id,
                        now: sent_at,
                        received,
                    });
                }
                answer(appended, Response::Append)
            }
            Request::Vote(r) => answer(raft.vote(r).await, Response::Vote),
            Request::PreVote(r) => answer(raft.pre_vote(r).await, Response::Vote),
            Request::TransferLeader(r) => answer(
                raft.handle_transfer_leader(r).await,
                Response::TransferLeader,
            ),
            Request::Initialized => answer(raft.is_initialized().await, Response::Initialized),
            Request::Announce { id, client_addr } => {
                answer(set_client_addr(raft, id, client_addr).await, |()| {
                    Response::Announced
                })
            }
            Request::Snapshot { vote, meta } => {
                let answer = receive_snapshot(&mut conn, served, vote, meta).await?;
                send(&mut conn, &answer).await?;
                continue;
            }
        };
        send(&mut conn, &answer).await?;
    }
}

/// On the leader, makes voter `id`'s client address in the membership `client_addr`: a
/// membership entry that changes that node's `Peer` only (its cluster address stays, the
/// voters stay), committed before this returns. Nothing is written when the membership says
/// so already. Refused on a node that does not lead, for a node that is not a voter (openraft
/// would add it as a learner), and by openraft while another membership change is uncommitted
/// or before the leader committed an entry of its term: the asker retries.
pub async fn set_client_addr(raft: &Raft, id: u64, client_addr: String) -> Result<(), String> {
    let current = {
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        // openraft would refuse too, but log it as an error: a node asks whoever its view
        // names the leader, which may be a node that just restarted and does not lead yet.
        if m.state != ServerState::Leader {
            return Err(format!("node {} does not lead", m.id));
        }
        let membership = m.membership_config.membership();
        let voter = membership.voter_ids().any(|v| v == id);
        voter.then(|| membership.get_node(&id).cloned()).flatten()
    };
    let Some(peer) = current else {
        return Err(format!("node {id} is not a voter of this cluster"));
    };
    if peer.client_addr == client_addr {
        return Ok(());
    }
    let node = Peer {
        raft_addr: peer.raft_addr,
        client_addr,
    };
    let change =
        raft.change_membership(ChangeMembers::SetNodes(BTreeMap::from([(id, node)])), true);
    match tokio::time::timeout(ANNOUNCE_WAIT, change).await {
        Ok(changed) => changed.map(|_| ()).map_err(|e| e.to_string()),
        Err(_) => Err(format!(
            "the address did not commit within {ANNOUNCE_WAIT:?}"
        )),
    }
}

/// The answer to send for what the local Raft returned: a failure (it stopped) says why.
fn answer<T, E: std::fmt::Display>(r: Result<T, E>, ok: impl FnOnce(T) -> Response) -> Response {
    r.map_or_else(|e| Response::Failed(e.to_string()), ok)
}

/// Whether `name` is a plain file name (no folder, not `.` or `..`).
fn plain_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(parts.next(), Some(Component::Normal(_))) && parts.next().is_none()
}

/// Reads a snapshot's files into a fresh folder of `incoming` and installs it. Pieces that do
/// not read are an error (the connection ends); a snapshot that does not install is answered.
async fn receive_snapshot(
    conn: &mut PeerConn,
    served: &Served,
    vote: Vote,
    meta: super::SnapshotMeta,
) -> io::Result<Response> {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = served
        .incoming
        .join(format!("snap-{}", N.fetch_add(1, Ordering::Relaxed)));
    fs::create_dir_all(&dir)?;
    let result = async {
        while let Piece::Data { name, bytes } = recv::<Piece>(conn, MAX_FRAME).await? {
            if !plain_name(&name) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("snapshot file name {name:?}"),
                ));
            }
            fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join(&name))?
                .write_all(&bytes)?;
        }
        let snapshot = Snapshot {
            meta,
            snapshot: SnapshotFiles { dir: dir.clone() },
        };
        Ok(
            match served.raft.install_full_snapshot(vote, snapshot).await {
                Ok(r) => Response::Snapshot(r),
                Err(e) => Response::Failed(e.to_string()),
            },
        )
    }
    .await;
    let _ = fs::remove_dir_all(&dir);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound_and_resets_on_success() {
        let t = Instant::now();
        let mut b = Backoff::default();
        assert!(b.ready(t));
        let delays: Vec<u128> = (0..7).map(|_| b.failed(t).as_millis()).collect();
        assert_eq!(delays, [50, 100, 200, 400, 800, 1000, 1000]);
        assert!(!b.ready(t + Duration::from_millis(999)));
        assert!(b.ready(t + Duration::from_millis(1000)));
        b.succeeded();
        assert!(b.ready(t));
        assert_eq!(b.failed(t), FIRST_DELAY);
    }

    #[tokio::test]
    async fn a_snapshot_folder_removed_while_it_is_sent_still_arrives_whole() {
        let dir = crate::cluster::tests::TempDir::new("send-files");
        // Larger than the sockets' buffers: the sender waits for the reader in the first file.
        let sent: Vec<(String, Vec<u8>)> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| (name.to_string(), vec![i as u8 + 1; 16 * PIECE_BYTES + 7]))
            .collect();
        for (name, bytes) in &sent {
            fs::write(dir.0.join(name), bytes).unwrap();
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut reader = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (mut writer, _) = listener.accept().await.unwrap();
        let path = dir.0.clone();
        let sending = tokio::spawn(async move { send_files(&mut writer, &path).await });
        let mut got: Vec<(String, Vec<u8>)> = Vec::new();
        while let Piece::Data { name, bytes } = recv(&mut reader, MAX_FRAME).await.unwrap() {
            if got.is_empty() {
                // A snapshot built meanwhile replaces the folder.
                fs::remove_dir_all(&dir.0).unwrap();
            }
            match got.last_mut() {
                Some((n, b)) if *n == name => b.extend_from_slice(&bytes),
                _ => got.push((name, bytes.to_vec())),
            }
        }
        sending.await.unwrap().unwrap();
        assert_eq!(got, sent);
    }

    #[test]
    fn only_plain_file_names_are_taken() {
        assert!(plain_name("meta") && plain_name("shard-0.snap"));
        for bad in ["", ".", "..", "../x", "a/b", "/etc/passwd"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }
}
