//! The peer network's serving side: the cluster port's listener, which takes each peer's
//! connection through the handshake (`tls.rs`, `auth.rs`) within caps on what is in flight, then
//! serves its RPCs into the local Raft: appends (noting each one's send time for the clock
//! guard, `stamps.rs`, and the leadership heard), votes, leader transfers, snapshots received
//! as their folder's files, and this project's own requests (`Initialized`, `Announce`).

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::async_runtime::WatchReceiver;
use openraft::raft::AppendEntriesResponse;
use openraft::{ChangeMembers, ServerState};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::OwnedSemaphorePermit;

use super::auth::{accept, Secret, HANDSHAKE};
use super::stamps::{Stamp, Stamps};
use super::state::{Raft, Snapshot, SnapshotFiles};
use super::tls::{is_tls_error, PeerConn, Transport};
use super::wire::{recv, send, Piece, Request, Response, MAX_FRAME};
use super::{LeaderId, Peer, Vote};
use crate::ratelimit::{Cap, RateLimited};

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

/// How long the leader may take to commit an announced address (a membership entry); the
/// asker waits as long.
pub const ANNOUNCE_WAIT: Duration = Duration::from_secs(5);

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
    fn only_plain_file_names_are_taken() {
        assert!(plain_name("meta") && plain_name("shard-0.snap"));
        for bad in ["", ".", "..", "../x", "a/b", "/etc/passwd"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
    }
}
