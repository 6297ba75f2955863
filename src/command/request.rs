//! What a validated command asks for, by who answers it: the engine (on a namespace's shard),
//! the transaction machinery, every shard at once (INFO), the shard of a parked acquire (CLIENT
//! UNBLOCK), or the connection's own session.

use bytes::Bytes;

use super::info::Sections;
use crate::engine::request::EngineRequest;
use crate::engine::types::Nanos;
use crate::error::Error;

/// A validated request of any kind.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// A SEM./NS./LEASE. command, run on its namespace's shard (NS.LIST: on every shard).
    Engine(EngineRequest),
    /// MULTI, EXEC or DISCARD.
    Txn(Txn),
    /// `INFO [section ...]`: every shard's figures, merged.
    Info(Sections),
    /// `CLIENT UNBLOCK id [TIMEOUT|ERROR]`: on the shard where the client's acquire is parked.
    ClientUnblock {
        /// Client id.
        id: u64,
        /// ERROR (true) or TIMEOUT.
        error: bool,
    },
    /// `MONITOR`: the connection shows every command from then on.
    Monitor,
    /// `CONFIG RESETSTAT`: every thread's per-command statistics start again from zero.
    ResetStat,
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
        /// The library's name or version, shown in CLIENT LIST's `lib-name`/`lib-ver`.
        value: Bytes,
    },
    /// `CLIENT INFO`.
    ClientInfo,
    /// `CLIENT LIST [TYPE type | ID id ...]`.
    ClientList(ClientListing),
    /// `CLIENT KILL ...`, parsed as far as its first bad word.
    ClientKill {
        /// The filters of the pairs before the first bad one (all of them when none is bad).
        filter: KillFilter,
        /// The first bad pair's error. Redis 7.0 checks that a USER exists as it parses its
        /// pair, so the server answers this only once each of `filter.users` exists.
        error: Option<Error>,
    },
    /// A command accepted for compatibility that changes nothing here, answered `+OK`:
    /// `READONLY`, `READWRITE` (every node serves reads and writes alike, SPEC §10),
    /// `CLIENT NO-EVICT|NO-TOUCH on|off` (no client is evicted, no key has an LRU clock) and
    /// `CLIENT MAINT_NOTIFICATIONS` (nothing ever moves).
    Accepted,
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
    /// `COMMAND LIST [FILTERBY ...]`.
    CommandList(Option<ListFilter>),
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
    /// `TIME`.
    Time,
    /// `SLOWLOG GET [count]` (`None`: the default 10; -1: all).
    SlowlogGet(Option<i64>),
    /// `SLOWLOG LEN`.
    SlowlogLen,
    /// `SLOWLOG RESET`.
    SlowlogReset,
    /// `LATENCY LATEST`.
    LatencyLatest,
    /// `LATENCY HISTORY event`.
    LatencyHistory(Bytes),
    /// `LATENCY RESET [event ...]`.
    LatencyReset(Vec<Bytes>),
    /// `ROLE`.
    Role,
    /// `CLUSTER SLOTS`.
    ClusterSlots,
    /// `CLUSTER SHARDS`.
    ClusterShards,
    /// `CLUSTER NODES`.
    ClusterNodes,
    /// `CLUSTER INFO`.
    ClusterInfo,
    /// `CLUSTER MYID`.
    ClusterMyId,
    /// `CLUSTER KEYSLOT key`: the key's slot, computed as it is parsed.
    ClusterKeySlot(u16),
    /// `SHUTDOWN [NOSAVE|SAVE]`.
    Shutdown,
    /// `DEBUG PANIC`: crashes the server (with `--enable-debug-command`).
    DebugPanic,
    /// `DEBUG CLOCK-STEP seconds`: moves the server's wall clock, as an NTP step would (to test
    /// what a step does to leases and time-outs).
    DebugClockStep(Nanos),
    /// `DEBUG HELP`.
    DebugHelp,
    /// `<container> HELP` (`CLIENT HELP`, `CLUSTER HELP`, ...), by the container's name.
    Help(&'static str),
}

/// A client type, as `CLIENT LIST TYPE` and `CLIENT KILL TYPE` name it (`slave` and `replica`
/// are one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ClientType {
    Normal,
    Master,
    Replica,
    Pubsub,
}

/// Which clients `CLIENT LIST` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientListing {
    /// Every client, or those of one type.
    Type(Option<ClientType>),
    /// The clients with these ids, in this order (an id given twice is listed twice, as Redis).
    Ids(Vec<u64>),
}

/// Which commands `COMMAND LIST FILTERBY` keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListFilter {
    /// `MODULE name`: the commands of a loaded module (permitd loads none).
    Module,
    /// `ACLCAT category`, without its `@`, lowercase.
    AclCat(String),
    /// `PATTERN glob`, matched against each full name (`container|sub`), any case.
    Pattern(Bytes),
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
    /// Every `USER name`, in order: each must name a user, and a client matches the last.
    pub users: Vec<Bytes>,
    /// `TYPE type`.
    pub kind: Option<ClientType>,
    /// `SKIPME yes|no` (default yes).
    pub skipme: bool,
    /// The old form answers `+OK` / an error instead of a count.
    pub old_form: bool,
}
