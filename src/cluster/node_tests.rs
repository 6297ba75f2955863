//! Nodes of a cluster in one test process (`test_cluster.rs`): election, replication,
//! failover, restart and catch-up, snapshots to a follower far behind, `--cluster-init`'s
//! refusals and `--cluster-announce`.

use std::time::{Duration, Instant};

use super::auth::Secret;
use super::config::{ClusterConfig, Timing};
use super::entry::ShardEntry;
use super::node::{Node, ReadError, Role, Status, WriteError};
use super::stamps::Wall;
use super::test_cluster::*;
use super::tests::{journal, TempDir};
use super::tls::Transport;
use super::Peer;

#[test]
fn three_nodes_elect_replicate_fail_over_and_a_restarted_node_catches_up() {
    let mut c = Cluster::new("failover", 3, Timing::default());
    let started = Instant::now();
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    eprintln!("first leader: node {leader} after {:?}", started.elapsed());
    let follower = c.running().into_iter().find(|&id| id != leader).unwrap();

    // Entries written through the leader are applied on every node, to the same state.
    let last = c.write(leader, lid, workload_entries());
    let state = c.wait_same_state(last);
    let empty = crate::persist::snapshot::to_bytes(&Default::default(), 0, 0);
    assert_eq!(state[0], empty);
    assert_ne!(state[1], empty, "the workload's state");
    let (expected, _) = journal();
    let (nss, hwm) = expected.state();
    assert_eq!(
        state[1],
        crate::persist::snapshot::to_bytes(nss, hwm, 0),
        "the state the single node's engine holds"
    );

    // The leader reports its followers caught up; a follower knows the leader's client address.
    let ls = c.status(leader);
    assert_eq!(ls.peers.len(), 2);
    wait_until("followers' lag 0", WAIT, || {
        c.status(leader)
            .peers
            .iter()
            .all(|p| p.lag == Some(0) && p.matched == Some(last))
    });
    let fs = c.status(follower);
    assert_eq!(fs.role, Role::Follower);
    assert_eq!(
        fs.leader.as_ref().unwrap().client_addr,
        format!("127.0.0.1:{}", 7000 + leader)
    );

    // Reads: linearizable on the leader; a follower points at the leader; so do its writes.
    let (lh, fh) = (
        c.node(leader).handle().clone(),
        c.node(follower).handle().clone(),
    );
    let (on_leader, on_follower, write_on_follower) = block_on(async {
        (
            lh.ensure_linearizable().await,
            fh.ensure_linearizable().await,
            fh.proposer().write(namespaces("x", 1).remove(0), lid).await,
        )
    });
    assert_eq!(on_leader, Ok(()));
    assert_eq!(on_follower, Err(ReadError::NotLeader(Some(leader))));
    assert_eq!(write_on_follower, Err(WriteError::NotLeader(Some(leader))));

    // The leader stops: a new one is elected within the bound, and writes go on.
    let stopped_at = Instant::now();
    c.stop(leader);
    let (new_leader, new_lid, _) = c.wait_leader(FAILOVER);
    let failover = stopped_at.elapsed();
    eprintln!("failover: node {new_leader} leads {failover:?} after node {leader} stopped");
    assert_ne!(new_leader, leader);
    assert!(new_lid.term > lid.term);
    // A write naming the old leadership is refused, not applied.
    let stale = c.node(new_leader).handle().clone();
    let refused = block_on(async move {
        stale
            .proposer()
            .write(namespaces("stale", 1).remove(0), lid)
            .await
    });
    assert_eq!(refused, Err(WriteError::NotLeader(Some(new_leader))));
    let last = c.write(new_leader, new_lid, namespaces("after", 20));

    // The old leader restarts on its folder and catches up to the same state.
    c.start(leader);
    let state = c.wait_same_state(last);
    assert_ne!(state[0], empty, "the namespaces written after the failover");
    assert_eq!(c.status(leader).role, Role::Follower);

    // A leader hands leadership to another node when asked.
    let (cur, _, _) = c.wait_leader(WAIT);
    let to = c.running().into_iter().find(|&id| id != cur).unwrap();
    let h = c.node(cur).handle().clone();
    block_on(async move { h.transfer_leader(to).await }).unwrap();
    wait_until("leadership transferred", WAIT, || {
        c.status(to).role == Role::Leader
    });
}

#[test]
fn a_follower_far_behind_catches_up_by_a_snapshot() {
    // Snapshots every 10 entries, and the log keeps none that one holds.
    let timing = Timing {
        snapshot_after: 10,
        keep_after_snapshot: 0,
        ..Timing::default()
    };
    let mut c = Cluster::new("snapshot", 3, timing);
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let behind = c.running().into_iter().find(|&id| id != leader).unwrap();
    let last = c.write(leader, lid, namespaces("a", 3));
    c.wait_same_state(last);
    c.stop(behind);

    let last = c.write(leader, lid, namespaces("b", 40));
    wait_until(
        "the leader purges what the stopped follower lacks",
        WAIT,
        || c.status(leader).purged > Some(last - 20),
    );
    c.start(behind);
    let state = c.wait_same_state(last);
    let bs = c.status(behind);
    assert!(
        bs.snapshot > Some(last - 20),
        "the follower installed a snapshot past its log: {bs:?}"
    );
    // The state names all 43 namespaces (shard 0), after a restart from the snapshot too.
    c.stop(behind);
    c.start(behind);
    assert_eq!(c.wait_same_state(last), state);
}

#[test]
fn every_node_snapshots_and_purges_its_log_once_it_grew_by_snapshot_after_bytes() {
    // Never by count here: only the bytes appended ask for a snapshot. The log keeps 50
    // entries a snapshot holds, so that a follower purges after its own snapshot, not after
    // one the leader sent it.
    let timing = Timing {
        snapshot_after: 1_000_000,
        snapshot_after_bytes: 4 << 10,
        keep_after_snapshot: 50,
        ..Timing::default()
    };
    let mut c = Cluster::new("by-size", 3, timing);
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    // 100 bytes of frame each: a few entries stay far below 4 KiB.
    let few = c.write(leader, lid, namespaces("a", 5));
    c.wait_same_state(few);
    for id in c.running() {
        assert_eq!(
            c.status(id).snapshot,
            None,
            "node {id} snapshotted below the size"
        );
    }
    let last = c.write(leader, lid, namespaces("b", 200));
    let state = c.wait_same_state(last);
    for id in c.running() {
        wait_until(&format!("node {id} purges by size"), WAIT, || {
            c.status(id).purged.is_some()
        });
    }
    // The state is whole after a restart from the snapshot and what the log kept.
    c.stop(leader);
    c.start(leader);
    assert_eq!(c.wait_same_state(last), state);
}

/// Snapshots by count, every 100 entries, keeping 1,000 entries of each but at most 2 KiB of
/// them: with 100 bytes of frame an entry (`namespaces`), 20. By count alone a few hundred
/// entries would purge nothing.
fn keeping_2_kib() -> Timing {
    Timing {
        snapshot_after: 100,
        keep_after_snapshot: 1_000,
        keep_after_snapshot_bytes: 2 << 10,
        ..Timing::default()
    }
}

/// Whether a node under [`keeping_2_kib`] purged by size: it keeps at most 40 entries of its
/// snapshot (20, with some slack), where the count would keep them all.
fn kept_by_size(s: &Status) -> bool {
    matches!((s.snapshot, s.purged), (Some(snap), Some(p)) if snap - p <= 40)
}

#[test]
fn every_node_keeps_at_most_keep_after_snapshot_bytes_of_what_its_snapshot_holds() {
    let mut c = Cluster::new("keep-bytes", 3, keeping_2_kib());
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let last = c.write(leader, lid, namespaces("k", 350));
    let state = c.wait_same_state(last);
    for id in c.running() {
        wait_until(&format!("node {id} purges by size"), WAIT, || {
            let s = c.status(id);
            s.snapshot.is_some_and(|snap| snap + 100 > last) && kept_by_size(&s)
        });
        let s = c.status(id);
        let kept = s.snapshot.unwrap() - s.purged.unwrap();
        assert!(
            kept >= 10,
            "node {id} kept {kept} entries of its snapshot: {s:?}"
        );
    }
    // Restarted from the snapshot and the entries kept, a follower has the same state.
    let follower = c.running().into_iter().find(|&id| id != leader).unwrap();
    c.stop(follower);
    c.start(follower);
    assert_eq!(c.wait_same_state(last), state);
}

#[test]
fn a_leader_keeps_by_count_what_a_stopped_follower_lacks_and_by_size_once_it_is_back() {
    let mut c = Cluster::new("keep-lagging", 3, keeping_2_kib());
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let mut followers = c.running().into_iter().filter(|&id| id != leader);
    let (up, down) = (followers.next().unwrap(), followers.next().unwrap());
    // What the follower stopped has (every node has it once all applied it).
    let has = c.status(leader).last_index;
    wait_until("every node has it", WAIT, || {
        [up, down].iter().all(|&id| c.status(id).applied == has)
    });
    c.stop(down);
    let last = c.write(leader, lid, namespaces("l", 250));
    // The follower still up purges by size after its snapshot ...
    wait_until("the follower up purges by size", WAIT, || {
        c.status(up).purged.is_some()
    });
    // ... the leader keeps, of its snapshot's entries, all the stopped one lacks.
    let ls = c.status(leader);
    assert!(ls.snapshot >= Some(199), "the leader snapshotted: {ls:?}");
    std::thread::sleep(Duration::from_millis(500));
    let ls = c.status(leader);
    assert!(
        ls.purged <= has,
        "the leader purged what node {down} lacks: {ls:?}"
    );
    // Back, the follower catches up from the leader's log (no snapshot sent: it builds its
    // own), and at the next snapshot the leader purges by size.
    c.start(down);
    c.wait_same_state(last);
    let ds = c.status(down);
    // A snapshot installed purges all it holds.
    assert!(
        ds.purged.is_none() || ds.purged < ds.snapshot,
        "the follower was sent a snapshot: {ds:?}"
    );
    let last = c.write(leader, lid, namespaces("m", 100));
    c.wait_same_state(last);
    wait_until("the leader purges by size", WAIT, || {
        kept_by_size(&c.status(leader))
    });
}

#[test]
fn cluster_init_refuses_when_a_peer_already_belongs_to_a_cluster() {
    let dir = TempDir::new("init-1");
    let port = free_port();
    let one = |dir: &TempDir| ClusterConfig {
        id: 1,
        dir: dir.0.clone(),
        shards: 1,
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        secret: Secret::new("s"),
        transport: Transport::default(),
        init: Some(
            [(
                1,
                Peer {
                    raft_addr: format!("127.0.0.1:{port}"),
                    client_addr: "127.0.0.1:7001".into(),
                },
            )]
            .into(),
        ),
        announce: None,
        timing: Timing::default(),
        wall: Wall::default(),
    };
    // A cluster of one: it leads at once.
    let node1 = Node::start(one(&dir)).unwrap();
    wait_until("node 1 leads", WAIT, || {
        node1.handle().status().borrow().role == Role::Leader
    });

    // Node 2, on an empty dir, names node 1 in its --cluster-init: refused.
    let dir2 = TempDir::new("init-2");
    let port2 = free_port();
    let mut two = one(&dir2);
    two.id = 2;
    two.listen = format!("127.0.0.1:{port2}").parse().unwrap();
    let mut members = two.init.clone().unwrap();
    members.insert(
        2,
        Peer {
            raft_addr: format!("127.0.0.1:{port2}"),
            client_addr: "127.0.0.1:7002".into(),
        },
    );
    two.init = Some(members.clone());
    let err = Node::start(two.clone()).err().expect("refused");
    assert!(
        err.contains(&format!(
            "node 1 at 127.0.0.1:{port} already belongs to a cluster"
        )),
        "{err}"
    );
    // It left nothing that belongs to a cluster: started plainly, it waits, uninitialized.
    two.init = None;
    let node2 = Node::start(two.clone()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(node2.handle().status().borrow().leader, None);
    node2.shutdown();

    // A peer with another secret: refused at once, not waited for.
    let mut wrong = two.clone();
    wrong.secret = Secret::new("other");
    wrong.init = Some(members);
    let t = Instant::now();
    let err = Node::start(wrong).err().expect("refused");
    assert!(err.contains("does not know the cluster secret"), "{err}");
    assert!(t.elapsed() < WAIT);

    // Node 1 again with --cluster-init, on its dir that already holds a cluster: refused.
    node1.shutdown();
    let err = Node::start(one(&dir)).err().expect("refused");
    assert!(
        err.contains("this node already belongs to a cluster"),
        "{err}"
    );
}

#[test]
fn a_leader_cut_off_from_its_followers_takes_no_writes() {
    let mut c = Cluster::new("cutoff", 3, Timing::default());
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let last = c.write(leader, lid, namespaces("a", 2));
    c.wait_same_state(last);
    for id in c.running().into_iter().filter(|&id| id != leader) {
        c.stop(id);
    }
    // Once its lease lapses with no quorum behind it (the election timeout, at most 1 s),
    // CheckQuorum refuses new writes at once: nothing is appended that could never commit.
    std::thread::sleep(Duration::from_secs(3));
    let h = c.node(leader).handle().clone();
    let (refused, read) = block_on(async move {
        let proposer = h.proposer();
        let refused =
            tokio::time::timeout(WAIT, proposer.write(namespaces("b", 1).remove(0), lid)).await;
        let read = tokio::time::timeout(Duration::from_secs(5), h.ensure_linearizable()).await;
        (refused, read)
    });
    assert_eq!(refused, Ok(Err(WriteError::NoQuorum)));
    let s = c.status(leader);
    assert_eq!(
        (s.committed, s.last_index),
        (Some(last), Some(last)),
        "nothing appended"
    );
    // Nor is a read served: no quorum confirms the leadership.
    assert!(!matches!(read, Ok(Ok(()))), "{read:?}");
}

/// Every node's client address as node `id`'s membership has it.
fn client_addrs(c: &Cluster, id: u64) -> Vec<(u64, String)> {
    let s = c.status(id);
    let mut addrs: Vec<(u64, String)> = s
        .peers
        .iter()
        .map(|p| (p.id, p.client_addr.clone()))
        .collect();
    addrs.extend(s.client_addr.map(|a| (id, a)));
    addrs.sort();
    addrs
}

/// Waits until every running node's membership has the client addresses `want`.
fn wait_client_addrs(c: &Cluster, want: &[(u64, &str)]) {
    let want: Vec<(u64, String)> = want.iter().map(|&(id, a)| (id, a.into())).collect();
    for id in c.running() {
        wait_until(&format!("node {id} shows {want:?}"), WAIT, || {
            client_addrs(c, id) == want
        });
    }
}

#[test]
fn cluster_announce_puts_a_nodes_address_in_the_membership_and_writes_go_on() {
    let mut c = Cluster::new("announce", 3, Timing::default());
    // Node 1's own entry at --cluster-init; node 3 asks the leader (or does it as the leader).
    c.configs[0].announce = Some("192.0.2.1:7001".into());
    c.configs[2].announce = Some("192.0.2.3:7003".into());
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    wait_client_addrs(
        &c,
        &[
            (1, "192.0.2.1:7001"),
            (2, "127.0.0.1:7002"),
            (3, "192.0.2.3:7003"),
        ],
    );
    // The change of a node's address (a membership entry) did not disturb the shards' entries.
    let last = c.write(leader, lid, workload_entries());
    c.wait_same_state(last);
    // The cluster addresses did not change.
    let s = c.status(1);
    assert!(s
        .peers
        .iter()
        .all(|p| p.raft_addr == c.configs[p.id as usize - 1].listen.to_string()));

    // A node restarted with an address of its own gets it in, whoever leads.
    c.stop(2);
    c.configs[1].announce = Some("[::1]:7002".into());
    c.start(2);
    wait_client_addrs(
        &c,
        &[
            (1, "192.0.2.1:7001"),
            (2, "[::1]:7002"),
            (3, "192.0.2.3:7003"),
        ],
    );
    let (leader, lid, _) = c.wait_leader(WAIT);
    let last = c.write(leader, lid, namespaces("after", 5));
    c.wait_same_state(last);
    assert_eq!(c.status(leader).leader.unwrap().client_addr, {
        let want = ["192.0.2.1:7001", "[::1]:7002", "192.0.2.3:7003"];
        want[leader as usize - 1].to_string()
    });
}

#[test]
fn a_leader_announces_its_own_address_itself() {
    // A cluster of one leads at once: its restart with --cluster-announce changes its entry
    // on its own.
    let mut c = Cluster::new("announce-one", 1, Timing::default());
    c.start_all();
    c.wait_leader(WAIT);
    wait_client_addrs(&c, &[(1, "127.0.0.1:7001")]);
    c.stop(1);
    c.configs[0].announce = Some("192.0.2.1:17001".into());
    c.start(1);
    wait_client_addrs(&c, &[(1, "192.0.2.1:17001")]);
    assert_eq!(c.status(1).role, Role::Leader);
}

#[test]
fn a_follower_knows_the_leaders_clock_from_its_appends_send_times_not_the_entries_now() {
    let mut c = Cluster::new("clock-evidence", 3, Timing::default());
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let stamped = |c: &Cluster| {
        c.running()
            .into_iter()
            .filter(|&id| id != leader)
            .any(|id| {
                c.node(id)
                    .handle()
                    .recent_stamps()
                    .iter()
                    .any(|s| s.leader == leader)
            })
    };
    // Until its shards serve (here: until the test says so), a leader's appends carry no
    // time: a leader whose clock the guard refused is no one's reference. Five heartbeats.
    std::thread::sleep(Duration::from_millis(500));
    assert!(!stamped(&c), "stamps from a leader that did not vouch");
    c.configs[leader as usize - 1].wall.vouch(lid.term);
    // Entries stamped 5 s before they are sent, as a follower sees entries that reach it, or
    // commit, late (after a restart, after the next election): taken as evidence, they made a
    // survivor refuse to lead.
    let wall = Wall::default();
    let old = wall.now() - 5_000_000_000;
    let entries = (0..20)
        .map(|_| ShardEntry {
            shard: 0,
            now: old,
            records: Vec::new(),
        })
        .collect();
    c.write(leader, lid, entries);
    // Each follower's bound on its offset from the leader's clock is the transit of the
    // leader's appends, far within the guard's 500 ms (a write needs one follower only: the
    // other's first stamps may come a moment later).
    for id in c.running().into_iter().filter(|&id| id != leader) {
        let least = || {
            c.node(id)
                .handle()
                .recent_stamps()
                .iter()
                .filter(|s| s.leader == leader)
                .map(|s| s.ahead_at(wall.now()))
                .min()
        };
        wait_until("a stamp from the leader", WAIT, || least().is_some());
        let least = least();
        assert!(
            least.is_some_and(|ns| ns < 200_000_000),
            "node {id}: {least:?}"
        );
    }
}
