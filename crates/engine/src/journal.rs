//! State-change records: what the engine journals for durability, and how replay applies them.
//!
//! A record states a result ("this holder now has weight 3 and token 17"), never a command to
//! re-run, so replay needs no clock and gives the same state every time.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::leases::{Holds, Lease};
use super::process_id::ProcessId;
use super::state::{Namespace, Semaphore};
use super::types::{FencingToken, LeaseId, Metadata, Name, Nanos, Weight};

/// One state change. Its names and values are the state's own copies, never slices of the
/// request: the Raft log keeps records in memory until a snapshot, and a request's slice
/// pins the connection's whole read buffer (a leader grew by 100 MB/s at P=1 that way).
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Record {
    /// A namespace was created or updated (all its own fields).
    NsPut {
        name: Name,
        description: Bytes,
        metadata: Metadata,
        version: i64,
        created_at: Nanos,
        updated_at: Nanos,
    },
    /// A namespace and all inside it were deleted.
    NsDel { name: Name },
    /// A semaphore was created or updated (its own fields; holders unchanged).
    SemPut {
        ns: Name,
        name: Name,
        description: Bytes,
        metadata: Metadata,
        permits: Weight,
        version: i64,
        created_at: Nanos,
        updated_at: Nanos,
        last_activity_at: Nanos,
    },
    /// A semaphore and its holders were deleted.
    SemDel { ns: Name, name: Name },
    /// A lease was created or refreshed.
    LeasePut {
        ns: Name,
        id: LeaseId,
        serial: u64,
        process_id: Bytes,
        created_at: Nanos,
        expires_at: Nanos,
        metadata: Metadata,
    },
    /// A lease ended (revoked or expired), with all its holds.
    LeaseDel { ns: Name, id: LeaseId },
    /// A lease's hold on a semaphore was set (new or changed).
    HoldSet {
        ns: Name,
        sem: Name,
        lease: LeaseId,
        weight: Weight,
        token: FencingToken,
        /// First acquisition time.
        locked_at: Nanos,
        metadata: Metadata,
        /// The semaphore's last_activity_at after the change.
        at: Nanos,
    },
    /// A lease's hold on a semaphore was released.
    HoldDel {
        ns: Name,
        sem: Name,
        lease: LeaseId,
        /// The semaphore's last_activity_at after the change.
        at: Nanos,
    },
    /// A semaphore's last_activity_at moved without a hold changing (an acquire that did not
    /// get permits at once).
    Touch {
        ns: Name,
        sem: Name,
        /// New last_activity_at.
        at: Nanos,
    },
    /// The wall clock stepped forward `by` at `at` (an NTP step, a VM resumed): every lease of
    /// the shard dies `by` later, so that the step expires none of them. One record for the
    /// whole shard, however many leases it holds.
    TimeShift { by: Nanos, at: Nanos },
}

/// Hands `out` the records that rebuild the current state of `n`, one at a time (a snapshot
/// never holds them all at once).
pub fn namespace_records(n: &Namespace, out: &mut impl FnMut(Record)) {
    out(ns_put(n));
    for (_, l) in n.leases.iter() {
        out(lease_put(&n.name, l));
    }
    for s in n.semaphores.values() {
        out(sem_put(&n.name, s));
        for h in s.holders.iter() {
            out(Record::HoldSet {
                ns: n.name.clone(),
                sem: s.name.clone(),
                lease: n.leases[h.lease].id,
                weight: h.weight,
                token: h.token,
                locked_at: h.locked_at,
                metadata: h.metadata.clone(),
                at: s.last_activity_at,
            });
        }
    }
}

/// The NsPut record of a namespace's own fields.
pub fn ns_put(n: &Namespace) -> Record {
    Record::NsPut {
        name: n.name.clone(),
        description: n.description.clone(),
        metadata: n.metadata.clone(),
        version: n.version,
        created_at: n.created_at,
        updated_at: n.updated_at,
    }
}

/// The SemPut record of a semaphore's current fields.
pub fn sem_put(ns: &Name, s: &Semaphore) -> Record {
    Record::SemPut {
        ns: ns.clone(),
        name: s.name.clone(),
        description: s.description.clone(),
        metadata: s.metadata.clone(),
        permits: s.permits,
        version: s.version,
        created_at: s.created_at,
        updated_at: s.updated_at,
        last_activity_at: s.last_activity_at,
    }
}

/// The LeasePut record of a lease's current fields.
pub fn lease_put(ns: &Name, l: &Lease) -> Record {
    Record::LeasePut {
        ns: ns.clone(),
        id: l.id,
        serial: l.serial,
        process_id: Bytes::copy_from_slice(&l.process_id),
        created_at: l.created_at,
        expires_at: l.expires_at,
        metadata: l.metadata.clone(),
    }
}

/// Why a record could not be applied: the log disagrees with itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayError(pub String);

/// Applies one record to a shard's namespaces; `hwm` tracks the highest fencing token seen.
pub fn apply(
    nss: &mut BTreeMap<Name, Namespace>,
    hwm: &mut FencingToken,
    rec: Record,
) -> Result<(), ReplayError> {
    let missing = |what: &str| ReplayError(format!("record refers to a missing {what}"));
    match rec {
        Record::NsPut {
            name,
            description,
            metadata,
            version,
            created_at,
            updated_at,
        } => {
            let n = nss.entry(name.clone()).or_insert_with(|| {
                Namespace::new(name, Bytes::new(), Metadata::default(), created_at)
            });
            n.description = description;
            n.metadata = metadata;
            n.version = version;
            n.created_at = created_at;
            n.updated_at = updated_at;
        }
        Record::NsDel { name } => {
            nss.remove(&name);
        }
        Record::SemPut {
            ns,
            name,
            description,
            metadata,
            permits,
            version,
            created_at,
            updated_at,
            last_activity_at,
        } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            let s = if n.semaphores.contains_key(&name) {
                n.semaphores.get_mut(&name).expect("just checked")
            } else {
                let new =
                    Semaphore::new(name, permits, Bytes::new(), Metadata::default(), created_at);
                n.add_semaphore(new)
            };
            s.description = description;
            s.metadata = metadata;
            s.permits = permits;
            s.version = version;
            s.created_at = created_at;
            s.updated_at = updated_at;
            s.last_activity_at = last_activity_at;
        }
        Record::SemDel { ns, name } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            if let Some(s) = n.remove_semaphore(&name) {
                for h in s.holders.iter() {
                    n.leases[h.lease].holds.remove(s.key);
                }
            }
        }
        Record::LeasePut {
            ns,
            id,
            serial,
            process_id,
            created_at,
            expires_at,
            metadata,
        } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            match n.leases.find(&id) {
                Some(r) => n.leases[r].expires_at = expires_at,
                None => {
                    n.leases.insert(Lease {
                        id,
                        serial,
                        process_id: ProcessId::new(&process_id),
                        created_at,
                        expires_at,
                        metadata,
                        holds: Holds::None,
                    });
                }
            }
        }
        Record::LeaseDel { ns, id } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            if let Some(l) = n.leases.find(&id).and_then(|r| n.leases.remove(r)) {
                for (sem, token) in l.holds.iter() {
                    if let Some(s) = n.sem_keys.get(sem).cloned() {
                        n.semaphores
                            .get_mut(&s)
                            .expect("keys name live semaphores")
                            .remove_holder(token);
                    }
                }
            }
        }
        Record::HoldSet {
            ns,
            sem,
            lease,
            weight,
            token,
            locked_at,
            metadata,
            at,
        } => {
            *hwm = (*hwm).max(token);
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            let s = n
                .semaphores
                .get_mut(&sem)
                .ok_or_else(|| missing("semaphore"))?;
            let r = n.leases.find(&lease).ok_or_else(|| missing("lease"))?;
            s.set_hold(r, &mut n.leases[r], weight, metadata, locked_at, || token);
            if let Some(h) = s.holders.get_mut(token) {
                h.locked_at = locked_at;
            }
            s.last_activity_at = at;
        }
        Record::HoldDel { ns, sem, lease, at } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            let s = n
                .semaphores
                .get_mut(&sem)
                .ok_or_else(|| missing("semaphore"))?;
            if let Some(r) = n.leases.find(&lease) {
                s.remove_hold(&mut n.leases[r]);
            }
            s.last_activity_at = at;
        }
        Record::Touch { ns, sem, at } => {
            let n = nss.get_mut(&ns).ok_or_else(|| missing("namespace"))?;
            let s = n
                .semaphores
                .get_mut(&sem)
                .ok_or_else(|| missing("semaphore"))?;
            s.last_activity_at = at;
        }
        Record::TimeShift { by, at: _ } => {
            for n in nss.values_mut() {
                n.leases.shift_expiries(by);
            }
        }
    }
    Ok(())
}
