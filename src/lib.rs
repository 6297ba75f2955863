//! permitd: distributed weighted semaphores held under leases, served over the Redis protocol.
//!
//! Layers, from the wire in: [`protocol`] (request grammar, reply encoding), [`command`] (the
//! command table, parsing into typed requests), [`engine`] (the deterministic shard state
//! machine), [`server`] (listener, connections, shard threads, timers); [`cluster`] (cluster
//! mode's Raft node: storage, peer network, runtime) sits beside [`persist`].

#![warn(missing_docs)]

pub mod alloc;
pub mod cluster;
pub mod command;
pub mod config;
pub mod glob;
pub mod pem;
pub mod persist;
pub mod ratelimit;
pub mod server;

// The crates below the server, under the names the rest of the code knows them by.
pub use permitd_engine as engine;
pub use permitd_protocol as protocol;
pub use permitd_protocol::error;
