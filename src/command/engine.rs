//! Parsing of the engine commands (NS.*, SEM.*, LEASE.*): their words, checked once, into the
//! engine's request structs. The order of the checks in each is the order in which a client
//! meets the errors of a request with several: keep it.

use bytes::Bytes;

use super::args::{self, Opt, Options};
use crate::engine::page::CursorKind;
use crate::engine::request::{self as r, EngineRequest as E};
use crate::engine::types::{LeaseId, Limits, Name};
use crate::error::Error;

fn ns(a: &[Bytes], limits: &Limits) -> Result<Name, Error> {
    args::name(&a[1], "namespace", limits)
}

fn sem(a: &[Bytes], limits: &Limits) -> Result<Name, Error> {
    args::name(&a[2], "semaphore", limits)
}

pub(super) fn ns_create(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[2..], &[Opt::Desc, Opt::Meta])?;
    Ok(E::NsCreate(r::NsCreate {
        ns: ns(a, limits)?,
        desc: o.desc(limits)?,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn ns_get(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::NsGet(r::NsGet { ns: ns(a, limits)? }))
}

pub(super) fn ns_list(a: &[Bytes], _: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[1..], &[Opt::Cursor, Opt::Limit])?;
    Ok(E::NsList(r::NsList {
        page: o.page(CursorKind::Namespaces)?,
    }))
}

pub(super) fn ns_update(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[2..], &[Opt::Version, Opt::Desc, Opt::Meta])?;
    Ok(E::NsUpdate(r::NsUpdate {
        version: o.version()?,
        ns: ns(a, limits)?,
        desc: o.desc(limits)?,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn ns_delete(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::NsDelete(r::NsDelete { ns: ns(a, limits)? }))
}

pub(super) fn sem_create(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[4..], &[Opt::Desc, Opt::Meta])?;
    let permits = args::int(&a[3])?;
    let (ns, sem) = (ns(a, limits)?, sem(a, limits)?);
    Ok(E::SemCreate(r::SemCreate {
        permits: args::positive(permits, "permits")?,
        ns,
        sem,
        desc: o.desc(limits)?,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn sem_get(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::SemGet(r::SemGet {
        ns: ns(a, limits)?,
        sem: sem(a, limits)?,
    }))
}

pub(super) fn sem_list(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[2..], &[Opt::Cursor, Opt::Limit])?;
    Ok(E::SemList(r::SemList {
        ns: ns(a, limits)?,
        page: o.page(CursorKind::Semaphores)?,
    }))
}

pub(super) fn sem_update(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[4..], &[Opt::Version, Opt::Desc, Opt::Meta])?;
    let permits = args::int(&a[3])?;
    let version = o.version()?;
    let (ns, sem) = (ns(a, limits)?, sem(a, limits)?);
    Ok(E::SemUpdate(r::SemUpdate {
        permits: args::positive(permits, "permits")?,
        version,
        ns,
        sem,
        desc: o.desc(limits)?,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn sem_delete(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::SemDelete(r::SemDelete {
        ns: ns(a, limits)?,
        sem: sem(a, limits)?,
    }))
}

pub(super) fn sem_acquire(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[6..], &[Opt::Meta])?;
    let weight = args::int(&a[4])?;
    let timeout = args::timeout(&a[5], limits)?;
    let (ns, sem) = (ns(a, limits)?, sem(a, limits)?);
    Ok(E::SemAcquire(r::SemAcquire {
        weight: args::positive(weight, "weight")?,
        timeout,
        ns,
        sem,
        lease: LeaseId::parse(&a[3]),
        meta: o.meta(limits)?,
    }))
}

/// `SEM.ACQUIREALL ns lease timeout sem weight [sem weight ...] [META k v ...]`. The pairs run
/// up to the word `META` in a semaphore's place: a semaphore named so is acquired with
/// SEM.ACQUIRE.
pub(super) fn sem_acquire_all(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let rest = &a[4..];
    let meta_at = (0..rest.len())
        .step_by(2)
        .find(|&i| rest[i].eq_ignore_ascii_case(b"META"))
        .unwrap_or(rest.len());
    let (pairs, opts) = rest.split_at(meta_at);
    let o = Options::parse(opts, &[Opt::Meta])?;
    if pairs.is_empty() || !pairs.len().is_multiple_of(2) {
        return Err(Error::syntax());
    }
    let weights = pairs
        .chunks(2)
        .map(|p| args::int(&p[1]))
        .collect::<Result<Vec<i64>, Error>>()?;
    let timeout = args::timeout(&a[3], limits)?;
    let ns = ns(a, limits)?;
    let mut parts: Vec<r::Part> = Vec::with_capacity(weights.len());
    for (p, weight) in pairs.chunks(2).zip(weights) {
        let sem = args::name(&p[0], "semaphore", limits)?;
        let weight = args::positive(weight, "weight")?;
        if parts.iter().any(|q| q.sem == sem) {
            return Err(Error::InvalidArg(format!(
                "semaphore '{sem}' is listed more than once"
            )));
        }
        parts.push(r::Part { sem, weight });
    }
    if parts.len() > r::MAX_ACQUIRE_ALL {
        return Err(Error::InvalidArg(format!(
            "at most {} semaphores per SEM.ACQUIREALL",
            r::MAX_ACQUIRE_ALL
        )));
    }
    Ok(E::SemAcquireAll(r::SemAcquireAll {
        ns,
        lease: LeaseId::parse(&a[2]),
        timeout,
        parts,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn sem_release(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::SemRelease(r::SemRelease {
        ns: ns(a, limits)?,
        sem: sem(a, limits)?,
        lease: LeaseId::parse(&a[3]),
    }))
}

pub(super) fn sem_holders(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[3..], &[Opt::Cursor, Opt::Limit])?;
    Ok(E::SemHolders(r::SemHolders {
        ns: ns(a, limits)?,
        sem: sem(a, limits)?,
        page: o.page(CursorKind::Holders)?,
    }))
}

pub(super) fn sem_waiters(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[3..], &[Opt::Cursor, Opt::Limit])?;
    Ok(E::SemWaiters(r::SemWaiters {
        ns: ns(a, limits)?,
        sem: sem(a, limits)?,
        page: o.page(CursorKind::Waiters)?,
    }))
}

pub(super) fn lease_create(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[4..], &[Opt::Meta])?;
    let ttl = args::int(&a[3])?;
    let ns = ns(a, limits)?;
    Ok(E::LeaseCreate(r::LeaseCreate {
        ttl: args::ttl(ttl, limits)?,
        ns,
        id: args::lease_id(),
        process_id: args::process_id(&a[2], limits)?,
        meta: o.meta(limits)?,
    }))
}

pub(super) fn lease_get(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::LeaseGet(r::LeaseGet {
        ns: ns(a, limits)?,
        lease: LeaseId::parse(&a[2]),
    }))
}

pub(super) fn lease_list(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let o = Options::parse(&a[2..], &[Opt::Process, Opt::Cursor, Opt::Limit])?;
    Ok(E::LeaseList(r::LeaseList {
        ns: ns(a, limits)?,
        page: o.page(CursorKind::Leases)?,
        process: o.process.clone(),
    }))
}

pub(super) fn lease_refresh(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    let ttl = args::int(&a[3])?;
    let ns = ns(a, limits)?;
    Ok(E::LeaseRefresh(r::LeaseRefresh {
        ttl: args::ttl(ttl, limits)?,
        ns,
        lease: LeaseId::parse(&a[2]),
    }))
}

pub(super) fn lease_revoke(a: &[Bytes], limits: &Limits) -> Result<E, Error> {
    Ok(E::LeaseRevoke(r::LeaseRevoke {
        ns: ns(a, limits)?,
        lease: LeaseId::parse(&a[2]),
    }))
}
