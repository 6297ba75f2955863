//! permitd-load: a load generator for permitd and for the Redis + Lua semaphore it replaces.
//!
//! One client code path drives both servers: the same connections, the same pipelining and
//! the same RESP2 reply reading (`permitd_client::resp`); only the commands differ:
//!
//! * `--target permitd`: `SEM.ACQUIRE ns sem lease 1 0` + `SEM.RELEASE ns sem lease`, each
//!   connection under its own lease (`LEASE.CREATE`).
//! * `--target lua`: `EVALSHA` of `redis-compat/lua/acquire.lua` and `release.lua` (compiled
//!   into this binary), each connection with its own random holder id.
//!
//! Modes:
//!
//! * `throughput`: C connections, each sends P acquire/release pairs at once (a pipeline of
//!   2P commands, as `redis-benchmark -P` does), waits for all their replies, and repeats,
//!   for D seconds after a warm-up. Reports pairs/s, commands/s and the acquired ratio.
//! * `handoff` (permitd only): one lease holds the only permit of a semaphore, a second one
//!   is parked in `SEM.ACQUIRE ... 10`; measures from sending `SEM.RELEASE` to receiving the
//!   waiter's ACQUIRED reply, N times. Reports p50/p99 in microseconds.
//! * `ping`: C connections pipelining P `PING`s, for D seconds: the same client's ceiling.
//!
//! Every result is one JSON object on one line of stdout; progress goes to stderr. Traffic
//! goes only to the address given (loopback by default); every loop is bounded in time.

mod handoff;
mod replies;
mod rounds;
mod setup;
mod throughput;

use std::error::Error;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The lease TTL the server accepts at most (SPEC §6); runs are kept well inside it.
const MAX_LEASE_TTL: u64 = 300;

/// A reply that takes longer than this ends the run with an error instead of a hang. Longer
/// than any wait this tool asks for (a parked hand-off waiter is answered right after the
/// release that frees it).
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

/// Read buffer room per connection: a deep pipeline's replies arrive in large reads.
const READ_CHUNK: usize = 64 * 1024;

type BoxError = Box<dyn Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

#[derive(Parser, Debug)]
#[command(
    name = "permitd-load",
    about = "Load generator for permitd and for the Redis + Lua semaphore baseline"
)]
struct Cli {
    /// Server address (keep it on loopback).
    #[arg(long, global = true, default_value = "127.0.0.1")]
    host: String,
    /// The port the server listens on.
    #[arg(long, short = 'p', global = true, default_value_t = 6379)]
    port: u16,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// acquire(weight 1, timeout 0) + release pairs, pipelined, for a fixed time.
    Throughput(ThroughputArgs),
    /// Release-to-waiter-grant latency on permitd.
    Handoff(HandoffArgs),
    /// Pipelined PINGs: the client's own ceiling against a server.
    Ping(PingArgs),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    /// permitd's SEM.ACQUIRE / SEM.RELEASE under leases.
    Permitd,
    /// redis-server with redis-compat/lua/{acquire,release}.lua via EVALSHA.
    Lua,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Permitd => "permitd",
            Target::Lua => "lua",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct LoadArgs {
    /// Connections, each with its own lease (permitd) or holder id (lua).
    #[arg(short = 'c', long, default_value_t = 50)]
    connections: usize,
    /// Pipeline depth: units of work in flight per connection.
    #[arg(short = 'P', long, default_value_t = 1)]
    pipeline: usize,
    /// Measured seconds (after the warm-up).
    #[arg(short = 'd', long, default_value_t = 10.0)]
    duration: f64,
    /// Warm-up seconds, not counted.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// OS threads, each running a single-threaded tokio runtime; connections are spread
    /// round-robin over them.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

#[derive(Args, Debug, Clone)]
struct ThroughputArgs {
    /// Which server speaks at --host/--port.
    #[arg(long, value_enum)]
    target: Target,
    #[command(flatten)]
    load: LoadArgs,
    /// Permits per semaphore (default: connections x pipeline, so every acquire fits).
    #[arg(long)]
    permits: Option<u64>,
    /// Semaphores to spread the connections over (connection i uses semaphore i mod K).
    #[arg(long, default_value_t = 1)]
    semaphores: usize,
    /// Namespace (permitd) / key prefix (lua).
    #[arg(long, default_value = "permitd-load")]
    ns: String,
}

#[derive(Args, Debug, Clone)]
struct HandoffArgs {
    /// Measured hand-offs.
    #[arg(short = 'n', long, default_value_t = 2000)]
    count: usize,
    /// Hand-offs before measuring, not counted.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Seconds the waiter's SEM.ACQUIRE may park.
    #[arg(long, default_value = "10")]
    timeout: String,
    /// Upper bound on the whole run, seconds.
    #[arg(long, default_value_t = 120.0)]
    max_seconds: f64,
    /// Namespace of the semaphore and the two leases (created if missing).
    #[arg(long, default_value = "permitd-load")]
    ns: String,
    /// Idle milliseconds between the waiter parking and the release (0: release at once). With
    /// a gap, server and client sleep before each hand-off, as in bench-peers' Node client.
    #[arg(long, default_value_t = 0.0)]
    gap_ms: f64,
}

#[derive(Args, Debug, Clone)]
struct PingArgs {
    /// Which server speaks at --host/--port (only a label here: both answer PING).
    #[arg(long, value_enum)]
    target: Target,
    #[command(flatten)]
    load: LoadArgs,
}

fn main() {
    let cli = Cli::parse();
    let addr = match permitd_tools::resolve(&cli.host, cli.port) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("permitd-load: {e}");
            std::process::exit(2);
        }
    };
    let res = match &cli.mode {
        Mode::Throughput(a) => throughput::throughput(addr, a),
        Mode::Handoff(a) => handoff::handoff(addr, a),
        Mode::Ping(a) => throughput::ping(addr, a),
    };
    if let Err(e) = res {
        eprintln!("permitd-load: {e}");
        std::process::exit(1);
    }
}

fn current_thread_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}
