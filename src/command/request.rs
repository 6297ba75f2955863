//! What a validated command asks for, by who answers it: the engine (on a namespace's shard),
//! the transaction machinery, every shard at once (INFO), or the connection's own session.

use bytes::Bytes;

use crate::engine::request::EngineRequest;
use crate::engine::types::Nanos;

/// A validated request of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A SEM./NS./LEASE. command, run on its namespace's shard (NS.LIST: on every shard).
    Engine(EngineRequest),
    /// MULTI, EXEC or DISCARD.
    Txn(Txn),
    /// `INFO [section ...]`: every shard's figures, merged.
    Info(Vec<Bytes>),
    /// A connection- or server-level command, answered by the connection's session.
    Session(SessionRequest),
}

/// A transaction command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Txn {
    Multi,
    Exec,
    Discard,
}

/// A Redis surface command that the connection's session answers (PING, AUTH, CLIENT, ACL,
/// COMMAND, CONFIG GET, SHUTDOWN, DEBUG, ...).
#[derive(Debug, Clone, PartialEq)]
pub enum SessionRequest {
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
    /// `DEBUG CLOCK-STEP seconds`: moves the server's wall clock, as an NTP step would (to test
    /// what a step does to leases and time-outs).
    DebugClockStep(Nanos),
    /// `DEBUG HELP`.
    DebugHelp,
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
