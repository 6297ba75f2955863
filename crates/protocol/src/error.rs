//! The reply errors of SPEC §5: one variant per error code a client can see.

use std::fmt;

/// A command error sent to the client as `-CODE message`.
///
/// Each variant is one code word of the spec (`ERR`, `NOTFOUND`, ...) or of the Redis surface
/// clients rely on (`NOPROTO`, `CROSSSLOT`, `EXECABORT`, `UNBLOCKED`); the payload is the human
/// sentence after the code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// `ERR`: syntax, arity, unknown command or option, a number that does not parse.
    Err(String),
    /// `NOTFOUND`: namespace, semaphore or lease missing; lease expired.
    NotFound(String),
    /// `ALREADYEXISTS`: NS.CREATE / SEM.CREATE of an existing name.
    AlreadyExists(String),
    /// `INVALIDARG`: a value out of range.
    InvalidArg(String),
    /// `RESOURCEEXHAUSTED`: a quota is reached.
    ResourceExhausted(String),
    /// `NOAUTH`: a password is configured and the client has not authenticated.
    NoAuth(String),
    /// `WRONGPASS`: AUTH with a wrong user or password.
    WrongPass(String),
    /// `NOPROTO`: HELLO with an unsupported protocol version.
    NoProto(String),
    /// `CROSSSLOT`: a transaction touching more than one namespace.
    CrossSlot(String),
    /// `EXECABORT`: EXEC after a command was rejected while queueing.
    ExecAbort(String),
    /// `UNBLOCKED`: a parked acquire ended by `CLIENT UNBLOCK id ERROR`.
    Unblocked(String),
    /// `NOPERM`: the user may not run this command or touch this namespace.
    NoPerm(String),
    /// `OOM`: `--maxmemory` is reached and the command would add state.
    Oom(String),
    /// `MISCONF`: a change cannot be made durable now (the data directory is full); nothing
    /// changed.
    Misconf(String),
    /// `MOVED`: cluster mode, this node does not lead; `<slot> <leader host:port>` (Redis
    /// Cluster's form, which cluster clients follow). Nothing ran.
    Moved(String),
    /// `CLUSTERDOWN`: cluster mode, no leader is known. Nothing ran.
    ClusterDown(String),
    /// `TRYAGAIN`: cluster mode, the leader cannot run it yet. Nothing ran.
    TryAgain(String),
    /// `LEADERCHANGED`: cluster mode, leadership moved before the change was known to be
    /// committed: it may or may not have taken effect.
    LeaderChanged(String),
}

impl Error {
    /// The code word that starts the error line.
    pub fn code(&self) -> &'static str {
        match self {
            Error::Err(_) => "ERR",
            Error::NotFound(_) => "NOTFOUND",
            Error::AlreadyExists(_) => "ALREADYEXISTS",
            Error::InvalidArg(_) => "INVALIDARG",
            Error::ResourceExhausted(_) => "RESOURCEEXHAUSTED",
            Error::NoAuth(_) => "NOAUTH",
            Error::WrongPass(_) => "WRONGPASS",
            Error::NoProto(_) => "NOPROTO",
            Error::CrossSlot(_) => "CROSSSLOT",
            Error::ExecAbort(_) => "EXECABORT",
            Error::Unblocked(_) => "UNBLOCKED",
            Error::NoPerm(_) => "NOPERM",
            Error::Oom(_) => "OOM",
            Error::Misconf(_) => "MISCONF",
            Error::Moved(_) => "MOVED",
            Error::ClusterDown(_) => "CLUSTERDOWN",
            Error::TryAgain(_) => "TRYAGAIN",
            Error::LeaderChanged(_) => "LEADERCHANGED",
        }
    }

    /// The human sentence after the code.
    pub fn message(&self) -> &str {
        match self {
            Error::Err(m)
            | Error::NotFound(m)
            | Error::AlreadyExists(m)
            | Error::InvalidArg(m)
            | Error::ResourceExhausted(m)
            | Error::NoAuth(m)
            | Error::WrongPass(m)
            | Error::NoProto(m)
            | Error::CrossSlot(m)
            | Error::ExecAbort(m)
            | Error::Unblocked(m)
            | Error::NoPerm(m)
            | Error::Oom(m)
            | Error::Misconf(m)
            | Error::Moved(m)
            | Error::ClusterDown(m)
            | Error::TryAgain(m)
            | Error::LeaderChanged(m) => m,
        }
    }

    /// `ERR wrong number of arguments for 'name' command`, Redis's wording.
    pub fn wrong_arity(name: &str) -> Error {
        Error::Err(format!(
            "wrong number of arguments for '{}' command",
            name.to_ascii_lowercase()
        ))
    }

    /// `ERR value is not an integer or out of range`, Redis's wording.
    pub fn not_integer() -> Error {
        Error::Err("value is not an integer or out of range".into())
    }

    /// `ERR syntax error`, Redis's wording.
    pub fn syntax() -> Error {
        Error::Err("syntax error".into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.code(), self.message())
    }
}

impl std::error::Error for Error {}

/// Result of a command: a reply value or a reply error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
