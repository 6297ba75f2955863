//! Reply values and their RESP2 / RESP3 encoding.
//!
//! Entities are built once as a [`Reply`] tree and encoded per connection: a map is a RESP3 map
//! after `HELLO 3` and a flat `[field, value, ...]` array under RESP2, as Redis does for
//! `CONFIG GET` or `XINFO`.

use std::borrow::Cow;

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::Error;

/// The protocol version a connection speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// RESP2, the default.
    Resp2,
    /// RESP3, after `HELLO 3`.
    Resp3,
}

impl Proto {
    /// The number `HELLO` reports.
    pub fn number(self) -> i64 {
        match self {
            Proto::Resp2 => 2,
            Proto::Resp3 => 3,
        }
    }
}

/// One reply value.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+text` (a status line: no CR or LF in it).
    Simple(Cow<'static, str>),
    /// `-CODE message`.
    Error(Error),
    /// `:n`.
    Int(i64),
    /// `$len\r\nbytes`.
    Bulk(Bytes),
    /// Null bulk (`$-1`) under RESP2, `_` under RESP3.
    Null,
    /// `*n` followed by the items.
    Array(Vec<Reply>),
    /// RESP3 map; a flat array of pairs under RESP2.
    Map(Vec<(Reply, Reply)>),
    /// RESP3 verbatim string (`=len\r\ntxt:...`); a bulk string under RESP2.
    Verbatim(Bytes),
}

impl Reply {
    /// `+OK`.
    pub const OK: Reply = Reply::Simple(Cow::Borrowed("OK"));

    /// A status line (`+text`), from a static word or a line made at run time.
    pub fn simple(s: impl Into<Cow<'static, str>>) -> Reply {
        Reply::Simple(s.into())
    }

    /// A bulk string from a static field name or word.
    pub fn text(s: &'static str) -> Reply {
        Reply::Bulk(Bytes::from_static(s.as_bytes()))
    }

    /// A bulk string from any bytes.
    pub fn bulk(b: impl Into<Bytes>) -> Reply {
        Reply::Bulk(b.into())
    }

    /// A map whose keys are static field names.
    pub fn fields(pairs: Vec<(&'static str, Reply)>) -> Reply {
        Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (Reply::text(k), v))
                .collect(),
        )
    }

    /// The value of field `name` of a map reply (`None` for a missing field or a non-map).
    pub fn field(&self, name: &str) -> Option<&Reply> {
        match self {
            Reply::Map(pairs) => pairs
                .iter()
                .find(|(k, _)| matches!(k, Reply::Bulk(b) if b == name.as_bytes()))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// Whether this reply is an error.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    /// Appends this reply, encoded for `proto`, to `out`.
    pub fn encode(&self, proto: Proto, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => {
                out.put_u8(b'+');
                out.put_slice(s.as_bytes());
                out.put_slice(b"\r\n");
            }
            Reply::Error(e) => {
                out.put_u8(b'-');
                out.put_slice(e.code().as_bytes());
                out.put_u8(b' ');
                // An error line cannot carry CR or LF; Redis replaces them with spaces.
                out.extend(e.message().bytes().map(|b| {
                    if b == b'\r' || b == b'\n' {
                        b' '
                    } else {
                        b
                    }
                }));
                out.put_slice(b"\r\n");
            }
            Reply::Int(n) => header(out, b':', *n),
            Reply::Bulk(b) => bulk(out, b),
            Reply::Null => match proto {
                Proto::Resp2 => out.put_slice(b"$-1\r\n"),
                Proto::Resp3 => out.put_slice(b"_\r\n"),
            },
            Reply::Array(items) => {
                header(out, b'*', items.len() as i64);
                for item in items {
                    item.encode(proto, out);
                }
            }
            Reply::Map(pairs) => {
                match proto {
                    Proto::Resp2 => header(out, b'*', 2 * pairs.len() as i64),
                    Proto::Resp3 => header(out, b'%', pairs.len() as i64),
                }
                for (k, v) in pairs {
                    k.encode(proto, out);
                    v.encode(proto, out);
                }
            }
            Reply::Verbatim(b) => match proto {
                Proto::Resp2 => Reply::Bulk(b.clone()).encode(proto, out),
                Proto::Resp3 => {
                    header(out, b'=', b.len() as i64 + 4);
                    out.put_slice(b"txt:");
                    out.put_slice(b);
                    out.put_slice(b"\r\n");
                }
            },
        }
    }
}

impl From<Error> for Reply {
    fn from(e: Error) -> Reply {
        Reply::Error(e)
    }
}

impl<T: Into<Reply>> From<Result<T, Error>> for Reply {
    fn from(r: Result<T, Error>) -> Reply {
        match r {
            Ok(v) => v.into(),
            Err(e) => Reply::Error(e),
        }
    }
}

/// Bulk strings up to this size are assembled on the stack and copied once.
const SMALL_BULK: usize = 64;

/// Writes `<kind><n>\r\n` with one copy into `out`.
fn header(out: &mut BytesMut, kind: u8, n: i64) {
    let mut buf = [0u8; 24];
    buf[0] = kind;
    let len = 1 + write_int(&mut buf[1..], n);
    buf[len..len + 2].copy_from_slice(b"\r\n");
    out.put_slice(&buf[..len + 2]);
}

/// Writes a bulk string; a short one (most field names and values) in a single copy.
fn bulk(out: &mut BytesMut, b: &[u8]) {
    if b.len() > SMALL_BULK {
        header(out, b'$', b.len() as i64);
        out.put_slice(b);
        out.put_slice(b"\r\n");
        return;
    }
    let mut buf = [0u8; SMALL_BULK + 8];
    buf[0] = b'$';
    let mut len = 1 + write_int(&mut buf[1..], b.len() as i64);
    buf[len..len + 2].copy_from_slice(b"\r\n");
    len += 2;
    buf[len..len + b.len()].copy_from_slice(b);
    len += b.len();
    buf[len..len + 2].copy_from_slice(b"\r\n");
    out.put_slice(&buf[..len + 2]);
}

/// Writes the decimal form of `n` at the start of `buf` (at least 20 bytes); returns its length.
fn write_int(buf: &mut [u8], n: i64) -> usize {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = n.unsigned_abs();
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    let mut at = 0;
    if n < 0 {
        buf[0] = b'-';
        at = 1;
    }
    let len = digits.len() - i;
    buf[at..at + len].copy_from_slice(&digits[i..]);
    at + len
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis_protocol::resp3::decode::complete::decode;
    use redis_protocol::resp3::types::{OwnedFrame, Resp3Frame};

    fn enc(r: &Reply, p: Proto) -> Vec<u8> {
        let mut out = BytesMut::new();
        r.encode(p, &mut out);
        out.to_vec()
    }

    #[test]
    fn map_is_flat_array_in_resp2_and_map_in_resp3() {
        let r = Reply::fields(vec![("a", Reply::Int(1)), ("b", Reply::text("x"))]);
        assert_eq!(
            enc(&r, Proto::Resp2),
            b"*4\r\n$1\r\na\r\n:1\r\n$1\r\nb\r\n$1\r\nx\r\n"
        );
        let bytes = enc(&r, Proto::Resp3);
        let (frame, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        match frame {
            OwnedFrame::Map { data, .. } => assert_eq!(data.len(), 2),
            other => panic!("not a map: {other:?}"),
        }
    }

    #[test]
    fn integers_and_errors() {
        assert_eq!(enc(&Reply::Int(-42), Proto::Resp2), b":-42\r\n");
        assert_eq!(
            enc(&Reply::Int(i64::MIN), Proto::Resp2),
            b":-9223372036854775808\r\n"
        );
        let e = Reply::Error(Error::NotFound("lease\r\nx".into()));
        assert_eq!(enc(&e, Proto::Resp3), b"-NOTFOUND lease  x\r\n");
    }

    #[test]
    fn bulk_strings_around_the_small_size_are_identical_in_form() {
        for len in [0, 1, 9, 10, 63, 64, 65, 200] {
            let data = vec![b'x'; len];
            let bytes = enc(&Reply::Bulk(Bytes::from(data.clone())), Proto::Resp2);
            let mut want = format!("${len}\r\n").into_bytes();
            want.extend_from_slice(&data);
            want.extend_from_slice(b"\r\n");
            assert_eq!(bytes, want, "length {len}");
        }
    }

    #[test]
    fn verbatim_and_null() {
        let v = Reply::Verbatim(Bytes::from_static(b"hi"));
        assert_eq!(enc(&v, Proto::Resp2), b"$2\r\nhi\r\n");
        let bytes = enc(&v, Proto::Resp3);
        let (frame, _) = decode(&bytes).unwrap().unwrap();
        assert_eq!(frame.as_str(), Some("hi"));
        assert_eq!(enc(&Reply::Null, Proto::Resp2), b"$-1\r\n");
        assert_eq!(enc(&Reply::Null, Proto::Resp3), b"_\r\n");
    }
}
