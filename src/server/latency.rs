//! The latency monitor (`--latency-monitor-threshold`, milliseconds; 0: off), as Redis's
//! latency.c keeps it: per event (`command`, `fast-command`), the latest 160 seconds that had a
//! spike of at least the threshold, each with its worst latency, and the worst of all time.
//! LATENCY LATEST, HISTORY and RESET read it. The latencies are the slow log's durations.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use crate::protocol::Reply;

/// Seconds of samples kept per event (Redis's `LATENCY_TS_LEN`).
const SAMPLES: usize = 160;

#[derive(Debug, Default)]
struct Series {
    /// (unix second, worst latency in ms that second), oldest first.
    samples: VecDeque<(i64, u64)>,
    max: u64,
}

/// The latency monitor (see the module docs).
#[derive(Debug)]
pub struct LatencyMonitor {
    threshold_ms: u64,
    events: Mutex<BTreeMap<&'static str, Series>>,
}

impl LatencyMonitor {
    /// A monitor of spikes of `threshold_ms` or more (0: off).
    pub fn new(threshold_ms: u64) -> LatencyMonitor {
        LatencyMonitor {
            threshold_ms,
            events: Mutex::default(),
        }
    }

    fn events(&self) -> MutexGuard<'_, BTreeMap<&'static str, Series>> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether it records anything.
    pub fn on(&self) -> bool {
        self.threshold_ms > 0
    }

    /// Records that `event` took `took`, if that reaches the threshold.
    pub fn record(&self, event: &'static str, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        if !self.on() || ms < self.threshold_ms {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let mut events = self.events();
        let s = events.entry(event).or_default();
        s.max = s.max.max(ms);
        match s.samples.back_mut() {
            Some((t, worst)) if *t == now => *worst = (*worst).max(ms),
            _ => {
                if s.samples.len() == SAMPLES {
                    s.samples.pop_front();
                }
                s.samples.push_back((now, ms));
            }
        }
    }

    /// `LATENCY LATEST`: per event, its latest spike's time and latency, and its worst.
    pub fn latest(&self) -> Reply {
        Reply::Array(
            self.events()
                .iter()
                .filter_map(|(event, s)| {
                    let (t, ms) = s.samples.back()?;
                    Some(Reply::Array(vec![
                        Reply::bulk(*event),
                        Reply::Int(*t),
                        Reply::Int(*ms as i64),
                        Reply::Int(s.max as i64),
                    ]))
                })
                .collect(),
        )
    }

    /// `LATENCY HISTORY event`: its spikes, oldest first, as (time, latency) pairs.
    pub fn history(&self, event: &[u8]) -> Reply {
        let events = self.events();
        let series = events.iter().find(|(e, _)| e.as_bytes() == event);
        Reply::Array(series.map_or_else(Vec::new, |(_, s)| {
            s.samples
                .iter()
                .map(|(t, ms)| Reply::Array(vec![Reply::Int(*t), Reply::Int(*ms as i64)]))
                .collect()
        }))
    }

    /// `LATENCY RESET [event ...]`: forgets the named events (all when none is named); the
    /// count of those forgotten.
    pub fn reset(&self, named: &[Bytes]) -> usize {
        let mut events = self.events();
        let before = events.len();
        events.retain(|e, _| {
            !named.is_empty() && !named.iter().any(|n| n.eq_ignore_ascii_case(e.as_bytes()))
        });
        before - events.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spikes_at_the_threshold_are_kept_per_second_with_the_worst() {
        let m = LatencyMonitor::new(5);
        m.record("command", Duration::from_millis(4));
        assert_eq!(m.latest(), Reply::Array(vec![]), "below the threshold");
        m.record("command", Duration::from_millis(7));
        m.record("command", Duration::from_millis(5));
        let Reply::Array(latest) = m.latest() else {
            panic!()
        };
        let Reply::Array(e) = &latest[0] else {
            panic!()
        };
        assert_eq!(e[0], Reply::bulk("command"));
        // One second (unless the clock ticked between the two): its worst, 7.
        assert!(e[2] == Reply::Int(7) || e[2] == Reply::Int(5));
        assert_eq!(e[3], Reply::Int(7), "the worst of all time");
        let Reply::Array(h) = m.history(b"command") else {
            panic!()
        };
        assert!(!h.is_empty() && h.len() <= 2);
        assert_eq!(m.history(b"fork"), Reply::Array(vec![]));
        m.record("fast-command", Duration::from_millis(9));
        assert_eq!(m.reset(&[Bytes::from_static(b"FAST-COMMAND")]), 1);
        assert_eq!(m.reset(&[]), 1);
        assert_eq!(m.latest(), Reply::Array(vec![]));
        assert!(!LatencyMonitor::new(0).on());
    }
}
