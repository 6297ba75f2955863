//! The state every task of the run shares (one thread: `Rc` + `RefCell`), and its random numbers.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::sync::{watch, Semaphore};

use crate::conn::Conn;
use crate::settings::{Cli, CONNECT_CONCURRENCY, MAX_OPS, MAX_REPORTED, SEMS};

/// What happened during the run, for the summary line.
#[derive(Default)]
pub struct Stats {
    pub ops: u64,
    pub acquired: u64,
    pub unavailable: u64,
    pub timed_out: u64,
    pub errors: BTreeMap<String, u64>,
    pub connects: u64,
    pub connect_failures: u64,
    pub disconnects: u64,
    pub kills_sent: u64,
    pub kills_hit: u64,
    pub killed_seen: u64,
    pub unblocks_sent: u64,
    pub unblocks_hit: u64,
    pub revokes: u64,
    pub updates_ok: u64,
    pub updates_rejected: u64,
    pub consistency_checks: u64,
    pub max_timeout_late_ms: u64,
    pub violations: u64,
    pub reported: Vec<String>,
}

/// What the load, chaos and control tasks share.
pub struct Shared {
    pub addr: SocketAddr,
    pub cli: Cli,
    pub stats: RefCell<Stats>,
    /// Current client id of each parker (0 while it has no connection).
    pub parker_ids: RefCell<Vec<u64>>,
    /// Client ids that were sent CLIENT KILL / CLIENT UNBLOCK (their odd endings are expected).
    pub killed: RefCell<HashSet<u64>>,
    pub unblocked: RefCell<HashSet<u64>>,
    /// Recent lease ids, for refresh / get / revoke by others.
    pub leases: RefCell<Vec<String>>,
    pub lease_pos: Cell<usize>,
    /// Per semaphore, the highest fencing token seen in a reply so far.
    pub max_token: RefCell<HashMap<String, i64>>,
    /// Per semaphore, the permits set last (by setup or SEM.UPDATE), for the weights asked.
    pub permits: RefCell<HashMap<String, i64>>,
    pub connect_gate: Semaphore,
    pub stop: Cell<bool>,
    /// Load tasks that have finished and hold an open, idle connection.
    pub resting: Cell<usize>,
    /// Load tasks that have a connection (for the start barrier).
    pub connected: Cell<usize>,
    pub start: watch::Sender<bool>,
    pub close: watch::Sender<bool>,
}

impl Shared {
    pub fn new(cli: Cli, addr: SocketAddr) -> Shared {
        let (start, _) = watch::channel(false);
        let (close, _) = watch::channel(false);
        Shared {
            addr,
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
        }
    }

    pub fn violation(&self, msg: String) {
        let mut s = self.stats.borrow_mut();
        s.violations += 1;
        if s.reported.len() < MAX_REPORTED {
            eprintln!("VIOLATION: {msg}");
            s.reported.push(msg);
        }
    }

    pub fn op(&self) {
        let mut s = self.stats.borrow_mut();
        s.ops += 1;
        if s.ops >= MAX_OPS {
            self.stop.set(true);
        }
    }

    pub fn error(&self, code: &str) {
        *self
            .stats
            .borrow_mut()
            .errors
            .entry(code.to_string())
            .or_default() += 1;
    }

    pub fn add_lease(&self, id: String) {
        let mut l = self.leases.borrow_mut();
        if l.len() < 4096 {
            l.push(id);
        } else {
            let p = self.lease_pos.get();
            l[p] = id;
            self.lease_pos.set((p + 1) % 4096);
        }
    }

    pub fn random_lease(&self, rng: &mut Rng) -> Option<String> {
        let l = self.leases.borrow();
        (!l.is_empty()).then(|| l[rng.below(l.len())].clone())
    }

    pub fn token_floor(&self, sem: &str) -> i64 {
        self.max_token.borrow().get(sem).copied().unwrap_or(0)
    }

    pub async fn connect(&self) -> Option<Conn> {
        let _permit = self.connect_gate.acquire().await.ok()?;
        match Conn::open(self.addr).await {
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

/// xorshift64*: fast, and the same sequence for the same seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }
}
