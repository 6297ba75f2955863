//! The network server: listener, shard threads, connections, timers.
//!
//! Its files depend on each other one way, each only on those listed before it:
//! `acl`, `background`, `fdlimit` (the open-files limit), `parking`, `tls`, `topology`,
//! `stats` (per-command figures),
//! `semstats` (per-semaphore figures) (leaves); `clients` (the client registry);
//! `session` (who a connection is logged in as); `msg` (what the threads send each other);
//! `global` (state every thread shares); `cluster` (cluster mode's options, topology,
//! refusals and hand-over); `gate` (a connection's replies held until their
//! changes are durable); `info`
//! (INFO and CONFIG GET text); `worker` (an engine shard's runtime); `httpauth` (who asks on
//! the HTTP port: basic credentials checked against the ACL); `metrics` (the `/metrics`
//! exposition and the HTTP listener of `--metrics-port`); `surface` (the Redis
//! surface commands over a session); `multi` (transactions); `conn` (a connection's I/O, and
//! the interface it runs requests through); `dispatch` (routing each request: the
//! implementation of that interface); `thread` (a shard thread's main loop); `listener`
//! (start-up and the accept loop).

pub mod acl;
pub mod background;
pub mod clients;
mod clock;
mod cluster;
pub mod conn;
mod dispatch;
mod fdlimit;
mod gate;
mod global;
mod httpauth;
pub mod info;
mod latency;
mod listener;
mod memory;
mod metrics;
mod monitor;
mod msg;
mod multi;
mod parking;
mod semstats;
mod session;
mod shown;
mod slowlog;
mod stats;
mod surface;
mod thread;
pub mod tls;
pub mod topology;
mod worker;

pub use listener::run;
