//! Redis's request grammar: multibulk arrays of bulk strings, and inline commands.
//!
//! Requests are narrower than general RESP (only arrays of bulk strings, or a text line), and
//! Redis answers malformed ones with exact `Protocol error: ...` wordings that clients and tools
//! see, so this parser follows Redis's `processMultibulkBuffer` / `processInlineBuffer` rules:
//! lengths are checked on the header, before any payload is buffered, and arguments are split off
//! the read buffer without copying. (The `redis-protocol` crate decodes general RESP frames; we use
//! it where the peer is a server: in the load generator and the tests.)

use bytes::{Buf, Bytes, BytesMut};

/// How long an inline request or a length line may get before it is refused (Redis's
/// `PROTO_INLINE_MAX_SIZE`).
pub const INLINE_MAX: usize = 64 * 1024;

/// Bulk length allowed before authentication, as Redis.
const UNAUTH_MAX_BULK: usize = 16 * 1024;

/// Array length allowed before authentication, as Redis.
const UNAUTH_MAX_MULTIBULK: usize = 10;

/// A malformed request: answered with `-ERR Protocol error: <message>`, then the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

/// Limits on one request (server options).
#[derive(Debug, Clone, Copy)]
pub struct RequestLimits {
    /// Longest bulk argument (`--proto-max-bulk-len`).
    pub max_bulk_len: usize,
    /// Most arguments in one request.
    pub max_multibulk_len: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_bulk_len: 4 * 1024 * 1024,
            max_multibulk_len: 1024 * 1024,
        }
    }
}

/// An incremental request parser; one per connection.
#[derive(Debug, Default)]
pub struct RequestParser {
    /// A multibulk request whose header was read but not all its arguments.
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    remaining: usize,
    args: Vec<Bytes>,
    bulk_len: Option<usize>,
    bytes: usize,
}

impl RequestParser {
    /// Bytes held in arguments of a request not yet complete (they count toward the query buffer).
    pub fn pending_bytes(&self) -> usize {
        self.partial.as_ref().map_or(0, |p| p.bytes)
    }

    /// Whether no request is partly parsed.
    pub fn is_idle(&self) -> bool {
        self.partial.is_none()
    }

    /// Takes one complete request off the front of `buf`; `Ok(None)` when more bytes are needed.
    /// Empty requests (a blank line, `*0`) are skipped.
    pub fn next(
        &mut self,
        buf: &mut BytesMut,
        limits: &RequestLimits,
        authenticated: bool,
    ) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            if self.partial.is_none() {
                match buf.first() {
                    None => return Ok(None),
                    Some(b'*') => {}
                    Some(_) => match inline(buf)? {
                        None => return Ok(None),
                        Some(args) if args.is_empty() => continue,
                        Some(args) => return Ok(Some(args)),
                    },
                }
                let Some(n) = length_line(buf, "mbulk")? else {
                    return Ok(None);
                };
                let n = parse_len(&n).filter(|&n| n <= limits.max_multibulk_len as i64);
                let Some(n) = n else {
                    return Err(perr("invalid multibulk length"));
                };
                if n > UNAUTH_MAX_MULTIBULK as i64 && !authenticated {
                    return Err(perr("unauthenticated multibulk length"));
                }
                if n <= 0 {
                    continue;
                }
                self.partial = Some(Partial {
                    remaining: n as usize,
                    // Grown as arguments really arrive: a header alone must not allocate much.
                    args: Vec::with_capacity((n as usize).min(1024)),
                    bulk_len: None,
                    bytes: 0,
                });
            }
            let p = self.partial.as_mut().expect("set above");
            while p.remaining > 0 {
                let len = match p.bulk_len {
                    Some(len) => len,
                    None => {
                        let Some(&first) = buf.first() else {
                            return Ok(None);
                        };
                        if first != b'$' {
                            return Err(perr(&format!("expected '$', got '{}'", first as char)));
                        }
                        let Some(line) = length_line(buf, "bulk")? else {
                            return Ok(None);
                        };
                        let len = parse_len(&line)
                            .filter(|&l| l >= 0 && l as usize <= limits.max_bulk_len)
                            .ok_or_else(|| perr("invalid bulk length"))?
                            as usize;
                        if len > UNAUTH_MAX_BULK && !authenticated {
                            return Err(perr("unauthenticated bulk length"));
                        }
                        p.bulk_len = Some(len);
                        len
                    }
                };
                if buf.len() < len + 2 {
                    // Room for the whole argument, so it arrives without reallocations.
                    buf.reserve(len + 2 - buf.len());
                    return Ok(None);
                }
                let arg = buf.split_to(len).freeze();
                buf.advance(2);
                p.bytes += len;
                p.args.push(arg);
                p.bulk_len = None;
                p.remaining -= 1;
            }
            let done = self.partial.take().expect("set above");
            return Ok(Some(done.args));
        }
    }
}

fn perr(msg: &str) -> ProtocolError {
    ProtocolError(msg.to_string())
}

/// Takes a `*N\r\n` / `$N\r\n` line off `buf` and returns the text after its type byte.
fn length_line(buf: &mut BytesMut, what: &str) -> Result<Option<Bytes>, ProtocolError> {
    match memchr(b'\r', buf) {
        None if buf.len() > INLINE_MAX => Err(perr(&format!("too big {what} count string"))),
        None => Ok(None),
        Some(cr) if cr + 2 > buf.len() => Ok(None),
        Some(cr) => {
            let line = buf.split_to(cr + 2).freeze();
            Ok(Some(line.slice(1..cr)))
        }
    }
}

/// Appends one command as clients send it: a multibulk array of bulk strings. The server never
/// encodes requests; its load generator, soak driver, tests and fuzzer do, all with this.
pub fn encode_request(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses a decimal as Redis's `string2ll` does: no sign but `-`, no leading zeros, no spaces.
pub fn parse_len(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || (digits[0] == b'0' && (digits.len() > 1 || neg)) {
        return None;
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_sub((d - b'0') as i64)?;
    }
    if neg {
        Some(v)
    } else {
        v.checked_neg()
    }
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

/// Takes an inline request (a text line) off `buf`.
fn inline(buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(nl) = memchr(b'\n', buf) else {
        if buf.len() > INLINE_MAX {
            return Err(perr("too big inline request"));
        }
        return Ok(None);
    };
    let line = buf.split_to(nl + 1);
    let mut line = &line[..nl];
    if let [rest @ .., b'\r'] = line {
        line = rest;
    }
    split_args(line)
        .map(Some)
        .ok_or_else(|| perr("unbalanced quotes in request"))
}

/// Splits an inline line into arguments as Redis's `sdssplitargs`: spaces separate, and double
/// quotes (with `\n`, `\xHH`, ... escapes) or single quotes group. `None` on unbalanced quotes.
pub fn split_args(line: &[u8]) -> Option<Vec<Bytes>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i == line.len() {
            return Some(args);
        }
        let mut cur = Vec::new();
        let mut in_dq = false;
        let mut in_sq = false;
        loop {
            let c = line.get(i).copied();
            if in_dq {
                match c {
                    None => return None,
                    Some(b'\\') if i + 3 < line.len() && line[i + 1] == b'x' => {
                        match (hex(line[i + 2]), hex(line[i + 3])) {
                            (Some(h), Some(l)) => {
                                cur.push(h * 16 + l);
                                i += 3;
                            }
                            _ => cur.push(b'\\'),
                        }
                    }
                    Some(b'\\') if i + 1 < line.len() => {
                        i += 1;
                        cur.push(match line[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 8,
                            b'a' => 7,
                            other => other,
                        });
                    }
                    Some(b'"') => {
                        // A closing quote must be followed by a space or the end.
                        if line.get(i + 1).is_some_and(|b| !b.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    Some(b) => cur.push(b),
                }
            } else if in_sq {
                match c {
                    None => return None,
                    Some(b'\\') if line.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        cur.push(b'\'');
                    }
                    Some(b'\'') => {
                        if line.get(i + 1).is_some_and(|b| !b.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    Some(b) => cur.push(b),
                }
            } else {
                match c {
                    None => break,
                    Some(b) if b.is_ascii_whitespace() => break,
                    Some(b'"') => in_dq = true,
                    Some(b'\'') => in_sq = true,
                    Some(b) => cur.push(b),
                }
            }
            i += 1;
        }
        args.push(Bytes::from(cur));
    }
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8], auth: bool) -> (Vec<Vec<Bytes>>, Option<ProtocolError>) {
        let mut p = RequestParser::default();
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match p.next(&mut buf, &RequestLimits::default(), auth) {
                Ok(Some(a)) => out.push(a),
                Ok(None) => return (out, None),
                Err(e) => return (out, Some(e)),
            }
        }
    }

    #[test]
    fn multibulk_and_inline_mixed() {
        let (cmds, err) = parse_all(
            b"*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nPING\r\n\r\nset 'a b' \"c\\x41\\n\"\r\n",
            true,
        );
        assert!(err.is_none());
        assert_eq!(cmds.len(), 3);
        assert_eq!(cmds[0], vec![Bytes::from("ECHO"), Bytes::from("hi")]);
        assert_eq!(cmds[1], vec![Bytes::from("PING")]);
        assert_eq!(
            cmds[2],
            vec![Bytes::from("set"), Bytes::from("a b"), Bytes::from("cA\n")]
        );
    }

    #[test]
    fn incremental_byte_by_byte() {
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n";
        let mut p = RequestParser::default();
        let mut buf = BytesMut::new();
        let mut got = None;
        for &b in input.iter() {
            buf.extend_from_slice(&[b]);
            if let Some(a) = p.next(&mut buf, &RequestLimits::default(), true).unwrap() {
                got = Some(a);
            }
        }
        assert_eq!(got.unwrap()[2], Bytes::from("hello"));
        assert!(buf.is_empty());
    }

    #[test]
    fn redis_protocol_errors() {
        let cases: &[(&[u8], &str)] = &[
            (b"*1\r\n+PING\r\n", "expected '$', got '+'"),
            (b"*1\r\n$-5\r\n", "invalid bulk length"),
            (b"*1\r\n$1000000000000\r\n", "invalid bulk length"),
            (b"*1000000000\r\n", "invalid multibulk length"),
            (b"*abc\r\n", "invalid multibulk length"),
            (b"*1\r\n$01\r\n", "invalid bulk length"),
            (b"ECHO \"abc\r\n", "unbalanced quotes in request"),
        ];
        for (input, want) in cases {
            let (_, err) = parse_all(input, true);
            assert_eq!(err, Some(ProtocolError(want.to_string())), "{:?}", input);
        }
    }

    #[test]
    fn unauthenticated_limits_are_tight() {
        let (_, err) = parse_all(b"*11\r\n", false);
        assert_eq!(err.unwrap().0, "unauthenticated multibulk length");
        let (_, err) = parse_all(b"*1\r\n$16385\r\n", false);
        assert_eq!(err.unwrap().0, "unauthenticated bulk length");
        let (_, err) = parse_all(b"*11\r\n", true);
        assert!(err.is_none());
    }

    #[test]
    fn huge_inline_without_newline_is_refused() {
        let big = vec![b'a'; INLINE_MAX + 1];
        let (_, err) = parse_all(&big, true);
        assert_eq!(err.unwrap().0, "too big inline request");
    }

    #[test]
    fn empty_multibulk_is_skipped() {
        let (cmds, err) = parse_all(b"*0\r\n*-1\r\n*1\r\n$4\r\nPING\r\n", true);
        assert!(err.is_none());
        assert_eq!(cmds.len(), 1);
    }

    #[test]
    fn len_parsing_is_strict() {
        assert_eq!(parse_len(b"0"), Some(0));
        assert_eq!(parse_len(b"-1"), Some(-1));
        assert_eq!(parse_len(b"00"), None);
        assert_eq!(parse_len(b"+1"), None);
        assert_eq!(parse_len(b"-0"), None);
        assert_eq!(parse_len(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_len(b"9223372036854775808"), None);
    }
}
