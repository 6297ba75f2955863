//! What the run is asked to do (the command line) and the fixed shape of its load.

use clap::Parser;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "permitd-soak",
    about = "Soak test: 10,000 connections, parked acquires, kills, expiries, then invariants"
)]
pub(crate) struct Cli {
    /// Server host (loopback only).
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// The port permitd listens on.
    #[arg(long, short = 'p')]
    pub(crate) port: u16,
    /// The server's process id, to read its memory use from /proc.
    #[arg(long)]
    pub(crate) server_pid: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 300)]
    pub(crate) seconds: u64,
    /// Load connections in all (parkers + workers + 4 chaos connections).
    #[arg(long, default_value_t = 10_000)]
    pub(crate) connections: usize,
    /// Connections that loop on blocking SEM.ACQUIRE.
    #[arg(long, default_value_t = 5_000)]
    pub(crate) parkers: usize,
    /// Longest acquire timeout a parker asks for, seconds.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) max_timeout: f64,
    /// Allowed growth of the RSS after the load over before it, as a fraction.
    #[arg(long, default_value_t = 0.10)]
    pub(crate) rss_tolerance: f64,
    /// Seed of every random choice (the same seed makes the same choices).
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
}

pub(crate) const NS: &str = "soak";
/// The semaphores and their permits at the start (SEM.UPDATE moves them between half and
/// double).
pub(crate) const SEMS: [(&str, i64); 5] =
    [("s0", 4), ("s1", 8), ("s2", 16), ("s3", 32), ("s4", 64)];
/// Heaviest acquire.
pub(crate) const MAX_WEIGHT: i64 = 3;
/// Connects in flight at once.
pub(crate) const CONNECT_CONCURRENCY: usize = 256;
/// Upper bound on commands sent, whatever the duration.
pub(crate) const MAX_OPS: u64 = 50_000_000;
/// Violations printed in full (all are counted).
pub(crate) const MAX_REPORTED: usize = 50;
