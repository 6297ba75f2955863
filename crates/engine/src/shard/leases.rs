//! LEASE.* commands.

use bytes::Bytes;

use super::base::{lease_missing, lease_ref, ns_mut, number_cursor, Shard};
use super::queue::{drop_lease, serve_many};
use crate::error::Error;
use crate::journal;
use crate::leases::{Holds, Lease, LeaseRef};
use crate::page::{take_page, CursorKind};
use crate::process_id::ProcessId;
use crate::protocol::Reply;
use crate::request::{LeaseCreate, LeaseList, LeaseRefresh, LeaseRevoke};
use crate::state::Namespace;
use crate::types::{LeaseId, Nanos};
use crate::view;

impl Shard {
    pub(super) fn lease_create(&mut self, now: Nanos, req: LeaseCreate) -> Result<Reply, Error> {
        let LeaseCreate {
            ns,
            id,
            process_id,
            ttl,
            meta,
        } = req;
        let max = self.cx.limits.max_leases_per_namespace;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        if n.leases.len() >= max {
            return Err(Error::ResourceExhausted(format!(
                "lease quota reached in namespace '{ns}' ({max} leases)"
            )));
        }
        if n.leases.find(&id).is_some() {
            // 166 random bits: only a broken random source gets here.
            return Err(Error::AlreadyExists("lease id collision, retry".into()));
        }
        let serial = n.leases.take_serial();
        let expires_at = now.saturating_add(ttl);
        let lease = Lease {
            id,
            serial,
            process_id: ProcessId::new(&process_id),
            created_at: now,
            expires_at,
            metadata: meta,
            holds: Holds::None,
        };
        let reply = view::lease(&lease);
        self.cx.journal.push(journal::lease_put(&n.name, &lease));
        let (key, r) = (n.key, n.leases.insert(lease));
        self.add_lease_timer(expires_at, key, r);
        Ok(reply)
    }

    pub(super) fn lease_list(&self, req: LeaseList) -> Result<Reply, Error> {
        let LeaseList { ns, process, page } = req;
        let n = self.ns(&ns)?;
        let from = number_cursor(&page)?.map(|(dir, serial)| (dir, serial as u64));
        let keep = |r: &LeaseRef| match &process {
            Some(p) => n.leases[*r].process_id[..] == p[..],
            None => true,
        };
        let p = take_page(n.leases.order(), from, page.limit, keep, |_, r| {
            view::lease(&n.leases[*r])
        });
        Ok(view::page("leases", CursorKind::Leases, p, |s| {
            Bytes::copy_from_slice(&s.to_be_bytes())
        }))
    }

    pub(super) fn lease_refresh(&mut self, now: Nanos, req: LeaseRefresh) -> Result<Reply, Error> {
        let LeaseRefresh { ns, lease, ttl } = req;
        let n = ns_mut(&mut self.namespaces, &ns)?;
        let r = lease_ref(&n.leases, &ns, lease)?;
        let l = &mut n.leases[r];
        let before = l.expires_at;
        l.expires_at = now.saturating_add(ttl);
        self.cx.journal.push(journal::lease_put(&n.name, l));
        let (reply, at, key) = (view::lease(l), l.expires_at, n.key);
        // The old expiry entry stays behind, stale.
        if at != before {
            self.add_lease_timer(at, key, r);
        }
        Ok(reply)
    }

    /// LEASE.REVOKE: every hold of the lease goes (the queues it held are served), its parked
    /// acquires end NOTFOUND.
    pub(super) fn lease_revoke(&mut self, now: Nanos, req: LeaseRevoke) -> Result<Reply, Error> {
        let n = ns_mut(&mut self.namespaces, &req.ns)?;
        let r = lease_ref(&n.leases, &req.ns, req.lease)?;
        let touched = drop_lease(n, r, &mut self.cx);
        serve_many(n, touched, now, &mut self.cx);
        Ok(Reply::OK)
    }
}

/// Live lease `lease` of namespace `n`.
pub(super) fn find_lease(n: &Namespace, lease: Option<LeaseId>) -> Result<&Lease, Error> {
    lease
        .and_then(|id| n.leases.by_id(&id))
        .ok_or_else(|| lease_missing(&n.name))
}
