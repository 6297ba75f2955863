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
//! connections are closed (and the slow log and statistics reset) the server's RSS is within
//! `--rss-tolerance` of its level before the load. One summary line goes to stdout; the exit code is 1 on any violation.

mod checks;
mod conn;
mod control;
mod load;
mod settings;
mod shared;

use std::rc::Rc;

use clap::Parser;
use tokio::task::LocalSet;

use settings::Cli;
use shared::Shared;

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
