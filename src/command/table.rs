//! The command table: the single source of truth for every command's name, arity, flags, key
//! positions, summary and arguments. Dispatch, `COMMAND`, `COMMAND INFO`, `COMMAND DOCS` and
//! `docs/commands.md` are all derived from it.

/// Which handler runs a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum Cmd {
    NsCreate,
    NsGet,
    NsList,
    NsUpdate,
    NsDelete,
    SemCreate,
    SemGet,
    SemList,
    SemUpdate,
    SemDelete,
    SemAcquire,
    SemRelease,
    SemHolders,
    LeaseCreate,
    LeaseGet,
    LeaseList,
    LeaseRefresh,
    LeaseRevoke,
    Ping,
    Echo,
    Quit,
    Reset,
    Select,
    Auth,
    Hello,
    Client,
    ClientId,
    ClientSetName,
    ClientGetName,
    ClientSetInfo,
    ClientInfo,
    ClientList,
    ClientKill,
    ClientUnblock,
    ClientUnsupported,
    Command,
    CommandCount,
    CommandInfo,
    CommandDocs,
    CommandList,
    CommandGetKeys,
    Info,
    Acl,
    AclSetUser,
    AclDelUser,
    AclList,
    AclUsers,
    AclWhoami,
    AclCat,
    AclLoad,
    AclSave,
    Config,
    ConfigGet,
    Shutdown,
    Debug,
    Multi,
    Exec,
    Discard,
}

/// An argument's type, as `COMMAND DOCS` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    /// A key (the namespace).
    Key,
    /// Free text.
    String,
    /// An integer.
    Integer,
    /// A decimal number.
    Double,
    /// A fixed word.
    PureToken,
    /// A group of arguments.
    Block,
    /// One of several.
    OneOf,
}

impl ArgType {
    /// The `COMMAND DOCS` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ArgType::Key => "key",
            ArgType::String => "string",
            ArgType::Integer => "integer",
            ArgType::Double => "double",
            ArgType::PureToken => "pure-token",
            ArgType::Block => "block",
            ArgType::OneOf => "oneof",
        }
    }
}

/// One argument of a command, for `COMMAND DOCS` and the docs.
#[derive(Debug)]
pub struct Arg {
    /// Name (lowercase, as Redis).
    pub name: &'static str,
    /// Type.
    pub kind: ArgType,
    /// The option word that introduces it (`DESC`, `META`, ...).
    pub token: Option<&'static str>,
    /// May be left out.
    pub optional: bool,
    /// May repeat.
    pub multiple: bool,
    /// Members of a block or one-of.
    pub args: &'static [Arg],
}

const fn arg(name: &'static str, kind: ArgType) -> Arg {
    Arg {
        name,
        kind,
        token: None,
        optional: false,
        multiple: false,
        args: &[],
    }
}

const fn opt(name: &'static str, kind: ArgType, token: &'static str) -> Arg {
    Arg {
        name,
        kind,
        token: Some(token),
        optional: true,
        multiple: false,
        args: &[],
    }
}

const fn token(name: &'static str, tok: &'static str) -> Arg {
    Arg {
        name,
        kind: ArgType::PureToken,
        token: Some(tok),
        optional: false,
        multiple: false,
        args: &[],
    }
}

const NS: Arg = arg("namespace", ArgType::Key);
const SEM: Arg = arg("semaphore", ArgType::String);
const LEASE: Arg = arg("lease", ArgType::String);
const DESC: Arg = opt("description", ArgType::String, "DESC");
const CURSOR: Arg = opt("cursor", ArgType::String, "CURSOR");
const LIMIT: Arg = opt("limit", ArgType::Integer, "LIMIT");
const VERSION: Arg = Arg {
    name: "version",
    kind: ArgType::Integer,
    token: Some("VERSION"),
    optional: false,
    multiple: false,
    args: &[],
};
const META: Arg = Arg {
    name: "metadata",
    kind: ArgType::Block,
    token: Some("META"),
    optional: true,
    multiple: false,
    args: &[Arg {
        name: "entry",
        kind: ArgType::Block,
        token: None,
        optional: false,
        multiple: true,
        args: &[arg("key", ArgType::String), arg("value", ArgType::String)],
    }],
};

/// One command (or subcommand) of the table.
#[derive(Debug)]
pub struct CommandSpec {
    /// Lowercase name; subcommands are `container|sub`.
    pub name: &'static str,
    /// Handler.
    pub cmd: Cmd,
    /// Redis arity: the count of words including the name, negative for "at least".
    pub arity: i32,
    /// Flags (`write`, `readonly`, `blocking`, `fast`, ...).
    pub flags: &'static [&'static str],
    /// ACL categories.
    pub acl: &'static [&'static str],
    /// First key position (0: none); last key and step are 1 when there is a key.
    pub first_key: i32,
    /// Group, as in `COMMAND DOCS`.
    pub group: &'static str,
    /// One-line summary.
    pub summary: &'static str,
    /// Complexity.
    pub complexity: &'static str,
    /// Arguments after the name.
    pub args: &'static [Arg],
    /// Subcommands of a container command.
    pub subcommands: &'static [CommandSpec],
}

#[allow(clippy::too_many_arguments)]
const fn spec(
    name: &'static str,
    cmd: Cmd,
    arity: i32,
    flags: &'static [&'static str],
    acl: &'static [&'static str],
    first_key: i32,
    group: &'static str,
    summary: &'static str,
    args: &'static [Arg],
) -> CommandSpec {
    CommandSpec {
        name,
        cmd,
        arity,
        flags,
        acl,
        first_key,
        group,
        summary,
        complexity: "O(log N)",
        args,
        subcommands: &[],
    }
}

const SEMG: &str = "semaphore";
const CONN: &str = "connection";
const SRV: &str = "server";
const TXN: &str = "transactions";
const W: &[&str] = &["write", "fast"];
const R: &[&str] = &["readonly", "fast"];
const ACL_W: &[&str] = &["@write", "@semaphore", "@fast"];
const ACL_R: &[&str] = &["@read", "@semaphore", "@fast"];
const ACL_CONN: &[&str] = &["@fast", "@connection"];
const ACL_ADMIN: &[&str] = &["@admin", "@slow", "@dangerous"];
const CONNF: &[&str] = &["noscript", "loading", "stale", "fast"];
/// Flags of the commands a client may send before it authenticates.
const NO_AUTH_F: &[&str] = &[
    "noscript",
    "loading",
    "stale",
    "fast",
    "no-auth",
    "allow-busy",
];

static CLIENT_SUBS: &[CommandSpec] = &[
    spec(
        "client|id",
        Cmd::ClientId,
        2,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Returns the unique client ID of the connection.",
        &[],
    ),
    spec(
        "client|setname",
        Cmd::ClientSetName,
        3,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Sets the connection name.",
        &[arg("connection-name", ArgType::String)],
    ),
    spec(
        "client|getname",
        Cmd::ClientGetName,
        2,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Returns the name of the connection.",
        &[],
    ),
    spec(
        "client|setinfo",
        Cmd::ClientSetInfo,
        4,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Sets information specific to the client or connection.",
        &[arg("attr", ArgType::String), arg("value", ArgType::String)],
    ),
    spec(
        "client|info",
        Cmd::ClientInfo,
        2,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Returns information about the connection.",
        &[],
    ),
    spec(
        "client|list",
        Cmd::ClientList,
        -2,
        &["admin", "noscript", "loading", "stale"],
        ACL_ADMIN,
        0,
        CONN,
        "Lists open connections.",
        &[opt("client-id", ArgType::Integer, "ID")],
    ),
    spec(
        "client|kill",
        Cmd::ClientKill,
        -3,
        &["admin", "noscript", "loading", "stale"],
        ACL_ADMIN,
        0,
        CONN,
        "Terminates open connections.",
        &[
            opt("client-id", ArgType::Integer, "ID"),
            opt("ip:port", ArgType::String, "ADDR"),
            opt("username", ArgType::String, "USER"),
        ],
    ),
    spec(
        "client|unblock",
        Cmd::ClientUnblock,
        -3,
        &["admin", "noscript", "loading", "stale"],
        ACL_ADMIN,
        0,
        CONN,
        "Unblocks a client parked in SEM.ACQUIRE.",
        &[
            arg("client-id", ArgType::Integer),
            Arg {
                name: "unblock-type",
                kind: ArgType::OneOf,
                token: None,
                optional: true,
                multiple: false,
                args: &[token("timeout", "TIMEOUT"), token("error", "ERROR")],
            },
        ],
    ),
    spec(
        "client|tracking",
        Cmd::ClientUnsupported,
        -3,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Not supported: permitd has no client-side caching.",
        &[],
    ),
    spec(
        "client|caching",
        Cmd::ClientUnsupported,
        3,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Not supported: permitd has no client-side caching.",
        &[],
    ),
    spec(
        "client|trackinginfo",
        Cmd::ClientUnsupported,
        2,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Not supported: permitd has no client-side caching.",
        &[],
    ),
    spec(
        "client|getredir",
        Cmd::ClientUnsupported,
        2,
        CONNF,
        ACL_CONN,
        0,
        CONN,
        "Not supported: permitd has no client-side caching.",
        &[],
    ),
];

static COMMAND_SUBS: &[CommandSpec] = &[
    spec(
        "command|count",
        Cmd::CommandCount,
        2,
        &["loading", "stale"],
        &["@slow", "@connection"],
        0,
        SRV,
        "Returns a count of commands.",
        &[],
    ),
    spec(
        "command|info",
        Cmd::CommandInfo,
        -2,
        &["loading", "stale"],
        &["@slow", "@connection"],
        0,
        SRV,
        "Returns information about one, multiple or all commands.",
        &[Arg {
            name: "command-name",
            kind: ArgType::String,
            token: None,
            optional: true,
            multiple: true,
            args: &[],
        }],
    ),
    spec(
        "command|docs",
        Cmd::CommandDocs,
        -2,
        &["loading", "stale"],
        &["@slow", "@connection"],
        0,
        SRV,
        "Returns documentary information about one, multiple or all commands.",
        &[Arg {
            name: "command-name",
            kind: ArgType::String,
            token: None,
            optional: true,
            multiple: true,
            args: &[],
        }],
    ),
    spec(
        "command|list",
        Cmd::CommandList,
        -2,
        &["loading", "stale"],
        &["@slow", "@connection"],
        0,
        SRV,
        "Returns a list of command names.",
        &[],
    ),
    spec(
        "command|getkeys",
        Cmd::CommandGetKeys,
        -3,
        &["loading", "stale"],
        &["@slow", "@connection"],
        0,
        SRV,
        "Extracts the key names from an arbitrary command.",
        &[
            arg("command", ArgType::String),
            Arg {
                name: "arg",
                kind: ArgType::String,
                token: None,
                optional: true,
                multiple: true,
                args: &[],
            },
        ],
    ),
];

const ADMINF: &[&str] = &["admin", "noscript", "loading", "stale"];
const ACL_READ: &[&str] = &["@slow"];

static ACL_SUBS: &[CommandSpec] = &[
    spec("acl|setuser", Cmd::AclSetUser, -3, ADMINF, ACL_ADMIN, 0, SRV, "Creates or changes a user: on/off, >password, ~namespace-pattern, +@category, -command, ...", &[arg("username", ArgType::String), Arg { name: "rule", kind: ArgType::String, token: None, optional: true, multiple: true, args: &[] }]),
    spec("acl|deluser", Cmd::AclDelUser, -3, ADMINF, ACL_ADMIN, 0, SRV, "Deletes users.", &[Arg { name: "username", kind: ArgType::String, token: None, optional: false, multiple: true, args: &[] }]),
    spec("acl|list", Cmd::AclList, 2, ADMINF, ACL_ADMIN, 0, SRV, "Lists the users and their rules.", &[]),
    spec("acl|users", Cmd::AclUsers, 2, ADMINF, ACL_ADMIN, 0, SRV, "Lists the user names.", &[]),
    spec("acl|whoami", Cmd::AclWhoami, 2, &["noscript", "loading", "stale"], ACL_READ, 0, SRV, "Returns the user of the connection.", &[]),
    spec("acl|cat", Cmd::AclCat, -2, &["noscript", "loading", "stale"], ACL_READ, 0, SRV, "Lists the categories, or the commands of one.", &[Arg { name: "category", kind: ArgType::String, token: None, optional: true, multiple: false, args: &[] }]),
    spec("acl|load", Cmd::AclLoad, 2, ADMINF, ACL_ADMIN, 0, SRV, "Reloads the users from the ACL file.", &[]),
    spec("acl|save", Cmd::AclSave, 2, ADMINF, ACL_ADMIN, 0, SRV, "Writes the users to the ACL file.", &[]),
];

static CONFIG_SUBS: &[CommandSpec] = &[spec(
    "config|get",
    Cmd::ConfigGet,
    -3,
    &["admin", "noscript", "loading", "stale"],
    ACL_ADMIN,
    0,
    SRV,
    "Returns the effective values of server options.",
    &[Arg {
        name: "parameter",
        kind: ArgType::String,
        token: None,
        optional: false,
        multiple: true,
        args: &[],
    }],
)];

/// Every command, in the order the docs list them.
pub static COMMANDS: &[CommandSpec] = &[
    spec(
        "ns.create",
        Cmd::NsCreate,
        -2,
        W,
        ACL_W,
        1,
        SEMG,
        "Creates a namespace.",
        &[NS, DESC, META],
    ),
    spec(
        "ns.get",
        Cmd::NsGet,
        2,
        R,
        ACL_R,
        1,
        SEMG,
        "Returns a namespace.",
        &[NS],
    ),
    spec(
        "ns.list",
        Cmd::NsList,
        -1,
        &["readonly"],
        &["@read", "@semaphore", "@slow"],
        0,
        SEMG,
        "Lists namespaces in name order, one page at a time.",
        &[CURSOR, LIMIT],
    ),
    spec(
        "ns.update",
        Cmd::NsUpdate,
        -4,
        W,
        ACL_W,
        1,
        SEMG,
        "Replaces a namespace's description and metadata if its version matches.",
        &[NS, VERSION, DESC, META],
    ),
    spec(
        "ns.delete",
        Cmd::NsDelete,
        2,
        &["write"],
        &["@write", "@semaphore", "@slow", "@dangerous"],
        1,
        SEMG,
        "Deletes a namespace and everything in it.",
        &[NS],
    ),
    spec(
        "sem.create",
        Cmd::SemCreate,
        -4,
        W,
        ACL_W,
        1,
        SEMG,
        "Creates a semaphore with a number of permits.",
        &[NS, SEM, arg("permits", ArgType::Integer), DESC, META],
    ),
    spec(
        "sem.get",
        Cmd::SemGet,
        3,
        R,
        ACL_R,
        1,
        SEMG,
        "Returns a semaphore.",
        &[NS, SEM],
    ),
    spec(
        "sem.list",
        Cmd::SemList,
        -2,
        &["readonly"],
        &["@read", "@semaphore", "@slow"],
        1,
        SEMG,
        "Lists a namespace's semaphores in name order, one page at a time.",
        &[NS, CURSOR, LIMIT],
    ),
    spec(
        "sem.update",
        Cmd::SemUpdate,
        -6,
        W,
        ACL_W,
        1,
        SEMG,
        "Changes a semaphore's permits, description and metadata if its version matches.",
        &[
            NS,
            SEM,
            arg("permits", ArgType::Integer),
            VERSION,
            DESC,
            META,
        ],
    ),
    spec(
        "sem.delete",
        Cmd::SemDelete,
        3,
        W,
        ACL_W,
        1,
        SEMG,
        "Deletes a semaphore; its parked acquires end with NOTFOUND.",
        &[NS, SEM],
    ),
    spec(
        "sem.acquire",
        Cmd::SemAcquire,
        -6,
        &["write", "blocking"],
        &["@write", "@semaphore", "@blocking"],
        1,
        SEMG,
        "Acquires weight permits under a lease, waiting up to timeout seconds (FIFO).",
        &[
            NS,
            SEM,
            LEASE,
            arg("weight", ArgType::Integer),
            arg("timeout", ArgType::Double),
            META,
        ],
    ),
    spec(
        "sem.release",
        Cmd::SemRelease,
        4,
        W,
        ACL_W,
        1,
        SEMG,
        "Releases a lease's hold on a semaphore.",
        &[NS, SEM, LEASE],
    ),
    spec(
        "sem.holders",
        Cmd::SemHolders,
        -3,
        &["readonly"],
        &["@read", "@semaphore", "@slow"],
        1,
        SEMG,
        "Lists a semaphore's holders, oldest first, one page at a time.",
        &[NS, SEM, CURSOR, LIMIT],
    ),
    spec(
        "lease.create",
        Cmd::LeaseCreate,
        -4,
        W,
        ACL_W,
        1,
        SEMG,
        "Creates a lease that lives ttl seconds unless refreshed.",
        &[
            NS,
            arg("process-id", ArgType::String),
            arg("ttl", ArgType::Integer),
            META,
        ],
    ),
    spec(
        "lease.get",
        Cmd::LeaseGet,
        3,
        R,
        ACL_R,
        1,
        SEMG,
        "Returns a live lease.",
        &[NS, LEASE],
    ),
    spec(
        "lease.list",
        Cmd::LeaseList,
        -2,
        &["readonly"],
        &["@read", "@semaphore", "@slow"],
        1,
        SEMG,
        "Lists a namespace's live leases in creation order, one page at a time.",
        &[
            NS,
            opt("process-id", ArgType::String, "PROCESS"),
            CURSOR,
            LIMIT,
        ],
    ),
    spec(
        "lease.refresh",
        Cmd::LeaseRefresh,
        4,
        W,
        ACL_W,
        1,
        SEMG,
        "Extends a live lease to now + ttl, with all its holds.",
        &[NS, LEASE, arg("ttl", ArgType::Integer)],
    ),
    spec(
        "lease.revoke",
        Cmd::LeaseRevoke,
        3,
        W,
        ACL_W,
        1,
        SEMG,
        "Releases every hold of a lease and deletes it.",
        &[NS, LEASE],
    ),
    spec(
        "ping",
        Cmd::Ping,
        -1,
        &["fast", "stale"],
        &["@fast", "@connection"],
        0,
        CONN,
        "Returns the server's liveliness response.",
        &[Arg {
            name: "message",
            kind: ArgType::String,
            token: None,
            optional: true,
            multiple: false,
            args: &[],
        }],
    ),
    spec(
        "echo",
        Cmd::Echo,
        2,
        &["fast", "loading", "stale"],
        &["@fast", "@connection"],
        0,
        CONN,
        "Returns the given string.",
        &[arg("message", ArgType::String)],
    ),
    spec(
        "quit",
        Cmd::Quit,
        -1,
        NO_AUTH_F,
        &["@fast", "@connection"],
        0,
        CONN,
        "Closes the connection.",
        &[],
    ),
    spec(
        "reset",
        Cmd::Reset,
        1,
        NO_AUTH_F,
        &["@fast", "@connection"],
        0,
        CONN,
        "Resets the connection.",
        &[],
    ),
    spec(
        "select",
        Cmd::Select,
        2,
        &["loading", "stale", "fast"],
        &["@fast", "@connection"],
        0,
        CONN,
        "Changes the selected database (only 0 exists).",
        &[arg("index", ArgType::Integer)],
    ),
    spec(
        "auth",
        Cmd::Auth,
        -2,
        NO_AUTH_F,
        &["@fast", "@connection"],
        0,
        CONN,
        "Authenticates the connection.",
        &[
            Arg {
                name: "username",
                kind: ArgType::String,
                token: None,
                optional: true,
                multiple: false,
                args: &[],
            },
            arg("password", ArgType::String),
        ],
    ),
    spec(
        "hello",
        Cmd::Hello,
        -1,
        NO_AUTH_F,
        &["@fast", "@connection"],
        0,
        CONN,
        "Handshakes with the server: protocol version, authentication, name.",
        &[Arg {
            name: "arguments",
            kind: ArgType::Block,
            token: None,
            optional: true,
            multiple: false,
            args: &[
                arg("protover", ArgType::Integer),
                Arg {
                    name: "auth",
                    kind: ArgType::Block,
                    token: Some("AUTH"),
                    optional: true,
                    multiple: false,
                    args: &[
                        arg("username", ArgType::String),
                        arg("password", ArgType::String),
                    ],
                },
                opt("clientname", ArgType::String, "SETNAME"),
            ],
        }],
    ),
    CommandSpec {
        subcommands: CLIENT_SUBS,
        ..spec(
            "client",
            Cmd::Client,
            -2,
            &[],
            &["@slow"],
            0,
            CONN,
            "A container for client connection commands.",
            &[],
        )
    },
    CommandSpec {
        subcommands: COMMAND_SUBS,
        ..spec(
            "command",
            Cmd::Command,
            -1,
            &["loading", "stale"],
            &["@slow", "@connection"],
            0,
            SRV,
            "Returns detailed information about all commands.",
            &[],
        )
    },
    spec(
        "info",
        Cmd::Info,
        -1,
        &["loading", "stale"],
        &["@slow", "@dangerous"],
        0,
        SRV,
        "Returns information and statistics about the server.",
        &[Arg {
            name: "section",
            kind: ArgType::String,
            token: None,
            optional: true,
            multiple: true,
            args: &[],
        }],
    ),
    CommandSpec {
        subcommands: ACL_SUBS,
        ..spec(
            "acl",
            Cmd::Acl,
            -2,
            &[],
            &["@slow"],
            0,
            SRV,
            "A container for access control commands.",
            &[],
        )
    },
    CommandSpec {
        subcommands: CONFIG_SUBS,
        ..spec(
            "config",
            Cmd::Config,
            -2,
            &[],
            &["@slow"],
            0,
            SRV,
            "A container for server configuration commands.",
            &[],
        )
    },
    spec(
        "shutdown",
        Cmd::Shutdown,
        -1,
        &[
            "admin",
            "noscript",
            "loading",
            "stale",
            "no-multi",
            "allow-busy",
        ],
        ACL_ADMIN,
        0,
        SRV,
        "Stops the server after flushing its state.",
        &[Arg {
            name: "save-selector",
            kind: ArgType::OneOf,
            token: None,
            optional: true,
            multiple: false,
            args: &[token("nosave", "NOSAVE"), token("save", "SAVE")],
        }],
    ),
    spec(
        "debug",
        Cmd::Debug,
        -2,
        ADMINF,
        ACL_ADMIN,
        0,
        SRV,
        "Debugging: PANIC crashes the server. Refused unless --enable-debug-command allows it.",
        &[arg("subcommand", ArgType::String)],
    ),
    spec(
        "multi",
        Cmd::Multi,
        1,
        &["noscript", "loading", "stale", "fast", "allow-busy"],
        &["@fast", "@transaction"],
        0,
        TXN,
        "Starts a transaction (one namespace).",
        &[],
    ),
    spec(
        "exec",
        Cmd::Exec,
        1,
        &["noscript", "loading", "stale", "skip-slowlog"],
        &["@slow", "@transaction"],
        0,
        TXN,
        "Executes all commands of a transaction atomically.",
        &[],
    ),
    spec(
        "discard",
        Cmd::Discard,
        1,
        &["noscript", "loading", "stale", "fast", "allow-busy"],
        &["@fast", "@transaction"],
        0,
        TXN,
        "Discards a transaction.",
        &[],
    ),
];

/// Finds a top-level command by name, any case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Finds a command or `container|sub` by its full name, any case.
pub fn lookup_full(name: &[u8]) -> Option<&'static CommandSpec> {
    let lower = name.to_ascii_lowercase();
    match lower.iter().position(|&b| b == b'|') {
        None => lookup(&lower),
        Some(bar) => lookup(&lower[..bar])?
            .subcommands
            .iter()
            .find(|s| s.name.as_bytes() == lower.as_slice()),
    }
}

impl CommandSpec {
    /// Whether `argc` words (name included) fit this command's arity.
    pub fn arity_ok(&self, argc: usize) -> bool {
        if self.arity >= 0 {
            argc == self.arity as usize
        } else {
            argc >= (-self.arity) as usize
        }
    }

    /// The subcommand named by `word`, any case.
    pub fn subcommand(&self, word: &[u8]) -> Option<&'static CommandSpec> {
        let prefix_len = self.name.len() + 1;
        self.subcommands
            .iter()
            .find(|s| s.name.as_bytes()[prefix_len..].eq_ignore_ascii_case(word))
    }

    /// Whether the command changes state.
    pub fn is_write(&self) -> bool {
        self.flags.contains(&"write")
    }

    /// A usage line, e.g. `SEM.ACQUIRE namespace semaphore lease weight timeout [META key value ...]`.
    pub fn usage(&self) -> String {
        let mut s = self.name.replace('|', " ").to_uppercase();
        for a in self.args {
            s.push(' ');
            s.push_str(&arg_usage(a));
        }
        s
    }
}

fn arg_usage(a: &Arg) -> String {
    let body = match a.kind {
        ArgType::PureToken => a.token.unwrap_or(a.name).to_string(),
        ArgType::Block => {
            let inner: Vec<String> = a.args.iter().map(arg_usage).collect();
            let inner = inner.join(" ");
            match a.token {
                Some(t) => format!("{t} {inner}"),
                None => inner,
            }
        }
        ArgType::OneOf => {
            let inner: Vec<String> = a.args.iter().map(arg_usage).collect();
            inner.join("|")
        }
        _ => match a.token {
            Some(t) => format!("{t} {}", a.name),
            None => a.name.to_string(),
        },
    };
    let body = if a.multiple {
        format!("{body} [{body} ...]")
    } else {
        body
    };
    if a.optional {
        format!("[{body}]")
    } else {
        body
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arities_follow_redis_conventions() {
        let ar = |n: &str| lookup(n.as_bytes()).unwrap().arity;
        assert_eq!(ar("sem.acquire"), -6);
        assert_eq!(ar("ns.create"), -2);
        assert_eq!(ar("ns.get"), 2);
        assert_eq!(ar("sem.release"), 4);
        assert_eq!(ar("lease.create"), -4);
        assert_eq!(ar("lease.refresh"), 4);
    }

    #[test]
    fn lookups_ignore_case_and_find_subcommands() {
        assert_eq!(lookup(b"SeM.AcQuIrE").unwrap().cmd, Cmd::SemAcquire);
        assert_eq!(lookup_full(b"CLIENT|ID").unwrap().cmd, Cmd::ClientId);
        assert_eq!(
            lookup(b"client")
                .unwrap()
                .subcommand(b"UNBLOCK")
                .unwrap()
                .cmd,
            Cmd::ClientUnblock
        );
        assert!(lookup(b"nosuch").is_none());
    }

    #[test]
    fn usage_lines_show_options() {
        assert_eq!(
            lookup(b"sem.acquire").unwrap().usage(),
            "SEM.ACQUIRE namespace semaphore lease weight timeout [META key value [key value ...]]"
        );
    }
}
