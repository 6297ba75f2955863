//! Binary encoding of records and snapshots: little-endian integers, length-prefixed bytes.

use bytes::{BufMut, Bytes, BytesMut};

use crate::engine::journal::Record;
use crate::engine::types::{LeaseId, Metadata, Name};

/// A decoding failure: the bytes are not what was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

/// Appends values to a buffer, in the encoding [`Dec`] reads.
pub struct Enc<'a>(pub &'a mut BytesMut);

impl Enc<'_> {
    /// One byte (a record's tag, a flag).
    pub fn u8(&mut self, v: u8) {
        self.0.put_u8(v);
    }
    /// 8 bytes, little-endian.
    pub fn u64(&mut self, v: u64) {
        self.0.put_u64_le(v);
    }
    /// 8 bytes, little-endian two's complement (times in ns, permits, weights, tokens).
    pub fn i64(&mut self, v: i64) {
        self.0.put_i64_le(v);
    }
    /// The length as a little-endian u32, then the bytes.
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.put_u32_le(b.len() as u32);
        self.0.put_slice(b);
    }
    /// A namespace or semaphore name, as [`bytes`](Self::bytes).
    pub fn name(&mut self, n: &Name) {
        self.bytes(n.bytes());
    }
    /// A lease id in its wire form (`ls_` and 28 characters), as [`bytes`](Self::bytes).
    pub fn lease(&mut self, id: &LeaseId) {
        self.bytes(&id.to_bytes());
    }
    /// Metadata: the number of pairs as a little-endian u32, then each key and value as
    /// [`bytes`](Self::bytes), in the order they are kept.
    pub fn meta(&mut self, m: &Metadata) {
        self.0.put_u32_le(m.pairs().len() as u32);
        for (k, v) in m.pairs() {
            self.bytes(k);
            self.bytes(v);
        }
    }
}

/// Reads values from a buffer, in the encoding [`Enc`] writes; a value cut short is a
/// [`DecodeError`].
pub struct Dec {
    buf: Bytes,
}

impl Dec {
    /// Reads from `buf`.
    pub fn new(buf: Bytes) -> Dec {
        Dec { buf }
    }

    /// Whether everything was read.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Passes over what is left unread (a message of another version, whose layout after the
    /// part read is not this one's to know).
    pub fn skip_rest(&mut self) {
        self.buf.clear();
    }

    fn take(&mut self, n: usize) -> Result<Bytes, DecodeError> {
        if self.buf.len() < n {
            return Err(DecodeError("truncated"));
        }
        Ok(self.buf.split_to(n))
    }
    /// One byte.
    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    /// 4 bytes, little-endian (the length of bytes, the count of metadata pairs).
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes(b[..].try_into().expect("4 bytes")))
    }
    /// 8 bytes, little-endian.
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        Ok(u64::from_le_bytes(b[..].try_into().expect("8 bytes")))
    }
    /// 8 bytes, little-endian two's complement.
    pub fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }
    /// A little-endian u32 length, then that many bytes, copied out: restored state must not pin
    /// the whole file buffer.
    pub fn bytes(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        Ok(Bytes::copy_from_slice(&self.take(n)?))
    }
    /// A name, as [`bytes`](Self::bytes); one a client could not have created is an error.
    pub fn name(&mut self) -> Result<Name, DecodeError> {
        let b = self.bytes()?;
        if !Name::is_valid(&b, usize::MAX) {
            return Err(DecodeError("bad name"));
        }
        Ok(Name::new_unchecked(b))
    }
    /// A lease id in its wire form, as [`bytes`](Self::bytes).
    pub fn lease(&mut self) -> Result<LeaseId, DecodeError> {
        LeaseId::parse(&self.bytes()?).ok_or(DecodeError("bad lease id"))
    }
    /// Metadata, as [`Enc::meta`] writes it.
    pub fn meta(&mut self) -> Result<Metadata, DecodeError> {
        let n = self.u32()? as usize;
        let mut pairs = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            pairs.push((self.bytes()?, self.bytes()?));
        }
        Ok(Metadata::from_pairs(pairs))
    }
}

const NS_PUT: u8 = 1;
const NS_DEL: u8 = 2;
const SEM_PUT: u8 = 3;
const SEM_DEL: u8 = 4;
const LEASE_PUT: u8 = 5;
const LEASE_DEL: u8 = 6;
const HOLD_SET: u8 = 7;
const HOLD_DEL: u8 = 8;
const TOUCH: u8 = 9;
const TIME_SHIFT: u8 = 10;

/// Appends a record's encoding.
pub fn encode_record(r: &Record, out: &mut BytesMut) {
    let mut e = Enc(out);
    match r {
        Record::NsPut {
            name,
            description,
            metadata,
            version,
            created_at,
            updated_at,
        } => {
            e.u8(NS_PUT);
            e.name(name);
            e.bytes(description);
            e.meta(metadata);
            e.i64(*version);
            e.i64(*created_at);
            e.i64(*updated_at);
        }
        Record::NsDel { name } => {
            e.u8(NS_DEL);
            e.name(name);
        }
        Record::SemPut {
            ns,
            name,
            description,
            metadata,
            permits,
            version,
            created_at,
            updated_at,
            last_activity_at,
        } => {
            e.u8(SEM_PUT);
            e.name(ns);
            e.name(name);
            e.bytes(description);
            e.meta(metadata);
            e.i64(*permits);
            e.i64(*version);
            e.i64(*created_at);
            e.i64(*updated_at);
            e.i64(*last_activity_at);
        }
        Record::SemDel { ns, name } => {
            e.u8(SEM_DEL);
            e.name(ns);
            e.name(name);
        }
        Record::LeasePut {
            ns,
            id,
            serial,
            process_id,
            created_at,
            expires_at,
            metadata,
        } => {
            e.u8(LEASE_PUT);
            e.name(ns);
            e.lease(id);
            e.u64(*serial);
            e.bytes(process_id);
            e.i64(*created_at);
            e.i64(*expires_at);
            e.meta(metadata);
        }
        Record::LeaseDel { ns, id } => {
            e.u8(LEASE_DEL);
            e.name(ns);
            e.lease(id);
        }
        Record::HoldSet {
            ns,
            sem,
            lease,
            weight,
            token,
            locked_at,
            metadata,
            at,
        } => {
            e.u8(HOLD_SET);
            e.name(ns);
            e.name(sem);
            e.lease(lease);
            e.i64(*weight);
            e.i64(*token);
            e.i64(*locked_at);
            e.meta(metadata);
            e.i64(*at);
        }
        Record::HoldDel { ns, sem, lease, at } => {
            e.u8(HOLD_DEL);
            e.name(ns);
            e.name(sem);
            e.lease(lease);
            e.i64(*at);
        }
        Record::Touch { ns, sem, at } => {
            e.u8(TOUCH);
            e.name(ns);
            e.name(sem);
            e.i64(*at);
        }
        Record::TimeShift { by, at } => {
            e.u8(TIME_SHIFT);
            e.i64(*by);
            e.i64(*at);
        }
    }
}

/// Decodes one record.
pub fn decode_record(d: &mut Dec) -> Result<Record, DecodeError> {
    Ok(match d.u8()? {
        NS_PUT => Record::NsPut {
            name: d.name()?,
            description: d.bytes()?,
            metadata: d.meta()?,
            version: d.i64()?,
            created_at: d.i64()?,
            updated_at: d.i64()?,
        },
        NS_DEL => Record::NsDel { name: d.name()? },
        SEM_PUT => Record::SemPut {
            ns: d.name()?,
            name: d.name()?,
            description: d.bytes()?,
            metadata: d.meta()?,
            permits: d.i64()?,
            version: d.i64()?,
            created_at: d.i64()?,
            updated_at: d.i64()?,
            last_activity_at: d.i64()?,
        },
        SEM_DEL => Record::SemDel {
            ns: d.name()?,
            name: d.name()?,
        },
        LEASE_PUT => Record::LeasePut {
            ns: d.name()?,
            id: d.lease()?,
            serial: d.u64()?,
            process_id: d.bytes()?,
            created_at: d.i64()?,
            expires_at: d.i64()?,
            metadata: d.meta()?,
        },
        LEASE_DEL => Record::LeaseDel {
            ns: d.name()?,
            id: d.lease()?,
        },
        HOLD_SET => Record::HoldSet {
            ns: d.name()?,
            sem: d.name()?,
            lease: d.lease()?,
            weight: d.i64()?,
            token: d.i64()?,
            locked_at: d.i64()?,
            metadata: d.meta()?,
            at: d.i64()?,
        },
        HOLD_DEL => Record::HoldDel {
            ns: d.name()?,
            sem: d.name()?,
            lease: d.lease()?,
            at: d.i64()?,
        },
        TOUCH => Record::Touch {
            ns: d.name()?,
            sem: d.name()?,
            at: d.i64()?,
        },
        TIME_SHIFT => Record::TimeShift {
            by: d.i64()?,
            at: d.i64()?,
        },
        _ => return Err(DecodeError("unknown record type")),
    })
}
