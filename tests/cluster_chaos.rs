//! The fault harness against a real cluster (SPEC §10, issue 18 deliverable 5): 3 and 5
//! permitd processes on 127.0.0.1, the workload's clients following the leader (`MOVED`,
//! `CLUSTERDOWN`, `TRYAGAIN`: nothing ran, they go on elsewhere or a moment later), the leader
//! killed with `kill -9`, frozen with SIGSTOP for longer than the election timeout, cut off
//! from its peers while its clients still reach it, peer links partitioned one way or delayed
//! (through a proxy in front of each node's cluster port), followers killed, two of five nodes
//! killed at once. Each class runs for `PERMITD_CHAOS_SECS` (a few
//! seconds by default; scripts/cluster-chaos runs them longer), and the checker must find no
//! violation in its history, every rule shown able to catch one planted in it.

mod cluster_harness;
mod common;

use std::thread;
use std::time::Duration;

use cluster_harness::history::History;
use cluster_harness::nodes::Nodes;
use cluster_harness::proxy::Dir;
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

/// The partition class's main fault does what it says: a leader cut off from its peers is
/// replaced by another, and once healed it follows that one.
#[test]
fn an_isolated_leader_is_replaced_and_follows_after_the_heal() {
    let nodes = Nodes::cluster_behind_proxies(3, &[]);
    let first = nodes.wait_for_leader();
    nodes.isolate(first);
    let replaced = common::wait_until(Duration::from_secs(30), || {
        nodes.masters().iter().any(|&m| m != first)
    });
    assert!(replaced, "no other node took over from the isolated leader");
    nodes.heal_peers();
    let next = nodes.wait_for_leader();
    assert_ne!(next, first, "the deposed leader follows after the heal");
}

/// (v) Peer links through a proxy in front of each node's cluster port: the leader is cut off
/// from its peers (both ways) while its clients still reach it, so it serves nothing it could
/// not replicate and is deposed; or one node's inbound links are held one way (requests, or
/// answers: delivered late at heal) or delayed; for up to 3 s each.
#[test]
fn cluster_partitions_lose_nothing_acknowledged() {
    let mut nodes = Nodes::cluster_behind_proxies(3, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0xcafe);
    let (faults, h) = run(&mut nodes, seed, |nodes| {
        thread::sleep(rng.millis(500, 1500));
        let i = target(nodes, &mut rng, 3);
        let any = rng.range(0, 3) as usize;
        match rng.range(0, 4) {
            0 | 1 => nodes.isolate(i),
            2 => {
                let dir = [Dir::ToTarget, Dir::FromTarget][rng.range(0, 2) as usize];
                nodes.peer_proxy(any).partition(dir);
            }
            _ => {
                let dir = [Dir::ToTarget, Dir::FromTarget][rng.range(0, 2) as usize];
                nodes.peer_proxy(any).delay(dir, rng.millis(20, 300));
            }
        }
        thread::sleep(rng.millis(500, 3000));
        nodes.heal_peers();
        1
    });
    verdict("cluster-partition", 3, faults, seed, &h);
}
