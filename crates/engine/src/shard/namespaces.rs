//! NS.* commands, and the merge of every shard's part of an NS.LIST page.

use std::sync::atomic::Ordering;

use super::base::{name_cursor, ns_missing, ns_mut, Shard};
use super::queue::forget_waiter;
use crate::error::Error;
use crate::journal::{self, Record};
use crate::page::{take_page, CursorKind, Dir, Page, PageOf};
use crate::protocol::Reply;
use crate::request::{NsCreate, NsUpdate};
use crate::state::Namespace;
use crate::types::{Name, Nanos};
use crate::view;

impl Shard {
    pub(super) fn ns_create(&mut self, now: Nanos, req: NsCreate) -> Result<Reply, Error> {
        let NsCreate { ns, desc, meta } = req;
        if self.namespaces.contains_key(&ns) {
            return Err(Error::AlreadyExists(format!(
                "namespace '{ns}' already exists"
            )));
        }
        let max = self.cx.limits.max_namespaces;
        let count = &self.cx.namespace_count;
        if count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |c| {
                (c < max).then_some(c + 1)
            })
            .is_err()
        {
            return Err(Error::ResourceExhausted(format!(
                "namespace quota reached ({max} namespaces)"
            )));
        }
        let ns = ns.detached();
        let mut n = Namespace::new(ns.clone(), desc, meta, now);
        n.key = self.keys.add(&ns);
        let reply = view::namespace(&n);
        self.cx.journal.push(journal::ns_put(&n));
        self.namespaces.insert(ns, n);
        Ok(reply)
    }

    pub(super) fn ns_update(&mut self, now: Nanos, req: NsUpdate) -> Result<Reply, Error> {
        let n = ns_mut(&mut self.namespaces, &req.ns)?;
        check_version(req.version, n.version)?;
        n.description = req.desc;
        n.metadata = req.meta;
        n.version += 1;
        n.updated_at = now;
        self.cx.journal.push(journal::ns_put(n));
        Ok(view::namespace(n))
    }

    /// NS.DELETE: its parked acquires end NOTFOUND; deleting a missing namespace is a no-op.
    pub(super) fn ns_delete(&mut self, ns: &Name) -> Reply {
        if let Some(n) = self.namespaces.remove(ns) {
            self.cx.journal.push(Record::NsDel { name: n.name });
            self.cx.namespace_count.fetch_sub(1, Ordering::AcqRel);
            // Its leases' expiry entries stay behind, stale (their key names no namespace).
            self.keys.remove(n.key);
            for s in n.semaphores.values() {
                for (&w, waiter) in &s.queue {
                    // A SEM.ACQUIREALL ends once, where the waiter index has it: its first queue.
                    if waiter.queues(&s.name)[0] != s.name {
                        continue;
                    }
                    forget_waiter(&mut self.cx, (n.key, waiter.lease), w, waiter.deadline);
                    self.cx.outbox.push((w, Reply::Error(ns_missing(ns))));
                }
            }
        }
        Reply::OK
    }

    /// This shard's share of an NS.LIST page (merged with the other shards' by the caller).
    pub fn ns_list_part(&self, page: &Page) -> PageOf<Name, (Name, Reply)> {
        self.ns_list_part_where(page, |_| true)
    }

    /// [`Shard::ns_list_part`] over the namespaces `visible` lets through.
    pub fn ns_list_part_where(
        &self,
        page: &Page,
        visible: impl Fn(&Name) -> bool,
    ) -> PageOf<Name, (Name, Reply)> {
        take_page(
            &self.namespaces,
            name_cursor(page),
            page.limit,
            |n| visible(&n.name),
            |k, n| (k.clone(), view::namespace(n)),
        )
    }
}

/// VERSION of NS.UPDATE and SEM.UPDATE: the change applies only to the version it was made from.
pub(super) fn check_version(expected: i64, current: i64) -> Result<(), Error> {
    if expected != current {
        return Err(Error::InvalidArg(format!(
            "version mismatch: expected {expected}, current {current}"
        )));
    }
    Ok(())
}

/// Merges shards' NS.LIST parts into one page in name order.
pub fn merge_ns_pages(
    parts: Vec<PageOf<Name, (Name, Reply)>>,
    page: &Page,
) -> PageOf<Name, (Name, Reply)> {
    let dir = page.cursor.as_ref().map_or(Dir::Next, |c| c.dir);
    let mut beyond = false;
    let mut behind = false;
    let mut items: Vec<(Name, Reply)> = Vec::new();
    for p in parts {
        match dir {
            Dir::Next => {
                beyond |= p.next.is_some();
                behind |= p.prev.is_some();
            }
            Dir::Prev => {
                beyond |= p.prev.is_some();
                behind |= p.next.is_some();
            }
        }
        items.extend(p.items);
    }
    items.sort_by(|a, b| a.0.cmp(&b.0));
    if items.len() > page.limit {
        beyond = true;
        match dir {
            Dir::Next => items.truncate(page.limit),
            Dir::Prev => {
                items.drain(..items.len() - page.limit);
            }
        }
    }
    let cursor_key = page
        .cursor
        .as_ref()
        .map(|c| Name::new_unchecked(c.key.clone()));
    let first = items.first().map(|i| i.0.clone());
    let last = items.last().map(|i| i.0.clone());
    let (next, prev) = match dir {
        Dir::Next => (
            if beyond { last } else { None },
            if behind { first.or(cursor_key) } else { None },
        ),
        Dir::Prev => (
            if behind { last.or(cursor_key) } else { None },
            if beyond { first } else { None },
        ),
    };
    PageOf { items, next, prev }
}

/// The NS.LIST reply of a merged page.
pub fn ns_page_reply(p: PageOf<Name, (Name, Reply)>) -> Reply {
    let p = PageOf {
        items: p.items.into_iter().map(|(_, r)| r).collect(),
        next: p.next,
        prev: p.prev,
    };
    view::page("namespaces", CursorKind::Namespaces, p, |k| {
        k.bytes().clone()
    })
}
