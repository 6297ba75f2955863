//! Server-level replies: INFO sections, CONFIG GET, HELLO.

use bytes::Bytes;

use super::cluster;
use super::global::Global;
use super::memory;
use super::msg::ShardInfo;
use super::stats::{percentile_usec, CommandStats};
use super::topology::{self, Topology};
use crate::command::info::{Sections, SECTIONS};
use crate::engine::{Counts, Stats};
use crate::persist::PersistStats;
use crate::protocol::{Proto, Reply};

/// Every shard's INFO figures added up.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Namespaces, semaphores, leases, holders, waiters.
    pub counts: Counts,
    /// Engine counters, summed.
    pub stats: Stats,
    /// Persistence: sums of sizes and counts, the latest times, the longest durations.
    pub persist: PersistStats,
    /// Commands run by all connections (`total_commands_processed`).
    pub commands: u64,
    /// Every thread's per-command figures.
    pub command_stats: CommandStats,
}

/// The Redis version permitd is compatible with (clients check `redis_version`).
pub const REDIS_COMPAT_VERSION: &str = "7.0.0";

/// permitd's own version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Adds up the shards' figures.
pub fn sum(parts: &[ShardInfo]) -> Totals {
    let mut c = Counts::default();
    let mut s = Stats::default();
    let mut p = PersistStats::default();
    let mut commands = 0;
    let mut command_stats = CommandStats::default();
    for part in parts {
        command_stats.merge(&part.command_stats);
        let (pc, ps, pp) = (&part.counts, &part.stats, &part.persist);
        commands += part.commands;
        p.last_fsync_at = p.last_fsync_at.max(pp.last_fsync_at);
        p.fsyncs += pp.fsyncs;
        p.log_bytes += pp.log_bytes;
        p.snapshots += pp.snapshots;
        p.last_snapshot_us = p.last_snapshot_us.max(pp.last_snapshot_us);
        p.last_snapshot_pause_us = p.last_snapshot_pause_us.max(pp.last_snapshot_pause_us);
        p.write_failing |= pp.write_failing;
        p.snapshot_failing |= pp.snapshot_failing;
        c.namespaces += pc.namespaces;
        c.semaphores += pc.semaphores;
        c.leases += pc.leases;
        c.holders += pc.holders;
        c.waiters += pc.waiters;
        s.acquire_acquired += ps.acquire_acquired;
        s.acquire_unavailable += ps.acquire_unavailable;
        s.acquire_timed_out += ps.acquire_timed_out;
        s.leases_expired += ps.leases_expired;
        s.clients_unblocked += ps.clients_unblocked;
    }
    // The error of a shard that is failing now, else the last one any shard had.
    let failing = parts.iter().find(|part| part.persist.write_failing);
    let erred = parts.iter().find(|part| part.persist.last_write_errno != 0);
    p.last_write_errno = failing
        .or(erred)
        .map_or(0, |part| part.persist.last_write_errno);
    Totals {
        counts: c,
        stats: s,
        persist: p,
        commands,
        command_stats,
    }
}

/// Redis's word for whether the last try of a write went through.
fn status(failing: bool) -> &'static str {
    if failing {
        "err"
    } else {
        "ok"
    }
}

/// The OS error of the last failed write of the log (empty when none failed since start): it
/// stays after writes resume, to tell what happened; `last_write_status` tells whether it lasts.
fn write_error(errno: i32) -> String {
    match errno {
        0 => String::new(),
        e => std::io::Error::from_raw_os_error(e).to_string(),
    }
}

/// The INFO text for the asked sections.
pub fn info_text(g: &Global, asked: &Sections, totals: Totals) -> String {
    let mut out = String::new();
    for &section in SECTIONS {
        // `# Raft` only in cluster mode (SPEC §10).
        if !asked.shows(section) || (section == "raft" && g.cluster().is_none()) {
            continue;
        }
        if !out.is_empty() {
            out.push_str("\r\n");
        }
        let mut title = section.to_string();
        title[..1].make_ascii_uppercase();
        if section == "cpu" {
            title.make_ascii_uppercase(); // Redis's spelling
        }
        out.push_str(&format!("# {title}\r\n"));
        let fields = match section {
            "replication" => g.topology().info_replication(),
            "cluster" => g.topology().info_cluster(),
            "raft" => g
                .cluster()
                .map_or_else(Vec::new, |n| cluster::info_raft(&n.status().borrow())),
            "commandstats" | "errorstats" | "latencystats" => {
                command_fields(&totals.command_stats, section)
            }
            _ => section_fields(g, section, &totals)
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        };
        for (k, v) in fields {
            out.push_str(&format!("{k}:{v}\r\n"));
        }
    }
    out
}

/// Redis's latency percentiles (`latency-tracking-info-percentiles`, default `50 99 99.9`).
const PERCENTILES: [(&str, f64); 3] = [("50", 50.0), ("99", 99.0), ("99.9", 99.9)];

/// The lines of `# Commandstats`, `# Errorstats` and `# Latencystats`, in Redis 7's format.
fn command_fields(cs: &CommandStats, section: &str) -> Vec<(String, String)> {
    match section {
        "commandstats" => cs
            .commands()
            .into_iter()
            .filter(|(_, st)| st.calls > 0 || st.failed > 0 || st.rejected > 0)
            .map(|(name, st)| {
                let usec = st.nanos / 1000;
                let per_call = if st.calls == 0 {
                    0.0
                } else {
                    usec as f64 / st.calls as f64
                };
                (
                    format!("cmdstat_{name}"),
                    format!(
                        "calls={},usec={usec},usec_per_call={per_call:.2},rejected_calls={},failed_calls={}",
                        st.calls, st.rejected, st.failed
                    ),
                )
            })
            .collect(),
        "errorstats" => cs
            .errors()
            .into_iter()
            .map(|(code, n)| (format!("errorstat_{code}"), format!("count={n}")))
            .collect(),
        _ => cs
            .latencies()
            .into_iter()
            .map(|(name, h)| {
                let p = PERCENTILES
                    .iter()
                    .map(|(label, p)| format!("p{label}={:.3}", percentile_usec(h, *p)))
                    .collect::<Vec<_>>()
                    .join(",");
                (format!("latency_percentiles_usec_{name}"), p)
            })
            .collect(),
    }
}

fn section_fields(g: &Global, section: &str, t: &Totals) -> Vec<(&'static str, String)> {
    let (c, s, p) = (t.counts, t.stats, t.persist);
    let uptime = g.started.elapsed().as_secs();
    match section {
        "server" => vec![
            ("redis_version", REDIS_COMPAT_VERSION.into()),
            ("permitd_version", VERSION.into()),
            ("redis_mode", topology::MODE.into()),
            ("os", std::env::consts::OS.into()),
            ("arch_bits", "64".into()),
            ("multiplexing_api", "epoll".into()),
            ("process_id", std::process::id().to_string()),
            ("tcp_port", g.port.to_string()),
            ("uptime_in_seconds", uptime.to_string()),
            ("uptime_in_days", (uptime / 86400).to_string()),
            ("shards", g.shard_count().to_string()),
        ],
        "clients" => vec![
            ("connected_clients", g.clients.count().to_string()),
            (
                "clients_per_shard",
                (0..g.shard_count())
                    .map(|i| g.clients.count_on_shard(i).to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("maxclients", g.config.maxclients.to_string()),
            ("blocked_clients", g.clients.blocked().to_string()),
        ],
        "memory" => {
            let rss = memory::rss_bytes();
            vec![
                ("used_memory", rss.to_string()),
                ("used_memory_rss", rss.to_string()),
                ("maxmemory", g.memory.limit().to_string()),
            ]
        }
        "persistence" => vec![
            ("loading", "0".into()),
            ("async_loading", "0".into()),
            ("rdb_bgsave_in_progress", "0".into()),
            ("rdb_last_bgsave_status", status(p.snapshot_failing).into()),
            ("aof_enabled", "1".into()),
            ("aof_rewrite_in_progress", "0".into()),
            (
                "aof_last_bgrewrite_status",
                status(p.snapshot_failing).into(),
            ),
            ("aof_last_write_status", status(p.write_failing).into()),
            ("last_write_status", status(p.write_failing).into()),
            ("last_write_error", write_error(p.last_write_errno)),
            ("fsync_policy", g.config.fsync.as_str().into()),
            ("log_bytes", p.log_bytes.to_string()),
            ("fsyncs", p.fsyncs.to_string()),
            ("last_fsync_at", p.last_fsync_at.to_string()),
            ("snapshots", p.snapshots.to_string()),
            ("last_snapshot_duration_us", p.last_snapshot_us.to_string()),
            (
                "last_snapshot_pause_us",
                p.last_snapshot_pause_us.to_string(),
            ),
        ],
        "stats" => vec![
            (
                "total_connections_received",
                g.clients.total_connections().to_string(),
            ),
            ("total_commands_processed", t.commands.to_string()),
            (
                "total_error_replies",
                t.command_stats
                    .errors()
                    .iter()
                    .map(|(_, n)| n)
                    .sum::<u64>()
                    .to_string(),
            ),
            (
                "rejected_connections",
                g.clients.rejected_connections().to_string(),
            ),
            ("acquire_acquired", s.acquire_acquired.to_string()),
            ("acquire_unavailable", s.acquire_unavailable.to_string()),
            ("acquire_timed_out", s.acquire_timed_out.to_string()),
            ("leases_expired", s.leases_expired.to_string()),
            ("clients_unblocked", s.clients_unblocked.to_string()),
        ],
        "cpu" => cpu(),
        "semaphores" => vec![
            ("namespaces", c.namespaces.to_string()),
            ("semaphores", c.semaphores.to_string()),
            ("leases", c.leases.to_string()),
            ("holders", c.holders.to_string()),
            ("waiters", c.waiters.to_string()),
        ],
        "keyspace" => {
            if c.namespaces == 0 {
                Vec::new()
            } else {
                vec![(
                    "db0",
                    format!("keys={},expires={},avg_ttl=0", c.namespaces, c.leases),
                )]
            }
        }
        _ => Vec::new(),
    }
}

/// `# CPU` as Redis 7.0 writes it: system and user CPU seconds of the process, of its waited-for
/// children, and of the thread answering (Redis's main thread; here the shard thread that
/// runs INFO).
fn cpu() -> Vec<(&'static str, String)> {
    let used = |who: libc::c_int| {
        // SAFETY: getrusage only writes the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(who, &mut u) } != 0 {
            return ("0.000000".to_string(), "0.000000".to_string());
        }
        let secs = |t: libc::timeval| format!("{}.{:06}", t.tv_sec, t.tv_usec);
        (secs(u.ru_stime), secs(u.ru_utime))
    };
    let (sys, user) = used(libc::RUSAGE_SELF);
    let (sys_children, user_children) = used(libc::RUSAGE_CHILDREN);
    let (sys_main, user_main) = used(libc::RUSAGE_THREAD);
    vec![
        ("used_cpu_sys", sys),
        ("used_cpu_user", user),
        ("used_cpu_sys_children", sys_children),
        ("used_cpu_user_children", user_children),
        ("used_cpu_sys_main_thread", sys_main),
        ("used_cpu_user_main_thread", user_main),
    ]
}

/// `CONFIG GET pattern...`: name/value pairs of every option matching a pattern.
pub fn config_get(g: &Global, patterns: &[Bytes]) -> Reply {
    let mut pairs = Vec::new();
    for (name, value) in g.config.entries() {
        if patterns
            .iter()
            .any(|p| crate::glob::matches(&p.to_ascii_lowercase(), name.as_bytes()))
        {
            pairs.push((Reply::text(name), Reply::bulk(value)));
        }
    }
    Reply::Map(pairs)
}

/// The HELLO reply: who answers, the protocol now spoken, the client's id, and this node's
/// place in the cluster.
pub fn hello(client_id: u64, proto: Proto, topology: &Topology) -> Reply {
    Reply::fields(vec![
        ("server", Reply::text("permitd")),
        ("version", Reply::text(REDIS_COMPAT_VERSION)),
        ("proto", Reply::Int(proto.number())),
        ("id", Reply::Int(client_id as i64)),
        ("mode", Reply::text(topology::MODE)),
        ("role", Reply::text(topology.role_name())),
        ("modules", Reply::Array(Vec::new())),
    ])
}
