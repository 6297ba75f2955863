//! Server options: command line (clap), each also readable from a `PERMITD_*` variable.

use std::path::PathBuf;

use clap::Parser;

use crate::cluster::config::{default_cluster_port, split_host_port};
use crate::engine::types::Limits;
use crate::persist::Fsync;
use crate::protocol::RequestLimits;

/// permitd: distributed weighted semaphores held under leases, over the Redis protocol.
#[derive(Parser, Debug, Clone)]
#[command(name = "permitd", version, about, long_about = None)]
pub struct Config {
    /// Address to listen on. The default accepts only local clients.
    #[arg(long, env = "PERMITD_BIND", default_value = "127.0.0.1")]
    pub bind: String,

    /// TCP port to listen on (0 picks a free one and logs it).
    #[arg(long, env = "PERMITD_PORT", default_value_t = 6379)]
    pub port: u16,

    /// Number of engine shards (threads); 0 means one per core.
    #[arg(long, env = "PERMITD_SHARDS", default_value_t = 0)]
    pub shards: usize,

    /// Directory for the data files.
    #[arg(long, env = "PERMITD_DIR", default_value = "./data")]
    pub dir: PathBuf,

    /// When the log reaches the disk: `always` (a reply waits for its change to be on disk;
    /// group commit), `everysec` (about once a second: a crash of the machine may lose the last
    /// second), `no` (when the OS decides).
    #[arg(long, env = "PERMITD_FSYNC", value_enum, default_value_t = Fsync::Always)]
    pub fsync: Fsync,

    /// Start even if a log is corrupt before its end, truncating it at the first bad record
    /// (the records from there on are lost), as redis-check-aof --fix does.
    #[arg(long, env = "PERMITD_REPAIR_LOG", default_value_t = false)]
    pub repair_log: bool,

    /// Log size (bytes) past which a shard writes a snapshot and starts a new log.
    #[arg(long, env = "PERMITD_SNAPSHOT_THRESHOLD", default_value_t = 64 * 1024 * 1024)]
    pub snapshot_threshold: u64,

    /// Password of the default user; when set, clients must AUTH first.
    #[arg(long, env = "PERMITD_REQUIREPASS")]
    pub requirepass: Option<String>,

    /// An ACL file: one `user <name> <rules...>` line per user, as Redis's (ACL LOAD/SAVE).
    #[arg(long, env = "PERMITD_ACLFILE")]
    pub aclfile: Option<PathBuf>,

    /// With no password on the default user, accept connections only from 127.0.0.1 and ::1.
    #[arg(long, env = "PERMITD_PROTECTED_MODE", default_value = "yes", value_parser = yes_no,
          action = clap::ArgAction::Set)]
    pub protected_mode: bool,

    /// A second port that speaks TLS (clients use rediss://); needs the cert and key files.
    #[arg(long, env = "PERMITD_TLS_PORT")]
    pub tls_port: Option<u16>,

    /// The server's certificate chain (PEM).
    #[arg(long, env = "PERMITD_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,

    /// The server's private key (PEM).
    #[arg(long, env = "PERMITD_TLS_KEY_FILE")]
    pub tls_key_file: Option<PathBuf>,

    /// CA certificates (PEM) for client certificates: when set, TLS clients must present a
    /// certificate signed by one of them.
    #[arg(long, env = "PERMITD_TLS_CA_CERT_FILE")]
    pub tls_ca_cert_file: Option<PathBuf>,

    /// Most client connections at once; more get `ERR max number of clients reached`.
    #[arg(long, env = "PERMITD_MAXCLIENTS", default_value_t = 10_000)]
    pub maxclients: usize,

    /// Memory the server may use (resident set) before commands that would add state answer
    /// `-OOM` (reads, releases, revokes and deletes go on), in bytes or with Redis's units
    /// (`100mb`, `2gb`); 0 (the default, as Redis): no limit.
    #[arg(long, env = "PERMITD_MAXMEMORY", default_value = "0", value_parser = memory_size)]
    pub maxmemory: u64,

    /// Close a client idle (no command, not parked) for this many seconds; 0 never does.
    #[arg(long, env = "PERMITD_TIMEOUT", default_value_t = 0)]
    pub timeout: u64,

    /// Log in SLOWLOG the commands that run this many microseconds or longer (0: every
    /// command; negative: none), as Redis's `slowlog-log-slower-than`.
    #[arg(
        long,
        env = "PERMITD_SLOWLOG_LOG_SLOWER_THAN",
        default_value_t = 10_000,
        allow_negative_numbers = true
    )]
    pub slowlog_log_slower_than: i64,

    /// Most entries SLOWLOG keeps (the oldest go first), as Redis's `slowlog-max-len`.
    #[arg(long, env = "PERMITD_SLOWLOG_MAX_LEN", default_value_t = 128)]
    pub slowlog_max_len: usize,

    /// Record in the latency monitor (LATENCY LATEST) the commands that run this many
    /// milliseconds or longer; 0 turns it off, as Redis's `latency-monitor-threshold`.
    #[arg(long, env = "PERMITD_LATENCY_MONITOR_THRESHOLD", default_value_t = 0)]
    pub latency_monitor_threshold: u64,

    /// TCP keepalive probe interval in seconds (0: off), so dead peers are found and dropped.
    #[arg(long, env = "PERMITD_TCP_KEEPALIVE", default_value_t = 300)]
    pub tcp_keepalive: u64,

    /// Disconnect a client whose replies could not be written for this many seconds (it stopped
    /// reading); 0 never does.
    #[arg(long, env = "PERMITD_CLIENT_OUTPUT_TIMEOUT", default_value_t = 60)]
    pub client_output_timeout: u64,

    /// Most bytes of replies buffered for one client before it is disconnected (Redis's
    /// `client-output-buffer-limit` hard limit); 0 means none. permitd keeps reading a client
    /// while its replies wait, so that a pipeline written before any reply is read completes;
    /// this bounds what a client that reads slowly or never costs.
    #[arg(long, env = "PERMITD_CLIENT_OUTPUT_BUFFER_LIMIT", default_value_t = 64 * 1024 * 1024)]
    pub client_output_buffer_limit: usize,

    /// Serve Prometheus metrics (`GET /metrics`) and a health check (`GET /health`) over HTTP
    /// on this port of the bind address (0 picks a free one and logs it); off when unset.
    #[arg(long, env = "PERMITD_METRICS_PORT")]
    pub metrics_port: Option<u16>,

    /// Most semaphores (and namespaces) with series of their own in `/metrics`, the busiest
    /// first, so that many semaphores cannot flood the scraper.
    #[arg(long, env = "PERMITD_METRICS_MAX_SEMAPHORES", default_value_t = 1000)]
    pub metrics_max_semaphores: usize,

    /// Log filter (`error`, `warn`, `info`, `debug`, `trace`, or a tracing directive).
    #[arg(long, env = "PERMITD_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Longest bulk argument a client may send, bytes (Redis's proto-max-bulk-len).
    #[arg(long, env = "PERMITD_PROTO_MAX_BULK_LEN", default_value_t = 4 * 1024 * 1024)]
    pub proto_max_bulk_len: usize,

    /// Most arguments in one request.
    #[arg(long, env = "PERMITD_PROTO_MAX_MULTIBULK_LEN", default_value_t = 1024 * 1024)]
    pub proto_max_multibulk_len: usize,

    /// Most unparsed bytes buffered for one client before it is disconnected.
    #[arg(long, env = "PERMITD_CLIENT_QUERY_BUFFER_LIMIT", default_value_t = 64 * 1024 * 1024)]
    pub client_query_buffer_limit: usize,

    /// Longest namespace or semaphore name, bytes.
    #[arg(long, env = "PERMITD_MAX_NAME_LEN", default_value_t = 128)]
    pub max_name_len: usize,

    /// Longest process_id, bytes.
    #[arg(long, env = "PERMITD_MAX_PROCESS_ID_LEN", default_value_t = 128)]
    pub max_process_id_len: usize,

    /// Longest description, bytes.
    #[arg(long, env = "PERMITD_MAX_DESCRIPTION_LEN", default_value_t = 1024)]
    pub max_description_len: usize,

    /// Most metadata entries on one entity.
    #[arg(long, env = "PERMITD_MAX_METADATA_ENTRIES", default_value_t = 32)]
    pub max_metadata_entries: usize,

    /// Longest metadata key, bytes.
    #[arg(long, env = "PERMITD_MAX_METADATA_KEY_LEN", default_value_t = 128)]
    pub max_metadata_key_len: usize,

    /// Longest metadata value, bytes.
    #[arg(long, env = "PERMITD_MAX_METADATA_VALUE_LEN", default_value_t = 256)]
    pub max_metadata_value_len: usize,

    /// Shortest lease ttl, seconds.
    #[arg(long, env = "PERMITD_MIN_LEASE_TTL", default_value_t = 1,
          value_parser = clap::value_parser!(i64).range(1..=LONGEST_SECS))]
    pub min_lease_ttl: i64,

    /// Longest lease ttl, seconds (at most 100 years).
    #[arg(long, env = "PERMITD_MAX_LEASE_TTL", default_value_t = 300,
          value_parser = clap::value_parser!(i64).range(1..=LONGEST_SECS))]
    pub max_lease_ttl: i64,

    /// Longest SEM.ACQUIRE timeout, seconds (at most 100 years).
    #[arg(long, env = "PERMITD_MAX_ACQUIRE_TIMEOUT", default_value_t = 300.0,
          value_parser = seconds)]
    pub max_acquire_timeout: f64,

    /// Most namespaces on the server.
    #[arg(long, env = "PERMITD_MAX_NAMESPACES", default_value_t = 100_000)]
    pub max_namespaces: usize,

    /// Most semaphores in one namespace.
    #[arg(
        long,
        env = "PERMITD_MAX_SEMAPHORES_PER_NAMESPACE",
        default_value_t = 1_000_000
    )]
    pub max_semaphores_per_namespace: usize,

    /// Most leases in one namespace.
    #[arg(
        long,
        env = "PERMITD_MAX_LEASES_PER_NAMESPACE",
        default_value_t = 1_000_000
    )]
    pub max_leases_per_namespace: usize,

    /// Most holders of one semaphore.
    #[arg(
        long,
        env = "PERMITD_MAX_HOLDERS_PER_SEMAPHORE",
        default_value_t = 1_000
    )]
    pub max_holders_per_semaphore: usize,

    /// Most parked acquires on one semaphore.
    #[arg(
        long,
        env = "PERMITD_MAX_WAITERS_PER_SEMAPHORE",
        default_value_t = 100_000
    )]
    pub max_waiters_per_semaphore: usize,

    /// Most parked acquires on the whole server.
    #[arg(long, env = "PERMITD_MAX_WAITERS", default_value_t = 1_000_000)]
    pub max_waiters: usize,

    /// Who may run DEBUG (DEBUG PANIC crashes the server, to test restarts): `no`, `yes`, or
    /// `local` (clients on 127.0.0.1 or ::1), as Redis's option of the same name.
    #[arg(long, env = "PERMITD_ENABLE_DEBUG_COMMAND", value_enum, default_value_t = Protected::No)]
    pub enable_debug_command: Protected,

    /// Cluster mode (SPEC §10): this node's id in its cluster, an integer >= 1, unique and
    /// never reused. Without it the server is a single node and the other `--cluster-*`
    /// options are refused.
    #[arg(long, env = "PERMITD_CLUSTER_NODE_ID", value_parser = clap::value_parser!(u64).range(1..))]
    pub cluster_node_id: Option<u64>,

    /// Cluster mode: the port peers reach this node on (default `--port` + 10000).
    #[arg(long, env = "PERMITD_CLUSTER_PORT")]
    pub cluster_port: Option<u16>,

    /// Cluster mode: the client address (`host:port`) the other nodes send clients to, in
    /// `MOVED` and `CLUSTER SLOTS` (default `--bind` and `--port`; with an unspecified `--bind`
    /// such as 0.0.0.0, the one `--cluster-init` named). Give it for a node behind NAT or a port
    /// mapping. The node has the leader record it in the membership.
    #[arg(long, env = "PERMITD_CLUSTER_ANNOUNCE", value_parser = host_port)]
    pub cluster_announce: Option<String>,

    /// Cluster mode: the IP address the cluster port listens on and peers are dialed from
    /// (default `--bind`): a separate network for peer traffic.
    #[arg(long, env = "PERMITD_CLUSTER_BIND")]
    pub cluster_bind: Option<String>,

    /// Cluster mode: the secret every peer must prove it knows; required unless every peer
    /// address is loopback. Prefer `--cluster-secret-file`: a command line is visible to every
    /// user of the machine.
    #[arg(
        long,
        env = "PERMITD_CLUSTER_SECRET",
        conflicts_with = "cluster_secret_file"
    )]
    pub cluster_secret: Option<String>,

    /// Cluster mode: a file holding the cluster secret (its first line).
    #[arg(long, env = "PERMITD_CLUSTER_SECRET_FILE")]
    pub cluster_secret_file: Option<PathBuf>,

    /// Cluster mode: this node's certificate chain (PEM) for the cluster port. With
    /// `--cluster-tls-key-file` and `--cluster-tls-ca-cert-file`, peer traffic is TLS with
    /// mutual authentication (required unless every peer address is loopback). The
    /// certificate must name the host peers dial (the `--cluster-init` host), for use as both
    /// TLS server and client.
    #[arg(long, env = "PERMITD_CLUSTER_TLS_CERT_FILE")]
    pub cluster_tls_cert_file: Option<PathBuf>,

    /// Cluster mode: the private key (PEM) of `--cluster-tls-cert-file`.
    #[arg(long, env = "PERMITD_CLUSTER_TLS_KEY_FILE")]
    pub cluster_tls_key_file: Option<PathBuf>,

    /// Cluster mode: the CA certificates (PEM) that sign the cluster's peer certificates; a
    /// peer presenting any other is refused.
    #[arg(long, env = "PERMITD_CLUSTER_TLS_CA_CERT_FILE")]
    pub cluster_tls_ca_cert_file: Option<PathBuf>,

    /// Cluster mode: forms a new cluster of the voters named, this node included:
    /// `ID=host:port[@cport],...` (cport defaults to port + 10000). Exactly one node, once, on
    /// an empty `--dir`.
    #[arg(long, env = "PERMITD_CLUSTER_INIT")]
    pub cluster_init: Option<String>,

    /// Cluster mode: how long past its promotion a new leader keeps every lease that was
    /// alive at the cluster's last committed instant, seconds (0: strict, no grace). A holder
    /// whose heartbeats went unanswered during the failover keeps its permits meanwhile.
    #[arg(long, env = "PERMITD_FAILOVER_LEASE_GRACE", default_value_t = 2.0,
          value_parser = seconds)]
    pub failover_lease_grace: f64,
}

/// Who may run a protected command (Redis's `enable-debug-command` values).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protected {
    /// Nobody.
    No,
    /// Every client its ACL lets run it.
    Yes,
    /// Only clients connected from this machine.
    Local,
}

impl Protected {
    /// Whether a client may run the command (`local`: it connects from this machine).
    pub fn allows(self, local: bool) -> bool {
        match self {
            Protected::No => false,
            Protected::Yes => true,
            Protected::Local => local,
        }
    }

    /// The option's spelling, for CONFIG GET.
    pub fn as_str(self) -> &'static str {
        match self {
            Protected::No => "no",
            Protected::Yes => "yes",
            Protected::Local => "local",
        }
    }
}

/// The longest lease ttl or acquire timeout an option may allow: 100 years. A lease's death
/// time is `now + ttl` in nanoseconds since 1970, which must fit an i64 (292 years); past about
/// 9.2e9 s, `ttl * 1e9` alone overflowed, and a lease was acknowledged with a negative
/// `expires_at`, dead at once.
const LONGEST_SECS: i64 = 100 * 365 * 24 * 3600;

/// Parses a duration option in seconds, fractions allowed, from 0 to [`LONGEST_SECS`].
fn seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(0.0..=LONGEST_SECS as f64).contains(&v) {
        return Err(format!("{s} is not in 0..={LONGEST_SECS} seconds"));
    }
    Ok(v)
}

/// Parses a memory size as Redis reads one (`memtoll`): a number of bytes, or with a unit: `k`,
/// `m`, `g` for powers of 1000 and `kb`, `mb`, `gb` for powers of 1024, any case.
fn memory_size(s: &str) -> Result<u64, String> {
    let lower = s.to_ascii_lowercase();
    let digits = lower.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit: u64 = match &lower[digits.len()..] {
        "" | "b" => 1,
        "k" => 1_000,
        "kb" => 1 << 10,
        "m" => 1_000_000,
        "mb" => 1 << 20,
        "g" => 1_000_000_000,
        "gb" => 1 << 30,
        other => return Err(format!("unknown unit '{other}' (b, k, kb, m, mb, g, gb)")),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a memory size"))?;
    n.checked_mul(unit)
        .ok_or_else(|| format!("'{s}' is too large"))
}

/// Checks a `host:port` address (an IPv6 host in brackets).
fn host_port(s: &str) -> Result<String, String> {
    split_host_port(s)
        .map(|_| s.to_string())
        .map_err(|why| format!("'{s}': {why} (want host:port)"))
}

/// Parses Redis's `yes` / `no` (also true/false).
fn yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "true" | "1" => Ok(true),
        "no" | "false" | "0" => Ok(false),
        _ => Err(format!("expected yes or no, got '{s}'")),
    }
}

impl Config {
    /// The engine limits these options set.
    pub fn limits(&self) -> Limits {
        Limits {
            max_name_len: self.max_name_len,
            max_process_id_len: self.max_process_id_len,
            max_description_len: self.max_description_len,
            max_metadata_entries: self.max_metadata_entries,
            max_metadata_key_len: self.max_metadata_key_len,
            max_metadata_value_len: self.max_metadata_value_len,
            min_lease_ttl: self.min_lease_ttl,
            max_lease_ttl: self.max_lease_ttl,
            max_acquire_timeout: self.max_acquire_timeout,
            max_namespaces: self.max_namespaces,
            max_semaphores_per_namespace: self.max_semaphores_per_namespace,
            max_leases_per_namespace: self.max_leases_per_namespace,
            max_holders_per_semaphore: self.max_holders_per_semaphore,
            max_waiters_per_semaphore: self.max_waiters_per_semaphore,
            max_waiters: self.max_waiters,
        }
    }

    /// The request limits these options set.
    pub fn request_limits(&self) -> RequestLimits {
        RequestLimits {
            max_bulk_len: self.proto_max_bulk_len,
            max_multibulk_len: self.proto_max_multibulk_len,
        }
    }

    /// The cluster port to listen on: `--cluster-port`, or `--port` + 10000 (`None` past
    /// 65535).
    pub fn cluster_listen_port(&self) -> Option<u16> {
        self.cluster_port
            .or_else(|| default_cluster_port(self.port))
    }

    /// The shard count to run: `--shards`, or one per core.
    pub fn shard_count(&self) -> usize {
        if self.shards > 0 {
            self.shards
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    /// Every option by its long name and current value, for `CONFIG GET` (plus the `save` and
    /// `appendonly` names redis-benchmark asks for).
    pub fn entries(&self) -> Vec<(&'static str, String)> {
        vec![
            ("bind", self.bind.clone()),
            ("port", self.port.to_string()),
            ("shards", self.shard_count().to_string()),
            ("dir", self.dir.display().to_string()),
            ("fsync", self.fsync.as_str().to_string()),
            (
                "repair-log",
                if self.repair_log { "yes" } else { "no" }.to_string(),
            ),
            ("snapshot-threshold", self.snapshot_threshold.to_string()),
            ("requirepass", self.requirepass.clone().unwrap_or_default()),
            ("maxclients", self.maxclients.to_string()),
            ("maxmemory", self.maxmemory.to_string()),
            ("aclfile", path_entry(&self.aclfile)),
            (
                "protected-mode",
                if self.protected_mode { "yes" } else { "no" }.to_string(),
            ),
            ("tls-port", self.tls_port.unwrap_or(0).to_string()),
            (
                "cluster-node-id",
                self.cluster_node_id.unwrap_or(0).to_string(),
            ),
            (
                "cluster-port",
                self.cluster_node_id
                    .and(self.cluster_listen_port())
                    .unwrap_or(0)
                    .to_string(),
            ),
            (
                "cluster-announce",
                self.cluster_announce.clone().unwrap_or_default(),
            ),
            (
                "cluster-bind",
                self.cluster_node_id
                    .map(|_| {
                        self.cluster_bind
                            .clone()
                            .unwrap_or_else(|| self.bind.clone())
                    })
                    .unwrap_or_default(),
            ),
            (
                "cluster-tls-cert-file",
                path_entry(&self.cluster_tls_cert_file),
            ),
            (
                "cluster-tls-key-file",
                path_entry(&self.cluster_tls_key_file),
            ),
            (
                "cluster-tls-ca-cert-file",
                path_entry(&self.cluster_tls_ca_cert_file),
            ),
            (
                "failover-lease-grace",
                self.failover_lease_grace.to_string(),
            ),
            ("metrics-port", self.metrics_port.unwrap_or(0).to_string()),
            (
                "metrics-max-semaphores",
                self.metrics_max_semaphores.to_string(),
            ),
            ("timeout", self.timeout.to_string()),
            ("tcp-keepalive", self.tcp_keepalive.to_string()),
            (
                "slowlog-log-slower-than",
                self.slowlog_log_slower_than.to_string(),
            ),
            ("slowlog-max-len", self.slowlog_max_len.to_string()),
            (
                "latency-monitor-threshold",
                self.latency_monitor_threshold.to_string(),
            ),
            (
                "client-output-timeout",
                self.client_output_timeout.to_string(),
            ),
            (
                "client-output-buffer-limit",
                self.client_output_buffer_limit.to_string(),
            ),
            ("log-level", self.log_level.clone()),
            ("proto-max-bulk-len", self.proto_max_bulk_len.to_string()),
            (
                "proto-max-multibulk-len",
                self.proto_max_multibulk_len.to_string(),
            ),
            (
                "client-query-buffer-limit",
                self.client_query_buffer_limit.to_string(),
            ),
            ("max-name-len", self.max_name_len.to_string()),
            ("max-process-id-len", self.max_process_id_len.to_string()),
            ("max-description-len", self.max_description_len.to_string()),
            (
                "max-metadata-entries",
                self.max_metadata_entries.to_string(),
            ),
            (
                "max-metadata-key-len",
                self.max_metadata_key_len.to_string(),
            ),
            (
                "max-metadata-value-len",
                self.max_metadata_value_len.to_string(),
            ),
            ("min-lease-ttl", self.min_lease_ttl.to_string()),
            ("max-lease-ttl", self.max_lease_ttl.to_string()),
            ("max-acquire-timeout", self.max_acquire_timeout.to_string()),
            ("max-namespaces", self.max_namespaces.to_string()),
            (
                "max-semaphores-per-namespace",
                self.max_semaphores_per_namespace.to_string(),
            ),
            (
                "max-leases-per-namespace",
                self.max_leases_per_namespace.to_string(),
            ),
            (
                "max-holders-per-semaphore",
                self.max_holders_per_semaphore.to_string(),
            ),
            (
                "max-waiters-per-semaphore",
                self.max_waiters_per_semaphore.to_string(),
            ),
            ("max-waiters", self.max_waiters.to_string()),
            (
                "enable-debug-command",
                self.enable_debug_command.as_str().to_string(),
            ),
            ("save", String::new()),
            ("appendonly", "yes".to_string()),
            ("appendfsync", self.fsync.as_str().to_string()),
            ("databases", "1".to_string()),
        ]
    }
}

/// A path option's `CONFIG GET` value: empty when not given.
fn path_entry(path: &Option<PathBuf>) -> String {
    path.as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default()
}
