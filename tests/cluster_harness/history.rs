//! What a run did, as its clients saw it: every call with its invoke and complete instants on
//! one monotonic clock, and its outcome. The checker reads nothing else.

use std::time::Instant;

/// An instant of the run: nanoseconds on `CLOCK_MONOTONIC` since the history's start. One
/// machine, one clock: instants of different client threads compare.
pub type At = u64;

/// "Never": the end of an unknown outcome's effect, which may come at any time after its invoke.
pub const NEVER: At = At::MAX;

/// What a call asked for. Every call is in the history's one namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `LEASE.CREATE ns process ttl`.
    CreateLease { ttl: u64 },
    /// `LEASE.REFRESH ns lease ttl`.
    Refresh { lease: String, ttl: u64 },
    /// `LEASE.REVOKE ns lease`.
    Revoke { lease: String },
    /// `SEM.ACQUIRE ns sem lease weight timeout`.
    Acquire {
        lease: String,
        sem: String,
        weight: u32,
        timeout_ms: u64,
    },
    /// `SEM.RELEASE ns sem lease`.
    Release { lease: String, sem: String },
    /// `SEM.HOLDERS ns sem LIMIT 250`: a read.
    Holders { sem: String },
    /// `LEASE.GET ns lease`: a read.
    GetLease { lease: String },
}

impl Op {
    /// The lease the call names, if any.
    pub fn lease(&self) -> Option<&str> {
        match self {
            Op::Refresh { lease, .. }
            | Op::Revoke { lease }
            | Op::Acquire { lease, .. }
            | Op::Release { lease, .. }
            | Op::GetLease { lease } => Some(lease),
            Op::CreateLease { .. } | Op::Holders { .. } => None,
        }
    }
}

/// One holder in a SEM.HOLDERS reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub lease: String,
    pub weight: u32,
    pub token: i64,
}

/// How a call ended, as far as its client knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// LEASE.CREATE answered: the new lease's id.
    Created(String),
    /// SEM.ACQUIRE answered ACQUIRED: the fencing token.
    Acquired(i64),
    /// SEM.ACQUIRE answered UNAVAILABLE or TIMED_OUT.
    NotAcquired,
    /// SEM.HOLDERS answered: its holders.
    Holders(Vec<Holder>),
    /// Any other success: a release, a refresh, a revoke, a lease found.
    Ok,
    /// An error reply (`CODE message`): known, and nothing changed (SPEC §5).
    Refused(String),
    /// No answer (read timeout, lost connection; `LEADERCHANGED` in a cluster): the change may
    /// have happened, at any instant after the invoke, even after later calls (a request held in
    /// a partitioned link arrives late).
    Unknown(String),
}

impl Outcome {
    /// Whether this is the server saying the call's lease does not exist: the lease is missing
    /// or expired, or so is the namespace holding it.
    pub fn lease_missing(&self) -> bool {
        matches!(self, Outcome::Refused(e)
            if e.starts_with("NOTFOUND lease") || e.starts_with("NOTFOUND namespace"))
    }
}

/// One call: what was asked, when, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The client (thread) that made it.
    pub client: usize,
    pub op: Op,
    /// Just before the request was written.
    pub invoke: At,
    /// Just after the reply was read (for an unknown outcome: when the client gave up).
    pub complete: At,
    pub outcome: Outcome,
}

impl Call {
    /// Until when the call may take effect: its complete instant, or [`NEVER`] when its
    /// outcome is unknown.
    pub fn effect_until(&self) -> At {
        match self.outcome {
            Outcome::Unknown(_) => NEVER,
            _ => self.complete,
        }
    }

    /// Whether the server answered with something other than an error.
    pub fn succeeded(&self) -> bool {
        !matches!(self.outcome, Outcome::Refused(_) | Outcome::Unknown(_))
    }
}

/// The whole run: the namespace, its semaphores with their permits (fixed for the run), and
/// every call.
#[derive(Debug, Clone)]
pub struct History {
    pub ns: String,
    pub sems: Vec<(String, u32)>,
    pub calls: Vec<Call>,
    /// Cluster mode: a new leader extends the leases alive at the log's last instant by the
    /// failover grace (SPEC §10), and failovers may follow each other, so an expiry never makes
    /// a lease surely dead; a revoke still does.
    pub leases_extended: bool,
}

impl History {
    pub fn new(ns: &str, sems: &[(&str, u32)]) -> History {
        History {
            ns: ns.to_string(),
            sems: sems.iter().map(|&(s, p)| (s.to_string(), p)).collect(),
            calls: Vec::new(),
            leases_extended: false,
        }
    }

    /// The permits of semaphore `sem`.
    pub fn permits(&self, sem: &str) -> u32 {
        self.sems
            .iter()
            .find(|(s, _)| s == sem)
            .map(|&(_, p)| p)
            .unwrap_or_else(|| panic!("semaphore {sem} is not in the history"))
    }

    /// The calls counted by how they ended.
    pub fn counts(&self) -> Counts {
        let mut n = Counts {
            calls: self.calls.len(),
            ..Counts::default()
        };
        for c in &self.calls {
            match c.outcome {
                Outcome::Refused(_) => n.refused += 1,
                Outcome::Unknown(_) => n.unknown += 1,
                Outcome::Acquired(_) => {
                    n.acknowledged += 1;
                    n.granted += 1;
                }
                _ => n.acknowledged += 1,
            }
        }
        n
    }
}

/// How a history's calls ended.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    pub calls: usize,
    /// Answered with a success.
    pub acknowledged: usize,
    /// Of those, acquires granted.
    pub granted: usize,
    /// Answered with an error.
    pub refused: usize,
    /// Not answered.
    pub unknown: usize,
}

/// The run's clock: [`At`] instants since its start.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    pub fn start() -> Clock {
        Clock(Instant::now())
    }

    pub fn now(&self) -> At {
        self.0.elapsed().as_nanos() as At
    }
}
