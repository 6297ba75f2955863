//! Parsing of the Redis-surface commands (connection, server, ACL) whose words need more than
//! a copy: the error texts are Redis's, byte for byte, because clients match on them.

use bytes::Bytes;

use super::args;
use super::request::{KillFilter, SessionRequest as Request};
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

pub(super) fn client_list(a: &[Bytes]) -> Result<Request, Error> {
    if a.len() == 2 {
        Ok(Request::ClientList(None))
    } else if a[2].eq_ignore_ascii_case(b"id") && a.len() > 3 {
        let ids = a[3..]
            .iter()
            .map(|b| args::int(b).map(|v| v as u64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| Error::Err("Invalid client ID".into()))?;
        Ok(Request::ClientList(Some(ids)))
    } else if a[2].eq_ignore_ascii_case(b"type") && a.len() == 4 {
        Ok(Request::ClientList(None))
    } else {
        Err(Error::syntax())
    }
}

/// The words after `CLIENT KILL`: the old form `ip:port`, or filter pairs.
pub(super) fn client_kill(rest: &[Bytes]) -> Result<KillFilter, Error> {
    let mut f = KillFilter {
        skipme: true,
        ..KillFilter::default()
    };
    if rest.len() == 1 {
        f.addr = Some(rest[0].clone());
        f.old_form = true;
        f.skipme = false;
        return Ok(f);
    }
    if !rest.len().is_multiple_of(2) {
        return Err(Error::syntax());
    }
    for pair in rest.chunks(2) {
        let (k, v) = (&pair[0], &pair[1]);
        if k.eq_ignore_ascii_case(b"id") {
            f.id = Some(
                args::int(v)
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| Error::Err("client-id should be greater than 0".into()))?
                    as u64,
            );
        } else if k.eq_ignore_ascii_case(b"addr") {
            f.addr = Some(v.clone());
        } else if k.eq_ignore_ascii_case(b"laddr") {
            f.laddr = Some(v.clone());
        } else if k.eq_ignore_ascii_case(b"user") {
            f.user = Some(v.clone());
        } else if k.eq_ignore_ascii_case(b"skipme") {
            f.skipme = if v.eq_ignore_ascii_case(b"yes") {
                true
            } else if v.eq_ignore_ascii_case(b"no") {
                false
            } else {
                return Err(Error::syntax());
            };
        } else if k.eq_ignore_ascii_case(b"type") || k.eq_ignore_ascii_case(b"maxage") {
            // Accepted for compatibility; every permitd client is a normal client.
        } else {
            return Err(Error::syntax());
        }
    }
    Ok(f)
}

pub(super) fn client_unblock(a: &[Bytes]) -> Result<Request, Error> {
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
    Ok(Request::ClientUnblock { id, error })
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
