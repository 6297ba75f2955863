//! Rule (a): never more permits relied on than exist.

use super::super::history::{History, Op, Outcome};
use super::holds::Relied;
use super::{ms, short, Rule, Violation};

/// Sweeps each semaphore's relied windows in time order; reports each stretch where their
/// weights sum above the permits once, at its start, and each SEM.HOLDERS reply that shows more.
pub fn check(h: &History, relied: &[Relied]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (sem, permits) in &h.sems {
        let holds: Vec<&Relied> = relied.iter().filter(|r| &r.sem == sem).collect();
        // (instant, starts?, hold): at one instant ends go first, as windows are half-open.
        let mut events: Vec<(u64, bool, usize)> = holds
            .iter()
            .enumerate()
            .flat_map(|(k, r)| [(r.from, true, k), (r.until, false, k)])
            .collect();
        events.sort();
        let mut open: Vec<usize> = Vec::new();
        let mut over = false;
        for (t, starts, k) in events {
            if !starts {
                open.retain(|&o| o != k);
                over = sum(&holds, &open) > *permits;
                continue;
            }
            open.push(k);
            let held = sum(&holds, &open);
            if held > *permits && !over {
                let who: Vec<String> = open
                    .iter()
                    .map(|&o| {
                        let r = holds[o];
                        format!(
                            "{} w{} token {} [{}..{}) call {}",
                            short(&r.lease),
                            r.weight,
                            r.token,
                            ms(r.from),
                            ms(r.until),
                            r.call
                        )
                    })
                    .collect();
                out.push(Violation {
                    rule: Rule::OverGrant,
                    detail: format!(
                        "{sem} ({permits} permits): {held} relied on at {}: {}",
                        ms(t),
                        who.join(", ")
                    ),
                });
            }
            over = held > *permits;
        }
    }
    for (i, c) in h.calls.iter().enumerate() {
        if let (Op::Holders { sem }, Outcome::Holders(list)) = (&c.op, &c.outcome) {
            let held: u32 = list.iter().map(|x| x.weight).sum();
            if held > h.permits(sem) {
                out.push(Violation {
                    rule: Rule::OverGrant,
                    detail: format!(
                        "SEM.HOLDERS {sem} (call {i}) lists {held} of {} permits",
                        h.permits(sem)
                    ),
                });
            }
        }
    }
    out
}

fn sum(holds: &[&Relied], open: &[usize]) -> u32 {
    open.iter().map(|&o| holds[o].weight).sum()
}
