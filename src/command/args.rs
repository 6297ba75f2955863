//! Argument parsers shared by the commands: numbers with Redis's wording, names, options.

use bytes::Bytes;

use crate::engine::page::{Cursor, CursorKind, Page};
use crate::engine::types::{LeaseId, Limits, Metadata, Name, Nanos, NANOS_PER_SEC};
use crate::error::Error;
use crate::protocol::request::parse_len;

/// A copy of a value the state keeps: arguments are slices of the connection's read buffer,
/// and a kept slice would pin the whole buffer for the entity's lifetime.
fn detach(b: &Bytes) -> Bytes {
    Bytes::copy_from_slice(b)
}

/// An integer, or `ERR value is not an integer or out of range`.
pub fn int(b: &[u8]) -> Result<i64, Error> {
    parse_len(b).ok_or_else(Error::not_integer)
}

/// An acquire timeout in seconds (integer or decimal), as nanoseconds.
pub fn timeout(b: &[u8], limits: &Limits) -> Result<Nanos, Error> {
    let bad = || Error::Err("timeout is not a float or out of range".into());
    let text = std::str::from_utf8(b).map_err(|_| bad())?;
    // Plain decimals only: no "inf", "nan", hex or spaces.
    if text.is_empty()
        || !text
            .bytes()
            .all(|c| c.is_ascii_digit() || matches!(c, b'.' | b'-' | b'+' | b'e' | b'E'))
    {
        return Err(bad());
    }
    let secs: f64 = text.parse().map_err(|_| bad())?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(bad());
    }
    if secs > limits.max_acquire_timeout {
        return Err(Error::InvalidArg(format!(
            "timeout must be between 0 and {} seconds",
            limits.max_acquire_timeout
        )));
    }
    // A positive timeout never rounds to 0, which would mean "do not wait" (Redis rounds the
    // timeouts of blocking commands up, too): 1e-10 s waits 1 ns and times out.
    let nanos = (secs * NANOS_PER_SEC as f64).round() as Nanos;
    Ok(if secs > 0.0 { nanos.max(1) } else { nanos })
}

/// A lease ttl (already parsed as whole seconds) checked against the limits, as nanoseconds.
pub fn ttl(secs: i64, limits: &Limits) -> Result<Nanos, Error> {
    if secs < limits.min_lease_ttl || secs > limits.max_lease_ttl {
        return Err(Error::InvalidArg(format!(
            "ttl must be between {} and {} seconds",
            limits.min_lease_ttl, limits.max_lease_ttl
        )));
    }
    Ok(secs * NANOS_PER_SEC)
}

/// A positive count (`weight`, `permits`), already parsed.
pub fn positive(v: i64, what: &str) -> Result<i64, Error> {
    if v <= 0 {
        return Err(Error::InvalidArg(format!("{what} must be greater than 0")));
    }
    Ok(v)
}

/// A namespace or semaphore name.
pub fn name(b: &Bytes, what: &str, limits: &Limits) -> Result<Name, Error> {
    if Name::is_valid(b, limits.max_name_len) {
        return Ok(Name::new_unchecked(b.clone()));
    }
    Err(Error::InvalidArg(format!(
        "invalid {what} name: must be 1 to {} bytes of [-_0-9a-zA-Z]",
        limits.max_name_len
    )))
}

/// A process id: 1 to `max_process_id_len` bytes, binary-safe. Still a slice of the request: the
/// engine keeps its own copy of it (a `ProcessId`), so detaching here would copy it twice.
pub fn process_id(b: &Bytes, limits: &Limits) -> Result<Bytes, Error> {
    if b.is_empty() || b.len() > limits.max_process_id_len {
        return Err(Error::InvalidArg(format!(
            "process_id must be 1 to {} bytes",
            limits.max_process_id_len
        )));
    }
    Ok(b.clone())
}

/// The option words a command accepts after its fixed arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opt {
    /// `DESC text`.
    Desc,
    /// `META k v ...` (last).
    Meta,
    /// `VERSION n`.
    Version,
    /// `CURSOR c`.
    Cursor,
    /// `LIMIT n`.
    Limit,
    /// `PROCESS p`.
    Process,
}

impl Opt {
    fn word(self) -> &'static str {
        match self {
            Opt::Desc => "DESC",
            Opt::Meta => "META",
            Opt::Version => "VERSION",
            Opt::Cursor => "CURSOR",
            Opt::Limit => "LIMIT",
            Opt::Process => "PROCESS",
        }
    }
}

/// Options as given (raw), before range checks.
#[derive(Debug, Default)]
pub struct Options {
    desc: Option<Bytes>,
    meta: Vec<(Bytes, Bytes)>,
    version: Option<i64>,
    cursor: Option<Bytes>,
    limit: Option<i64>,
    /// `PROCESS` filter.
    pub process: Option<Bytes>,
}

impl Options {
    /// Parses option words (any case, any order; `META` last) from `rest`.
    pub fn parse(rest: &[Bytes], allowed: &[Opt]) -> Result<Options, Error> {
        let mut o = Options::default();
        let mut i = 0;
        while i < rest.len() {
            let word = &rest[i];
            let opt = allowed
                .iter()
                .copied()
                .find(|o| o.word().as_bytes().eq_ignore_ascii_case(word))
                .ok_or_else(Error::syntax)?;
            // Every option takes the word after it, but META the rest of the words, in pairs.
            let value = || rest.get(i + 1).cloned().ok_or_else(Error::syntax);
            match opt {
                Opt::Meta => {
                    let pairs = &rest[i + 1..];
                    if !pairs.len().is_multiple_of(2) {
                        return Err(Error::syntax());
                    }
                    o.meta = pairs
                        .chunks(2)
                        .map(|p| (p[0].clone(), p[1].clone()))
                        .collect();
                    return Ok(o);
                }
                Opt::Desc => o.desc = Some(value()?),
                Opt::Version => o.version = Some(int(&value()?)?),
                Opt::Cursor => o.cursor = Some(value()?),
                Opt::Limit => o.limit = Some(int(&value()?)?),
                Opt::Process => o.process = Some(value()?),
            }
            i += 2;
        }
        Ok(o)
    }

    /// The `VERSION` an update must carry (`ERR syntax error` without it).
    pub fn version(&self) -> Result<i64, Error> {
        self.version.ok_or_else(Error::syntax)
    }

    /// The description, checked against the limit (empty when left out).
    pub fn desc(&self, limits: &Limits) -> Result<Bytes, Error> {
        let d = self.desc.as_ref().map(detach).unwrap_or_default();
        if d.len() > limits.max_description_len {
            return Err(Error::InvalidArg(format!(
                "description longer than {} bytes",
                limits.max_description_len
            )));
        }
        Ok(d)
    }

    /// The metadata, checked against the limits (empty when left out).
    pub fn meta(&self, limits: &Limits) -> Result<Metadata, Error> {
        for (k, v) in &self.meta {
            if k.is_empty() || k.len() > limits.max_metadata_key_len {
                return Err(Error::InvalidArg(format!(
                    "metadata key must be 1 to {} bytes",
                    limits.max_metadata_key_len
                )));
            }
            if v.len() > limits.max_metadata_value_len {
                return Err(Error::InvalidArg(format!(
                    "metadata value longer than {} bytes",
                    limits.max_metadata_value_len
                )));
            }
        }
        let m = Metadata::from_pairs(
            self.meta
                .iter()
                .map(|(k, v)| (detach(k), detach(v)))
                .collect(),
        );
        if m.pairs().len() > limits.max_metadata_entries {
            return Err(Error::InvalidArg(format!(
                "metadata has more than {} entries",
                limits.max_metadata_entries
            )));
        }
        Ok(m)
    }

    /// The page asked for: cursor of listing `kind` (`""` is the first page) and LIMIT 1..250.
    pub fn page(&self, kind: CursorKind) -> Result<Page, Error> {
        let limit = self.limit.unwrap_or(100);
        if !(1..=250).contains(&limit) {
            return Err(Error::InvalidArg("LIMIT must be between 1 and 250".into()));
        }
        let cursor = match &self.cursor {
            Some(c) if !c.is_empty() => Some(Cursor::decode(c, kind)?),
            _ => None,
        };
        Ok(Page {
            cursor,
            limit: limit as usize,
        })
    }
}

/// A new lease id from the operating system's CSPRNG: 166 random bits, an unguessable
/// capability.
pub fn lease_id() -> LeaseId {
    LeaseId::from_random(|buf| getrandom::getrandom(buf).expect("the OS CSPRNG is available"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_from_the_os_differ() {
        let (a, b) = (lease_id(), lease_id());
        assert_ne!(a, b);
        assert_eq!(LeaseId::parse(&a.to_bytes()), Some(a));
    }
}
