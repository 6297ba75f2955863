//! Per-command statistics, Redis's: calls, time spent, rejected and failed calls, latency
//! percentiles, and error replies by code (INFO `# Commandstats`, `# Errorstats`,
//! `# Latencystats`, and the command series of `/metrics`).
//!
//! Each thread counts into its own [`CommandStats`] (no shared counter on the hot path); INFO and
//! a scrape ask every thread for a copy and add them up ([`CommandStats::merge`]).

use std::time::Duration;

use hdrhistogram::Histogram;

use crate::engine::room::FastMap;
use crate::error::Error;
use crate::protocol::Reply;

/// Latencies are recorded in nanoseconds from 1 ns to 1 s, to 2 significant digits: Redis's own
/// bounds and precision (`LATENCY_HISTOGRAM_MAX_VALUE`, `LATENCY_HISTOGRAM_PRECISION`); a
/// longer one counts as 1 s.
const LOWEST_NS: u64 = 1;
const HIGHEST_NS: u64 = 1_000_000_000;
const SIGFIG: u8 = 2;

/// How a command ended, as Redis counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It ran and answered normally.
    Ok,
    /// It ran and answered an error (`failed_calls`).
    Failed,
    /// It was refused before it ran: arity, permissions, OOM (`rejected_calls`).
    Rejected,
}

impl Outcome {
    /// How a call that ran and answered `reply` ended, and its error.
    pub fn of(reply: &Reply) -> (Outcome, Option<&Error>) {
        match reply {
            Reply::Error(e) => (Outcome::Failed, Some(e)),
            _ => (Outcome::Ok, None),
        }
    }
}

/// One command's figures.
#[derive(Debug, Clone, Default)]
pub struct CmdStat {
    /// Calls that ran (Redis's `calls`: failed ones included, rejected ones not).
    pub calls: u64,
    /// Time they ran, in total.
    pub nanos: u64,
    /// Calls that ran and answered an error.
    pub failed: u64,
    /// Calls refused before they ran.
    pub rejected: u64,
}

impl CmdStat {
    fn add(&mut self, other: &CmdStat) {
        self.calls += other.calls;
        self.nanos += other.nanos;
        self.failed += other.failed;
        self.rejected += other.rejected;
    }
}

/// How long the calls of one command took.
pub type Latency = Histogram<u64>;

fn new_latency() -> Latency {
    Histogram::new_with_bounds(LOWEST_NS, HIGHEST_NS, SIGFIG).expect("valid histogram bounds")
}

/// The latency in microseconds at percentile `p` (0..100), as Redis reports it.
pub fn percentile_usec(h: &Latency, p: f64) -> f64 {
    h.value_at_percentile(p) as f64 / 1000.0
}

/// A thread's figures, or every thread's added up.
#[derive(Debug, Clone, Default)]
pub struct CommandStats {
    /// By command name (a subcommand's is `container|sub`, as in Redis).
    commands: FastMap<&'static str, CmdStat>,
    /// By command name: each call's latency (a copy may leave them out, see [`Self::copy`]).
    latency: FastMap<&'static str, Latency>,
    /// Error replies by their code word (Redis counts every error reply, also of unknown
    /// commands).
    errors: FastMap<&'static str, u64>,
}

impl CommandStats {
    /// Counts a call of `name` that took `took` (nothing for a rejected one) and ended so; an
    /// error reply is counted under its code.
    pub fn record(&mut self, name: &'static str, took: Duration, outcome: Outcome) {
        let stat = self.commands.entry(name).or_default();
        match outcome {
            Outcome::Rejected => stat.rejected += 1,
            Outcome::Ok | Outcome::Failed => {
                let ns = took.as_nanos().min(u128::from(u64::MAX)) as u64;
                stat.calls += 1;
                stat.nanos += ns;
                stat.failed += u64::from(outcome == Outcome::Failed);
                self.latency
                    .entry(name)
                    .or_insert_with(new_latency)
                    .saturating_record(ns.max(LOWEST_NS));
            }
        }
    }

    /// A copy to merge with other threads' figures; with the latency histograms only when
    /// `latency` (they are the bulk of it, and only INFO latencystats and `/metrics` read them).
    pub fn copy(&self, latency: bool) -> CommandStats {
        CommandStats {
            commands: self.commands.clone(),
            latency: if latency {
                self.latency.clone()
            } else {
                FastMap::default()
            },
            errors: self.errors.clone(),
        }
    }

    /// A call that ran and later ended with `error` (a parked acquire whose semaphore went
    /// away): its call was counted when it ran.
    pub fn failed_later(&mut self, name: &'static str, error: &Error) {
        self.commands.entry(name).or_default().failed += 1;
        self.error(error);
    }

    /// Counts an error reply.
    pub fn error(&mut self, error: &Error) {
        *self.errors.entry(error.code()).or_insert(0) += 1;
    }

    /// Adds another thread's figures to these.
    pub fn merge(&mut self, other: &CommandStats) {
        for (name, stat) in &other.commands {
            match self.commands.get_mut(name) {
                Some(mine) => mine.add(stat),
                None => {
                    self.commands.insert(name, stat.clone());
                }
            }
        }
        for (name, h) in &other.latency {
            match self.latency.get_mut(name) {
                // Same bounds on both sides: adding cannot fail.
                Some(mine) => {
                    let _ = mine.add(h);
                }
                None => {
                    self.latency.insert(name, h.clone());
                }
            }
        }
        for (code, n) in &other.errors {
            *self.errors.entry(code).or_insert(0) += n;
        }
    }

    /// The commands that have figures, by name.
    pub fn commands(&self) -> Vec<(&'static str, &CmdStat)> {
        let mut v: Vec<_> = self.commands.iter().map(|(n, s)| (*n, s)).collect();
        v.sort_unstable_by_key(|(n, _)| *n);
        v
    }

    /// The latencies of the commands that ran, by name.
    pub fn latencies(&self) -> Vec<(&'static str, &Latency)> {
        let mut v: Vec<_> = self.latency.iter().map(|(n, h)| (*n, h)).collect();
        v.sort_unstable_by_key(|(n, _)| *n);
        v
    }

    /// Error replies by code, by code.
    pub fn errors(&self) -> Vec<(&'static str, u64)> {
        let mut v: Vec<_> = self.errors.iter().map(|(c, n)| (*c, *n)).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_failures_and_rejections_are_counted_apart() {
        let mut s = CommandStats::default();
        s.record("sem.get", Duration::from_micros(10), Outcome::Ok);
        s.record("sem.get", Duration::from_micros(30), Outcome::Failed);
        s.error(&Error::NotFound("x".into()));
        s.record("sem.get", Duration::ZERO, Outcome::Rejected);
        let (name, st) = s.commands()[0];
        assert_eq!(name, "sem.get");
        assert_eq!((st.calls, st.failed, st.rejected), (2, 1, 1));
        assert_eq!(st.nanos, 40_000);
        assert_eq!(s.errors(), vec![("NOTFOUND", 1)]);
    }

    #[test]
    fn merged_threads_add_up_and_keep_percentiles() {
        let mut a = CommandStats::default();
        let mut b = CommandStats::default();
        for _ in 0..99 {
            a.record("ping", Duration::from_micros(1), Outcome::Ok);
        }
        b.record("ping", Duration::from_millis(5), Outcome::Ok);
        b.error(&Error::Err("x".into()));
        a.merge(&b);
        assert_eq!(a.commands()[0].1.calls, 100);
        let (_, h) = a.latencies()[0];
        // 2 significant digits: within 1% of the recorded value.
        assert!((percentile_usec(h, 50.0) - 1.0).abs() < 0.011);
        assert!((percentile_usec(h, 99.9) - 5000.0).abs() < 0.01 * 5000.0);
        assert_eq!(a.errors(), vec![("ERR", 1)]);
        assert!(a.copy(false).latencies().is_empty());
        assert_eq!(a.copy(false).commands()[0].1.calls, 100);
    }
}
