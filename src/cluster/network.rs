//! The peer network's client side: openraft's `RaftNetworkFactory`/`RaftNetworkV2` over the
//! cluster port's connections (TCP, in mutual TLS off loopback: `tls.rs`). `serve.rs` is the
//! other side, the listener that serves peers' RPCs into the local Raft.
//!
//! Connections are persistent: each peer has a pool of authenticated connections (`auth.rs`),
//! and an RPC takes an idle one (or dials), sends its request frame, reads the answer frame and
//! puts the connection back. openraft runs replication, heartbeats and snapshots as separate
//! tasks, so a peer usually holds two or three connections, and a heartbeat never waits behind
//! a snapshot on the same socket. A connection that fails or times out is dropped (its stream
//! may be out of step); dialing a peer that failed waits a backoff doubling from 50 ms to 1 s.
//! A snapshot travels as its request, then its folder's files in pieces of 1 MiB, then the
//! answer once the receiver installed it.

use std::collections::HashMap;
use std::fs;
use std::io::{self, Read};
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{
    NetworkError, RPCError, ReplicationClosed, StreamingError, Timeout, Unreachable,
};
use openraft::network::{RPCOption, RPCTypes, RaftNetworkFactory, RaftNetworkV2};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, VoteRequest, VoteResponse,
};
use openraft::OptionalSend;
use tokio::io::AsyncWrite;
use tokio::net::{TcpSocket, TcpStream};

use super::auth::{dial, Secret, HANDSHAKE};
use super::coalesce::Coalesced;
use super::config::ClusterConfig;
use super::stamps::Wall;
use super::state::{Snapshot, SnapshotFiles};
use super::tls::{PeerConn, Transport};
use super::wire::{
    recv, send, Piece, Request, Response, TransferLeaderResponse, MAX_FRAME, PIECE_BYTES,
};
use super::{Peer, TypeConfig, Vote};

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

#[cfg(test)]
mod tests {
    use tokio::net::TcpListener;

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
}
