//! Reading the server's replies off raw bytes: RESP2, and the RESP3 types permitd sends (null,
//! map, verbatim string). The one reply reader of the project's own clients: the integration
//! tests' raw sockets, the engine model test (which reads the engine's replies as a RESP3 client
//! would), `permitd-soak` and `permitd-load`.
//!
//! Two levels over one grammar:
//! - [`Reader`] walks a buffer token by token ([`Token`]: a scalar, or an aggregate's size),
//!   borrowing from the buffer. It allocates nothing, so a load generator can classify replies
//!   on its hot path without costing the server under test CPU time.
//! - [`Value`] is a reply as an owned tree, with lookups by field name that read a RESP3 map and
//!   RESP2's flat `[field, value, ...]` array alike.
//!
//! Replies come off a socket in pieces: a read that reaches the end of the buffer inside a reply
//! fails with [`ReadError::Incomplete`], and the caller reads more bytes and starts again from the
//! reply's first byte.

use std::fmt;

/// Why no reply could be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// The buffer ends inside the reply: read more bytes and parse again from its start.
    Incomplete,
    /// The bytes are no reply: an unknown type byte, a bad length, a missing CRLF.
    Malformed(String),
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Incomplete => f.write_str("incomplete reply"),
            ReadError::Malformed(why) => write!(f, "malformed reply: {why}"),
        }
    }
}

impl std::error::Error for ReadError {}

fn malformed(why: String) -> ReadError {
    ReadError::Malformed(why)
}

/// One element of a reply as it stands in the buffer: a whole scalar, or the header of an
/// aggregate, whose items are the elements that follow it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token<'a> {
    /// `+text`.
    Simple(&'a [u8]),
    /// `-CODE message`, without the `-`.
    Error(&'a [u8]),
    /// `:n`.
    Int(i64),
    /// `$len` and its bytes; `None` for RESP2's null bulk string (`$-1`).
    Bulk(Option<&'a [u8]>),
    /// RESP3 `=len`: the text after its 4-byte format prefix (`txt:`).
    Verbatim(&'a [u8]),
    /// RESP3 `_`.
    Null,
    /// `*n`: `n` elements follow; `None` for RESP2's null array (`*-1`).
    Array(Option<usize>),
    /// RESP3 `%n`: `n` key/value pairs follow.
    Map(usize),
}

impl Token<'_> {
    /// How many elements follow this token as its items (none for a scalar).
    fn items(self) -> usize {
        match self {
            Token::Array(Some(n)) => n,
            Token::Map(n) => n.saturating_mul(2),
            _ => 0,
        }
    }
}

/// Reads the elements of a buffer front to back.
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// How many bytes have been read: after one whole reply, its length.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next element's token (an aggregate's items are the tokens after it).
    pub fn token(&mut self) -> Result<Token<'a>, ReadError> {
        let kind = *self.buf.get(self.pos).ok_or(ReadError::Incomplete)?;
        self.pos += 1;
        let line = self.line()?;
        Ok(match kind {
            b'+' => Token::Simple(line),
            b'-' => Token::Error(line),
            b':' => Token::Int(number(line)?),
            b'$' => Token::Bulk(self.blob(line)?),
            b'=' => {
                let blob = self
                    .blob(line)?
                    .ok_or_else(|| malformed("null verbatim string".into()))?;
                let text = blob
                    .get(4..)
                    .ok_or_else(|| malformed("verbatim string without its format".into()))?;
                Token::Verbatim(text)
            }
            b'_' if line.is_empty() => Token::Null,
            b'*' => Token::Array(length(line)?),
            b'%' => Token::Map(length(line)?.ok_or_else(|| malformed("null map".into()))?),
            other => {
                return Err(malformed(format!(
                    "unexpected reply type byte {other:#04x}"
                )))
            }
        })
    }

    /// Skips the items of `token`, read just before (nothing for a scalar).
    pub fn skip_items(&mut self, token: Token<'a>) -> Result<(), ReadError> {
        for _ in 0..token.items() {
            self.skip()?;
        }
        Ok(())
    }

    /// Skips one whole element, its items included.
    pub fn skip(&mut self) -> Result<(), ReadError> {
        let token = self.token()?;
        self.skip_items(token)
    }

    /// One whole element as an owned tree.
    pub fn value(&mut self) -> Result<Value, ReadError> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok(match self.token()? {
            Token::Simple(s) => Value::Simple(text(s)),
            Token::Error(e) => Value::Error(text(e)),
            Token::Int(n) => Value::Int(n),
            Token::Bulk(b) => Value::Bulk(b.map(<[u8]>::to_vec)),
            Token::Verbatim(t) => Value::Verbatim(t.to_vec()),
            Token::Null => Value::Null,
            Token::Array(None) => Value::Array(None),
            // Not `with_capacity(n)`: `n` comes off the wire before its items do.
            Token::Array(Some(n)) => Value::Array(Some(
                (0..n).map(|_| self.value()).collect::<Result<_, _>>()?,
            )),
            Token::Map(n) => Value::Map(
                (0..n)
                    .map(|_| Ok((self.value()?, self.value()?)))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }

    /// The rest of the line at the current position, without its CRLF.
    fn line(&mut self) -> Result<&'a [u8], ReadError> {
        let buf: &'a [u8] = self.buf;
        let rest = &buf[self.pos..];
        let end = rest
            .iter()
            .position(|&b| b == b'\r')
            .ok_or(ReadError::Incomplete)?;
        match rest.get(end + 1) {
            None => return Err(ReadError::Incomplete),
            Some(b'\n') => {}
            Some(_) => return Err(malformed("CR without LF in a reply line".into())),
        }
        self.pos += end + 2;
        Ok(&rest[..end])
    }

    /// The payload of a bulk or verbatim string whose header said `len`.
    fn blob(&mut self, len: &[u8]) -> Result<Option<&'a [u8]>, ReadError> {
        let Some(n) = length(len)? else {
            return Ok(None);
        };
        let buf: &'a [u8] = self.buf;
        let rest = &buf[self.pos..];
        if rest.len() < n.saturating_add(2) {
            return Err(ReadError::Incomplete);
        }
        if &rest[n..n + 2] != b"\r\n" {
            return Err(malformed(format!("a {n}-byte string not ended by CRLF")));
        }
        self.pos += n + 2;
        Ok(Some(&rest[..n]))
    }
}

/// A length header: `-1` is RESP2's null (`None`); any other negative length is malformed.
fn length(line: &[u8]) -> Result<Option<usize>, ReadError> {
    match number(line)? {
        -1 => Ok(None),
        n if n >= 0 => Ok(Some(n as usize)),
        n => Err(malformed(format!("bad length {n}"))),
    }
}

fn number(line: &[u8]) -> Result<i64, ReadError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| malformed(format!("bad number {:?}", String::from_utf8_lossy(line))))
}

/// The length of the first reply in `buf`, found without building it.
pub fn reply_len(buf: &[u8]) -> Result<usize, ReadError> {
    let mut r = Reader::new(buf);
    r.skip()?;
    Ok(r.position())
}

/// A reply as an owned tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    /// `+text`.
    Simple(String),
    /// `-CODE message`, without the `-`.
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$len` and its bytes; `None` for RESP2's null bulk string (`$-1`).
    Bulk(Option<Vec<u8>>),
    /// `*n` and its elements; `None` for RESP2's null array (`*-1`).
    Array(Option<Vec<Value>>),
    /// RESP3 `_`.
    Null,
    /// RESP3 `%n`: its key/value pairs, in order.
    Map(Vec<(Value, Value)>),
    /// RESP3 `=len`: the text, without its format prefix.
    Verbatim(Vec<u8>),
}

impl Value {
    /// The first reply in `buf`, and how many bytes of `buf` it takes.
    pub fn parse(buf: &[u8]) -> Result<(Value, usize), ReadError> {
        let mut r = Reader::new(buf);
        let v = r.value()?;
        Ok((v, r.position()))
    }

    /// The bytes of a string reply (simple, bulk or verbatim).
    pub fn bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Simple(s) => Some(s.as_bytes()),
            Value::Bulk(Some(b)) | Value::Verbatim(b) => Some(b),
            _ => None,
        }
    }

    /// A string reply as text (invalid UTF-8 replaced).
    pub fn text(&self) -> Option<String> {
        self.bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// An integer reply's value.
    pub fn int(&self) -> Option<i64> {
        match self {
            Value::Int(n) => Some(*n),
            _ => None,
        }
    }

    /// The elements of an array reply.
    pub fn items(&self) -> Option<&[Value]> {
        match self {
            Value::Array(Some(items)) => Some(items),
            _ => None,
        }
    }

    /// The value of field `name` of an entity: a RESP3 map, or RESP2's flat
    /// `[field, value, ...]` array.
    pub fn field(&self, name: &str) -> Option<&Value> {
        let is = |k: &Value| k.bytes() == Some(name.as_bytes());
        match self {
            Value::Map(pairs) => pairs.iter().find(|(k, _)| is(k)).map(|(_, v)| v),
            Value::Array(Some(items)) => {
                items.chunks_exact(2).find(|kv| is(&kv[0])).map(|kv| &kv[1])
            }
            _ => None,
        }
    }

    /// Field `name`, when it is an integer.
    pub fn int_field(&self, name: &str) -> Option<i64> {
        self.field(name).and_then(Value::int)
    }

    /// Field `name`, when it is a string, as text.
    pub fn text_field(&self, name: &str) -> Option<String> {
        self.field(name).and_then(Value::text)
    }

    /// Field `name`, when it is an array, as its elements.
    pub fn items_field(&self, name: &str) -> Option<&[Value]> {
        self.field(name).and_then(Value::items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8]) -> Value {
        let (v, used) = Value::parse(bytes).unwrap();
        assert_eq!(
            used,
            bytes.len(),
            "{v:?} took {used} of {} bytes",
            bytes.len()
        );
        v
    }

    fn bulk(s: &str) -> Value {
        Value::Bulk(Some(s.as_bytes().to_vec()))
    }

    /// SEM.ACQUIRE's reply as RESP2 and as RESP3 (a nested map, a verbatim-free entity).
    const ACQUIRED_RESP2: &[u8] = b"*6\r\n$7\r\noutcome\r\n$24\r\nACQUIRE_OUTCOME_ACQUIRED\r\n\
        $9\r\nsemaphore\r\n*4\r\n$7\r\npermits\r\n:4\r\n$12\r\nactive_holds\r\n:1\r\n\
        $13\r\nfencing_token\r\n:7\r\n";
    const ACQUIRED_RESP3: &[u8] = b"%3\r\n$7\r\noutcome\r\n$24\r\nACQUIRE_OUTCOME_ACQUIRED\r\n\
        $9\r\nsemaphore\r\n%2\r\n$7\r\npermits\r\n:4\r\n$12\r\nactive_holds\r\n:1\r\n\
        $13\r\nfencing_token\r\n:7\r\n";

    #[test]
    fn reads_every_type_the_server_sends() {
        assert_eq!(parse(b"+OK\r\n"), Value::Simple("OK".into()));
        assert_eq!(
            parse(b"-NOTFOUND lease not found\r\n"),
            Value::Error("NOTFOUND lease not found".into())
        );
        assert_eq!(parse(b":-42\r\n"), Value::Int(-42));
        assert_eq!(parse(b"$0\r\n\r\n"), bulk(""));
        assert_eq!(parse(b"$4\r\na\r\nb\r\n"), bulk("a\r\nb"));
        assert_eq!(parse(b"$-1\r\n"), Value::Bulk(None));
        assert_eq!(parse(b"*-1\r\n"), Value::Array(None));
        assert_eq!(parse(b"*0\r\n"), Value::Array(Some(vec![])));
        assert_eq!(parse(b"_\r\n"), Value::Null);
        assert_eq!(parse(b"=6\r\ntxt:hi\r\n"), Value::Verbatim(b"hi".to_vec()));
        assert_eq!(
            parse(b"%1\r\n$1\r\na\r\n*2\r\n:1\r\n$-1\r\n"),
            Value::Map(vec![(
                bulk("a"),
                Value::Array(Some(vec![Value::Int(1), Value::Bulk(None)]))
            )])
        );
    }

    #[test]
    fn fields_read_the_same_under_resp2_and_resp3() {
        for bytes in [ACQUIRED_RESP2, ACQUIRED_RESP3] {
            let v = parse(bytes);
            assert_eq!(
                v.text_field("outcome").as_deref(),
                Some("ACQUIRE_OUTCOME_ACQUIRED")
            );
            assert_eq!(v.int_field("fencing_token"), Some(7));
            let sem = v.field("semaphore").expect("semaphore");
            assert_eq!(
                (sem.int_field("permits"), sem.int_field("active_holds")),
                (Some(4), Some(1))
            );
            assert_eq!(v.field("lease_id"), None);
            assert_eq!(v.int_field("outcome"), None, "not an integer");
        }
        let list = parse(b"*2\r\n$6\r\nleases\r\n*1\r\n:1\r\n");
        assert_eq!(list.items_field("leases"), Some(&[Value::Int(1)][..]));
        assert_eq!(Value::Int(1).field("x"), None);
    }

    #[test]
    fn every_cut_of_a_reply_is_incomplete() {
        for bytes in [ACQUIRED_RESP2, ACQUIRED_RESP3, b"=6\r\ntxt:hi\r\n"] {
            for cut in 0..bytes.len() {
                assert_eq!(
                    Value::parse(&bytes[..cut]),
                    Err(ReadError::Incomplete),
                    "cut at {cut}"
                );
                assert_eq!(reply_len(&bytes[..cut]), Err(ReadError::Incomplete));
            }
        }
    }

    #[test]
    fn reads_one_reply_of_several_and_skips_without_building() {
        let mut two = ACQUIRED_RESP2.to_vec();
        two.extend_from_slice(b"+PONG\r\n");
        assert_eq!(reply_len(&two), Ok(ACQUIRED_RESP2.len()));
        let (_, used) = Value::parse(&two).unwrap();
        assert_eq!(used, ACQUIRED_RESP2.len());

        let mut r = Reader::new(&two);
        assert_eq!(r.token(), Ok(Token::Array(Some(6))));
        assert_eq!(r.token(), Ok(Token::Bulk(Some(&b"outcome"[..]))));
        r.skip().unwrap();
        let sem_key = r.token().unwrap();
        r.skip_items(sem_key).unwrap();
        let sem = r.token().unwrap();
        assert_eq!(sem, Token::Array(Some(4)));
        r.skip_items(sem).unwrap();
        r.skip().unwrap();
        r.skip().unwrap();
        assert_eq!(r.position(), ACQUIRED_RESP2.len());
        assert_eq!(r.token(), Ok(Token::Simple(&b"PONG"[..])));
    }

    #[test]
    fn rejects_what_is_no_reply() {
        for bad in [
            &b"?x\r\n"[..],
            b":12a\r\n",
            b"$-2\r\n",
            b"$1\r\nab\r\n",
            b"+a\rb\r\n",
            b"%-1\r\n",
            b"=2\r\nab\r\n",
            b"_x\r\n",
        ] {
            assert!(
                matches!(Value::parse(bad), Err(ReadError::Malformed(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn a_huge_announced_array_is_incomplete_not_an_allocation() {
        assert_eq!(
            Value::parse(b"*4611686018427387904\r\n:1\r\n"),
            Err(ReadError::Incomplete)
        );
    }
}
