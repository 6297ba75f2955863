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
//! * `failover` (cluster mode): C clients loop acquire + release against the nodes given,
//!   following MOVED and retrying CLUSTERDOWN/TRYAGAIN as cluster clients do; for each leader
//!   kill announced on stdin (`kill <unix-ns>`), each client's time to its next success.
//!
//! Every result is one JSON object on one line of stdout; progress goes to stderr. Traffic
//! goes only to the addresses given (loopback by default); every loop is bounded in time.

mod args;
mod failover;
mod handoff;
mod replies;
mod rounds;
mod setup;
mod throughput;

use clap::{Parser, Subcommand};

use args::{FailoverArgs, HandoffArgs, PingArgs, ThroughputArgs};

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
    /// Cluster mode: each client's time from a leader kill (announced on stdin) to its next
    /// success.
    Failover(FailoverArgs),
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
        Mode::Failover(a) => failover::failover(a),
    };
    if let Err(e) = res {
        eprintln!("permitd-load: {e}");
        std::process::exit(1);
    }
}
