//! The workload: clients, each a thread with its own connection and its own lease, doing random
//! SEM.ACQUIRE (weights 1-3, timeouts 0-2 s), SEM.RELEASE, LEASE.REFRESH and LEASE.REVOKE on a
//! few small semaphores, bounded in time and count, recording every call in a [`History`].
//! Then, once the faults have healed, the final reads the checker's rule (c) needs.
//!
//! The clients speak RESP over raw sockets (`common::RawConn`, replies read with the client
//! crate's reader) so that each call's invoke and complete instants are exactly around its
//! write and its read, and a lost connection is an unknown outcome, never a retry behind the
//! recorder's back.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::history::{Call, Clock, History, Holder, Op, Outcome};
use crate::common::{RawConn, Resp};

/// The namespace of every run.
pub const NS: &str = "chaos";

/// The semaphores of every run and their permits: small, so that clients contend.
pub const SEMS: [(&str, u32); 3] = [("s2", 2), ("s3", 3), ("s5", 5)];

/// How long a client waits for a reply beyond its acquire's own timeout before it calls the
/// outcome unknown and reconnects.
const REPLY_SLACK: Duration = Duration::from_millis(1500);

/// How long the clients go on after the faults end, before the final reads: long enough for
/// those a fault left without a lease to make a new one and hold permits again, so that the
/// final reads have acknowledged holds to check.
const CALM: Duration = Duration::from_secs(3);

/// A small seeded generator (splitmix64): runs repeat from their seed, with no new crate.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }

    /// A duration of `lo..hi` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct Config {
    pub clients: usize,
    /// How long the clients run.
    pub duration: Duration,
    /// At most this many calls per client.
    pub max_calls: usize,
    /// The TTL of every lease, seconds: short, so leases also expire during the run.
    pub ttl: u64,
    pub seed: u64,
}

/// A run in progress: the clients' threads.
pub struct Running {
    config: Config,
    clock: Clock,
    /// When the faults end.
    deadline: Instant,
    /// Tells the clients to stop.
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<(Vec<Call>, Option<String>)>>,
}

/// How long the schema's creation and the final reads try, following the leader.
const SETTLED: Duration = Duration::from_secs(30);

/// Creates the run's namespace and semaphores through `nodes` (in cluster mode on whichever
/// node leads, following [`redirect`]s).
pub fn create_schema(nodes: &[SocketAddr]) {
    let mut commands = vec![vec!["NS.CREATE".to_string(), NS.to_string()]];
    commands.extend(SEMS.iter().map(|(sem, permits)| {
        vec![
            "SEM.CREATE".into(),
            NS.into(),
            sem.to_string(),
            permits.to_string(),
        ]
    }));
    let mut at = nodes[0];
    let deadline = Instant::now() + SETTLED;
    for words in commands {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        loop {
            match RawConn::try_connect(at).map(|mut c| c.cmd(&words)) {
                Ok(Resp::Error(e)) if redirect(&e).is_some() => {
                    at = redirect(&e).flatten().unwrap_or(at);
                }
                Ok(reply) => {
                    expect_ok(reply);
                    break;
                }
                Err(_) => at = following(nodes, at),
            }
            assert!(Instant::now() < deadline, "no node took {words:?}");
            thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The node after `at` in `nodes` (`at` refuses connections: it may be down).
fn following(nodes: &[SocketAddr], at: SocketAddr) -> SocketAddr {
    let i = nodes.iter().position(|&n| n == at).unwrap_or(0);
    nodes[(i + 1) % nodes.len()]
}

/// Whether an error reply is cluster mode's "not here, not now" (nothing ran: SPEC §10), and
/// where to go: `MOVED`'s leader, or (`CLUSTERDOWN`, `TRYAGAIN`) the same node a moment later.
pub fn redirect(error: &str) -> Option<Option<SocketAddr>> {
    let (code, rest) = error.split_once(' ').unwrap_or((error, ""));
    match code {
        "MOVED" => Some(rest.split(' ').nth(1).and_then(|a| a.parse().ok())),
        "CLUSTERDOWN" | "TRYAGAIN" => Some(None),
        _ => None,
    }
}

/// Creates the schema, then starts the clients, client `i` on `targets[i % targets.len()]`;
/// in cluster mode (several targets) each follows the leader among them.
pub fn start(config: Config, targets: &[SocketAddr]) -> Running {
    create_schema(targets);
    let clock = Clock::start();
    let deadline = Instant::now() + config.duration;
    let stop = Arc::new(AtomicBool::new(false));
    let clients = (0..config.clients)
        .map(|id| {
            let client = Client::new(id, targets, id, clock, &config);
            let (stop, max_calls) = (stop.clone(), config.max_calls);
            thread::spawn(move || client.run(&stop, max_calls))
        })
        .collect();
    Running {
        config,
        clock,
        deadline,
        stop,
        clients,
    }
}

impl Running {
    /// Whether the run's duration has not passed yet: the caller injects faults meanwhile.
    pub fn running(&self) -> bool {
        Instant::now() < self.deadline
    }

    /// Lets the clients go on for a calm spell (the faults healed), stops them, then makes the
    /// final reads through `nodes` (see [`Client::final_calls`]). All of it goes into the
    /// history.
    pub fn finish(mut self, nodes: &[SocketAddr]) -> History {
        thread::sleep(CALM);
        self.stop.store(true, Ordering::SeqCst);
        let mut history = History::new(NS, &SEMS);
        let mut live = Vec::new();
        for c in std::mem::take(&mut self.clients) {
            let (calls, lease) = c.join().expect("a workload client panicked");
            history.calls.extend(calls);
            live.extend(lease);
        }
        let created: Vec<String> = history
            .calls
            .iter()
            .filter_map(|c| match &c.outcome {
                Outcome::Created(id) => Some(id.clone()),
                _ => None,
            })
            .collect();
        let mut last = Client::new(self.config.clients, nodes, 0, self.clock, &self.config);
        last.final_calls(live, created);
        history.calls.extend(last.calls);
        history
    }
}

impl Drop for Running {
    /// Stops the clients of a run left unfinished (a test that failed half-way).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One client: its connection, its lease and what it believes it holds.
struct Client {
    id: usize,
    /// Every node; `addr` is the one it calls now.
    nodes: Vec<SocketAddr>,
    addr: SocketAddr,
    clock: Clock,
    ttl: u64,
    rng: Rng,
    conn: Option<RawConn>,
    lease: Option<String>,
    /// Semaphores (indexes in [`SEMS`]) the lease holds, acknowledged.
    held: BTreeSet<usize>,
    /// A lease given up after an unknown outcome, to revoke on the next connection.
    abandoned: Option<String>,
    calls: Vec<Call>,
}

impl Client {
    fn new(id: usize, nodes: &[SocketAddr], first: usize, clock: Clock, config: &Config) -> Client {
        Client {
            id,
            nodes: nodes.to_vec(),
            addr: nodes[first % nodes.len()],
            clock,
            ttl: config.ttl,
            rng: Rng::new(config.seed ^ (id as u64 + 1).wrapping_mul(0xA24B_AED4_963E_E407)),
            conn: None,
            lease: None,
            held: BTreeSet::new(),
            abandoned: None,
            calls: Vec::new(),
        }
    }

    /// Calls until told to stop or `max_calls`; returns the calls and the lease it still has.
    fn run(mut self, stop: &AtomicBool, max_calls: usize) -> (Vec<Call>, Option<String>) {
        while !stop.load(Ordering::SeqCst) && self.calls.len() < max_calls {
            if self.conn.is_none() {
                match RawConn::try_connect(self.addr) {
                    Ok(c) => self.conn = Some(c),
                    Err(_) => {
                        self.next_node();
                        thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                }
            }
            self.step();
            let think = self.rng.millis(0, 4);
            thread::sleep(think);
        }
        (self.calls, self.lease)
    }

    /// One call, chosen from what the client believes.
    fn step(&mut self) {
        if let Some(lease) = self.abandoned.take() {
            self.call(Op::Revoke { lease });
            return;
        }
        let Some(lease) = self.lease.clone() else {
            self.call(Op::CreateLease { ttl: self.ttl });
            return;
        };
        let free: Vec<usize> = (0..SEMS.len()).filter(|s| !self.held.contains(s)).collect();
        let held: Vec<usize> = self.held.iter().copied().collect();
        // 45% acquire, 30% release (each the other when it cannot; a client holds at most two
        // semaphores, or the clients mostly wait on each other), 22% refresh, 3% revoke.
        let roll = self.rng.range(0, 100);
        let op = if roll >= 97 {
            Op::Revoke { lease }
        } else if roll >= 75 {
            Op::Refresh {
                lease,
                ttl: self.ttl,
            }
        } else if (roll < 45 || held.is_empty()) && held.len() < 2 {
            let (sem, permits) = SEMS[free[self.rng.range(0, free.len() as u64) as usize]];
            let timeouts = [0, 0, 0, 50, 100, 250, 500, 1000, 2000];
            let timeout_ms = timeouts[self.rng.range(0, timeouts.len() as u64) as usize];
            Op::Acquire {
                lease,
                sem: sem.into(),
                weight: self.rng.range(1, u64::from(permits.min(3)) + 1) as u32,
                timeout_ms,
            }
        } else {
            let sem = SEMS[held[self.rng.range(0, held.len() as u64) as usize]].0;
            Op::Release {
                lease,
                sem: sem.into(),
            }
        };
        self.call(op);
    }

    /// Makes one call, records it, and updates what the client believes from its outcome.
    fn call(&mut self, op: Op) -> Outcome {
        let outcome = self.record(op.clone());
        let sem = |name: &str| SEMS.iter().position(|(s, _)| *s == name).unwrap();
        match (&op, &outcome) {
            (Op::CreateLease { .. }, Outcome::Created(id)) => self.lease = Some(id.clone()),
            (Op::Acquire { sem: s, .. }, Outcome::Acquired(_)) => {
                self.held.insert(sem(s));
            }
            (Op::Release { sem: s, .. }, Outcome::Ok) => {
                self.held.remove(&sem(s));
            }
            (Op::Revoke { .. }, Outcome::Ok) => self.forget_lease(),
            (_, o) if o.lease_missing() => self.forget_lease(),
            // A refresh that may or may not have landed only ever extends the lease: keep it.
            (Op::Refresh { .. }, Outcome::Unknown(_)) => {}
            // Anything else unknown may land later, at any time: the checker cannot rely on
            // this lease's holds from now on, so the client starts afresh with a new one.
            (Op::Acquire { .. } | Op::Release { .. }, Outcome::Unknown(_)) => {
                self.abandoned = self.lease.take();
                self.held.clear();
            }
            (Op::Revoke { .. }, Outcome::Unknown(_)) => self.forget_lease(),
            _ => {}
        }
        outcome
    }

    /// After the run: refreshes the leases the clients still had (they stopped at different
    /// times: this makes their holds relied on across the reads that follow, so rule (c)
    /// checks them all), reads SEM.HOLDERS of every semaphore and LEASE.GET of every lease
    /// created, revokes them all, and acquires each semaphore once more with a new lease (its
    /// token must top every token handed out).
    fn final_calls(&mut self, live: Vec<String>, created: Vec<String>) {
        for lease in live {
            let ttl = self.ttl;
            self.settled(Op::Refresh { lease, ttl });
        }
        for (sem, _) in SEMS {
            self.settled(Op::Holders { sem: sem.into() });
        }
        for lease in &created {
            self.settled(Op::GetLease {
                lease: lease.clone(),
            });
        }
        for lease in created {
            self.settled(Op::Revoke { lease });
        }
        if let Outcome::Created(lease) = self.settled(Op::CreateLease { ttl: 30 }) {
            for (sem, _) in SEMS {
                self.settled(Op::Acquire {
                    lease: lease.clone(),
                    sem: sem.into(),
                    weight: 1,
                    timeout_ms: 5000,
                });
            }
        }
    }

    /// What each node says of the cluster (`INFO raft` and `ROLE`), for a failure's message.
    fn diagnose(&self) -> String {
        let said = |addr: SocketAddr| -> String {
            let Ok(mut c) = RawConn::try_connect(addr) else {
                return "unreachable".into();
            };
            let info = match c.cmd(&["INFO", "raft"]) {
                Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b).into_owned(),
                other => format!("{other:?}"),
            };
            let keep = [
                "raft_node_id",
                "raft_role",
                "raft_term",
                "raft_leader_id",
                "raft_commit",
            ];
            let lines: Vec<&str> = info
                .lines()
                .filter(|l| keep.iter().any(|k| l.starts_with(k)))
                .collect();
            format!("{} ROLE={:?}", lines.join(" "), c.cmd(&["ROLE"]))
        };
        self.nodes
            .iter()
            .map(|&a| format!("\n  {a}: {}", said(a)))
            .collect()
    }

    fn next_node(&mut self) {
        self.addr = following(&self.nodes, self.addr);
    }

    fn forget_lease(&mut self) {
        self.lease = None;
        self.held.clear();
    }

    /// A call that must get an answer: retried (each try recorded) until one comes, for up to
    /// [`SETTLED`], following the leader. For the final reads, made after the faults heal.
    fn settled(&mut self, op: Op) -> Outcome {
        let deadline = Instant::now() + SETTLED;
        loop {
            while self.conn.is_none() {
                self.conn = RawConn::try_connect(self.addr).ok();
                if self.conn.is_none() {
                    assert!(
                        Instant::now() < deadline,
                        "{op:?}: no server at {} after the faults healed; the last answers: {:?}; \
                         the nodes: {}",
                        self.addr,
                        self.calls
                            .iter()
                            .rev()
                            .take(5)
                            .map(|c| &c.outcome)
                            .collect::<Vec<_>>(),
                        self.diagnose()
                    );
                    self.next_node();
                    thread::sleep(Duration::from_millis(50));
                }
            }
            let outcome = self.record(op.clone());
            let redirected = matches!(&outcome, Outcome::Refused(e) if redirect(e).is_some());
            if !matches!(outcome, Outcome::Unknown(_)) && !redirected {
                return outcome;
            }
            assert!(
                Instant::now() < deadline,
                "{op:?} got no answer after the faults healed: {outcome:?}; the nodes: {}",
                self.diagnose()
            );
        }
    }

    /// Sends the call's command on the open connection and reads its reply, recording the
    /// call; a connection that fails is dropped.
    fn record(&mut self, op: Op) -> Outcome {
        let conn = self.conn.as_mut().expect("a connection");
        let words = command(&op);
        let words: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        let wait = match op {
            Op::Acquire { timeout_ms, .. } => Duration::from_millis(timeout_ms) + REPLY_SLACK,
            _ => REPLY_SLACK,
        };
        let _ = conn.stream().set_read_timeout(Some(wait));
        let invoke = self.clock.now();
        let reply = conn.send_cmd(&words).and_then(|()| conn.read_reply());
        let complete = self.clock.now();
        let outcome = match reply {
            Ok(Resp::Error(e)) if e.starts_with("LEADERCHANGED") => Outcome::Unknown(e),
            Ok(Resp::Error(e)) => Outcome::Refused(e),
            Ok(v) => outcome(&op, &v),
            Err(e) => Outcome::Unknown(e.to_string()),
        };
        if matches!(outcome, Outcome::Unknown(_)) {
            // A late reply would answer the next call: this connection is done.
            self.conn = None;
        }
        if let Outcome::Refused(e) = &outcome {
            match redirect(e) {
                Some(Some(leader)) => {
                    self.addr = leader;
                    self.conn = None;
                }
                Some(None) => thread::sleep(Duration::from_millis(50)),
                None => {}
            }
        }
        self.calls.push(Call {
            client: self.id,
            op,
            invoke,
            complete,
            outcome: outcome.clone(),
        });
        outcome
    }
}

/// The command words of a call.
fn command(op: &Op) -> Vec<String> {
    let w = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
    match op {
        Op::CreateLease { ttl } => w(&["LEASE.CREATE", NS, "chaos", &ttl.to_string()]),
        Op::Refresh { lease, ttl } => w(&["LEASE.REFRESH", NS, lease, &ttl.to_string()]),
        Op::Revoke { lease } => w(&["LEASE.REVOKE", NS, lease]),
        Op::Acquire {
            lease,
            sem,
            weight,
            timeout_ms,
        } => w(&[
            "SEM.ACQUIRE",
            NS,
            sem,
            lease,
            &weight.to_string(),
            &format!("{:.3}", *timeout_ms as f64 / 1000.0),
        ]),
        Op::Release { lease, sem } => w(&["SEM.RELEASE", NS, sem, lease]),
        Op::Holders { sem } => w(&["SEM.HOLDERS", NS, sem, "LIMIT", "250"]),
        Op::GetLease { lease } => w(&["LEASE.GET", NS, lease]),
    }
}

/// A successful reply, read as the call's outcome. A reply of the wrong shape is a server bug,
/// and fails the run.
fn outcome(op: &Op, reply: &Resp) -> Outcome {
    let need = |v: Option<String>| v.unwrap_or_else(|| panic!("{op:?}: unexpected {reply:?}"));
    let int = |v: Option<i64>| v.unwrap_or_else(|| panic!("{op:?}: unexpected {reply:?}"));
    match op {
        Op::CreateLease { .. } => Outcome::Created(need(reply.text_field("lease_id"))),
        Op::Acquire { .. } => match need(reply.text_field("outcome")).as_str() {
            "ACQUIRE_OUTCOME_ACQUIRED" => Outcome::Acquired(int(reply.int_field("fencing_token"))),
            "ACQUIRE_OUTCOME_UNAVAILABLE" | "ACQUIRE_OUTCOME_TIMED_OUT" => Outcome::NotAcquired,
            other => panic!("{op:?}: unexpected outcome {other}"),
        },
        Op::Holders { .. } => {
            let holders = reply.items_field("holders");
            let holders = holders.unwrap_or_else(|| panic!("{op:?}: unexpected {reply:?}"));
            Outcome::Holders(
                holders
                    .iter()
                    .map(|h| Holder {
                        lease: need(h.text_field("lease_id")),
                        weight: int(h.int_field("weight")) as u32,
                        token: int(h.int_field("fencing_token")),
                    })
                    .collect(),
            )
        }
        Op::Refresh { .. } | Op::Revoke { .. } | Op::Release { .. } | Op::GetLease { .. } => {
            Outcome::Ok
        }
    }
}

fn expect_ok(reply: Resp) {
    assert!(!matches!(reply, Resp::Error(_)), "setup failed: {reply:?}");
}
