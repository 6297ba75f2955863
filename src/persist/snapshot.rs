//! Snapshots: a shard's whole state as the records that rebuild it, with a checksum.
//!
//! `[b"PMTDSNP1"][body len u64][crc32c u32][body]`, body = `[lsn u64][token hwm i64][count
//! u64][records...]`. Loading applies the records with the same `apply` the log replay uses.
//!
//! A snapshot is encoded in pieces of about [`PIECE`] bytes that a writer thread puts on disk
//! while the next ones are encoded, so the state is never copied into one buffer as large as
//! itself (1M leases are about 170 MB encoded) and the shard pauses only to encode.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};

use super::codec::{decode_record, encode_record, Dec, Enc};
use crate::engine::journal::{apply, namespace_records};
use crate::engine::state::Namespace;
use crate::engine::types::{FencingToken, Name};

const MAGIC: &[u8; 8] = b"PMTDSNP1";

/// Size of the header before the body.
pub const HEADER_LEN: usize = 20;

/// About how many bytes of body each [`Piece::Body`] carries.
const PIECE: usize = 1 << 20;

/// A decoded snapshot.
#[allow(missing_docs)]
pub struct Snapshot {
    /// Every log record up to this LSN is inside.
    pub lsn: u64,
    /// Fencing-token high-water mark.
    pub hwm: FencingToken,
    pub namespaces: BTreeMap<Name, Namespace>,
}

/// One piece of an encoded snapshot, in the order [`encode`] hands them out.
#[derive(Debug)]
pub enum Piece {
    /// The next bytes of the body.
    Body(Bytes),
    /// The header, known once the whole body is out: it goes before the body.
    Header([u8; HEADER_LEN]),
}

/// Encodes a shard's state, handing `sink` the body in pieces and then the header. Returns
/// false when `sink` refused a piece (its writer failed): the snapshot is then incomplete.
pub fn encode(
    namespaces: &BTreeMap<Name, Namespace>,
    hwm: FencingToken,
    lsn: u64,
    mut sink: impl FnMut(Piece) -> bool,
) -> bool {
    let count: usize = namespaces
        .values()
        .map(|n| {
            1 + n.leases.len()
                + n.semaphores.len()
                + n.semaphores
                    .values()
                    .map(|s| s.holders.len())
                    .sum::<usize>()
        })
        .sum();
    let mut buf = BytesMut::with_capacity(PIECE + 4096);
    {
        let mut e = Enc(&mut buf);
        e.u64(lsn);
        e.i64(hwm);
        e.u64(count as u64);
    }
    let (mut len, mut crc, mut ok) = (0u64, 0u32, true);
    let mut emit = |buf: &mut BytesMut, sink: &mut dyn FnMut(Piece) -> bool| {
        len += buf.len() as u64;
        crc = crc32c::crc32c_append(crc, buf);
        ok = ok && sink(Piece::Body(buf.split().freeze()));
        buf.reserve(PIECE + 4096);
    };
    let mut written = 0usize;
    for n in namespaces.values() {
        namespace_records(n, &mut |r| {
            written += 1;
            encode_record(&r, &mut buf);
            if buf.len() >= PIECE {
                emit(&mut buf, &mut sink);
            }
        });
    }
    debug_assert_eq!(written, count, "the header's record count is exact");
    emit(&mut buf, &mut sink);
    let mut header = [0u8; HEADER_LEN];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&len.to_le_bytes());
    header[16..].copy_from_slice(&crc.to_le_bytes());
    ok && sink(Piece::Header(header))
}

/// The whole snapshot file's bytes in one buffer: tests compare states through it, and a new
/// cluster leader copies a shard's state out of the state machine with it.
pub fn to_bytes(namespaces: &BTreeMap<Name, Namespace>, hwm: FencingToken, lsn: u64) -> Bytes {
    use bytes::BufMut;
    let mut body = BytesMut::new();
    let mut out = BytesMut::new();
    encode(namespaces, hwm, lsn, |p| {
        match p {
            Piece::Body(b) => body.put_slice(&b),
            Piece::Header(h) => out.put_slice(&h),
        }
        true
    });
    out.put_slice(&body);
    out.freeze()
}

/// Decodes a snapshot; the error says what is wrong.
pub fn decode(buf: Bytes) -> Result<Snapshot, String> {
    if buf.len() < HEADER_LEN || &buf[..8] != MAGIC {
        return Err("not a permitd snapshot (bad header)".into());
    }
    let len = u64::from_le_bytes(buf[8..16].try_into().expect("8 bytes")) as usize;
    let crc = u32::from_le_bytes(buf[16..20].try_into().expect("4 bytes"));
    let body = buf.slice(HEADER_LEN..);
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
