//! What every mode shares: the options of each mode, the targets, the limits the runs keep
//! to, and the runtime each connection thread runs.

use std::error::Error;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// The lease TTL the server accepts at most (SPEC §6); runs are kept well inside it.
pub(crate) const MAX_LEASE_TTL: u64 = 300;

/// A reply that takes longer than this ends the run with an error instead of a hang. Longer
/// than any wait this tool asks for (a parked hand-off waiter is answered right after the
/// release that frees it).
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// Read buffer room per connection: a deep pipeline's replies arrive in large reads.
pub(crate) const READ_CHUNK: usize = 64 * 1024;

pub(crate) type BoxError = Box<dyn Error + Send + Sync>;
pub(crate) type Result<T> = std::result::Result<T, BoxError>;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Target {
    /// permitd's SEM.ACQUIRE / SEM.RELEASE under leases.
    Permitd,
    /// permitd: one SEM.ACQUIREALL of two semaphores, then a SEM.RELEASE of each.
    PermitdAll,
    /// permitd: MULTI, SEM.ACQUIRE of each of two semaphores, EXEC, then a SEM.RELEASE of each
    /// (what SEM.ACQUIREALL replaces; it never waits, all or none only if both fit).
    PermitdMulti,
    /// redis-server with redis-compat/lua/{acquire,release}.lua via EVALSHA.
    Lua,
}

impl Target {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Target::Permitd => "permitd",
            Target::PermitdAll => "permitd-all",
            Target::PermitdMulti => "permitd-multi",
            Target::Lua => "lua",
        }
    }
}

#[derive(Args, Debug, Clone)]
pub(crate) struct LoadArgs {
    /// Connections, each with its own lease (permitd) or holder id (lua).
    #[arg(short = 'c', long, default_value_t = 50)]
    pub(crate) connections: usize,
    /// Pipeline depth: units of work in flight per connection.
    #[arg(short = 'P', long, default_value_t = 1)]
    pub(crate) pipeline: usize,
    /// Measured seconds (after the warm-up).
    #[arg(short = 'd', long, default_value_t = 10.0)]
    pub(crate) duration: f64,
    /// Warm-up seconds, not counted.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) warmup: f64,
    /// OS threads, each running a single-threaded tokio runtime; connections are spread
    /// round-robin over them.
    #[arg(long, default_value_t = 2)]
    pub(crate) threads: usize,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct ThroughputArgs {
    /// Which server speaks at --host/--port.
    #[arg(long, value_enum)]
    pub(crate) target: Target,
    #[command(flatten)]
    pub(crate) load: LoadArgs,
    /// Permits per semaphore (default: connections x pipeline, so every acquire fits).
    #[arg(long)]
    pub(crate) permits: Option<u64>,
    /// Semaphores to spread the connections over (connection i uses semaphore i mod K).
    #[arg(long, default_value_t = 1)]
    pub(crate) semaphores: usize,
    /// Namespace (permitd) / key prefix (lua).
    #[arg(long, default_value = "permitd-load")]
    pub(crate) ns: String,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct HandoffArgs {
    /// Measured hand-offs.
    #[arg(short = 'n', long, default_value_t = 2000)]
    pub(crate) count: usize,
    /// Hand-offs before measuring, not counted.
    #[arg(long, default_value_t = 100)]
    pub(crate) warmup: usize,
    /// Seconds the waiter's SEM.ACQUIRE may park.
    #[arg(long, default_value = "10")]
    pub(crate) timeout: String,
    /// Upper bound on the whole run, seconds.
    #[arg(long, default_value_t = 120.0)]
    pub(crate) max_seconds: f64,
    /// Namespace of the semaphore and the two leases (created if missing).
    #[arg(long, default_value = "permitd-load")]
    pub(crate) ns: String,
    /// Idle milliseconds between the waiter parking and the release (0: release at once). With
    /// a gap, server and client sleep before each hand-off, as in bench-peers' Node client.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) gap_ms: f64,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct FailoverArgs {
    /// The cluster's nodes, their client addresses comma-separated (host:port,host:port,...).
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) nodes: Vec<String>,
    /// Clients, each on its own connection under its own lease.
    #[arg(short = 'c', long, default_value_t = 8)]
    pub(crate) connections: usize,
    /// A pause longer than this between two successes of one client is an outage, ms.
    #[arg(long, default_value_t = 100.0)]
    pub(crate) gap_ms: f64,
    /// Pause before a retry after CLUSTERDOWN, TRYAGAIN or a refused or lost connection, ms.
    #[arg(long, default_value_t = 50.0)]
    pub(crate) retry_ms: f64,
    /// Seconds a kill waits for every client's next success; then it is reported without them.
    #[arg(long, default_value_t = 30.0)]
    pub(crate) settle_seconds: f64,
    /// The clients' lease TTL, seconds; each refreshes its lease every third of it.
    #[arg(long, default_value_t = 30)]
    pub(crate) lease_ttl: u64,
    /// Upper bound on the whole run, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub(crate) max_seconds: f64,
    /// Namespace of the semaphore and the leases (created if missing).
    #[arg(long, default_value = "permitd-load")]
    pub(crate) ns: String,
}

#[derive(Args, Debug, Clone)]
pub(crate) struct PingArgs {
    /// Which server speaks at --host/--port (only a label here: both answer PING).
    #[arg(long, value_enum)]
    pub(crate) target: Target,
    #[command(flatten)]
    pub(crate) load: LoadArgs,
}

pub(crate) fn current_thread_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
