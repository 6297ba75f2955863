//! The fault harness against a real cluster (SPEC §10, issue 18 deliverable 5): 3 and 5
//! permitd processes on 127.0.0.1, the workload's clients following the leader (`MOVED`,
//! `CLUSTERDOWN`, `TRYAGAIN`: nothing ran, they go on elsewhere or a moment later), the leader
//! killed with `kill -9`, frozen with SIGSTOP for longer than the election timeout, followers
//! killed, two of five nodes killed at once. Each class runs for `PERMITD_CHAOS_SECS` (a few
//! seconds by default; scripts/cluster-chaos runs them longer), and the checker must find no
//! violation in its history, every rule shown able to catch one planted in it.

mod cluster_harness;
mod common;

use std::thread;
use std::time::Duration;

use cluster_harness::history::History;
use cluster_harness::nodes::Nodes;
use cluster_harness::workload::{self, Rng};
use cluster_harness::{chaos_config, chaos_seed, verdict};

/// Runs the workload on `nodes` while `fault` injects faults (it returns the count so far,
/// once per call), and returns the history, read as cluster mode's (leases may be extended).
fn run(
    nodes: &mut Nodes,
    seed: u64,
    mut fault: impl FnMut(&mut Nodes) -> usize,
) -> (usize, History) {
    let run = workload::start(chaos_config(seed), &nodes.addrs());
    let mut faults = 0;
    while run.running() {
        faults += fault(nodes);
    }
    let mut h = run.finish(&nodes.addrs());
    h.leases_extended = true;
    (faults, h)
}

/// The node to fault: the leader when one is known (its index), else any.
fn target(nodes: &Nodes, rng: &mut Rng, count: usize) -> usize {
    nodes
        .leader()
        .unwrap_or_else(|| rng.range(0, count as u64) as usize)
}

/// (i) No faults on three nodes: the baseline.
#[test]
fn cluster_clean_run_has_no_violations() {
    let mut nodes = Nodes::cluster(3, &[]);
    let seed = chaos_seed();
    let (_, h) = run(&mut nodes, seed, |_| {
        thread::sleep(Duration::from_millis(50));
        0
    });
    verdict("cluster-clean", 3, 0, seed, &h);
}

/// (ii) The leader is killed with `kill -9` and restarted on its directory (one time in four a
/// follower instead): every acknowledged change survives on the majority, the new leader serves
/// it, and the old one catches up.
#[test]
fn cluster_kill9_of_the_leader_loses_nothing_acknowledged() {
    let mut nodes = Nodes::cluster(3, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0x1ead);
    let (faults, h) = run(&mut nodes, seed, |nodes| {
        thread::sleep(rng.millis(500, 1500));
        let leader = target(nodes, &mut rng, 3);
        let i = if rng.range(0, 4) == 0 {
            (leader + 1 + rng.range(0, 2) as usize) % 3
        } else {
            leader
        };
        nodes.kill9(i);
        thread::sleep(rng.millis(100, 1500));
        nodes.restart(i);
        1
    });
    verdict("cluster-kill9", 3, faults, seed, &h);
}

/// (iii) The leader is frozen with SIGSTOP for longer than the election timeout (up to 3 s):
/// the others elect a new one; thawed, the old leader finds itself deposed, its pending
/// changes never acknowledged (CheckQuorum and the reply gate), and follows.
#[test]
fn cluster_sigstop_of_the_leader_loses_nothing_acknowledged() {
    let mut nodes = Nodes::cluster(3, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0x5709);
    let (faults, h) = run(&mut nodes, seed, |nodes| {
        thread::sleep(rng.millis(500, 1500));
        let i = target(nodes, &mut rng, 3);
        nodes.pause(i);
        thread::sleep(rng.millis(1200, 3000));
        nodes.resume(i);
        1
    });
    verdict("cluster-sigstop", 3, faults, seed, &h);
}

/// (iv) Five nodes, two killed at once (the leader among them when known), then restarted: a
/// majority of three keeps serving, and nothing acknowledged is lost.
#[test]
fn cluster_of_five_survives_two_nodes_killed_at_once() {
    let mut nodes = Nodes::cluster(5, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0x5555);
    let (faults, h) = run(&mut nodes, seed, |nodes| {
        thread::sleep(rng.millis(500, 1500));
        let first = target(nodes, &mut rng, 5);
        let second = (first + 1 + rng.range(0, 4) as usize) % 5;
        nodes.kill9(first);
        nodes.kill9(second);
        thread::sleep(rng.millis(100, 1500));
        nodes.restart(first);
        nodes.restart(second);
        1
    });
    verdict("cluster-five", 5, faults, seed, &h);
}
