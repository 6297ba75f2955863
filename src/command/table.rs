//! The command table: the single source of truth for every command's name, arity, flags, key
//! positions, summary and arguments. Dispatch, `COMMAND`, `COMMAND INFO`, `COMMAND DOCS` and
//! `docs/commands.md` are all derived from it.

mod flags;

pub use flags::{AclCat, AclCats, Flag, Flags};

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
    SemAcquireAll,
    SemRelease,
    SemHolders,
    SemWaiters,
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
    ClientNoEvict,
    ClientNoTouch,
    ClientMaintNotifications,
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
    ConfigResetStat,
    Shutdown,
    Debug,
    Time,
    Role,
    Monitor,
    Slowlog,
    SlowlogGet,
    SlowlogLen,
    SlowlogReset,
    Latency,
    LatencyLatest,
    LatencyHistory,
    LatencyReset,
    Multi,
    Exec,
    Discard,
    Cluster,
    ClusterSlots,
    ClusterShards,
    ClusterNodes,
    ClusterInfo,
    ClusterMyId,
    ClusterKeySlot,
    ReadOnly,
    ReadWrite,
    /// `<container> HELP`, one entry in each container.
    Help,
}

/// An argument's type, as `COMMAND DOCS` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgType {
    /// The namespace: the key `COMMAND GETKEYS` and cluster-aware clients route by.
    Key,
    /// Free text, or a name.
    String,
    /// A whole number.
    Integer,
    /// A decimal number (seconds in a time-out).
    Double,
    /// A fixed word standing alone (`NOSAVE`), its `token`.
    PureToken,
    /// A group of arguments that come together.
    Block,
    /// One of the alternatives in `args`.
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

/// One argument of a command, for `COMMAND DOCS`, usage lines and the docs.
#[derive(Debug)]
pub struct Arg {
    /// Lowercase, as Redis names arguments.
    pub name: &'static str,
    /// Its type, which also decides how its usage is written.
    pub kind: ArgType,
    /// The option word that introduces it (`DESC`, `META`, ...).
    pub token: Option<&'static str>,
    /// May be left out.
    pub optional: bool,
    /// May repeat.
    pub multiple: bool,
    /// The members of a block or one-of.
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

/// An option: `token` followed by the value.
const fn opt(name: &'static str, kind: ArgType, token: &'static str) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, kind)
    }
    .optional()
}

/// A value introduced by `token`, required.
const fn tagged(name: &'static str, kind: ArgType, token: &'static str) -> Arg {
    Arg {
        token: Some(token),
        ..arg(name, kind)
    }
}

const fn token(name: &'static str, tok: &'static str) -> Arg {
    Arg {
        token: Some(tok),
        ..arg(name, ArgType::PureToken)
    }
}

const fn block(name: &'static str, args: &'static [Arg]) -> Arg {
    Arg {
        args,
        ..arg(name, ArgType::Block)
    }
}

const fn one_of(name: &'static str, args: &'static [Arg]) -> Arg {
    Arg {
        args,
        ..arg(name, ArgType::OneOf)
    }
}

impl Arg {
    const fn optional(self) -> Arg {
        Arg {
            optional: true,
            ..self
        }
    }

    const fn multiple(self) -> Arg {
        Arg {
            multiple: true,
            ..self
        }
    }
}

const NS: Arg = arg("namespace", ArgType::Key);
const SEM: Arg = arg("semaphore", ArgType::String);
const LEASE: Arg = arg("lease", ArgType::String);
const DESC: Arg = opt("description", ArgType::String, "DESC");
const CURSOR: Arg = opt("cursor", ArgType::String, "CURSOR");
const LIMIT: Arg = opt("limit", ArgType::Integer, "LIMIT");
const VERSION: Arg = tagged("version", ArgType::Integer, "VERSION");
const META: Arg = Arg {
    token: Some("META"),
    ..block(
        "metadata",
        &[block(
            "entry",
            &[arg("key", ArgType::String), arg("value", ArgType::String)],
        )
        .multiple()],
    )
}
.optional();
const COMMAND_NAMES: &[Arg] = &[arg("command-name", ArgType::String).optional().multiple()];

/// One command (or subcommand) of the table.
#[derive(Debug)]
pub struct CommandSpec {
    /// Lowercase; a subcommand's is `container|sub`.
    pub name: &'static str,
    /// The handler that runs it.
    pub cmd: Cmd,
    /// Redis arity: the count of words including the name, negative for "at least".
    pub arity: i32,
    /// What `COMMAND INFO` reports; dispatch acts on `no-auth` and `no-multi`.
    pub flags: Flags,
    /// The categories ACL rules allow or deny it by.
    pub acl: AclCats,
    /// Where the namespace, the only key, is (0: none). Last key and step are 1 when it is there.
    pub first_key: i32,
    /// The `COMMAND DOCS` group, which is also the section of `docs/commands.md`.
    pub group: &'static str,
    /// One line for `COMMAND DOCS` and the docs.
    pub summary: &'static str,
    /// Time complexity, in the letters the head of `docs/commands.md` explains.
    pub complexity: &'static str,
    /// The arguments after the name (after the subcommand word for a subcommand).
    pub args: &'static [Arg],
    /// The subcommands of a container command.
    pub subcommands: &'static [CommandSpec],
}

// Entries are written over these bases, naming only what differs.

/// The base of the bases. Its name, arity, group, summary and complexity are blank and its
/// `cmd` is PING's, so an entry that forgets one of its own fails
/// `entries_fill_in_their_own_fields`.
const UNSET: CommandSpec = CommandSpec {
    name: "",
    cmd: Cmd::Ping,
    arity: 0,
    flags: Flags::of(&[]),
    acl: AclCats::of(&[]),
    first_key: 0,
    group: "",
    summary: "",
    complexity: "",
    args: &[],
    subcommands: &[],
};

/// A namespace, semaphore or lease command that changes state. The namespace comes first.
const ENGINE_WRITE: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Write, Flag::Fast]),
    acl: AclCats::of(&[AclCat::Write, AclCat::Semaphore, AclCat::Fast]),
    first_key: 1,
    group: "semaphore",
    ..UNSET
};

/// A namespace, semaphore or lease command that may add state (an entity, metadata, a hold, a
/// waiter): refused past `--maxmemory`, as Redis flags SET `denyoom`.
const ENGINE_ADD: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Write, Flag::DenyOom, Flag::Fast]),
    ..ENGINE_WRITE
};

/// A namespace, semaphore or lease command that reads one entity.
const ENGINE_READ: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Readonly, Flag::Fast]),
    acl: AclCats::of(&[AclCat::Read, AclCat::Semaphore, AclCat::Fast]),
    ..ENGINE_WRITE
};

/// A listing, one page at a time.
const ENGINE_LISTING: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Readonly]),
    acl: AclCats::of(&[AclCat::Read, AclCat::Semaphore, AclCat::Slow]),
    ..ENGINE_WRITE
};

const CONNECTION: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale, Flag::Fast]),
    acl: AclCats::of(&[AclCat::Fast, AclCat::Connection]),
    group: "connection",
    complexity: "O(1)",
    ..UNSET
};

/// The connection commands a client may send before it authenticates.
const BEFORE_AUTH: CommandSpec = CommandSpec {
    flags: Flags::of(&[
        Flag::Noscript,
        Flag::Loading,
        Flag::Stale,
        Flag::Fast,
        Flag::NoAuth,
        Flag::AllowBusy,
    ]),
    ..CONNECTION
};

const SERVER: CommandSpec = CommandSpec {
    group: "server",
    ..UNSET
};

const ADMIN: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Admin, Flag::Noscript, Flag::Loading, Flag::Stale]),
    acl: AclCats::of(&[AclCat::Admin, AclCat::Slow, AclCat::Dangerous]),
    ..SERVER
};

/// `COMMAND` and its subcommands.
const INTROSPECTION: CommandSpec = CommandSpec {
    flags: Flags::of(&[Flag::Loading, Flag::Stale]),
    acl: AclCats::of(&[AclCat::Slow, AclCat::Connection]),
    ..SERVER
};

/// A command that only holds subcommands (`CLIENT`, `ACL`, `CONFIG`).
const CONTAINER: CommandSpec = CommandSpec {
    arity: -2,
    acl: AclCats::of(&[AclCat::Slow]),
    complexity: "Depends on subcommand.",
    ..SERVER
};

const TRANSACTION: CommandSpec = CommandSpec {
    arity: 1,
    flags: Flags::of(&[
        Flag::Noscript,
        Flag::Loading,
        Flag::Stale,
        Flag::Fast,
        Flag::AllowBusy,
    ]),
    acl: AclCats::of(&[AclCat::Fast, AclCat::Transaction]),
    group: "transactions",
    ..UNSET
};

/// `on|off`, the argument of the CLIENT switches.
const ON_OFF: Arg = one_of("enabled", &[token("on", "ON"), token("off", "OFF")]);

/// A `CLUSTER` subcommand: it describes the cluster, which a node knows at any time (Redis
/// allows them on a stale replica, not while loading).
const CLUSTER: CommandSpec = CommandSpec {
    arity: 2,
    flags: Flags::of(&[Flag::Stale]),
    acl: AclCats::of(&[AclCat::Slow]),
    group: "cluster",
    ..UNSET
};

/// READONLY and READWRITE, which a cluster client sends to a replica it reads from.
const READ_MODE: CommandSpec = CommandSpec {
    arity: 1,
    flags: Flags::of(&[Flag::Fast, Flag::Loading, Flag::Stale]),
    acl: AclCats::of(&[AclCat::Fast, AclCat::Connection]),
    group: "cluster",
    complexity: "O(1)",
    ..UNSET
};

/// `<container> HELP`, the last subcommand of every container, as in Redis 7.0: its help text
/// is made from the container's entries (docs.rs).
const HELP: CommandSpec = CommandSpec {
    cmd: Cmd::Help,
    arity: 2,
    flags: Flags::of(&[Flag::Loading, Flag::Stale]),
    acl: AclCats::of(&[AclCat::Slow]),
    summary: "Shows helpful text about the different subcommands.",
    complexity: "O(1)",
    ..SERVER
};

const NO_CLIENT_CACHING: &str = "Not supported: permitd has no client-side caching.";

static CLIENT_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "client|id",
        cmd: Cmd::ClientId,
        arity: 2,
        summary: "Returns the unique client ID of the connection.",
        ..CONNECTION
    },
    CommandSpec {
        name: "client|setname",
        cmd: Cmd::ClientSetName,
        arity: 3,
        summary: "Sets the connection name.",
        args: &[arg("connection-name", ArgType::String)],
        ..CONNECTION
    },
    CommandSpec {
        name: "client|getname",
        cmd: Cmd::ClientGetName,
        arity: 2,
        summary: "Returns the name of the connection.",
        ..CONNECTION
    },
    CommandSpec {
        name: "client|setinfo",
        cmd: Cmd::ClientSetInfo,
        arity: 4,
        summary: "Sets information specific to the client or connection.",
        args: &[arg("attr", ArgType::String), arg("value", ArgType::String)],
        ..CONNECTION
    },
    CommandSpec {
        name: "client|info",
        cmd: Cmd::ClientInfo,
        arity: 2,
        summary: "Returns information about the connection.",
        ..CONNECTION
    },
    CommandSpec {
        name: "client|list",
        cmd: Cmd::ClientList,
        arity: -2,
        group: "connection",
        summary: "Lists open connections, all or those of one type or of the given ids.",
        complexity: "O(N), N the clients",
        args: &[one_of(
            "filter",
            &[
                tagged("client-type", ArgType::String, "TYPE"),
                Arg {
                    token: Some("ID"),
                    ..block("ids", &[arg("client-id", ArgType::Integer).multiple()])
                },
            ],
        )
        .optional()],
        ..ADMIN
    },
    CommandSpec {
        name: "client|kill",
        cmd: Cmd::ClientKill,
        arity: -3,
        group: "connection",
        summary: "Terminates open connections: the one at ip:port, or those every filter given \
                  matches (every client is of type normal).",
        complexity: "O(N), N the clients",
        args: &[one_of(
            "filter",
            &[
                arg("ip:port", ArgType::String),
                block(
                    "new-format",
                    &[
                        opt("client-id", ArgType::Integer, "ID"),
                        opt("client-type", ArgType::String, "TYPE"),
                        opt("username", ArgType::String, "USER"),
                        opt("ip:port", ArgType::String, "ADDR"),
                        opt("ip:port", ArgType::String, "LADDR"),
                        opt("yes/no", ArgType::String, "SKIPME"),
                    ],
                ),
            ],
        )],
        ..ADMIN
    },
    CommandSpec {
        name: "client|unblock",
        cmd: Cmd::ClientUnblock,
        arity: -3,
        group: "connection",
        summary: "Unblocks a client parked in SEM.ACQUIRE.",
        complexity: "O(log N), N the clients",
        args: &[
            arg("client-id", ArgType::Integer),
            one_of(
                "unblock-type",
                &[token("timeout", "TIMEOUT"), token("error", "ERROR")],
            )
            .optional(),
        ],
        ..ADMIN
    },
    CommandSpec {
        name: "client|no-evict",
        cmd: Cmd::ClientNoEvict,
        arity: 3,
        // Redis's, @connection included: unlike the admin CLIENT subcommands above, which
        // permitd keeps out of @connection so that `+@connection` cannot kill or list other
        // clients, this one changes nothing.
        acl: AclCats::of(&[
            AclCat::Admin,
            AclCat::Slow,
            AclCat::Dangerous,
            AclCat::Connection,
        ]),
        group: "connection",
        summary: "Accepted: permitd never evicts a client.",
        complexity: "O(1)",
        args: &[ON_OFF],
        ..ADMIN
    },
    CommandSpec {
        name: "client|no-touch",
        cmd: Cmd::ClientNoTouch,
        arity: 3,
        flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale]),
        acl: AclCats::of(&[AclCat::Slow, AclCat::Connection]),
        summary: "Accepted: permitd keeps no access times that commands would touch.",
        args: &[ON_OFF],
        ..CONNECTION
    },
    CommandSpec {
        name: "client|maint_notifications",
        cmd: Cmd::ClientMaintNotifications,
        arity: -3,
        flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale]),
        acl: AclCats::of(&[AclCat::Slow, AclCat::Connection]),
        summary: "Accepted: no endpoint ever moves, so no maintenance notification is sent.",
        args: &[
            ON_OFF,
            block(
                "option",
                &[arg("name", ArgType::String), arg("value", ArgType::String)],
            )
            .optional()
            .multiple(),
        ],
        ..CONNECTION
    },
    CommandSpec {
        name: "client|tracking",
        cmd: Cmd::ClientUnsupported,
        arity: -3,
        summary: NO_CLIENT_CACHING,
        ..CONNECTION
    },
    CommandSpec {
        name: "client|caching",
        cmd: Cmd::ClientUnsupported,
        arity: 3,
        summary: NO_CLIENT_CACHING,
        ..CONNECTION
    },
    CommandSpec {
        name: "client|trackinginfo",
        cmd: Cmd::ClientUnsupported,
        arity: 2,
        summary: NO_CLIENT_CACHING,
        ..CONNECTION
    },
    CommandSpec {
        name: "client|getredir",
        cmd: Cmd::ClientUnsupported,
        arity: 2,
        summary: NO_CLIENT_CACHING,
        ..CONNECTION
    },
    CommandSpec {
        name: "client|help",
        acl: AclCats::of(&[AclCat::Slow, AclCat::Connection]),
        group: "connection",
        ..HELP
    },
];

static COMMAND_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "command|count",
        cmd: Cmd::CommandCount,
        arity: 2,
        summary: "Returns a count of commands.",
        complexity: "O(1)",
        ..INTROSPECTION
    },
    CommandSpec {
        name: "command|info",
        cmd: Cmd::CommandInfo,
        arity: -2,
        summary: "Returns information about one, multiple or all commands.",
        complexity: "O(N), N the commands",
        args: COMMAND_NAMES,
        ..INTROSPECTION
    },
    CommandSpec {
        name: "command|docs",
        cmd: Cmd::CommandDocs,
        arity: -2,
        summary: "Returns documentary information about one, multiple or all commands.",
        complexity: "O(N), N the commands",
        args: COMMAND_NAMES,
        ..INTROSPECTION
    },
    CommandSpec {
        name: "command|list",
        cmd: Cmd::CommandList,
        arity: -2,
        summary: "Returns the names of the commands and subcommands, all or those a filter keeps.",
        complexity: "O(N), N the commands",
        args: &[Arg {
            token: Some("FILTERBY"),
            ..block(
                "filterby",
                &[one_of(
                    "filter",
                    &[
                        tagged("module-name", ArgType::String, "MODULE"),
                        tagged("category", ArgType::String, "ACLCAT"),
                        tagged("pattern", ArgType::String, "PATTERN"),
                    ],
                )],
            )
        }
        .optional()],
        ..INTROSPECTION
    },
    CommandSpec {
        name: "command|getkeys",
        cmd: Cmd::CommandGetKeys,
        arity: -3,
        summary: "Extracts the key names from an arbitrary command.",
        complexity: "O(1)",
        args: &[
            arg("command", ArgType::String),
            arg("arg", ArgType::String).optional().multiple(),
        ],
        ..INTROSPECTION
    },
    CommandSpec {
        name: "command|help",
        acl: AclCats::of(&[AclCat::Slow, AclCat::Connection]),
        ..HELP
    },
];

static ACL_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "acl|setuser",
        cmd: Cmd::AclSetUser,
        arity: -3,
        summary: "Creates or changes a user: on/off, >password, ~namespace-pattern, +@category, \
                  -command, ...",
        complexity: "O(N), N the rules",
        args: &[
            arg("username", ArgType::String),
            arg("rule", ArgType::String).optional().multiple(),
        ],
        ..ADMIN
    },
    CommandSpec {
        name: "acl|deluser",
        cmd: Cmd::AclDelUser,
        arity: -3,
        summary: "Deletes users.",
        complexity: "O(N), N the clients (a deleted user's are closed)",
        args: &[arg("username", ArgType::String).multiple()],
        ..ADMIN
    },
    CommandSpec {
        name: "acl|list",
        cmd: Cmd::AclList,
        arity: 2,
        summary: "Lists the users and their rules.",
        complexity: "O(N), N the users",
        ..ADMIN
    },
    CommandSpec {
        name: "acl|users",
        cmd: Cmd::AclUsers,
        arity: 2,
        summary: "Lists the user names.",
        complexity: "O(N), N the users",
        ..ADMIN
    },
    CommandSpec {
        name: "acl|whoami",
        cmd: Cmd::AclWhoami,
        arity: 2,
        flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale]),
        acl: AclCats::of(&[AclCat::Slow]),
        summary: "Returns the user of the connection.",
        complexity: "O(1)",
        ..SERVER
    },
    CommandSpec {
        name: "acl|cat",
        cmd: Cmd::AclCat,
        arity: -2,
        flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale]),
        acl: AclCats::of(&[AclCat::Slow]),
        summary: "Lists the categories, or the commands of one.",
        complexity: "O(1)",
        args: &[arg("category", ArgType::String).optional()],
        ..SERVER
    },
    CommandSpec {
        name: "acl|load",
        cmd: Cmd::AclLoad,
        arity: 2,
        summary: "Reloads the users from the ACL file.",
        complexity: "O(N), N the users in the file",
        ..ADMIN
    },
    CommandSpec {
        name: "acl|save",
        cmd: Cmd::AclSave,
        arity: 2,
        summary: "Writes the users to the ACL file.",
        complexity: "O(N), N the users",
        ..ADMIN
    },
    CommandSpec {
        name: "acl|help",
        ..HELP
    },
];

static CLUSTER_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "cluster|slots",
        cmd: Cmd::ClusterSlots,
        summary: "Returns the slot range 0-16383 with the nodes that serve it, master first.",
        complexity: "O(N), N the nodes",
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|shards",
        cmd: Cmd::ClusterShards,
        summary: "Returns the shard (slots 0-16383) and its nodes.",
        complexity: "O(N), N the nodes",
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|nodes",
        cmd: Cmd::ClusterNodes,
        summary: "Returns the cluster's nodes, one line each, in Redis Cluster's format.",
        complexity: "O(N), N the nodes",
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|info",
        cmd: Cmd::ClusterInfo,
        summary: "Returns the cluster's state in Redis 7.0's fields (cluster_state is ok while a \
                  leader serves the slots); as in Redis 7.0, cluster_enabled:1 is in INFO \
                  cluster, not here.",
        complexity: "O(1)",
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|myid",
        cmd: Cmd::ClusterMyId,
        summary: "Returns this node's id.",
        complexity: "O(1)",
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|keyslot",
        cmd: Cmd::ClusterKeySlot,
        arity: 3,
        summary: "Returns the hash slot of a key (a namespace): CRC16 of its {hash tag} or of it.",
        complexity: "O(N), N the bytes of the key",
        args: &[arg("key", ArgType::String)],
        ..CLUSTER
    },
    CommandSpec {
        name: "cluster|help",
        group: "cluster",
        ..HELP
    },
];

static CONFIG_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "config|get",
        cmd: Cmd::ConfigGet,
        arity: -3,
        summary: "Returns the effective values of server options.",
        complexity: "O(N), N the options",
        args: &[arg("parameter", ArgType::String).multiple()],
        ..ADMIN
    },
    CommandSpec {
        name: "config|resetstat",
        cmd: Cmd::ConfigResetStat,
        arity: 2,
        summary: "Resets the per-command statistics (INFO commandstats, errorstats, latencystats).",
        complexity: "O(1)",
        ..ADMIN
    },
    CommandSpec {
        name: "config|help",
        ..HELP
    },
];

static SLOWLOG_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "slowlog|get",
        cmd: Cmd::SlowlogGet,
        arity: -2,
        summary: "Returns the newest entries of the slow log (10 by default, -1 for all).",
        complexity: "O(N), N the entries returned",
        args: &[arg("count", ArgType::Integer).optional()],
        ..ADMIN
    },
    CommandSpec {
        name: "slowlog|len",
        cmd: Cmd::SlowlogLen,
        arity: 2,
        summary: "Returns the number of entries in the slow log.",
        complexity: "O(1)",
        ..ADMIN
    },
    CommandSpec {
        name: "slowlog|reset",
        cmd: Cmd::SlowlogReset,
        arity: 2,
        summary: "Empties the slow log.",
        complexity: "O(N), N the entries",
        ..ADMIN
    },
    CommandSpec {
        name: "slowlog|help",
        ..HELP
    },
];

static LATENCY_SUBS: &[CommandSpec] = &[
    CommandSpec {
        name: "latency|latest",
        cmd: Cmd::LatencyLatest,
        arity: 2,
        summary: "Returns each event's latest latency spike and its worst.",
        complexity: "O(1)",
        ..ADMIN
    },
    CommandSpec {
        name: "latency|history",
        cmd: Cmd::LatencyHistory,
        arity: 3,
        summary: "Returns an event's latency spikes, one per second, oldest first.",
        complexity: "O(N), N the spikes kept",
        args: &[arg("event", ArgType::String)],
        ..ADMIN
    },
    CommandSpec {
        name: "latency|reset",
        cmd: Cmd::LatencyReset,
        arity: -2,
        summary: "Forgets the named events' spikes (all events when none is named).",
        complexity: "O(1)",
        args: &[arg("event", ArgType::String).optional().multiple()],
        ..ADMIN
    },
    CommandSpec {
        name: "latency|help",
        ..HELP
    },
];

/// Every command, in the order the docs list them.
pub static COMMANDS: &[CommandSpec] = &[
    CommandSpec {
        name: "ns.create",
        cmd: Cmd::NsCreate,
        arity: -2,
        summary: "Creates a namespace.",
        complexity: "O(log N)",
        args: &[NS, DESC, META],
        ..ENGINE_ADD
    },
    CommandSpec {
        name: "ns.get",
        cmd: Cmd::NsGet,
        arity: 2,
        summary: "Returns a namespace.",
        complexity: "O(log N)",
        args: &[NS],
        ..ENGINE_READ
    },
    CommandSpec {
        name: "ns.list",
        cmd: Cmd::NsList,
        arity: -1,
        first_key: 0,
        summary: "Lists namespaces in name order, one page at a time.",
        complexity: "O(log N + M) per shard, M the page size; O(N) for a user with ~patterns",
        args: &[CURSOR, LIMIT],
        ..ENGINE_LISTING
    },
    CommandSpec {
        name: "ns.update",
        cmd: Cmd::NsUpdate,
        arity: -4,
        summary: "Replaces a namespace's description and metadata if its version matches.",
        complexity: "O(log N)",
        args: &[NS, VERSION, DESC, META],
        ..ENGINE_ADD
    },
    CommandSpec {
        name: "ns.delete",
        cmd: Cmd::NsDelete,
        arity: 2,
        flags: Flags::of(&[Flag::Write]),
        acl: AclCats::of(&[
            AclCat::Write,
            AclCat::Semaphore,
            AclCat::Slow,
            AclCat::Dangerous,
        ]),
        summary: "Deletes a namespace and everything in it.",
        complexity: "O(N), N what the namespace holds",
        args: &[NS],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "sem.create",
        cmd: Cmd::SemCreate,
        arity: -4,
        summary: "Creates a semaphore with a number of permits.",
        complexity: "O(log N)",
        args: &[NS, SEM, arg("permits", ArgType::Integer), DESC, META],
        ..ENGINE_ADD
    },
    CommandSpec {
        name: "sem.get",
        cmd: Cmd::SemGet,
        arity: 3,
        summary: "Returns a semaphore.",
        complexity: "O(log N)",
        args: &[NS, SEM],
        ..ENGINE_READ
    },
    CommandSpec {
        name: "sem.list",
        cmd: Cmd::SemList,
        arity: -2,
        summary: "Lists a namespace's semaphores in name order, one page at a time.",
        complexity: "O(log N + M), M the page size",
        args: &[NS, CURSOR, LIMIT],
        ..ENGINE_LISTING
    },
    CommandSpec {
        name: "sem.update",
        cmd: Cmd::SemUpdate,
        arity: -6,
        summary: "Changes a semaphore's permits, description and metadata if its version matches.",
        complexity: "O(log N + W), W its parked acquires",
        args: &[
            NS,
            SEM,
            arg("permits", ArgType::Integer),
            VERSION,
            DESC,
            META,
        ],
        ..ENGINE_ADD
    },
    CommandSpec {
        name: "sem.delete",
        cmd: Cmd::SemDelete,
        arity: 3,
        summary: "Deletes a semaphore; its parked acquires end with NOTFOUND.",
        complexity: "O(log N + H + W), H its holders, W its parked acquires",
        args: &[NS, SEM],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "sem.acquire",
        cmd: Cmd::SemAcquire,
        arity: -6,
        flags: Flags::of(&[Flag::Write, Flag::DenyOom, Flag::Blocking]),
        acl: AclCats::of(&[AclCat::Write, AclCat::Semaphore, AclCat::Blocking]),
        summary: "Acquires weight permits under a lease, waiting up to timeout seconds (FIFO).",
        complexity: "O(log N + K), K the parked acquires a smaller hold lets in",
        args: &[
            NS,
            SEM,
            LEASE,
            arg("weight", ArgType::Integer),
            arg("timeout", ArgType::Double),
            META,
        ],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "sem.acquireall",
        cmd: Cmd::SemAcquireAll,
        arity: -6,
        flags: Flags::of(&[Flag::Write, Flag::DenyOom, Flag::Blocking]),
        acl: AclCats::of(&[AclCat::Write, AclCat::Semaphore, AclCat::Blocking]),
        summary:
            "Acquires permits of several semaphores under a lease, all or none, waiting up to \
                  timeout seconds (FIFO by arrival across them).",
        complexity: "O(S log N + K), S the semaphores, K the parked acquires it lets in",
        args: &[
            NS,
            LEASE,
            arg("timeout", ArgType::Double),
            block(
                "hold",
                &[
                    arg("semaphore", ArgType::String),
                    arg("weight", ArgType::Integer),
                ],
            )
            .multiple(),
            META,
        ],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "sem.release",
        cmd: Cmd::SemRelease,
        arity: 4,
        summary: "Releases a lease's hold on a semaphore.",
        complexity: "O(log N + K), K the parked acquires it lets in",
        args: &[NS, SEM, LEASE],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "sem.holders",
        cmd: Cmd::SemHolders,
        arity: -3,
        summary: "Lists a semaphore's holders, oldest first, one page at a time.",
        complexity: "O(log N + M), M the page size",
        args: &[NS, SEM, CURSOR, LIMIT],
        ..ENGINE_LISTING
    },
    CommandSpec {
        name: "sem.waiters",
        cmd: Cmd::SemWaiters,
        arity: -3,
        summary:
            "Lists a semaphore's parked acquires in the order they are served, one page at a time.",
        complexity: "O(log N + M), M the page size",
        args: &[NS, SEM, CURSOR, LIMIT],
        ..ENGINE_LISTING
    },
    CommandSpec {
        name: "lease.create",
        cmd: Cmd::LeaseCreate,
        arity: -4,
        summary: "Creates a lease that lives ttl seconds unless refreshed.",
        complexity: "O(log N)",
        args: &[
            NS,
            arg("process-id", ArgType::String),
            arg("ttl", ArgType::Integer),
            META,
        ],
        ..ENGINE_ADD
    },
    CommandSpec {
        name: "lease.get",
        cmd: Cmd::LeaseGet,
        arity: 3,
        summary: "Returns a live lease.",
        complexity: "O(log N)",
        args: &[NS, LEASE],
        ..ENGINE_READ
    },
    CommandSpec {
        name: "lease.list",
        cmd: Cmd::LeaseList,
        arity: -2,
        summary: "Lists a namespace's live leases in creation order, one page at a time.",
        complexity: "O(log N + M), M the page size; O(N) with PROCESS",
        args: &[
            NS,
            opt("process-id", ArgType::String, "PROCESS"),
            CURSOR,
            LIMIT,
        ],
        ..ENGINE_LISTING
    },
    CommandSpec {
        name: "lease.refresh",
        cmd: Cmd::LeaseRefresh,
        arity: 4,
        summary: "Extends a live lease to now + ttl, with all its holds.",
        complexity: "O(log N)",
        args: &[NS, LEASE, arg("ttl", ArgType::Integer)],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "lease.revoke",
        cmd: Cmd::LeaseRevoke,
        arity: 3,
        summary: "Releases every hold of a lease and deletes it.",
        complexity: "O(H log N + K), H its holds and parked acquires, K the acquires it lets in",
        args: &[NS, LEASE],
        ..ENGINE_WRITE
    },
    CommandSpec {
        name: "ping",
        cmd: Cmd::Ping,
        arity: -1,
        flags: Flags::of(&[Flag::Fast, Flag::Stale]),
        summary: "Returns the server's liveliness response.",
        args: &[arg("message", ArgType::String).optional()],
        ..CONNECTION
    },
    CommandSpec {
        name: "echo",
        cmd: Cmd::Echo,
        arity: 2,
        flags: Flags::of(&[Flag::Fast, Flag::Loading, Flag::Stale]),
        summary: "Returns the given string.",
        args: &[arg("message", ArgType::String)],
        ..CONNECTION
    },
    CommandSpec {
        name: "quit",
        cmd: Cmd::Quit,
        arity: -1,
        summary: "Closes the connection.",
        ..BEFORE_AUTH
    },
    CommandSpec {
        name: "reset",
        cmd: Cmd::Reset,
        arity: 1,
        summary: "Resets the connection.",
        ..BEFORE_AUTH
    },
    CommandSpec {
        name: "select",
        cmd: Cmd::Select,
        arity: 2,
        flags: Flags::of(&[Flag::Loading, Flag::Stale, Flag::Fast]),
        summary: "Changes the selected database (only 0 exists).",
        args: &[arg("index", ArgType::Integer)],
        ..CONNECTION
    },
    CommandSpec {
        name: "auth",
        cmd: Cmd::Auth,
        arity: -2,
        summary: "Authenticates the connection.",
        args: &[
            arg("username", ArgType::String).optional(),
            arg("password", ArgType::String),
        ],
        ..BEFORE_AUTH
    },
    CommandSpec {
        name: "hello",
        cmd: Cmd::Hello,
        arity: -1,
        summary: "Handshakes with the server: protocol version, authentication, name.",
        args: &[block(
            "arguments",
            &[
                arg("protover", ArgType::Integer),
                Arg {
                    token: Some("AUTH"),
                    ..block(
                        "auth",
                        &[
                            arg("username", ArgType::String),
                            arg("password", ArgType::String),
                        ],
                    )
                }
                .optional(),
                opt("clientname", ArgType::String, "SETNAME"),
            ],
        )
        .optional()],
        ..BEFORE_AUTH
    },
    CommandSpec {
        name: "client",
        cmd: Cmd::Client,
        group: "connection",
        summary: "A container for client connection commands.",
        subcommands: CLIENT_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "command",
        cmd: Cmd::Command,
        arity: -1,
        summary: "Returns detailed information about all commands.",
        complexity: "O(N), N the commands",
        subcommands: COMMAND_SUBS,
        ..INTROSPECTION
    },
    CommandSpec {
        name: "info",
        cmd: Cmd::Info,
        arity: -1,
        acl: AclCats::of(&[AclCat::Slow, AclCat::Dangerous]),
        summary: "Returns information and statistics about the server.",
        complexity: "O(N), N the namespaces and semaphores",
        args: &[arg("section", ArgType::String).optional().multiple()],
        ..INTROSPECTION
    },
    CommandSpec {
        name: "time",
        cmd: Cmd::Time,
        arity: 1,
        flags: Flags::of(&[Flag::Loading, Flag::Stale, Flag::Fast]),
        acl: AclCats::of(&[AclCat::Fast]),
        summary: "Returns the server's time: Unix seconds and microseconds.",
        complexity: "O(1)",
        ..SERVER
    },
    CommandSpec {
        name: "monitor",
        cmd: Cmd::Monitor,
        arity: 1,
        flags: Flags::of(&[
            Flag::Admin,
            Flag::Noscript,
            Flag::Loading,
            Flag::Stale,
            Flag::NoMulti,
        ]),
        summary: "Shows every command the server runs as it runs it (lease ids redacted).",
        complexity: "O(1)",
        ..ADMIN
    },
    CommandSpec {
        name: "slowlog",
        cmd: Cmd::Slowlog,
        summary: "A container for slow log commands.",
        subcommands: SLOWLOG_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "latency",
        cmd: Cmd::Latency,
        summary: "A container for latency monitor commands.",
        subcommands: LATENCY_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "role",
        cmd: Cmd::Role,
        arity: 1,
        flags: Flags::of(&[Flag::Noscript, Flag::Loading, Flag::Stale, Flag::Fast]),
        acl: AclCats::of(&[AclCat::Admin, AclCat::Fast, AclCat::Dangerous]),
        summary: "Returns this node's replication role: master on the leader.",
        complexity: "O(1)",
        ..SERVER
    },
    CommandSpec {
        name: "acl",
        cmd: Cmd::Acl,
        summary: "A container for access control commands.",
        subcommands: ACL_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "config",
        cmd: Cmd::Config,
        summary: "A container for server configuration commands.",
        subcommands: CONFIG_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "shutdown",
        cmd: Cmd::Shutdown,
        arity: -1,
        flags: Flags::of(&[
            Flag::Admin,
            Flag::Noscript,
            Flag::Loading,
            Flag::Stale,
            Flag::NoMulti,
            Flag::AllowBusy,
        ]),
        summary: "Stops the server after flushing its state.",
        complexity: "O(N), N the changes not yet on disk",
        args: &[one_of(
            "save-selector",
            &[token("nosave", "NOSAVE"), token("save", "SAVE")],
        )
        .optional()],
        ..ADMIN
    },
    CommandSpec {
        name: "debug",
        cmd: Cmd::Debug,
        arity: -2,
        summary:
            "Debugging: PANIC crashes the server. Refused unless --enable-debug-command allows it.",
        complexity: "O(1)",
        args: &[arg("subcommand", ArgType::String)],
        ..ADMIN
    },
    CommandSpec {
        name: "multi",
        cmd: Cmd::Multi,
        summary: "Starts a transaction (one namespace).",
        complexity: "O(1)",
        ..TRANSACTION
    },
    CommandSpec {
        name: "exec",
        cmd: Cmd::Exec,
        flags: Flags::of(&[
            Flag::Noscript,
            Flag::Loading,
            Flag::Stale,
            Flag::SkipSlowlog,
        ]),
        acl: AclCats::of(&[AclCat::Slow, AclCat::Transaction]),
        summary: "Executes all commands of a transaction atomically.",
        complexity: "Depends on the queued commands.",
        ..TRANSACTION
    },
    CommandSpec {
        name: "discard",
        cmd: Cmd::Discard,
        summary: "Discards a transaction.",
        complexity: "O(N), N the queued commands",
        ..TRANSACTION
    },
    CommandSpec {
        name: "cluster",
        cmd: Cmd::Cluster,
        group: "cluster",
        summary: "A container for the cluster topology commands.",
        subcommands: CLUSTER_SUBS,
        ..CONTAINER
    },
    CommandSpec {
        name: "readonly",
        cmd: Cmd::ReadOnly,
        summary: "Accepted: every node serves reads and writes alike.",
        ..READ_MODE
    },
    CommandSpec {
        name: "readwrite",
        cmd: Cmd::ReadWrite,
        summary: "Accepted: every node serves reads and writes alike.",
        ..READ_MODE
    },
];

/// Finds a top-level command by name, any case.
pub fn lookup(name: &[u8]) -> Option<&'static CommandSpec> {
    COMMANDS
        .iter()
        .find(|c| c.name.as_bytes().eq_ignore_ascii_case(name))
}

/// Every command and subcommand, each container before its subcommands.
pub fn all_specs() -> impl Iterator<Item = &'static CommandSpec> {
    COMMANDS
        .iter()
        .flat_map(|c| std::iter::once(c).chain(c.subcommands))
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
    fn entries_fill_in_their_own_fields() {
        let mut names = std::collections::HashSet::new();
        let mut cmds = std::collections::HashSet::new();
        for c in COMMANDS {
            for s in c.subcommands {
                assert!(s.name.starts_with(&format!("{}|", c.name)), "{}", s.name);
            }
        }
        for s in all_specs() {
            assert!(
                names.insert(s.name) && !s.name.is_empty(),
                "name {:?}",
                s.name
            );
            assert!(s.arity != 0, "{}: arity", s.name);
            assert!(!s.summary.is_empty(), "{}: summary", s.name);
            assert!(!s.complexity.is_empty(), "{}: complexity", s.name);
            assert!(!s.group.is_empty(), "{}: group", s.name);
            // Only the unsupported CLIENT subcommands, and the HELP of each container, share a
            // handler.
            if s.cmd != Cmd::ClientUnsupported && s.cmd != Cmd::Help {
                assert!(cmds.insert(s.cmd), "{}: {:?} twice", s.name, s.cmd);
            }
        }
    }

    #[test]
    fn usage_lines_show_options() {
        assert_eq!(
            lookup(b"sem.acquire").unwrap().usage(),
            "SEM.ACQUIRE namespace semaphore lease weight timeout [META key value [key value ...]]"
        );
    }
}
