//! The deterministic shard state machine: namespaces, semaphores, leases, holders and parked
//! acquires. No clock, no socket: `now` comes in with every call.

pub mod creation;
pub mod journal;
pub mod leases;
pub mod page;
pub mod process_id;
pub mod request;
pub mod room;
pub mod route;
pub mod shard;
pub mod state;
pub mod timers;
pub mod types;
pub mod view;

pub use shard::{Cancel, Counts, Exec, Shard, Stats};
pub use state::WaiterId;
