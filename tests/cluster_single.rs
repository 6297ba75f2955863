//! The fault harness against ONE permitd: the workload, recorder and checker of the cluster
//! classes (tests/cluster_chaos.rs), proven on a single node, where a node that really loses
//! acknowledged changes can be made on purpose (the wiped class). Each fault class runs for `PERMITD_CHAOS_SECS` (a few seconds
//! by default; scripts/cluster-chaos runs them longer) and must show 0 violations, with every
//! rule shown able to catch a violation planted in the run's own history; and a node that
//! really loses acknowledged changes must be caught.

mod cluster_harness;
mod common;

use std::collections::HashSet;
use std::thread;
use std::time::Duration;

use cluster_harness::check::{check, Rule};
use cluster_harness::nodes::Nodes;
use cluster_harness::proxy::{Dir, Proxy};
use cluster_harness::workload::{self, Rng};
use cluster_harness::{chaos_config, chaos_seed, verdict};

/// The proxy itself: a one-way partition holds that direction's bytes and delivers them at
/// heal, a delay delays, a drop resets.
#[test]
fn the_proxy_partitions_one_way_delays_and_drops() {
    let nodes = Nodes::start(1, &[]);
    let proxy = Proxy::start(nodes.addr(0));
    let mut c = common::RawConn::connect(proxy.addr());
    let ping = |c: &mut common::RawConn| c.send_cmd(&[b"PING"]).unwrap();
    let pong = common::Resp::Simple("PONG".into());
    let quiet = Some(Duration::from_millis(300));
    for dir in [Dir::ToTarget, Dir::FromTarget] {
        proxy.partition(dir);
        ping(&mut c);
        c.stream().set_read_timeout(quiet).unwrap();
        assert!(
            c.read_reply().is_err(),
            "{dir:?} partitioned, yet a reply came"
        );
        proxy.heal();
        c.stream().set_read_timeout(None).unwrap();
        assert_eq!(
            c.read_reply().unwrap(),
            pong,
            "held {dir:?}, delivered at heal"
        );
    }
    proxy.delay(Dir::FromTarget, Duration::from_millis(200));
    let t0 = std::time::Instant::now();
    ping(&mut c);
    assert_eq!(c.read_reply().unwrap(), pong);
    assert!(t0.elapsed() >= Duration::from_millis(200), "no delay");
    proxy.drop_connections();
    c.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    assert!(
        c.read_reply().is_err(),
        "a dropped connection still answers"
    );
}

/// (i) No faults: the baseline every fault class is measured against.
#[test]
fn clean_run_has_no_violations() {
    let nodes = Nodes::start(1, &[]);
    let seed = chaos_seed();
    let run = workload::start(chaos_config(seed), &[nodes.addr(0)]);
    while run.running() {
        thread::sleep(Duration::from_millis(50));
    }
    verdict("clean", 1, 0, seed, &run.finish(&[nodes.addr(0)]));
}

/// (ii) The clients reach the node through the proxy, which drops every connection, delays
/// replies or requests, and partitions one direction (requests held: they land late; replies
/// held: the client never learns what happened) for up to a second and a half at a time.
#[test]
fn proxy_drops_delays_and_one_way_partitions() {
    let nodes = Nodes::start(1, &[]);
    let proxy = Proxy::start(nodes.addr(0));
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0xfa17);
    let run = workload::start(chaos_config(seed), &[proxy.addr()]);
    let mut faults = 0;
    while run.running() {
        thread::sleep(rng.millis(200, 700));
        match rng.range(0, 4) {
            0 => proxy.drop_connections(),
            1 => {
                let dir = [Dir::ToTarget, Dir::FromTarget][rng.range(0, 2) as usize];
                proxy.delay(dir, rng.millis(20, 300));
                thread::sleep(rng.millis(300, 1000));
            }
            2 => {
                proxy.partition(Dir::ToTarget);
                thread::sleep(rng.millis(200, 1500));
            }
            _ => {
                proxy.partition(Dir::FromTarget);
                thread::sleep(rng.millis(200, 1500));
            }
        }
        proxy.heal();
        faults += 1;
    }
    verdict("proxy", 1, faults, seed, &run.finish(&[nodes.addr(0)]));
}

/// (iii) The node is killed with `kill -9` and restarted on its directory, again and again:
/// every acknowledged change survives (SPEC §8), leases that died while it was down stay dead.
#[test]
fn kill9_and_restart_lose_nothing_acknowledged() {
    let mut nodes = Nodes::start(1, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0xdead);
    let run = workload::start(chaos_config(seed), &[nodes.addr(0)]);
    let mut faults = 0;
    while run.running() {
        thread::sleep(rng.millis(300, 1200));
        nodes.kill9(0);
        thread::sleep(rng.millis(50, 800));
        nodes.restart(0);
        faults += 1;
    }
    verdict("kill9", 1, faults, seed, &run.finish(&[nodes.addr(0)]));
}

/// (iv) The node is frozen with SIGSTOP for up to three seconds (often longer than a reply's
/// wait: the clients give up and reconnect to a node that does not answer; as long as a lease:
/// the node expires leases as it wakes) and thawed.
#[test]
fn sigstop_pauses_lose_nothing_acknowledged() {
    let nodes = Nodes::start(1, &[]);
    let seed = chaos_seed();
    let mut rng = Rng::new(seed ^ 0x5709);
    let run = workload::start(chaos_config(seed), &[nodes.addr(0)]);
    let mut faults = 0;
    while run.running() {
        thread::sleep(rng.millis(300, 1200));
        nodes.pause(0);
        thread::sleep(rng.millis(200, 3000));
        nodes.resume(0);
        faults += 1;
    }
    verdict("sigstop", 1, faults, seed, &run.finish(&[nodes.addr(0)]));
}

/// The checker against a server that really loses acknowledged changes: the node's data
/// directory is emptied while it is down, and its schema made again, as an operator would.
/// Leases acknowledged alive are then missing (c), tokens start over (b), and permits held
/// before are granted again (a): the checker must say all three.
#[test]
fn a_node_that_loses_its_data_is_caught() {
    let mut nodes = Nodes::start(1, &[]);
    let seed = chaos_seed();
    let config = workload::Config {
        duration: Duration::from_secs(3),
        ..chaos_config(seed)
    };
    let run = workload::start(config, &[nodes.addr(0)]);
    thread::sleep(Duration::from_millis(1500));
    nodes.kill9(0);
    nodes.wipe(0);
    nodes.restart(0);
    workload::create_schema(&[nodes.addr(0)]);
    let h = run.finish(&[nodes.addr(0)]);
    let violations = check(&h);
    let rules: HashSet<Rule> = violations.iter().map(|v| v.rule).collect();
    println!(
        "chaos wiped: nodes=1 faults=1 ops={} violations={} rules={rules:?} seed={seed}",
        h.calls.len(),
        violations.len()
    );
    for rule in [Rule::OverGrant, Rule::TokenFell, Rule::LeaseLost] {
        assert!(
            rules.contains(&rule),
            "no {rule:?} after the node lost its data (seed {seed}): {rules:?}"
        );
    }
}
