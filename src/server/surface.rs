//! The Redis surface commands: PING, AUTH, HELLO, CLIENT *, COMMAND *, CONFIG GET, ACL *,
//! CLUSTER * and ROLE (rendered by topology.rs), TIME, SHUTDOWN, DEBUG, ... They run on the
//! connection's [`Session`] and the shared state, on the connection's own thread, and never
//! wait: what needs the shards (NS.LIST, INFO) is dispatch.rs's.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::acl;
use super::clients::Client;
use super::global::Global;
use super::info;
use super::session::Session;
use super::topology::Viewer;
use crate::command::{
    docs, table, ClientListing, ClientType, KillFilter, ListFilter, SessionRequest as Request,
};
use crate::error::Error;
use crate::glob;
use crate::protocol::{Proto, Reply};

/// Runs a connection- or server-level command; `None` when nothing is to be answered.
pub fn run(s: &mut Session, g: &Global, req: Request) -> Option<Reply> {
    Some(match req {
        Request::Ping(None) => Reply::simple("PONG"),
        Request::Ping(Some(m)) | Request::Echo(m) => Reply::Bulk(m),
        Request::Quit => {
            s.close = true;
            Reply::OK
        }
        Request::Reset => {
            s.reset(&g.acl);
            Reply::simple("RESET")
        }
        Request::Select(0) => Reply::OK,
        Request::Select(_) => Reply::Error(Error::Err("DB index is out of range".into())),
        Request::Auth { user, pass } => match s.auth(&g.acl, user.as_ref(), &pass, false) {
            Ok(()) => Reply::OK,
            Err(e) => Reply::Error(e),
        },
        Request::Hello {
            proto,
            auth,
            setname,
        } => hello(s, g, proto, auth, setname),
        Request::ClientId => Reply::Int(s.client().id() as i64),
        Request::ClientSetName(n) => {
            s.client().set_name(n);
            Reply::OK
        }
        Request::ClientGetName => {
            let n = s.client().name();
            if n.is_empty() {
                Reply::Null
            } else {
                Reply::Bulk(n)
            }
        }
        Request::ClientSetInfo { lib_name, value } => {
            s.client().set_lib(lib_name, value);
            Reply::OK
        }
        Request::ClientInfo => Reply::Verbatim(format!("{}\n", s.client().info_line()).into()),
        Request::ClientList(listing) => client_list(g, &listing),
        Request::ClientKill { filter, error } => client_kill(s, g, &filter, error),
        Request::Accepted => Reply::OK,
        Request::ClientUnsupported(what) => Reply::Error(Error::Err(format!(
            "permitd does not support {what} (CLIENT TRACKING and related subcommands)"
        ))),
        Request::Command => docs::info_reply(&[]),
        Request::CommandCount => docs::count_reply(),
        Request::CommandInfo(names) => docs::info_reply(&names),
        Request::CommandDocs(names) => docs::docs_reply(&names),
        Request::CommandList(filter) => command_list(filter),
        Request::CommandGetKeys(argv) => docs::getkeys_reply(&argv).into(),
        Request::ConfigGet(patterns) => info::config_get(g, &patterns),
        Request::AclSetUser(name, rules) => g.acl.setuser(&name, &rules).map(|()| Reply::OK).into(),
        Request::AclDelUser(names) => match g.acl.deluser(&names) {
            Ok(n) => {
                // As Redis: the connections of a deleted user are closed.
                g.clients
                    .kill_where(|c| names.iter().any(|u| u.as_bytes() == c.user().as_ref()));
                Reply::Int(n as i64)
            }
            Err(e) => Reply::Error(e),
        },
        Request::AclList => lines(g.acl.list()),
        Request::AclUsers => lines(g.acl.names()),
        Request::AclWhoami => Reply::bulk(s.client().user()),
        Request::AclCat(None) => lines(acl::categories()),
        Request::AclCat(Some(cat)) => {
            if !acl::categories().contains(&cat) {
                Reply::Error(Error::Err(format!("Unknown category '{cat}'")))
            } else {
                lines(
                    acl::commands_in(&cat)
                        .into_iter()
                        .map(String::from)
                        .collect(),
                )
            }
        }
        Request::AclLoad => g.acl.load().map(|()| Reply::OK).into(),
        Request::AclSave => g.acl.save().map(|()| Reply::OK).into(),
        Request::Time => time(),
        Request::SlowlogGet(count) => g.slowlog.get(count),
        Request::SlowlogLen => Reply::Int(g.slowlog.len() as i64),
        Request::SlowlogReset => {
            g.slowlog.reset();
            Reply::OK
        }
        Request::LatencyLatest => g.latency.latest(),
        Request::LatencyHistory(event) => g.latency.history(&event),
        Request::LatencyReset(events) => Reply::Int(g.latency.reset(&events) as i64),
        Request::Role => g.topology().role(),
        // The viewer first: it reads the topology too, and a second read of a lock this thread
        // holds may wait behind a writer forever (std's RwLock).
        Request::ClusterSlots => {
            let v = viewer(s, g);
            g.topology().cluster_slots(v)
        }
        Request::ClusterShards => {
            let v = viewer(s, g);
            g.topology().cluster_shards(v)
        }
        Request::ClusterNodes => {
            let v = viewer(s, g);
            Reply::Verbatim(g.topology().cluster_nodes(v).into())
        }
        Request::ClusterInfo => Reply::Verbatim(g.topology().cluster_info().into()),
        Request::ClusterMyId => Reply::bulk(g.topology().my_id().as_str().to_owned()),
        Request::ClusterKeySlot(slot) => Reply::Int(i64::from(slot)),
        Request::Shutdown => {
            tracing::info!(client = s.client().id(), "User requested shutdown...");
            // In cluster mode the leader hands over before its connections drain (listener.rs).
            match g.cluster() {
                Some(_) => g.ask_stop(),
                None => g.begin_shutdown(),
            }
            s.close = true;
            return None;
        }
        Request::DebugPanic => debug_panic(),
        Request::DebugHelp => docs::help("debug", DEBUG_HELP.iter().map(|l| Cow::Borrowed(*l))),
        Request::Help(container) => docs::container_help(container),
        Request::DebugClockStep(by) => {
            tracing::warn!(
                client = s.client().id(),
                step_ms = by / 1_000_000,
                "DEBUG CLOCK-STEP"
            );
            g.step_clock(by);
            Reply::OK
        }
    })
}

/// DEBUG PANIC: an invariant failure on demand, to check that one ends the process (main.rs's
/// panic hook) and that a restart serves what was acknowledged before. The message is Redis's.
fn debug_panic() -> ! {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    panic!("DEBUG PANIC called at Unix time {now}");
}

/// DEBUG's subcommands, as DEBUG HELP lists them (DEBUG is no container of the table).
const DEBUG_HELP: &[&str] = &[
    "PANIC",
    "    Crash the server (the process exits; a restart replays its log).",
    "CLOCK-STEP <seconds>",
    "    Move the server's wall clock by <seconds> (negative: back), as an NTP step would.",
];

fn hello(
    s: &mut Session,
    g: &Global,
    proto: Option<i64>,
    auth: Option<(Bytes, Bytes)>,
    setname: Option<Bytes>,
) -> Reply {
    let p = match proto {
        None => s.proto(),
        Some(2) => Proto::Resp2,
        Some(3) => Proto::Resp3,
        Some(_) => return Reply::Error(Error::NoProto("unsupported protocol version".into())),
    };
    if let Some((user, pass)) = auth {
        if let Err(e) = s.auth(&g.acl, Some(&user), &pass, true) {
            return Reply::Error(e);
        }
    }
    if !s.is_authenticated() {
        return Reply::Error(Error::NoAuth("HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into()));
    }
    if let Some(n) = setname {
        if n.iter().any(|&b| b <= b' ' || b > b'~') {
            return Reply::Error(Error::Err(
                "Client names cannot contain spaces, newlines or special characters.".into(),
            ));
        }
        s.client().set_name(n);
    }
    s.set_proto(p);
    info::hello(s.client().id(), p, &g.topology())
}

/// Whether a client of this server is of type `kind` (any type when `None`). Every client is a
/// normal one: permitd has no pub/sub, and no replica or master talks to it over a client
/// connection.
fn of_type(kind: Option<ClientType>) -> bool {
    kind.is_none_or(|k| k == ClientType::Normal)
}

fn client_list(g: &Global, listing: &ClientListing) -> Reply {
    let clients: Vec<Arc<Client>> = match listing {
        ClientListing::Type(kind) if of_type(*kind) => g.clients.all(),
        ClientListing::Type(_) => Vec::new(),
        ClientListing::Ids(ids) => ids.iter().filter_map(|&id| g.clients.get(id)).collect(),
    };
    let mut text = String::new();
    for c in clients {
        text.push_str(&c.info_line());
        text.push('\n');
    }
    Reply::Verbatim(text.into())
}

/// CLIENT KILL. An unknown user, then the error of the pair that stopped the parse, refuse it,
/// in Redis 7.0's order (see [`KillFilter::users`]). The caller, when it matches and SKIPME
/// does not spare it, is not killed at once like the others but closed once its reply is
/// written, as Redis closes it after the reply.
fn client_kill(s: &mut Session, g: &Global, f: &KillFilter, error: Option<Error>) -> Reply {
    for u in &f.users {
        if g.acl.get(&String::from_utf8_lossy(u)).is_none() {
            return Reply::Error(Error::Err(format!(
                "No such user '{}'",
                String::from_utf8_lossy(u)
            )));
        }
    }
    if let Some(e) = error {
        return Reply::Error(e);
    }
    let matches = |c: &Client| {
        f.id.is_none_or(|id| id == c.id())
            && f.addr
                .as_ref()
                .is_none_or(|a| a.as_ref() == c.addr().to_string().as_bytes())
            && f.laddr
                .as_ref()
                .is_none_or(|a| a.as_ref() == c.laddr().to_string().as_bytes())
            && f.users.last().is_none_or(|u| *u == c.user())
            && of_type(f.kind)
    };
    let me = s.client().clone();
    let others = g.clients.kill_where(|c| c.id() != me.id() && matches(c));
    let itself = !f.skipme && matches(&me);
    if itself {
        s.close = true;
    }
    let killed = others + usize::from(itself);
    if f.old_form {
        if killed == 0 {
            return Reply::Error(Error::Err("No such client".into()));
        }
        return Reply::OK;
    }
    Reply::Int(killed as i64)
}

/// COMMAND LIST: every command and subcommand by its full name (`client|kill`), or those the
/// filter keeps.
fn command_list(filter: Option<ListFilter>) -> Reply {
    let names: Vec<&'static str> = match filter {
        None => table::all_specs().map(|c| c.name).collect(),
        // No module is ever loaded.
        Some(ListFilter::Module) => Vec::new(),
        Some(ListFilter::AclCat(cat)) => acl::commands_in(&cat),
        Some(ListFilter::Pattern(p)) => {
            // Redis matches without case; every name is lowercase.
            let p = p.to_ascii_lowercase();
            table::all_specs()
                .filter(|c| glob::matches(&p, c.name.as_bytes()))
                .map(|c| c.name)
                .collect()
        }
    };
    Reply::Array(names.into_iter().map(Reply::text).collect())
}

/// TIME: Unix seconds and the microseconds into the second, as bulk strings (as Redis).
fn time() -> Reply {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Reply::Array(vec![
        Reply::bulk(now.as_secs().to_string()),
        Reply::bulk(now.subsec_micros().to_string()),
    ])
}

/// The asking client, for the topology replies that name this node's address.
fn viewer(s: &Session, g: &Global) -> Viewer {
    g.topology().viewer(s.client().laddr())
}

/// An array of bulk strings.
fn lines(items: Vec<String>) -> Reply {
    Reply::Array(items.into_iter().map(Reply::bulk).collect())
}
