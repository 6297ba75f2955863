//! The payload of a normal Raft entry (replication.md §4.1): one shard's result records of one
//! loop turn, stamped with the leader's `now`. Followers apply them with the engine's
//! clock-free replay (`journal::apply`), as a restart replays the shard's log.

use std::fmt;

use bytes::BytesMut;

use crate::engine::journal::Record;
use crate::engine::types::Nanos;
use crate::persist::codec::{decode_record, encode_record, Dec, DecodeError, Enc};

/// One shard's records of one loop turn.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardEntry {
    /// The shard whose engine made the records.
    pub shard: u16,
    /// The leader's clock when it made them: the floor a new leader's clock starts from.
    pub now: Nanos,
    /// The results, in order.
    pub records: Vec<Record>,
}

impl fmt::Display for ShardEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "shard {} at {}: {} records",
            self.shard,
            self.now,
            self.records.len()
        )
    }
}

impl ShardEntry {
    /// Appends the encoding: `[shard u64][now i64][count u64][records]`, each record in the
    /// shard log's own encoding.
    pub fn encode(&self, out: &mut BytesMut) {
        let mut e = Enc(out);
        e.u64(u64::from(self.shard));
        e.i64(self.now);
        e.u64(self.records.len() as u64);
        for r in &self.records {
            encode_record(r, out);
        }
    }

    /// Decodes what [`ShardEntry::encode`] wrote.
    pub fn decode(d: &mut Dec) -> Result<ShardEntry, DecodeError> {
        let shard = u16::try_from(d.u64()?).map_err(|_| DecodeError("bad shard index"))?;
        let now = d.i64()?;
        let count = d.u64()?;
        let mut records = Vec::with_capacity(count.min(1024) as usize);
        for _ in 0..count {
            records.push(decode_record(d)?);
        }
        Ok(ShardEntry {
            shard,
            now,
            records,
        })
    }
}
