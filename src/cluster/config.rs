//! A node's cluster settings (SPEC §10) as the node runtime takes them, and the parsing and
//! checks of what the `--cluster-*` options will carry. The server's option parsing is not
//! wired yet: tests build a [`ClusterConfig`] themselves.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::auth::Secret;
use super::stamps::Wall;
use super::tls::Transport;
use super::Peer;

/// The voters `--cluster-init` names, by node id.
pub type Members = BTreeMap<u64, Peer>;

/// Raft's timing and log-size settings.
#[derive(Debug, Clone)]
pub struct Timing {
    /// A follower that hears no leader for a random time in `election_min_ms..election_max_ms`
    /// stands for election.
    pub election_min_ms: u64,
    /// See `election_min_ms`.
    pub election_max_ms: u64,
    /// How often the leader heartbeats its followers.
    pub heartbeat_ms: u64,
    /// A snapshot is built once this many entries were applied since the last one.
    pub snapshot_after: u64,
    /// And once the log grew by this many bytes since the last one asked for by size (its
    /// entries stay in memory until a snapshot: `growth.rs`).
    pub snapshot_after_bytes: u64,
    /// Entries a snapshot includes that are kept in the log anyway (a follower this close
    /// catches up from the log, not by a snapshot).
    pub keep_after_snapshot: u64,
    /// And of those, at most this many bytes of frames (2.8 times that in memory: `purge.rs`).
    pub keep_after_snapshot_bytes: u64,
}

impl Default for Timing {
    /// For a loaded 2-core box (replication.md §4.7): openraft's 150-300 ms election timeout
    /// invites spurious elections under CPU contention. But a follower of openraft 0.10 stands
    /// only once the leader lease (`election_timeout_max`) and then its election timeout have
    /// passed since it last heard the leader: with 500-1000 ms, elections began 1.5-2 s after
    /// a leader's death, measured, too close to SPEC §10's 3 s for a client's next answer.
    /// 300-600 ms starts them after 0.9-1.2 s.
    fn default() -> Timing {
        Timing {
            election_min_ms: 300,
            election_max_ms: 600,
            heartbeat_ms: 100,
            snapshot_after: 10_000,
            // Half the default of a single node's `--snapshot-threshold`: decoded, the entries
            // take 2.8 times their frames in memory (P=16, 50 clients: 128 MiB of log, 350 MiB
            // more resident on a follower).
            snapshot_after_bytes: 32 << 20,
            keep_after_snapshot: 1_000,
            // At P=16 (50 clients) 1,000 entries were some 40 MiB of frames, and 115 MiB of a
            // follower's memory; 4 MiB is some 100 of them, 0.2 s of that load.
            keep_after_snapshot_bytes: 4 << 20,
        }
    }
}

/// A node's cluster settings.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// `--cluster-node-id`: >= 1, unique, never reused.
    pub id: u64,
    /// Where the node keeps its Raft log and state machine.
    pub dir: PathBuf,
    /// The shard count (every node of a cluster runs the same).
    pub shards: usize,
    /// Where the cluster port listens.
    pub listen: SocketAddr,
    /// `--cluster-secret`: empty only when every peer address is loopback.
    pub secret: Secret,
    /// `--cluster-tls-*`: plain only when every peer address is loopback.
    pub transport: Transport,
    /// `--cluster-init`: the voters, this node among them; forms the cluster on an empty dir.
    pub init: Option<Members>,
    /// The client address this node's membership entry must carry (what the other nodes hand
    /// out in `MOVED` and `CLUSTER SLOTS`): `--cluster-announce`, by default `--bind` and
    /// `--port` (SPEC §10); `None` (an unspecified `--bind`, 0.0.0.0 say, which names no
    /// address to reach) keeps the one `--cluster-init` named.
    pub announce: Option<String>,
    /// Raft's timing.
    pub timing: Timing,
    /// The server's wall clock: what the appends this node sends as leader are stamped with.
    pub wall: Wall,
}

/// Whether `host:port` names a loopback address (`localhost`, 127.0.0.0/8, `::1`).
fn is_loopback(addr: &str) -> bool {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl ClusterConfig {
    /// Checks the settings against SPEC §10's rules.
    pub fn check(&self) -> Result<(), String> {
        if self.id == 0 {
            return Err("--cluster-node-id must be an integer >= 1".into());
        }
        if let Some(members) = &self.init {
            if !members.contains_key(&self.id) {
                return Err(format!(
                    "--cluster-init must name every voter, this node ({}) included",
                    self.id
                ));
            }
        }
        let peers_loopback = self
            .init
            .iter()
            .flat_map(|m| m.values())
            .all(|p| is_loopback(&p.raft_addr));
        let loopback = self.listen.ip().is_loopback() && peers_loopback;
        if self.secret.is_empty() && !loopback {
            return Err(
                "--cluster-secret (or --cluster-secret-file) is required unless every peer \
                 address is loopback"
                    .into(),
            );
        }
        if !self.transport.is_tls() && !loopback {
            return Err(
                "--cluster-tls-cert-file, --cluster-tls-key-file and --cluster-tls-ca-cert-file \
                 are required unless every peer address is loopback: peer traffic carries lease \
                 ids and every replicated change"
                    .into(),
            );
        }
        Ok(())
    }
}

/// A node's cluster port when none is given: its client port + 10000 (SPEC §10), `None` past
/// 65535.
pub fn default_cluster_port(client_port: u16) -> Option<u16> {
    client_port.checked_add(10000)
}

/// Splits `host:port` (an IPv6 host in brackets, the port 1-65535) into its host and port, or
/// says what is wrong with it.
pub fn split_host_port(s: &str) -> Result<(&str, u16), &'static str> {
    let (host, port) = s.rsplit_once(':').ok_or("no port")?;
    if host.is_empty() {
        return Err("no host");
    }
    if host.contains(':') && !(host.starts_with('[') && host.ends_with(']')) {
        return Err("an IPv6 address goes in brackets");
    }
    let port = port.parse().ok().filter(|&p| p != 0).ok_or("bad port")?;
    Ok((host, port))
}

/// Parses `--cluster-init ID=host:port[@cport],...`: each voter's client address, and its
/// cluster port (`cport`, by default `port` + 10000) on the same host.
pub fn parse_init(s: &str) -> Result<Members, String> {
    let mut members = Members::new();
    for item in s.split(',') {
        let bad =
            |why: &str| format!("--cluster-init: {item:?}: {why} (want ID=host:port[@cport])");
        let (id, addr) = item.split_once('=').ok_or_else(|| bad("no '='"))?;
        let id: u64 = id
            .trim()
            .parse()
            .ok()
            .filter(|&id| id >= 1)
            .ok_or_else(|| bad("the id must be an integer >= 1"))?;
        let (client, cport) = match addr.split_once('@') {
            Some((client, cport)) => (client, Some(cport)),
            None => (addr, None),
        };
        let (host, port) = split_host_port(client).map_err(bad)?;
        let cport: u16 = match cport {
            Some(c) => c
                .parse()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| bad("bad cluster port"))?,
            None => default_cluster_port(port)
                .ok_or_else(|| bad("port + 10000 is past 65535: give @cport"))?,
        };
        let peer = Peer {
            raft_addr: format!("{host}:{cport}"),
            client_addr: client.to_string(),
        };
        if members.insert(id, peer).is_some() {
            return Err(bad("the id is named twice"));
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(raft: &str, client: &str) -> Peer {
        Peer {
            raft_addr: raft.into(),
            client_addr: client.into(),
        }
    }

    #[test]
    fn cluster_init_names_each_voter_with_its_two_addresses() {
        let m = parse_init("1=127.0.0.1:7001,2=127.0.0.1:7002@17102,3=[::1]:7003").unwrap();
        assert_eq!(
            m.into_iter().collect::<Vec<_>>(),
            [
                (1, peer("127.0.0.1:17001", "127.0.0.1:7001")),
                (2, peer("127.0.0.1:17102", "127.0.0.1:7002")),
                (3, peer("[::1]:17003", "[::1]:7003")),
            ]
        );
    }

    #[test]
    fn a_bad_cluster_init_says_which_item_and_why() {
        for (s, why) in [
            ("1=127.0.0.1:7001,1=127.0.0.1:7002", "named twice"),
            ("0=127.0.0.1:7001", "integer >= 1"),
            ("x=127.0.0.1:7001", "integer >= 1"),
            ("1:127.0.0.1:7001", "no '='"),
            ("1=127.0.0.1", "no port"),
            ("1=127.0.0.1:0", "bad port"),
            ("1=:7001", "no host"),
            ("1=h:60000", "past 65535"),
            ("1=h:7001@x", "bad cluster port"),
            ("1=::1:7001", "in brackets"),
            ("", "no '='"),
        ] {
            let err = parse_init(s).unwrap_err();
            assert!(
                err.contains(why) && err.starts_with("--cluster-init"),
                "{s}: {err}"
            );
        }
    }

    fn config(listen: &str, init: Option<&str>, secret: &str) -> ClusterConfig {
        ClusterConfig {
            id: 1,
            dir: PathBuf::from("/nonexistent"),
            shards: 1,
            listen: listen.parse().unwrap(),
            secret: Secret::new(secret),
            transport: Transport::Plain,
            init: init.map(|s| parse_init(s).unwrap()),
            announce: None,
            timing: Timing::default(),
            wall: Wall::default(),
        }
    }

    /// Mutual TLS whose files are never read: `check` looks at the kind only.
    fn over_tls(mut c: ClusterConfig) -> ClusterConfig {
        let dir = std::env::temp_dir().join(format!("permitd-check-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let [cert, key, ca] = crate::cluster::peer_tests::pki::peer_files(&dir, "n", &["n"]);
        c.transport = Transport::tls(&cert, &key, &ca).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        c
    }

    #[test]
    fn the_secret_and_tls_are_required_unless_every_peer_is_loopback() {
        let local = "1=127.0.0.1:7001,2=localhost:7002,3=[::1]:7003";
        assert_eq!(config("127.0.0.1:17001", Some(local), "").check(), Ok(()));
        assert_eq!(config("127.0.0.1:17001", None, "").check(), Ok(()));
        let far = "1=127.0.0.1:7001,2=10.0.0.2:7002";
        for c in [
            config("127.0.0.1:17001", Some(far), ""),
            config("0.0.0.0:17001", None, ""),
            over_tls(config("0.0.0.0:17001", Some(far), "")),
        ] {
            assert!(c.check().unwrap_err().contains("--cluster-secret"), "{c:?}");
        }
        for c in [
            config("0.0.0.0:17001", Some(far), "s"),
            config("0.0.0.0:17001", None, "s"),
        ] {
            assert!(
                c.check().unwrap_err().contains("--cluster-tls-cert-file"),
                "{c:?}"
            );
        }
        let c = over_tls(config("0.0.0.0:17001", Some(far), "s"));
        assert_eq!(c.check(), Ok(()));
    }

    #[test]
    fn cluster_init_must_name_this_node() {
        let c = config("127.0.0.1:17001", Some("2=127.0.0.1:7002"), "");
        assert!(c.check().unwrap_err().contains("this node (1)"));
        let mut zero = config("127.0.0.1:17001", None, "");
        zero.id = 0;
        assert!(zero.check().unwrap_err().contains(">= 1"));
    }
}
