//! Parsing of the Redis-surface commands (connection, server, ACL) whose words need more than
//! a copy: the error texts are Redis's, byte for byte, because clients match on them.

use bytes::Bytes;

use super::args;
use super::request::{
    ClientListing, ClientType, KillFilter, ListFilter, SessionRequest as Request,
};
use crate::engine::types::{Nanos, NANOS_PER_SEC};
use crate::error::Error;

/// Words as text, for ACL rules and user names (Redis treats them as C strings too).
pub(super) fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

pub(super) fn ping(a: &[Bytes]) -> Result<Request, Error> {
    match a.len() {
        1 => Ok(Request::Ping(None)),
        2 => Ok(Request::Ping(Some(a[1].clone()))),
        _ => Err(Error::wrong_arity("ping")),
    }
}

pub(super) fn auth(a: &[Bytes]) -> Result<Request, Error> {
    match a.len() {
        2 => Ok(Request::Auth {
            user: None,
            pass: a[1].clone(),
        }),
        3 => Ok(Request::Auth {
            user: Some(a[1].clone()),
            pass: a[2].clone(),
        }),
        _ => Err(Error::syntax()),
    }
}

pub(super) fn hello(a: &[Bytes]) -> Result<Request, Error> {
    let mut proto = None;
    let mut auth = None;
    let mut setname = None;
    let mut i = 1;
    if a.len() > 1 {
        let v = args::int(&a[1])
            .map_err(|_| Error::Err("Protocol version is not an integer or out of range".into()))?;
        proto = Some(v);
        i = 2;
    }
    while i < a.len() {
        let more = a.len() - i - 1;
        if a[i].eq_ignore_ascii_case(b"auth") && more >= 2 {
            auth = Some((a[i + 1].clone(), a[i + 2].clone()));
            i += 3;
        } else if a[i].eq_ignore_ascii_case(b"setname") && more >= 1 {
            setname = Some(a[i + 1].clone());
            i += 2;
        } else {
            return Err(Error::Err(format!(
                "Syntax error in HELLO option '{}'",
                String::from_utf8_lossy(&a[i])
            )));
        }
    }
    Ok(Request::Hello {
        proto,
        auth,
        setname,
    })
}

pub(super) fn client_setname(a: &[Bytes]) -> Result<Request, Error> {
    if a[2].iter().any(|&b| b <= b' ' || b > b'~') {
        return Err(Error::Err(
            "Client names cannot contain spaces, newlines or special characters.".into(),
        ));
    }
    Ok(Request::ClientSetName(a[2].clone()))
}

pub(super) fn client_setinfo(a: &[Bytes]) -> Result<Request, Error> {
    let lib_name = if a[2].eq_ignore_ascii_case(b"lib-name") {
        true
    } else if a[2].eq_ignore_ascii_case(b"lib-ver") {
        false
    } else {
        return Err(Error::Err(format!(
            "Unrecognized option '{}'",
            String::from_utf8_lossy(&a[2])
        )));
    };
    if a[3].iter().any(|b| !(b'!'..=b'~').contains(b)) {
        return Err(Error::Err(format!(
            "{} cannot contain spaces, newlines or special characters.",
            if lib_name { "lib-name" } else { "lib-ver" }
        )));
    }
    Ok(Request::ClientSetInfo {
        lib_name,
        value: a[3].clone(),
    })
}

/// A client type by its Redis name, any case.
fn client_type(w: &Bytes) -> Result<ClientType, Error> {
    Ok(match w.to_ascii_lowercase().as_slice() {
        b"normal" => ClientType::Normal,
        b"master" => ClientType::Master,
        b"slave" | b"replica" => ClientType::Replica,
        b"pubsub" => ClientType::Pubsub,
        _ => {
            return Err(Error::Err(format!(
                "Unknown client type '{}'",
                String::from_utf8_lossy(w)
            )))
        }
    })
}

/// `CLIENT LIST [TYPE type | ID id ...]`: one filter or none, as Redis.
pub(super) fn client_list(a: &[Bytes]) -> Result<Request, Error> {
    if a.len() == 4 && a[2].eq_ignore_ascii_case(b"type") {
        let kind = client_type(&a[3])?;
        return Ok(Request::ClientList(ClientListing::Type(Some(kind))));
    }
    if a.len() > 3 && a[2].eq_ignore_ascii_case(b"id") {
        let ids = a[3..]
            .iter()
            .map(|b| args::int(b).map(|v| v as u64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| Error::Err("Invalid client ID".into()))?;
        return Ok(Request::ClientList(ClientListing::Ids(ids)));
    }
    if a.len() != 2 {
        return Err(Error::syntax());
    }
    Ok(Request::ClientList(ClientListing::Type(None)))
}

/// The words after `CLIENT KILL`: the old form `ip:port`, or filter pairs, checked in order as
/// Redis 7.0 does, up to the first bad pair, whose error is the answer. An option without its
/// value, or one Redis 7.0 does not know (`MAXAGE` came in 7.4), is a syntax error. Redis also
/// refuses an unknown `USER` as it reaches its pair, before the pairs after it; whether a user
/// exists is the server's to say, so the filter comes back with the pairs before the bad one,
/// and their users are checked before the pair's error is answered.
pub(super) fn client_kill(rest: &[Bytes]) -> Request {
    let mut filter = KillFilter {
        skipme: true,
        ..KillFilter::default()
    };
    let error = if let [addr] = rest {
        filter.addr = Some(addr.clone());
        filter.old_form = true;
        filter.skipme = false;
        None
    } else {
        kill_pairs(rest, &mut filter).err()
    };
    Request::ClientKill { filter, error }
}

/// Adds CLIENT KILL's filter pairs to `f` in order, up to the first bad one, whose error it
/// returns.
fn kill_pairs(rest: &[Bytes], f: &mut KillFilter) -> Result<(), Error> {
    for pair in rest.chunks(2) {
        let [k, v] = pair else {
            return Err(Error::syntax());
        };
        if k.eq_ignore_ascii_case(b"id") {
            f.id = Some(
                args::int(v)
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| Error::Err("client-id should be greater than 0".into()))?
                    as u64,
            );
        } else if k.eq_ignore_ascii_case(b"type") {
            f.kind = Some(client_type(v)?);
        } else if k.eq_ignore_ascii_case(b"addr") {
            f.addr = Some(v.clone());
        } else if k.eq_ignore_ascii_case(b"laddr") {
            f.laddr = Some(v.clone());
        } else if k.eq_ignore_ascii_case(b"user") {
            f.users.push(v.clone());
        } else if k.eq_ignore_ascii_case(b"skipme") {
            f.skipme = two_way(v, b"yes", b"no")?;
        } else {
            return Err(Error::syntax());
        }
    }
    Ok(())
}

/// Whether `w` is the word `yes` (true) or `no` (false), any case; anything else is a syntax
/// error, as Redis answers it.
fn two_way(w: &Bytes, yes: &[u8], no: &[u8]) -> Result<bool, Error> {
    if w.eq_ignore_ascii_case(yes) {
        Ok(true)
    } else if w.eq_ignore_ascii_case(no) {
        Ok(false)
    } else {
        Err(Error::syntax())
    }
}

/// `CLIENT NO-EVICT on|off`, `CLIENT NO-TOUCH on|off`.
pub(super) fn client_switch(a: &[Bytes]) -> Result<Request, Error> {
    two_way(&a[2], b"on", b"off").map(|_| Request::Accepted)
}

/// `CLIENT MAINT_NOTIFICATIONS on|off [option value ...]` (what redis-py, go-redis, Jedis and
/// Lettuce send, e.g. `moving-endpoint-type internal-ip`): any option is accepted, since no
/// endpoint ever moves.
pub(super) fn client_maint_notifications(a: &[Bytes]) -> Result<Request, Error> {
    two_way(&a[2], b"on", b"off")?;
    if !a[3..].len().is_multiple_of(2) {
        return Err(Error::syntax());
    }
    Ok(Request::Accepted)
}

/// `COMMAND LIST [FILTERBY MODULE name | ACLCAT category | PATTERN pattern]`. Redis takes a
/// FILTERBY only as the last three words, so there is at most one.
pub(super) fn command_list(a: &[Bytes]) -> Result<Request, Error> {
    if a.len() == 2 {
        return Ok(Request::CommandList(None));
    }
    if a.len() != 5 || !a[2].eq_ignore_ascii_case(b"filterby") {
        return Err(Error::syntax());
    }
    let (kind, value) = (&a[3], &a[4]);
    let filter = if kind.eq_ignore_ascii_case(b"module") {
        ListFilter::Module
    } else if kind.eq_ignore_ascii_case(b"aclcat") {
        ListFilter::AclCat(text(value).to_ascii_lowercase())
    } else if kind.eq_ignore_ascii_case(b"pattern") {
        ListFilter::Pattern(value.clone())
    } else {
        return Err(Error::syntax());
    };
    Ok(Request::CommandList(Some(filter)))
}

pub(super) fn client_unblock(a: &[Bytes]) -> Result<super::request::Request, Error> {
    let id = args::int(&a[2])? as u64;
    let error = match a.get(3) {
        None => false,
        Some(w) if w.eq_ignore_ascii_case(b"timeout") => false,
        Some(w) if w.eq_ignore_ascii_case(b"error") => true,
        Some(_) => {
            return Err(Error::Err(
                "CLIENT UNBLOCK reason should be TIMEOUT or ERROR".into(),
            ))
        }
    };
    if a.len() > 4 {
        return Err(Error::syntax());
    }
    Ok(super::request::Request::ClientUnblock { id, error })
}

/// `SLOWLOG GET [count]`: the count checked as Redis checks it.
pub(super) fn slowlog_get(a: &[Bytes]) -> Result<Request, Error> {
    let Some(word) = a.get(2) else {
        return Ok(Request::SlowlogGet(None));
    };
    if a.len() > 3 {
        return Err(Error::Err(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try SLOWLOG HELP.",
            String::from_utf8_lossy(&a[1])
        )));
    }
    match args::int(word) {
        Ok(n) if n >= -1 => Ok(Request::SlowlogGet(Some(n))),
        _ => Err(Error::Err(
            "count should be greater than or equal to -1".into(),
        )),
    }
}

pub(super) fn acl_cat(a: &[Bytes]) -> Result<Request, Error> {
    match a.len() {
        2 => Ok(Request::AclCat(None)),
        3 => Ok(Request::AclCat(Some(text(&a[2]).to_ascii_lowercase()))),
        _ => Err(Error::wrong_arity("acl|cat")),
    }
}

pub(super) fn shutdown(a: &[Bytes]) -> Result<Request, Error> {
    for w in &a[1..] {
        let known = [&b"nosave"[..], b"save", b"now", b"force", b"abort"];
        if !known.iter().any(|k| w.eq_ignore_ascii_case(k)) {
            return Err(Error::syntax());
        }
    }
    Ok(Request::Shutdown)
}

pub(super) fn debug(a: &[Bytes]) -> Result<Request, Error> {
    match (a.len(), &a[1]) {
        (2, w) if w.eq_ignore_ascii_case(b"panic") => Ok(Request::DebugPanic),
        (2, w) if w.eq_ignore_ascii_case(b"help") => Ok(Request::DebugHelp),
        (3, w) if w.eq_ignore_ascii_case(b"clock-step") => {
            let secs = std::str::from_utf8(&a[2])
                .ok()
                .and_then(|t| t.parse::<f64>().ok())
                .filter(|s| s.is_finite() && s.abs() <= 100.0 * 365.0 * 86400.0)
                .ok_or_else(|| Error::Err("value is not a valid float".into()))?;
            Ok(Request::DebugClockStep(
                (secs * NANOS_PER_SEC as f64) as Nanos,
            ))
        }
        _ => Err(Error::Err(format!(
            "unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
            String::from_utf8_lossy(&a[1][..a[1].len().min(128)])
        ))),
    }
}
