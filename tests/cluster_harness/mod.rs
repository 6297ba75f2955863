//! The fault harness and history checker of the cluster tests (issue 18, deliverable 5):
//!
//! - [`nodes`]: permitd processes on free 127.0.0.1 ports, killed, restarted, frozen;
//! - [`proxy`]: an in-test TCP proxy that delays, drops and partitions (one way too);
//! - [`workload`]: clients with their own leases doing random acquires, releases, refreshes
//!   and revokes, recording every call in a [`history`] with a monotonic clock;
//! - [`check`]: proves from the history alone that no more permits were relied on than exist,
//!   that fencing tokens rose, and that no acknowledged change was lost;
//! - [`sabotage`]: breaks each rule in a copy of a run's history, to prove the run's checks
//!   could have failed.
//!
//! A test file includes it with `mod common; mod cluster_harness;` (it uses `common`'s server
//! and raw client). Not every file uses every part, hence the `dead_code` allowance, as in
//! `common`.
#![allow(dead_code)]

pub mod check;
pub mod history;
pub mod nodes;
pub mod proxy;
pub mod sabotage;
pub mod workload;

use std::time::Duration;

use history::{History, Op, Outcome};

/// How long each fault class runs its workload: `PERMITD_CHAOS_SECS` (scripts/cluster-chaos
/// sets it), else a few seconds, which keeps CI's runs short.
pub fn chaos_duration() -> Duration {
    let secs = std::env::var("PERMITD_CHAOS_SECS")
        .ok()
        .map(|s| s.parse().expect("PERMITD_CHAOS_SECS: a number of seconds"))
        .unwrap_or(4);
    Duration::from_secs(secs)
}

/// The run's seed: `PERMITD_CHAOS_SEED` to repeat a run, else the clock's.
pub fn chaos_seed() -> u64 {
    std::env::var("PERMITD_CHAOS_SEED")
        .ok()
        .map(|s| s.parse().expect("PERMITD_CHAOS_SEED: a number"))
        .unwrap_or_else(|| permitd_client::now_ns() as u64)
}

/// The workload of a fault class: 8 clients, leases of 3 s, for [`chaos_duration`].
pub fn chaos_config(seed: u64) -> workload::Config {
    workload::Config {
        clients: 8,
        duration: chaos_duration(),
        max_calls: 50_000,
        ttl: 3,
        seed,
    }
}

/// Checks a fault class's history: prints its summary line (`chaos CLASS: ...`, which
/// scripts/cluster-chaos collects), then fails on any violation, on a final acquire that was
/// not granted, or on a rule the checker could not have caught in this history.
pub fn verdict(class: &str, nodes: usize, faults: usize, seed: u64, h: &History) {
    let violations = check::check(h);
    let n = h.counts();
    println!(
        "chaos {class}: nodes={nodes} faults={faults} ops={} acknowledged={} granted={} \
         refused={} unknown={} violations={} seed={seed}",
        n.calls,
        n.acknowledged,
        n.granted,
        n.refused,
        n.unknown,
        violations.len()
    );
    let shown: Vec<String> = violations.iter().take(20).map(|v| v.to_string()).collect();
    assert!(
        violations.is_empty(),
        "{class}: {} violations (seed {seed}), the first:\n{}",
        violations.len(),
        shown.join("\n")
    );
    // The probe acquires after the run: each must be granted once the faults healed.
    let probes = h
        .calls
        .iter()
        .rev()
        .take(h.sems.len())
        .filter(|c| matches!(c.op, Op::Acquire { .. }) && matches!(c.outcome, Outcome::Acquired(_)))
        .count();
    assert_eq!(
        probes,
        h.sems.len(),
        "{class}: the final acquires were not all granted"
    );
    sabotage::assert_checker_bites(h);
}
