//! What a validated SEM./NS./LEASE. command asks of its shard: one struct per command, built by
//! `command::parse` once the words are checked, and run by [`super::Shard::execute`].
//!
//! Lease ids that are not shaped like one are kept as `None`: such a lease cannot exist, and the
//! engine answers NOTFOUND as for any unknown id. Fields are named as the command's arguments
//! (docs/commands.md); each struct's doc says what is not plain from the name.

use bytes::Bytes;

use super::page::Page;
use super::types::{LeaseId, Metadata, Name, Nanos, Weight};

/// A validated engine command.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum EngineRequest {
    NsCreate(NsCreate),
    NsGet(NsGet),
    NsList(NsList),
    NsUpdate(NsUpdate),
    NsDelete(NsDelete),
    SemCreate(SemCreate),
    SemGet(SemGet),
    SemList(SemList),
    SemUpdate(SemUpdate),
    SemDelete(SemDelete),
    SemAcquire(SemAcquire),
    SemAcquireAll(SemAcquireAll),
    SemRelease(SemRelease),
    SemHolders(SemHolders),
    SemWaiters(SemWaiters),
    LeaseCreate(LeaseCreate),
    LeaseGet(LeaseGet),
    LeaseList(LeaseList),
    LeaseRefresh(LeaseRefresh),
    LeaseRevoke(LeaseRevoke),
}

/// `NS.CREATE ns [DESC text] [META k v ...]`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct NsCreate {
    pub ns: Name,
    pub desc: Bytes,
    pub meta: Metadata,
}

/// `NS.GET ns`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct NsGet {
    pub ns: Name,
}

/// `NS.LIST [CURSOR c] [LIMIT n]`: every shard answers its part, and the caller merges them.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct NsList {
    pub page: Page,
}

/// `NS.UPDATE ns VERSION expected [DESC text] [META k v ...]`: replaces the description and
/// the metadata if `version` is the current one.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct NsUpdate {
    pub ns: Name,
    pub version: i64,
    pub desc: Bytes,
    pub meta: Metadata,
}

/// `NS.DELETE ns`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct NsDelete {
    pub ns: Name,
}

/// `SEM.CREATE ns sem permits [DESC text] [META k v ...]`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemCreate {
    pub ns: Name,
    pub sem: Name,
    pub permits: Weight,
    pub desc: Bytes,
    pub meta: Metadata,
}

/// `SEM.GET ns sem`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemGet {
    pub ns: Name,
    pub sem: Name,
}

/// `SEM.LIST ns [CURSOR c] [LIMIT n]`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemList {
    pub ns: Name,
    pub page: Page,
}

/// `SEM.UPDATE ns sem permits VERSION expected [DESC text] [META k v ...]`: sets the total
/// permits, description and metadata if `version` is the current one.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemUpdate {
    pub ns: Name,
    pub sem: Name,
    pub permits: Weight,
    pub version: i64,
    pub desc: Bytes,
    pub meta: Metadata,
}

/// `SEM.DELETE ns sem`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemDelete {
    pub ns: Name,
    pub sem: Name,
}

/// `SEM.ACQUIRE ns sem lease weight timeout [META k v ...]`: `weight` is what the lease is to
/// hold in all (a re-acquire changes its hold), `timeout` how long to wait (0: never waits),
/// `meta` the holder's metadata.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemAcquire {
    pub ns: Name,
    pub sem: Name,
    pub lease: Option<LeaseId>,
    pub weight: Weight,
    pub timeout: Nanos,
    pub meta: Metadata,
}

/// The most semaphores one SEM.ACQUIREALL may ask for (SPEC §12).
pub const MAX_ACQUIRE_ALL: usize = 16;

/// `SEM.ACQUIREALL ns lease timeout sem weight [sem weight ...] [META k v ...]`: each of
/// `parts` as a SEM.ACQUIRE would take it, all or none, under one wait; `meta` goes to every
/// hold. `parts` holds 1 to [`MAX_ACQUIRE_ALL`] distinct semaphores, in the order asked.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemAcquireAll {
    pub ns: Name,
    pub lease: Option<LeaseId>,
    pub timeout: Nanos,
    pub parts: Vec<Part>,
    pub meta: Metadata,
}

/// One semaphore of a SEM.ACQUIREALL and the weight the lease is to hold on it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct Part {
    pub sem: Name,
    pub weight: Weight,
}

/// `SEM.RELEASE ns sem lease`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemRelease {
    pub ns: Name,
    pub sem: Name,
    pub lease: Option<LeaseId>,
}

/// `SEM.HOLDERS ns sem [CURSOR c] [LIMIT n]`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemHolders {
    pub ns: Name,
    pub sem: Name,
    pub page: Page,
}

/// `SEM.WAITERS ns sem [CURSOR c] [LIMIT n]`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct SemWaiters {
    pub ns: Name,
    pub sem: Name,
    pub page: Page,
}

/// `LEASE.CREATE ns process_id ttl [META k v ...]`. The id is drawn from the CSPRNG at the
/// edge, so that the engine stays deterministic and the journal records it.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct LeaseCreate {
    pub ns: Name,
    pub id: LeaseId,
    pub process_id: Bytes,
    pub ttl: Nanos,
    pub meta: Metadata,
}

/// `LEASE.GET ns lease`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct LeaseGet {
    pub ns: Name,
    pub lease: Option<LeaseId>,
}

/// `LEASE.LIST ns [PROCESS p] [CURSOR c] [LIMIT n]`: `process` keeps only that process's
/// leases.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct LeaseList {
    pub ns: Name,
    pub process: Option<Bytes>,
    pub page: Page,
}

/// `LEASE.REFRESH ns lease ttl`: the lease then lives until now + `ttl`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct LeaseRefresh {
    pub ns: Name,
    pub lease: Option<LeaseId>,
    pub ttl: Nanos,
}

/// `LEASE.REVOKE ns lease`.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub struct LeaseRevoke {
    pub ns: Name,
    pub lease: Option<LeaseId>,
}

impl EngineRequest {
    /// The namespace the request touches (its shard key); `None` for NS.LIST, which every shard
    /// answers.
    pub fn namespace(&self) -> Option<&Name> {
        use EngineRequest as R;
        Some(match self {
            R::NsList(_) => return None,
            R::NsCreate(r) => &r.ns,
            R::NsGet(r) => &r.ns,
            R::NsUpdate(r) => &r.ns,
            R::NsDelete(r) => &r.ns,
            R::SemCreate(r) => &r.ns,
            R::SemGet(r) => &r.ns,
            R::SemList(r) => &r.ns,
            R::SemUpdate(r) => &r.ns,
            R::SemDelete(r) => &r.ns,
            R::SemAcquire(r) => &r.ns,
            R::SemAcquireAll(r) => &r.ns,
            R::SemRelease(r) => &r.ns,
            R::SemHolders(r) => &r.ns,
            R::SemWaiters(r) => &r.ns,
            R::LeaseCreate(r) => &r.ns,
            R::LeaseGet(r) => &r.ns,
            R::LeaseList(r) => &r.ns,
            R::LeaseRefresh(r) => &r.ns,
            R::LeaseRevoke(r) => &r.ns,
        })
    }

    /// Whether the request is one of the commands that change state (the command table's
    /// `write` flag): refused as a whole, whatever it would do, while changes cannot be saved,
    /// as Redis refuses every write command then (even a `DEL` of a missing key).
    pub fn is_write(&self) -> bool {
        use EngineRequest as R;
        match self {
            R::NsCreate(_)
            | R::NsUpdate(_)
            | R::NsDelete(_)
            | R::SemCreate(_)
            | R::SemUpdate(_)
            | R::SemDelete(_)
            | R::SemAcquire(_)
            | R::SemAcquireAll(_)
            | R::SemRelease(_)
            | R::LeaseCreate(_)
            | R::LeaseRefresh(_)
            | R::LeaseRevoke(_) => true,
            R::NsGet(_)
            | R::NsList(_)
            | R::SemGet(_)
            | R::SemList(_)
            | R::SemHolders(_)
            | R::SemWaiters(_)
            | R::LeaseGet(_)
            | R::LeaseList(_) => false,
        }
    }

    /// Whether the request may park its client (an acquire with a timeout).
    pub fn may_block(&self) -> bool {
        use EngineRequest as R;
        match self {
            R::SemAcquire(r) => r.timeout > 0,
            R::SemAcquireAll(r) => r.timeout > 0,
            R::NsCreate(_)
            | R::NsGet(_)
            | R::NsList(_)
            | R::NsUpdate(_)
            | R::NsDelete(_)
            | R::SemCreate(_)
            | R::SemGet(_)
            | R::SemList(_)
            | R::SemUpdate(_)
            | R::SemDelete(_)
            | R::SemRelease(_)
            | R::SemHolders(_)
            | R::SemWaiters(_)
            | R::LeaseCreate(_)
            | R::LeaseGet(_)
            | R::LeaseList(_)
            | R::LeaseRefresh(_)
            | R::LeaseRevoke(_) => false,
        }
    }
}
