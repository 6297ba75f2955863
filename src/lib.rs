//! permitd: distributed weighted semaphores held under leases, served over the Redis protocol.
//!
//! Layers, from the wire in: [`protocol`] (request grammar, reply encoding), [`command`] (the
//! command table, parsing into typed requests), [`engine`] (the deterministic shard state
//! machine), [`server`] (listener, connections, shard threads, timers).

#![warn(missing_docs)]

pub mod alloc;
pub mod command;
pub mod config;
pub mod engine;
pub mod error;
pub mod glob;
pub mod persist;
pub mod protocol;
pub mod server;
