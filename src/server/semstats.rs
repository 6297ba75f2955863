//! The per-namespace and per-semaphore figures of `/metrics` (SPEC §11): gauges read from a
//! shard's state when scraped, and each semaphore's wait from park to grant, counted by the
//! shard as it grants. Both are capped (`--metrics-max-semaphores`), busiest first, so that a
//! million semaphores cannot flood the scraper.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::engine::room::FastMap;
use crate::engine::state::Namespace;
use crate::engine::types::Name;
use crate::engine::WaiterId;

/// Upper bounds (seconds) of the wait histogram's buckets: from a millisecond to the longest
/// acquire timeout (300 s).
pub const WAIT_BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A semaphore, by namespace and name.
pub type SemKey = (Name, Name);

/// One semaphore's waits from park to grant.
#[derive(Debug, Clone, Default)]
pub struct WaitHist {
    /// Per bucket of [`WAIT_BUCKETS`], then above the last one (not cumulative).
    pub counts: [u64; WAIT_BUCKETS.len() + 1],
    /// Seconds waited in total.
    pub sum: f64,
    /// Grants counted.
    pub count: u64,
    /// When this semaphore last granted a waiter (the shard's grant sequence): the ones that
    /// have not for longest are dropped first when there are too many.
    last: u64,
}

impl WaitHist {
    fn observe(&mut self, secs: f64, seq: u64) {
        self.counts[WAIT_BUCKETS.partition_point(|&b| b < secs)] += 1;
        self.sum += secs;
        self.count += 1;
        self.last = seq;
    }

    /// (upper bound, count) per bucket, `f64::MAX` standing for +Inf, as prometheus-client's
    /// encoder takes them.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        WAIT_BUCKETS
            .iter()
            .copied()
            .chain([f64::MAX])
            .zip(self.counts)
            .collect()
    }
}

/// A shard's wait histograms, for at most twice the cap of semaphores at a time.
#[derive(Debug, Default)]
pub struct Waits {
    by_sem: FastMap<SemKey, WaitHist>,
    seq: u64,
}

impl Waits {
    /// Counts a grant on `sem` after `secs` of waiting; past `2 * cap` semaphores, keeps the
    /// `cap` that granted last (once per `cap` new semaphores: the cost is spread).
    pub fn observe(&mut self, sem: &SemKey, secs: f64, cap: usize) {
        self.seq += 1;
        match self.by_sem.get_mut(sem) {
            Some(h) => h.observe(secs, self.seq),
            None => {
                let mut h = WaitHist::default();
                h.observe(secs, self.seq);
                self.by_sem.insert(sem.clone(), h);
                if self.by_sem.len() > 2 * cap.max(1) {
                    let mut lasts: Vec<u64> = self.by_sem.values().map(|h| h.last).collect();
                    let at = lasts.len() - cap.max(1);
                    let (_, &mut cut, _) = lasts.select_nth_unstable(at);
                    self.by_sem.retain(|_, h| h.last >= cut);
                }
            }
        }
    }

    /// The `cap` semaphores that granted most waiters, of the namespaces `shown` lets through.
    pub fn busiest(&self, cap: usize, shown: impl Fn(&Name) -> bool) -> Vec<(SemKey, WaitHist)> {
        let mut v: Vec<_> = self.by_sem.iter().filter(|(k, _)| shown(&k.0)).collect();
        v.sort_unstable_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(b.0)));
        v.into_iter()
            .take(cap)
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect()
    }
}

/// One semaphore's gauges.
#[derive(Debug, Clone, PartialEq)]
pub struct SemGauge {
    /// Namespace, semaphore.
    pub key: SemKey,
    /// The permits it has (SEM.GET's `permits`).
    pub permits: i64,
    /// The permits held, the sum of its holders' weights (SEM.GET's `active_holds`).
    pub active_holds: i64,
    /// How many leases hold some of it (SEM.GET's `active_holders_count`).
    pub holders: u64,
    /// Parked acquires.
    pub waiters: u64,
    /// Seconds the oldest parked acquire has waited (0 with none).
    pub oldest_wait: f64,
}

impl SemGauge {
    /// Busiest first: most waiters, then most permits held, then by name.
    pub fn rank(&self) -> (Reverse<u64>, Reverse<i64>, &SemKey) {
        (Reverse(self.waiters), Reverse(self.active_holds), &self.key)
    }
}

/// One namespace's counts.
#[derive(Debug, Clone, PartialEq)]
pub struct NsGauge {
    /// The namespace.
    pub ns: Name,
    /// How many semaphores it has.
    pub semaphores: u64,
    /// Live leases.
    pub leases: u64,
    /// Holders of its semaphores.
    pub holders: u64,
    /// Parked acquires on its semaphores.
    pub waiters: u64,
}

impl NsGauge {
    /// Busiest first: most waiters, then holders, then leases, then by name.
    pub fn rank(&self) -> (Reverse<u64>, Reverse<u64>, Reverse<u64>, &Name) {
        (
            Reverse(self.waiters),
            Reverse(self.holders),
            Reverse(self.leases),
            &self.ns,
        )
    }
}

/// A shard's busiest namespaces and semaphores, of those a scrape may show.
#[derive(Debug, Default)]
pub struct Busiest {
    /// The busiest namespaces, at most the cap.
    pub namespaces: Vec<NsGauge>,
    /// The busiest semaphores, at most the cap.
    pub semaphores: Vec<SemGauge>,
    /// How many namespaces the scrape may show, the cap aside.
    pub seen_namespaces: u64,
    /// How many semaphores the scrape may show, the cap aside.
    pub seen_semaphores: u64,
}

/// The `cap` busiest namespaces and semaphores of a shard's state, of the namespaces `shown`
/// lets through (a user's key patterns); `waited` tells how long a parked acquire has waited
/// (seconds). A bounded heap keeps the memory at `cap` entries however many semaphores there
/// are.
pub fn busiest(
    namespaces: &BTreeMap<Name, Namespace>,
    waited: impl Fn(WaiterId) -> Option<f64>,
    cap: usize,
    shown: impl Fn(&Name) -> bool,
) -> Busiest {
    let mut ns_out = Vec::new();
    let mut seen_semaphores = 0;
    let mut sems: BinaryHeap<Ranked> = BinaryHeap::with_capacity(cap + 1);
    for (ns_name, ns) in namespaces.iter().filter(|(n, _)| shown(n)) {
        seen_semaphores += ns.semaphores.len() as u64;
        let mut g = NsGauge {
            ns: ns_name.clone(),
            semaphores: ns.semaphores.len() as u64,
            leases: ns.leases.len() as u64,
            holders: 0,
            waiters: 0,
        };
        for (name, s) in &ns.semaphores {
            g.holders += s.holders.len() as u64;
            g.waiters += s.queue.len() as u64;
            let rank = (Reverse(s.queue.len() as u64), Reverse(s.active_holds));
            // The heap's top is the least busy kept: one no busier is not built at all.
            if sems.len() == cap && sems.peek().is_none_or(|top| rank >= top.rank()) {
                continue;
            }
            let oldest = s.queue.keys().next().and_then(|&id| waited(id));
            sems.push(Ranked(SemGauge {
                key: (ns_name.clone(), name.clone()),
                permits: s.permits,
                active_holds: s.active_holds,
                holders: s.holders.len() as u64,
                waiters: s.queue.len() as u64,
                oldest_wait: oldest.unwrap_or(0.0),
            }));
            if sems.len() > cap {
                sems.pop();
            }
        }
        ns_out.push(g);
    }
    let seen_namespaces = ns_out.len() as u64;
    ns_out.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
    ns_out.truncate(cap);
    let mut sem_out: Vec<SemGauge> = sems.into_iter().map(|r| r.0).collect();
    sem_out.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
    Busiest {
        namespaces: ns_out,
        semaphores: sem_out,
        seen_namespaces,
        seen_semaphores,
    }
}

/// A semaphore in the heap of the busiest, ordered so that the least busy is on top.
struct Ranked(SemGauge);

impl Ranked {
    /// The inverse of busy: larger is less busy.
    fn rank(&self) -> (Reverse<u64>, Reverse<i64>) {
        (Reverse(self.0.waiters), Reverse(self.0.active_holds))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.0.rank() == other.0.rank()
    }
}

impl Eq for Ranked {}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.rank().cmp(&other.0.rank())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, sem: &str) -> SemKey {
        let n = |s: &str| Name::new_unchecked(bytes::Bytes::copy_from_slice(s.as_bytes()));
        (n(ns), n(sem))
    }

    #[test]
    fn a_wait_lands_in_the_first_bucket_at_or_above_it() {
        let mut w = Waits::default();
        w.observe(&key("a", "s"), 0.003, 10);
        w.observe(&key("a", "s"), 0.005, 10);
        w.observe(&key("a", "s"), 400.0, 10);
        let (_, h) = &w.busiest(10, |_| true)[0];
        let b = h.buckets();
        assert_eq!(b[1], (0.005, 2));
        assert_eq!(*b.last().unwrap(), (f64::MAX, 1));
        assert_eq!(h.count, 3);
        assert!((h.sum - 400.008).abs() < 1e-9);
    }

    #[test]
    fn too_many_semaphores_keep_those_that_granted_last() {
        let mut w = Waits::default();
        for i in 0..5 {
            w.observe(&key("a", &format!("s{i}")), 1.0, 2);
        }
        // Past 2 * 2 semaphores, the 2 that granted last stay.
        let kept: Vec<_> = w
            .busiest(10, |_| true)
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.contains(&key("a", "s3")) && kept.contains(&key("a", "s4")));
    }
}
