//! Cluster mode (SPEC §10, replication.md §4.1): the shard's changes go to the cluster instead
//! of its own log, which it never writes.
//!
//! On the leader the shard evaluates: its engine runs ahead of the committed log, as a single
//! node's runs ahead of its disk, and each pass of [`ShardCtx::replicate_loop`] proposes the
//! records made since the last one as one Raft entry stamped with the shard's `now` (group
//! commit: a few proposals in flight per shard, in order). The replies wait behind the gate
//! until their entry committed; replies that changed nothing wait for the next entry too, which
//! proves the leadership after they were made (linearizable reads at the cost of a write,
//! shared by every reply of the pass).
//!
//! A follower's shard holds no state and serves nothing: the state machine holds every shard's
//! committed state. When its node becomes leader, the shard waits until the term's first entry
//! applied (then the state machine holds every change committed before the term), copies its
//! state out of it, holds its clock at least at the log's last instant, extends every lease
//! alive then to the promotion time plus `--failover-lease-grace` (journaled, so the term's
//! first proposal carries it), and only then serves. When leadership moves, the shard drops its
//! state (changes not known to be committed are not trusted), answers its parked acquires
//! `MOVED` to the new leader (`CLUSTERDOWN` while none is known: they were never granted), and
//! the replies waiting for its proposals `LEADERCHANGED` (proposed, they may have committed),
//! or `TRYAGAIN` (never proposed, or reads that showed only committed changes: nothing
//! happened; [`Answers`]).
//!
//! An idle leader proposes an empty entry every second (shard 0), so that the log's last
//! instant, the floor a new leader's clock starts from, is never more than a second old.
//!
//! A proposal of unknown fate (leadership moved as it was made, or it did not commit within
//! [`WRITE_WAIT`]: a leader cut off from its quorum) may still commit later in the same
//! leadership, after a take-over copied the state machine: the shard therefore serves again
//! only in another leadership, or once every proposal of this one committed or was discarded,
//! and meanwhile, while its node still leads, it asks the follower least behind to take over.

use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use super::{Leading, Parked, ShardCtx};
use crate::cluster::entry::ShardEntry;
use crate::cluster::node::{Handle, Role, WriteError};
use crate::cluster::{LeaderId, LogId};
use crate::command::slot::key_slot;
use crate::engine::types::{Nanos, NANOS_PER_SEC};
use crate::error::Error;
use crate::protocol::Reply;
use crate::server::cluster;
use crate::server::global::Redirecting;

/// How soon a node that leads tries again to take over when the last try failed (no quorum
/// confirmed it yet).
const TAKE_OVER_RETRY: Duration = Duration::from_millis(50);

/// How many proposals of a shard may be in flight at once: while they wait, what the shard does
/// gathers into the next (group commit), and several in flight keep each node's log writer
/// batching.
const IN_FLIGHT: usize = 4;

/// How often an idle leader proposes an empty entry (shard 0 only).
const TICK: Duration = Duration::from_secs(1);

/// How long a proposal may wait to commit before the shard stands by and answers its replies
/// (`LEADERCHANGED`, or `TRYAGAIN` for reads: [`Answers`]; a leader cut off from its quorum).
const WRITE_WAIT: Duration = Duration::from_secs(5);

/// How far ahead of the previous leaders' clocks a node's clock may run and it still lead:
/// further, it would expire leases early by as much (replication.md §4.2).
const MAX_CLOCK_OFFSET: Nanos = 500 * 1_000_000;

/// How old a stamp may be and still tell of the clocks now.
const STAMP_AGE: Duration = Duration::from_secs(10);

/// How often a leader that does not serve (a change of unknown fate, a clock ahead) asks a
/// follower to take over.
const HAND_OVER_RETRY: Duration = Duration::from_secs(1);

/// How long acquires parked on a leader that stood by wait to be sent to the next one: an
/// election begins 0.9-1.2 s after a leader is lost, and may need a second round.
const NEXT_LEADER_WAIT: Duration = Duration::from_secs(2);

impl ShardCtx {
    /// The error every request gets while the shard does not serve (cluster mode, between two
    /// leaderships of this node; dispatch answers `MOVED` once the topology names another).
    pub(super) fn standby_refusal(&self) -> Option<Error> {
        matches!(*self.leading.borrow(), Leading::Standby)
            .then(|| Error::TryAgain("this node is not serving: leadership is moving".into()))
    }

    /// Whether the shard runs in cluster mode.
    pub(super) fn clustered(&self) -> bool {
        !matches!(*self.leading.borrow(), Leading::Alone)
    }

    fn serving_as(&self) -> Option<LeaderId> {
        match &*self.leading.borrow() {
            Leading::Serving(l) => Some(*l),
            Leading::Alone | Leading::Standby => None,
        }
    }

    /// Proposes what the shard did, up to [`IN_FLIGHT`] entries at a time (in order: a later
    /// entry builds on an earlier one), and releases the replies of each once it committed
    /// (commits come in log order, so a commit also settles every proposal before it); a
    /// proposal that fails ends this leadership of the shard.
    pub(super) async fn replicate_loop(self: Rc<Self>, node: Handle) {
        let proposer = node.proposer();
        loop {
            let leader = self.serving_as();
            let proposal = match &leader {
                Some(_) if self.in_flight.get() < IN_FLIGHT => {
                    self.store.borrow_mut().take_proposal()
                }
                _ => None,
            };
            let (Some(leader), Some((records, lsn))) = (leader, proposal) else {
                let woken = tokio::time::timeout(TICK, self.flush_wake.notified()).await;
                if woken.is_err() && self.id == 0 && self.serving_as().is_some() {
                    // Idle: an empty entry, so that the log's last instant (a new leader's
                    // clock floor) stays within a second of this leader's clock.
                    self.store.borrow_mut().note_read();
                }
                continue;
            };
            let entry = ShardEntry {
                shard: self.id as u16,
                now: self.last_now.get(),
                records,
            };
            self.proposed.set(lsn);
            self.in_flight.set(self.in_flight.get() + 1);
            let (ctx, proposer, node) = (self.clone(), proposer.clone(), node.clone());
            tokio::task::spawn_local(async move {
                let write = proposer.write(entry, leader);
                tokio::pin!(write);
                // A leader cut off from its quorum keeps an appended entry pending until
                // leadership moves (openraft's rule): its replies wait at most this long, and
                // the write itself is awaited still, so that the count in flight says when
                // nothing of this leadership is pending any more.
                let written = match tokio::time::timeout(WRITE_WAIT, &mut write).await {
                    Ok(written) => written,
                    Err(_) => {
                        ctx.settle_proposal(&node, leader, lsn, Err(WriteError::Unknown));
                        let _ = write.await;
                        Err(WriteError::Unknown)
                    }
                };
                ctx.in_flight.set(ctx.in_flight.get() - 1);
                ctx.settle_proposal(&node, leader, lsn, written);
                if ctx.in_flight.get() == 0 && ctx.tainted.get() == Some(leader) {
                    // Its proposals all committed or were discarded: a take-over in the same
                    // leadership copies them with the state machine (its linearizable read
                    // waits until they are applied).
                    ctx.tainted.set(None);
                    ctx.leadership_wake.notify_one();
                }
                ctx.flush_wake.notify_one();
            });
        }
    }

    /// What became of the proposal up to `lsn` made as leader `leader`. A commit marks every
    /// LSN up to `lsn` durable, which is right for the proposals before it only if they reached
    /// the log too: one refused before it was appended (`NotLeader`, `NoQuorum`) is answered at
    /// its submission, so its task runs (the shard's tasks run in the order woken) before any
    /// later proposal can have committed, and the stand-by it causes rolls those back as well
    /// (a roll-back outweighs a later durable mark).
    fn settle_proposal(
        self: &Rc<Self>,
        node: &Handle,
        leader: LeaderId,
        lsn: u64,
        written: Result<LogId, WriteError>,
    ) {
        match written {
            Ok(_) => {
                self.store.borrow_mut().committed(lsn);
                self.global.mark_durable(self.id, lsn);
            }
            // Stood by meanwhile (the status said so first): already answered.
            Err(_) if self.serving_as() != Some(leader) => {}
            // Nothing written, and nothing else in flight that might have been.
            Err(WriteError::NotLeader(_) | WriteError::NoQuorum) if self.in_flight.get() == 0 => {
                let saved = self.store.borrow().saved_lsn();
                self.stand_by(node, saved);
            }
            Err(_) => self.stand_by(node, self.proposed.get()),
        }
    }

    /// Serves while this node leads: takes over when it becomes leader, stands by when it no
    /// longer is (or leads in another term), until the node stops.
    pub(super) async fn follow_leadership(self: Rc<Self>, node: Handle) {
        let mut status = node.status();
        loop {
            let (leads, leader) = {
                let s = status.borrow_and_update();
                (s.role == Role::Leader, s.leader_id)
            };
            match self.serving_as() {
                Some(l) if leads && leader.as_ref() == Some(&l) => {}
                Some(_) => self.stand_by(&node, self.proposed.get()),
                None => {
                    if let Some(l) = leader.filter(|_| leads) {
                        if self.tainted.get() == Some(l) {
                            // A proposal of this leadership may still commit behind the copy
                            // a take-over would make: serve again only in another leadership.
                            self.hand_over_now(&node, "a change of unknown fate").await;
                            continue;
                        }
                        if let Some(ahead) = self.clock_ahead(&node) {
                            tracing::error!(
                                shard = self.id,
                                ahead_ms = ahead / 1_000_000,
                                "this node's clock runs ahead of the leaders' before it: it \
                                 refuses to lead (it would expire leases early); fix its clock"
                            );
                            self.hand_over_now(&node, "the clock runs ahead").await;
                            continue;
                        }
                        if !self.take_over(&node, l).await {
                            tokio::time::sleep(TAKE_OVER_RETRY).await;
                            continue;
                        }
                    }
                }
            }
            tokio::select! {
                changed = status.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = self.leadership_wake.notified() => {}
            }
        }
    }

    /// Asks the follower least behind to take over (then waits a moment), `why` this node does
    /// not serve as the leader it is.
    async fn hand_over_now(&self, node: &Handle, why: &str) {
        let to = cluster::successor(&node.status().borrow(), u64::MAX);
        if let Some(to) = to {
            tracing::warn!(shard = self.id, to, "{why}: handing leadership over");
            let _ = node.transfer_leader(to).await;
        }
        tokio::time::sleep(HAND_OVER_RETRY).await;
    }

    /// How far this node's clock runs ahead of the leaders' before it, if further than
    /// [`MAX_CLOCK_OFFSET`] (SPEC §10's clock guard): each append another leader sent,
    /// heartbeats included, says the offset plus its transit to this node, so the least of the
    /// recent ones bounds the offset from above. No recent stamp, no evidence: nothing is
    /// refused.
    fn clock_ahead(&self, node: &Handle) -> Option<Nanos> {
        let me = node.status().borrow().id;
        let wall = self.global.wall_nanos();
        node.recent_stamps()
            .iter()
            .filter(|s| s.leader != me && s.received.elapsed() < STAMP_AGE)
            .map(|s| s.ahead_at(wall))
            .min()
            .filter(|&ahead| ahead > MAX_CLOCK_OFFSET)
    }

    /// Makes the shard serve as leader `leader`: false when that leadership could not be
    /// confirmed (no quorum yet) or is over already.
    async fn take_over(&self, node: &Handle, leader: LeaderId) -> bool {
        // The copy must hold every entry of this node's log that may still commit in this
        // leadership. The linearizable read waits for the term's first entry, so for all before
        // it; a restarted leader does not resume its term (node.rs), and proposals of unknown
        // fate keep the leadership tainted until they resolved. Waiting until everything in the
        // log now is applied holds the rule whatever the path.
        let mut status = node.status();
        let upto = status.borrow().last_index;
        if node.ensure_linearizable().await.is_err() {
            return false;
        }
        let applied = status.wait_for(|s| s.leader_id != Some(leader) || s.applied >= upto);
        match tokio::time::timeout(WRITE_WAIT, applied).await {
            Ok(Ok(s)) if s.role == Role::Leader && s.leader_id == Some(leader) => {}
            _ => return false,
        }
        // A shard that does not serve journals nothing and notes no read.
        debug_assert!(!self.store.borrow().has_pending());
        self.store.borrow_mut().drop_pending();
        let committed = node.committed(self.id);
        self.clock
            .raise_to(committed.floor, self.global.wall_nanos());
        let now = self.now();
        {
            let mut engine = self.engine.borrow_mut();
            engine.roll_back(committed.namespaces, committed.hwm, |_| false);
            let grace = grace_nanos(self.global.config.failover_lease_grace);
            if grace > 0 {
                engine.extend_leases(committed.floor, now.saturating_add(grace));
            }
        }
        tracing::info!(
            shard = self.id,
            grace_s = self.global.config.failover_lease_grace,
            "leading: serving the cluster's committed state"
        );
        *self.leading.borrow_mut() = Leading::Serving(leader);
        self.global.wall().vouch(leader.term);
        self.settle();
        true
    }

    /// Stops serving: the state not known to be committed is dropped, parked acquires are
    /// answered `MOVED` (or `CLUSTERDOWN`), and the replies waiting for proposals up to
    /// `unknown` that may show a change get `LEADERCHANGED`, the others `TRYAGAIN`: a read
    /// that showed only committed changes is safe to send again, and cluster clients do.
    fn stand_by(self: &Rc<Self>, node: &Handle, unknown: u64) {
        let Some(leader) = self.serving_as() else {
            return;
        };
        *self.leading.borrow_mut() = Leading::Standby;
        let (saved, last, first_change) = {
            let mut store = self.store.borrow_mut();
            let first_change = store.first_unsaved_change();
            store.drop_pending();
            (store.saved_lsn(), store.last_lsn(), first_change)
        };
        let floor = saved.max(self.answered.get());
        let answers = Answers::of(floor, unknown, last, first_change);
        if answers.unknown_fate.is_some() {
            self.tainted.set(Some(leader));
        }
        for ((after, upto), error) in answers.ranges() {
            self.global.roll_back(self.id, after, upto, error);
        }
        self.answered.set(last.max(floor));
        let slots: Vec<(u16, Parked)> = {
            let engine = self.engine.borrow();
            let mut parked = self.parked.borrow_mut();
            // Every parked reply has its waiter in the engine; slot 0 is a redirect all the same.
            let slot = |id| {
                engine
                    .waiter_semaphore(id)
                    .map_or(0, |(ns, _)| key_slot(ns.bytes()))
            };
            parked.drain().map(|(id, p)| (slot(id), p)).collect()
        };
        // Counted before the engine drops their waiters: a stopping server waits while either
        // count is above zero (cluster::answer_parked).
        let counted = self.global.redirecting(slots.len());
        self.engine
            .borrow_mut()
            .roll_back(BTreeMap::new(), 0, |_| false);
        tracing::info!(
            shard = self.id,
            parked = slots.len(),
            "leadership moved: the state not known to be committed is dropped"
        );
        if !slots.is_empty() {
            let (ctx, node) = (self.clone(), node.clone());
            tokio::task::spawn_local(send_to_leader(ctx, node, leader, slots, saved, counted));
        }
        self.leadership_wake.notify_one();
    }
}

/// How a stand-by answers the replies waiting on LSNs `(floor, last]` (those up to `floor` are
/// settled: committed, or answered by a stand-by before), each range `(after, upto]`.
#[derive(Debug, PartialEq, Eq)]
struct Answers {
    /// Before the first change of unknown fate: reads that showed only committed changes
    /// (`TRYAGAIN`).
    reads: Option<(u64, u64)>,
    /// From it up to the last proposed: `LEADERCHANGED`, they may have committed.
    unknown_fate: Option<(u64, u64)>,
    /// Never proposed: nothing happened (`TRYAGAIN`).
    unproposed: Option<(u64, u64)>,
}

impl Answers {
    /// For proposals up to `unknown` of unknown fate, the last LSN `last`, and the first change
    /// not known committed `first_change` (a read waits for a proposal of its own when no
    /// change is pending, and shares a pending change's LSN otherwise).
    fn of(floor: u64, unknown: u64, last: u64, first_change: Option<u64>) -> Answers {
        let unknown = unknown.clamp(floor, last.max(floor));
        let reads_upto =
            first_change.map_or(unknown, |f| f.saturating_sub(1).clamp(floor, unknown));
        let range = |after: u64, upto: u64| (upto > after).then_some((after, upto));
        Answers {
            reads: range(floor, reads_upto),
            unknown_fate: range(reads_upto, unknown),
            unproposed: range(unknown, last),
        }
    }

    /// Each range with the error its replies get.
    fn ranges(&self) -> impl Iterator<Item = ((u64, u64), Error)> {
        let nothing = || Error::TryAgain("leadership moved: nothing was changed".into());
        let maybe = || {
            Error::LeaderChanged(
                "leadership moved before this change was known to be committed: it may or may \
                 not have taken effect"
                    .into(),
            )
        };
        [
            self.reads.map(|r| (r, nothing())),
            self.unknown_fate.map(|r| (r, maybe())),
            self.unproposed.map(|r| (r, nothing())),
        ]
        .into_iter()
        .flatten()
    }
}

/// Answers the acquires parked under leadership `was` `MOVED` to the next leader, once one is
/// known (an election takes a second or so; they were waiting anyway), or `CLUSTERDOWN` after
/// [`NEXT_LEADER_WAIT`]. They were never granted: re-sent, they join the new leader's queue.
/// `_counted` keeps a stopping server's Raft running until they are answered.
async fn send_to_leader(
    ctx: Rc<ShardCtx>,
    node: Handle,
    was: LeaderId,
    parked: Vec<(u16, Parked)>,
    lsn: u64,
    _counted: Redirecting,
) {
    let mut status = node.status();
    let known = status.wait_for(|s| s.leader.is_some() && s.leader_id != Some(was));
    let leader = match tokio::time::timeout(NEXT_LEADER_WAIT, known).await {
        Ok(Ok(s)) => s.leader.clone(),
        _ => None,
    };
    for (slot, p) in parked {
        let e = match &leader {
            Some(l) => Error::Moved(format!("{slot} {}", l.client_addr)),
            None => Error::ClusterDown("no leader".into()),
        };
        ctx.answer_parked(p, Reply::Error(e), lsn);
    }
}

/// `--failover-lease-grace` in nanoseconds.
fn grace_nanos(secs: f64) -> Nanos {
    (secs * NANOS_PER_SEC as f64) as Nanos
}

#[cfg(test)]
mod tests {
    use super::Answers;

    #[test]
    fn a_stand_by_answers_reads_before_the_first_unknown_change_tryagain() {
        // Saved up to 10; proposals up to 14 of unknown fate, the first change at 12 (11 a
        // read of its own); 15-16 never proposed.
        assert_eq!(
            Answers::of(10, 14, 16, Some(12)),
            Answers {
                reads: Some((10, 11)),
                unknown_fate: Some((11, 14)),
                unproposed: Some((14, 16)),
            }
        );
        // Reads alone in flight: nothing of unknown fate.
        assert_eq!(
            Answers::of(10, 14, 14, None),
            Answers {
                reads: Some((10, 14)),
                unknown_fate: None,
                unproposed: None,
            }
        );
        // A first change not yet proposed (after `unknown`): the proposals are reads only.
        assert_eq!(
            Answers::of(10, 12, 14, Some(13)),
            Answers {
                reads: Some((10, 12)),
                unknown_fate: None,
                unproposed: Some((12, 14)),
            }
        );
        // The first change right above what is saved: no read before it.
        assert_eq!(Answers::of(10, 12, 12, Some(11)).reads, None);
        // A second stand-by before the leadership's first commit (`saved` and `unknown` still
        // the first's): what the first answered, up to its `last`, is not answered again.
        assert_eq!(
            Answers::of(16, 14, 18, Some(17)),
            Answers {
                reads: None,
                unknown_fate: None,
                unproposed: Some((16, 18)),
            }
        );
        assert_eq!(
            Answers::of(16, 14, 16, None),
            Answers {
                reads: None,
                unknown_fate: None,
                unproposed: None,
            }
        );
    }
}
