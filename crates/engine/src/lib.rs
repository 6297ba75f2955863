//! The deterministic shard state machine: namespaces, semaphores, leases, holders and parked
//! acquires. No clock, no socket: `now` comes in with every call.
//!
//! A leaf of the layers: it uses the wire's reply tree and error codes (`permitd-protocol`) and
//! nothing of the command table, persistence or the server; its Cargo.toml lists all it may use.

#![warn(missing_docs)]

use permitd_protocol as protocol;
use permitd_protocol::error;

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
pub use state::{ClientId, WaiterId};
