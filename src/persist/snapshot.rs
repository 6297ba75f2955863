//! Snapshots: a shard's whole state as the records that rebuild it, with a checksum.
//!
//! `[b"PMTDSNP1"][body len u64][crc32c u32][body]`, body = `[lsn u64][token hwm i64][count
//! u64][records...]`. Loading applies the records with the same `apply` the log replay uses.

use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{decode_record, encode_record, Dec, Enc};
use crate::engine::journal::{apply, namespace_records};
use crate::engine::state::Namespace;
use crate::engine::types::{FencingToken, Name};

const MAGIC: &[u8; 8] = b"PMTDSNP1";

/// A decoded snapshot.
pub struct Snapshot {
    /// Every log record up to this LSN is inside.
    pub lsn: u64,
    /// Fencing-token high-water mark.
    pub hwm: FencingToken,
    /// The namespaces.
    pub namespaces: BTreeMap<Name, Namespace>,
}

/// Encodes a shard's state.
pub fn encode(namespaces: &BTreeMap<Name, Namespace>, hwm: FencingToken, lsn: u64) -> Bytes {
    let mut records = Vec::new();
    for n in namespaces.values() {
        namespace_records(n, &mut records);
    }
    let mut body = BytesMut::with_capacity(64 + records.len() * 96);
    {
        let mut e = Enc(&mut body);
        e.u64(lsn);
        e.i64(hwm);
        e.u64(records.len() as u64);
    }
    for r in &records {
        encode_record(r, &mut body);
    }
    let mut out = BytesMut::with_capacity(body.len() + 20);
    out.put_slice(MAGIC);
    out.put_u64_le(body.len() as u64);
    out.put_u32_le(crc32c::crc32c(&body));
    out.put_slice(&body);
    out.freeze()
}

/// Decodes a snapshot; the error says what is wrong.
pub fn decode(buf: Bytes) -> Result<Snapshot, String> {
    if buf.len() < 20 || &buf[..8] != MAGIC {
        return Err("not a permitd snapshot (bad header)".into());
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let body = buf.slice(20..);
    if body.len() != len {
        return Err(format!(
            "truncated: body is {} bytes, header says {len}",
            body.len()
        ));
    }
    if crc32c::crc32c(&body) != crc {
        return Err("checksum mismatch".into());
    }
    let mut d = Dec::new(body);
    let bad = |e: super::codec::DecodeError| e.0.to_string();
    let lsn = d.u64().map_err(bad)?;
    let mut hwm = d.i64().map_err(bad)?;
    let count = d.u64().map_err(bad)?;
    let mut namespaces = BTreeMap::new();
    for _ in 0..count {
        let r = decode_record(&mut d).map_err(bad)?;
        apply(&mut namespaces, &mut hwm, r).map_err(|e| e.0)?;
    }
    Ok(Snapshot {
        lsn,
        hwm,
        namespaces,
    })
}
