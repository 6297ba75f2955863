//! Typed engine requests: what a validated SEM./NS./LEASE. command asks of its shard.

use bytes::Bytes;

use crate::engine::page::Page;
use crate::engine::types::{LeaseId, Metadata, Name, Nanos, Weight};

/// A validated engine command. Lease ids that are not shaped like one are kept as `None`: such
/// a lease cannot exist, and the engine answers NOTFOUND like for any unknown id.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineRequest {
    /// `NS.CREATE ns [DESC text] [META k v ...]`.
    NsCreate {
        /// Namespace.
        ns: Name,
        /// Description.
        desc: Bytes,
        /// Metadata.
        meta: Metadata,
    },
    /// `NS.GET ns`.
    NsGet {
        /// Namespace.
        ns: Name,
    },
    /// `NS.LIST [CURSOR c] [LIMIT n]`: answered by every shard, merged.
    NsList {
        /// Page.
        page: Page,
    },
    /// `NS.UPDATE ns VERSION expected [DESC text] [META k v ...]`.
    NsUpdate {
        /// Namespace.
        ns: Name,
        /// Expected current version.
        version: i64,
        /// New description.
        desc: Bytes,
        /// New metadata.
        meta: Metadata,
    },
    /// `NS.DELETE ns`.
    NsDelete {
        /// Namespace.
        ns: Name,
    },
    /// `SEM.CREATE ns sem permits [DESC text] [META k v ...]`.
    SemCreate {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
        /// Total permits.
        permits: Weight,
        /// Description.
        desc: Bytes,
        /// Metadata.
        meta: Metadata,
    },
    /// `SEM.GET ns sem`.
    SemGet {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
    },
    /// `SEM.LIST ns [CURSOR c] [LIMIT n]`.
    SemList {
        /// Namespace.
        ns: Name,
        /// Page.
        page: Page,
    },
    /// `SEM.UPDATE ns sem permits VERSION expected [DESC text] [META k v ...]`.
    SemUpdate {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
        /// New total permits.
        permits: Weight,
        /// Expected current version.
        version: i64,
        /// New description.
        desc: Bytes,
        /// New metadata.
        meta: Metadata,
    },
    /// `SEM.DELETE ns sem`.
    SemDelete {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
    },
    /// `SEM.ACQUIRE ns sem lease weight timeout [META k v ...]`.
    SemAcquire {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
        /// Lease.
        lease: Option<LeaseId>,
        /// Permits wanted in all.
        weight: Weight,
        /// How long to wait; 0 never waits.
        timeout: Nanos,
        /// Holder metadata.
        meta: Metadata,
    },
    /// `SEM.RELEASE ns sem lease`.
    SemRelease {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
        /// Lease.
        lease: Option<LeaseId>,
    },
    /// `SEM.HOLDERS ns sem [CURSOR c] [LIMIT n]`.
    SemHolders {
        /// Namespace.
        ns: Name,
        /// Semaphore.
        sem: Name,
        /// Page.
        page: Page,
    },
    /// `LEASE.CREATE ns process_id ttl [META k v ...]`; the id is drawn at the edge.
    LeaseCreate {
        /// Namespace.
        ns: Name,
        /// The new lease's id, from the CSPRNG.
        id: LeaseId,
        /// Owner process, free-form.
        process_id: Bytes,
        /// Time to live.
        ttl: Nanos,
        /// Metadata.
        meta: Metadata,
    },
    /// `LEASE.GET ns lease`.
    LeaseGet {
        /// Namespace.
        ns: Name,
        /// Lease.
        lease: Option<LeaseId>,
    },
    /// `LEASE.LIST ns [PROCESS p] [CURSOR c] [LIMIT n]`.
    LeaseList {
        /// Namespace.
        ns: Name,
        /// Only leases of this process.
        process: Option<Bytes>,
        /// Page.
        page: Page,
    },
    /// `LEASE.REFRESH ns lease ttl`.
    LeaseRefresh {
        /// Namespace.
        ns: Name,
        /// Lease.
        lease: Option<LeaseId>,
        /// New time to live from now.
        ttl: Nanos,
    },
    /// `LEASE.REVOKE ns lease`.
    LeaseRevoke {
        /// Namespace.
        ns: Name,
        /// Lease.
        lease: Option<LeaseId>,
    },
}

impl EngineRequest {
    /// The namespace the request touches (its shard key); `None` for NS.LIST.
    pub fn namespace(&self) -> Option<&Name> {
        use EngineRequest::*;
        match self {
            NsList { .. } => None,
            NsCreate { ns, .. }
            | NsGet { ns }
            | NsUpdate { ns, .. }
            | NsDelete { ns }
            | SemCreate { ns, .. }
            | SemGet { ns, .. }
            | SemList { ns, .. }
            | SemUpdate { ns, .. }
            | SemDelete { ns, .. }
            | SemAcquire { ns, .. }
            | SemRelease { ns, .. }
            | SemHolders { ns, .. }
            | LeaseCreate { ns, .. }
            | LeaseGet { ns, .. }
            | LeaseList { ns, .. }
            | LeaseRefresh { ns, .. }
            | LeaseRevoke { ns, .. } => Some(ns),
        }
    }

    /// Whether the request may park its client (an acquire with a timeout).
    pub fn may_block(&self) -> bool {
        matches!(self, EngineRequest::SemAcquire { timeout, .. } if *timeout > 0)
    }
}
