//! permitd-soak: many connections, thousands of parked acquires and every way they can end, all
//! at once, against one permitd on loopback; then checks that the server is back where it
//! started. `scripts/soak` starts the server and runs this.
//!
//! Load (for `--seconds`, after all connections are open):
//! * `--parkers` connections loop on `SEM.ACQUIRE` with random weights and random timeouts on a
//!   handful of small semaphores, so nearly all of them are parked at any moment. Granted holds
//!   are released, revoked with their lease, or left to die with a short lease. Some parkers
//!   drop their connection while parked.
//! * The other connections are workers: timeout-0 acquires and releases, lease refreshes and
//!   reads, SEM.GET + SEM.HOLDERS in one MULTI (checked for consistency), LEASE.LIST, random
//!   reconnects; most of the time they sit idle.
//! * Four chaos connections: `CLIENT KILL ID` and `CLIENT UNBLOCK id TIMEOUT|ERROR` on parked
//!   clients, `LEASE.REVOKE` of random leases, `SEM.UPDATE` permit changes up and down.
//!
//! Every reply is checked against the SPEC as it arrives (outcomes possible for the request,
//! `active_holds <= permits`, a weight never above the permits it was granted from, fencing
//! tokens above every token seen before the request was sent, only the error codes each
//! command can give, no lease or holder visible past its `expires_at`, time-outs not early).
//!
//! At the end: INFO shows no waiter and no blocked client and exactly the open connections,
//! every semaphore's `active_holds` is the sum of its holders (read atomically in MULTI), no
//! listed lease is dead, revoking every lease frees every permit, and once the load's
//! connections are closed the server's RSS is within `--rss-tolerance` of its level before the
//! load. One summary line goes to stdout; the exit code is 1 on any violation.

mod checks;
mod control;
mod load;
mod shared;

use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use clap::Parser;
use permitd::protocol::request::encode_request;
use permitd_client::resp::Value;
use tokio::task::LocalSet;

use shared::Shared;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "permitd-soak",
    about = "Soak test: 10,000 connections, parked acquires, kills, expiries, then invariants"
)]
struct Cli {
    /// Server host (loopback only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port permitd listens on.
    #[arg(long, short = 'p')]
    port: u16,
    /// The server's process id, to read its memory use from /proc.
    #[arg(long)]
    server_pid: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Load connections in all (parkers + workers + 4 chaos connections).
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Connections that loop on blocking SEM.ACQUIRE.
    #[arg(long, default_value_t = 5_000)]
    parkers: usize,
    /// Longest acquire timeout a parker asks for, seconds.
    #[arg(long, default_value_t = 20.0)]
    max_timeout: f64,
    /// Allowed growth of the RSS after the load over before it, as a fraction.
    #[arg(long, default_value_t = 0.10)]
    rss_tolerance: f64,
    /// Seed of every random choice (the same seed makes the same choices).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const NS: &str = "soak";
/// The semaphores and their permits at the start (SEM.UPDATE moves them between half and
/// double).
const SEMS: [(&str, i64); 5] = [("s0", 4), ("s1", 8), ("s2", 16), ("s3", 32), ("s4", 64)];
/// Heaviest acquire.
const MAX_WEIGHT: i64 = 3;
/// A reply that takes longer than this past the request's own timeout is a violation.
const REPLY_GRACE: Duration = Duration::from_secs(30);
/// Connects in flight at once.
const CONNECT_CONCURRENCY: usize = 256;
/// Upper bound on commands sent, whatever the duration.
const MAX_OPS: u64 = 50_000_000;
/// Violations printed in full (all are counted).
const MAX_REPORTED: usize = 50;

/// Read buffer room per connection: 10,000 of them stay small.
const READ_CHUNK: usize = 1024;

fn encode(args: &[&str]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let mut out = Vec::new();
    encode_request(&mut out, &args);
    out
}

/// A load connection, and the client id the server gave it (the target of CLIENT KILL and
/// CLIENT UNBLOCK).
struct Conn {
    io: permitd_tools::Conn,
    id: u64,
}

impl Conn {
    async fn open(addr: SocketAddr) -> io::Result<Conn> {
        let io = permitd_tools::Conn::connect(addr, Duration::from_secs(30), READ_CHUNK).await?;
        let mut c = Conn { io, id: 0 };
        match c.cmd(&["CLIENT", "ID"], Duration::ZERO).await? {
            Value::Int(id) if id > 0 => c.id = id as u64,
            other => return Err(io::Error::other(format!("CLIENT ID answered {other:?}"))),
        }
        Ok(c)
    }

    async fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.io.send(&encode(args)).await
    }

    /// The next reply; `wait` is how long the request itself may take (a blocking timeout).
    async fn read(&mut self, wait: Duration) -> io::Result<Value> {
        self.io.reply(wait + REPLY_GRACE).await
    }

    async fn cmd(&mut self, args: &[&str], wait: Duration) -> io::Result<Value> {
        self.send(args).await?;
        self.read(wait).await
    }
}

fn main() {
    let cli = Cli::parse();
    if cli.connections < 8 || cli.parkers == 0 {
        eprintln!("permitd-soak: need at least 8 connections and 1 parker");
        std::process::exit(2);
    }
    let addr = match permitd_tools::resolve(&cli.host, cli.port) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("permitd-soak: {e}");
            std::process::exit(2);
        }
    };
    let sh = Rc::new(Shared::new(cli, addr));
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("permitd-soak: runtime: {e}");
            std::process::exit(2);
        }
    };
    let local = LocalSet::new();
    let result = local.block_on(&rt, control::run(sh.clone()));
    if let Err(e) = result {
        eprintln!("permitd-soak: {e}");
        std::process::exit(1);
    }
    let s = sh.stats.borrow();
    if s.violations > 0 {
        eprintln!("permitd-soak: {} violations; the first ones:", s.violations);
        for v in &s.reported {
            eprintln!("  {v}");
        }
        std::process::exit(1);
    }
}
