//! `--metrics-port` (SPEC §11): an HTTP listener (hyper) on the bind address serving
//! `GET /metrics` and `GET /health`.
//!
//! A scrape asks every shard for its figures (each thread counts its own, so nothing shared is
//! touched on the hot path), adds them up, and has prometheus-client write them: OpenMetrics when
//! the scraper asks for it (Prometheus does), else Prometheus's text format 0.0.4, which differs
//! only in how a counter's family is named (see [`to_text_format`]).
//! Per-namespace and per-semaphore series are capped at `--metrics-max-semaphores`, busiest
//! first; `permitd_metrics_omitted_*` tell how many were left out. Whenever the server has a
//! password, every path but `/health` asks for the ACL's credentials and shows only the
//! namespaces the user's key patterns allow (`httpauth.rs`).
//!
//! Scrapes cost the server a bounded share of its time however many scrapers there are: one is
//! answered per 50 ms at most, one gathering runs at a time, and the scrapes that come
//! meanwhile share it. An exposition
//! whose gathering and writing took 20 ms or more (a large state: some 100,000 semaphores) is
//! served again, to the same user, for ten times as long as it took, at most a second, so that
//! scraping back to back leaves the server at least ten elevenths of its time; a quicker one is
//! not, and its scrapes see every change made before them. In cluster mode the
//! `permitd_cluster_*` series tell the node's Raft state, from the same status as `INFO raft`;
//! the others are this node's, so a follower's keyspace series read 0 (its shards hold no
//! state: the leader's are the cluster's).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{HeaderValue, ACCEPT, CONTENT_TYPE, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::acl::User;
use super::global::Global;
use super::httpauth;
use super::info::{self, Totals};
use super::msg::{ShardMetrics, ShardMsg};
use super::semstats::{NsGauge, SemGauge, SemKey, WaitHist};
use super::stats::Latency;
use crate::cluster::node::{Role, Status};
use crate::ratelimit::{Cap, RateLimited};

/// Upper bounds (seconds) of the command latency histogram's buckets.
const COMMAND_BUCKETS: [f64; 16] = [
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0,
];

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Most connections the HTTP port holds at once. A scraper or two and a few people need a
/// handful; each is a file descriptor the client ports share, and 562 idle ones made PINGs time
/// out under a 512-descriptor limit (issue 40, item 9).
const MAX_CONNECTIONS: usize = 64;

/// How long a connection may go without sending a whole request's headers, idle between
/// requests included: a scraper sends them at once, so an idle connection holds one of the
/// [`MAX_CONNECTIONS`] for this long at most.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Failed accepts (out of descriptors, say), logged at most once a second.
static ACCEPT_FAILED: RateLimited = RateLimited::new();

/// The scrapes' pace, and the last exposition written, shared by the scrapes that come while
/// it is fresh.
#[derive(Default)]
struct Scrapes {
    /// When the next scrape may be answered.
    next: std::sync::Mutex<Option<Instant>>,
    /// Locked while one is gathered, so that one gathering runs at a time and the scrapes
    /// waiting for it take its result.
    last: tokio::sync::Mutex<Option<Exposition>>,
}

/// The HTTP port answers one scrape per this at most; more wait their turn. Prometheus scrapes
/// a target every 15 s by default. Four scrapers going back to back had a cached exposition
/// (some 400 KB with a thousand semaphores' series) written a thousand times a second: the
/// writing alone took a core of the two (measured by scripts/bench-scrape).
const SCRAPE_EVERY: Duration = Duration::from_millis(50);

/// An exposition written for a viewer, and until when it is served again.
struct Exposition {
    /// The user whose namespaces it shows (`None`: every namespace).
    viewer: Option<Arc<User>>,
    until: Instant,
    open_metrics: Bytes,
    /// Prometheus's text format, written from the OpenMetrics text when first asked for.
    text: OnceLock<Bytes>,
}

/// An exposition whose gathering and writing took this long or longer is served again, for
/// this many times as long as it took, and at most for the last.
const REUSE_FROM: Duration = Duration::from_millis(20);
const REUSE_FACTOR: u32 = 10;
const REUSE_MOST: Duration = Duration::from_secs(1);

impl Scrapes {
    /// The exposition for `viewer`, in OpenMetrics (`open`) or the text format: the last one
    /// if still fresh and theirs (the same ACL user, not changed since), else a new one.
    async fn body(&self, g: &Global, viewer: Option<Arc<User>>, open: bool) -> Bytes {
        let turn = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let turn = next.map_or_else(Instant::now, |n| n.max(Instant::now()));
            *next = Some(turn + SCRAPE_EVERY);
            turn
        };
        tokio::time::sleep_until(turn.into()).await;
        let mut last = self.last.lock().await;
        let fresh = last.as_ref().is_some_and(|e| {
            Instant::now() < e.until
                && match (&e.viewer, &viewer) {
                    (None, None) => true,
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                }
        });
        if !fresh {
            let started = Instant::now();
            let open_metrics = Bytes::from(exposition(gather(g, viewer.clone()).await));
            let took = started.elapsed();
            let reuse = match took >= REUSE_FROM {
                true => (took * REUSE_FACTOR).min(REUSE_MOST),
                false => Duration::ZERO,
            };
            *last = Some(Exposition {
                viewer,
                until: Instant::now() + reuse,
                open_metrics,
                text: OnceLock::new(),
            });
        }
        let e = last.as_ref().expect("written above");
        match open {
            true => e.open_metrics.clone(),
            false => e
                .text
                .get_or_init(|| {
                    let om = std::str::from_utf8(&e.open_metrics).unwrap_or_default();
                    Bytes::from(to_text_format(om))
                })
                .clone(),
        }
    }
}

/// Serves `/metrics` and `/health` on `listener` until the runtime stops (at shutdown).
pub async fn serve(g: Arc<Global>, listener: std::net::TcpListener) {
    let listener = match tokio::net::TcpListener::from_std(listener) {
        Ok(l) => l,
        Err(e) => return tracing::error!(error = %e, "the metrics listener failed"),
    };
    let cap = Cap::new(MAX_CONNECTIONS, "metrics port");
    let scrapes = Arc::new(Scrapes::default());
    loop {
        let (stream, from) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                if let Some(more) = ACCEPT_FAILED.allow() {
                    tracing::warn!(error = %e, "metrics accept failed{more}");
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Over the cap, `stream` is dropped: closed at once.
        let Some(slot) = cap.admit(from) else {
            continue;
        };
        let (g, scrapes) = (g.clone(), scrapes.clone());
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let (g, scrapes) = (g.clone(), scrapes.clone());
                async move { Ok::<_, Infallible>(answer(&g, &scrapes, req).await) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(io, service)
                .await;
            drop(slot);
        });
    }
}

/// One HTTP request's answer.
async fn answer<B>(g: &Global, scrapes: &Scrapes, req: Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
    }
    match req.uri().path() {
        // A node serves while it runs and, in cluster mode, knows a leader (SPEC §11); it
        // stops answering 200 once shutting down.
        "/health" if g.shutting_down() => plain(StatusCode::SERVICE_UNAVAILABLE, "stopping\n"),
        "/health" if !g.topology().knows_leader() => {
            plain(StatusCode::SERVICE_UNAVAILABLE, "no leader\n")
        }
        "/health" => plain(StatusCode::OK, "OK\n"),
        _ => match httpauth::user(&g.acl, req.headers()) {
            Some(user) => authorized(g, scrapes, &req, user).await,
            None => {
                let mut r = plain(StatusCode::UNAUTHORIZED, "credentials needed\n");
                r.headers_mut().insert(
                    WWW_AUTHENTICATE,
                    HeaderValue::from_static(httpauth::CHALLENGE),
                );
                r
            }
        },
    }
}

/// The answer to a request of `user` (for anything but `/health`).
async fn authorized<B>(
    g: &Global,
    scrapes: &Scrapes,
    req: &Request<B>,
    user: Arc<User>,
) -> Response<Full<Bytes>> {
    match req.uri().path() {
        "/metrics" => {
            let open = req
                .headers()
                .get(ACCEPT)
                .and_then(|a| a.to_str().ok())
                .is_some_and(|a| a.contains("application/openmetrics-text"));
            let visible_to = Some(user).filter(|u| !u.sees_all());
            let body = scrapes.body(g, visible_to, open).await;
            let kind = if open { OPENMETRICS } else { TEXT_FORMAT };
            let mut r = Response::new(Full::new(body));
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static(kind));
            r
        }
        _ => plain(
            StatusCode::NOT_FOUND,
            "not found: try /metrics or /health\n",
        ),
    }
}

fn plain(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

/// Everything a scrape shows, every shard's figures merged.
#[derive(Debug)]
struct Snapshot {
    totals: Totals,
    connected: u64,
    connections_received: u64,
    connections_rejected: u64,
    namespaces: Vec<NsGauge>,
    semaphores: Vec<SemGauge>,
    waits: Vec<(SemKey, WaitHist)>,
    /// How many namespaces and semaphores the scraper may see, the cap aside.
    seen_namespaces: u64,
    seen_semaphores: u64,
    /// Cluster mode: the node's Raft status.
    cluster: Option<Status>,
}

/// Asks every shard for its figures and merges them, keeping the busiest up to the cap; only
/// the namespaces `visible_to`'s key patterns allow (`None`: all).
async fn gather(g: &Global, visible_to: Option<Arc<User>>) -> Snapshot {
    let cap = g.config.metrics_max_semaphores;
    let parts: Vec<ShardMetrics> = g
        .ask_all(|reply| ShardMsg::Metrics {
            cap,
            visible_to: visible_to.clone(),
            reply,
        })
        .await
        .into_iter()
        .map(|(_, m)| m)
        .collect();
    let infos: Vec<_> = parts.iter().map(|p| p.info.clone()).collect();
    let (mut namespaces, mut semaphores, mut waits) = (Vec::new(), Vec::new(), Vec::new());
    let (mut seen_namespaces, mut seen_semaphores) = (0, 0);
    for p in parts {
        namespaces.extend(p.busiest.namespaces);
        semaphores.extend(p.busiest.semaphores);
        seen_namespaces += p.busiest.seen_namespaces;
        seen_semaphores += p.busiest.seen_semaphores;
        waits.extend(p.waits);
    }
    namespaces.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
    namespaces.truncate(cap);
    semaphores.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
    semaphores.truncate(cap);
    waits.sort_unstable_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(&b.0)));
    waits.truncate(cap);
    Snapshot {
        totals: info::sum(&infos),
        connected: g.clients.count() as u64,
        connections_received: g.clients.total_connections(),
        connections_rejected: g.clients.rejected_connections(),
        namespaces,
        semaphores,
        waits,
        seen_namespaces,
        seen_semaphores,
        cluster: g.cluster().map(|h| h.status().borrow().clone()),
    }
}

/// The OpenMetrics text of a snapshot.
fn exposition(s: Snapshot) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(s));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Prometheus's text format 0.0.4 from the OpenMetrics that prometheus-client writes: the same
/// samples, but a counter's `# HELP`/`# TYPE` name its samples' `_total` name, and no `# EOF`.
fn to_text_format(om: &str) -> String {
    let counters: Vec<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 16 * counters.len());
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let head = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|p| line.starts_with(p));
        if let Some(head) = head {
            let rest = &line[head.len()..];
            let name = rest.split(' ').next().unwrap_or_default();
            if counters.contains(&name) {
                out.push_str(head);
                out.push_str(name);
                out.push_str("_total");
                out.push_str(&rest[name.len()..]);
                out.push('\n');
                continue;
            }
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn text(b: &Bytes) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// (upper bound, count) of a command's latencies, per bucket of [`COMMAND_BUCKETS`] then +Inf.
fn command_buckets(h: &Latency) -> Vec<(f64, u64)> {
    let mut counts = [0u64; COMMAND_BUCKETS.len() + 1];
    for v in h.iter_recorded() {
        let secs = v.value_iterated_to() as f64 / 1e9;
        counts[COMMAND_BUCKETS.partition_point(|&b| b < secs)] += v.count_at_value();
    }
    COMMAND_BUCKETS
        .iter()
        .copied()
        .chain([f64::MAX])
        .zip(counts)
        .collect()
}

type Res = Result<(), std::fmt::Error>;

/// Writes one family of a metric type, one sample per label set.
fn family<L: prometheus_client::encoding::EncodeLabelSet, M: EncodeMetric>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    samples: impl IntoIterator<Item = (L, M)>,
) -> Res {
    let mut f = enc.encode_descriptor(name, help, None, kind)?;
    for (labels, m) in samples {
        m.encode(f.encode_family(&labels)?)?;
    }
    Ok(())
}

/// Writes one metric without labels.
fn single(enc: &mut DescriptorEncoder, name: &str, help: &str, m: impl EncodeMetric) -> Res {
    let f = enc.encode_descriptor(name, help, None, m.metric_type())?;
    m.encode(f)
}

fn counter(v: u64) -> ConstCounter<u64> {
    ConstCounter::new(v)
}

fn gauge<N>(v: N) -> ConstGauge<N> {
    ConstGauge::new(v)
}

impl Snapshot {
    fn encode_commands(&self, enc: &mut DescriptorEncoder) -> Res {
        let cs = &self.totals.command_stats;
        let commands = cs.commands();
        let outcomes = commands.iter().flat_map(|(name, st)| {
            [
                ("ok", st.calls.saturating_sub(st.failed)),
                ("failed", st.failed),
                ("rejected", st.rejected),
            ]
            .map(|(outcome, n)| ([("command", *name), ("outcome", outcome)], counter(n)))
        });
        family(
            enc,
            "permitd_commands",
            "Commands by command and outcome (ok, failed: ran and answered an error, rejected: refused before running)",
            MetricType::Counter,
            outcomes,
        )?;
        let mut f = enc.encode_descriptor(
            "permitd_command_duration_seconds",
            "Time each command took to run (not the wait of a parked acquire)",
            None,
            MetricType::Histogram,
        )?;
        for (name, h) in cs.latencies() {
            let sum = commands
                .iter()
                .find(|(n, _)| *n == name)
                .map_or(0.0, |(_, st)| st.nanos as f64 / 1e9);
            f.encode_family(&[("command", name)])?
                .encode_histogram::<NoLabelSet>(sum, h.len(), &command_buckets(h), None)?;
        }
        family(
            enc,
            "permitd_errors",
            "Error replies by error code",
            MetricType::Counter,
            cs.errors()
                .into_iter()
                .map(|(code, n)| ([("code", code)], counter(n))),
        )
    }

    fn encode_server(&self, enc: &mut DescriptorEncoder) -> Res {
        let (c, s) = (self.totals.counts, self.totals.stats);
        family(
            enc,
            "permitd_acquires",
            "SEM.ACQUIRE results by outcome",
            MetricType::Counter,
            [
                ("acquired", s.acquire_acquired),
                ("unavailable", s.acquire_unavailable),
                ("timed_out", s.acquire_timed_out),
            ]
            .map(|(o, n)| ([("outcome", o)], counter(n))),
        )?;
        single(
            enc,
            "permitd_lease_expiries",
            "Leases that expired (not refreshed in time)",
            counter(s.leases_expired),
        )?;
        single(
            enc,
            "permitd_connections_received",
            "Client connections accepted",
            counter(self.connections_received),
        )?;
        single(
            enc,
            "permitd_connections_rejected",
            "Client connections refused (maxclients)",
            counter(self.connections_rejected),
        )?;
        single(
            enc,
            "permitd_connected_clients",
            "Client connections open now",
            gauge(self.connected),
        )?;
        single(
            enc,
            "permitd_parked_acquires",
            "Acquires parked (waiting for permits) now",
            gauge(c.waiters),
        )?;
        single(enc, "permitd_namespaces", "Namespaces", gauge(c.namespaces))?;
        single(
            enc,
            "permitd_semaphores",
            "Semaphores, in all namespaces",
            gauge(c.semaphores),
        )?;
        single(
            enc,
            "permitd_leases",
            "Live leases, in all namespaces",
            gauge(c.leases),
        )?;
        single(
            enc,
            "permitd_holders",
            "Holders, on all semaphores",
            gauge(c.holders),
        )?;
        // Of those the scraper may see: the others are not its to count.
        let omitted = |seen: u64, shown: usize| gauge(seen.saturating_sub(shown as u64));
        single(
            enc,
            "permitd_metrics_omitted_namespaces",
            "Namespaces without series of their own (past --metrics-max-semaphores)",
            omitted(self.seen_namespaces, self.namespaces.len()),
        )?;
        single(
            enc,
            "permitd_metrics_omitted_semaphores",
            "Semaphores without series of their own (past --metrics-max-semaphores)",
            omitted(self.seen_semaphores, self.semaphores.len()),
        )
    }

    fn encode_namespaces(&self, enc: &mut DescriptorEncoder) -> Res {
        type Of = fn(&NsGauge) -> u64;
        let series: [(&str, &str, Of); 4] = [
            (
                "permitd_namespace_semaphores",
                "Semaphores in the namespace",
                |n| n.semaphores,
            ),
            (
                "permitd_namespace_leases",
                "Live leases in the namespace",
                |n| n.leases,
            ),
            (
                "permitd_namespace_holders",
                "Holders on the namespace's semaphores",
                |n| n.holders,
            ),
            (
                "permitd_namespace_waiters",
                "Parked acquires on the namespace's semaphores",
                |n| n.waiters,
            ),
        ];
        for (name, help, of) in series {
            let samples = self
                .namespaces
                .iter()
                .map(|n| ([("namespace", text(n.ns.bytes()))], gauge(of(n))));
            family(enc, name, help, MetricType::Gauge, samples)?;
        }
        Ok(())
    }

    fn encode_semaphores(&self, enc: &mut DescriptorEncoder) -> Res {
        let labels = |k: &SemKey| {
            [
                ("namespace", text(k.0.bytes())),
                ("semaphore", text(k.1.bytes())),
            ]
        };
        type Of = fn(&SemGauge) -> i64;
        let series: [(&str, &str, Of); 4] = [
            (
                "permitd_semaphore_permits",
                "The semaphore's permits",
                |s| s.permits,
            ),
            (
                "permitd_semaphore_active_holds",
                "Permits held (sum of holder weights)",
                |s| s.active_holds,
            ),
            (
                "permitd_semaphore_holders",
                "Holders of the semaphore",
                |s| s.holders as i64,
            ),
            (
                "permitd_semaphore_waiters",
                "Acquires parked on the semaphore",
                |s| s.waiters as i64,
            ),
        ];
        for (name, help, of) in series {
            let samples = self
                .semaphores
                .iter()
                .map(|s| (labels(&s.key), gauge(of(s))));
            family(enc, name, help, MetricType::Gauge, samples)?;
        }
        family(
            enc,
            "permitd_semaphore_oldest_wait_seconds",
            "How long the oldest parked acquire has waited (0: none)",
            MetricType::Gauge,
            self.semaphores
                .iter()
                .map(|s| (labels(&s.key), gauge(s.oldest_wait))),
        )?;
        let mut f = enc.encode_descriptor(
            "permitd_semaphore_wait_seconds",
            "Wait of parked acquires from park to grant",
            None,
            MetricType::Histogram,
        )?;
        for (key, h) in &self.waits {
            f.encode_family(&labels(key))?
                .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets(), None)?;
        }
        Ok(())
    }
}

/// Cluster mode's series: who leads, the term and indexes, and on the leader each follower's
/// lag and whether it answers (as `INFO raft` tells them).
fn encode_cluster(s: &Status, enc: &mut DescriptorEncoder) -> Res {
    single(
        enc,
        "permitd_cluster_leader",
        "1 on the node that leads, 0 on the others",
        gauge(i64::from(s.role == Role::Leader)),
    )?;
    single(
        enc,
        "permitd_cluster_leader_id",
        "The node id of the leader this node knows (0: none known, CLUSTERDOWN)",
        gauge(s.leader.as_ref().map_or(0, |l| l.id as i64)),
    )?;
    single(
        enc,
        "permitd_cluster_term",
        "The Raft term",
        gauge(s.term as i64),
    )?;
    let index = |i: Option<u64>| gauge(i.map_or(-1, |i| i as i64));
    single(
        enc,
        "permitd_cluster_commit_index",
        "The last committed Raft log index (-1: none)",
        index(s.committed),
    )?;
    single(
        enc,
        "permitd_cluster_applied_index",
        "The last applied Raft log index (-1: none)",
        index(s.applied),
    )?;
    let peer = |id: u64| [("peer", id.to_string())];
    family(
        enc,
        "permitd_cluster_peer_lag",
        "On the leader: entries of its log a follower does not hold yet",
        MetricType::Gauge,
        s.peers
            .iter()
            .filter_map(|p| Some((peer(p.id), gauge(p.lag? as i64)))),
    )?;
    family(
        enc,
        "permitd_cluster_peer_up",
        "On the leader: 1 while a follower answers, 0 once it answered nothing for two leader leases",
        MetricType::Gauge,
        s.peers
            .iter()
            .filter_map(|p| Some((peer(p.id), gauge(i64::from(p.answering?))))),
    )
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder) -> Res {
        self.encode_commands(&mut enc)?;
        self.encode_server(&mut enc)?;
        self.encode_namespaces(&mut enc)?;
        self.encode_semaphores(&mut enc)?;
        match &self.cluster {
            Some(s) => encode_cluster(s, &mut enc),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_format_names_counter_families_by_their_samples() {
        let om = "# HELP a_things Things.\n# TYPE a_things counter\na_things_total{x=\"1\"} 3\n\
                  # HELP b Gauge.\n# TYPE b gauge\nb 1\n# EOF\n";
        assert_eq!(
            to_text_format(om),
            "# HELP a_things_total Things.\n# TYPE a_things_total counter\n\
             a_things_total{x=\"1\"} 3\n# HELP b Gauge.\n# TYPE b gauge\nb 1\n"
        );
    }

    #[test]
    fn command_latencies_fall_in_the_buckets_at_or_above_them() {
        let mut h = Latency::new_with_bounds(1, 1_000_000_000, 2).unwrap();
        h.record(3_000).unwrap(); // 3 µs
        h.record(20_000_000).unwrap(); // 20 ms
        let b = command_buckets(&h);
        assert_eq!(b[0], (0.00001, 1));
        assert_eq!(b[10], (0.025, 1));
        assert_eq!(b.iter().map(|(_, n)| n).sum::<u64>(), 2);
    }
}
