//! permitd-soak: many connections, thousands of parked acquires and every way they can end, all
//! at once, against one permitd on loopback; then checks that the server is back where it
//! started. `scripts/soak` starts the server and runs this.
//!
//! Load (for `--seconds`, after all connections are open):
//! * `--parkers` connections loop on `SEM.ACQUIRE` with random weights and random timeouts on a
//!   handful of small semaphores, so nearly all of them are parked at any moment. Granted holds
//!   are released, revoked with their lease, or left to die with a short lease. Some parkers
//!   drop their connection while parked.
//! * The other connections are workers: timeout-0 acquires and releases, lease refreshes and
//!   reads, SEM.GET + SEM.HOLDERS in one MULTI (checked for consistency), LEASE.LIST, random
//!   reconnects; most of the time they sit idle.
//! * Four chaos connections: `CLIENT KILL ID` and `CLIENT UNBLOCK id TIMEOUT|ERROR` on parked
//!   clients, `LEASE.REVOKE` of random leases, `SEM.UPDATE` permit changes up and down.
//!
//! Every reply is checked against the SPEC as it arrives (outcomes possible for the request,
//! `active_holds <= permits`, a weight never above the permits it was granted from, fencing
//! tokens above every token seen before the request was sent, only the error codes each
//! command can give, no lease or holder visible past its `expires_at`, time-outs not early).
//!
//! At the end: INFO shows no waiter and no blocked client and exactly the open connections,
//! every semaphore's `active_holds` is the sum of its holders (read atomically in MULTI), no
//! listed lease is dead, revoking every lease frees every permit, and once the load's
//! connections are closed the server's RSS is within `--rss-tolerance` of its level before the
//! load. One summary line goes to stdout; the exit code is 1 on any violation.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use clap::Parser;
use permitd::protocol::request::encode_request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio::task::LocalSet;
use tokio::time::sleep;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "permitd-soak",
    about = "Soak test: 10,000 connections, parked acquires, kills, expiries, then invariants"
)]
struct Cli {
    /// Server host (loopback only).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Server port.
    #[arg(long, short = 'p')]
    port: u16,
    /// The server's process id, to read its memory use from /proc.
    #[arg(long)]
    server_pid: u32,
    /// Seconds of load.
    #[arg(long, default_value_t = 300)]
    seconds: u64,
    /// Load connections in all (parkers + workers + 4 chaos connections).
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// Connections that loop on blocking SEM.ACQUIRE.
    #[arg(long, default_value_t = 5_000)]
    parkers: usize,
    /// Longest acquire timeout a parker asks for, seconds.
    #[arg(long, default_value_t = 20.0)]
    max_timeout: f64,
    /// Allowed growth of the RSS after the load over before it, as a fraction.
    #[arg(long, default_value_t = 0.10)]
    rss_tolerance: f64,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const NS: &str = "soak";
/// The semaphores and their permits at the start (SEM.UPDATE moves them between half and
/// double).
const SEMS: [(&str, i64); 5] = [("s0", 4), ("s1", 8), ("s2", 16), ("s3", 32), ("s4", 64)];
/// Heaviest acquire.
const MAX_WEIGHT: i64 = 3;
/// A reply that takes longer than this past the request's own timeout is a violation.
const REPLY_GRACE: Duration = Duration::from_secs(30);
/// Connects in flight at once.
const CONNECT_CONCURRENCY: usize = 256;
/// Upper bound on commands sent, whatever the duration.
const MAX_OPS: u64 = 50_000_000;
/// Violations printed in full (all are counted).
const MAX_REPORTED: usize = 50;

// ---------------------------------------------------------------------------------------------
// RESP2
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Arr(Option<Vec<V>>),
}

impl V {
    fn text(&self) -> Option<String> {
        match self {
            V::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            V::Simple(s) => Some(s.clone()),
            _ => None,
        }
    }

    /// A field of an entity (RESP2 flat field/value array).
    fn get(&self, name: &str) -> Option<&V> {
        let V::Arr(Some(items)) = self else {
            return None;
        };
        items
            .chunks(2)
            .find(|p| p.len() == 2 && matches!(&p[0], V::Bulk(Some(b)) if b == name.as_bytes()))
            .map(|p| &p[1])
    }

    fn int(&self, name: &str) -> Option<i64> {
        match self.get(name) {
            Some(V::Int(i)) => Some(*i),
            _ => None,
        }
    }

    fn list(&self, name: &str) -> Option<&[V]> {
        match self.get(name) {
            Some(V::Arr(Some(items))) => Some(items),
            _ => None,
        }
    }
}

fn parse_line(buf: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let rel = buf.get(from..)?.windows(2).position(|w| w == b"\r\n")?;
    Some((&buf[from..from + rel], from + rel + 2))
}

fn parse_at(buf: &[u8], pos: usize) -> Result<Option<(V, usize)>, String> {
    let Some(&kind) = buf.get(pos) else {
        return Ok(None);
    };
    let Some((line, next)) = parse_line(buf, pos + 1) else {
        return Ok(None);
    };
    let text = || String::from_utf8_lossy(line).into_owned();
    let num = || -> Result<i64, String> {
        std::str::from_utf8(line)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad number {:?}", text()))
    };
    Ok(Some(match kind {
        b'+' => (V::Simple(text()), next),
        b'-' => (V::Err(text()), next),
        b':' => (V::Int(num()?), next),
        b'$' => {
            let n = num()?;
            if n < 0 {
                (V::Bulk(None), next)
            } else {
                let end = next + n as usize;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                (V::Bulk(Some(buf[next..end].to_vec())), end + 2)
            }
        }
        b'*' => {
            let n = num()?;
            if n < 0 {
                (V::Arr(None), next)
            } else {
                let mut items = Vec::with_capacity(n.min(1024) as usize);
                let mut p = next;
                for _ in 0..n {
                    let Some((v, q)) = parse_at(buf, p)? else {
                        return Ok(None);
                    };
                    items.push(v);
                    p = q;
                }
                (V::Arr(Some(items)), p)
            }
        }
        other => return Err(format!("unexpected reply type byte {other:#x}")),
    }))
}

fn encode(args: &[&str]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let mut out = Vec::new();
    encode_request(&mut out, &args);
    out
}

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    id: u64,
}

impl Conn {
    async fn open(addr: &str) -> io::Result<Conn> {
        let stream = tokio::time::timeout(Duration::from_secs(30), TcpStream::connect(addr))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        stream.set_nodelay(true)?;
        let mut c = Conn {
            stream,
            buf: BytesMut::with_capacity(1024),
            id: 0,
        };
        match c.cmd(&["CLIENT", "ID"], Duration::ZERO).await? {
            V::Int(id) if id > 0 => c.id = id as u64,
            other => return Err(io::Error::other(format!("CLIENT ID answered {other:?}"))),
        }
        Ok(c)
    }

    async fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.stream.write_all(&encode(args)).await
    }

    /// The next reply; `wait` is how long the request itself may take (a blocking timeout).
    async fn read(&mut self, wait: Duration) -> io::Result<V> {
        let read = async {
            loop {
                if let Some((v, n)) = parse_at(&self.buf, 0).map_err(io::Error::other)? {
                    self.buf.advance(n);
                    return Ok(v);
                }
                if self.stream.read_buf(&mut self.buf).await? == 0 {
                    return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "closed"));
                }
            }
        };
        match tokio::time::timeout(wait + REPLY_GRACE, read).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "no reply")),
        }
    }

    async fn cmd(&mut self, args: &[&str], wait: Duration) -> io::Result<V> {
        self.send(args).await?;
        self.read(wait).await
    }
}

// ---------------------------------------------------------------------------------------------
// Shared state of the run (one thread: Rc + RefCell)
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Stats {
    ops: u64,
    acquired: u64,
    unavailable: u64,
    timed_out: u64,
    errors: BTreeMap<String, u64>,
    connects: u64,
    connect_failures: u64,
    disconnects: u64,
    kills_sent: u64,
    kills_hit: u64,
    killed_seen: u64,
    unblocks_sent: u64,
    unblocks_hit: u64,
    revokes: u64,
    updates_ok: u64,
    updates_rejected: u64,
    consistency_checks: u64,
    max_timeout_late_ms: u64,
    violations: u64,
    reported: Vec<String>,
}

struct Shared {
    addr: String,
    cli: Cli,
    stats: RefCell<Stats>,
    /// Current client id of each parker (0 while it has no connection).
    parker_ids: RefCell<Vec<u64>>,
    /// Client ids that were sent CLIENT KILL / CLIENT UNBLOCK (their odd endings are expected).
    killed: RefCell<HashSet<u64>>,
    unblocked: RefCell<HashSet<u64>>,
    /// Recent lease ids, for refresh / get / revoke by others.
    leases: RefCell<Vec<String>>,
    lease_pos: Cell<usize>,
    /// Per semaphore, the highest fencing token seen in a reply so far.
    max_token: RefCell<HashMap<String, i64>>,
    /// Per semaphore, the permits set last (by setup or SEM.UPDATE), for the weights asked.
    permits: RefCell<HashMap<String, i64>>,
    connect_gate: Semaphore,
    stop: Cell<bool>,
    /// Load tasks that have finished and hold an open, idle connection.
    resting: Cell<usize>,
    /// Load tasks that have a connection (for the start barrier).
    connected: Cell<usize>,
    start: watch::Sender<bool>,
    close: watch::Sender<bool>,
}

impl Shared {
    fn violation(&self, msg: String) {
        let mut s = self.stats.borrow_mut();
        s.violations += 1;
        if s.reported.len() < MAX_REPORTED {
            eprintln!("VIOLATION: {msg}");
            s.reported.push(msg);
        }
    }

    fn op(&self) {
        let mut s = self.stats.borrow_mut();
        s.ops += 1;
        if s.ops >= MAX_OPS {
            self.stop.set(true);
        }
    }

    fn error(&self, code: &str) {
        *self
            .stats
            .borrow_mut()
            .errors
            .entry(code.to_string())
            .or_default() += 1;
    }

    fn add_lease(&self, id: String) {
        let mut l = self.leases.borrow_mut();
        if l.len() < 4096 {
            l.push(id);
        } else {
            let p = self.lease_pos.get();
            l[p] = id;
            self.lease_pos.set((p + 1) % 4096);
        }
    }

    fn random_lease(&self, rng: &mut Rng) -> Option<String> {
        let l = self.leases.borrow();
        (!l.is_empty()).then(|| l[rng.below(l.len())].clone())
    }

    fn token_floor(&self, sem: &str) -> i64 {
        self.max_token.borrow().get(sem).copied().unwrap_or(0)
    }

    async fn connect(&self) -> Option<Conn> {
        let _permit = self.connect_gate.acquire().await.ok()?;
        match Conn::open(&self.addr).await {
            Ok(c) => {
                self.stats.borrow_mut().connects += 1;
                Some(c)
            }
            Err(e) => {
                let mut s = self.stats.borrow_mut();
                s.connect_failures += 1;
                if s.connect_failures <= 5 {
                    eprintln!("connect failed: {e}");
                }
                None
            }
        }
    }
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

fn code_of(e: &str) -> &str {
    e.split(' ').next().unwrap_or("")
}

/// Descriptors the server has open, and its limit (soft RLIMIT_NOFILE).
fn server_fds(pid: u32) -> (u64, u64) {
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    (open, limit)
}

fn rss_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Reply checks
// ---------------------------------------------------------------------------------------------

/// A semaphore entity: `active_holds` within `permits`. Returns (permits, active_holds).
fn check_semaphore(sh: &Shared, what: &str, v: &V) -> Option<(i64, i64)> {
    let (Some(permits), Some(held), Some(count)) = (
        v.int("permits"),
        v.int("active_holds"),
        v.int("active_holders_count"),
    ) else {
        sh.violation(format!("{what}: not a semaphore: {v:?}"));
        return None;
    };
    if permits <= 0 || held < 0 || held > permits || count < 0 || count > held {
        sh.violation(format!(
            "{what}: permits {permits}, active_holds {held}, holders {count}"
        ));
    }
    Some((permits, held))
}

/// A lease entity: well-formed id, alive when the request was sent.
fn check_lease(sh: &Shared, what: &str, v: &V, sent_ns: i64) -> Option<String> {
    let id = v.get("lease_id").and_then(V::text);
    let expires = v.int("expires_at");
    match (id, expires) {
        (Some(id), Some(exp)) => {
            let shaped = id.len() == 31
                && id.starts_with("ls_")
                && id[3..].bytes().all(|b| b.is_ascii_alphanumeric());
            if !shaped {
                sh.violation(format!("{what}: lease id {id:?} is not ls_ + 28 base62"));
            }
            if exp <= sent_ns {
                sh.violation(format!(
                    "{what}: lease visible {} ms after it died",
                    (sent_ns - exp) / 1_000_000
                ));
            }
            Some(id)
        }
        _ => {
            sh.violation(format!("{what}: not a lease: {v:?}"));
            None
        }
    }
}

/// An error reply to `cmd`: its code must be one `cmd` can give in this run.
fn check_error(sh: &Shared, cmd: &str, e: &str, allowed: &[&str]) {
    let code = code_of(e);
    sh.error(code);
    let ok = allowed.iter().any(|a| {
        let (c, text) = a.split_once(' ').unwrap_or((a, ""));
        c == code && e.contains(text)
    });
    if !ok {
        sh.violation(format!("{cmd}: unexpected error {e:?}"));
    }
}

const LEASE_GONE: &str = "NOTFOUND lease not found or expired";

/// What an acquire's reply was.
enum Acq {
    Acquired,
    NotNow,
    LeaseGone,
    Other,
}

/// Checks one SEM.ACQUIRE reply. `floor`: the highest token seen before it was sent.
#[allow(clippy::too_many_arguments)]
fn check_acquire(
    sh: &Shared,
    v: &V,
    sem: &str,
    weight: i64,
    timeout: f64,
    floor: i64,
    waited: Duration,
    client: u64,
) -> Acq {
    if let V::Err(e) = v {
        let unblocked = sh.unblocked.borrow().contains(&client);
        let mut allowed = vec![LEASE_GONE, "INVALIDARG weight exceeds semaphore permits"];
        if unblocked {
            allowed.push("UNBLOCKED client unblocked via CLIENT UNBLOCK");
        }
        check_error(sh, "SEM.ACQUIRE", e, &allowed);
        return if e.starts_with(LEASE_GONE) {
            Acq::LeaseGone
        } else {
            Acq::Other
        };
    }
    let outcome = v.get("outcome").and_then(V::text).unwrap_or_default();
    let Some(s) = v.get("semaphore") else {
        sh.violation(format!("SEM.ACQUIRE: no semaphore in {v:?}"));
        return Acq::Other;
    };
    let Some((permits, _)) = check_semaphore(sh, "SEM.ACQUIRE", s) else {
        return Acq::Other;
    };
    let token = v.int("fencing_token");
    match outcome.as_str() {
        "ACQUIRE_OUTCOME_ACQUIRED" => {
            sh.stats.borrow_mut().acquired += 1;
            if weight > permits {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: ACQUIRED weight {weight} with only {permits} permits"
                ));
            }
            match token {
                Some(t) if t > floor => {
                    let mut m = sh.max_token.borrow_mut();
                    let e = m.entry(sem.to_string()).or_insert(0);
                    *e = (*e).max(t);
                }
                Some(t) => sh.violation(format!(
                    "SEM.ACQUIRE {sem}: fencing token {t} not above {floor}, seen before the request"
                )),
                None => sh.violation(format!("SEM.ACQUIRE {sem}: ACQUIRED without a token")),
            }
            Acq::Acquired
        }
        "ACQUIRE_OUTCOME_UNAVAILABLE" => {
            sh.stats.borrow_mut().unavailable += 1;
            if timeout > 0.0 {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: UNAVAILABLE with timeout {timeout}"
                ));
            }
            Acq::NotNow
        }
        "ACQUIRE_OUTCOME_TIMED_OUT" => {
            sh.stats.borrow_mut().timed_out += 1;
            let want = Duration::from_secs_f64(timeout);
            if timeout == 0.0 {
                sh.violation(format!("SEM.ACQUIRE {sem}: TIMED_OUT with timeout 0"));
            } else if waited + Duration::from_millis(5) < want
                && !sh.unblocked.borrow().contains(&client)
            {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: TIMED_OUT after {waited:?}, timeout {timeout} s"
                ));
            } else if waited > want {
                let late = (waited - want).as_millis() as u64;
                let mut st = sh.stats.borrow_mut();
                st.max_timeout_late_ms = st.max_timeout_late_ms.max(late);
            }
            if token.is_some() {
                sh.violation(format!("SEM.ACQUIRE {sem}: TIMED_OUT with a token"));
            }
            Acq::NotNow
        }
        other => {
            sh.violation(format!("SEM.ACQUIRE {sem}: outcome {other:?}"));
            Acq::Other
        }
    }
}

/// A lost connection: expected after CLIENT KILL, a violation otherwise.
fn lost(sh: &Shared, client: u64, what: &str, e: &io::Error) {
    if sh.killed.borrow().contains(&client) {
        sh.stats.borrow_mut().killed_seen += 1;
    } else {
        sh.violation(format!("{what}: connection {client} lost: {e}"));
    }
}

/// SEM.GET + SEM.HOLDERS in one transaction: one consistent picture.
async fn consistency_check(sh: &Shared, c: &mut Conn, sem: &str) -> io::Result<()> {
    let sent = now_ns();
    c.send(&["MULTI"]).await?;
    c.send(&["SEM.GET", NS, sem]).await?;
    c.send(&["SEM.HOLDERS", NS, sem, "LIMIT", "250"]).await?;
    c.send(&["EXEC"]).await?;
    for _ in 0..3 {
        let v = c.read(Duration::ZERO).await?;
        if !matches!(&v, V::Simple(s) if s == "OK" || s == "QUEUED") {
            sh.violation(format!("MULTI: {v:?}"));
        }
    }
    for _ in 0..4 {
        sh.op();
    }
    let v = c.read(Duration::ZERO).await?;
    let V::Arr(Some(results)) = &v else {
        sh.violation(format!("EXEC: {v:?}"));
        return Ok(());
    };
    if results.len() != 2 {
        sh.violation(format!("EXEC: {v:?}"));
        return Ok(());
    }
    sh.stats.borrow_mut().consistency_checks += 1;
    let Some((permits, held)) = check_semaphore(sh, "SEM.GET", &results[0]) else {
        return Ok(());
    };
    let Some(holders) = results[1].list("holders") else {
        sh.violation(format!("SEM.HOLDERS: {:?}", results[1]));
        return Ok(());
    };
    let mut sum = 0;
    let mut last_token = 0;
    for h in holders {
        let (Some(w), Some(exp), Some(t)) =
            (h.int("weight"), h.int("expires_at"), h.int("fencing_token"))
        else {
            sh.violation(format!("SEM.HOLDERS: holder {h:?}"));
            continue;
        };
        sum += w;
        if exp <= sent {
            sh.violation(format!(
                "SEM.HOLDERS {sem}: holder of a lease dead for {} ms",
                (sent - exp) / 1_000_000
            ));
        }
        if t <= last_token {
            sh.violation(format!("SEM.HOLDERS {sem}: not oldest first"));
        }
        last_token = t;
    }
    let count = results[0].int("active_holders_count").unwrap_or(-1);
    if sum != held || count != holders.len() as i64 || held > permits {
        sh.violation(format!(
            "{sem}: active_holds {held} (count {count}) but holders sum to {sum} ({} of them), permits {permits}",
            holders.len()
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Load tasks
// ---------------------------------------------------------------------------------------------

/// Waits for the start, keeps a connection, and at the end rests with it open until `close`.
async fn rest(sh: &Shared, conn: &mut Option<Conn>) {
    if conn.is_none() {
        for _ in 0..50 {
            if let Some(c) = sh.connect().await {
                *conn = Some(c);
                break;
            }
            sleep(Duration::from_millis(200)).await;
        }
        if conn.is_none() {
            sh.violation("could not reconnect at the end".into());
        }
    }
    sh.resting.set(sh.resting.get() + 1);
    let mut close = sh.close.subscribe();
    let _ = close.wait_for(|c| *c).await;
    drop(conn.take());
}

async fn first_connect(sh: &Shared) -> Option<Conn> {
    let mut conn = None;
    for _ in 0..20 {
        if let Some(c) = sh.connect().await {
            conn = Some(c);
            break;
        }
        sleep(Duration::from_millis(500)).await;
    }
    sh.connected.set(sh.connected.get() + 1);
    let mut start = sh.start.subscribe();
    let _ = start.wait_for(|s| *s).await;
    conn
}

fn pick_sem(sh: &Shared, rng: &mut Rng) -> (&'static str, i64) {
    let (name, _) = SEMS[rng.below(SEMS.len())];
    let permits = sh.permits.borrow().get(name).copied().unwrap_or(1);
    (name, permits)
}

async fn parker(sh: Rc<Shared>, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 1) << 20);
    let mut conn = first_connect(&sh).await;
    // The lease this parker acquires under, and whether its ttl is short (left to expire).
    let mut lease: Option<(String, bool)> = None;
    while !sh.stop.get() {
        let Some(c) = conn.as_mut() else {
            sh.parker_ids.borrow_mut()[i] = 0;
            conn = sh.connect().await;
            if conn.is_none() {
                sleep(Duration::from_millis(200)).await;
            }
            continue;
        };
        let id = c.id;
        sh.parker_ids.borrow_mut()[i] = id;
        if lease.is_none() {
            let short = rng.chance(0.3);
            let ttl = if short {
                rng.range(1, 3)
            } else {
                rng.range(20, 60)
            };
            let sent = now_ns();
            sh.op();
            let proc_id = format!("parker-{i}");
            match c
                .cmd(
                    &["LEASE.CREATE", NS, &proc_id, &ttl.to_string()],
                    Duration::ZERO,
                )
                .await
            {
                Ok(V::Err(e)) => check_error(&sh, "LEASE.CREATE", &e, &[]),
                Ok(v) => {
                    if let Some(l) = check_lease(&sh, "LEASE.CREATE", &v, sent) {
                        sh.add_lease(l.clone());
                        lease = Some((l, short));
                    }
                }
                Err(e) => {
                    lost(&sh, id, "LEASE.CREATE", &e);
                    conn = None;
                }
            }
            continue;
        }
        let (l, short) = lease.clone().expect("set above");
        let (sem, permits) = pick_sem(&sh, &mut rng);
        let weight = 1 + rng.below(MAX_WEIGHT.min(permits) as usize) as i64;
        let timeout = if rng.chance(0.03) {
            0.0
        } else {
            (rng.range(10, (sh.cli.max_timeout * 100.0) as u64) as f64) / 100.0
        };
        let timeout_text = format!("{timeout:.2}");
        let floor = sh.token_floor(sem);
        sh.op();
        let sent = Instant::now();
        if let Err(e) = c
            .send(&[
                "SEM.ACQUIRE",
                NS,
                sem,
                &l,
                &weight.to_string(),
                &timeout_text,
            ])
            .await
        {
            lost(&sh, id, "SEM.ACQUIRE", &e);
            conn = None;
            lease = None;
            continue;
        }
        // Now and then the client goes away while parked (maybe just as it is granted: the
        // hold is then unknown, so the lease is given up).
        let leave_after = rng.chance(0.03).then(|| rng.ms(0, 2000));
        let wait = Duration::from_secs_f64(timeout);
        let reply = match leave_after {
            None => Some(c.read(wait).await),
            Some(d) => tokio::select! {
                r = c.read(wait) => Some(r),
                _ = sleep(d) => None,
            },
        };
        let waited = sent.elapsed();
        let reply = match reply {
            None => {
                sh.stats.borrow_mut().disconnects += 1;
                conn = None;
                lease = None;
                continue;
            }
            Some(Err(e)) => {
                lost(&sh, id, "SEM.ACQUIRE", &e);
                conn = None;
                lease = None;
                continue;
            }
            Some(Ok(v)) => v,
        };
        match check_acquire(&sh, &reply, sem, weight, timeout, floor, waited, id) {
            Acq::LeaseGone => lease = None,
            Acq::NotNow | Acq::Other => {}
            Acq::Acquired => {
                sleep(rng.ms(0, 400)).await;
                let what = rng.below(100);
                let c = conn.as_mut().expect("connected");
                sh.op();
                if what < 15 && short {
                    // Leave the hold to die with the lease.
                    lease = None;
                } else if what < 30 {
                    sh.stats.borrow_mut().revokes += 1;
                    match c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await {
                        Ok(V::Simple(s)) if s == "OK" => {}
                        Ok(V::Err(e)) => check_error(&sh, "LEASE.REVOKE", &e, &[LEASE_GONE]),
                        Ok(v) => sh.violation(format!("LEASE.REVOKE: {v:?}")),
                        Err(e) => {
                            lost(&sh, id, "LEASE.REVOKE", &e);
                            conn = None;
                        }
                    }
                    lease = None;
                } else {
                    match c.cmd(&["SEM.RELEASE", NS, sem, &l], Duration::ZERO).await {
                        Ok(V::Err(e)) => {
                            check_error(&sh, "SEM.RELEASE", &e, &[LEASE_GONE]);
                            lease = None;
                        }
                        Ok(v) => {
                            check_semaphore(&sh, "SEM.RELEASE", &v);
                        }
                        Err(e) => {
                            lost(&sh, id, "SEM.RELEASE", &e);
                            conn = None;
                            lease = None;
                        }
                    }
                }
            }
        }
    }
    // Done: give back what is held (a revoke covers it), then rest.
    if let (Some(c), Some((l, _))) = (conn.as_mut(), lease.take()) {
        let _ = c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await;
    }
    sh.parker_ids.borrow_mut()[i] = 0;
    rest(&sh, &mut conn).await;
}

async fn worker(sh: Rc<Shared>, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 1) << 40);
    let mut conn = first_connect(&sh).await;
    let mut lease: Option<(String, Instant)> = None;
    let mut held: Option<&'static str> = None;
    // Spread the first operations out.
    sleep(rng.ms(0, 2000)).await;
    while !sh.stop.get() {
        sleep(rng.ms(200, 2000)).await;
        if sh.stop.get() {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = sh.connect().await;
            continue;
        };
        let id = c.id;
        let op = rng.below(100);
        let sent = now_ns();
        sh.op();
        let r: io::Result<()> = async {
            match op {
                0..=14 => match c.cmd(&["PING"], Duration::ZERO).await? {
                    V::Simple(s) if s == "PONG" => {}
                    v => sh.violation(format!("PING: {v:?}")),
                },
                15..=24 => {
                    let (sem, _) = pick_sem(&sh, &mut rng);
                    match c.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await? {
                        V::Err(e) => check_error(&sh, "SEM.GET", &e, &[]),
                        v => {
                            check_semaphore(&sh, "SEM.GET", &v);
                        }
                    }
                }
                25..=44 => {
                    // Own lease: create or refresh it when needed.
                    let stale = lease
                        .as_ref()
                        .is_none_or(|(_, at)| at.elapsed() > Duration::from_secs(20));
                    if stale && held.is_none() {
                        let v = match &lease {
                            Some((l, _)) => {
                                c.cmd(&["LEASE.REFRESH", NS, l, "60"], Duration::ZERO)
                                    .await?
                            }
                            None => {
                                let p = format!("worker-{i}");
                                c.cmd(&["LEASE.CREATE", NS, &p, "60"], Duration::ZERO)
                                    .await?
                            }
                        };
                        match v {
                            V::Err(e) => {
                                check_error(&sh, "LEASE.REFRESH", &e, &[LEASE_GONE]);
                                lease = None;
                            }
                            v => {
                                if let Some(l) = check_lease(&sh, "LEASE.CREATE", &v, sent) {
                                    if lease.is_none() {
                                        sh.add_lease(l.clone());
                                    }
                                    lease = Some((l, Instant::now()));
                                }
                            }
                        }
                    } else if let Some((l, _)) = &lease {
                        if let Some(sem) = held.take() {
                            match c.cmd(&["SEM.RELEASE", NS, sem, l], Duration::ZERO).await? {
                                V::Err(e) => {
                                    check_error(&sh, "SEM.RELEASE", &e, &[LEASE_GONE]);
                                    lease = None;
                                }
                                v => {
                                    check_semaphore(&sh, "SEM.RELEASE", &v);
                                }
                            }
                        } else {
                            let (sem, _) = pick_sem(&sh, &mut rng);
                            let floor = sh.token_floor(sem);
                            let t = Instant::now();
                            let v = c
                                .cmd(&["SEM.ACQUIRE", NS, sem, l, "1", "0"], Duration::ZERO)
                                .await?;
                            match check_acquire(&sh, &v, sem, 1, 0.0, floor, t.elapsed(), id) {
                                Acq::Acquired => held = Some(sem),
                                Acq::LeaseGone => lease = None,
                                _ => {}
                            }
                        }
                    }
                }
                45..=54 => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        let ttl = rng.range(1, 60).to_string();
                        match c
                            .cmd(&["LEASE.REFRESH", NS, &l, &ttl], Duration::ZERO)
                            .await?
                        {
                            V::Err(e) => check_error(&sh, "LEASE.REFRESH", &e, &[LEASE_GONE]),
                            v => {
                                check_lease(&sh, "LEASE.REFRESH", &v, sent);
                            }
                        }
                    }
                }
                55..=64 => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        match c.cmd(&["LEASE.GET", NS, &l], Duration::ZERO).await? {
                            V::Err(e) => check_error(&sh, "LEASE.GET", &e, &[LEASE_GONE]),
                            v => {
                                check_lease(&sh, "LEASE.GET", &v, sent);
                            }
                        }
                    }
                }
                65..=79 => {
                    let (sem, _) = pick_sem(&sh, &mut rng);
                    consistency_check(&sh, c, sem).await?;
                }
                80..=84 => {
                    match c
                        .cmd(&["LEASE.LIST", NS, "LIMIT", "100"], Duration::ZERO)
                        .await?
                    {
                        V::Err(e) => check_error(&sh, "LEASE.LIST", &e, &[]),
                        v => match v.list("leases") {
                            Some(ls) => {
                                for l in ls {
                                    check_lease(&sh, "LEASE.LIST", l, sent);
                                }
                            }
                            None => sh.violation(format!("LEASE.LIST: {v:?}")),
                        },
                    }
                }
                85 => {
                    // A random disconnect (what it held stays with its lease).
                    sh.stats.borrow_mut().disconnects += 1;
                    return Err(io::Error::other("disconnect"));
                }
                _ => {}
            }
            Ok(())
        }
        .await;
        if let Err(e) = r {
            if e.to_string() != "disconnect" {
                lost(&sh, id, "worker", &e);
            }
            conn = None;
            held = None;
            lease = None;
        }
    }
    if let (Some(c), Some((l, _))) = (conn.as_mut(), lease.take()) {
        let _ = c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await;
    }
    rest(&sh, &mut conn).await;
}

#[derive(Clone, Copy)]
enum Chaos {
    Kill,
    Unblock,
    Revoke,
    Update,
}

async fn chaos(sh: Rc<Shared>, kind: Chaos, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 7) << 50);
    let mut conn = first_connect(&sh).await;
    let every = match kind {
        Chaos::Kill => Duration::from_millis(100),
        Chaos::Unblock => Duration::from_millis(150),
        Chaos::Revoke => Duration::from_millis(40),
        Chaos::Update => Duration::from_millis(300),
    };
    while !sh.stop.get() {
        sleep(every).await;
        if sh.stop.get() {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = sh.connect().await;
            continue;
        };
        let id = c.id;
        sh.op();
        let r: io::Result<()> = async {
            match kind {
                Chaos::Kill | Chaos::Unblock => {
                    let target = {
                        let ids = sh.parker_ids.borrow();
                        ids[rng.below(ids.len())]
                    };
                    if target == 0 {
                        return Ok(());
                    }
                    let t = target.to_string();
                    let v = if let Chaos::Kill = kind {
                        sh.killed.borrow_mut().insert(target);
                        sh.stats.borrow_mut().kills_sent += 1;
                        c.cmd(&["CLIENT", "KILL", "ID", &t], Duration::ZERO).await?
                    } else {
                        sh.unblocked.borrow_mut().insert(target);
                        sh.stats.borrow_mut().unblocks_sent += 1;
                        let how = if rng.chance(0.5) { "TIMEOUT" } else { "ERROR" };
                        c.cmd(&["CLIENT", "UNBLOCK", &t, how], Duration::ZERO)
                            .await?
                    };
                    match (v, kind) {
                        (V::Int(0), _) => {}
                        (V::Int(1), Chaos::Kill) => sh.stats.borrow_mut().kills_hit += 1,
                        (V::Int(1), _) => sh.stats.borrow_mut().unblocks_hit += 1,
                        (v, _) => sh.violation(format!("CLIENT KILL/UNBLOCK: {v:?}")),
                    }
                }
                Chaos::Revoke => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        sh.stats.borrow_mut().revokes += 1;
                        match c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await? {
                            V::Simple(s) if s == "OK" => {}
                            V::Err(e) => check_error(&sh, "LEASE.REVOKE", &e, &[LEASE_GONE]),
                            v => sh.violation(format!("LEASE.REVOKE: {v:?}")),
                        }
                    }
                }
                Chaos::Update => {
                    let (sem, base) = SEMS[rng.below(SEMS.len())];
                    let v = c.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await?;
                    let Some(version) = v.int("version") else {
                        sh.violation(format!("SEM.GET: {v:?}"));
                        return Ok(());
                    };
                    let permits = rng.range((base / 2).max(1) as u64, base as u64 * 2) as i64;
                    let v = c
                        .cmd(
                            &[
                                "SEM.UPDATE",
                                NS,
                                sem,
                                &permits.to_string(),
                                "VERSION",
                                &version.to_string(),
                            ],
                            Duration::ZERO,
                        )
                        .await?;
                    match v {
                        V::Err(e) => {
                            sh.stats.borrow_mut().updates_rejected += 1;
                            check_error(
                                &sh,
                                "SEM.UPDATE",
                                &e,
                                &["INVALIDARG version mismatch", "INVALIDARG permits"],
                            );
                        }
                        v => {
                            sh.stats.borrow_mut().updates_ok += 1;
                            if let Some((p, _)) = check_semaphore(&sh, "SEM.UPDATE", &v) {
                                if p != permits {
                                    sh.violation(format!("SEM.UPDATE {sem}: permits {p}"));
                                }
                                sh.permits.borrow_mut().insert(sem.to_string(), p);
                            }
                        }
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = r {
            lost(&sh, id, "chaos", &e);
            conn = None;
        }
    }
    rest(&sh, &mut conn).await;
}

// ---------------------------------------------------------------------------------------------
// Control connection: setup, monitor, final checks
// ---------------------------------------------------------------------------------------------

fn info_map(v: &V) -> HashMap<String, String> {
    v.text()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

async fn info(c: &mut Conn) -> io::Result<HashMap<String, String>> {
    Ok(info_map(&c.cmd(&["INFO"], Duration::ZERO).await?))
}

fn num(m: &HashMap<String, String>, k: &str) -> i64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(-1)
}

#[derive(Default)]
struct Peaks {
    connected: i64,
    blocked: i64,
    waiters: i64,
    rss_kb: u64,
    fds: u64,
}

async fn monitor(sh: Rc<Shared>, peaks: Rc<RefCell<Peaks>>) {
    let Ok(mut c) = Conn::open(&sh.addr).await else {
        sh.violation("monitor could not connect".into());
        return;
    };
    let mut close = sh.close.subscribe();
    loop {
        tokio::select! {
            _ = close.wait_for(|c| *c) => return,
            _ = sleep(Duration::from_secs(1)) => {}
        }
        match info(&mut c).await {
            Ok(m) => {
                let mut p = peaks.borrow_mut();
                p.connected = p.connected.max(num(&m, "connected_clients"));
                p.blocked = p.blocked.max(num(&m, "blocked_clients"));
                p.waiters = p.waiters.max(num(&m, "waiters"));
                p.rss_kb = p.rss_kb.max(rss_kb(sh.cli.server_pid, "VmRSS:"));
                p.fds = p.fds.max(server_fds(sh.cli.server_pid).0);
            }
            Err(e) => {
                sh.violation(format!("monitor INFO: {e}"));
                return;
            }
        }
    }
}

/// Polls INFO until `ok` holds or `secs` pass; returns the last INFO.
async fn wait_info(
    c: &mut Conn,
    secs: u64,
    ok: impl Fn(&HashMap<String, String>) -> bool,
) -> io::Result<HashMap<String, String>> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let m = info(c).await?;
        if ok(&m) || Instant::now() > deadline {
            return Ok(m);
        }
        sleep(Duration::from_millis(100)).await;
    }
}

async fn setup(c: &mut Conn) -> io::Result<()> {
    c.cmd(&["NS.DELETE", NS], Duration::ZERO).await?;
    let v = c.cmd(&["NS.CREATE", NS], Duration::ZERO).await?;
    if let V::Err(e) = v {
        return Err(io::Error::other(format!("NS.CREATE: {e}")));
    }
    for (sem, permits) in SEMS {
        let v = c
            .cmd(
                &["SEM.CREATE", NS, sem, &permits.to_string()],
                Duration::ZERO,
            )
            .await?;
        if let V::Err(e) = v {
            return Err(io::Error::other(format!("SEM.CREATE: {e}")));
        }
    }
    Ok(())
}

/// Every lease of the namespace, page by page.
async fn all_leases(sh: &Shared, c: &mut Conn) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    for _ in 0..100_000 {
        let sent = now_ns();
        let mut args = vec!["LEASE.LIST", NS, "LIMIT", "250"];
        if !cursor.is_empty() {
            args.extend(["CURSOR", cursor.as_str()]);
        }
        let v = c.cmd(&args, Duration::ZERO).await?;
        let Some(ls) = v.list("leases") else {
            sh.violation(format!("LEASE.LIST: {v:?}"));
            break;
        };
        for l in ls {
            if let Some(id) = check_lease(sh, "final LEASE.LIST", l, sent) {
                out.push(id);
            }
        }
        cursor = v.get("next_cursor").and_then(V::text).unwrap_or_default();
        if cursor.is_empty() {
            break;
        }
    }
    Ok(out)
}

async fn run(sh: Rc<Shared>) -> io::Result<()> {
    let cli = sh.cli.clone();
    let pid = cli.server_pid;
    let mut admin = Conn::open(&sh.addr).await?;
    setup(&mut admin).await?;
    sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kb(pid, "VmRSS:");
    let started = Instant::now();

    let peaks = Rc::new(RefCell::new(Peaks::default()));
    tokio::task::spawn_local(monitor(sh.clone(), peaks.clone()));
    let chaos_kinds = [Chaos::Kill, Chaos::Unblock, Chaos::Revoke, Chaos::Update];
    let parkers = cli.parkers.min(cli.connections - chaos_kinds.len());
    let workers = cli.connections - parkers - chaos_kinds.len();
    let mut handles = Vec::new();
    for i in 0..parkers {
        handles.push(tokio::task::spawn_local(parker(sh.clone(), i)));
    }
    for i in 0..workers {
        handles.push(tokio::task::spawn_local(worker(sh.clone(), i)));
    }
    for (i, k) in chaos_kinds.into_iter().enumerate() {
        handles.push(tokio::task::spawn_local(chaos(sh.clone(), k, i)));
    }
    let total = handles.len();
    // All connections open first, then the load starts at once.
    let open_deadline = Instant::now() + Duration::from_secs(120);
    while sh.connected.get() < total && Instant::now() < open_deadline {
        sleep(Duration::from_millis(100)).await;
    }
    let m = wait_info(&mut admin, 10, |m| {
        num(m, "connected_clients") >= total as i64 + 2
    })
    .await?;
    let opened = num(&m, "connected_clients") - 2;
    eprintln!(
        "soak: {opened} load connections open after {:.1} s; load for {} s",
        started.elapsed().as_secs_f64(),
        cli.seconds
    );
    if opened != total as i64 {
        let (fds, limit) = server_fds(pid);
        sh.violation(format!(
            "{opened} connections open of {total} ({} connect failures; the server has {fds} \
             descriptors open, its limit is {limit})",
            sh.stats.borrow().connect_failures
        ));
    }
    let _ = sh.start.send(true);
    let load_start = Instant::now();
    let mut next_report = 30;
    while load_start.elapsed() < Duration::from_secs(cli.seconds) && !sh.stop.get() {
        sleep(Duration::from_secs(1)).await;
        let e = load_start.elapsed().as_secs();
        if e >= next_report {
            next_report += 30;
            let p = peaks.borrow();
            let s = sh.stats.borrow();
            eprintln!(
                "soak: {e} s ops={} acquired={} timed_out={} peak_blocked={} rss={} kB violations={}",
                s.ops,
                s.acquired,
                s.timed_out,
                p.blocked,
                rss_kb(pid, "VmRSS:"),
                s.violations
            );
        }
    }
    sh.stop.set(true);
    // Tasks finish what they are doing (a parked acquire ends within its timeout).
    let drain_limit =
        Duration::from_secs_f64(cli.max_timeout) + REPLY_GRACE + Duration::from_secs(15);
    let drain_start = Instant::now();
    while sh.resting.get() < total && drain_start.elapsed() < drain_limit {
        sleep(Duration::from_millis(100)).await;
    }
    if sh.resting.get() < total {
        sh.violation(format!(
            "{} of {total} load tasks did not finish",
            total - sh.resting.get()
        ));
    }

    // 1. INFO: nothing parked, every connection accounted for (load + admin + monitor).
    let expected = total as i64 + 2;
    let m = wait_info(&mut admin, 10, |m| {
        num(m, "blocked_clients") == 0
            && num(m, "waiters") == 0
            && num(m, "connected_clients") == expected
    })
    .await?;
    for (k, want) in [
        ("blocked_clients", 0),
        ("waiters", 0),
        ("connected_clients", expected),
    ] {
        if num(&m, k) != want {
            sh.violation(format!(
                "after the load INFO {k}:{} (want {want})",
                num(&m, k)
            ));
        }
    }
    let leases_expired = num(&m, "leases_expired");
    // 2. Every semaphore: active_holds is the sum of its holders, none of a dead lease.
    for (sem, _) in SEMS {
        consistency_check(&sh, &mut admin, sem).await?;
    }
    // 3. No lease is visible past its death; revoking all of them frees every permit.
    let leases = all_leases(&sh, &mut admin).await?;
    for chunk in leases.chunks(256) {
        for l in chunk {
            admin.send(&["LEASE.REVOKE", NS, l]).await?;
        }
        for _ in chunk {
            match admin.read(Duration::ZERO).await? {
                V::Simple(_) => {}
                V::Err(e) => check_error(&sh, "final LEASE.REVOKE", &e, &[LEASE_GONE]),
                v => sh.violation(format!("LEASE.REVOKE: {v:?}")),
            }
        }
    }
    for (sem, _) in SEMS {
        let v = admin.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await?;
        let held = v.int("active_holds");
        let count = v.int("active_holders_count");
        if held != Some(0) || count != Some(0) {
            sh.violation(format!(
                "{sem}: after revoking every lease active_holds {held:?}, holders {count:?}"
            ));
        }
    }
    let m = info(&mut admin).await?;
    for k in ["leases", "holders", "waiters"] {
        if num(&m, k) != 0 {
            sh.violation(format!(
                "after revoking every lease INFO {k}:{}",
                num(&m, k)
            ));
        }
    }

    // 4. Close the load's connections; memory must come back.
    let _ = sh.close.send(true);
    for h in handles {
        let _ = h.await;
    }
    let m = wait_info(&mut admin, 30, |m| num(m, "connected_clients") == 1).await?;
    if num(&m, "connected_clients") != 1 {
        sh.violation(format!(
            "after closing the load INFO connected_clients:{} (want 1)",
            num(&m, "connected_clients")
        ));
    }
    // Give the allocator a moment, then take the lowest of a few readings.
    let mut rss_after = u64::MAX;
    for _ in 0..10 {
        sleep(Duration::from_secs(1)).await;
        rss_after = rss_after.min(rss_kb(pid, "VmRSS:"));
    }
    let rss_peak = rss_kb(pid, "VmHWM:").max(peaks.borrow().rss_kb);
    let limit = (rss_before as f64 * (1.0 + cli.rss_tolerance)) as u64;
    if rss_after > limit {
        sh.violation(format!(
            "RSS after the load {rss_after} kB > {rss_before} kB before + {:.0}%",
            cli.rss_tolerance * 100.0
        ));
    }

    let s = sh.stats.borrow();
    let p = peaks.borrow();
    let errors: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!(
        "soak: seconds={} connections={total} parkers={parkers} peak_connected={} peak_parked={} peak_waiters={} \
         ops={} acquired={} timed_out={} unavailable={} errors={{{}}} kills={}/{} killed_seen={} \
         unblocks={}/{} disconnects={} revokes={} updates={}/{} leases_expired={} consistency_checks={} \
         reconnects={} connect_failures={} max_timeout_late_ms={} server_fds(peak={} limit={}) \
         rss_kb(before={rss_before} peak={rss_peak} after={rss_after}) \
         violations={}",
        cli.seconds,
        p.connected,
        p.blocked,
        p.waiters,
        s.ops,
        s.acquired,
        s.timed_out,
        s.unavailable,
        errors.join(","),
        s.kills_hit,
        s.kills_sent,
        s.killed_seen,
        s.unblocks_hit,
        s.unblocks_sent,
        s.disconnects,
        s.revokes,
        s.updates_ok,
        s.updates_ok + s.updates_rejected,
        leases_expired,
        s.consistency_checks,
        s.connects.saturating_sub(total as u64),
        s.connect_failures,
        s.max_timeout_late_ms,
        p.fds,
        server_fds(pid).1,
        s.violations,
    );
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if cli.connections < 8 || cli.parkers == 0 {
        eprintln!("permitd-soak: need at least 8 connections and 1 parker");
        std::process::exit(2);
    }
    let (start, _) = watch::channel(false);
    let (close, _) = watch::channel(false);
    let sh = Rc::new(Shared {
        addr: format!("{}:{}", cli.host, cli.port),
        parker_ids: RefCell::new(vec![0; cli.parkers]),
        permits: RefCell::new(SEMS.iter().map(|(s, p)| (s.to_string(), *p)).collect()),
        cli,
        stats: RefCell::new(Stats::default()),
        killed: RefCell::new(HashSet::new()),
        unblocked: RefCell::new(HashSet::new()),
        leases: RefCell::new(Vec::new()),
        lease_pos: Cell::new(0),
        max_token: RefCell::new(HashMap::new()),
        connect_gate: Semaphore::new(CONNECT_CONCURRENCY),
        stop: Cell::new(false),
        resting: Cell::new(0),
        connected: Cell::new(0),
        start,
        close,
    });
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("permitd-soak: runtime: {e}");
            std::process::exit(2);
        }
    };
    let local = LocalSet::new();
    let result = local.block_on(&rt, run(sh.clone()));
    if let Err(e) = result {
        eprintln!("permitd-soak: {e}");
        std::process::exit(1);
    }
    let s = sh.stats.borrow();
    if s.violations > 0 {
        eprintln!("permitd-soak: {} violations; the first ones:", s.violations);
        for v in &s.reported {
            eprintln!("  {v}");
        }
        std::process::exit(1);
    }
}
