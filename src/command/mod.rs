//! Commands: the table, and parsing + validation of raw words into typed requests (once, at
//! the edge).

pub mod args;
pub mod docs;
mod engine;
pub mod request;
mod surface;
pub mod table;

use bytes::Bytes;

pub use request::{KillFilter, Request};
pub use table::{Cmd, CommandSpec};

use crate::engine::request::EngineRequest;
use crate::engine::types::Limits;
use crate::error::Error;

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

/// Parses and validates a resolved command into a typed request. One arm per command: a command
/// added to the table without its parser does not compile.
pub fn parse(spec: &CommandSpec, argv: &[Bytes], limits: &Limits) -> Result<Request, Error> {
    use Cmd as C;
    let a = argv;
    let engine = |parse: fn(&[Bytes], &Limits) -> Result<EngineRequest, Error>| {
        parse(a, limits).map(Request::Engine)
    };
    match spec.cmd {
        C::NsCreate => engine(engine::ns_create),
        C::NsGet => engine(engine::ns_get),
        C::NsList => engine(engine::ns_list),
        C::NsUpdate => engine(engine::ns_update),
        C::NsDelete => engine(engine::ns_delete),
        C::SemCreate => engine(engine::sem_create),
        C::SemGet => engine(engine::sem_get),
        C::SemList => engine(engine::sem_list),
        C::SemUpdate => engine(engine::sem_update),
        C::SemDelete => engine(engine::sem_delete),
        C::SemAcquire => engine(engine::sem_acquire),
        C::SemRelease => engine(engine::sem_release),
        C::SemHolders => engine(engine::sem_holders),
        C::LeaseCreate => engine(engine::lease_create),
        C::LeaseGet => engine(engine::lease_get),
        C::LeaseList => engine(engine::lease_list),
        C::LeaseRefresh => engine(engine::lease_refresh),
        C::LeaseRevoke => engine(engine::lease_revoke),
        C::Ping => surface::ping(a),
        C::Echo => Ok(Request::Echo(a[1].clone())),
        C::Quit => Ok(Request::Quit),
        C::Reset => Ok(Request::Reset),
        C::Select => Ok(Request::Select(args::int(&a[1])?)),
        C::Auth => surface::auth(a),
        C::Hello => surface::hello(a),
        C::ClientId => Ok(Request::ClientId),
        C::ClientSetName => surface::client_setname(a),
        C::ClientGetName => Ok(Request::ClientGetName),
        C::ClientSetInfo => surface::client_setinfo(a),
        C::ClientInfo => Ok(Request::ClientInfo),
        C::ClientList => surface::client_list(a),
        C::ClientKill => surface::client_kill(&a[2..]).map(Request::ClientKill),
        C::ClientUnblock => surface::client_unblock(a),
        C::ClientUnsupported => Ok(Request::ClientUnsupported("client-side caching")),
        C::Command => Ok(Request::Command),
        C::CommandCount => Ok(Request::CommandCount),
        C::CommandInfo => Ok(Request::CommandInfo(a[2..].to_vec())),
        C::CommandDocs => Ok(Request::CommandDocs(a[2..].to_vec())),
        C::CommandList => Ok(Request::CommandList),
        C::CommandGetKeys => Ok(Request::CommandGetKeys(a[2..].to_vec())),
        C::Info => Ok(Request::Info(a[1..].to_vec())),
        C::ConfigGet => Ok(Request::ConfigGet(a[2..].to_vec())),
        C::AclSetUser => Ok(Request::AclSetUser(
            surface::text(&a[2]),
            a[3..].iter().map(surface::text).collect(),
        )),
        C::AclDelUser => Ok(Request::AclDelUser(
            a[2..].iter().map(surface::text).collect(),
        )),
        C::AclList => Ok(Request::AclList),
        C::AclUsers => Ok(Request::AclUsers),
        C::AclWhoami => Ok(Request::AclWhoami),
        C::AclCat => surface::acl_cat(a),
        C::AclLoad => Ok(Request::AclLoad),
        C::AclSave => Ok(Request::AclSave),
        C::Shutdown => surface::shutdown(a),
        C::Debug => surface::debug(a),
        C::Multi => Ok(Request::Multi),
        C::Exec => Ok(Request::Exec),
        C::Discard => Ok(Request::Discard),
        // `resolve` never returns a container without its subcommand (their arity needs one);
        // were it to, the client gets the arity error rather than the server a panic.
        C::Client | C::Config | C::Acl => Err(Error::wrong_arity(spec.name)),
    }
}

/// Resolves and parses in one step.
pub fn parse_argv(
    argv: &[Bytes],
    limits: &Limits,
) -> Result<(&'static CommandSpec, Request), Error> {
    let spec = resolve(argv)?;
    Ok((spec, parse(spec, argv, limits)?))
}
