//! The append-only log: framed records, and a scanner that tells a torn tail (dropped) from
//! corruption (an error, unless repairing).
//!
//! A frame is `[0xA7][len u32][crc32c u32][payload]`, the checksum covering the length bytes and
//! the payload; a shard log's payload is `[lsn u64][record]...`: the records of one change of
//! the shard (all that one turn of its thread journaled), so that a crash keeps all of them or
//! none (the records of a SEM.ACQUIREALL's grant, of a transaction). A log written when a frame
//! held one record reads the same. The framing and the scan take any
//! payload ([`frame_with`], [`scan_with`]): the cluster's Raft log (`cluster/log.rs`) frames its
//! entries the same way.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{decode_record, encode_record, Dec, DecodeError, Enc};
use crate::engine::journal::Record;

const MAGIC: u8 = 0xA7;
const HEADER: usize = 9;

/// Appends one frame of `recs` (one change, at least one record) to `out`.
pub fn frame(lsn: u64, recs: &[Record], out: &mut BytesMut) {
    debug_assert!(!recs.is_empty());
    frame_with(out, |out| {
        Enc(out).u64(lsn);
        for rec in recs {
            encode_record(rec, out);
        }
    });
}

/// Appends one frame to `out`, whose payload `payload` writes.
pub fn frame_with(out: &mut BytesMut, payload: impl FnOnce(&mut BytesMut)) {
    let start = out.len();
    out.put_u8(MAGIC);
    out.put_u32_le(0);
    out.put_u32_le(0);
    payload(out);
    let len = (out.len() - start - HEADER) as u32;
    out[start + 1..start + 5].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), &out[start + HEADER..]);
    out[start + 5..start + 9].copy_from_slice(&crc.to_le_bytes());
}

/// The bytes of a frame's header, before its payload.
pub const FRAME_HEADER: usize = HEADER;

/// The payload length a frame header announces, or `None` when `head` is not a frame's header.
/// A stream reader (the cluster's peer connections) reads the header, then that many bytes.
pub fn frame_payload_len(head: &[u8; HEADER]) -> Option<usize> {
    (head[0] == MAGIC).then(|| u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize)
}

/// Decodes one whole frame read from a stream: `None` unless it is intact, its payload decodes
/// and nothing is left over.
pub fn decode_frame<T>(
    frame: Bytes,
    decode: impl Fn(&mut Dec) -> Result<T, DecodeError>,
) -> Option<T> {
    match parse_at(&frame, 0, &decode) {
        Some((value, end)) if end == frame.len() => Some(value),
        _ => None,
    }
}

/// A shard log's payload: its lsn and records (at least one).
fn lsn_records(d: &mut Dec) -> Result<(u64, Vec<Record>), DecodeError> {
    let lsn = d.u64()?;
    let mut recs = vec![decode_record(d)?];
    while !d.is_empty() {
        recs.push(decode_record(d)?);
    }
    Ok((lsn, recs))
}

/// Parses the frame at `pos`: its payload decoded and its end offset, or `None` when it is not
/// intact (a payload that does not decode, or leaves bytes over, is not intact either).
fn parse_at<T>(
    buf: &Bytes,
    pos: usize,
    decode: &impl Fn(&mut Dec) -> Result<T, DecodeError>,
) -> Option<(T, usize)> {
    let head = buf.get(pos..pos + HEADER)?;
    if head[0] != MAGIC {
        return None;
    }
    let len_bytes: [u8; 4] = head[1..5].try_into().ok()?;
    let len = u32::from_le_bytes(len_bytes) as usize;
    let crc = u32::from_le_bytes(head[5..9].try_into().ok()?);
    let end = pos.checked_add(HEADER)?.checked_add(len)?;
    let payload = buf.get(pos + HEADER..end)?;
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != crc {
        return None;
    }
    let mut d = Dec::new(buf.slice(pos + HEADER..end));
    let value = decode(&mut d).ok()?;
    if !d.is_empty() {
        return None;
    }
    Some((value, end))
}

/// What a log scan found.
#[derive(Debug)]
pub struct Scan<T = (u64, Vec<Record>)> {
    /// Intact frames' payloads, in order.
    pub records: Vec<T>,
    /// Where each record's frame ends (the offset the next one starts at).
    pub ends: Vec<usize>,
    /// Offset of a dropped torn final record, if any.
    pub torn_at: Option<usize>,
    /// Offset where a repair cut the log (corruption before the end), if any.
    pub repaired_at: Option<usize>,
}

/// A bad record followed by intact ones: the log is corrupt at `offset`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    /// Byte offset of the first bad record.
    pub offset: usize,
}

/// Bytes the file system writes or loses together after a crash: a page of the page cache, and
/// the block size of the usual file systems (ext4, xfs, tmpfs). A crash that lost part of a
/// write loses whole pages of it.
const PAGE: usize = 4096;

/// Whether the bad frame at `pos`, with no intact frame after it, is what a crash during its
/// write leaves, rather than damage to a record that was written whole:
///
/// - a prefix: the file ends inside the frame (its header, or the payload its length names).
///   `write` appends in order, so a crash leaves a prefix of the frame and never anything but
///   the frame's own bytes; the first byte is then the frame's magic;
/// - or zeros from a page boundary to the end of the file: a file system that made the file
///   longer before the pages of the write reached the disk (ext4 without data ordering, xfs)
///   reads those pages back as zeros, and a preallocated tail reads as zeros.
///
/// (The cluster's Raft log, which writes over zeros written ahead, adds a rule of its own for
/// sectors a power loss kept out of order: `cluster/log.rs` `cut_short`.)
///
/// Anything else, such as a frame of full length whose checksum fails with nonzero bytes up to
/// the end (a flipped bit), is damage: it may be a change that was acknowledged, so it is not
/// dropped quietly. Two cases are left that no check can tell: a flipped bit in the last frame's
/// length that makes it run past the end looks like a prefix, and so does a flipped bit in a
/// last frame whose own bytes end in zeros across a page boundary.
fn torn_at(buf: &[u8], pos: usize) -> bool {
    let rest = &buf[pos..];
    let zeros_from = pos + rest.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    let zeroed_page = zeros_from == pos || zeros_from.div_ceil(PAGE) * PAGE < buf.len();
    if zeroed_page && zeros_from < buf.len() {
        return true;
    }
    if rest[0] != MAGIC {
        return false;
    }
    let Some(head) = rest.get(..HEADER) else {
        return true;
    };
    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    rest.len() < HEADER + len
}

/// Reads every record of a log. A bad frame with nothing intact after it that looks torn (see
/// [`torn_at`]) is the tail of a write a crash cut short, and is dropped; any other bad frame
/// is corruption: an error, or with `repair` the log is cut there (everything from the bad
/// record on is dropped).
pub fn scan(buf: Bytes, repair: bool) -> Result<Scan, Corrupt> {
    scan_with(buf, repair, lsn_records)
}

/// The record of a file that is replaced by rename, so whole or absent: `None` (damage) unless
/// `buf` is exactly one intact frame whose payload `decode` reads.
pub fn single_frame<T>(
    buf: Bytes,
    decode: impl Fn(&mut Dec) -> Result<T, DecodeError>,
) -> Option<T> {
    match scan_with(buf, false, decode) {
        Ok(s) if s.records.len() == 1 && s.torn_at.is_none() => s.records.into_iter().next(),
        _ => None,
    }
}

/// [`scan`] of frames whose payloads `decode` reads.
pub fn scan_with<T>(
    buf: Bytes,
    repair: bool,
    decode: impl Fn(&mut Dec) -> Result<T, DecodeError>,
) -> Result<Scan<T>, Corrupt> {
    let mut out = Scan {
        records: Vec::new(),
        ends: Vec::new(),
        torn_at: None,
        repaired_at: None,
    };
    let mut pos = 0;
    while pos < buf.len() {
        match parse_at(&buf, pos, &decode) {
            Some((value, end)) => {
                out.records.push(value);
                out.ends.push(end);
                pos = end;
            }
            None => {
                let intact_after =
                    (pos + 1..buf.len()).any(|p| parse_at(&buf, p, &decode).is_some());
                if !intact_after && torn_at(&buf, pos) {
                    out.torn_at = Some(pos);
                } else if repair {
                    out.repaired_at = Some(pos);
                } else {
                    return Err(Corrupt { offset: pos });
                }
                return Ok(out);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::types::Name;

    fn rec(i: u8) -> Record {
        Record::NsDel {
            name: Name::new_unchecked(Bytes::from(format!("ns{i}"))),
        }
    }

    fn log_of(n: u8) -> BytesMut {
        let mut out = BytesMut::new();
        for i in 0..n {
            frame(i as u64 + 1, &[rec(i)], &mut out);
        }
        out
    }

    /// The records of one change are one frame: a crash that cuts its write short anywhere
    /// drops every one of them, never the second half alone (a SEM.ACQUIREALL's grant writes a
    /// hold per semaphore).
    #[test]
    fn a_change_of_several_records_is_kept_whole_or_dropped_whole() {
        let mut out = log_of(1);
        let first = out.len();
        frame(2, &[rec(1), rec(2), rec(3)], &mut out);
        let s = scan(out.clone().freeze(), false).unwrap();
        assert_eq!(s.records[1], (2, vec![rec(1), rec(2), rec(3)]));
        for cut in first + 1..out.len() {
            let s = scan(out.clone().freeze().slice(..cut), false).unwrap();
            assert_eq!(s.records, vec![(1, vec![rec(0)])], "cut at {cut}");
            assert_eq!(s.torn_at, Some(first), "cut at {cut}");
        }
    }

    #[test]
    fn empty_log_is_fine() {
        let s = scan(Bytes::new(), false).unwrap();
        assert!(s.records.is_empty() && s.torn_at.is_none());
    }

    #[test]
    fn all_records_read_back() {
        let s = scan(log_of(5).freeze(), false).unwrap();
        assert_eq!(s.records.len(), 5);
        assert_eq!(s.records[4], (5, vec![rec(4)]));
    }

    #[test]
    fn torn_tail_is_dropped() {
        let full = log_of(5);
        for cut in 1..12 {
            let torn = full.clone().freeze().slice(..full.len() - cut);
            let s = scan(torn, false).unwrap();
            assert_eq!(s.records.len(), 4, "cut {cut}");
            assert!(s.torn_at.is_some());
        }
    }

    #[test]
    fn flipped_byte_in_the_middle_is_corruption_or_repaired() {
        let mut buf = log_of(5);
        let second = scan(log_of(1).freeze(), false).unwrap();
        assert_eq!(second.records.len(), 1);
        let first_len = log_of(1).len();
        buf[first_len + 12] ^= 0x40;
        let err = scan(buf.clone().freeze(), false).unwrap_err();
        assert_eq!(err.offset, first_len);
        let repaired = scan(buf.freeze(), true).unwrap();
        assert_eq!(repaired.records.len(), 1);
        assert_eq!(repaired.repaired_at, Some(first_len));
    }

    /// A log whose last record, of some 300 bytes, starts at or after `at` (within 40 bytes).
    fn log_with_last_at(at: usize) -> (BytesMut, usize) {
        let mut out = BytesMut::new();
        while out.len() < at {
            frame(out.len() as u64 + 1, &[rec(0)], &mut out);
        }
        let start = out.len();
        let big = Record::NsPut {
            name: Name::new_unchecked(Bytes::from_static(b"big")),
            description: Bytes::from(vec![b'd'; 300]),
            metadata: Default::default(),
            version: 1,
            created_at: 1,
            updated_at: 1,
        };
        frame(99, &[big], &mut out);
        (out, start)
    }

    #[test]
    fn a_flipped_bit_in_the_last_record_is_corruption_not_a_torn_tail() {
        let full = log_of(5);
        let last = full.len() - log_of(1).len();
        // Not in the length field (bytes 1 to 4): see `torn_at`.
        for at in [last, last + 6, last + 12, full.len() - 1] {
            let mut buf = full.clone();
            buf[at] ^= 0x10;
            let err = scan(buf.clone().freeze(), false).expect_err("corruption");
            assert_eq!(err.offset, last, "flip at {at}");
            let repaired = scan(buf.freeze(), true).unwrap();
            assert_eq!(repaired.records.len(), 4);
            assert_eq!(repaired.repaired_at, Some(last));
        }
    }

    #[test]
    fn zeros_where_a_crash_left_pages_unwritten_are_a_torn_tail() {
        // The last record crosses a page boundary and the pages from it on read as zeros.
        let (mut buf, start) = log_with_last_at(PAGE - 100);
        assert!(start < PAGE && buf.len() > PAGE);
        for b in &mut buf[PAGE..] {
            *b = 0;
        }
        let s = scan(buf.freeze(), false).unwrap();
        assert_eq!(s.torn_at, Some(start));
        // Zeros after the last whole record (a preallocated or zero-filled tail), short or long.
        for zeros in [1, 9, 100, 5000] {
            let mut buf = log_of(3);
            let end = buf.len();
            buf.resize(end + zeros, 0);
            let s = scan(buf.freeze(), false).unwrap();
            assert_eq!(
                (s.records.len(), s.torn_at),
                (3, Some(end)),
                "{zeros} zeros"
            );
        }
    }

    #[test]
    fn zeros_inside_a_page_of_the_last_record_are_corruption() {
        // Zeroed bytes that do not reach back to a page boundary: no crash leaves that.
        let mut buf = log_of(4);
        let start = buf.len() - log_of(1).len();
        let n = buf.len();
        for b in &mut buf[n - 3..] {
            *b = 0;
        }
        assert_eq!(scan(buf.freeze(), false).unwrap_err().offset, start);
    }

    #[test]
    fn bytes_that_are_no_frame_at_the_end_are_corruption() {
        let mut buf = log_of(3);
        let end = buf.len();
        buf.extend_from_slice(b"xy");
        assert_eq!(scan(buf.freeze(), false).unwrap_err().offset, end);
    }
}
