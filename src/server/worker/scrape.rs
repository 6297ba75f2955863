//! A shard's part of a `/metrics` scrape: its INFO figures, and its busiest namespaces and
//! semaphores found by a walk of its state in steps ([`Walk`]), the shard serving its clients
//! between two. One pass over a million semaphores took the shard from its clients for as long
//! as it ran: four scrape loops pushed PING's p99 to 0.3-1.4 s (the hostile pass).

use std::rc::Rc;
use std::sync::Arc;

use tokio::sync::oneshot;

use super::ShardCtx;
use crate::engine::types::Name;
use crate::server::acl::User;
use crate::server::msg::ShardMetrics;
use crate::server::semstats::Walk;

/// The semaphores (or namespaces) one step of the walk goes over: some 0.1-0.3 ms, which is
/// what a client of the shard may wait behind it.
const STEP: usize = 2048;

impl ShardCtx {
    /// Answers a scrape once its walk is over: of the namespaces `visible_to`'s key patterns
    /// allow (`None`: all).
    pub(super) async fn scrape(
        self: Rc<Self>,
        cap: usize,
        visible_to: Option<Arc<User>>,
        reply: oneshot::Sender<ShardMetrics>,
    ) {
        let shown = |ns: &Name| visible_to.as_ref().is_none_or(|u| u.can_access(ns.bytes()));
        let info = self.info_part(self.now(), true);
        self.settle();
        let mut walk = Walk::new(cap);
        loop {
            let over = {
                let engine = self.engine.borrow();
                let parked = self.parked.borrow();
                let waited = |id| parked.get(&id).map(|p| p.since.elapsed().as_secs_f64());
                walk.step(engine.state().0, waited, shown, STEP)
            };
            if over {
                break;
            }
            tokio::task::yield_now().await;
        }
        let busiest = walk.finish();
        let waits = self.waits.borrow().busiest(cap, shown);
        let _ = reply.send(ShardMetrics {
            info,
            busiest,
            waits,
        });
    }
}
