//! Peer traffic on a hostile path (SPEC §17): a proxy in front of every node's cluster port
//! reads what passes and alters what it passes on. In the clear (allowed on loopback only) it
//! reads lease ids, which are capabilities; over mutual TLS it reads none, and a record it
//! alters is refused and the link reset: the change it carried is sent again intact, and a
//! failover serves what the client wrote, never a forgery.

mod cluster_harness;
mod common;

use std::time::Duration;

use cluster_harness::nodes::Nodes;
use cluster_harness::proxy::Dir;
use common::cluster::run_ready_at;
use common::*;

/// What the test writes: a namespace with a description, and a lease in it. The lease id.
fn write_secrets(nodes: &Nodes, leader: usize) -> String {
    let at = nodes.addr(leader);
    let ok = |args: &[&str]| run_ready_at(at, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    ok(&["NS.CREATE", "vault", "DESC", "the-true-description"]);
    let lease = ok(&["LEASE.CREATE", "vault", "worker-7", "60"]);
    text(&field(&lease, "lease_id"))
}

/// Whether `needle` is among the bytes `hay`.
fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every byte the peer proxies passed on, once the followers have had time to get the writes.
fn seen_on_the_path(nodes: &Nodes) -> Vec<u8> {
    std::thread::sleep(Duration::from_secs(1));
    (0..3)
        .flat_map(|i| nodes.peer_proxy(i).recorded())
        .collect()
}

/// The control: in the clear, the path reads the lease id (so the check below can fail).
#[test]
fn in_the_clear_the_path_reads_lease_ids() {
    let nodes = Nodes::cluster_behind_proxies(3, &[]);
    (0..3).for_each(|i| nodes.peer_proxy(i).record());
    let lease = write_secrets(&nodes, nodes.wait_for_leader());
    let seen = seen_on_the_path(&nodes);
    assert!(holds(&seen, &lease), "the lease id crossed in the clear");
    assert!(holds(&seen, "the-true-description"));
}

#[test]
fn over_tls_the_path_reads_no_lease_id_and_an_altered_record_is_refused() {
    let pki = unique_temp_dir();
    let files = common::pki::peer_files(&pki, "peer", &["127.0.0.1"]);
    let files: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let args = [
        "--cluster-tls-cert-file",
        &files[0],
        "--cluster-tls-key-file",
        &files[1],
        "--cluster-tls-ca-cert-file",
        &files[2],
    ];
    let mut nodes = Nodes::cluster_behind_proxies(3, &args);
    (0..3).for_each(|i| nodes.peer_proxy(i).record());
    let leader = nodes.wait_for_leader();
    let lease = write_secrets(&nodes, leader);
    let seen = seen_on_the_path(&nodes);
    assert!(
        seen.len() > 1_000,
        "peer traffic passed: {} bytes",
        seen.len()
    );
    for secret in [lease.as_str(), "the-true-description", "worker-7", "vault"] {
        assert!(!holds(&seen, secret), "{secret} crossed in the clear");
    }

    // The path alters what the leader sends each follower next, while a change goes out.
    let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    for &f in &followers {
        nodes.peer_proxy(f).tamper(Dir::ToTarget);
    }
    let update = [
        "NS.UPDATE",
        "vault",
        "VERSION",
        "1",
        "DESC",
        "the-new-description",
    ];
    run_ready_at(nodes.addr(leader), &update).expect("the change is acknowledged");
    for &f in &followers {
        assert!(
            wait_until(Duration::from_secs(10), || {
                !nodes.log_lines_with(f, &["connection reset"]).is_empty()
            }),
            "node {f} refused the altered record and reset the link"
        );
    }

    // The old leader goes: the new one serves the change as written.
    nodes.kill9(leader);
    let mut new_leader = None;
    assert!(
        wait_until(Duration::from_secs(30), || {
            new_leader = nodes.leader();
            new_leader.is_some()
        }),
        "a new leader"
    );
    let new_leader = new_leader.unwrap();
    let ns = run_ready_at(nodes.addr(new_leader), &["NS.GET", "vault"]).unwrap();
    assert_eq!(text(&field(&ns, "description")), "the-new-description");
    let got = run_ready_at(nodes.addr(new_leader), &["LEASE.GET", "vault", &lease]).unwrap();
    assert_eq!(text(&field(&got, "process_id")), "worker-7");
    let _ = std::fs::remove_dir_all(&pki);
}
