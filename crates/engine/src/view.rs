//! Entities as replies (SPEC §4 "Replies"): maps with the field names of §1.

use bytes::Bytes;

use super::leases::Lease;
use super::page::{CursorKind, PageOf};
use super::state::{Holder, Namespace, Semaphore, Waiter};
use super::types::{FencingToken, Metadata};
use crate::protocol::Reply;

/// The outcome of an acquire, spelled as the spec's enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The lease now holds the permits.
    Acquired,
    /// Timeout 0 and the permits were not available.
    Unavailable,
    /// Waited the whole timeout.
    TimedOut,
}

impl Outcome {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "ACQUIRE_OUTCOME_ACQUIRED",
            Outcome::Unavailable => "ACQUIRE_OUTCOME_UNAVAILABLE",
            Outcome::TimedOut => "ACQUIRE_OUTCOME_TIMED_OUT",
        }
    }
}

/// Metadata as a map of bulk strings.
pub fn metadata(m: &Metadata) -> Reply {
    Reply::Map(
        m.pairs()
            .iter()
            .map(|(k, v)| (Reply::Bulk(k.clone()), Reply::Bulk(v.clone())))
            .collect(),
    )
}

/// A namespace as NS.CREATE, NS.GET, NS.UPDATE and NS.LIST's entries show it.
pub fn namespace(ns: &Namespace) -> Reply {
    Reply::fields(vec![
        ("name", Reply::Bulk(ns.name.bytes().clone())),
        ("description", Reply::Bulk(ns.description.clone())),
        ("metadata", metadata(&ns.metadata)),
        ("version", Reply::Int(ns.version)),
        ("created_at", Reply::Int(ns.created_at)),
        ("updated_at", Reply::Int(ns.updated_at)),
    ])
}

/// A semaphore as SEM.CREATE, SEM.GET, SEM.UPDATE, SEM.RELEASE, SEM.LIST's entries and the
/// `semaphore` field of an acquire's reply show it.
pub fn semaphore(s: &Semaphore) -> Reply {
    Reply::fields(vec![
        ("name", Reply::Bulk(s.name.bytes().clone())),
        ("description", Reply::Bulk(s.description.clone())),
        ("permits", Reply::Int(s.permits)),
        ("active_holds", Reply::Int(s.active_holds)),
        ("active_holders_count", Reply::Int(s.holders.len() as i64)),
        ("waiters", Reply::Int(s.queue.len() as i64)),
        ("version", Reply::Int(s.version)),
        ("created_at", Reply::Int(s.created_at)),
        ("updated_at", Reply::Int(s.updated_at)),
        ("last_activity_at", Reply::Int(s.last_activity_at)),
        ("metadata", metadata(&s.metadata)),
    ])
}

/// A holder of `lease` (its id, process and `expires_at` are the lease's).
pub fn holder(token: FencingToken, h: &Holder, lease: &Lease) -> Reply {
    Reply::fields(vec![
        ("lease_id", Reply::Bulk(lease.id.to_bytes())),
        (
            "process_id",
            Reply::Bulk(Bytes::copy_from_slice(&lease.process_id)),
        ),
        ("weight", Reply::Int(h.weight)),
        ("locked_at", Reply::Int(h.locked_at)),
        ("expires_at", Reply::Int(lease.expires_at)),
        ("fencing_token", Reply::Int(token)),
        ("metadata", metadata(&h.metadata)),
    ])
}

/// A parked acquire for `lease` (its id and process are the lease's).
pub fn waiter(w: &Waiter, lease: &Lease) -> Reply {
    Reply::fields(vec![
        ("lease_id", Reply::Bulk(lease.id.to_bytes())),
        (
            "process_id",
            Reply::Bulk(Bytes::copy_from_slice(&lease.process_id)),
        ),
        ("weight", Reply::Int(w.weight)),
        ("parked_at", Reply::Int(w.parked_at)),
        ("deadline", Reply::Int(w.deadline)),
        ("client_id", Reply::Int(w.client as i64)),
    ])
}

/// A lease as LEASE.CREATE, LEASE.GET, LEASE.REFRESH and LEASE.LIST's entries show it.
pub fn lease(l: &Lease) -> Reply {
    Reply::fields(vec![
        ("lease_id", Reply::Bulk(l.id.to_bytes())),
        (
            "process_id",
            Reply::Bulk(Bytes::copy_from_slice(&l.process_id)),
        ),
        ("created_at", Reply::Int(l.created_at)),
        ("expires_at", Reply::Int(l.expires_at)),
        ("metadata", metadata(&l.metadata)),
    ])
}

/// An acquire result: outcome, semaphore, and the fencing token when acquired.
pub fn acquire(outcome: Outcome, s: &Semaphore, token: Option<FencingToken>) -> Reply {
    let mut fields = vec![
        ("outcome", Reply::text(outcome.as_str())),
        ("semaphore", semaphore(s)),
    ];
    if let Some(t) = token {
        fields.push(("fencing_token", Reply::Int(t)));
    }
    Reply::fields(fields)
}

/// A SEM.ACQUIREALL result: the outcome, then `holds`, one per semaphore in the order asked,
/// each its semaphore and, when acquired, its fencing token.
pub fn acquire_all<'a>(
    outcome: Outcome,
    holds: impl IntoIterator<Item = (&'a Semaphore, Option<FencingToken>)>,
) -> Reply {
    let holds = holds
        .into_iter()
        .map(|(s, token)| {
            let mut fields = vec![("semaphore", semaphore(s))];
            if let Some(t) = token {
                fields.push(("fencing_token", Reply::Int(t)));
            }
            Reply::fields(fields)
        })
        .collect();
    Reply::fields(vec![
        ("outcome", Reply::text(outcome.as_str())),
        ("holds", Reply::Array(holds)),
    ])
}

/// Whether an acquire reply [`acquire`] built says ACQUIRED (the server's wait-time figures
/// count the grants of parked acquires).
pub fn is_acquired(r: &Reply) -> bool {
    r.field("outcome") == Some(&Reply::text(Outcome::Acquired.as_str()))
}

/// A page: the list under `list`, then `next_cursor` and `previous_cursor` (`""` when none).
pub fn page<K>(
    list: &'static str,
    kind: CursorKind,
    p: PageOf<K, Reply>,
    key: impl Fn(&K) -> Bytes,
) -> Reply {
    use super::page::{Cursor, Dir};
    let cursor = |k: Option<K>, dir: Dir| match k {
        Some(k) => Reply::Bulk(Cursor { dir, key: key(&k) }.encode(kind)),
        None => Reply::text(""),
    };
    Reply::fields(vec![
        (list, Reply::Array(p.items)),
        ("next_cursor", cursor(p.next, Dir::Next)),
        ("previous_cursor", cursor(p.prev, Dir::Prev)),
    ])
}
