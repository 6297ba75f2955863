//! What peers say on the cluster port: openraft's RPCs and their answers, each one frame of
//! `persist/log.rs`'s framing (`[0xA7][len][crc32c][payload]`) with a payload in
//! `persist::codec`'s encoding. A connection carries one request, then its answer, at a time.

use bytes::{Bytes, BytesMut};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderRequest,
    VoteRequest, VoteResponse,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::codec;
use super::{SnapshotMeta, TypeConfig, Vote};
use crate::engine::types::Nanos;
use crate::persist::codec::{Dec, DecodeError, Enc};
use crate::persist::log::{decode_frame, frame_payload_len, frame_with, FRAME_HEADER};

/// The largest frame a peer accepts: an append of `max_payload_entries` entries, or a snapshot
/// piece, fits many times over; a bad length from a confused peer does not make us allocate it.
pub const MAX_FRAME: usize = 64 << 20;

/// The bytes of a snapshot file one [`Piece`] carries at most.
pub const PIECE_BYTES: usize = 1 << 20;

/// What openraft's answer to a leader transfer is.
pub type TransferLeaderResponse = openraft::raft::TransferLeaderResponse<TypeConfig>;
type TransferLeaderError = openraft::raft::TransferLeaderError<TypeConfig>;

/// A request from a peer.
#[derive(Debug, Clone)]
pub enum Request {
    /// Replicate entries (or a heartbeat: none).
    Append {
        /// openraft's request.
        rpc: AppendEntriesRequest<TypeConfig>,
        /// The sender's wall clock when it sent it (the clock guard's evidence, `stamps.rs`),
        /// from a leader whose shards serve.
        sent_at: Option<Nanos>,
    },
    /// Vote for a candidate.
    Vote(VoteRequest<TypeConfig>),
    /// Would you vote for this candidate (nothing is saved)?
    PreVote(VoteRequest<TypeConfig>),
    /// The leader hands leadership to a node.
    TransferLeader(TransferLeaderRequest<TypeConfig>),
    /// Install this snapshot: its files follow as [`Piece`]s, then [`Piece::Done`].
    Snapshot {
        /// The sender's vote.
        vote: Vote,
        /// What the snapshot holds.
        meta: SnapshotMeta,
    },
    /// Do you already belong to a cluster? `--cluster-init` asks every listed peer first.
    Initialized,
    /// To the leader, from a node started with `--cluster-announce`: make voter `id`'s client
    /// address in the membership `client_addr` (its cluster address stays).
    Announce {
        /// The voter.
        id: u64,
        /// Where its clients are to reach it.
        client_addr: String,
    },
}

/// A piece of a snapshot's files, after [`Request::Snapshot`].
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// Bytes to append to the file `name` (a plain file name, no folder).
    Data {
        /// The file.
        name: String,
        /// Its next bytes.
        bytes: Bytes,
    },
    /// Every file was sent.
    Done,
}

/// An answer to a [`Request`].
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    /// To [`Request::Append`].
    Append(AppendEntriesResponse<TypeConfig>),
    /// To [`Request::Vote`] and [`Request::PreVote`].
    Vote(VoteResponse<TypeConfig>),
    /// To [`Request::TransferLeader`].
    TransferLeader(TransferLeaderResponse),
    /// To [`Request::Snapshot`], once installed.
    Snapshot(SnapshotResponse<TypeConfig>),
    /// To [`Request::Initialized`].
    Initialized(bool),
    /// To [`Request::Announce`]: the membership carries the address (it did already, or the
    /// change committed).
    Announced,
    /// The node could not serve the request (its Raft stopped, or a snapshot would not
    /// install); the reason.
    Failed(String),
}

const APPEND: u8 = 1;
const VOTE: u8 = 2;
const PRE_VOTE: u8 = 3;
const TRANSFER: u8 = 4;
const SNAPSHOT: u8 = 5;
const INITIALIZED: u8 = 6;
const FAILED: u8 = 7;
const ANNOUNCE: u8 = 8;

const DATA: u8 = 1;
const DONE: u8 = 2;

const SUCCESS: u8 = 1;
const PARTIAL: u8 = 2;
const CONFLICT: u8 = 3;
const HIGHER_VOTE: u8 = 4;

const TRANSFERRED: u8 = 1;
const VOTE_CHANGED: u8 = 2;
const NOT_FLUSHED: u8 = 3;

/// A message that goes in one frame.
pub trait Message: Sized {
    /// Appends the payload.
    fn put(&self, out: &mut BytesMut);
    /// Reads the payload.
    fn get(d: &mut Dec) -> Result<Self, DecodeError>;
}

fn flag(e: &mut Enc, b: bool) {
    e.u8(u8::from(b));
}

fn dec_flag(d: &mut Dec) -> Result<bool, DecodeError> {
    match d.u8()? {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(DecodeError("bad flag")),
    }
}

fn vote_request(e: &mut Enc, r: &VoteRequest<TypeConfig>) {
    codec::vote(e, &r.vote);
    codec::opt_log_id(e, r.last_log_id.as_ref());
    flag(e, r.leadership_transfer);
}

fn dec_vote_request(d: &mut Dec) -> Result<VoteRequest<TypeConfig>, DecodeError> {
    Ok(VoteRequest {
        vote: codec::dec_vote(d)?,
        last_log_id: codec::dec_opt_log_id(d)?,
        leadership_transfer: dec_flag(d)?,
    })
}

impl Message for Request {
    fn put(&self, out: &mut BytesMut) {
        match self {
            Request::Append { rpc: r, sent_at } => {
                let mut e = Enc(out);
                e.u8(APPEND);
                codec::opt(&mut e, sent_at.as_ref(), |e, t| e.i64(*t));
                codec::vote(&mut e, &r.vote);
                codec::opt_log_id(&mut e, r.prev_log_id.as_ref());
                codec::opt_log_id(&mut e, r.leader_commit.as_ref());
                e.u64(r.entries.len() as u64);
                for ent in &r.entries {
                    // Length-prefixed, so that an entry's decoder sees its own bytes only.
                    let mut one = BytesMut::new();
                    codec::entry(&mut one, ent);
                    Enc(out).bytes(&one);
                }
            }
            Request::Vote(r) | Request::PreVote(r) => {
                let mut e = Enc(out);
                e.u8(if matches!(self, Request::Vote(_)) {
                    VOTE
                } else {
                    PRE_VOTE
                });
                vote_request(&mut e, r);
            }
            Request::TransferLeader(r) => {
                let mut e = Enc(out);
                e.u8(TRANSFER);
                codec::vote(&mut e, r.from_leader());
                e.u64(*r.to_node_id());
                codec::opt_log_id(&mut e, r.last_log_id());
            }
            Request::Snapshot { vote, meta } => {
                let mut e = Enc(out);
                e.u8(SNAPSHOT);
                codec::vote(&mut e, vote);
                codec::opt_log_id(&mut e, meta.last_log_id.as_ref());
                codec::stored_membership(&mut e, &meta.last_membership);
            }
            Request::Initialized => Enc(out).u8(INITIALIZED),
            Request::Announce { id, client_addr } => {
                let mut e = Enc(out);
                e.u8(ANNOUNCE);
                e.u64(*id);
                codec::text(&mut e, client_addr);
            }
        }
    }

    fn get(d: &mut Dec) -> Result<Request, DecodeError> {
        Ok(match d.u8()? {
            APPEND => {
                let sent_at = codec::dec_opt(d, Dec::i64)?;
                let vote = codec::dec_vote(d)?;
                let prev_log_id = codec::dec_opt_log_id(d)?;
                let leader_commit = codec::dec_opt_log_id(d)?;
                let count = d.u64()?;
                let mut entries = Vec::with_capacity(count.min(1024) as usize);
                for _ in 0..count {
                    let mut one = Dec::new(d.bytes()?);
                    entries.push(codec::dec_entry(&mut one)?);
                    if !one.is_empty() {
                        return Err(DecodeError("bytes after an entry"));
                    }
                }
                Request::Append {
                    rpc: AppendEntriesRequest {
                        vote,
                        prev_log_id,
                        entries,
                        leader_commit,
                    },
                    sent_at,
                }
            }
            VOTE => Request::Vote(dec_vote_request(d)?),
            PRE_VOTE => Request::PreVote(dec_vote_request(d)?),
            TRANSFER => {
                let from = codec::dec_vote(d)?;
                let to = d.u64()?;
                let last = codec::dec_opt_log_id(d)?;
                Request::TransferLeader(TransferLeaderRequest::new(from, to, last))
            }
            SNAPSHOT => Request::Snapshot {
                vote: codec::dec_vote(d)?,
                meta: SnapshotMeta {
                    last_log_id: codec::dec_opt_log_id(d)?,
                    last_membership: codec::dec_stored_membership(d)?,
                },
            },
            INITIALIZED => Request::Initialized,
            ANNOUNCE => Request::Announce {
                id: d.u64()?,
                client_addr: codec::dec_text(d)?,
            },
            _ => return Err(DecodeError("unknown request")),
        })
    }
}

impl Message for Piece {
    fn put(&self, out: &mut BytesMut) {
        let mut e = Enc(out);
        match self {
            Piece::Data { name, bytes } => {
                e.u8(DATA);
                codec::text(&mut e, name);
                e.bytes(bytes);
            }
            Piece::Done => e.u8(DONE),
        }
    }

    fn get(d: &mut Dec) -> Result<Piece, DecodeError> {
        Ok(match d.u8()? {
            DATA => Piece::Data {
                name: codec::dec_text(d)?,
                bytes: d.bytes()?,
            },
            DONE => Piece::Done,
            _ => return Err(DecodeError("unknown snapshot piece")),
        })
    }
}

fn transfer_error(e: &mut Enc, err: &TransferLeaderError) {
    match err {
        TransferLeaderError::VoteChanged { expected, actual } => {
            e.u8(VOTE_CHANGED);
            codec::vote(e, expected);
            codec::vote(e, actual);
        }
        TransferLeaderError::LogNotFlushed { expected, actual } => {
            e.u8(NOT_FLUSHED);
            codec::opt_log_id(e, expected.as_ref());
            codec::opt_log_id(e, actual.as_ref());
        }
    }
}

impl Message for Response {
    fn put(&self, out: &mut BytesMut) {
        let mut e = Enc(out);
        match self {
            Response::Append(r) => {
                e.u8(APPEND);
                match r {
                    AppendEntriesResponse::Success => e.u8(SUCCESS),
                    AppendEntriesResponse::PartialSuccess(id) => {
                        e.u8(PARTIAL);
                        codec::opt_log_id(&mut e, id.as_ref());
                    }
                    AppendEntriesResponse::Conflict => e.u8(CONFLICT),
                    AppendEntriesResponse::HigherVote(v) => {
                        e.u8(HIGHER_VOTE);
                        codec::vote(&mut e, v);
                    }
                }
            }
            Response::Vote(r) => {
                e.u8(VOTE);
                codec::vote(&mut e, &r.vote);
                flag(&mut e, r.vote_granted);
                codec::opt_log_id(&mut e, r.last_log_id.as_ref());
            }
            Response::TransferLeader(r) => {
                e.u8(TRANSFER);
                match r {
                    Ok(()) => e.u8(TRANSFERRED),
                    Err(err) => transfer_error(&mut e, err),
                }
            }
            Response::Snapshot(r) => {
                e.u8(SNAPSHOT);
                codec::vote(&mut e, &r.vote);
            }
            Response::Initialized(b) => {
                e.u8(INITIALIZED);
                flag(&mut e, *b);
            }
            Response::Announced => e.u8(ANNOUNCE),
            Response::Failed(why) => {
                e.u8(FAILED);
                codec::text(&mut e, why);
            }
        }
    }

    fn get(d: &mut Dec) -> Result<Response, DecodeError> {
        Ok(match d.u8()? {
            APPEND => Response::Append(match d.u8()? {
                SUCCESS => AppendEntriesResponse::Success,
                PARTIAL => AppendEntriesResponse::PartialSuccess(codec::dec_opt_log_id(d)?),
                CONFLICT => AppendEntriesResponse::Conflict,
                HIGHER_VOTE => AppendEntriesResponse::HigherVote(codec::dec_vote(d)?),
                _ => return Err(DecodeError("unknown append answer")),
            }),
            VOTE => Response::Vote(VoteResponse {
                vote: codec::dec_vote(d)?,
                vote_granted: dec_flag(d)?,
                last_log_id: codec::dec_opt_log_id(d)?,
            }),
            TRANSFER => Response::TransferLeader(match d.u8()? {
                TRANSFERRED => Ok(()),
                VOTE_CHANGED => Err(TransferLeaderError::VoteChanged {
                    expected: codec::dec_vote(d)?,
                    actual: codec::dec_vote(d)?,
                }),
                NOT_FLUSHED => Err(TransferLeaderError::LogNotFlushed {
                    expected: codec::dec_opt_log_id(d)?,
                    actual: codec::dec_opt_log_id(d)?,
                }),
                _ => return Err(DecodeError("unknown transfer answer")),
            }),
            SNAPSHOT => Response::Snapshot(SnapshotResponse::new(codec::dec_vote(d)?)),
            INITIALIZED => Response::Initialized(dec_flag(d)?),
            FAILED => Response::Failed(codec::dec_text(d)?),
            ANNOUNCE => Response::Announced,
            _ => return Err(DecodeError("unknown answer")),
        })
    }
}

fn invalid(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// Writes one message as a frame.
pub async fn send<M: Message>(w: &mut (impl AsyncWrite + Unpin), msg: &M) -> std::io::Result<()> {
    let mut out = BytesMut::new();
    frame_with(&mut out, |out| msg.put(out));
    w.write_all(&out).await?;
    // TLS may keep the last record in its buffer until flushed (plain TCP: a no-op).
    w.flush().await
}

/// Reads one frame of at most `max` payload bytes and decodes its message; a frame that is not
/// intact or does not decode is an error (the connection is then dropped).
pub async fn recv<M: Message>(r: &mut (impl AsyncRead + Unpin), max: usize) -> std::io::Result<M> {
    let mut head = [0u8; FRAME_HEADER];
    r.read_exact(&mut head).await?;
    let len = frame_payload_len(&head).ok_or_else(|| invalid("not a frame"))?;
    if len > max {
        return Err(invalid("frame too large"));
    }
    let mut buf = BytesMut::zeroed(FRAME_HEADER + len);
    buf[..FRAME_HEADER].copy_from_slice(&head);
    r.read_exact(&mut buf[FRAME_HEADER..]).await?;
    decode_frame(buf.freeze(), M::get).ok_or_else(|| invalid("bad frame"))
}

#[cfg(test)]
mod tests {
    use openraft::raft::TransferLeaderError;

    use super::*;
    use crate::cluster::entry::ShardEntry;
    use crate::cluster::{Entry, LeaderId, LogId, Membership, Payload, StoredMembership};

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(LeaderId { term, node_id: 2 }, index)
    }

    /// Sends `msg` through a pipe and reads it back: the same message (by its debug form, as
    /// openraft's requests have no `PartialEq`).
    async fn through<M: Message + std::fmt::Debug>(msg: M) {
        let (mut a, mut b) = tokio::io::duplex(1 << 16);
        send(&mut a, &msg).await.unwrap();
        let got: M = recv(&mut b, MAX_FRAME).await.unwrap();
        assert_eq!(format!("{got:?}"), format!("{msg:?}"));
    }

    #[tokio::test]
    async fn every_request_and_answer_reads_back_as_sent() {
        let vote = Vote::new_committed(3, 2);
        let (_, journal) = crate::cluster::tests::journal();
        let membership = Membership::new_with_defaults(vec![[1, 2, 3].into()], []);
        let entries = vec![
            Entry {
                log_id: log_id(3, 5),
                payload: Payload::Blank,
            },
            Entry {
                log_id: log_id(3, 6),
                payload: Payload::Normal(ShardEntry {
                    shard: 1,
                    now: 7,
                    records: journal[..4].to_vec(),
                }),
            },
            Entry {
                log_id: log_id(3, 7),
                payload: Payload::Membership(membership.clone()),
            },
        ];
        let vote_req = VoteRequest {
            vote: Vote::new(4, 3),
            last_log_id: Some(log_id(3, 7)),
            leadership_transfer: true,
        };
        for req in [
            Request::Append {
                rpc: AppendEntriesRequest {
                    vote,
                    prev_log_id: Some(log_id(3, 4)),
                    entries,
                    leader_commit: Some(log_id(3, 5)),
                },
                sent_at: Some(1_796_172_745_406_805_199),
            },
            Request::Append {
                rpc: AppendEntriesRequest {
                    vote,
                    prev_log_id: None,
                    entries: Vec::new(),
                    leader_commit: None,
                },
                sent_at: None,
            },
            Request::Vote(vote_req.clone()),
            Request::PreVote(vote_req),
            Request::TransferLeader(TransferLeaderRequest::new(vote, 3, Some(log_id(3, 7)))),
            Request::Snapshot {
                vote,
                meta: SnapshotMeta {
                    last_log_id: Some(log_id(3, 7)),
                    last_membership: StoredMembership::new(Some(log_id(3, 7)), membership),
                },
            },
            Request::Initialized,
            Request::Announce {
                id: 2,
                client_addr: "[::1]:7002".into(),
            },
        ] {
            through(req).await;
        }
        for answer in [
            Response::Append(AppendEntriesResponse::Success),
            Response::Append(AppendEntriesResponse::PartialSuccess(Some(log_id(3, 6)))),
            Response::Append(AppendEntriesResponse::PartialSuccess(None)),
            Response::Append(AppendEntriesResponse::Conflict),
            Response::Append(AppendEntriesResponse::HigherVote(Vote::new(5, 1))),
            Response::Vote(VoteResponse::new(vote, Some(log_id(3, 7)), true)),
            Response::Vote(VoteResponse::new(vote, None, false)),
            Response::TransferLeader(Ok(())),
            Response::TransferLeader(Err(TransferLeaderError::VoteChanged {
                expected: vote,
                actual: Vote::new(4, 3),
            })),
            Response::TransferLeader(Err(TransferLeaderError::LogNotFlushed {
                expected: Some(log_id(3, 7)),
                actual: None,
            })),
            Response::Snapshot(SnapshotResponse::new(vote)),
            Response::Initialized(true),
            Response::Announced,
            Response::Failed("stopped".into()),
        ] {
            through(answer).await;
        }
        through(Piece::Data {
            name: "shard-0.snap".into(),
            bytes: Bytes::from_static(b"data"),
        })
        .await;
        through(Piece::Done).await;
    }

    #[tokio::test]
    async fn a_damaged_or_oversized_frame_is_an_error() {
        let mut out = BytesMut::new();
        frame_with(&mut out, |out| Response::Initialized(true).put(out));
        // A flipped bit: the checksum fails.
        let mut bad = out.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        let err = recv::<Response>(&mut &bad[..], MAX_FRAME)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("bad frame"), "{err}");
        // Not a frame at all.
        let err = recv::<Response>(&mut &b"*1\r\n$4\r\nPING\r\n"[..], MAX_FRAME)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("not a frame"), "{err}");
        // Longer than the reader takes: refused before it is read.
        let err = recv::<Response>(&mut &out[..], 1).await.unwrap_err();
        assert!(err.to_string().contains("too large"), "{err}");
        // An intact frame whose payload is not a message.
        let mut junk = BytesMut::new();
        frame_with(&mut junk, |out| out.extend_from_slice(&[99]));
        assert!(recv::<Response>(&mut &junk[..], MAX_FRAME).await.is_err());
    }
}
