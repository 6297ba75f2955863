//! Commands: the table, and parsing + validation of raw words into typed requests (once, at
//! the edge).

pub mod args;
pub mod docs;
pub mod request;
pub mod table;

use bytes::Bytes;

pub use request::EngineRequest;
pub use table::{Cmd, CommandSpec};

use crate::engine::page::CursorKind;
use crate::engine::types::{LeaseId, Limits};
use crate::error::Error;
use args::{Opt, Options};

/// A validated request of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A SEM./NS./LEASE. command, run on its namespace's shard.
    Engine(EngineRequest),
    /// `PING [message]`.
    Ping(Option<Bytes>),
    /// `ECHO message`.
    Echo(Bytes),
    /// `QUIT`.
    Quit,
    /// `RESET`.
    Reset,
    /// `SELECT index`.
    Select(i64),
    /// `AUTH [user] pass`.
    Auth {
        /// User, `default` when left out.
        user: Option<Bytes>,
        /// Password.
        pass: Bytes,
    },
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`.
    Hello {
        /// Protocol version asked for.
        proto: Option<i64>,
        /// Credentials.
        auth: Option<(Bytes, Bytes)>,
        /// Connection name.
        setname: Option<Bytes>,
    },
    /// `CLIENT ID`.
    ClientId,
    /// `CLIENT SETNAME name`.
    ClientSetName(Bytes),
    /// `CLIENT GETNAME`.
    ClientGetName,
    /// `CLIENT SETINFO LIB-NAME|LIB-VER value`.
    ClientSetInfo {
        /// True for LIB-NAME, false for LIB-VER.
        lib_name: bool,
        /// Value.
        value: Bytes,
    },
    /// `CLIENT INFO`.
    ClientInfo,
    /// `CLIENT LIST [ID id ...]`.
    ClientList(Option<Vec<u64>>),
    /// `CLIENT KILL ...`.
    ClientKill(KillFilter),
    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`.
    ClientUnblock {
        /// Client id.
        id: u64,
        /// ERROR (true) or TIMEOUT.
        error: bool,
    },
    /// A client-caching subcommand permitd does not support.
    ClientUnsupported(&'static str),
    /// `COMMAND`.
    Command,
    /// `COMMAND COUNT`.
    CommandCount,
    /// `COMMAND INFO [name ...]`.
    CommandInfo(Vec<Bytes>),
    /// `COMMAND DOCS [name ...]`.
    CommandDocs(Vec<Bytes>),
    /// `COMMAND LIST`.
    CommandList,
    /// `COMMAND GETKEYS command arg ...`.
    CommandGetKeys(Vec<Bytes>),
    /// `INFO [section ...]`.
    Info(Vec<Bytes>),
    /// `CONFIG GET pattern ...`.
    ConfigGet(Vec<Bytes>),
    /// `ACL SETUSER name rule ...`.
    AclSetUser(String, Vec<String>),
    /// `ACL DELUSER name ...`.
    AclDelUser(Vec<String>),
    /// `ACL LIST`.
    AclList,
    /// `ACL USERS`.
    AclUsers,
    /// `ACL WHOAMI`.
    AclWhoami,
    /// `ACL CAT [category]`.
    AclCat(Option<String>),
    /// `ACL LOAD`.
    AclLoad,
    /// `ACL SAVE`.
    AclSave,
    /// `SHUTDOWN [NOSAVE|SAVE]`.
    Shutdown,
    /// `DEBUG PANIC`: crashes the server (with `--enable-debug-command`).
    DebugPanic,
    /// `DEBUG HELP`.
    DebugHelp,
    /// `MULTI`.
    Multi,
    /// `EXEC`.
    Exec,
    /// `DISCARD`.
    Discard,
}

/// Which clients `CLIENT KILL` ends.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KillFilter {
    /// `ID id`.
    pub id: Option<u64>,
    /// `ADDR ip:port` (or the old form `CLIENT KILL ip:port`).
    pub addr: Option<Bytes>,
    /// `LADDR ip:port`.
    pub laddr: Option<Bytes>,
    /// `USER name`.
    pub user: Option<Bytes>,
    /// `SKIPME yes|no` (default yes).
    pub skipme: bool,
    /// The old form answers `+OK` / an error instead of a count.
    pub old_form: bool,
}

/// Finds the command (or subcommand) named by `argv` and checks its arity. This is all that is
/// checked when a command is queued inside MULTI.
pub fn resolve(argv: &[Bytes]) -> Result<&'static CommandSpec, Error> {
    let name = &argv[0];
    let Some(spec) = table::lookup(name) else {
        let mut msg = format!(
            "unknown command '{}', with args beginning with: ",
            String::from_utf8_lossy(&name[..name.len().min(128)])
        );
        for a in argv.iter().skip(1).take(16) {
            msg.push_str(&format!(
                "'{}' ",
                String::from_utf8_lossy(&a[..a.len().min(128)])
            ));
        }
        return Err(Error::Err(msg));
    };
    if spec.subcommands.is_empty() || argv.len() < 2 {
        if !spec.arity_ok(argv.len()) {
            return Err(Error::wrong_arity(spec.name));
        }
        return Ok(spec);
    }
    let Some(sub) = spec.subcommand(&argv[1]) else {
        return Err(Error::Err(format!(
            "unknown subcommand '{}'. Try {} HELP.",
            String::from_utf8_lossy(&argv[1][..argv[1].len().min(128)]),
            spec.name.to_uppercase()
        )));
    };
    if !sub.arity_ok(argv.len()) {
        return Err(Error::wrong_arity(sub.name));
    }
    Ok(sub)
}

/// Parses and validates a resolved command into a typed request.
pub fn parse(spec: &CommandSpec, argv: &[Bytes], limits: &Limits) -> Result<Request, Error> {
    use EngineRequest as E;
    let a = argv;
    let lease = |b: &Bytes| LeaseId::parse(b);
    let name = |b: &Bytes, what: &str| args::name(b, what, limits);
    let ns = || name(&a[1], "namespace");
    let sem = || name(&a[2], "semaphore");
    let r = match spec.cmd {
        Cmd::NsCreate => {
            let o = Options::parse(&a[2..], &[Opt::Desc, Opt::Meta])?;
            E::NsCreate {
                ns: ns()?,
                desc: o.desc(limits)?,
                meta: o.meta(limits)?,
            }
        }
        Cmd::NsGet => E::NsGet { ns: ns()? },
        Cmd::NsList => {
            let o = Options::parse(&a[1..], &[Opt::Cursor, Opt::Limit])?;
            E::NsList {
                page: o.page(CursorKind::Namespaces)?,
            }
        }
        Cmd::NsUpdate => {
            let o = Options::parse(&a[2..], &[Opt::Version, Opt::Desc, Opt::Meta])?;
            E::NsUpdate {
                version: o.version()?,
                ns: ns()?,
                desc: o.desc(limits)?,
                meta: o.meta(limits)?,
            }
        }
        Cmd::NsDelete => E::NsDelete { ns: ns()? },
        Cmd::SemCreate => {
            let o = Options::parse(&a[4..], &[Opt::Desc, Opt::Meta])?;
            let permits = args::int(&a[3])?;
            let (ns, sem) = (ns()?, sem()?);
            E::SemCreate {
                permits: args::positive(permits, "permits")?,
                ns,
                sem,
                desc: o.desc(limits)?,
                meta: o.meta(limits)?,
            }
        }
        Cmd::SemGet => E::SemGet {
            ns: ns()?,
            sem: sem()?,
        },
        Cmd::SemList => {
            let o = Options::parse(&a[2..], &[Opt::Cursor, Opt::Limit])?;
            E::SemList {
                ns: ns()?,
                page: o.page(CursorKind::Semaphores)?,
            }
        }
        Cmd::SemUpdate => {
            let o = Options::parse(&a[4..], &[Opt::Version, Opt::Desc, Opt::Meta])?;
            let permits = args::int(&a[3])?;
            let version = o.version()?;
            let (ns, sem) = (ns()?, sem()?);
            E::SemUpdate {
                permits: args::positive(permits, "permits")?,
                version,
                ns,
                sem,
                desc: o.desc(limits)?,
                meta: o.meta(limits)?,
            }
        }
        Cmd::SemDelete => E::SemDelete {
            ns: ns()?,
            sem: sem()?,
        },
        Cmd::SemAcquire => {
            let o = Options::parse(&a[6..], &[Opt::Meta])?;
            let weight = args::int(&a[4])?;
            let timeout = args::timeout(&a[5], limits)?;
            let (ns, sem) = (ns()?, sem()?);
            E::SemAcquire {
                weight: args::positive(weight, "weight")?,
                timeout,
                ns,
                sem,
                lease: lease(&a[3]),
                meta: o.meta(limits)?,
            }
        }
        Cmd::SemRelease => E::SemRelease {
            ns: ns()?,
            sem: sem()?,
            lease: lease(&a[3]),
        },
        Cmd::SemHolders => {
            let o = Options::parse(&a[3..], &[Opt::Cursor, Opt::Limit])?;
            E::SemHolders {
                ns: ns()?,
                sem: sem()?,
                page: o.page(CursorKind::Holders)?,
            }
        }
        Cmd::LeaseCreate => {
            let o = Options::parse(&a[4..], &[Opt::Meta])?;
            let ttl = args::int(&a[3])?;
            let ns = ns()?;
            E::LeaseCreate {
                ttl: args::ttl(ttl, limits)?,
                ns,
                id: LeaseId::generate(),
                process_id: args::process_id(&a[2], limits)?,
                meta: o.meta(limits)?,
            }
        }
        Cmd::LeaseGet => E::LeaseGet {
            ns: ns()?,
            lease: lease(&a[2]),
        },
        Cmd::LeaseList => {
            let o = Options::parse(&a[2..], &[Opt::Process, Opt::Cursor, Opt::Limit])?;
            E::LeaseList {
                ns: ns()?,
                page: o.page(CursorKind::Leases)?,
                process: o.process.clone(),
            }
        }
        Cmd::LeaseRefresh => {
            let ttl = args::int(&a[3])?;
            let ns = ns()?;
            E::LeaseRefresh {
                ttl: args::ttl(ttl, limits)?,
                ns,
                lease: lease(&a[2]),
            }
        }
        Cmd::LeaseRevoke => E::LeaseRevoke {
            ns: ns()?,
            lease: lease(&a[2]),
        },
        other => return parse_surface(other, a),
    };
    Ok(Request::Engine(r))
}

/// Parses the Redis-surface commands (connection, server, transactions).
fn parse_surface(cmd: Cmd, a: &[Bytes]) -> Result<Request, Error> {
    let rest = || a[2..].to_vec();
    Ok(match cmd {
        Cmd::Ping => match a.len() {
            1 => Request::Ping(None),
            2 => Request::Ping(Some(a[1].clone())),
            _ => return Err(Error::wrong_arity("ping")),
        },
        Cmd::Echo => Request::Echo(a[1].clone()),
        Cmd::Quit => Request::Quit,
        Cmd::Reset => Request::Reset,
        Cmd::Select => Request::Select(args::int(&a[1])?),
        Cmd::Auth => match a.len() {
            2 => Request::Auth {
                user: None,
                pass: a[1].clone(),
            },
            3 => Request::Auth {
                user: Some(a[1].clone()),
                pass: a[2].clone(),
            },
            _ => return Err(Error::syntax()),
        },
        Cmd::Hello => parse_hello(a)?,
        Cmd::ClientId => Request::ClientId,
        Cmd::ClientSetName => {
            if a[2].iter().any(|&b| b <= b' ' || b > b'~') {
                return Err(Error::Err(
                    "Client names cannot contain spaces, newlines or special characters.".into(),
                ));
            }
            Request::ClientSetName(a[2].clone())
        }
        Cmd::ClientGetName => Request::ClientGetName,
        Cmd::ClientSetInfo => {
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
            Request::ClientSetInfo {
                lib_name,
                value: a[3].clone(),
            }
        }
        Cmd::ClientInfo => Request::ClientInfo,
        Cmd::ClientList => {
            if a.len() == 2 {
                Request::ClientList(None)
            } else if a[2].eq_ignore_ascii_case(b"id") && a.len() > 3 {
                let ids = a[3..]
                    .iter()
                    .map(|b| args::int(b).map(|v| v as u64))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| Error::Err("Invalid client ID".into()))?;
                Request::ClientList(Some(ids))
            } else if a[2].eq_ignore_ascii_case(b"type") && a.len() == 4 {
                Request::ClientList(None)
            } else {
                return Err(Error::syntax());
            }
        }
        Cmd::ClientKill => Request::ClientKill(parse_kill(&rest())?),
        Cmd::ClientUnblock => {
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
            Request::ClientUnblock { id, error }
        }
        Cmd::ClientUnsupported => Request::ClientUnsupported("client-side caching"),
        Cmd::Command => Request::Command,
        Cmd::CommandCount => Request::CommandCount,
        Cmd::CommandInfo => Request::CommandInfo(rest()),
        Cmd::CommandDocs => Request::CommandDocs(rest()),
        Cmd::CommandList => Request::CommandList,
        Cmd::CommandGetKeys => Request::CommandGetKeys(rest()),
        Cmd::Info => Request::Info(a[1..].to_vec()),
        Cmd::ConfigGet => Request::ConfigGet(rest()),
        Cmd::AclSetUser => Request::AclSetUser(text(&a[2]), a[3..].iter().map(text).collect()),
        Cmd::AclDelUser => Request::AclDelUser(a[2..].iter().map(text).collect()),
        Cmd::AclList => Request::AclList,
        Cmd::AclUsers => Request::AclUsers,
        Cmd::AclWhoami => Request::AclWhoami,
        Cmd::AclCat => match a.len() {
            2 => Request::AclCat(None),
            3 => Request::AclCat(Some(text(&a[2]).to_ascii_lowercase())),
            _ => return Err(Error::wrong_arity("acl|cat")),
        },
        Cmd::AclLoad => Request::AclLoad,
        Cmd::AclSave => Request::AclSave,
        Cmd::Shutdown => {
            for w in &a[1..] {
                let known = [&b"nosave"[..], b"save", b"now", b"force", b"abort"];
                if !known.iter().any(|k| w.eq_ignore_ascii_case(k)) {
                    return Err(Error::syntax());
                }
            }
            Request::Shutdown
        }
        Cmd::Debug => match (a.len(), &a[1]) {
            (2, w) if w.eq_ignore_ascii_case(b"panic") => Request::DebugPanic,
            (2, w) if w.eq_ignore_ascii_case(b"help") => Request::DebugHelp,
            _ => {
                return Err(Error::Err(format!(
                    "unknown subcommand or wrong number of arguments for '{}'. Try DEBUG HELP.",
                    String::from_utf8_lossy(&a[1][..a[1].len().min(128)])
                )))
            }
        },
        Cmd::Multi => Request::Multi,
        Cmd::Exec => Request::Exec,
        Cmd::Discard => Request::Discard,
        Cmd::Client | Cmd::Config | Cmd::Acl => {
            unreachable!("containers resolve to a subcommand")
        }
        _ => unreachable!("engine commands are parsed by `parse`"),
    })
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn parse_hello(a: &[Bytes]) -> Result<Request, Error> {
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

fn parse_kill(rest: &[Bytes]) -> Result<KillFilter, Error> {
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

/// Resolves and parses in one step.
pub fn parse_argv(
    argv: &[Bytes],
    limits: &Limits,
) -> Result<(&'static CommandSpec, Request), Error> {
    let spec = resolve(argv)?;
    Ok((spec, parse(spec, argv, limits)?))
}
