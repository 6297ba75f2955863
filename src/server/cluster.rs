//! The server's side of cluster mode (SPEC §10): the `--cluster-*` options turned into the
//! node runtime's settings, the topology kept in step with the node's view of its cluster, and
//! leadership handed over when the leader stops. With no `--cluster-node-id` the server is the
//! single node and none of this runs.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::global::Global;
use super::topology::{Member, Topology};
use crate::cluster::auth::Secret;
use crate::cluster::config::{parse_init, ClusterConfig, Timing};
use crate::cluster::node::{Handle, Role, Status};
use crate::cluster::stamps::Wall;
use crate::cluster::tls::Transport;
use crate::command::slot::key_slot;
use crate::command::table::{AclCat, CommandSpec};
use crate::config::Config;
use crate::error::Error;
use crate::persist::codec::Enc;
use crate::persist::log::{frame_with, single_frame};
use crate::persist::{sync_dir, write_file_synced, Fsync, ShardState};

/// How long a stopping leader waits for a follower to take over before it stops anyway.
const HAND_OVER_WAIT: Duration = Duration::from_secs(3);

/// The folder under `--dir` that holds a node's Raft log and state machine (`log/`, `sm/`,
/// `incoming/`): in cluster mode the Raft log is the shards' durable log (their own log files
/// stay empty).
pub const NODE_DIR: &str = "raft";

/// The file in [`NODE_DIR`] that names the cluster node the `--dir` belongs to: one frame (as
/// the Raft log's `meta`) holding its id, written once, atomically and fsynced, when the node
/// first starts on the folder. A restart under another `--cluster-node-id` is refused by it
/// (ids are unique and never reused, SPEC §10), and a start without cluster options says whose
/// folder it is.
pub const ID_FILE: &str = "node-id";

/// Whose a `--dir` is, as its [`NODE_DIR`] says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    /// No [`NODE_DIR`]: no cluster node's.
    Nobody,
    /// A [`NODE_DIR`] without [`ID_FILE`]: a cluster node's, made before nodes recorded their
    /// id.
    Unnamed,
    /// Cluster node N's.
    Node(u64),
}

/// Whose `node_dir` (a `--dir`'s [`NODE_DIR`]) is; an error naming the file when it cannot be
/// read or its [`ID_FILE`] is damaged.
fn owner(node_dir: &Path) -> Result<Owner, String> {
    match fs::metadata(node_dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Owner::Nobody),
        Err(e) => return Err(format!("{}: {e}", node_dir.display())),
    }
    let path = node_dir.join(ID_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Owner::Unnamed),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    match single_frame(Bytes::from(bytes), |d| d.u64()) {
        Some(id) if id >= 1 => Ok(Owner::Node(id)),
        _ => Err(format!(
            "{}: corrupt cluster node id file (it names the node this --dir belongs to)",
            path.display()
        )),
    }
}

/// Checks, before anything is written to it, that `config`'s `--dir` is the node's these
/// options start. A single node refuses a cluster node's folder: it would start empty beside
/// the Raft log, and take writes the cluster never sees. A cluster node refuses the folder of
/// another node id: ids are never reused (SPEC §10).
pub fn check_dir(config: &Config) -> Result<(), String> {
    let dir = &config.dir;
    let node_dir = dir.join(NODE_DIR);
    match (config.cluster_node_id, owner(&node_dir)?) {
        (None, Owner::Nobody) | (Some(_), Owner::Nobody | Owner::Unnamed) => Ok(()),
        (Some(id), Owner::Node(n)) if n == id => Ok(()),
        (None, owner) => {
            let (whose, id) = match owner {
                Owner::Node(n) => (format!("cluster node {n}"), n.to_string()),
                _ => ("a cluster node".to_string(), "N".to_string()),
            };
            Err(format!(
                "{} belongs to {whose} (its Raft log is in {}): start it with its cluster \
                 options (--cluster-node-id {id} ...). Without them it would start as an empty \
                 single node, whose writes never reach the cluster",
                dir.display(),
                node_dir.display()
            ))
        }
        (Some(id), Owner::Node(n)) => Err(format!(
            "{} belongs to cluster node {n}, not {id} ({} says so): node ids are never reused. \
             If this {NODE_DIR}/ was copied from node {n} to replace or restore node {id}, \
             delete its {ID_FILE} (docs/operations.md); never start a copy as node {n} while \
             node {n} runs. Start it with --cluster-node-id {n} only if it is node {n}'s own \
             folder",
            dir.display(),
            node_dir.join(ID_FILE).display()
        )),
    }
}

/// Records node `id` in `node_dir` ([`ID_FILE`]), unless [`check_dir`] found it there: on the
/// node's first start on an empty `--dir`, and on a [`NODE_DIR`] made before nodes recorded
/// their id (no record of it existed then, so the id given is taken as the node's). Called
/// once every other check passed, just before the node starts: a start refused for its
/// options, or for a single node's data in the `--dir`, leaves no [`NODE_DIR`] behind.
pub fn record_id(node_dir: &Path, id: u64) -> Result<(), String> {
    let fresh = match owner(node_dir)? {
        Owner::Node(_) => return Ok(()),
        Owner::Unnamed => false,
        Owner::Nobody => true,
    };
    let at = |p: &Path, e: io::Error| format!("{}: {e}", p.display());
    if fresh {
        fs::create_dir_all(node_dir).map_err(|e| at(node_dir, e))?;
        // The folder's own entry, as the id file's below.
        let parent = node_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        sync_dir(parent).map_err(|e| at(parent, e))?;
    }
    let mut bytes = BytesMut::new();
    frame_with(&mut bytes, |out| Enc(out).u64(id));
    let path = node_dir.join(ID_FILE);
    write_file_synced(&path, &bytes).map_err(|e| at(&path, e))
}

/// Cluster mode starts on a `--dir` without a single node's data: the shards' state comes from
/// the cluster, and data found beside it would be silently set aside.
pub fn check_no_single_node_data(shards: &[ShardState], dir: &Path) -> Result<(), String> {
    if shards.iter().all(|s| s.namespaces.is_empty()) {
        return Ok(());
    }
    Err(format!(
        "{} holds a single node's data: cluster mode starts on an empty --dir (its state \
         comes from the cluster). Move the data aside, or run without --cluster-node-id",
        dir.display()
    ))
}

/// The node settings of `config`'s `--cluster-*` options: `None` without
/// `--cluster-node-id`, an error naming the option when they do not fit together.
pub fn settings(config: &Config, shards: usize) -> Result<Option<ClusterConfig>, String> {
    let Some(id) = config.cluster_node_id else {
        return match any_cluster_option(config) {
            Some(name) => Err(format!("{name} needs --cluster-node-id")),
            None => Ok(None),
        };
    };
    let port = config
        .cluster_listen_port()
        .ok_or("--port + 10000 is past 65535: give --cluster-port")?;
    let (option, bind) = match &config.cluster_bind {
        Some(ip) => ("--cluster-bind", ip),
        None => ("--bind", &config.bind),
    };
    let ip: IpAddr = bind
        .parse()
        .map_err(|_| format!("{option} {bind}: cluster mode needs an IP address"))?;
    check_cluster_mode_options(config)?;
    let secret = match (&config.cluster_secret, &config.cluster_secret_file) {
        (Some(s), _) if s.is_empty() => {
            return Err("--cluster-secret: the secret is empty".into());
        }
        (Some(s), _) => Secret::new(s.as_bytes()),
        (None, Some(path)) => Secret::new(read_secret(path)?),
        (None, None) => Secret::new(Vec::new()),
    };
    let transport = match (
        &config.cluster_tls_cert_file,
        &config.cluster_tls_key_file,
        &config.cluster_tls_ca_cert_file,
    ) {
        (None, None, None) => Transport::Plain,
        (Some(cert), Some(key), Some(ca)) => {
            Transport::tls(cert, key, ca).map_err(|e| format!("--cluster-tls-*: {e}"))?
        }
        _ => {
            return Err("--cluster-tls-cert-file, --cluster-tls-key-file and \
                        --cluster-tls-ca-cert-file go together"
                .into())
        }
    };
    let init = config.cluster_init.as_deref().map(parse_init).transpose()?;
    let cfg = ClusterConfig {
        id,
        dir: config.dir.join(NODE_DIR),
        shards,
        listen: SocketAddr::new(ip, port),
        secret,
        transport,
        init,
        announce: config
            .cluster_announce
            .clone()
            .or_else(|| bound_client_addr(config)),
        timing: Timing::default(),
        // The system's clock; the server hands over its own (`Global::wall`).
        wall: Wall::default(),
    };
    cfg.check()?;
    Ok(Some(cfg))
}

/// The client address `--bind` and `--port` name, SPEC §10's default for `--cluster-announce`:
/// none when `--bind` is unspecified (0.0.0.0, ::) or `--port` is 0 (a free port, not known
/// yet), which name no address to reach.
fn bound_client_addr(config: &Config) -> Option<String> {
    let ip: IpAddr = config.bind.parse().ok()?;
    (!ip.is_unspecified() && config.port != 0).then(|| SocketAddr::new(ip, config.port).to_string())
}

/// Refuses, in cluster mode, the options that do not apply there or that cluster mode bounds,
/// rather than accept them and do otherwise.
fn check_cluster_mode_options(config: &Config) -> Result<(), String> {
    // The Raft log is the shards' durable log in cluster mode (their own log files stay empty),
    // and it is fdatasync'd before every acknowledgement whatever --fsync says: `no` and
    // `everysec` would be a lie in CONFIG GET and INFO. `always` says what it does (scripts
    // give it to single nodes and cluster nodes alike).
    if config.fsync != Fsync::Always {
        return Err(format!(
            "--fsync {}: cluster mode fdatasyncs its Raft log at every commit: --fsync does \
             not apply (leave it out, or give always)",
            config.fsync.as_str()
        ));
    }
    if config.repair_log {
        return Err(
            "--repair-log does not apply in cluster mode: a node whose Raft log is damaged is \
             replaced (docs/operations.md)"
                .into(),
        );
    }
    // A new leader extends the leases alive to its promotion plus the grace: past the longest
    // ttl, a failover would keep a lease longer than any LEASE.CREATE or refresh could.
    if config.failover_lease_grace > config.max_lease_ttl as f64 {
        return Err(format!(
            "--failover-lease-grace {} is above --max-lease-ttl {}: a failover would keep \
             leases longer than any ttl may (give at most {})",
            config.failover_lease_grace, config.max_lease_ttl, config.max_lease_ttl
        ));
    }
    Ok(())
}

/// The first cluster option given besides `--cluster-node-id`, by its name.
fn any_cluster_option(config: &Config) -> Option<&'static str> {
    [
        ("--cluster-port", config.cluster_port.is_some()),
        ("--cluster-bind", config.cluster_bind.is_some()),
        ("--cluster-announce", config.cluster_announce.is_some()),
        ("--cluster-secret", config.cluster_secret.is_some()),
        (
            "--cluster-secret-file",
            config.cluster_secret_file.is_some(),
        ),
        ("--cluster-init", config.cluster_init.is_some()),
        (
            "--cluster-tls-cert-file",
            config.cluster_tls_cert_file.is_some(),
        ),
        (
            "--cluster-tls-key-file",
            config.cluster_tls_key_file.is_some(),
        ),
        (
            "--cluster-tls-ca-cert-file",
            config.cluster_tls_ca_cert_file.is_some(),
        ),
    ]
    .into_iter()
    .find_map(|(name, given)| given.then_some(name))
}

/// The secret in `path`: its first line, without the line end (as `--requirepass` would be
/// written by hand or by a secrets manager).
fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("--cluster-secret-file {}: {e}", path.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!(
            "--cluster-secret-file {}: the first line is empty",
            path.display()
        ));
    }
    Ok(line.to_vec())
}

/// What cluster mode answers the namespace command `spec` (`argv` its words) instead of
/// running it, if anything: on a follower `MOVED` to the leader, `CLUSTERDOWN` while no
/// leader is known (SPEC §10). The leader runs it (its shard answers `TRYAGAIN` while it is
/// not ready yet: worker/replica.rs). The Redis surface commands are served by every node.
pub fn refusal(g: &Global, spec: &CommandSpec, argv: &[Bytes]) -> Option<Error> {
    if g.config.cluster_node_id.is_none() || !spec.acl.has(AclCat::Semaphore) {
        return None;
    }
    // Redis Cluster's slot of the key (the namespace); 0 for keyless commands (NS.LIST).
    let slot = usize::try_from(spec.first_key)
        .ok()
        .filter(|&i| i > 0)
        .and_then(|i| argv.get(i))
        .map_or(0, |key| key_slot(key));
    g.topology().refusal(slot)
}

/// INFO's `# Raft` fields (SPEC §10): this node, its term and role, the leader, the commit
/// and applied index, and per peer its cluster address, the last index it holds, its lag
/// behind the leader's log, how long ago the last RPC it answered was sent and whether it
/// answers (`up`, or `down` after two leader leases without an answer): all four known on the
/// leader only, empty elsewhere.
pub fn info_raft(s: &Status) -> Vec<(String, String)> {
    let index = |i: Option<u64>| i.map_or_else(|| "-".to_string(), |i| i.to_string());
    let role = match s.role {
        Role::Leader => "leader",
        Role::Follower => "follower",
        Role::Candidate => "candidate",
        Role::Learner => "learner",
        Role::Shutdown => "shutdown",
    };
    let mut fields = vec![
        ("raft_node_id".to_string(), s.id.to_string()),
        ("raft_role".into(), role.into()),
        ("raft_term".into(), s.term.to_string()),
        (
            "raft_leader_id".into(),
            s.leader
                .as_ref()
                .map_or_else(|| "-".to_string(), |l| l.id.to_string()),
        ),
        ("raft_commit_index".into(), index(s.committed)),
        ("raft_applied_index".into(), index(s.applied)),
        ("raft_last_log_index".into(), index(s.last_index)),
        ("raft_snapshot_index".into(), index(s.snapshot)),
        ("raft_purged_index".into(), index(s.purged)),
        ("raft_peers".into(), s.peers.len().to_string()),
    ];
    for p in &s.peers {
        let known = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
        fields.push((
            format!("raft_peer{}", p.id),
            format!(
                "addr={},client_addr={},match={},lag={},last_ack_ms={},state={}",
                p.raft_addr,
                p.client_addr,
                known(p.matched),
                known(p.lag),
                known(p.acked_ms_ago),
                match p.answering {
                    Some(true) => "up",
                    Some(false) => "down",
                    None => "",
                }
            ),
        ));
    }
    fields
}

/// What the topology is made of: it is rebuilt only when this changes, not on every commit.
#[derive(PartialEq)]
struct Shape {
    /// Each voter's node number, client address and whether the leader lost touch with it.
    members: Vec<(u64, String, bool)>,
    leader: Option<u64>,
    term: u64,
}

impl Shape {
    fn of(s: &Status) -> Shape {
        let mut members: Vec<(u64, String, bool)> = s
            .peers
            .iter()
            .map(|p| (p.id, p.client_addr.clone(), p.answering == Some(false)))
            .collect();
        members.extend(s.client_addr.clone().map(|a| (s.id, a, false)));
        members.sort();
        Shape {
            members,
            leader: s.leader.as_ref().map(|l| l.id),
            term: s.term,
        }
    }
}

/// Node `id`'s client address `addr` resolved (its first address), or `None` (logged). On the
/// runtime, not in place: a name's lookup may wait on a DNS server.
async fn resolve(id: u64, addr: &str) -> Option<SocketAddr> {
    let at = tokio::net::lookup_host(addr)
        .await
        .ok()
        .and_then(|mut a| a.next());
    if at.is_none() {
        tracing::warn!(node = id, addr = %addr, "a node's client address does not resolve");
    }
    at
}

/// Keeps `global`'s topology the cluster as `node` sees it (leader, term, members), until the
/// node stops. `port` and `tls_port` are this node's client ports; with `--cluster-announce`
/// it shows itself at that address, as the others do. A member whose address does not resolve
/// is left out (and looked up again at the next change); one that did is not looked up again,
/// so that a leader change does not wait on a DNS server.
pub async fn follow_topology(global: &Global, node: Handle, port: u16, tls_port: Option<u16>) {
    let mut status = node.status();
    let me = status.borrow().id;
    let mut resolved: HashMap<(u64, String), SocketAddr> = HashMap::new();
    let mut lookup = async |id: u64, addr: &str| {
        let key = (id, addr.to_string());
        if let Some(at) = resolved.get(&key) {
            return Some(*at);
        }
        let at = resolve(id, addr).await?;
        resolved.insert(key, at);
        Some(at)
    };
    let mut shown: Option<Shape> = None;
    let mut last_leader = None;
    loop {
        let shape = Shape::of(&status.borrow_and_update());
        if shown.as_ref() != Some(&shape) {
            last_leader = shape.leader.or(last_leader);
            let mut members = Vec::with_capacity(shape.members.len());
            for (id, addr, failed) in &shape.members {
                if let Some(at) = lookup(*id, addr).await {
                    members.push(Member {
                        id: *id,
                        at,
                        failed: *failed,
                    });
                }
            }
            let announced = match global.config.cluster_announce.as_deref() {
                Some(a) => lookup(me, a).await,
                None => None,
            };
            global.set_topology(Topology::clustered(
                (me, announced),
                port,
                tls_port,
                &members,
                (shape.leader, last_leader),
                shape.term,
            ));
            shown = Some(shape);
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}

/// Stops the server, which then exits non-zero, once the node's Raft stopped of itself (SPEC
/// §8 in cluster mode: a write or sync of the Raft log failed for another reason than lack of
/// room, `EIO` say, and the files' state is unknown). A node left up with its Raft stopped
/// serves nothing until restarted by hand; exiting lets its supervisor restart it, and the
/// restart recovers from what is on disk.
pub async fn stop_when_raft_fails(global: &Global, node: Handle) {
    let why = node.failure().await;
    if !global.shutting_down() {
        tracing::error!(
            "cluster: the Raft node stopped: {why}; stopping, so that a restart recovers from \
             what is on disk"
        );
        global.stop_failed();
    }
}

/// The follower to hand leadership to, on the leader: of those that answer, the one least
/// behind, at most `max_lag` entries (the lowest id among equals); `None` when none is known to
/// be that close. A silent follower's lag is stale: handed leadership, it would not take it.
pub fn successor(s: &Status, max_lag: u64) -> Option<u64> {
    s.peers
        .iter()
        .filter(|p| p.answering != Some(false))
        .filter_map(|p| Some((p.lag?, p.id)))
        .filter(|&(lag, _)| lag <= max_lag)
        .min()
        .map(|(_, id)| id)
}

/// After a hand-over, waits (at most [`HAND_OVER_WAIT`]) until the acquires parked on this node
/// as leader were sent to the next one: its shards stand by a moment after the hand-over, and
/// answer them once they know the next leader; stopping Raft first would leave them none to
/// name, and the stopping shard threads would close their connections unanswered (a test saw
/// it).
pub async fn answer_parked(global: &Global) {
    let waiting = global.waiter_count();
    let deadline = tokio::time::Instant::now() + HAND_OVER_WAIT;
    while (waiting.load(Ordering::SeqCst) > 0 || global.redirects_pending() > 0)
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// On the leader, hands leadership to an up-to-date follower and waits (at most
/// [`HAND_OVER_WAIT`]) until another node leads, so that a planned stop costs the cluster no
/// election timeout (SPEC §10: SHUTDOWN on the leader); whether another node leads now.
pub async fn hand_over(node: &Handle) -> bool {
    let mut status = node.status();
    // A follower may lag an entry or two behind for a moment (the latest commit on its way).
    let ready = status.wait_for(|s| s.role != Role::Leader || successor(s, 0).is_some());
    let to = match tokio::time::timeout(HAND_OVER_WAIT, ready).await {
        Ok(Ok(s)) if s.role == Role::Leader => successor(&s, 0),
        _ => None,
    };
    let Some(to) = to else {
        return false;
    };
    tracing::info!(to, "handing leadership over before stopping");
    if node.transfer_leader(to).await.is_err() {
        return false;
    }
    let handed = status.wait_for(|s| s.leader.as_ref().is_some_and(|l| l.id != s.id));
    if tokio::time::timeout(HAND_OVER_WAIT, handed).await.is_err() {
        tracing::warn!(to, "no other node took over in time; stopping anyway");
        return false;
    }
    true
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cluster::node::PeerStatus;

    fn config(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("permitd").chain(args.iter().copied())).unwrap()
    }

    /// The `--cluster-tls-*` options of peer TLS files made in `dir`, for hosts `sans`.
    fn tls_options(dir: &Path, sans: &[&str]) -> Vec<String> {
        let files = crate::cluster::peer_tests::pki::peer_files(dir, "node", sans);
        ["--cluster-tls-cert-file", "--cluster-tls-key-file"]
            .into_iter()
            .chain(["--cluster-tls-ca-cert-file"])
            .zip(&files)
            .flat_map(|(option, path)| [option.to_string(), path.display().to_string()])
            .collect()
    }

    #[test]
    fn leadership_goes_to_the_answering_follower_least_behind() {
        let peer = |id, lag, answering| PeerStatus {
            id,
            raft_addr: String::new(),
            client_addr: String::new(),
            matched: None,
            lag: Some(lag),
            acked_ms_ago: None,
            answering: Some(answering),
        };
        let status = |peers| Status {
            id: 1,
            role: Role::Leader,
            client_addr: None,
            term: 2,
            leader: None,
            leader_id: None,
            committed: None,
            applied: None,
            last_index: None,
            snapshot: None,
            purged: None,
            peers,
        };
        let s = status(vec![peer(2, 0, false), peer(3, 1, true), peer(4, 1, true)]);
        assert_eq!(successor(&s, 1), Some(3));
        assert_eq!(successor(&s, 0), None);
        assert_eq!(successor(&status(vec![peer(2, 0, true)]), 0), Some(2));
    }

    #[test]
    fn without_a_node_id_the_server_is_the_single_node() {
        assert!(settings(&config(&[]), 2).unwrap().is_none());
        let err = settings(&config(&["--cluster-init", "1=127.0.0.1:7001"]), 2).unwrap_err();
        assert_eq!(err, "--cluster-init needs --cluster-node-id");
    }

    #[test]
    fn cluster_announce_is_host_port_in_cluster_mode_only() {
        let c = settings(
            &config(&[
                "--cluster-node-id",
                "2",
                "--cluster-announce",
                "10.0.0.2:7002",
            ]),
            1,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.announce.as_deref(), Some("10.0.0.2:7002"));
        let entries = config(&["--cluster-announce", "[::1]:7002"]).entries();
        assert!(entries.contains(&("cluster-announce", "[::1]:7002".to_string())));
        let entries = config(&[]).entries();
        assert!(entries.contains(&("cluster-announce", String::new())));
        // Without it, the node is announced at its --bind and --port (SPEC §10), unless --bind
        // names no address.
        let announce = |args: &[&str]| settings(&config(args), 1).unwrap().unwrap().announce;
        let node2 = ["--cluster-node-id", "2", "--port", "7002"];
        assert_eq!(announce(&node2).as_deref(), Some("127.0.0.1:7002"));
        let v6 = [&node2[..], &["--bind", "::1"]].concat();
        assert_eq!(announce(&v6).as_deref(), Some("[::1]:7002"));
        let dir = std::env::temp_dir().join(format!("permitd-announce-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tls = tls_options(&dir, &["10.0.0.2"]);
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        let any = [
            &node2[..],
            &["--bind", "0.0.0.0", "--cluster-secret", "s"],
            &tls,
        ]
        .concat();
        assert_eq!(announce(&any), None);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(announce(&["--cluster-node-id", "2", "--port", "0"]), None);
        let err = settings(&config(&["--cluster-announce", "10.0.0.2:7002"]), 1).unwrap_err();
        assert_eq!(err, "--cluster-announce needs --cluster-node-id");
        for (bad, why) in [
            ("10.0.0.2", "no port"),
            ("10.0.0.2:0", "bad port"),
            ("10.0.0.2:65536", "bad port"),
            ("10.0.0.2:x", "bad port"),
            (":7002", "no host"),
            ("::1:7002", "in brackets"),
        ] {
            let err = Config::try_parse_from(["permitd", "--cluster-announce", bad])
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("--cluster-announce") && err.contains(why),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn the_cluster_port_defaults_to_the_port_plus_10000_on_the_bind_address() {
        let c = settings(&config(&["--port", "7001", "--cluster-node-id", "3"]), 2)
            .unwrap()
            .unwrap();
        assert_eq!(c.id, 3);
        assert_eq!(c.listen, "127.0.0.1:17001".parse().unwrap());
        assert_eq!(c.dir, Path::new("./data").join(NODE_DIR));
        assert_eq!(c.shards, 2);
        let c = settings(
            &config(&["--cluster-node-id", "3", "--cluster-port", "9000"]),
            1,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.listen.port(), 9000);
        let err = settings(&config(&["--port", "60000", "--cluster-node-id", "1"]), 1);
        assert!(err.unwrap_err().contains("give --cluster-port"));
    }

    #[test]
    fn the_secret_comes_from_the_option_or_the_first_line_of_its_file() {
        let dir = std::env::temp_dir().join(format!("permitd-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("secret");
        std::fs::write(&file, "s3cret\r\nignored\n").unwrap();
        let far = "1=10.0.0.1:7001,2=10.0.0.2:7001";
        let base = [
            "--bind",
            "0.0.0.0",
            "--cluster-node-id",
            "1",
            "--cluster-init",
            far,
        ];
        let tls = tls_options(&dir, &["10.0.0.1"]);
        let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
        let with_file: Vec<&str> = base
            .iter()
            .copied()
            .chain(["--cluster-secret-file", file.to_str().unwrap()])
            .chain(tls.iter().copied())
            .collect();
        let c = settings(&config(&with_file), 1).unwrap().unwrap();
        assert!(c.transport.is_tls());
        // Peers off loopback need a secret, and TLS.
        let err = settings(&config(&[&base[..], &tls[..]].concat()), 1).unwrap_err();
        assert!(err.contains("--cluster-secret"), "{err}");
        let err = settings(&config(&with_file[..with_file.len() - 2]), 1).unwrap_err();
        assert!(err.contains("go together"), "{err}");
        let err = settings(&config(&with_file[..with_file.len() - 6]), 1).unwrap_err();
        assert!(err.contains("--cluster-tls-cert-file"), "{err}");
        // A file that holds no certificate is named.
        let wrong = [&with_file[..with_file.len() - 1], &[file.to_str().unwrap()]].concat();
        let err = settings(&config(&wrong), 1).unwrap_err();
        assert!(err.contains(file.to_str().unwrap()), "{err}");
        std::fs::write(&file, "\nsecret on line two\n").unwrap();
        let err = settings(&config(&with_file), 1).unwrap_err();
        assert!(err.contains("the first line is empty"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_empty_cluster_secret_is_refused_as_an_empty_secret_file_is() {
        let err = settings(
            &config(&["--cluster-node-id", "1", "--cluster-secret", ""]),
            1,
        );
        assert_eq!(err.unwrap_err(), "--cluster-secret: the secret is empty");
        let c = settings(
            &config(&["--cluster-node-id", "1", "--cluster-secret", "s"]),
            1,
        );
        assert!(c.unwrap().is_some());
    }

    #[test]
    fn fsync_other_than_always_and_repair_log_are_refused_in_cluster_mode() {
        for policy in ["no", "everysec"] {
            let err =
                settings(&config(&["--cluster-node-id", "1", "--fsync", policy]), 1).unwrap_err();
            assert!(
                err.starts_with(&format!("--fsync {policy}: cluster mode fdatasyncs its Raft log at every commit: --fsync does not apply")),
                "{err}"
            );
            // A single node's policy, as before.
            assert!(settings(&config(&["--fsync", policy]), 1)
                .unwrap()
                .is_none());
        }
        let always = config(&["--cluster-node-id", "1", "--fsync", "always"]);
        assert!(settings(&always, 1).unwrap().is_some());
        let err = settings(&config(&["--cluster-node-id", "1", "--repair-log"]), 1).unwrap_err();
        assert!(
            err.starts_with("--repair-log does not apply in cluster mode"),
            "{err}"
        );
        assert!(settings(&config(&["--repair-log"]), 1).unwrap().is_none());
    }

    #[test]
    fn the_failover_lease_grace_is_at_most_the_longest_lease_ttl() {
        let grace = |extra: &[&str]| {
            let args: Vec<&str> = ["--cluster-node-id", "1"]
                .iter()
                .chain(extra)
                .copied()
                .collect();
            settings(&config(&args), 1).map(|c| c.is_some())
        };
        let err = grace(&["--failover-lease-grace", "1e9"]).unwrap_err();
        assert_eq!(
            err,
            "--failover-lease-grace 1000000000 is above --max-lease-ttl 300: a failover would \
             keep leases longer than any ttl may (give at most 300)"
        );
        assert_eq!(grace(&["--failover-lease-grace", "300"]), Ok(true));
        assert_eq!(grace(&["--failover-lease-grace", "0"]), Ok(true));
        // The default grace (2 s) against a shorter longest ttl.
        let err = grace(&["--max-lease-ttl", "1"]).unwrap_err();
        assert!(
            err.starts_with("--failover-lease-grace 2 is above --max-lease-ttl 1"),
            "{err}"
        );
        assert_eq!(
            grace(&["--max-lease-ttl", "1", "--failover-lease-grace", "0.5"]),
            Ok(true)
        );
        // A single node has no failover: the option is not used, nor checked.
        let single = config(&["--max-lease-ttl", "1", "--failover-lease-grace", "1e9"]);
        assert!(settings(&single, 1).unwrap().is_none());
    }

    /// A new, empty folder for one test.
    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("permitd-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_cluster_nodes_dir_is_refused_to_a_single_node_and_to_another_node_id() {
        let dir = temp_dir("node-dir");
        let d = dir.to_str().unwrap();
        let single = config(&["--dir", d]);
        let node = |id: &str| config(&["--dir", d, "--cluster-node-id", id]);
        // A fresh --dir: anyone's; checking writes nothing.
        assert_eq!(check_dir(&single), Ok(()));
        assert_eq!(check_dir(&node("1")), Ok(()));
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // Node 1's first start records it.
        let node_dir = dir.join(NODE_DIR);
        record_id(&node_dir, 1).unwrap();
        assert_eq!(owner(&node_dir), Ok(Owner::Node(1)));
        assert_eq!(check_dir(&node("1")), Ok(()));
        let err = check_dir(&node("5")).unwrap_err();
        assert!(
            err.starts_with(&format!("{d} belongs to cluster node 1, not 5 (")),
            "{err}"
        );
        assert!(err.contains("--cluster-node-id 1"), "{err}");
        let err = check_dir(&single).unwrap_err();
        assert!(
            err.starts_with(&format!(
                "{d} belongs to cluster node 1 (its Raft log is in "
            )),
            "{err}"
        );
        assert!(err.contains("start it with its cluster options (--cluster-node-id 1 ...)"));
        // Recording again keeps the id it has.
        record_id(&node_dir, 5).unwrap();
        assert_eq!(owner(&node_dir), Ok(Owner::Node(1)));
        // A raft/ from before ids were recorded: a cluster node's, which one unknown; the first
        // start with an id records it.
        std::fs::remove_file(node_dir.join(ID_FILE)).unwrap();
        let err = check_dir(&single).unwrap_err();
        assert!(
            err.contains("belongs to a cluster node (its Raft log"),
            "{err}"
        );
        assert!(err.contains("(--cluster-node-id N ...)"), "{err}");
        assert_eq!(check_dir(&node("5")), Ok(()));
        record_id(&node_dir, 5).unwrap();
        assert_eq!(owner(&node_dir), Ok(Owner::Node(5)));
        assert!(check_dir(&node("1")).unwrap_err().contains("node 5, not 1"));
        // A damaged id file stops every start, naming it.
        std::fs::write(node_dir.join(ID_FILE), b"5\n").unwrap();
        for c in [&single, &node("5")] {
            let err = check_dir(c).unwrap_err();
            assert!(
                err.contains("node-id: corrupt cluster node id file"),
                "{err}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_bad_cluster_init_or_bind_is_refused_naming_the_option() {
        let err = settings(
            &config(&["--cluster-node-id", "1", "--cluster-init", "1=127.0.0.1"]),
            1,
        )
        .unwrap_err();
        assert!(err.starts_with("--cluster-init"), "{err}");
        let err = settings(
            &config(&[
                "--cluster-node-id",
                "2",
                "--cluster-init",
                "1=127.0.0.1:7001",
            ]),
            1,
        )
        .unwrap_err();
        assert!(err.contains("this node (2)"), "{err}");
        let err = settings(
            &config(&["--bind", "localhost", "--cluster-node-id", "1"]),
            1,
        )
        .unwrap_err();
        assert!(err.contains("IP address"), "{err}");
        let err = settings(
            &config(&["--cluster-node-id", "1", "--cluster-bind", "peers.local"]),
            1,
        )
        .unwrap_err();
        assert!(err.starts_with("--cluster-bind peers.local"), "{err}");
        // Peer traffic on an address of its own, the client port on --bind.
        let c = settings(
            &config(&[
                "--port",
                "7001",
                "--cluster-node-id",
                "1",
                "--cluster-bind",
                "127.0.0.5",
            ]),
            1,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.listen, "127.0.0.5:17001".parse().unwrap());
    }
}
