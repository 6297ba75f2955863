//! openraft's values in the binary encoding of `persist::codec`: log ids, votes, memberships
//! and entries. A Raft log frame's payload is one [`entry`].

use std::collections::{BTreeMap, BTreeSet};

use bytes::BytesMut;
use openraft::EntryPayload;

use super::entry::ShardEntry;
use super::{Entry, LeaderId, LogId, Membership, Peer, StoredMembership, Vote};
use crate::persist::codec::{Dec, DecodeError, Enc};

fn leader_id(e: &mut Enc, id: &LeaderId) {
    e.u64(id.term);
    e.u64(id.node_id);
}

fn dec_leader_id(d: &mut Dec) -> Result<LeaderId, DecodeError> {
    Ok(LeaderId {
        term: d.u64()?,
        node_id: d.u64()?,
    })
}

/// A log id: `[term][node][index]`.
pub fn log_id(e: &mut Enc, id: &LogId) {
    leader_id(e, &id.leader_id);
    e.u64(id.index);
}

/// Decodes a [`log_id`].
pub fn dec_log_id(d: &mut Dec) -> Result<LogId, DecodeError> {
    let leader = dec_leader_id(d)?;
    Ok(LogId::new(leader, d.u64()?))
}

/// An optional value: a flag byte, then the value when present.
pub fn opt<T>(e: &mut Enc, v: Option<&T>, put: impl FnOnce(&mut Enc, &T)) {
    match v {
        None => e.u8(0),
        Some(v) => {
            e.u8(1);
            put(e, v);
        }
    }
}

/// Decodes an [`opt`].
pub fn dec_opt<T>(
    d: &mut Dec,
    get: impl FnOnce(&mut Dec) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    match d.u8()? {
        0 => Ok(None),
        1 => get(d).map(Some),
        _ => Err(DecodeError("bad option flag")),
    }
}

/// An optional log id.
pub fn opt_log_id(e: &mut Enc, id: Option<&LogId>) {
    opt(e, id, log_id);
}

/// Decodes an [`opt_log_id`].
pub fn dec_opt_log_id(d: &mut Dec) -> Result<Option<LogId>, DecodeError> {
    dec_opt(d, dec_log_id)
}

/// A vote: its leader id and whether a quorum granted it.
pub fn vote(e: &mut Enc, v: &Vote) {
    leader_id(e, &v.leader_id);
    e.u8(u8::from(v.committed));
}

/// Decodes a [`vote`].
pub fn dec_vote(d: &mut Dec) -> Result<Vote, DecodeError> {
    let leader_id = dec_leader_id(d)?;
    let committed = match d.u8()? {
        0 => false,
        1 => true,
        _ => return Err(DecodeError("bad vote flag")),
    };
    Ok(Vote {
        leader_id,
        committed,
    })
}

/// An optional vote.
pub fn opt_vote(e: &mut Enc, v: Option<&Vote>) {
    opt(e, v, vote);
}

/// Decodes an [`opt_vote`].
pub fn dec_opt_vote(d: &mut Dec) -> Result<Option<Vote>, DecodeError> {
    dec_opt(d, dec_vote)
}

/// A string (an address, a file name).
pub fn text(e: &mut Enc, s: &str) {
    e.bytes(s.as_bytes());
}

/// Decodes a [`text`].
pub fn dec_text(d: &mut Dec) -> Result<String, DecodeError> {
    String::from_utf8(d.bytes()?.to_vec()).map_err(|_| DecodeError("bad text"))
}

/// A membership: each voter set, then every node with its addresses.
pub fn membership(e: &mut Enc, m: &Membership) {
    let configs = m.get_joint_config();
    e.u64(configs.len() as u64);
    for set in configs {
        e.u64(set.len() as u64);
        for id in set {
            e.u64(*id);
        }
    }
    let nodes: Vec<_> = m.nodes().collect();
    e.u64(nodes.len() as u64);
    for (id, peer) in nodes {
        e.u64(*id);
        text(e, &peer.raft_addr);
        text(e, &peer.client_addr);
    }
}

/// Decodes a [`membership`]; one openraft would not build (a voter without its node) is bad.
pub fn dec_membership(d: &mut Dec) -> Result<Membership, DecodeError> {
    let mut configs = Vec::new();
    for _ in 0..d.u64()? {
        let mut set = BTreeSet::new();
        for _ in 0..d.u64()? {
            set.insert(d.u64()?);
        }
        configs.push(set);
    }
    let mut nodes = BTreeMap::new();
    for _ in 0..d.u64()? {
        let id = d.u64()?;
        let peer = Peer {
            raft_addr: dec_text(d)?,
            client_addr: dec_text(d)?,
        };
        nodes.insert(id, peer);
    }
    Membership::new(configs, nodes).map_err(|_| DecodeError("bad membership"))
}

/// A membership with the id of the entry that set it.
pub fn stored_membership(e: &mut Enc, m: &StoredMembership) {
    opt_log_id(e, m.log_id().as_ref());
    membership(e, m.membership());
}

/// Decodes a [`stored_membership`].
pub fn dec_stored_membership(d: &mut Dec) -> Result<StoredMembership, DecodeError> {
    let id = dec_opt_log_id(d)?;
    Ok(StoredMembership::new(id, dec_membership(d)?))
}

const BLANK: u8 = 0;
const NORMAL: u8 = 1;
const MEMBERSHIP: u8 = 2;

/// An entry: its log id, then its payload (blank, a shard's records, or a membership).
pub fn entry(out: &mut BytesMut, ent: &Entry) {
    let mut e = Enc(out);
    log_id(&mut e, &ent.log_id);
    match &ent.payload {
        EntryPayload::Blank => e.u8(BLANK),
        EntryPayload::Normal(data) => {
            e.u8(NORMAL);
            data.encode(out);
        }
        EntryPayload::Membership(m) => {
            e.u8(MEMBERSHIP);
            membership(&mut e, m);
        }
    }
}

/// Decodes an [`entry`].
pub fn dec_entry(d: &mut Dec) -> Result<Entry, DecodeError> {
    let log_id = dec_log_id(d)?;
    let payload = match d.u8()? {
        BLANK => EntryPayload::Blank,
        NORMAL => EntryPayload::Normal(ShardEntry::decode(d)?),
        MEMBERSHIP => EntryPayload::Membership(dec_membership(d)?),
        _ => return Err(DecodeError("unknown entry type")),
    };
    Ok(Entry { log_id, payload })
}
