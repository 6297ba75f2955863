//! Crash test (SPEC §8 Durability): acknowledged changes survive `kill -9`.
//!
//! Several client threads run a mixed load (namespaces and semaphores created, leases created,
//! refreshed and revoked, `SEM.ACQUIRE ... 0`, `SEM.RELEASE`, and in each thread's private
//! namespace `SEM.UPDATE`, `SEM.DELETE`, `NS.DELETE` and re-creation under the same names) and
//! record in a model every change the server ACKNOWLEDGED, with its effect. At a random moment (seeded, printed) the server is
//! SIGKILLed; it is restarted on the same data directory (with another `--shards` count and
//! snapshot threshold on some cycles) after every short lease it handed out has expired, and
//! the whole state is read back and compared with the model:
//!
//! - every acknowledged create exists; every acknowledged acquire whose lease is alive and that
//!   was not later acknowledged-released or revoked is in `SEM.HOLDERS` with the same weight and
//!   fencing token; acknowledged releases and revokes stay undone; refreshed `expires_at`s hold;
//! - nothing appears that no acknowledged command made (phantoms);
//! - SPEC invariants for every semaphore: `active_holds` == sum of holder weights <= `permits`,
//!   `active_holders_count` == number of holders, every holder's lease alive with the same
//!   `expires_at`; leases that expired while the server was down are dead; INFO's counts agree;
//! - fencing tokens handed out after the restart exceed every token seen before it (and during
//!   the load, every new hold's token exceeds every token acknowledged on that semaphore name
//!   before it was sent, across deletes and re-creation).
//!
//! Every other restart is preceded by a start that is SIGKILLed while it loads and rewrites its
//! files. Further tests below: a kill right after an acknowledged reply (deterministic), and
//! reads (NS.LIST) never showing a change that a crash can take back.
//!
//! The one command per client that was in flight at the kill (sent, no reply) may or may not
//! have happened: both outcomes are accepted, and the model adopts what the server shows.
//!
//! Knobs (environment): `CRASH_CYCLES` (3), `CRASH_SEED` (from the clock; printed),
//! `CRASH_WORKERS` (4), `CRASH_FSYNC` (`always`; `everysec`/`no` must also survive a process
//! kill, per the README). `scripts/crash-loop` runs this test with more cycles on a release
//! build. The last line printed is `cycles=N acknowledged_ops_checked=X lost=L`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

const SEC: i64 = 1_000_000_000;
/// TTL of the leases that must survive every restart (the server's maximum).
const LONG_TTL: i64 = 300;
/// TTL of the leases that must be dead after a restart (they expire while the server is down).
const SHORT_TTL: i64 = 1;
const ACQUIRED: &str = "ACQUIRE_OUTCOME_ACQUIRED";
const UNAVAILABLE: &str = "ACQUIRE_OUTCOME_UNAVAILABLE";
/// Caps that keep the state (and each verification) small however many cycles run.
const MAX_NAMESPACES: usize = 8;
const MAX_SEMAPHORES: usize = 40;
const MAX_LONG_LEASES_PER_WORKER: usize = 12;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64: small, seedable, good enough to pick operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// A number in `lo..=hi`.
    fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }

    fn pick<T: Clone>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())].clone()
    }
}

// ---------------------------------------------------------------------------------------------
// The model of what the server acknowledged.
// ---------------------------------------------------------------------------------------------

type SemKey = (String, String);
type HoldKey = (String, String, String);

#[derive(Clone, Debug)]
struct Lease {
    ns: String,
    pid: String,
    expires_at: i64,
    short: bool,
    owner: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hold {
    weight: i64,
    token: i64,
}

/// A change command, as sent (with what the model knew when it was sent).
#[derive(Clone, Debug)]
enum Op {
    NsCreate {
        ns: String,
    },
    SemCreate {
        ns: String,
        sem: String,
        permits: i64,
    },
    LeaseCreate {
        ns: String,
        pid: String,
        ttl: i64,
    },
    Refresh {
        ns: String,
        lease: String,
        ttl: i64,
    },
    Revoke {
        ns: String,
        lease: String,
    },
    Acquire {
        ns: String,
        sem: String,
        lease: String,
        weight: i64,
        /// The hold the lease had there (a re-acquire), if any.
        old: Option<Hold>,
        /// The highest token acknowledged on the semaphore before this was sent.
        floor: i64,
    },
    Release {
        ns: String,
        sem: String,
        lease: String,
    },
    SemUpdate {
        ns: String,
        sem: String,
        permits: i64,
        version: i64,
    },
    SemDelete {
        ns: String,
        sem: String,
    },
    NsDelete {
        ns: String,
    },
}

impl Op {
    fn words(&self) -> Vec<String> {
        let s = |x: &str| x.to_string();
        match self {
            Op::NsCreate { ns } => vec![s("NS.CREATE"), ns.clone()],
            Op::SemCreate { ns, sem, permits } => {
                vec![
                    s("SEM.CREATE"),
                    ns.clone(),
                    sem.clone(),
                    permits.to_string(),
                ]
            }
            Op::LeaseCreate { ns, pid, ttl } => {
                vec![s("LEASE.CREATE"), ns.clone(), pid.clone(), ttl.to_string()]
            }
            Op::Refresh { ns, lease, ttl } => {
                vec![
                    s("LEASE.REFRESH"),
                    ns.clone(),
                    lease.clone(),
                    ttl.to_string(),
                ]
            }
            Op::Revoke { ns, lease } => vec![s("LEASE.REVOKE"), ns.clone(), lease.clone()],
            Op::Acquire {
                ns,
                sem,
                lease,
                weight,
                ..
            } => vec![
                s("SEM.ACQUIRE"),
                ns.clone(),
                sem.clone(),
                lease.clone(),
                weight.to_string(),
                s("0"),
            ],
            Op::Release { ns, sem, lease } => {
                vec![s("SEM.RELEASE"), ns.clone(), sem.clone(), lease.clone()]
            }
            Op::SemUpdate {
                ns,
                sem,
                permits,
                version,
            } => vec![
                s("SEM.UPDATE"),
                ns.clone(),
                sem.clone(),
                permits.to_string(),
                s("VERSION"),
                version.to_string(),
            ],
            Op::SemDelete { ns, sem } => vec![s("SEM.DELETE"), ns.clone(), sem.clone()],
            Op::NsDelete { ns } => vec![s("NS.DELETE"), ns.clone()],
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Op::NsCreate { .. } => "ns.create",
            Op::SemCreate { .. } => "sem.create",
            Op::LeaseCreate { .. } => "lease.create",
            Op::Refresh { .. } => "lease.refresh",
            Op::Revoke { .. } => "lease.revoke",
            Op::Acquire { .. } => "sem.acquire",
            Op::Release { .. } => "sem.release",
            Op::SemUpdate { .. } => "sem.update",
            Op::SemDelete { .. } => "sem.delete",
            Op::NsDelete { .. } => "ns.delete",
        }
    }
}

/// A command sent whose reply never came (the server was killed).
#[derive(Clone, Debug)]
struct InFlight {
    op: Op,
    worker: usize,
    sent_at: i64,
}

#[derive(Default)]
struct Model {
    namespaces: BTreeSet<String>,
    /// (ns, sem) -> (permits, version).
    sems: BTreeMap<SemKey, (i64, i64)>,
    leases: BTreeMap<String, Lease>,
    holds: BTreeMap<HoldKey, Hold>,
    /// Revoked or expired leases (id -> namespace): must stay NOTFOUND forever.
    gone: BTreeMap<String, String>,
    /// The highest fencing token seen on each semaphore, and over all of them.
    max_token: BTreeMap<SemKey, i64>,
    global_max_token: i64,
    inflight: Vec<Option<InFlight>>,
    /// Acknowledged changes (successful change commands), in all and this cycle.
    acked: u64,
    acked_cycle: u64,
    acked_by_kind: BTreeMap<&'static str, u64>,
    /// Broken rules seen while the load ran (wrong tokens, unexpected errors).
    violations: Vec<String>,
}

impl Model {
    fn note_token(&mut self, key: &SemKey, token: i64) {
        let e = self.max_token.entry(key.clone()).or_insert(0);
        *e = (*e).max(token);
        self.global_max_token = self.global_max_token.max(token);
    }

    fn ack(&mut self, kind: &'static str) {
        self.acked += 1;
        self.acked_cycle += 1;
        *self.acked_by_kind.entry(kind).or_insert(0) += 1;
    }

    /// A lease is gone (revoked, or expired): it and its holds leave the model.
    fn bury(&mut self, id: &str) {
        if let Some(l) = self.leases.remove(id) {
            self.gone.insert(id.to_string(), l.ns);
        }
        self.holds.retain(|k, _| k.2 != id);
    }

    /// A semaphore is deleted: its holds go with it.
    fn drop_sem(&mut self, ns: &str, sem: &str) {
        self.sems.remove(&(ns.to_string(), sem.to_string()));
        self.holds.retain(|k, _| !(k.0 == ns && k.1 == sem));
    }

    /// A namespace is deleted: everything in it goes.
    fn drop_ns(&mut self, ns: &str) {
        self.namespaces.remove(ns);
        let leases: Vec<String> = self
            .leases
            .iter()
            .filter(|(_, l)| l.ns == ns)
            .map(|(id, _)| id.clone())
            .collect();
        for id in leases {
            self.bury(&id);
        }
        self.sems.retain(|k, _| k.0 != ns);
        self.holds.retain(|k, _| k.0 != ns);
    }

    fn usable(&self, l: &Lease, now: i64) -> bool {
        let margin = if l.short { SEC / 2 } else { 10 * SEC };
        l.expires_at > now + margin
    }

    /// Picks the next command for worker `w`.
    fn choose(&self, rng: &mut Rng, w: usize, tag: &str, seq: &mut u64, now: i64) -> Op {
        *seq += 1;
        let name = |p: &str| format!("{p}{tag}w{w}x{seq}");
        let mine: Vec<(String, Lease)> = self
            .leases
            .iter()
            .filter(|(_, l)| l.owner == w)
            .map(|(k, l)| (k.clone(), l.clone()))
            .collect();
        let usable: Vec<(String, Lease)> = mine
            .iter()
            .filter(|(_, l)| self.usable(l, now))
            .cloned()
            .collect();
        let long: Vec<(String, Lease)> = usable.iter().filter(|(_, l)| !l.short).cloned().collect();
        // Shared namespaces (never deleted; their semaphores never updated or deleted) are used
        // by every worker; a worker's private namespace `pw{w}` and its semaphores `ps0..2` are
        // updated, deleted and re-created (same names) by that worker alone.
        let private = format!("pw{w}");
        let shared: Vec<String> = self
            .namespaces
            .iter()
            .filter(|n| !n.starts_with("pw"))
            .cloned()
            .collect();
        let shared_sems = self.sems.keys().filter(|k| !k.0.starts_with("pw")).count();
        let mut lease_namespaces = shared.clone();
        if self.namespaces.contains(&private) {
            lease_namespaces.push(private.clone());
        }
        let r = rng.below(100);
        if shared.len() < 2 || (r < 3 && shared.len() < MAX_NAMESPACES) {
            return Op::NsCreate { ns: name("n") };
        }
        if shared_sems < 3 || (r < 8 && shared_sems < MAX_SEMAPHORES) {
            return Op::SemCreate {
                ns: rng.pick(&shared),
                sem: name("s"),
                permits: rng.range(3, 8),
            };
        }
        if (31..38).contains(&r) {
            if !self.namespaces.contains(&private) {
                return Op::NsCreate { ns: private };
            }
            let missing: Vec<String> = (0..3)
                .map(|i| format!("ps{i}"))
                .filter(|x| !self.sems.contains_key(&(private.clone(), x.clone())))
                .collect();
            if !missing.is_empty() {
                return Op::SemCreate {
                    ns: private,
                    sem: rng.pick(&missing),
                    permits: rng.range(2, 6),
                };
            }
            let sem = format!("ps{}", rng.below(3));
            let version = self.sems[&(private.clone(), sem.clone())].1;
            return match rng.below(10) {
                0 => Op::NsDelete { ns: private },
                1..=3 => Op::SemDelete { ns: private, sem },
                _ => Op::SemUpdate {
                    ns: private,
                    sem,
                    permits: rng.range(1, 8),
                    version,
                },
            };
        }
        if usable.is_empty() || (r < 16 && long.len() < MAX_LONG_LEASES_PER_WORKER) {
            return Op::LeaseCreate {
                ns: rng.pick(&lease_namespaces),
                pid: name("p"),
                ttl: LONG_TTL,
            };
        }
        if r < 19 {
            return Op::LeaseCreate {
                ns: rng.pick(&lease_namespaces),
                pid: name("q"),
                ttl: SHORT_TTL,
            };
        }
        if r < 27 && !long.is_empty() {
            let (id, l) = rng.pick(&long);
            return Op::Refresh {
                ns: l.ns,
                lease: id,
                ttl: LONG_TTL,
            };
        }
        if r < 31 && long.len() > 3 {
            let (id, l) = rng.pick(&usable);
            return Op::Revoke {
                ns: l.ns,
                lease: id,
            };
        }
        if r >= 80 {
            let held: Vec<HoldKey> = self
                .holds
                .keys()
                .filter(|k| usable.iter().any(|(id, _)| *id == k.2))
                .cloned()
                .collect();
            if !held.is_empty() {
                let (ns, sem, lease) = rng.pick(&held);
                return Op::Release { ns, sem, lease };
            }
        }
        // Acquire: one of my usable leases (mostly a long one, whose holds must outlive the
        // kill), a semaphore of its namespace.
        let (id, l) = if !long.is_empty() && rng.below(100) < 80 {
            rng.pick(&long)
        } else {
            rng.pick(&usable)
        };
        let sems: Vec<(SemKey, i64)> = self
            .sems
            .iter()
            .filter(|(k, _)| k.0 == l.ns)
            .map(|(k, p)| (k.clone(), p.0))
            .collect();
        if sems.is_empty() {
            return Op::SemCreate {
                sem: if l.ns == private {
                    "ps0".to_string()
                } else {
                    name("s")
                },
                ns: l.ns,
                permits: rng.range(3, 8),
            };
        }
        let ((ns, sem), permits) = rng.pick(&sems);
        let key = (ns.clone(), sem.clone());
        Op::Acquire {
            old: self
                .holds
                .get(&(ns.clone(), sem.clone(), id.clone()))
                .copied(),
            floor: self.max_token.get(&key).copied().unwrap_or(0),
            weight: rng.range(1, permits.min(3)),
            ns,
            sem,
            lease: id,
        }
    }

    /// Records the server's answer to `op` (sent at `sent_at`, answered at `done_at`).
    fn apply(&mut self, op: &Op, w: usize, sent_at: i64, done_at: i64, res: Result<Value, String>) {
        let short_lease = |m: &Model, id: &str| m.leases.get(id).is_some_and(|l| l.short);
        let bad = |m: &mut Model, what: String| {
            m.violations
                .push(format!("worker {w}: {} -> {what}", op.words().join(" ")))
        };
        match (op, res) {
            (Op::NsCreate { ns }, Ok(_)) => {
                self.namespaces.insert(ns.clone());
                self.ack(op.kind());
            }
            (Op::SemCreate { ns, sem, permits }, Ok(v)) => {
                let got = int(&field(&v, "permits"));
                if got != *permits {
                    bad(self, format!("reply permits {got}"));
                }
                self.sems.insert((ns.clone(), sem.clone()), (*permits, 1));
                self.ack(op.kind());
            }
            (Op::LeaseCreate { ns, pid, ttl }, Ok(v)) => {
                let id = text(&field(&v, "lease_id"));
                let exp = int(&field(&v, "expires_at"));
                if exp < sent_at + ttl * SEC - 1_000_000 || exp > done_at + ttl * SEC + 1_000_000 {
                    bad(
                        self,
                        format!("expires_at {exp} outside [sent+ttl, reply+ttl]"),
                    );
                }
                self.leases.insert(
                    id,
                    Lease {
                        ns: ns.clone(),
                        pid: pid.clone(),
                        expires_at: exp,
                        short: *ttl == SHORT_TTL,
                        owner: w,
                    },
                );
                self.ack(op.kind());
            }
            (Op::Refresh { lease, .. }, Ok(v)) => {
                let exp = int(&field(&v, "expires_at"));
                if let Some(l) = self.leases.get_mut(lease) {
                    l.expires_at = exp;
                }
                self.ack(op.kind());
            }
            (Op::Revoke { lease, .. }, Ok(_)) => {
                self.bury(lease);
                self.ack(op.kind());
            }
            (
                Op::Acquire {
                    ns,
                    sem,
                    lease,
                    weight,
                    old,
                    floor,
                },
                Ok(v),
            ) => {
                let s = field(&v, "semaphore");
                let (held, permits) = (int(&field(&s, "active_holds")), int(&field(&s, "permits")));
                if held > permits {
                    bad(self, format!("active_holds {held} > permits {permits}"));
                }
                let outcome = text(&field(&v, "outcome"));
                let key = (ns.clone(), sem.clone());
                if outcome == ACQUIRED {
                    let token = int(&field(&v, "fencing_token"));
                    match old {
                        Some(h) if h.token != token => bad(
                            self,
                            format!("re-acquire changed the token {} -> {token}", h.token),
                        ),
                        None if token <= *floor => bad(
                            self,
                            format!(
                                "new token {token} not above {floor}, acknowledged on this \
                                 semaphore before it was sent"
                            ),
                        ),
                        _ => {}
                    }
                    self.holds.insert(
                        (ns.clone(), sem.clone(), lease.clone()),
                        Hold {
                            weight: *weight,
                            token,
                        },
                    );
                    self.note_token(&key, token);
                    self.ack(op.kind());
                } else if outcome != UNAVAILABLE {
                    bad(self, format!("outcome {outcome} with timeout 0"));
                } else if old.is_some_and(|h| *weight <= h.weight) {
                    bad(
                        self,
                        "a smaller or equal re-acquire was refused".to_string(),
                    );
                }
            }
            (Op::Release { ns, sem, lease }, Ok(v)) => {
                let (held, permits) = (int(&field(&v, "active_holds")), int(&field(&v, "permits")));
                if held > permits {
                    bad(self, format!("active_holds {held} > permits {permits}"));
                }
                self.holds.remove(&(ns.clone(), sem.clone(), lease.clone()));
                self.ack(op.kind());
            }
            (
                Op::SemUpdate {
                    ns,
                    sem,
                    permits,
                    version,
                },
                Ok(v),
            ) => {
                let (p, ver) = (int(&field(&v, "permits")), int(&field(&v, "version")));
                let held = int(&field(&v, "active_holds"));
                if p != *permits || ver != version + 1 || held > p {
                    bad(
                        self,
                        format!("reply permits {p} version {ver} active_holds {held}"),
                    );
                }
                self.sems.insert((ns.clone(), sem.clone()), (p, ver));
                self.ack(op.kind());
            }
            // Lowering permits below the holds is refused; nothing changes.
            (Op::SemUpdate { .. }, Err(e))
                if e.starts_with("INVALIDARG") && e.contains("below active holds") => {}
            (Op::SemDelete { ns, sem }, Ok(_)) => {
                self.drop_sem(ns, sem);
                self.ack(op.kind());
            }
            (Op::NsDelete { ns }, Ok(_)) => {
                self.drop_ns(ns);
                self.ack(op.kind());
            }
            // A short lease may expire between choosing and running: NOTFOUND is right then.
            (
                Op::Acquire { lease, .. }
                | Op::Release { lease, .. }
                | Op::Revoke { lease, .. }
                | Op::Refresh { lease, .. },
                Err(e),
            ) if e.starts_with("NOTFOUND")
                && short_lease(self, lease)
                && self.leases[lease].expires_at <= done_at =>
            {
                self.bury(lease);
            }
            (_, Err(e)) => bad(self, format!("unexpected error {e}")),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Load.
// ---------------------------------------------------------------------------------------------

/// One client: runs commands until its connection breaks (the kill) or `stop` is set.
fn worker(
    url: String,
    model: Arc<Mutex<Model>>,
    w: usize,
    mut rng: Rng,
    tag: String,
    stop: Arc<AtomicBool>,
) -> u64 {
    let mut con = connect_url(&url);
    let mut seq = 0u64;
    let mut sent = 0u64;
    while !stop.load(Ordering::Relaxed) && sent < 1_000_000 {
        let sent_at = now_ns();
        let op = {
            let mut m = model.lock().unwrap();
            let op = m.choose(&mut rng, w, &tag, &mut seq, sent_at);
            m.inflight[w] = Some(InFlight {
                op: op.clone(),
                worker: w,
                sent_at,
            });
            op
        };
        let words = op.words();
        let args: Vec<&str> = words.iter().map(|s| s.as_str()).collect();
        sent += 1;
        let res = match call(&mut con, &args) {
            Ok(v) => Ok(v),
            Err(e) if e.code().is_some() => Err(err_text(&e)),
            // The connection broke: the command stays in flight, maybe done, maybe not.
            Err(_) => break,
        };
        let done_at = now_ns();
        let mut m = model.lock().unwrap();
        m.inflight[w] = None;
        m.apply(&op, w, sent_at, done_at, res);
    }
    sent
}

// ---------------------------------------------------------------------------------------------
// The server: the harness's, or one started here on the same port and directory with other
// options (the harness restarts with the options it started with).
// ---------------------------------------------------------------------------------------------

struct Node {
    server: Server,
    own: Option<Child>,
    fsync: String,
    /// `--shards` of the running server, for the report.
    shards: usize,
}

/// How the server comes back after kill number `cycle`.
fn restart_plan(cycle: usize) -> (Option<usize>, Option<&'static str>) {
    // (None = the harness's restart with its options: --shards 2, threshold 64 KiB).
    match cycle % 3 {
        0 => (Some(3), None),
        1 => (None, None),
        _ => (Some(1), Some("16384")),
    }
}

impl Node {
    fn start(fsync: &str) -> Node {
        let server = Server::start_with(&["--fsync", fsync, "--snapshot-threshold", "65536"]);
        Node {
            server,
            own: None,
            fsync: fsync.to_string(),
            shards: 2,
        }
    }

    fn kill9(&mut self) {
        match self.own.take() {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            None => self.server.kill9(),
        }
    }

    fn log_path(&self) -> PathBuf {
        self.server
            .dir()
            .parent()
            .expect("data dir has a parent")
            .join("permitd.log")
    }

    /// Starts the server again after a kill; `Err` with the log's tail if it does not come up.
    /// With `early_kill_ms`, a first start (with the new options) is SIGKILLed that many
    /// milliseconds after its spawn, in the middle of loading or rewriting its files.
    fn restart(&mut self, cycle: usize, early_kill_ms: Option<u64>) -> Result<(), String> {
        let (shards, threshold) = restart_plan(cycle);
        let Some(shards) = shards else {
            self.server.restart();
            self.shards = 2;
            return Ok(());
        };
        let mut last = String::new();
        for attempt in 0..4 {
            let early = if attempt == 0 { early_kill_ms } else { None };
            if attempt == 1 && early_kill_ms.is_none() {
                continue;
            }
            let log = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log_path())
                .map_err(|e| format!("open log: {e}"))?;
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_permitd"));
            cmd.args(["--bind", "127.0.0.1", "--port"])
                .arg(self.server.port().to_string())
                .arg("--dir")
                .arg(self.server.dir())
                .args(["--shards", &shards.to_string(), "--fsync", &self.fsync]);
            if let Some(t) = threshold {
                cmd.args(["--snapshot-threshold", t]);
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::from(log))
                .spawn()
                .map_err(|e| format!("spawn permitd: {e}"))?;
            if let Some(ms) = early {
                thread::sleep(Duration::from_millis(ms));
                let _ = child.kill();
                let _ = child.wait();
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Ok(Some(st)) = child.try_wait() {
                    last = format!("permitd --shards {shards} exited during start with {st}");
                    break;
                }
                if ping(self.server.addr()) {
                    self.own = Some(child);
                    self.shards = shards;
                    return Ok(());
                }
                if Instant::now() > deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last = "no PONG within 30 s".to_string();
                    break;
                }
                thread::sleep(Duration::from_millis(20));
            }
            thread::sleep(Duration::from_millis(300));
        }
        Err(format!(
            "{last}\n--- server log ---\n{}",
            self.server.log_tail(30)
        ))
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(mut c) = self.own.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One `INFO section` field over a fresh connection ("?" when it cannot be read).
fn info_field(url: &str, section: &str, name: &str) -> String {
    let Ok(client) = redis::Client::open(url) else {
        return "?".into();
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(2)) else {
        return "?".into();
    };
    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
    match call(&mut con, &["INFO", section]) {
        Ok(v) => text(&v)
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("{name}:"))
                    .map(str::to_string)
            })
            .unwrap_or_else(|| "?".into()),
        Err(_) => "?".into(),
    }
}

fn ping(addr: SocketAddr) -> bool {
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(300)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let mut w = &s;
    if w.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    BufReader::new(&s).read_line(&mut line).is_ok() && line.starts_with("+PONG")
}

// ---------------------------------------------------------------------------------------------
// Verification after a restart.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct SemObs {
    permits: i64,
    version: i64,
    active_holds: i64,
    active_holders_count: i64,
}

#[derive(Debug, Clone)]
struct LeaseObs {
    ns: String,
    pid: String,
    expires_at: i64,
}

#[derive(Debug, Clone)]
struct HolderObs {
    pid: String,
    weight: i64,
    expires_at: i64,
    token: i64,
}

#[derive(Default)]
struct Observed {
    namespaces: BTreeSet<String>,
    sems: BTreeMap<SemKey, SemObs>,
    leases: BTreeMap<String, LeaseObs>,
    holders: BTreeMap<HoldKey, HolderObs>,
}

#[derive(Default)]
struct Verdict {
    /// Acknowledged effects missing or undone (or un-acknowledged ones present).
    lost: Vec<String>,
    /// Broken invariants.
    violations: Vec<String>,
    /// In-flight commands found done / not done.
    inflight_done: usize,
    /// Acknowledged holds of live leases expected after the restart.
    holds_expected: usize,
}

fn q(con: &mut redis::Connection, args: &[&str]) -> Result<Value, String> {
    call(con, args).map_err(|e| format!("{} -> {}", args.join(" "), err_text(&e)))
}

/// Every item of a paged list command.
fn all_pages(con: &mut redis::Connection, base: &[&str], list: &str) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    for _ in 0..10_000 {
        let mut args = base.to_vec();
        args.extend(["LIMIT", "250"]);
        if !cursor.is_empty() {
            args.extend(["CURSOR", cursor.as_str()]);
        }
        let v = q(con, &args)?;
        out.extend(items(&field(&v, list)));
        cursor = text(&field(&v, "next_cursor"));
        if cursor.is_empty() {
            return Ok(out);
        }
    }
    Err(format!("{} never ended", base.join(" ")))
}

fn observe(con: &mut redis::Connection, v: &mut Verdict) -> Result<Observed, String> {
    let mut o = Observed::default();
    for n in all_pages(con, &["NS.LIST"], "namespaces")? {
        o.namespaces.insert(text(&field(&n, "name")));
    }
    for ns in o.namespaces.clone() {
        for s in all_pages(con, &["SEM.LIST", &ns], "semaphores")? {
            let name = text(&field(&s, "name"));
            // SEM.GET after the list, for the counts next to the holders read below.
            let g = q(con, &["SEM.GET", &ns, &name])?;
            o.sems.insert(
                (ns.clone(), name),
                SemObs {
                    permits: int(&field(&g, "permits")),
                    version: int(&field(&g, "version")),
                    active_holds: int(&field(&g, "active_holds")),
                    active_holders_count: int(&field(&g, "active_holders_count")),
                },
            );
        }
        for l in all_pages(con, &["LEASE.LIST", &ns], "leases")? {
            let id = text(&field(&l, "lease_id"));
            let obs = LeaseObs {
                ns: ns.clone(),
                pid: text(&field(&l, "process_id")),
                expires_at: int(&field(&l, "expires_at")),
            };
            if o.leases.insert(id.clone(), obs).is_some() {
                v.violations.push(format!("lease {id} listed twice"));
            }
        }
    }
    for ((ns, sem), so) in o.sems.clone() {
        let mut sum = 0;
        let mut count = 0;
        let mut tokens = BTreeSet::new();
        for h in all_pages(con, &["SEM.HOLDERS", &ns, &sem], "holders")? {
            let lease = text(&field(&h, "lease_id"));
            let ho = HolderObs {
                pid: text(&field(&h, "process_id")),
                weight: int(&field(&h, "weight")),
                expires_at: int(&field(&h, "expires_at")),
                token: int(&field(&h, "fencing_token")),
            };
            sum += ho.weight;
            count += 1;
            if !tokens.insert(ho.token) {
                v.violations
                    .push(format!("{ns}/{sem}: fencing token {} held twice", ho.token));
            }
            if o.holders
                .insert((ns.clone(), sem.clone(), lease.clone()), ho)
                .is_some()
            {
                v.violations
                    .push(format!("{ns}/{sem}: lease {lease} holds it twice"));
            }
        }
        if sum != so.active_holds || count != so.active_holders_count || sum > so.permits {
            v.violations.push(format!(
                "{ns}/{sem}: permits {} active_holds {} active_holders_count {}, but holders \
                 sum to weight {sum} over {count} holders",
                so.permits, so.active_holds, so.active_holders_count
            ));
        }
    }
    Ok(o)
}

/// Compares the restarted server with the model, accepting either outcome for the commands in
/// flight at the kill, then makes the model what the server shows.
fn verify(
    con: &mut redis::Connection,
    m: &mut Model,
    inflight: &[InFlight],
    kill_at: i64,
) -> Verdict {
    let mut v = Verdict::default();
    let t0 = now_ns();
    let o = match observe(con, &mut v) {
        Ok(o) => o,
        Err(e) => {
            v.violations
                .push(format!("reading the state back failed: {e}"));
            return v;
        }
    };
    let pending = |f: &dyn Fn(&Op) -> bool| inflight.iter().find(|p| f(&p.op)).cloned();
    let done = |v: &mut Verdict, yes: bool| v.inflight_done += yes as usize;

    // Namespaces and semaphores. A namespace deleted by an in-flight NS.DELETE takes all in it.
    let ns_gone = |ns: &str| {
        !o.namespaces.contains(ns)
            && pending(&|op| matches!(op, Op::NsDelete { ns: n } if n == ns)).is_some()
    };
    for ns in &m.namespaces {
        if !o.namespaces.contains(ns) && !ns_gone(ns) {
            v.lost.push(format!(
                "namespace {ns} (acknowledged NS.CREATE) is missing"
            ));
        }
    }
    for ns in &o.namespaces {
        if !m.namespaces.contains(ns)
            && pending(&|op| matches!(op, Op::NsCreate { ns: n } if n == ns)).is_none()
        {
            v.lost.push(format!(
                "namespace {ns} exists, never acknowledged (or acknowledged as deleted)"
            ));
        }
    }
    for p in inflight {
        match &p.op {
            Op::NsCreate { ns } => done(&mut v, o.namespaces.contains(ns)),
            Op::NsDelete { ns } => done(&mut v, !o.namespaces.contains(ns)),
            Op::SemDelete { ns, sem } => {
                done(&mut v, !o.sems.contains_key(&(ns.clone(), sem.clone())))
            }
            _ => {}
        }
    }
    for ((ns, sem), (permits, version)) in &m.sems {
        let update =
            pending(&|op| matches!(op, Op::SemUpdate { ns: n, sem: x, .. } if n == ns && x == sem));
        let deleted = ns_gone(ns)
            || pending(&|op| matches!(op, Op::SemDelete { ns: n, sem: x } if n == ns && x == sem))
                .is_some();
        match o.sems.get(&(ns.clone(), sem.clone())) {
            None if deleted => {}
            None => v.lost.push(format!(
                "semaphore {ns}/{sem} (acknowledged SEM.CREATE) is missing"
            )),
            Some(s) if s.permits == *permits && s.version == *version => {}
            Some(s) => {
                let updated = matches!(
                    update.as_ref().map(|p| &p.op),
                    Some(Op::SemUpdate { permits: np, .. }) if s.permits == *np && s.version == version + 1
                );
                done(&mut v, updated);
                if !updated {
                    v.lost.push(format!(
                        "semaphore {ns}/{sem}: permits {} version {}, acknowledged permits \
                         {permits} version {version}",
                        s.permits, s.version
                    ));
                }
            }
        }
    }
    for ((ns, sem), s) in &o.sems {
        if m.sems.contains_key(&(ns.clone(), sem.clone())) {
            continue;
        }
        let p =
            pending(&|op| matches!(op, Op::SemCreate { ns: n, sem: x, .. } if n == ns && x == sem));
        match p.map(|p| p.op) {
            Some(Op::SemCreate { permits, .. }) if permits == s.permits && s.version == 1 => {}
            _ => v.lost.push(format!(
                "semaphore {ns}/{sem} exists, never acknowledged (or acknowledged as deleted)"
            )),
        }
    }
    for p in inflight {
        if let Op::SemCreate { ns, sem, .. } = &p.op {
            done(&mut v, o.sems.contains_key(&(ns.clone(), sem.clone())));
        }
    }

    // Leases. `alive` gets every lease the server may rightly show, with its owner.
    let mut alive: BTreeMap<String, Lease> = BTreeMap::new();
    for (id, l) in &m.leases {
        let refresh = pending(&|op| matches!(op, Op::Refresh { lease, .. } if lease == id));
        let revoke = pending(&|op| matches!(op, Op::Revoke { lease, .. } if lease == id));
        let ok_exp = |e: i64| {
            e == l.expires_at
                || refresh.as_ref().is_some_and(|p| match &p.op {
                    Op::Refresh { ttl, .. } => {
                        e >= p.sent_at + ttl * SEC - 1_000_000
                            && e <= kill_at + ttl * SEC + 1_000_000
                    }
                    _ => false,
                })
        };
        let latest = match refresh.as_ref().map(|p| &p.op) {
            Some(Op::Refresh { ttl, .. }) => l.expires_at.max(kill_at + ttl * SEC),
            _ => l.expires_at,
        };
        match o.leases.get(id) {
            Some(ol) => {
                if latest <= t0 {
                    v.violations.push(format!(
                        "lease {id} expired at {} (before {t0}) but is still listed",
                        l.expires_at
                    ));
                } else if ol.ns != l.ns || ol.pid != l.pid || !ok_exp(ol.expires_at) {
                    v.lost.push(format!(
                        "lease {id}: {}/{} expires_at {}, acknowledged {}/{} expires_at {}",
                        ol.ns, ol.pid, ol.expires_at, l.ns, l.pid, l.expires_at
                    ));
                }
                let mut l = l.clone();
                l.expires_at = ol.expires_at;
                alive.insert(id.clone(), l);
            }
            None => {
                if l.expires_at > t0 + 5 * SEC && revoke.is_none() && !ns_gone(&l.ns) {
                    v.lost.push(format!(
                        "lease {id} ({}/{}, expires_at {}) is missing",
                        l.ns, l.pid, l.expires_at
                    ));
                }
            }
        }
        if refresh.is_some() {
            done(
                &mut v,
                o.leases
                    .get(id)
                    .is_some_and(|ol| ol.expires_at != l.expires_at),
            );
        }
        if revoke.is_some() {
            done(&mut v, !o.leases.contains_key(id));
        }
    }
    for p in inflight {
        if let Op::LeaseCreate { ns, pid, ttl } = &p.op {
            let found = o.leases.iter().find(|(_, l)| l.ns == *ns && l.pid == *pid);
            done(&mut v, found.is_some());
            if let Some((id, ol)) = found {
                if ol.expires_at < p.sent_at + ttl * SEC - 1_000_000
                    || ol.expires_at > kill_at + ttl * SEC + 1_000_000
                {
                    v.violations.push(format!(
                        "lease {id} from the in-flight LEASE.CREATE: expires_at {} outside \
                         [sent+ttl, kill+ttl]",
                        ol.expires_at
                    ));
                }
                alive.insert(
                    id.clone(),
                    Lease {
                        ns: ns.clone(),
                        pid: pid.clone(),
                        expires_at: ol.expires_at,
                        short: *ttl == SHORT_TTL,
                        owner: p.worker,
                    },
                );
            }
        }
    }
    for (id, ol) in &o.leases {
        if alive.contains_key(id) {
            continue;
        }
        if m.gone.contains_key(id) {
            v.lost.push(format!(
                "lease {id} ({}/{}) was revoked or had expired, and is back",
                ol.ns, ol.pid
            ));
        } else {
            v.lost.push(format!(
                "lease {id} ({}/{}) exists, never acknowledged",
                ol.ns, ol.pid
            ));
        }
    }
    for (id, ol) in &o.leases {
        if ol.expires_at <= t0 {
            v.violations.push(format!(
                "lease {id} listed with expires_at {} <= now {t0}",
                ol.expires_at
            ));
        }
    }
    // Dead leases answer NOTFOUND (the most recent few hundred, one by one).
    for (id, ns) in m.gone.iter().rev().take(300) {
        match call(con, &["LEASE.GET", ns, id]) {
            Err(e) if err_text(&e).starts_with("NOTFOUND") => {}
            Err(e) => v
                .violations
                .push(format!("LEASE.GET {ns} {id} (dead): {}", err_text(&e))),
            Ok(_) => v.lost.push(format!(
                "LEASE.GET {ns} {id}: a revoked/expired lease answers"
            )),
        }
    }

    // Holders.
    for ((ns, sem, id), h) in &o.holders {
        match o.leases.get(id) {
            None => v.violations.push(format!(
                "{ns}/{sem}: holder {id} has no live lease (LEASE.LIST does not show it)"
            )),
            Some(l) => {
                if l.ns != *ns || l.pid != h.pid || l.expires_at != h.expires_at {
                    v.violations.push(format!(
                        "{ns}/{sem}: holder {id} {}/expires_at {} disagrees with its lease \
                         {}/{}/expires_at {}",
                        h.pid, h.expires_at, l.ns, l.pid, l.expires_at
                    ));
                }
            }
        }
        if h.expires_at <= t0 {
            v.violations.push(format!(
                "{ns}/{sem}: holder {id} shown with expires_at {} <= now {t0}",
                h.expires_at
            ));
        }
    }
    v.holds_expected = m.holds.keys().filter(|k| alive.contains_key(&k.2)).count();
    let mut keys: BTreeSet<HoldKey> = m.holds.keys().cloned().collect();
    keys.extend(o.holders.keys().cloned());
    for key in keys {
        let (ns, sem, id) = &key;
        let model = m.holds.get(&key).copied();
        let got = o.holders.get(&key).map(|h| Hold {
            weight: h.weight,
            token: h.token,
        });
        let lease_alive = alive.contains_key(id) && o.leases.contains_key(id);
        // A semaphore that is not there (deleted, or reported missing above) shows no holders.
        if !o.sems.contains_key(&(ns.clone(), sem.clone())) {
            continue;
        }
        let acq = pending(
            &|op| matches!(op, Op::Acquire { ns: n, sem: s, lease, .. } if n == ns && s == sem && lease == id),
        );
        let rel = pending(
            &|op| matches!(op, Op::Release { ns: n, sem: s, lease } if n == ns && s == sem && lease == id),
        );
        let mut ok = got == model;
        if let Some(Op::Acquire {
            weight, old, floor, ..
        }) = acq.as_ref().map(|p| &p.op)
        {
            // Either not done (as the model), or done: the new weight, the old token or a new
            // one above every token acknowledged before it was sent.
            let done_now = got.is_some_and(|g| {
                g.weight == *weight
                    && match old {
                        Some(o) => g.token == o.token,
                        None => g.token > *floor,
                    }
            });
            done(&mut v, done_now && got != model);
            ok |= done_now;
        }
        if rel.is_some() {
            done(&mut v, got.is_none() && model.is_some());
            ok |= got.is_none();
        }
        // A lease that is gone (revoked by an in-flight LEASE.REVOKE, or expired) holds nothing.
        if !lease_alive {
            ok = got.is_none();
        }
        if !ok {
            let what = match (model, got) {
                (Some(mh), None) => format!(
                    "hold {ns}/{sem} by {id} (weight {}, token {}) is missing",
                    mh.weight, mh.token
                ),
                (None, Some(g)) if !lease_alive => format!(
                    "hold {ns}/{sem} by {id} (weight {}, token {}) shown, its lease is gone",
                    g.weight, g.token
                ),
                (None, Some(g)) => format!(
                    "hold {ns}/{sem} by {id} (weight {}, token {}) exists, never acknowledged \
                     (or acknowledged as released)",
                    g.weight, g.token
                ),
                (Some(mh), Some(g)) => format!(
                    "hold {ns}/{sem} by {id}: weight {} token {}, acknowledged weight {} token {}",
                    g.weight, g.token, mh.weight, mh.token
                ),
                (None, None) => unreachable!(),
            };
            v.lost.push(what);
        }
    }

    // INFO's counts agree with what the lists show.
    match q(con, &["INFO", "semaphores"]) {
        Ok(info) => {
            let info = text(&info);
            let get = |k: &str| -> Option<usize> {
                info.lines()
                    .find_map(|l| l.trim().strip_prefix(&format!("{k}:")))
                    .and_then(|x| x.trim().parse().ok())
            };
            let want = [
                ("namespaces", o.namespaces.len()),
                ("semaphores", o.sems.len()),
                ("leases", o.leases.len()),
                ("holders", o.holders.len()),
                ("waiters", 0),
            ];
            for (k, n) in want {
                if get(k) != Some(n) {
                    v.violations.push(format!(
                        "INFO semaphores: {k}:{:?}, the lists show {n}",
                        get(k)
                    ));
                }
            }
        }
        Err(e) => v.violations.push(e),
    }

    // The model becomes what the server shows.
    m.namespaces = o.namespaces.clone();
    m.sems = o
        .sems
        .iter()
        .map(|(k, s)| (k.clone(), (s.permits, s.version)))
        .collect();
    let before: Vec<String> = m.leases.keys().cloned().collect();
    for id in before {
        if !o.leases.contains_key(&id) {
            m.bury(&id);
        }
    }
    m.leases = alive
        .into_iter()
        .filter(|(id, _)| o.leases.contains_key(id))
        .collect();
    m.holds = o
        .holders
        .iter()
        .map(|(k, h)| {
            (
                k.clone(),
                Hold {
                    weight: h.weight,
                    token: h.token,
                },
            )
        })
        .collect();
    for ((ns, sem, _), h) in &o.holders {
        m.note_token(&(ns.clone(), sem.clone()), h.token);
    }
    v
}

/// After a restart: one new hold per semaphore with room must get a token above every token
/// seen before the restart (on that semaphore, and over all of them). The probe leases are
/// revoked at the end. Returns (probes acquired, probes without room).
fn probe_tokens(
    con: &mut redis::Connection,
    m: &mut Model,
    global_before: i64,
    cycle: usize,
    v: &mut Verdict,
) -> (usize, usize) {
    let (mut got, mut full) = (0, 0);
    let namespaces: Vec<String> = m.namespaces.iter().cloned().collect();
    for ns in namespaces {
        let lease = match q(con, &["LEASE.CREATE", &ns, &format!("probe{cycle}"), "60"]) {
            Ok(r) => text(&field(&r, "lease_id")),
            Err(e) => {
                v.violations.push(e);
                continue;
            }
        };
        let sems: Vec<SemKey> = m.sems.keys().filter(|k| k.0 == ns).cloned().collect();
        for key in sems {
            match q(con, &["SEM.ACQUIRE", &ns, &key.1, &lease, "1", "0"]) {
                Ok(r) if text(&field(&r, "outcome")) == ACQUIRED => {
                    got += 1;
                    let token = int(&field(&r, "fencing_token"));
                    let per_sem = m.max_token.get(&key).copied().unwrap_or(0);
                    if token <= per_sem || token <= global_before {
                        v.violations.push(format!(
                            "{ns}/{}: first token after the restart {token} is not above the \
                             highest seen before (this semaphore {per_sem}, any {global_before})",
                            key.1
                        ));
                    }
                    m.note_token(&key, token);
                }
                Ok(_) => full += 1,
                Err(e) => v.violations.push(e),
            }
        }
        match q(con, &["LEASE.REVOKE", &ns, &lease]) {
            Ok(_) => {
                m.gone.insert(lease, ns.clone());
            }
            Err(e) => v.violations.push(e),
        }
    }
    (got, full)
}

/// The default policy (`--fsync always`, or `CRASH_FSYNC`): the test `scripts/crash-loop` runs.
#[test]
fn acknowledged_changes_survive_kill9() {
    crash_cycles(&env_or("CRASH_FSYNC", "always".to_string()));
}

/// NS.CREATE, and SIGKILL the moment its reply arrives, ten times: the namespace must be there
/// after each restart. Deterministic where the cycles above are random.
fn kill_right_after_reply(fsync: &str) {
    let mut server = Server::start_with(&["--fsync", fsync]);
    let mut lost = Vec::new();
    for i in 0..10 {
        let name = format!("k{i}");
        let reply = server.raw().cmd(&["NS.CREATE", &name]);
        server.kill9();
        assert!(
            matches!(reply, Resp::Array(Some(_))),
            "NS.CREATE {name}: {reply:?}"
        );
        server.restart();
        if call(&mut server.conn(), &["NS.GET", &name]).is_err() {
            lost.push(name);
        }
    }
    assert!(
        lost.is_empty(),
        "--fsync {fsync}: NS.CREATE acknowledged, then kill -9 at once: after the restart \
         {lost:?} (of 10) are NOTFOUND"
    );
}

#[test]
fn acknowledged_create_survives_kill9_right_after_reply() {
    kill_right_after_reply("always");
}

/// The README promises that `everysec` and `no` lose nothing acknowledged when only the process
/// dies: a reply goes out only after its change was written to the OS.
#[test]
fn acknowledged_create_survives_kill9_right_after_reply_everysec() {
    kill_right_after_reply("everysec");
}

#[test]
fn acknowledged_create_survives_kill9_right_after_reply_fsync_no() {
    kill_right_after_reply("no");
}

fn crash_cycles(fsync: &str) {
    let cycles: usize = env_or("CRASH_CYCLES", 3);
    let workers: usize = env_or("CRASH_WORKERS", 4).max(1);
    let seed: u64 = env_or("CRASH_SEED", now_ns() as u64 % 1_000_000_007);
    println!(
        "crash: seed={seed} cycles={cycles} workers={workers} fsync={fsync} \
         (reproduce the choices with CRASH_SEED={seed})"
    );
    let started = Instant::now();
    let mut rng = Rng(seed);
    let mut node = Node::start(fsync);
    let model = Arc::new(Mutex::new(Model {
        inflight: vec![None; workers],
        ..Model::default()
    }));
    let (mut lost, mut violations, mut completed) = (0usize, 0usize, 0usize);

    for cycle in 0..cycles {
        model.lock().unwrap().acked_cycle = 0;
        let stop = Arc::new(AtomicBool::new(false));
        let shards_before = node.shards;
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (url, model, stop) = (node.server.url(), model.clone(), stop.clone());
                let wrng = Rng(seed ^ ((cycle as u64 + 1) << 32) ^ ((w as u64 + 1) * 0x5851_F42D));
                let tag = format!("c{cycle}");
                thread::spawn(move || worker(url, model, w, wrng, tag, stop))
            })
            .collect();
        let load_ms = rng.range(300, 1500) as u64;
        thread::sleep(Duration::from_millis(load_ms));
        let snapshots = info_field(&node.server.url(), "persistence", "snapshots");
        let kill_at = now_ns();
        node.kill9();
        stop.store(true, Ordering::Relaxed);
        let mut sent = 0;
        for h in handles {
            sent += h.join().expect("worker thread panicked");
        }
        let inflight: Vec<InFlight> = {
            let mut m = model.lock().unwrap();
            m.inflight.iter_mut().filter_map(|s| s.take()).collect()
        };
        // Every short lease handed out has expired before the server comes back.
        let wake = kill_at + SHORT_TTL * SEC + 100_000_000;
        let wait = wake - now_ns();
        if wait > 0 {
            thread::sleep(Duration::from_nanos(wait as u64));
        }
        // Every other cycle, a start is killed too, while it loads and rewrites its files.
        let early_kill = (cycle % 2 == 0).then(|| rng.range(0, 40) as u64);
        if let Err(e) = node.restart(cycle, early_kill) {
            println!("cycle {cycle}: STARTUP FAILURE after kill -9: {e}");
            violations += 1;
            break;
        }
        let mut con = connect_url(&node.server.url());
        let mut m = model.lock().unwrap();
        let global_before = m.global_max_token;
        let mut v = verify(&mut con, &mut m, &inflight, kill_at);
        let (probed, full) = probe_tokens(&mut con, &mut m, global_before, cycle, &mut v);
        // Keep every long lease far from expiry during the next cycle (only matters for very
        // long runs): revoke those within two minutes of it.
        let soon: Vec<(String, String)> = m
            .leases
            .iter()
            .filter(|(_, l)| !l.short && l.expires_at < now_ns() + 120 * SEC)
            .map(|(id, l)| (id.clone(), l.ns.clone()))
            .collect();
        for (id, ns) in soon {
            match q(&mut con, &["LEASE.REVOKE", &ns, &id]) {
                Ok(_) => m.bury(&id),
                Err(e) => v.violations.push(e),
            }
        }
        let in_run = std::mem::take(&mut m.violations);
        v.violations.extend(in_run);
        println!(
            "cycle {cycle}: killed after {load_ms} ms (shards {shards_before} -> {}{}), \
             {sent} commands sent, {} changes acknowledged, {} in flight ({} seen applied); \
             state: {} namespaces, {} semaphores, {} leases, {} holds ({} acknowledged holds checked); token probes {probed} \
             (no room {full}); snapshots before the kill: {snapshots}; lost={} violations={}",
            node.shards,
            match (early_kill, restart_plan(cycle).0) {
                (Some(ms), Some(_)) => format!("; a start killed after {ms} ms"),
                _ => String::new(),
            },
            m.acked_cycle,
            inflight.len(),
            v.inflight_done,
            m.namespaces.len(),
            m.sems.len(),
            m.leases.len(),
            m.holds.len(),
            v.holds_expected,
            v.lost.len(),
            v.violations.len()
        );
        for p in &inflight {
            println!("  in flight: {}", p.op.words().join(" "));
        }
        for l in v.lost.iter().take(30) {
            println!("  LOST: {l}");
        }
        for l in v.violations.iter().take(30) {
            println!("  VIOLATION: {l}");
        }
        lost += v.lost.len();
        violations += v.violations.len();
        completed += 1;
        if lost + violations > 0 {
            println!("--- server log (tail) ---\n{}", node.server.log_tail(40));
            break;
        }
    }
    let m = model.lock().unwrap();
    println!(
        "crash summary: seed={seed} fsync={fsync} cycles={completed}/{cycles} in {:.1} s; \
         acknowledged by kind: {:?}; violations={violations}",
        started.elapsed().as_secs_f64(),
        m.acked_by_kind
    );
    println!(
        "cycles={completed} acknowledged_ops_checked={} lost={lost}",
        m.acked
    );
    assert!(
        lost == 0 && violations == 0 && completed == cycles,
        "durability check failed (seed {seed}): lost={lost} violations={violations}, \
         {completed}/{cycles} cycles completed"
    );
}

// ---------------------------------------------------------------------------------------------
// Reads never show what a crash could take back.
// ---------------------------------------------------------------------------------------------

/// The namespace names in an NS.LIST reply read off a raw socket.
fn ns_names(reply: &Resp) -> Vec<String> {
    let Resp::Array(Some(top)) = reply else {
        panic!("NS.LIST reply: {reply:?}");
    };
    let Some(Resp::Array(Some(list))) = top.get(1) else {
        panic!("NS.LIST reply: {reply:?}");
    };
    list.iter()
        .filter_map(|ns| match ns {
            Resp::Array(Some(f)) => match f.get(1) {
                Some(Resp::Bulk(Some(b))) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Whether a reply is waiting on the socket (without reading it).
fn readable(c: &RawConn) -> bool {
    let s = c.stream();
    s.set_nonblocking(true).unwrap();
    let r = s.peek(&mut [0u8; 1]);
    s.set_nonblocking(false).unwrap();
    matches!(r, Ok(n) if n > 0)
}

/// README: "Under `always`, no reply (not even a read) is written before every change it could
/// show is on disk." Client A sends NS.CREATE; client B polls NS.LIST; the moment B sees the new
/// namespace while A has no reply yet, the server is SIGKILLed. After the restart the namespace
/// must exist: B was shown it. Writers on another namespace of the same shard keep the group
/// commits busy, which widens the window.
#[test]
fn reads_show_only_durable_changes() {
    let mut server = Server::start_with(&["--shards", "1", "--fsync", "always"]);
    let (mut caught, mut lost) = (0, Vec::new());
    let started = Instant::now();
    for attempt in 0..20 {
        if started.elapsed() > Duration::from_secs(40) {
            break;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let (url, stop) = (server.url(), stop.clone());
                thread::spawn(move || {
                    let mut con = connect_url(&url);
                    let _ = call(&mut con, &["NS.CREATE", "bg"]);
                    while !stop.load(Ordering::Relaxed) {
                        let mut p = redis::pipe();
                        for _ in 0..16 {
                            p.cmd("LEASE.CREATE").arg("bg").arg(format!("w{w}")).arg(60);
                        }
                        if p.query::<Vec<Value>>(&mut con).is_err() {
                            break;
                        }
                    }
                })
            })
            .collect();
        thread::sleep(Duration::from_millis(200));
        let (mut a, mut b) = (server.raw(), server.raw());
        let mut victim = None;
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut i = 0;
        while victim.is_none() && Instant::now() < deadline {
            i += 1;
            let name = format!("v{attempt}x{i}");
            a.send_cmd(&[b"NS.CREATE", name.as_bytes()]).unwrap();
            for _ in 0..50 {
                let seen = ns_names(&b.cmd(&["NS.LIST", "LIMIT", "250"]));
                if seen.contains(&name) {
                    if !readable(&a) {
                        server.kill9();
                        victim = Some(name.clone());
                    }
                    break;
                }
            }
            if victim.is_none() {
                a.read_reply().unwrap();
            }
        }
        stop.store(true, Ordering::Relaxed);
        server.kill9();
        for w in writers {
            let _ = w.join();
        }
        server.restart();
        let Some(victim) = victim else { continue };
        caught += 1;
        let mut con = server.conn();
        if call(&mut con, &["NS.GET", &victim]).is_err() {
            println!(
                "attempt {attempt}: NS.LIST showed namespace {victim} before its NS.CREATE was \
                 answered; kill -9; after the restart NS.GET {victim} -> NOTFOUND"
            );
            lost.push(victim);
            break;
        }
    }
    println!("reads: caught {caught} namespaces shown before their NS.CREATE was answered");
    assert!(
        lost.is_empty(),
        "NS.LIST showed namespaces a kill -9 then took back: {lost:?}"
    );
}
