//! Nodes of a cluster in one test process, for the cluster's tests: each its own folder and
//! Raft thread, real TCP on 127.0.0.1, started, stopped and written to through its handle.

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::auth::Secret;
use super::config::{ClusterConfig, Members, Timing};
use super::entry::ShardEntry;
use super::node::{Node, Role, Status, WriteError};
use super::stamps::Wall;
use super::tests::{journal, TempDir};
use super::tls::Transport;
use super::{LeaderId, Peer};
use crate::engine::journal::Record;
use crate::engine::types::{Metadata, Name};

/// Generous: CI is 2 loaded cores (and other tests' clusters share them).
pub(super) const WAIT: Duration = Duration::from_secs(20);
/// The bound the brief sets for a new leader after the old one stops.
pub(super) const FAILOVER: Duration = Duration::from_secs(10);

pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs `f` to completion on a runtime of the test's own (not the nodes').
pub(super) fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Polls until `cond` holds, for at most `limit`; the time it took.
pub(super) fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

pub(super) struct Cluster {
    // Fields drop in order: the nodes stop before their folders go.
    pub(super) nodes: Vec<Option<Node>>,
    pub(super) configs: Vec<ClusterConfig>,
    _dirs: Vec<TempDir>,
}

impl Cluster {
    /// The settings of `n` nodes (ids 1..=n) on free ports; node 1 forms the cluster.
    pub(super) fn new(what: &str, n: u64, timing: Timing) -> Cluster {
        let ports: Vec<u16> = (0..n).map(|_| free_port()).collect();
        let members: Members = (1..=n)
            .map(|id| {
                let peer = Peer {
                    raft_addr: format!("127.0.0.1:{}", ports[id as usize - 1]),
                    client_addr: format!("127.0.0.1:{}", 7000 + id),
                };
                (id, peer)
            })
            .collect();
        let dirs: Vec<TempDir> = (1..=n)
            .map(|id| TempDir::new(&format!("{what}-{id}")))
            .collect();
        let configs = (1..=n)
            .map(|id| ClusterConfig {
                id,
                dir: dirs[id as usize - 1].0.clone(),
                shards: 2,
                listen: members[&id].raft_addr.parse().unwrap(),
                secret: Secret::new("test secret"),
                transport: Transport::Plain,
                init: (id == 1).then(|| members.clone()),
                announce: None,
                timing: timing.clone(),
                wall: Wall::default(),
            })
            .collect();
        Cluster {
            nodes: (0..n).map(|_| None).collect(),
            configs,
            _dirs: dirs,
        }
    }

    /// Starts every node, node 1 (which forms the cluster) last.
    pub(super) fn start_all(&mut self) {
        for id in (1..=self.nodes.len() as u64).rev() {
            self.start(id);
        }
    }

    pub(super) fn start(&mut self, id: u64) {
        let node = Node::start(self.configs[id as usize - 1].clone()).unwrap();
        self.nodes[id as usize - 1] = Some(node);
        // From now on node 1 restarts as any other node: membership is in its log.
        self.configs[id as usize - 1].init = None;
    }

    pub(super) fn stop(&mut self, id: u64) {
        self.nodes[id as usize - 1].take().unwrap().shutdown();
    }

    pub(super) fn node(&self, id: u64) -> &Node {
        self.nodes[id as usize - 1].as_ref().unwrap()
    }

    pub(super) fn status(&self, id: u64) -> Status {
        self.node(id).handle().status().borrow().clone()
    }

    pub(super) fn running(&self) -> Vec<u64> {
        (1..=self.nodes.len() as u64)
            .filter(|&id| self.nodes[id as usize - 1].is_some())
            .collect()
    }

    /// Waits until every running node knows the same leader, one of them, with its leadership
    /// committed; that leader's id and leadership.
    pub(super) fn wait_leader(&self, limit: Duration) -> (u64, LeaderId, Duration) {
        let mut found = None;
        let took = wait_until("one leader known to all", limit, || {
            let statuses: Vec<Status> = self.running().iter().map(|&id| self.status(id)).collect();
            let Some(leader) = statuses[0].leader.as_ref().map(|l| l.id) else {
                return false;
            };
            let agreed = statuses
                .iter()
                .all(|s| s.leader.as_ref().map(|l| l.id) == Some(leader));
            let Some(ls) = statuses.iter().find(|s| s.id == leader) else {
                return false;
            };
            if agreed && ls.role == Role::Leader {
                found = ls.leader_id.map(|lid| (leader, lid));
            }
            found.is_some()
        });
        let (id, lid) = found.unwrap();
        (id, lid, took)
    }

    /// Writes `entries` through node `leader`, each committed before the next; a leader that
    /// no follower answered yet (just elected) is retried, as a client retries `-TRYAGAIN`.
    pub(super) fn write(&self, leader: u64, lid: LeaderId, entries: Vec<ShardEntry>) -> u64 {
        let proposer = self.node(leader).handle().proposer();
        block_on(async move {
            let mut last = 0;
            let start = Instant::now();
            for e in entries {
                loop {
                    match proposer.write(e.clone(), lid).await {
                        Ok(id) => {
                            last = id.index;
                            break;
                        }
                        Err(WriteError::NoQuorum) if start.elapsed() < WAIT => {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(e) => panic!("a write through the leader: {e:?}"),
                    }
                }
            }
            last
        })
    }

    /// Node `id`'s state machine: each shard's state.
    pub(super) fn state(&self, id: u64) -> Vec<Bytes> {
        let raft = self.node(id).handle().raft.clone();
        block_on(async move {
            raft.with_state_machine(|sm| Box::pin(async move { sm.shard_states() }))
                .await
                .unwrap()
        })
    }

    /// Waits until every running node applied `index`, then checks they hold the same state.
    pub(super) fn wait_same_state(&self, index: u64) -> Vec<Bytes> {
        for id in self.running() {
            wait_until(&format!("node {id} applies {index}"), WAIT, || {
                self.status(id).applied >= Some(index)
            });
        }
        let first = self.state(self.running()[0]);
        for id in self.running() {
            assert_eq!(self.state(id), first, "node {id}'s state");
        }
        first
    }
}

/// The single-node workload's records as entries of shard 1, three records each.
pub(super) fn workload_entries() -> Vec<ShardEntry> {
    journal()
        .1
        .chunks(3)
        .enumerate()
        .map(|(i, recs)| ShardEntry {
            shard: 1,
            now: (i as i64 + 1) * 1_000_000_000,
            records: recs.to_vec(),
        })
        .collect()
}

/// Entries that each create a namespace `<prefix>-<i>` on shard 0.
pub(super) fn namespaces(prefix: &str, n: usize) -> Vec<ShardEntry> {
    (0..n)
        .map(|i| ShardEntry {
            shard: 0,
            now: 100_000_000_000 + i as i64,
            records: vec![Record::NsPut {
                name: Name::new_unchecked(Bytes::from(format!("{prefix}-{i}"))),
                description: Bytes::new(),
                metadata: Metadata::default(),
                version: 1,
                created_at: 1,
                updated_at: 1,
            }],
        })
        .collect()
}
