//! The append-only log: framed records, and a scanner that tells a torn tail (dropped) from
//! corruption before the end (an error, unless repairing).
//!
//! A frame is `[0xA7][len u32][crc32c u32][payload]`, the checksum covering the length bytes and
//! the payload; a payload is `[lsn u64][record]`.

use bytes::{BufMut, Bytes, BytesMut};

use super::codec::{decode_record, encode_record, Dec, Enc};
use crate::engine::journal::Record;

const MAGIC: u8 = 0xA7;
const HEADER: usize = 9;

/// Appends one framed record to `out`.
pub fn frame(lsn: u64, rec: &Record, out: &mut BytesMut) {
    let start = out.len();
    out.put_u8(MAGIC);
    out.put_u32_le(0);
    out.put_u32_le(0);
    Enc(out).u64(lsn);
    encode_record(rec, out);
    let len = (out.len() - start - HEADER) as u32;
    out[start + 1..start + 5].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), &out[start + HEADER..]);
    out[start + 5..start + 9].copy_from_slice(&crc.to_le_bytes());
}

/// Parses the frame at `pos`: its lsn, record and end offset, or `None` when it is not intact.
fn parse_at(buf: &Bytes, pos: usize) -> Option<(u64, Record, usize)> {
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
    let lsn = d.u64().ok()?;
    let rec = decode_record(&mut d).ok()?;
    if !d.is_empty() {
        return None;
    }
    Some((lsn, rec, end))
}

/// What a log scan found.
#[derive(Debug)]
pub struct Scan {
    /// Intact records, in order.
    pub records: Vec<(u64, Record)>,
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

/// Reads every record of a log. A bad frame with nothing intact after it is a torn tail from a
/// crash and is dropped; with intact frames after it, it is corruption: an error, or with
/// `repair` the log is cut there (everything from the bad record on is dropped).
pub fn scan(buf: Bytes, repair: bool) -> Result<Scan, Corrupt> {
    let mut records = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        match parse_at(&buf, pos) {
            Some((lsn, rec, end)) => {
                records.push((lsn, rec));
                pos = end;
            }
            None => {
                let intact_after = (pos + 1..buf.len()).any(|p| parse_at(&buf, p).is_some());
                if !intact_after {
                    return Ok(Scan {
                        records,
                        torn_at: Some(pos),
                        repaired_at: None,
                    });
                }
                if repair {
                    return Ok(Scan {
                        records,
                        torn_at: None,
                        repaired_at: Some(pos),
                    });
                }
                return Err(Corrupt { offset: pos });
            }
        }
    }
    Ok(Scan {
        records,
        torn_at: None,
        repaired_at: None,
    })
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
            frame(i as u64 + 1, &rec(i), &mut out);
        }
        out
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
        assert_eq!(s.records[4], (5, rec(4)));
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
}
