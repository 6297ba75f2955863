//! Commands: the table, and parsing + validation of raw words into typed requests (once, at
//! the edge).

pub mod args;
pub mod docs;
mod engine;
pub mod info;
pub mod request;
pub mod slot;
mod surface;
pub mod table;

use bytes::Bytes;

pub use request::{
    ClientListing, ClientType, KillFilter, ListFilter, Request, SessionRequest, Txn,
};
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

/// The command or subcommand the words name, whatever their count: what an arity error is
/// counted against (INFO commandstats' `rejected_calls`).
pub fn known(argv: &[Bytes]) -> Option<&'static CommandSpec> {
    let spec = table::lookup(&argv[0])?;
    if spec.subcommands.is_empty() {
        return Some(spec);
    }
    argv.get(1).and_then(|w| spec.subcommand(w))
}

/// Parses and validates a resolved command into a typed request. One arm per command: a command
/// added to the table without its parser does not compile.
pub fn parse(spec: &CommandSpec, argv: &[Bytes], limits: &Limits) -> Result<Request, Error> {
    use Cmd as C;
    let a = argv;
    use SessionRequest as S;
    let engine = |parse: fn(&[Bytes], &Limits) -> Result<EngineRequest, Error>| {
        parse(a, limits).map(Request::Engine)
    };
    let session = |r: SessionRequest| -> Result<Request, Error> { Ok(Request::Session(r)) };
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
        C::SemAcquireAll => engine(engine::sem_acquire_all),
        C::SemRelease => engine(engine::sem_release),
        C::SemHolders => engine(engine::sem_holders),
        C::SemWaiters => engine(engine::sem_waiters),
        C::LeaseCreate => engine(engine::lease_create),
        C::LeaseGet => engine(engine::lease_get),
        C::LeaseList => engine(engine::lease_list),
        C::LeaseRefresh => engine(engine::lease_refresh),
        C::LeaseRevoke => engine(engine::lease_revoke),
        C::Ping => surface::ping(a).map(Request::Session),
        C::Echo => session(S::Echo(a[1].clone())),
        C::Quit => session(S::Quit),
        C::Reset => session(S::Reset),
        C::Select => session(S::Select(args::int(&a[1])?)),
        C::Auth => surface::auth(a).map(Request::Session),
        C::Hello => surface::hello(a).map(Request::Session),
        C::ClientId => session(S::ClientId),
        C::ClientSetName => surface::client_setname(a).map(Request::Session),
        C::ClientGetName => session(S::ClientGetName),
        C::ClientSetInfo => surface::client_setinfo(a).map(Request::Session),
        C::ClientInfo => session(S::ClientInfo),
        C::ClientList => surface::client_list(a).map(Request::Session),
        C::ClientKill => Ok(Request::Session(surface::client_kill(&a[2..]))),
        C::ClientUnblock => surface::client_unblock(a),
        C::ClientNoEvict | C::ClientNoTouch => surface::client_switch(a).map(Request::Session),
        C::ClientMaintNotifications => surface::client_maint_notifications(a).map(Request::Session),
        C::ClientUnsupported => session(S::ClientUnsupported("client-side caching")),
        C::Command => session(S::Command),
        C::CommandCount => session(S::CommandCount),
        C::CommandInfo => session(S::CommandInfo(a[2..].to_vec())),
        C::CommandDocs => session(S::CommandDocs(a[2..].to_vec())),
        C::CommandList => surface::command_list(a).map(Request::Session),
        C::CommandGetKeys => session(S::CommandGetKeys(a[2..].to_vec())),
        C::Info => info::Sections::parse(&a[1..]).map(Request::Info),
        C::ConfigGet => session(S::ConfigGet(a[2..].to_vec())),
        C::AclSetUser => session(S::AclSetUser(
            surface::text(&a[2]),
            a[3..].iter().map(surface::text).collect(),
        )),
        C::AclDelUser => session(S::AclDelUser(a[2..].iter().map(surface::text).collect())),
        C::AclList => session(S::AclList),
        C::AclUsers => session(S::AclUsers),
        C::AclWhoami => session(S::AclWhoami),
        C::AclCat => surface::acl_cat(a).map(Request::Session),
        C::AclLoad => session(S::AclLoad),
        C::AclSave => session(S::AclSave),
        C::Shutdown => surface::shutdown(a).map(Request::Session),
        C::Debug => surface::debug(a).map(Request::Session),
        C::Time => session(S::Time),
        C::Monitor => Ok(Request::Monitor),
        C::ConfigResetStat => Ok(Request::ResetStat),
        C::SlowlogGet => surface::slowlog_get(a).map(Request::Session),
        C::SlowlogLen => session(S::SlowlogLen),
        C::SlowlogReset => session(S::SlowlogReset),
        C::LatencyLatest => session(S::LatencyLatest),
        C::LatencyHistory => session(S::LatencyHistory(a[2].clone())),
        C::LatencyReset => session(S::LatencyReset(a[2..].to_vec())),
        C::Role => session(S::Role),
        C::ClusterSlots => session(S::ClusterSlots),
        C::ClusterShards => session(S::ClusterShards),
        C::ClusterNodes => session(S::ClusterNodes),
        C::ClusterInfo => session(S::ClusterInfo),
        C::ClusterMyId => session(S::ClusterMyId),
        C::ClusterKeySlot => session(S::ClusterKeySlot(slot::key_slot(&a[2]))),
        C::ReadOnly | C::ReadWrite => session(S::Accepted),
        // Every HELP entry is named `container|help`.
        C::Help => session(S::Help(spec.name.split('|').next().unwrap_or(spec.name))),
        C::Multi => Ok(Request::Txn(Txn::Multi)),
        C::Exec => Ok(Request::Txn(Txn::Exec)),
        C::Discard => Ok(Request::Txn(Txn::Discard)),
        // `resolve` never returns a container without its subcommand (their arity needs one);
        // were it to, the client gets the arity error rather than the server a panic.
        C::Client | C::Config | C::Acl | C::Cluster | C::Slowlog | C::Latency => {
            Err(Error::wrong_arity(spec.name))
        }
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

/// One parsed request of each engine command, in the table's order, with its table entry:
/// the tests that hold a property of a request to the table (its write flag in persist's) use
/// it. It checks that no engine command of the table is missing.
#[cfg(test)]
pub(crate) fn one_of_each() -> Vec<(&'static CommandSpec, EngineRequest)> {
    let lease = "ls_0123456789abcdefghijklmnopqr";
    let lines = [
        "NS.CREATE a".to_string(),
        "NS.GET a".into(),
        "NS.LIST".into(),
        "NS.UPDATE a VERSION 1".into(),
        "NS.DELETE a".into(),
        "SEM.CREATE a s 1".into(),
        "SEM.GET a s".into(),
        "SEM.LIST a".into(),
        "SEM.UPDATE a s 1 VERSION 1".into(),
        "SEM.DELETE a s".into(),
        format!("SEM.ACQUIRE a s {lease} 1 0"),
        format!("SEM.ACQUIREALL a {lease} 0 s 1"),
        format!("SEM.RELEASE a s {lease}"),
        "SEM.HOLDERS a s".into(),
        "SEM.WAITERS a s".into(),
        "LEASE.CREATE a p 10".into(),
        format!("LEASE.GET a {lease}"),
        "LEASE.LIST a".into(),
        format!("LEASE.REFRESH a {lease} 10"),
        format!("LEASE.REVOKE a {lease}"),
    ];
    let limits = Limits::default();
    let parsed: Vec<_> = lines
        .iter()
        .map(|line| {
            let argv: Vec<Bytes> = line
                .split(' ')
                .map(|w| Bytes::copy_from_slice(w.as_bytes()))
                .collect();
            let spec = resolve(&argv).unwrap();
            let Ok(Request::Engine(r)) = parse(spec, &argv, &limits) else {
                panic!("{line} is not an engine request");
            };
            (spec, r)
        })
        .collect();
    let names: Vec<&str> = parsed.iter().map(|(spec, _)| spec.name).collect();
    let engine: Vec<&str> = table::all_specs()
        .filter(|s| s.group == "semaphore")
        .map(|s| s.name)
        .collect();
    assert_eq!(names, engine, "one of each engine command of the table");
    parsed
}
