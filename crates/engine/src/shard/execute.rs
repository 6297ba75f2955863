//! The one entry point for a request: fire what is due, then run the command's handler.

use super::base::{Exec, Shard};
use super::leases::find_lease;
use super::namespaces::{merge_ns_pages, ns_page_reply};
use crate::protocol::Reply;
use crate::request::EngineRequest;
use crate::state::ClientId;
use crate::types::Nanos;
use crate::view;

impl Shard {
    /// Runs one request at `now`. An acquire may park only for a `client` (none inside MULTI:
    /// acquires never park there).
    pub fn execute(&mut self, now: Nanos, req: EngineRequest, client: Option<ClientId>) -> Exec {
        self.advance(now);
        use EngineRequest as R;
        let result = match req {
            R::NsCreate(r) => self.ns_create(now, r),
            R::NsGet(r) => self.ns(&r.ns).map(view::namespace),
            R::NsList(r) => {
                let part = self.ns_list_part(&r.page);
                Ok(ns_page_reply(merge_ns_pages(vec![part], &r.page)))
            }
            R::NsUpdate(r) => self.ns_update(now, r),
            R::NsDelete(r) => Ok(self.ns_delete(&r.ns)),
            R::SemCreate(r) => self.sem_create(now, r),
            R::SemGet(r) => self.sem(&r.ns, &r.sem).map(view::semaphore),
            R::SemList(r) => self.sem_list(&r.ns, &r.page),
            R::SemUpdate(r) => self.sem_update(now, r),
            R::SemDelete(r) => self.sem_delete(now, &r.ns, &r.sem),
            R::SemAcquire(r) => {
                return match self.acquire(now, r, client) {
                    Ok(exec) => exec,
                    Err(e) => Exec::Reply(Reply::Error(e)),
                };
            }
            R::SemAcquireAll(r) => {
                return match self.acquire_all(now, r, client) {
                    Ok(exec) => exec,
                    Err(e) => Exec::Reply(Reply::Error(e)),
                };
            }
            R::SemRelease(r) => self.release(now, r),
            R::SemHolders(r) => self.holders(&r.ns, &r.sem, &r.page),
            R::SemWaiters(r) => self.waiters(&r.ns, &r.sem, &r.page),
            R::LeaseCreate(r) => self.lease_create(now, r),
            R::LeaseGet(r) => self
                .ns(&r.ns)
                .and_then(|n| find_lease(n, r.lease))
                .map(view::lease),
            R::LeaseList(r) => self.lease_list(r),
            R::LeaseRefresh(r) => self.lease_refresh(now, r),
            R::LeaseRevoke(r) => self.lease_revoke(now, r),
        };
        Exec::Reply(result.into())
    }
}
