//! Cluster mode: which failed commands the helper sends again, and for how long.
//!
//! On a single node none of the errors below occur and every call is one command, as before.
//! A permitd cluster (SPEC §10) answers a command that it did not run with `MOVED` (this node is
//! a follower), `CLUSTERDOWN` (no leader known) or `TRYAGAIN` (a new leader not ready yet), and a
//! write whose outcome became unknown when leadership moved with `LEADERCHANGED`. The helper's
//! calls ([`Lease`](crate::Lease), [`Semaphore`](crate::Semaphore),
//! [`Heartbeat`](crate::Heartbeat)) handle them so:
//!
//! - **Not run** (`MOVED`, `TRYAGAIN`, `CLUSTERDOWN`, a refused connection, a cluster connection
//!   with no node for the slot): sent again, after a pause that starts at [`Retry::first_pause`]
//!   and doubles up to [`Retry::max_pause`].
//! - **Outcome unknown** (`LEADERCHANGED`, or the connection lost or timed out after sending):
//!   sent again as well, which is safe for each call: an acquire is re-sent with the same lease
//!   and weight (if the first try took effect, the server answers the same hold and fencing
//!   token); `SEM.RELEASE` and `LEASE.REFRESH` as they are; for `LEASE.REVOKE` and
//!   `SEM.DELETE`, `NOTFOUND` on the re-send means done; for `SEM.CREATE`, `ALREADYEXISTS` on
//!   the re-send is checked with `SEM.GET` (the same permits: done; other settings: the error).
//!   A re-sent `LEASE.CREATE` may leave the first try's lease behind, unused: it dies at its ttl.
//! - **How long**: an acquire (`SEM.ACQUIRE`, `SEM.ACQUIREALL`) keeps its own deadline, its
//!   timeout from the first send; each re-send carries the time left, so the server does not
//!   wait past the caller's deadline (to the millisecond). An acquire that did not run is
//!   re-sent until the deadline (one last time at it, with timeout 0; one asked with timeout 0
//!   is not re-sent), then the call fails with a timeout ([`redis::RedisError::is_timeout`])
//!   that names the last error and says nothing was acquired. Once an acquire's outcome is
//!   unknown, the deadline does not end it: giving up then could leave a hold the caller does
//!   not know about. It is re-sent (with timeout 0 once the deadline has passed) for up to
//!   [`Retry::budget`] past the deadline, to learn the outcome: `ACQUIRED` is the hold with its
//!   fencing token, `UNAVAILABLE` to a call that asked to wait is reported as
//!   [`Outcome::TimedOut`](crate::Outcome::TimedOut), and no answer within the budget fails
//!   with a timeout that says the lease may hold the permits (release them, or revoke the
//!   lease). Every other call is re-sent for [`Retry::budget`] (5 s by default, above the 3 s a
//!   failover takes), then fails with the last error. A [`Heartbeat`](crate::Heartbeat) retries
//!   until the lease would have expired: only `NOTFOUND` (or another definite error) ends it as
//!   lost.
//! - **`MOVED` on a plain connection**: re-sending to the same node cannot help, so after a few
//!   `MOVED` answers the call fails with a message that says so. Give the helper a
//!   `redis::cluster_async::ClusterConnection` (the `redis` crate's `cluster-async` feature),
//!   which follows `MOVED` to the leader itself. Its own retries (16 by default, each pause at
//!   least 1.28 s, growing) re-send a command as it was first sent, so a re-sent acquire waits
//!   its whole timeout again: build it with `ClusterClientBuilder::retries(0)` and it hands
//!   every such error back at once (still refreshing its slot map and reconnecting), and the
//!   helper keeps the total within the timeout. A heartbeat started with
//!   [`Heartbeat::start`](crate::Heartbeat::start) follows `MOVED` on a connection of its own;
//!   given a cluster connection ([`Heartbeat::start_on`](crate::Heartbeat::start_on)) it also
//!   finds a new leader when the node it knew is gone.
//! - **A lost connection** is retried on the connection the call was given: that only helps if
//!   it reconnects by itself, as `redis::aio::ConnectionManager` and a cluster connection do (a
//!   `MultiplexedConnection` stays broken once its socket is gone).

use std::io;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};
use tokio::time::{sleep, Instant};

/// How the helper re-sends a command that a cluster did not run, or whose outcome it lost
/// (the module documentation has the rules). `Retry::default()`: 5 s, 50 ms, 500 ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// How long a call other than an acquire keeps re-sending (a heartbeat keeps to the lease's
    /// ttl), and how long past its deadline an acquire whose outcome became unknown keeps
    /// re-sending to learn it (an acquire otherwise keeps to its own timeout).
    pub budget: Duration,
    /// The pause before the first re-send; each next pause doubles.
    pub first_pause: Duration,
    /// The longest pause between two sends.
    pub max_pause: Duration,
}

impl Default for Retry {
    fn default() -> Retry {
        Retry {
            budget: Duration::from_secs(5),
            first_pause: Duration::from_millis(50),
            max_pause: Duration::from_millis(500),
        }
    }
}

/// How many `MOVED` answers one call re-sends: enough for a cluster connection whose slot map
/// is being refreshed, and no more, since a plain connection would only ask the same node again.
const MOVED_RESENDS: u32 = 3;

/// What a failed send says about the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Not run: sending it again is always safe.
    NotRun,
    /// It may or may not have taken effect.
    Unknown,
    /// A definite answer.
    Final,
}

pub(crate) fn fate(e: &RedisError) -> Fate {
    match e.kind() {
        ErrorKind::Server(
            ServerErrorKind::Moved | ServerErrorKind::TryAgain | ServerErrorKind::ClusterDown,
        ) => Fate::NotRun,
        // Nothing was sent: the connection was refused, or a cluster connection knew no node.
        ErrorKind::Io if e.is_connection_refusal() => Fate::NotRun,
        ErrorKind::ClusterConnectionNotFound => Fate::NotRun,
        ErrorKind::Io => Fate::Unknown,
        _ if e.code() == Some("LEADERCHANGED") => Fate::Unknown,
        _ => Fate::Final,
    }
}

/// Until when a call re-sends.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// For [`Retry::budget`] from the first send.
    Budget,
    /// An acquire's deadline: each send carries the time left, and running out is a timeout.
    Deadline(Instant),
    /// The instant a lease would expire unrefreshed (the heartbeat).
    Expiry(Instant),
}

/// What the sends of one call came to.
pub(crate) struct Sent {
    /// The last answer (an error of the kinds above once the time is spent).
    pub result: RedisResult<Value>,
    /// An earlier send may have taken effect: a definite error now may be its doing.
    pub maybe_ran: bool,
}

impl Sent {
    /// The result, with `done` (an error code the call's own earlier send would cause, such as
    /// `NOTFOUND` for a re-sent delete) counted as success.
    pub fn ok_if(self, done: &str) -> RedisResult<Value> {
        match self.result {
            Err(e) if self.maybe_ran && e.code() == Some(done) => Ok(Value::Okay),
            r => r,
        }
    }
}

/// Sends the command `cmd` builds (given the time left before an acquire's deadline, zero
/// otherwise) until it gets an answer it can give, following the rules above.
pub(crate) async fn send<C: ConnectionLike>(
    conn: &mut C,
    retry: &Retry,
    until: Until,
    mut cmd: impl FnMut(Duration) -> Cmd,
) -> Sent {
    let start = Instant::now();
    let end = |maybe_ran: bool| match until {
        Until::Budget => start + retry.budget,
        // Whether an acquire holds must be learnt, not left to the caller's deadline: after an
        // unknown outcome it is re-sent up to the budget past the deadline (with timeout 0 then).
        Until::Deadline(at) if maybe_ran => at + retry.budget,
        Until::Deadline(at) | Until::Expiry(at) => at,
    };
    let mut pause = retry.first_pause;
    let mut maybe_ran = false;
    let mut moved = 0;
    loop {
        let left = match until {
            Until::Deadline(at) => at.saturating_duration_since(Instant::now()),
            _ => Duration::ZERO,
        };
        let e = match cmd(left).query_async(conn).await {
            Ok(v) => {
                return Sent {
                    result: Ok(v),
                    maybe_ran,
                }
            }
            Err(e) => e,
        };
        let f = fate(&e);
        maybe_ran |= f == Fate::Unknown;
        if e.kind() == ErrorKind::Server(ServerErrorKind::Moved) {
            moved += 1;
        }
        let (now, give_up) = (Instant::now(), end(maybe_ran));
        if f == Fate::Final || now >= give_up || moved > MOVED_RESENDS {
            let result = Err(match until {
                Until::Deadline(_) if f != Fate::Final && moved <= MOVED_RESENDS => {
                    timed_out(e, maybe_ran)
                }
                _ => surface(e),
            });
            return Sent { result, maybe_ran };
        }
        sleep(pause.min(give_up - now)).await;
        pause = (pause * 2).min(retry.max_pause);
    }
}

/// The error a call returns: `MOVED` with what to do about it, anything else as it came.
fn surface(e: RedisError) -> RedisError {
    if e.kind() != ErrorKind::Server(ServerErrorKind::Moved) {
        return e;
    }
    RedisError::from((
        ErrorKind::Server(ServerErrorKind::Moved),
        "permitd: this node is not the cluster's leader",
        format!(
            "{} (a plain connection does not follow MOVED: connect with \
             redis::cluster_async::ClusterConnection, built with retries(0))",
            e.detail().unwrap_or_default()
        ),
    ))
}

/// An acquire that got no answer before its deadline or, its outcome unknown, before the
/// budget past it.
fn timed_out(last: RedisError, maybe_ran: bool) -> RedisError {
    let (spent, held) = if maybe_ran {
        (
            "timeout, and the retry budget after it,",
            "an earlier try's outcome is unknown: the lease may hold the permits; release them, or \
             revoke the lease",
        )
    } else {
        ("timeout", "nothing was acquired")
    };
    let last = match (last.code(), last.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => last.to_string(),
    };
    RedisError::from(io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "permitd: the acquire's {spent} passed without an answer ({held}); last error: {last}"
        ),
    ))
}
