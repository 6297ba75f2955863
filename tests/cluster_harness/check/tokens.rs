//! Rule (b): fencing tokens rise per semaphore in the order grants were made.

use std::collections::HashMap;

use super::super::history::{At, Outcome};
use super::holds::{acquire_of, is_fresh};
use super::{ms, short, Index, Rule, Violation};

/// One acknowledged grant.
struct Grant<'h> {
    call: usize,
    lease: &'h str,
    invoke: At,
    complete: At,
    token: i64,
    fresh: bool,
}

pub fn check(ix: &Index) -> Vec<Violation> {
    let mut by_sem: HashMap<&str, Vec<Grant>> = HashMap::new();
    for (i, c) in ix.h.calls.iter().enumerate() {
        if let (Some((lease, sem, _)), Outcome::Acquired(token)) = (acquire_of(c), &c.outcome) {
            by_sem.entry(sem).or_default().push(Grant {
                call: i,
                lease,
                invoke: c.invoke,
                complete: c.complete,
                token: *token,
                fresh: is_fresh(ix, i),
            });
        }
    }
    let mut out = Vec::new();
    for (sem, grants) in &by_sem {
        repeated(sem, grants, &mut out);
        fell(sem, grants, &mut out);
    }
    out
}

/// No two grants to different leases share a token, and a fresh grant shares none with an
/// earlier one (a re-acquire may repeat its hold's token; a fresh grant is a new hold).
fn repeated(sem: &str, grants: &[Grant], out: &mut Vec<Violation>) {
    let mut in_order: Vec<&Grant> = grants.iter().collect();
    in_order.sort_by_key(|g| g.invoke);
    let mut seen: HashMap<i64, &Grant> = HashMap::new();
    for g in in_order {
        match seen.get(&g.token) {
            Some(first) if g.fresh || first.lease != g.lease => {
                out.push(Violation {
                    rule: Rule::TokenRepeated,
                    detail: format!(
                        "{sem}: token {} granted to {} (call {}) and to {} (call {})",
                        g.token,
                        short(first.lease),
                        first.call,
                        short(g.lease),
                        g.call
                    ),
                });
            }
            Some(_) => {}
            None => {
                seen.insert(g.token, g);
            }
        }
    }
}

/// A fresh grant's token is above every fresh grant's that completed before it was invoked.
fn fell(sem: &str, grants: &[Grant], out: &mut Vec<Violation>) {
    let mut done: Vec<&Grant> = grants.iter().filter(|g| g.fresh).collect();
    done.sort_by_key(|g| g.complete);
    // best[k]: the grant with the highest token among done[..=k].
    let mut best: Vec<&Grant> = Vec::with_capacity(done.len());
    for &g in &done {
        let top = match best.last() {
            Some(&b) if b.token >= g.token => b,
            _ => g,
        };
        best.push(top);
    }
    for g in grants.iter().filter(|g| g.fresh) {
        let before = done.partition_point(|d| d.complete < g.invoke);
        let Some(&b) = before.checked_sub(1).map(|k| &best[k]) else {
            continue;
        };
        if b.token >= g.token {
            out.push(Violation {
                rule: Rule::TokenFell,
                detail: format!(
                    "{sem}: token {} (call {}, invoked {}) after token {} (call {}, completed {})",
                    g.token,
                    g.call,
                    ms(g.invoke),
                    b.token,
                    b.call,
                    ms(b.complete)
                ),
            });
        }
    }
}
