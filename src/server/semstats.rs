//! The per-namespace and per-semaphore figures of `/metrics` (SPEC §11): gauges read from a
//! shard's state when scraped, and each semaphore's wait from park to grant, counted by the
//! shard as it grants. Both are capped (`--metrics-max-semaphores`), busiest first, so that a
//! million semaphores cannot flood the scraper.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Bound;

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
#[derive(Debug, Default, PartialEq)]
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

/// A walk of a shard's state for the `cap` busiest namespaces and semaphores, in steps: each
/// [`Walk::step`] goes over a bounded number of semaphores and says where it stopped, and the
/// next goes on from there, on the state as it then is. The shard serves its clients between
/// steps, so that a scrape of a million semaphores never stalls them (one pass stalled every
/// client of the shard for its whole length). A bounded heap keeps the memory at `cap`
/// semaphores however many there are.
#[derive(Debug)]
pub struct Walk {
    cap: usize,
    sems: BinaryHeap<Ranked>,
    namespaces: Vec<NsGauge>,
    /// The semaphores of the namespaces walked (or being walked) that the scrape may show.
    seen_semaphores: u64,
    /// Where the last step stopped: in this namespace (its gauge so far), after this
    /// semaphore (`None`: before its first).
    at: Option<(NsGauge, Option<Name>)>,
    /// The last namespace walked whole.
    done_with: Option<Name>,
}

impl Walk {
    /// A walk keeping the `cap` busiest.
    pub fn new(cap: usize) -> Walk {
        Walk {
            cap,
            sems: BinaryHeap::with_capacity(cap + 1),
            namespaces: Vec::new(),
            seen_semaphores: 0,
            at: None,
            done_with: None,
        }
    }

    /// Goes over at most `budget` semaphores of `namespaces` from where the last step stopped,
    /// of the namespaces `shown` lets through (a user's key patterns); whether the walk is
    /// over. `waited` tells how long a parked acquire has waited (seconds).
    pub fn step(
        &mut self,
        namespaces: &BTreeMap<Name, Namespace>,
        waited: impl Fn(WaiterId) -> Option<f64>,
        shown: impl Fn(&Name) -> bool,
        mut budget: usize,
    ) -> bool {
        let from = match (&self.at, &self.done_with) {
            (Some((g, _)), _) => Bound::Included(g.ns.clone()),
            (None, Some(ns)) => Bound::Excluded(ns.clone()),
            (None, None) => Bound::Unbounded,
        };
        for (ns_name, ns) in namespaces.range((from, Bound::Unbounded)) {
            // Going on in the namespace it stopped in (unless that one is gone), or starting
            // one, which counts as a semaphore: a million empty ones are a walk too.
            let (mut g, after) = match self.at.take() {
                Some((g, after)) if g.ns == *ns_name => (g, after),
                _ if budget == 0 => return false,
                _ => {
                    budget -= 1;
                    if !shown(ns_name) {
                        self.done_with = Some(ns_name.clone());
                        continue;
                    }
                    self.seen_semaphores += ns.semaphores.len() as u64;
                    let g = NsGauge {
                        ns: ns_name.clone(),
                        semaphores: ns.semaphores.len() as u64,
                        leases: ns.leases.len() as u64,
                        holders: 0,
                        waiters: 0,
                    };
                    (g, None)
                }
            };
            let rest = match &after {
                Some(sem) => ns
                    .semaphores
                    .range((Bound::Excluded(sem), Bound::Unbounded)),
                None => ns.semaphores.range::<Name, _>(..),
            };
            let mut last = after;
            for (name, s) in rest {
                if budget == 0 {
                    self.at = Some((g, last));
                    return false;
                }
                budget -= 1;
                g.holders += s.holders.len() as u64;
                g.waiters += s.queue.len() as u64;
                self.offer(ns_name, name, s, &waited);
                last = Some(name.clone());
            }
            self.done_with = Some(ns_name.clone());
            self.namespaces.push(g);
        }
        true
    }

    /// Keeps semaphore `name` of `ns` if it is among the busiest so far.
    fn offer(
        &mut self,
        ns: &Name,
        name: &Name,
        s: &crate::engine::state::Semaphore,
        waited: &impl Fn(WaiterId) -> Option<f64>,
    ) {
        let rank = (Reverse(s.queue.len() as u64), Reverse(s.active_holds));
        // The heap's top is the least busy kept: one no busier is not built at all.
        if self.sems.len() == self.cap && self.sems.peek().is_none_or(|top| rank >= top.rank()) {
            return;
        }
        let oldest = s.queue.keys().next().and_then(|&id| waited(id));
        self.sems.push(Ranked(SemGauge {
            key: (ns.clone(), name.clone()),
            permits: s.permits,
            active_holds: s.active_holds,
            holders: s.holders.len() as u64,
            waiters: s.queue.len() as u64,
            oldest_wait: oldest.unwrap_or(0.0),
        }));
        if self.sems.len() > self.cap {
            self.sems.pop();
        }
    }

    /// The busiest namespaces and semaphores found, at most `cap` of each, busiest first.
    pub fn finish(self) -> Busiest {
        let mut namespaces = self.namespaces;
        let seen_namespaces = namespaces.len() as u64;
        namespaces.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
        namespaces.truncate(self.cap);
        let mut semaphores: Vec<SemGauge> = self.sems.into_iter().map(|r| r.0).collect();
        semaphores.sort_unstable_by(|a, b| a.rank().cmp(&b.rank()));
        Busiest {
            namespaces,
            semaphores,
            seen_namespaces,
            seen_semaphores: self.seen_semaphores,
        }
    }
}

/// A semaphore in the heap of the busiest, ordered so that the least busy is on top.
#[derive(Debug)]
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

    /// An engine shard run by words, as its clients would.
    struct Eng {
        shard: crate::engine::Shard,
        limits: std::sync::Arc<crate::engine::types::Limits>,
    }

    impl Eng {
        fn run(&mut self, words: &[&str]) -> crate::protocol::Reply {
            use crate::command::{parse_argv, Request};
            let argv: Vec<bytes::Bytes> = words
                .iter()
                .map(|w| bytes::Bytes::copy_from_slice(w.as_bytes()))
                .collect();
            let Request::Engine(r) = parse_argv(&argv, &self.limits).unwrap().1 else {
                panic!("{words:?}: not an engine command");
            };
            match self.shard.execute(1_700_000_000_000_000_000, r, Some(1)) {
                crate::engine::Exec::Reply(reply) => reply,
                crate::engine::Exec::Parked(_) => panic!("{words:?} parked"),
            }
        }
    }

    /// A shard with `n` namespaces of `n` semaphores each (and one empty namespace), their
    /// permits held in varied amounts by one lease per namespace.
    fn shard(n: usize) -> Eng {
        let limits = std::sync::Arc::new(crate::engine::types::Limits::default());
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let shard = crate::engine::Shard::new(limits.clone(), count);
        let mut e = Eng { shard, limits };
        e.run(&["NS.CREATE", "empty"]);
        for i in 0..n {
            let ns = format!("ns{i}");
            e.run(&["NS.CREATE", &ns]);
            let lease = e.run(&["LEASE.CREATE", &ns, "p", "60"]);
            let Some(crate::protocol::Reply::Bulk(lease)) = lease.field("lease_id") else {
                panic!("{lease:?}");
            };
            let lease = String::from_utf8(lease.to_vec()).unwrap();
            for j in 0..n {
                let sem = format!("s{j}");
                e.run(&["SEM.CREATE", &ns, &sem, "100"]);
                let weight = ((i * 7 + j * 13) % 17 + 1).to_string();
                e.run(&["SEM.ACQUIRE", &ns, &sem, &lease, &weight, "0"]);
            }
        }
        e
    }

    #[test]
    fn a_walk_in_steps_finds_what_one_pass_finds() {
        let e = shard(12);
        let state = e.shard.state().0;
        let walk = |budget: usize, cap: usize| {
            let mut w = Walk::new(cap);
            let mut steps = 1;
            while !w.step(state, |_| None, |_| true, budget) {
                steps += 1;
            }
            (w.finish(), steps)
        };
        for cap in [1, 5, 200] {
            let (whole, steps) = walk(usize::MAX, cap);
            assert_eq!(steps, 1);
            assert_eq!(whole.semaphores.len(), cap.min(144));
            assert_eq!(whole.namespaces.len(), cap.min(13));
            assert_eq!((whole.seen_namespaces, whole.seen_semaphores), (13, 144));
            for budget in [1, 2, 7, 12, 13, 50] {
                let (stepped, steps) = walk(budget, cap);
                assert_eq!(stepped, whole, "budget {budget}, cap {cap}");
                // Namespaces count as semaphores: 13 of them and 144 semaphores.
                assert_eq!(steps, (13 + 144usize).div_ceil(budget), "budget {budget}");
            }
        }
        // The busiest first: the most permits held.
        let sems = walk(usize::MAX, 3).0.semaphores;
        assert!(sems
            .windows(2)
            .all(|p| p[0].active_holds >= p[1].active_holds));
        assert_eq!(sems[0].active_holds, 17);
    }

    #[test]
    fn a_walk_shows_only_the_namespaces_let_through_and_counts_only_them() {
        let e = shard(6);
        let mut w = Walk::new(2);
        let shown = |ns: &Name| matches!(ns.as_str(), "ns1" | "ns4");
        while !w.step(e.shard.state().0, |_| None, shown, 5) {}
        let b = w.finish();
        assert_eq!((b.seen_namespaces, b.seen_semaphores), (2, 12));
        assert!(b.namespaces.iter().all(|g| shown(&g.ns)));
        assert_eq!(b.semaphores.len(), 2);
        assert!(b.semaphores.iter().all(|g| shown(&g.key.0)));
    }

    #[test]
    fn a_namespace_gone_between_steps_is_left_out_and_the_walk_goes_on() {
        let mut e = shard(4);
        let mut w = Walk::new(100);
        assert!(!w.step(e.shard.state().0, |_| None, |_| true, 3));
        // The walk stopped inside ns0; it goes away.
        assert!(!e.run(&["NS.DELETE", "ns0"]).is_error());
        while !w.step(e.shard.state().0, |_| None, |_| true, 3) {}
        let Busiest {
            namespaces: ns,
            semaphores: sems,
            ..
        } = w.finish();
        let names: Vec<String> = ns.iter().map(|g| g.ns.to_string()).collect();
        assert!(!names.contains(&"ns0".to_string()), "{names:?}");
        assert_eq!(names.len(), 4, "{names:?}");
        // Every semaphore of the others; of ns0 what was walked before it went (it was so
        // then: a scrape's figures are of the walk's time).
        let others = sems.iter().filter(|g| g.key.0.to_string() != "ns0");
        assert_eq!(others.count(), 12);
        assert!(sems.len() <= 13);
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
