//! The `failover` mode (cluster mode, SPEC §10): how long clients go without an answer when the
//! leader dies.
//!
//! C clients, each on its own connection under its own lease, loop `SEM.ACQUIRE ns sem lease 1
//! 0` + `SEM.RELEASE` against a cluster known by its node addresses, as a cluster client does:
//! on `-MOVED <slot> <addr>` they reconnect to `addr`; on `-CLUSTERDOWN`, a refused or lost
//! connection they retry every `--retry-ms` on the next node of the list; on `-TRYAGAIN` they
//! retry the same node after `--retry-ms` (it is the new leader, getting ready); on
//! `-LEADERCHANGED` they re-send (an acquire again is a re-acquire, a release again a no-op).
//! Each client notes its successes (an ACQUIRED acquire, a release answered); a pause longer
//! than `--gap-ms` between two of them is an outage.
//!
//! Whoever kills the leader tells this tool on stdin, one line per kill: `kill <unix-ns>
//! [label]`, the wall-clock instant just before the kill. Once every client has succeeded
//! again after it (or `--settle-seconds` passed), one JSON line reports each client's time from
//! the kill to its next success. stdin's end (or `--max-seconds`) ends the run with a summary
//! line: p50/p99/max over every client and kill, the outages that followed no kill, and the
//! refusals seen. A line `{"event":"ready"}` says every client has succeeded once.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use permitd_client::resp::Value;
use permitd_protocol::request::encode_request;
use permitd_tools::Conn;

use crate::args::{current_thread_runtime, FailoverArgs, Result, READ_CHUNK};
use crate::handoff::percentile;
use crate::replies::{permitd_outcome, Outcome};
use crate::setup::unique_suffix;

/// How long a connect may take before the node counts as down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a reply may take before the connection counts as lost.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

pub fn failover(a: &FailoverArgs) -> Result<()> {
    if a.connections == 0 || a.nodes.is_empty() {
        return Err("failover: --connections and --nodes must not be empty".into());
    }
    if !(1..=300).contains(&a.lease_ttl) {
        return Err("failover: --lease-ttl must be in 1..=300 s".into());
    }
    let mut nodes = Vec::new();
    for n in &a.nodes {
        let addr = n
            .to_socket_addrs()
            .map_err(|e| format!("--nodes {n}: {e}"))?
            .next()
            .ok_or_else(|| format!("--nodes {n}: no address"))?;
        nodes.push(addr);
    }
    let shared = Arc::new(Shared {
        nodes,
        ns: a.ns.clone(),
        sem: format!("fo_{}", unique_suffix()),
        retry: Duration::from_secs_f64(a.retry_ms.max(1.0) / 1000.0),
        gap_ns: (a.gap_ms.max(1.0) * 1e6) as u64,
        lease_ttl: a.lease_ttl,
        stop: AtomicBool::new(false),
        records: Mutex::new((0..a.connections).map(|_| Record::default()).collect()),
    });

    // stdin's lines, read on a thread of their own; the channel closes at stdin's end.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    let rt = current_thread_runtime()?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.max_seconds.clamp(1.0, 3600.0));
    let settle = Duration::from_secs_f64(a.settle_seconds.max(0.1));
    rt.block_on(async {
        setup(&shared, a.connections).await?;
        let tasks: Vec<_> = (0..a.connections)
            .map(|i| tokio::spawn(client(i, shared.clone())))
            .collect();

        let mut ready = false;
        let mut kills: Vec<Kill> = Vec::new();
        let mut cursors = vec![0usize; a.connections];
        let mut taken: Vec<Vec<usize>> = vec![Vec::new(); a.connections];
        let mut stdin_open = true;
        let mut why = "stdin closed";
        loop {
            tokio::select! {
                line = rx.recv(), if stdin_open => match line {
                    Some(l) => match parse_kill(&l) {
                        Some((t, label)) => kills.push(Kill::new(t, label, a.connections)),
                        None => eprintln!("permitd-load: failover: ignored stdin line {l:?}"),
                    },
                    None => stdin_open = false,
                },
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            {
                let records = shared.records.lock().unwrap();
                if !ready && records.iter().all(|r| r.last.is_some()) {
                    ready = true;
                    println!("{{\"event\":\"ready\",\"clients\":{}}}", records.len());
                }
                // The kills in order: each takes, per client, its first outage ending after it.
                for (k, kill) in kills.iter_mut().enumerate() {
                    if kill.reported {
                        continue;
                    }
                    for (c, r) in records.iter().enumerate() {
                        if kill.after[c].is_none() {
                            if let Some(i) = next_outage_after(&r.outages, &mut cursors[c], kill.t)
                            {
                                kill.after[c] = Some(r.outages[i].1.saturating_sub(kill.t));
                                taken[c].push(i);
                            }
                        }
                    }
                    let all = kill.after.iter().all(Option::is_some);
                    if all || kill.heard.elapsed() > settle {
                        kill.reported = true;
                        println!("{}", kill.json(k + 1));
                    } else {
                        break; // the later kills wait for this one
                    }
                }
            }
            if !stdin_open && kills.iter().all(|k| k.reported) {
                break;
            }
            if Instant::now() > deadline {
                why = "max-seconds";
                break;
            }
        }

        shared.stop.store(true, Ordering::Relaxed);
        for t in tasks {
            let _ = tokio::time::timeout(REPLY_TIMEOUT + CONNECT_TIMEOUT, t).await;
        }
        let records = shared.records.lock().unwrap();
        println!("{}", summary(&records, &taken, &kills, why));
        Ok(())
    })
}

/// What the clients share: where the cluster is, what they use, and what they saw.
struct Shared {
    nodes: Vec<SocketAddr>,
    ns: String,
    sem: String,
    retry: Duration,
    gap_ns: u64,
    lease_ttl: u64,
    stop: AtomicBool,
    records: Mutex<Vec<Record>>,
}

impl Shared {
    fn note(&self, client: usize, f: impl FnOnce(&mut Record)) {
        f(&mut self.records.lock().unwrap()[client]);
    }
}

/// One client's record: its last success, its outages, and the refusals it met.
#[derive(Default, Debug)]
struct Record {
    /// Wall clock (unix ns) of the last success.
    last: Option<u64>,
    /// (last success before, first success after) of every pause longer than the gap.
    outages: Vec<(u64, u64)>,
    successes: u64,
    moved: u64,
    clusterdown: u64,
    tryagain: u64,
    leaderchanged: u64,
    connect_failed: u64,
    conn_lost: u64,
    leases_created: u64,
    other_errors: u64,
    first_other_error: Option<String>,
}

impl Record {
    fn success(&mut self, now: u64, gap_ns: u64) {
        if let Some(last) = self.last {
            if now.saturating_sub(last) > gap_ns {
                self.outages.push((last, now));
            }
        }
        self.last = Some(now);
        self.successes += 1;
    }

    fn other_error(&mut self, e: String) {
        self.other_errors += 1;
        self.first_other_error.get_or_insert(e);
    }
}

/// The index of the first outage from `*cursor` on that ends after `t`; the cursor moves past
/// it, so the next kill does not take it again.
fn next_outage_after(outages: &[(u64, u64)], cursor: &mut usize, t: u64) -> Option<usize> {
    while let Some(&(_, end)) = outages.get(*cursor) {
        *cursor += 1;
        if end > t {
            return Some(*cursor - 1);
        }
    }
    None
}

/// `kill <unix-ns> [label]`.
fn parse_kill(line: &str) -> Option<(u64, String)> {
    let mut words = line.split_whitespace();
    if words.next()? != "kill" {
        return None;
    }
    let t = words.next()?.parse().ok()?;
    Some((t, words.collect::<Vec<_>>().join(" ")))
}

struct Kill {
    t: u64,
    label: String,
    heard: Instant,
    /// Per client, ns from the kill to its next success.
    after: Vec<Option<u64>>,
    reported: bool,
}

impl Kill {
    fn new(t: u64, label: String, clients: usize) -> Kill {
        Kill {
            t,
            label,
            heard: Instant::now(),
            after: vec![None; clients],
            reported: false,
        }
    }

    fn json(&self, n: usize) -> String {
        let ms: Vec<String> = self
            .after
            .iter()
            .map(|a| a.map_or_else(|| "null".into(), |ns| format!("{:.1}", ns as f64 / 1e6)))
            .collect();
        let max = self.after.iter().flatten().max().copied().unwrap_or(0);
        format!(
            "{{\"event\":\"kill\",\"kill\":{n},\"label\":\"{}\",\"clients\":{},\"recovered\":{},\"max_ms\":{:.1},\"after_ms\":[{}]}}",
            escape(&self.label),
            self.after.len(),
            self.after.iter().flatten().count(),
            max as f64 / 1e6,
            ms.join(",")
        )
    }
}

/// `taken[c]`: the indexes of client c's outages that followed a kill.
fn summary(records: &[Record], taken: &[Vec<usize>], kills: &[Kill], why: &str) -> String {
    let mut samples: Vec<u64> = kills
        .iter()
        .flat_map(|k| k.after.iter().flatten())
        .copied()
        .collect();
    samples.sort_unstable();
    let missing: usize = kills
        .iter()
        .map(|k| k.after.iter().filter(|a| a.is_none()).count())
        .sum();
    let ms = |ns: u64| ns as f64 / 1e6;
    // The outages no kill took: their count, the longest, and (the first 200, in time order)
    // when each began (unix ms) and how long it lasted (ms).
    let mut others: Vec<(u64, u64)> = Vec::new();
    for (c, r) in records.iter().enumerate() {
        for (i, &(start, end)) in r.outages.iter().enumerate() {
            if !taken[c].contains(&i) {
                others.push((start, end - start));
            }
        }
    }
    others.sort_unstable();
    let other_max = others.iter().map(|o| o.1).max().unwrap_or(0);
    let listed: Vec<String> = others
        .iter()
        .take(200)
        .map(|&(start, len)| format!("[{},{:.1}]", start / 1_000_000, ms(len)))
        .collect();
    let sum = |f: fn(&Record) -> u64| records.iter().map(f).sum::<u64>();
    let first_other = records
        .iter()
        .find_map(|r| r.first_other_error.clone())
        .unwrap_or_default();
    format!(
        "{{\"mode\":\"failover\",\"stopped\":\"{why}\",\"clients\":{},\"kills\":{},\"samples\":{},\"missing\":{missing},\"p50_ms\":{:.1},\"p99_ms\":{:.1},\"max_ms\":{:.1},\"outages\":{},\"outages_not_after_a_kill\":{},\"max_other_outage_ms\":{:.1},\"successes\":{},\"moved\":{},\"clusterdown\":{},\"tryagain\":{},\"leaderchanged\":{},\"connect_failed\":{},\"conn_lost\":{},\"leases_created\":{},\"other_errors\":{},\"first_other_error\":\"{}\",\"other_outages\":[{}]}}",
        records.len(),
        kills.len(),
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(percentile(&samples, 1.0)),
        records.iter().map(|r| r.outages.len()).sum::<usize>(),
        others.len(),
        ms(other_max),
        sum(|r| r.successes),
        sum(|r| r.moved),
        sum(|r| r.clusterdown),
        sum(|r| r.tryagain),
        sum(|r| r.leaderchanged),
        sum(|r| r.connect_failed),
        sum(|r| r.conn_lost),
        sum(|r| r.leases_created),
        sum(|r| r.other_errors),
        escape(&first_other),
        listed.join(","),
    )
}

fn escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| match c {
            '"' | '\\' => vec!['\\', c],
            c if c.is_control() => vec![' '],
            c => vec![c],
        })
        .collect()
}

fn unix_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// How one attempt of a command ended.
enum Reply<T> {
    /// A reply that is not an error, as `read` made it.
    Value(T),
    /// An error reply's line, without the `-`.
    Error(String),
}

/// A client's way into the cluster: the node its next command goes to, and the connection.
struct Cluster {
    at: SocketAddr,
    rotation: usize,
    conn: Option<Conn>,
}

impl Cluster {
    fn new(first: usize, shared: &Shared) -> Cluster {
        let rotation = first % shared.nodes.len();
        Cluster {
            at: shared.nodes[rotation],
            rotation,
            conn: None,
        }
    }

    /// To the next node of the list, on a new connection.
    fn rotate(&mut self, shared: &Shared) {
        self.rotation = (self.rotation + 1) % shared.nodes.len();
        self.at = shared.nodes[self.rotation];
        self.conn = None;
    }

    /// Sends `req` until a node serves it, following redirects; `None` once the run stops.
    /// A served error reply comes back as `Some(Err(line))`.
    async fn run<T>(
        &mut self,
        shared: &Shared,
        client: usize,
        req: &[u8],
        read: impl Fn(&[u8]) -> T,
    ) -> Option<std::result::Result<T, String>> {
        while !shared.stop.load(Ordering::Relaxed) {
            if self.conn.is_none() {
                match Conn::connect(self.at, CONNECT_TIMEOUT, READ_CHUNK).await {
                    Ok(c) => self.conn = Some(c),
                    Err(_) => {
                        shared.note(client, |r| r.connect_failed += 1);
                        self.rotate(shared);
                        tokio::time::sleep(shared.retry).await;
                        continue;
                    }
                }
            }
            let conn = self.conn.as_mut().expect("connected above");
            let attempt = async {
                conn.send(req).await?;
                conn.next(REPLY_TIMEOUT, |b| match b.first() {
                    Some(b'-') => {
                        Reply::Error(String::from_utf8_lossy(b[1..].trim_ascii_end()).into_owned())
                    }
                    _ => Reply::Value(read(b)),
                })
                .await
            };
            match attempt.await {
                Err(_) => {
                    shared.note(client, |r| r.conn_lost += 1);
                    self.rotate(shared);
                    tokio::time::sleep(shared.retry).await;
                }
                Ok(Reply::Value(v)) => return Some(Ok(v)),
                Ok(Reply::Error(e)) => match e.split(' ').next().unwrap_or("") {
                    "MOVED" => {
                        shared.note(client, |r| r.moved += 1);
                        match e.split(' ').nth(2).and_then(|a| a.parse().ok()) {
                            Some(to) if to != self.at => {
                                self.at = to;
                                self.conn = None;
                            }
                            _ => tokio::time::sleep(shared.retry).await,
                        }
                    }
                    "CLUSTERDOWN" => {
                        shared.note(client, |r| r.clusterdown += 1);
                        self.rotate(shared);
                        tokio::time::sleep(shared.retry).await;
                    }
                    "TRYAGAIN" => {
                        shared.note(client, |r| r.tryagain += 1);
                        tokio::time::sleep(shared.retry).await;
                    }
                    "LEADERCHANGED" => shared.note(client, |r| r.leaderchanged += 1),
                    _ => return Some(Err(e)),
                },
            }
        }
        None
    }
}

fn request(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(&mut out, args);
    out
}

/// The namespace (if missing) and the semaphore, with a permit per client.
async fn setup(shared: &Shared, clients: usize) -> Result<()> {
    let mut cl = Cluster::new(0, shared);
    let ns = shared.ns.as_bytes();
    let give_up = Instant::now() + Duration::from_secs(30);
    let permits = clients.to_string();
    for (what, req) in [
        ("NS.CREATE", request(&[b"NS.CREATE", ns])),
        (
            "SEM.CREATE",
            request(&[b"SEM.CREATE", ns, shared.sem.as_bytes(), permits.as_bytes()]),
        ),
    ] {
        let served = tokio::time::timeout_at(give_up.into(), cl.run(shared, 0, &req, |_| ()))
            .await
            .map_err(|_| format!("failover: {what}: no node served it within 30 s"))?;
        match served {
            Some(Ok(())) => {}
            Some(Err(e)) if what == "NS.CREATE" && e.starts_with("ALREADYEXISTS") => {}
            Some(Err(e)) => return Err(format!("failover: {what}: -{e}").into()),
            None => return Err("failover: stopped during setup".into()),
        }
    }
    // Setup's refusals are not the run's.
    shared.note(0, |r| *r = Record::default());
    Ok(())
}

/// One client: a lease of its own, refreshed every third of its TTL, and acquire + release
/// until the run stops.
async fn client(i: usize, shared: Arc<Shared>) {
    let s = &*shared;
    let mut cl = Cluster::new(i, s);
    let (ns, sem) = (s.ns.as_bytes(), s.sem.as_bytes());
    let ttl = s.lease_ttl.to_string();
    let process = format!("permitd-load-failover-{i}");
    let refresh_every = Duration::from_secs_f64(s.lease_ttl as f64 / 3.0);
    let mut lease: Option<(String, Instant)> = None;
    while !s.stop.load(Ordering::Relaxed) {
        let Some((id, since)) = lease.clone() else {
            let req = request(&[b"LEASE.CREATE", ns, process.as_bytes(), ttl.as_bytes()]);
            let read = |b: &[u8]| {
                Value::parse(b)
                    .ok()
                    .and_then(|(v, _)| v.text_field("lease_id"))
            };
            match cl.run(s, i, &req, read).await {
                None => break,
                Some(Ok(Some(id))) => {
                    s.note(i, |r| r.leases_created += 1);
                    lease = Some((id, Instant::now()));
                }
                Some(Ok(None)) => s.note(i, |r| r.other_error("LEASE.CREATE: no lease_id".into())),
                Some(Err(e)) => {
                    s.note(i, |r| r.other_error(format!("LEASE.CREATE: -{e}")));
                    tokio::time::sleep(s.retry).await;
                }
            }
            continue;
        };
        let lid = id.as_bytes();
        if since.elapsed() >= refresh_every {
            let req = request(&[b"LEASE.REFRESH", ns, lid, ttl.as_bytes()]);
            match cl.run(s, i, &req, |_| ()).await {
                None => break,
                Some(Ok(())) => lease = Some((id.clone(), Instant::now())),
                Some(Err(e)) => {
                    s.note(i, |r| r.other_error(format!("LEASE.REFRESH: -{e}")));
                    lease = None;
                    continue;
                }
            }
        }
        let req = request(&[b"SEM.ACQUIRE", ns, sem, lid, b"1", b"0"]);
        match cl.run(s, i, &req, permitd_outcome).await {
            None => break,
            Some(Ok(Ok(Outcome::Acquired))) => s.note(i, |r| r.success(unix_ns(), s.gap_ns)),
            Some(Ok(o)) => s.note(i, |r| r.other_error(format!("SEM.ACQUIRE: {o:?}"))),
            Some(Err(e)) => {
                if e.starts_with("NOTFOUND") {
                    lease = None; // the lease is gone: a new one
                }
                s.note(i, |r| r.other_error(format!("SEM.ACQUIRE: -{e}")));
                continue;
            }
        }
        let req = request(&[b"SEM.RELEASE", ns, sem, lid]);
        match cl.run(s, i, &req, |_| ()).await {
            None => break,
            Some(Ok(())) => s.note(i, |r| r.success(unix_ns(), s.gap_ns)),
            Some(Err(e)) => s.note(i, |r| r.other_error(format!("SEM.RELEASE: -{e}"))),
        }
    }
    // Best effort: the lease goes with the client (it would expire anyway).
    if let Some((id, _)) = lease {
        let req = request(&[b"LEASE.REVOKE", ns, id.as_bytes()]);
        if let Some(conn) = cl.conn.as_mut() {
            if conn.send(&req).await.is_ok() {
                let _ = conn.next(CONNECT_TIMEOUT, |_| ()).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_longer_than_the_gap_is_an_outage() {
        let mut r = Record::default();
        for t in [100, 150, 190, 1_000, 1_040] {
            r.success(t, 100);
        }
        assert_eq!(r.outages, vec![(190, 1_000)]);
        assert_eq!(r.successes, 5);
    }

    #[test]
    fn each_kill_takes_the_first_outage_ending_after_it() {
        // A reply buffered before the kill and read after it ends a short pause, not an
        // outage; the outage that ends at the new leader's first success is the kill's.
        let outages = [(10, 40), (105, 900), (2_000, 2_600)];
        let mut cursor = 0;
        assert_eq!(next_outage_after(&outages, &mut cursor, 100), Some(1));
        assert_eq!(next_outage_after(&outages, &mut cursor, 1_990), Some(2));
        assert_eq!(next_outage_after(&outages, &mut cursor, 3_000), None);
        assert_eq!(cursor, 3);
    }

    #[test]
    fn reads_kill_lines() {
        assert_eq!(
            parse_kill("kill 1700000000123456789 node 2"),
            Some((1_700_000_000_123_456_789, "node 2".into()))
        );
        assert_eq!(parse_kill("kill x"), None);
        assert_eq!(parse_kill("mark 1"), None);
    }

    #[test]
    fn a_kill_reports_every_client() {
        let mut k = Kill::new(1_000_000, "n\"1".into(), 2);
        k.after[0] = Some(812_300_000);
        let j = k.json(3);
        assert!(j.contains("\"kill\":3"), "{j}");
        assert!(j.contains("\"label\":\"n\\\"1\""), "{j}");
        assert!(j.contains("\"recovered\":1"), "{j}");
        assert!(j.contains("\"after_ms\":[812.3,null]"), "{j}");
    }
}
