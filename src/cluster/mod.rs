//! Cluster mode (SPEC §10): the storage openraft runs on, the peer network and the node
//! runtime; `server/cluster.rs` and `server/worker/replica.rs` run the server on them. With no
//! cluster option nothing here runs.
//!
//! Every openraft type is named in this module and its files only, so that an alpha upgrade
//! stays here (`shared/design/replication.md` §2.4):
//! - `entry.rs`: what one Raft entry carries, a shard's result records of one loop turn;
//! - `codec.rs`: openraft's entries, log ids, votes and memberships in our binary encoding;
//! - `log.rs` and `writer.rs`: the Raft log in append-only segments of `persist`'s frames,
//!   written over zeros written ahead and fdatasync'd on a thread of its own; `growth.rs`:
//!   snapshots asked for by the log's size too, since the log keeps its entries in memory;
//!   `purge.rs`: what the log keeps of a snapshot's entries, by count and by size; `room.rs`:
//!   a full disk waited out, where any other failed write is final;
//! - `state.rs`: the state machine, the shards' replicated state rebuilt by the clock-free
//!   replay, with snapshots of `persist`'s per-shard encoding;
//! - `wire.rs`: the RPCs peers exchange, one frame each; `auth.rs`: the cluster-secret
//!   handshake that opens every peer connection; `tls.rs`: the cluster port in the clear or
//!   in mutual TLS, which carries that handshake and everything after it;
//! - `stamps.rs`: the clock guard's evidence, the send times of the leaders' appends;
//! - `network.rs`: openraft's network over pooled connections, and `serve.rs` the listener
//!   serving peers' RPCs; `coalesce.rs`: a follower's commit index carried by the next entries;
//! - `config.rs`: a node's cluster settings and `--cluster-init`'s parsing;
//! - `node.rs`: the Raft thread and its runtime, `--cluster-init`, and the `Send` handle the
//!   server uses (writes, status, linearizable reads, leader transfer).

pub mod auth;
mod coalesce;
pub mod codec;
pub mod config;
pub mod entry;
mod growth;
pub mod log;
pub mod network;
pub mod node;
mod purge;
mod room;
pub mod serve;
pub mod stamps;
pub mod state;
pub mod tls;
pub mod wire;
mod writer;

use entry::ShardEntry;

/// The log filter for `--log-level` `level`: openraft's heartbeat worker and replication
/// streams warn at each try while a peer is down (10-12 lines a second on the leader for one
/// dead follower, measured), so they log errors only, unless `level` names openraft itself (or
/// is `off`).
/// `network.rs` says once that a peer cannot be reached, `node.rs` when a follower stops
/// answering the leader and when it answers again.
pub fn log_filter(level: &str) -> String {
    if level.contains("openraft") || level.trim() == "off" {
        level.to_string()
    } else {
        format!("{level},openraft::core::heartbeat=error,openraft::replication=error")
    }
}

/// A voter's addresses, kept in the membership (which lives in the log).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peer {
    /// Where peers reach its Raft port.
    pub raft_addr: String,
    /// Where clients reach it (the address `MOVED` and `CLUSTER SLOTS` hand out).
    pub client_addr: String,
}

openraft::declare_raft_types!(
    /// permitd's Raft types: node ids are integers (`--cluster-node-id`), an entry's data is a
    /// shard's records, and applying one answers nothing (the leader already has the reply).
    pub TypeConfig:
        D = ShardEntry,
        R = (),
        Node = Peer,
);

/// A Raft log entry.
pub type Entry = openraft::type_config::alias::EntryOf<TypeConfig>;
/// A log entry's id (leader and index).
pub type LogId = openraft::type_config::alias::LogIdOf<TypeConfig>;
/// What an entry carries: nothing (a new leader's first), a shard's records, or a membership.
pub type Payload = openraft::EntryPayload<ShardEntry, u64, Peer>;
/// A node's vote.
pub type Vote = openraft::type_config::alias::VoteOf<TypeConfig>;
/// A membership and the id of the entry that set it.
pub type StoredMembership = openraft::type_config::alias::StoredMembershipOf<TypeConfig>;
/// The voters (one set, or two while a change is joint) and every node's addresses.
pub type Membership = openraft::Membership<u64, Peer>;
/// What a snapshot holds: the last entry in it and the membership then.
pub type SnapshotMeta = openraft::type_config::alias::SnapshotMetaOf<TypeConfig>;
/// The id of an entry's leader (its term and node).
pub type LeaderId = openraft::type_config::alias::CommittedLeaderIdOf<TypeConfig>;

#[cfg(test)]
mod node_tests;
#[cfg(test)]
pub(crate) mod peer_tests;
#[cfg(test)]
mod test_cluster;
#[cfg(test)]
mod tests;
