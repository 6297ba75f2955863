//! The cluster as this node knows it: which nodes there are, which one is the leader (the
//! master of the one slot range, 0-16383), and which one is this node. Every reply that
//! describes the cluster renders from here: `CLUSTER SLOTS|SHARDS|NODES|INFO|MYID`, `ROLE`,
//! `INFO cluster` and `INFO replication`, and the `mode`/`role` of HELLO and INFO, so that they
//! can never disagree with each other.
//!
//! Today a server is the single node of a one-node cluster: it leads and serves every slot
//! ([`Topology::single`]). Replication (SPEC §10) plugs in here and nowhere else in these
//! replies: it builds the topology from the cluster's membership (each peer with its announced
//! address), sets `leader` to the node its consensus elected (`None` while there is none) and
//! `epoch` to that leader's term, and replaces it whenever either changes (`Global` would then
//! hold it behind a lock or a watch instead of by value). The renderers below already answer
//! for any such topology as Redis Cluster does: a follower lists the leader's range with itself
//! among the replicas, says `ROLE` `slave` and `role:slave`, and with no leader `CLUSTER INFO`
//! says `cluster_state:fail` and no slot is served.
//!
//! The address a node is announced at: each peer's own, and this node's is the local address
//! the asking client reached, as seen on its connection (a single node does not know a better
//! one: bound to 0.0.0.0, each client is told the address it used), with the port of the
//! listener it came in on, so that a TLS client is sent to the TLS port and a plain one to the
//! plain port (Redis with `tls-cluster yes` does the same).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::command::slot::SLOTS;
use crate::error::Error;
use crate::protocol::Reply;

/// A node's id in Redis Cluster's form: 40 lowercase hex characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeId(String);

impl NodeId {
    /// The id of the single node whose data directory is `dir`, listening on `port`: the first
    /// 20 bytes of the SHA-256 of the directory's canonical path and the port, in hex. Cluster
    /// clients key their view of a cluster by node id, so it must stay the same across
    /// restarts of the same node; deriving it keeps it so without writing anything new into the
    /// data directory, whose format is the same with and without cluster support (SPEC §10).
    /// The canonical path, so that `./data` and `/srv/data` name one node; the port, so that
    /// the same directory served on another port (another address for clients) is another
    /// node. Should the directory not resolve, its path as given is used.
    pub fn derive(dir: &Path, port: u16) -> NodeId {
        let canonical = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
        let mut h = Sha256::new();
        h.update(canonical.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update(port.to_be_bytes());
        let digest = h.finalize();
        NodeId(digest[..20].iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The id of node `n` of a cluster (`--cluster-node-id`): the first 20 bytes of the SHA-256
    /// of its number, in hex. Every node derives the same id for it, so that all of them name
    /// the same nodes in CLUSTER NODES and SLOTS, and it stays across restarts.
    pub fn of_member(n: u64) -> NodeId {
        let mut h = Sha256::new();
        h.update(b"permitd cluster node ");
        h.update(n.to_be_bytes());
        let digest = h.finalize();
        NodeId(digest[..20].iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The 40 characters.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// One node of the cluster.
#[derive(Debug, Clone)]
struct Node {
    id: NodeId,
    /// Its announced address; `None` for this node, which is announced at the address each
    /// client reached.
    ip: Option<IpAddr>,
    /// Its plain client port.
    port: u16,
    /// Its TLS client port, when it has one.
    tls_port: Option<u16>,
    /// Whether the leader lost touch with it (a follower the leader's RPCs go unanswered by):
    /// shown `fail` in `CLUSTER NODES` and `failed` in `CLUSTER SHARDS`, and left out of the
    /// replicas `CLUSTER SLOTS`, `ROLE` and `INFO replication` list, as Redis leaves out a
    /// failed replica. Known on the leader only.
    failed: bool,
}

/// A voter of a cluster as the topology shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// Its node number (`--cluster-node-id`).
    pub id: u64,
    /// Its client address, resolved.
    pub at: SocketAddr,
    /// Whether the leader lost touch with it ([`Node`]'s `failed`).
    pub failed: bool,
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct Topology {
    nodes: Vec<Node>,
    /// This node, an index in `nodes`.
    me: usize,
    /// The node serving every slot, an index in `nodes`; the others are its replicas.
    leader: Option<usize>,
    /// The leader last known, while none is (an election): `CLUSTER SLOTS` and `SHARDS` keep
    /// showing it, as Redis Cluster keeps a failed master's slots until a failover, so that
    /// cluster clients keep their slot map and get `CLUSTERDOWN` (an empty map makes redis-py
    /// fail and ioredis drop every connection).
    last_leader: Option<usize>,
    /// The configuration epoch (Redis's `currentEpoch`/`configEpoch`): 0 until a cluster
    /// elects a leader, its term after that.
    epoch: u64,
}

/// Who asks: what this node's address is to them, and whether they came over TLS.
#[derive(Debug, Clone, Copy)]
pub struct Viewer {
    ip: IpAddr,
    tls: bool,
}

/// The value of `redis_mode` (INFO) and `mode` (HELLO): every server is a node of a cluster,
/// a one-node cluster when it runs alone, as `CLUSTER INFO` says (`cluster_enabled:1`).
pub const MODE: &str = "cluster";

/// The cluster bus port shown in `CLUSTER NODES` (`ip:port@cport`): no bus listens yet, and
/// Redis shows 0 for a port it does not know.
const BUS_PORT: u16 = 0;

impl Topology {
    /// A server on its own: one node, leading, serving every slot.
    pub fn single(id: NodeId, port: u16, tls_port: Option<u16>) -> Topology {
        let me = Node {
            id,
            ip: None,
            port,
            tls_port,
            failed: false,
        };
        Topology {
            nodes: vec![me],
            me: 0,
            leader: Some(0),
            last_leader: None,
            epoch: 0,
        }
    }

    /// Node `me` of a cluster whose voters are `members` (this node among them), led by
    /// `leader` (`None` while none is known; `last_leader` led before) in `term`. This node is
    /// shown at `announced` (its `--cluster-announce`, as the others show it) or else at the
    /// address each client reached, on `port` and `tls_port`, as a single node is; a peer at
    /// its announced address. An announced address is one port: TLS clients are sent there
    /// too, as they are to every peer.
    pub fn clustered(
        (me, announced): (u64, Option<SocketAddr>),
        port: u16,
        tls_port: Option<u16>,
        members: &[Member],
        (leader, last_leader): (Option<u64>, Option<u64>),
        term: u64,
    ) -> Topology {
        let mut t = Topology::single(NodeId::of_member(me), port, tls_port);
        if let Some(at) = announced {
            let mine = &mut t.nodes[0];
            mine.ip = Some(at.ip().to_canonical());
            mine.port = at.port();
            mine.tls_port = None;
        }
        let mut ids = vec![me];
        for m in members.iter().filter(|m| m.id != me) {
            t.nodes.push(Node {
                id: NodeId::of_member(m.id),
                ip: Some(m.at.ip().to_canonical()),
                port: m.at.port(),
                tls_port: None,
                failed: m.failed,
            });
            ids.push(m.id);
        }
        let index = |l: Option<u64>| l.and_then(|l| ids.iter().position(|&id| id == l));
        t.leader = index(leader);
        t.last_leader = index(last_leader);
        t.epoch = term;
        t
    }

    /// What a node that does not lead answers a namespace command of hash slot `slot` (SPEC
    /// §10): `MOVED` to the leader's client address, `CLUSTERDOWN` while no leader is known;
    /// `None` on the leader.
    pub fn refusal(&self, slot: u16) -> Option<Error> {
        match self.leader {
            Some(l) if l == self.me => None,
            Some(l) => {
                let n = &self.nodes[l];
                Some(Error::Moved(format!(
                    "{slot} {}:{}",
                    Self::peer_ip(n),
                    n.port
                )))
            }
            None => Some(Error::ClusterDown("no leader".into())),
        }
    }

    /// This node's id (`CLUSTER MYID`, INFO's `master_replid`).
    pub fn my_id(&self) -> &NodeId {
        &self.nodes[self.me].id
    }

    /// Whether a leader is known (always on a single node): `/health` answers 200 only then.
    pub fn knows_leader(&self) -> bool {
        self.leader.is_some()
    }

    /// The role of HELLO's `role` and INFO's `role:`: `master` on the leader.
    pub fn role_name(&self) -> &'static str {
        if self.leader == Some(self.me) {
            "master"
        } else {
            "slave"
        }
    }

    /// The client whose connection's local end is `laddr`.
    pub fn viewer(&self, laddr: SocketAddr) -> Viewer {
        Viewer {
            ip: laddr.ip().to_canonical(),
            tls: self.nodes[self.me].tls_port == Some(laddr.port()),
        }
    }

    /// Node `n`'s address as `v` reaches it: its announced one, or for this node the one `v`
    /// connected to.
    fn ip_for(n: &Node, v: Viewer) -> String {
        n.ip.unwrap_or(v.ip).to_string()
    }

    /// Node `n`'s port on the kind of listener `v` came in on (TLS or plain).
    fn port_for(n: &Node, v: Viewer) -> u16 {
        match (v.tls, n.tls_port) {
            (true, Some(tls)) => tls,
            _ => n.port,
        }
    }

    /// A peer's announced address, for the replies that only ever name peers (a leader's
    /// replicas, a follower's leader).
    fn peer_ip(n: &Node) -> String {
        n.ip.map(|ip| ip.to_string()).unwrap_or_default()
    }

    /// The nodes serving the slots, leader first (the last known one during an election),
    /// then its replicas; none before any leader was known.
    fn serving(&self) -> Vec<&Node> {
        let Some(leader) = self.leader.or(self.last_leader) else {
            return Vec::new();
        };
        let replicas = self.nodes.iter().enumerate().filter(|&(i, _)| i != leader);
        std::iter::once(&self.nodes[leader])
            .chain(replicas.map(|(_, n)| n))
            .collect()
    }

    /// The serving nodes the leader is in touch with: the ones clients may be sent to.
    fn answering(&self) -> Vec<&Node> {
        self.serving().into_iter().filter(|n| !n.failed).collect()
    }

    /// `CLUSTER SLOTS`: the range `[0, 16383, master, replica...]`, each node as
    /// `[ip, port, id, {}]` (the map holds the endpoints other than the preferred one, the ip:
    /// none, as no node has a hostname).
    pub fn cluster_slots(&self, v: Viewer) -> Reply {
        let nodes = self.answering();
        if nodes.is_empty() {
            return Reply::Array(Vec::new());
        }
        let mut range = vec![Reply::Int(0), Reply::Int(i64::from(SLOTS - 1))];
        range.extend(nodes.into_iter().map(|n| {
            Reply::Array(vec![
                Reply::bulk(Self::ip_for(n, v)),
                Reply::Int(i64::from(Self::port_for(n, v))),
                Reply::bulk(n.id.0.clone()),
                Reply::Map(Vec::new()),
            ])
        }));
        Reply::Array(vec![Reply::Array(range)])
    }

    /// `CLUSTER SHARDS`: the one shard, `{slots: [0, 16383], nodes: [...]}`, each node with
    /// Redis 7.0's fields in its order (`tls-port` only for a node that has one).
    pub fn cluster_shards(&self, v: Viewer) -> Reply {
        let nodes = self.serving();
        if nodes.is_empty() {
            return Reply::Array(Vec::new());
        }
        let details = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let ip = Self::ip_for(n, v);
                let mut f = vec![
                    ("id", Reply::bulk(n.id.0.clone())),
                    ("port", Reply::Int(i64::from(n.port))),
                ];
                if let Some(tls) = n.tls_port {
                    f.push(("tls-port", Reply::Int(i64::from(tls))));
                }
                f.extend([
                    ("ip", Reply::bulk(ip.clone())),
                    ("endpoint", Reply::bulk(ip)),
                    (
                        "role",
                        Reply::text(if i == 0 { "master" } else { "replica" }),
                    ),
                    // No replication stream: nothing sent yet, as on a Redis master that
                    // never had a replica.
                    ("replication-offset", Reply::Int(0)),
                    (
                        "health",
                        Reply::text(if n.failed { "failed" } else { "online" }),
                    ),
                ]);
                Reply::fields(f)
            })
            .collect();
        Reply::Array(vec![Reply::fields(vec![
            (
                "slots",
                Reply::Array(vec![Reply::Int(0), Reply::Int(i64::from(SLOTS - 1))]),
            ),
            ("nodes", Reply::Array(details)),
        ])])
    }

    /// `CLUSTER NODES`: one line per node, Redis's
    /// `id ip:port@cport flags master ping-sent pong-recv config-epoch link-state slots`.
    pub fn cluster_nodes(&self, v: Viewer) -> String {
        let mut out = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let leads = self.leader == Some(i);
            let myself = if i == self.me { "myself," } else { "" };
            let role = match (leads, n.failed) {
                (true, _) => "master",
                (false, false) => "slave",
                (false, true) => "slave,fail",
            };
            let link = if n.failed {
                "disconnected"
            } else {
                "connected"
            };
            let master = match self.leader {
                Some(l) if !leads => self.nodes[l].id.as_str(),
                _ => "-",
            };
            let slots = if leads {
                format!(" 0-{}", SLOTS - 1)
            } else {
                String::new()
            };
            // Ping sent and pong received are 0: no bus pings anyone yet (and Redis shows 0
            // for itself).
            out.push_str(&format!(
                "{} {}:{}@{BUS_PORT} {myself}{role} {master} 0 0 {} {link}{slots}\n",
                n.id.as_str(),
                Self::ip_for(n, v),
                Self::port_for(n, v),
                self.epoch,
            ));
        }
        out
    }

    /// `CLUSTER INFO`: Redis 7.0's fields, in its order.
    pub fn cluster_info(&self) -> String {
        let (state, served) = match self.leader {
            Some(_) => ("ok", SLOTS),
            None => ("fail", 0),
        };
        let fields: [(&str, String); 12] = [
            ("cluster_state", state.into()),
            ("cluster_slots_assigned", served.to_string()),
            ("cluster_slots_ok", served.to_string()),
            ("cluster_slots_pfail", "0".into()),
            ("cluster_slots_fail", "0".into()),
            ("cluster_known_nodes", self.nodes.len().to_string()),
            // Masters that serve slots.
            ("cluster_size", u8::from(self.leader.is_some()).to_string()),
            ("cluster_current_epoch", self.epoch.to_string()),
            ("cluster_my_epoch", self.epoch.to_string()),
            // No cluster bus: no message was sent or received, no link overflowed.
            ("cluster_stats_messages_sent", "0".into()),
            ("cluster_stats_messages_received", "0".into()),
            ("total_cluster_links_buffer_limit_exceeded", "0".into()),
        ];
        fields.iter().map(|(k, v)| format!("{k}:{v}\r\n")).collect()
    }

    /// `ROLE`: `[master, offset, [[ip, port, offset] per replica]]` on the leader;
    /// `[slave, leader ip, leader port, state, offset]` on a follower, whose state is
    /// `connected` while it knows a leader and `connect` (with no address, offset -1) while it
    /// does not.
    pub fn role(&self) -> Reply {
        match self.leader {
            Some(l) if l == self.me => {
                let replicas = self.answering()[1..]
                    .iter()
                    .map(|n| {
                        Reply::Array(vec![
                            Reply::bulk(Self::peer_ip(n)),
                            Reply::bulk(n.port.to_string()),
                            Reply::bulk("0"),
                        ])
                    })
                    .collect();
                Reply::Array(vec![
                    Reply::text("master"),
                    Reply::Int(0),
                    Reply::Array(replicas),
                ])
            }
            Some(l) => {
                let leader = &self.nodes[l];
                Reply::Array(vec![
                    Reply::text("slave"),
                    Reply::bulk(Self::peer_ip(leader)),
                    Reply::Int(i64::from(leader.port)),
                    Reply::text("connected"),
                    Reply::Int(0),
                ])
            }
            None => Reply::Array(vec![
                Reply::text("slave"),
                Reply::bulk(""),
                Reply::Int(0),
                Reply::text("connect"),
                Reply::Int(-1),
            ]),
        }
    }

    /// INFO's `# Cluster` fields: `cluster_enabled:1`, on every node (a single permitd is a
    /// one-node cluster). As in Redis 7.0, CLUSTER INFO does not repeat it.
    pub fn info_cluster(&self) -> Vec<(String, String)> {
        vec![("cluster_enabled".into(), "1".into())]
    }

    /// INFO's `# Replication` fields, Redis 7.0's that apply (no backlog: nothing replicates
    /// through one).
    pub fn info_replication(&self) -> Vec<(String, String)> {
        let mut f: Vec<(String, String)> = vec![("role".into(), self.role_name().into())];
        let kv = |k: &str, v: String| (k.to_string(), v);
        match self.leader {
            Some(l) if l == self.me => {
                let replicas = &self.answering()[1..];
                f.push(kv("connected_slaves", replicas.len().to_string()));
                for (i, n) in replicas.iter().enumerate() {
                    f.push(kv(
                        &format!("slave{i}"),
                        format!(
                            "ip={},port={},state=online,offset=0,lag=0",
                            Self::peer_ip(n),
                            n.port
                        ),
                    ));
                }
            }
            leader => {
                let (host, port, link) = match leader {
                    Some(l) => (Self::peer_ip(&self.nodes[l]), self.nodes[l].port, "up"),
                    None => (String::new(), 0, "down"),
                };
                f.push(kv("master_host", host));
                f.push(kv("master_port", port.to_string()));
                f.push(kv("master_link_status", link.into()));
                f.push(kv("connected_slaves", "0".into()));
            }
        }
        f.extend([
            kv("master_failover_state", "no-failover".into()),
            kv("master_replid", self.my_id().0.clone()),
            kv("master_replid2", "0".repeat(40)),
            kv("master_repl_offset", "0".into()),
            kv("second_repl_offset", "-1".into()),
            kv("repl_backlog_active", "0".into()),
        ]);
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Proto;

    fn resp(r: &Reply, proto: Proto) -> String {
        let mut out = bytes::BytesMut::new();
        r.encode(proto, &mut out);
        String::from_utf8(out.to_vec()).unwrap()
    }

    fn id(c: char) -> NodeId {
        NodeId(c.to_string().repeat(40))
    }

    fn at(ip: &str) -> Viewer {
        Viewer {
            ip: ip.parse().unwrap(),
            tls: false,
        }
    }

    /// Three nodes seen from node `me`, with `leader` leading.
    fn three(me: usize, leader: Option<usize>) -> Topology {
        let node = |c, ip: &str, port| Node {
            id: id(c),
            ip: Some(ip.parse().unwrap()),
            port,
            tls_port: None,
            failed: false,
        };
        let mut nodes = vec![
            node('a', "10.0.0.1", 7001),
            node('b', "10.0.0.2", 7002),
            node('c', "10.0.0.3", 7003),
        ];
        nodes[me].ip = None;
        Topology {
            nodes,
            me,
            leader,
            last_leader: None,
            epoch: 4,
        }
    }

    #[test]
    fn node_ids_are_stable_hex_per_directory_and_port() {
        let dir = std::env::temp_dir();
        let a = NodeId::derive(&dir, 6379);
        assert_eq!(a.as_str().len(), 40);
        assert!(a
            .as_str()
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));
        assert_eq!(a, NodeId::derive(&dir, 6379));
        assert_eq!(
            a,
            NodeId::derive(&dir.join("."), 6379),
            "the canonical path"
        );
        assert_ne!(a, NodeId::derive(&dir, 6380));
        assert_ne!(a, NodeId::derive(&dir.join("other"), 6379));
    }

    #[test]
    fn a_single_node_serves_every_slot_at_the_address_it_was_reached() {
        let t = Topology::single(id('f'), 6379, Some(6380));
        let f = "f".repeat(40);
        let plain = t.viewer("127.0.0.1:6379".parse().unwrap());
        assert_eq!(
            resp(&t.cluster_slots(plain), Proto::Resp2),
            format!("*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$9\r\n127.0.0.1\r\n:6379\r\n$40\r\n{f}\r\n*0\r\n")
        );
        let tls = t.viewer("[::ffff:10.1.2.3]:6380".parse().unwrap());
        assert_eq!(
            resp(&t.cluster_slots(tls), Proto::Resp3),
            format!(
                "*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n$8\r\n10.1.2.3\r\n:6380\r\n$40\r\n{f}\r\n%0\r\n"
            )
        );
        assert_eq!(
            t.cluster_nodes(plain),
            format!("{f} 127.0.0.1:6379@0 myself,master - 0 0 0 connected 0-16383\n")
        );
        assert_eq!(
            t.cluster_nodes(tls),
            format!("{f} 10.1.2.3:6380@0 myself,master - 0 0 0 connected 0-16383\n")
        );
        let shards = resp(&t.cluster_shards(plain), Proto::Resp3);
        assert_eq!(
            shards,
            format!(
                "*1\r\n%2\r\n$5\r\nslots\r\n*2\r\n:0\r\n:16383\r\n$5\r\nnodes\r\n*1\r\n%8\r\n\
                 $2\r\nid\r\n$40\r\n{f}\r\n$4\r\nport\r\n:6379\r\n$8\r\ntls-port\r\n:6380\r\n\
                 $2\r\nip\r\n$9\r\n127.0.0.1\r\n$8\r\nendpoint\r\n$9\r\n127.0.0.1\r\n\
                 $4\r\nrole\r\n$6\r\nmaster\r\n$18\r\nreplication-offset\r\n:0\r\n\
                 $6\r\nhealth\r\n$6\r\nonline\r\n"
            )
        );
        assert!(t.cluster_info().starts_with(
            "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n\
             cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:1\r\n\
             cluster_size:1\r\ncluster_current_epoch:0\r\ncluster_my_epoch:0\r\n"
        ));
        assert_eq!(
            resp(&t.role(), Proto::Resp2),
            "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n"
        );
        assert_eq!(t.role_name(), "master");
        let repl = t.info_replication();
        assert_eq!(repl[0], ("role".into(), "master".into()));
        assert_eq!(repl[1], ("connected_slaves".into(), "0".into()));
        assert!(repl.contains(&("master_replid".into(), f)));
    }

    #[test]
    fn a_follower_shows_the_leaders_range_with_itself_as_replica() {
        let t = three(1, Some(0));
        let v = at("10.0.0.2");
        let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        assert_eq!(t.my_id().as_str(), b);
        let Reply::Array(ranges) = t.cluster_slots(v) else {
            panic!()
        };
        let Reply::Array(range) = &ranges[0] else {
            panic!()
        };
        let ips: Vec<String> = range[2..]
            .iter()
            .map(|n| match n {
                Reply::Array(f) => resp(&f[0], Proto::Resp2),
                _ => panic!(),
            })
            .collect();
        assert_eq!(
            ips,
            [
                "$8\r\n10.0.0.1\r\n",
                "$8\r\n10.0.0.2\r\n",
                "$8\r\n10.0.0.3\r\n"
            ]
        );
        assert_eq!(
            t.cluster_nodes(v),
            format!(
                "{a} 10.0.0.1:7001@0 master - 0 0 4 connected 0-16383\n\
                 {b} 10.0.0.2:7002@0 myself,slave {a} 0 0 4 connected\n\
                 {c} 10.0.0.3:7003@0 slave {a} 0 0 4 connected\n"
            )
        );
        assert!(resp(&t.cluster_shards(v), Proto::Resp2).contains("replica"));
        assert_eq!(
            resp(&t.role(), Proto::Resp2),
            "*5\r\n$5\r\nslave\r\n$8\r\n10.0.0.1\r\n:7001\r\n$9\r\nconnected\r\n:0\r\n"
        );
        assert_eq!(t.info_replication()[0], ("role".into(), "slave".into()));
        assert!(t.cluster_info().starts_with("cluster_state:ok\r\n"));
        assert!(t.cluster_info().contains("cluster_known_nodes:3\r\n"));

        // The leader lists both followers as its replicas.
        let l = three(0, Some(0));
        assert_eq!(
            resp(&l.role(), Proto::Resp2),
            "*3\r\n$6\r\nmaster\r\n:0\r\n*2\r\n\
             *3\r\n$8\r\n10.0.0.2\r\n$4\r\n7002\r\n$1\r\n0\r\n\
             *3\r\n$8\r\n10.0.0.3\r\n$4\r\n7003\r\n$1\r\n0\r\n"
        );
        let repl = l.info_replication();
        assert!(repl.contains(&(
            "slave1".into(),
            "ip=10.0.0.3,port=7003,state=online,offset=0,lag=0".into()
        )));
        assert!(l
            .cluster_nodes(at("10.0.0.1"))
            .contains(&format!("{c} 10.0.0.3:7003@0 slave {a}")));
    }

    #[test]
    fn a_follower_sends_namespace_commands_to_the_leader_and_none_is_refused_on_it() {
        assert_eq!(three(0, Some(0)).refusal(42), None);
        assert_eq!(
            three(1, Some(2)).refusal(42),
            Some(Error::Moved("42 10.0.0.3:7003".into()))
        );
        assert_eq!(
            three(1, None).refusal(0),
            Some(Error::ClusterDown("no leader".into()))
        );
    }

    #[test]
    fn with_no_leader_the_cluster_is_down() {
        let t = three(2, None);
        let v = at("10.0.0.3");
        assert!(t.cluster_info().starts_with(
            "cluster_state:fail\r\ncluster_slots_assigned:0\r\ncluster_slots_ok:0\r\n"
        ));
        assert!(t.cluster_info().contains("cluster_size:0\r\n"));
        assert_eq!(resp(&t.cluster_slots(v), Proto::Resp2), "*0\r\n");
        assert_eq!(resp(&t.cluster_shards(v), Proto::Resp2), "*0\r\n");
        assert_eq!(
            resp(&t.role(), Proto::Resp2),
            "*5\r\n$5\r\nslave\r\n$0\r\n\r\n:0\r\n$7\r\nconnect\r\n:-1\r\n"
        );
        assert!(t
            .info_replication()
            .contains(&("master_link_status".into(), "down".into())));
    }

    #[test]
    fn a_node_with_an_announced_address_shows_itself_there_on_every_port() {
        let member = |id, at: &str| Member {
            id,
            at: at.parse().unwrap(),
            failed: false,
        };
        let members = [member(1, "10.0.0.1:7001"), member(2, "10.0.0.2:7002")];
        let (a, b) = (NodeId::of_member(1), NodeId::of_member(2));
        let (a, b) = (a.as_str(), b.as_str());
        let leads = (Some(2), None);
        let t = Topology::clustered(
            (2, Some("192.0.2.9:17002".parse().unwrap())),
            7002,
            Some(7102),
            &members,
            leads,
            3,
        );
        for laddr in ["127.0.0.1:7002", "127.0.0.1:7102"] {
            assert_eq!(
                t.cluster_nodes(t.viewer(laddr.parse().unwrap())),
                format!(
                    "{b} 192.0.2.9:17002@0 myself,master - 0 0 3 connected 0-16383\n\
                     {a} 10.0.0.1:7001@0 slave {b} 0 0 3 connected\n"
                ),
                "{laddr}"
            );
        }
        let slots = resp(&t.cluster_slots(at("127.0.0.1")), Proto::Resp2);
        assert!(slots.contains("$9\r\n192.0.2.9\r\n:17002\r\n"), "{slots}");
        // Without one: the address the client reached, and the TLS port to a TLS client.
        let t = Topology::clustered((2, None), 7002, Some(7102), &members, leads, 3);
        let tls = t.viewer("127.0.0.1:7102".parse().unwrap());
        assert!(t
            .cluster_nodes(tls)
            .starts_with(&format!("{b} 127.0.0.1:7102@0 myself,master")));
    }

    #[test]
    fn during_an_election_the_slots_stay_with_the_last_leader() {
        let t = Topology {
            last_leader: Some(0),
            ..three(2, None)
        };
        let v = at("10.0.0.3");
        assert!(t.cluster_info().starts_with("cluster_state:fail\r\n"));
        let slots = resp(&t.cluster_slots(v), Proto::Resp2);
        assert!(slots.contains("10.0.0.1\r\n:7001\r\n"), "{slots}");
        assert_eq!(t.refusal(7), Some(Error::ClusterDown("no leader".into())));
    }

    #[test]
    fn the_leader_shows_a_follower_it_lost_touch_with_as_failed_and_sends_no_client_there() {
        let mut t = three(0, Some(0));
        t.nodes[2].failed = true;
        let v = at("10.0.0.1");
        let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        assert_eq!(
            t.cluster_nodes(v),
            format!(
                "{a} 10.0.0.1:7001@0 myself,master - 0 0 4 connected 0-16383\n\
                 {b} 10.0.0.2:7002@0 slave {a} 0 0 4 connected\n\
                 {c} 10.0.0.3:7003@0 slave,fail {a} 0 0 4 disconnected\n"
            )
        );
        let slots = resp(&t.cluster_slots(v), Proto::Resp2);
        assert!(slots.starts_with("*1\r\n*4\r\n:0\r\n:16383\r\n"), "{slots}");
        assert!(
            slots.contains("10.0.0.2") && !slots.contains("10.0.0.3"),
            "{slots}"
        );
        let shards = resp(&t.cluster_shards(v), Proto::Resp2);
        assert_eq!(shards.matches("$6\r\nonline\r\n").count(), 2, "{shards}");
        assert_eq!(shards.matches("$6\r\nfailed\r\n").count(), 1, "{shards}");
        assert_eq!(
            resp(&t.role(), Proto::Resp2),
            "*3\r\n$6\r\nmaster\r\n:0\r\n*1\r\n\
             *3\r\n$8\r\n10.0.0.2\r\n$4\r\n7002\r\n$1\r\n0\r\n"
        );
        let repl = t.info_replication();
        assert!(repl.contains(&("connected_slaves".into(), "1".into())));
        assert!(!repl.iter().any(|(k, _)| k == "slave1"));
        assert!(t.cluster_info().starts_with("cluster_state:ok\r\n"));
    }
}
