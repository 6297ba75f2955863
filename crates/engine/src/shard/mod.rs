//! One shard's deterministic state machine: requests and `now` in, replies out.
//!
//! The shard never reads a clock or a socket. Its caller passes `now` to every call, calls
//! [`Shard::advance`] when [`Shard::next_deadline`] comes, and delivers the replies of parked
//! acquires that [`Shard::take_outbox`] hands back (grants, time-outs, errors).
//!
//! The files, each above the ones it uses: `base` (the data, the look-ups, what the caller
//! drains), `queue` (holds given, queues served), `time` (deadlines, cancellation), one file per
//! command family (`namespaces`, `semaphores`, `acquire`, `leases`), `execute`, which routes
//! a request to its handler, and `durability` (what a caller that cannot make changes durable
//! asks of the shard: grants held, a roll-back to the durable state).

mod acquire;
mod base;
mod durability;
mod execute;
mod leases;
mod namespaces;
mod queue;
mod semaphores;
mod time;

pub use base::{Cancel, Counts, Exec, Shard, Stats};
pub use namespaces::{merge_ns_pages, ns_page_reply};
