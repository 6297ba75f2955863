//! Rust clients of permitd.
//!
//! - [`resp`]: a reader of the server's replies (RESP2 and RESP3) off raw bytes, with no
//!   dependencies. The integration tests, `permitd-soak` and `permitd-load` read replies with it.
//! - With the `redis` feature (on by default): a thin helper on the `redis` crate for leases,
//!   semaphores, a scoped permit that is always released, and a lease heartbeat that reports a
//!   lost lease. It adds nothing the server already does: no client-side queueing or polling.
//!   Against a cluster it re-sends what the cluster did not run or whose outcome it lost, within
//!   each call's timeout or [`Retry`] budget ([`retry`] has the rules); a single node never
//!   answers in a way that needs it.
//!
//! Two things to know, as with any blocking Redis command:
//! - A parked `SEM.ACQUIRE` holds the commands behind it on its connection. Give acquires their
//!   own connection (a [`Heartbeat`] opens its own).
//! - The connection's response timeout must be above the acquire timeout (the `redis` crate's
//!   multiplexed connections default to 500 ms; set `AsyncConnectionConfig::set_response_timeout`).
//!   Otherwise the acquire times out on the client, its outcome unknown, and is re-sent with the
//!   time left until its deadline, the re-sends queued behind it on the same connection.
//!
//! ```no_run
//! # async fn demo() -> redis::RedisResult<()> {
//! use std::time::Duration;
//! use permitd_client::{Lease, Semaphore};
//! let client = redis::Client::open("redis://127.0.0.1:6379")?;
//! let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
//! let mut conn = client.get_multiplexed_async_connection_with_config(&config).await?;
//! let lease = Lease::create(&mut conn, "team", "worker-7", 30).await?;
//! let db = Semaphore::new("team", "db");
//! let rows = db
//!     .with_permit(&mut conn, &lease, 1, Duration::from_secs(5), |token| async move {
//!         // ... use the resource, passing `token` along as a fencing token ...
//!         token
//!     })
//!     .await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

#[cfg(feature = "redis")]
mod helper;
pub mod resp;
#[cfg(feature = "redis")]
pub mod retry;

#[cfg(feature = "redis")]
pub use helper::{Acquire, AcquireAll, Heartbeat, Lease, Outcome, Semaphore};
#[cfg(feature = "redis")]
pub use retry::Retry;

/// The time now in the server's unit: nanoseconds since the Unix epoch, the unit of every
/// `expires_at`, `created_at` and `locked_at` in its replies.
pub fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as i64
}
