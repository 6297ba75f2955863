//! The helper on the `redis` crate: typed calls for leases and semaphores, a scoped permit and a
//! lease heartbeat (the crate documentation shows them in use).

use std::future::Future;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{RedisError, RedisResult, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A field of a reply map (a RESP3 map, or a RESP2 flat `[field, value, ...]` array).
fn field<'a>(v: &'a Value, name: &str) -> Option<&'a Value> {
    let is = |k: &Value| {
        matches!(k, Value::BulkString(b) if b == name.as_bytes())
            || matches!(k, Value::SimpleString(s) if s == name)
    };
    match v {
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is(k)).map(|(_, v)| v),
        Value::Array(items) => items
            .chunks(2)
            .find(|p| p.len() == 2 && is(&p[0]))
            .map(|p| &p[1]),
        _ => None,
    }
}

fn int_field(v: &Value, name: &str) -> RedisResult<i64> {
    match field(v, name) {
        Some(Value::Int(n)) => Ok(*n),
        _ => Err(malformed(name)),
    }
}

fn text_field(v: &Value, name: &str) -> RedisResult<String> {
    match field(v, name) {
        Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
        Some(Value::SimpleString(s)) => Ok(s.clone()),
        _ => Err(malformed(name)),
    }
}

fn malformed(what: &str) -> RedisError {
    RedisError::from((
        redis::ErrorKind::Client,
        "unexpected reply from permitd",
        format!("missing or mistyped field '{what}'"),
    ))
}

/// A lease: a server-side TTL token under which permits are held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The namespace the lease lives in (its semaphores must be in the same one).
    pub namespace: String,
    /// The lease id (a capability: keep it secret).
    pub id: String,
    /// Time to live given at creation, seconds.
    pub ttl_secs: u64,
}

impl Lease {
    /// Creates a lease for `process_id` (`LEASE.CREATE`), alive for `ttl_secs` unless refreshed.
    pub async fn create<C: ConnectionLike>(
        conn: &mut C,
        namespace: &str,
        process_id: &str,
        ttl_secs: u64,
    ) -> RedisResult<Lease> {
        let reply: Value = redis::cmd("LEASE.CREATE")
            .arg(namespace)
            .arg(process_id)
            .arg(ttl_secs)
            .query_async(conn)
            .await?;
        Ok(Lease {
            namespace: namespace.to_string(),
            id: text_field(&reply, "lease_id")?,
            ttl_secs,
        })
    }

    /// `LEASE.REFRESH` for the lease's ttl; returns the new `expires_at` (ns since the epoch).
    pub async fn refresh<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<i64> {
        let reply: Value = redis::cmd("LEASE.REFRESH")
            .arg(&self.namespace)
            .arg(&self.id)
            .arg(self.ttl_secs)
            .query_async(conn)
            .await?;
        int_field(&reply, "expires_at")
    }

    /// `LEASE.REVOKE`: releases every hold of the lease.
    pub async fn revoke<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<()> {
        redis::cmd("LEASE.REVOKE")
            .arg(&self.namespace)
            .arg(&self.id)
            .query_async(conn)
            .await
    }
}

/// How an acquire ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The lease holds the permits.
    Acquired,
    /// Timeout 0 and the permits were not free.
    Unavailable,
    /// Waited the whole timeout.
    TimedOut,
}

/// An acquire's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acquire {
    /// Whether the permits were acquired, and if not, why.
    pub outcome: Outcome,
    /// The fencing token, when acquired.
    pub fencing_token: Option<i64>,
    /// The semaphore's permits in use after the call.
    pub active_holds: i64,
    /// The semaphore's total permits.
    pub permits: i64,
}

/// A `SEM.ACQUIREALL` result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireAll {
    /// Whether every permit was acquired (all or none), and if not, why.
    pub outcome: Outcome,
    /// Each semaphore's fencing token in the order asked, when acquired.
    pub fencing_tokens: Vec<Option<i64>>,
}

/// An acquire reply's `outcome`.
fn outcome_of(reply: &Value) -> RedisResult<Outcome> {
    match text_field(reply, "outcome")?.as_str() {
        "ACQUIRE_OUTCOME_ACQUIRED" => Ok(Outcome::Acquired),
        "ACQUIRE_OUTCOME_UNAVAILABLE" => Ok(Outcome::Unavailable),
        "ACQUIRE_OUTCOME_TIMED_OUT" => Ok(Outcome::TimedOut),
        _ => Err(malformed("outcome")),
    }
}

/// A reply's `fencing_token`, when it has one.
fn token_of(reply: &Value) -> Option<i64> {
    match field(reply, "fencing_token") {
        Some(Value::Int(n)) => Some(*n),
        _ => None,
    }
}

/// A semaphore of a namespace: only its address; every call asks the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Semaphore {
    /// The namespace it lives in.
    pub namespace: String,
    /// Its name within the namespace.
    pub name: String,
}

impl Semaphore {
    /// Names a semaphore (`SEM.CREATE` makes it).
    pub fn new(namespace: &str, name: &str) -> Semaphore {
        Semaphore {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }

    /// `SEM.ACQUIRE`: waits server-side (FIFO) up to `timeout` for `weight` permits.
    pub async fn acquire<C: ConnectionLike>(
        &self,
        conn: &mut C,
        lease: &Lease,
        weight: i64,
        timeout: Duration,
    ) -> RedisResult<Acquire> {
        let reply: Value = redis::cmd("SEM.ACQUIRE")
            .arg(&self.namespace)
            .arg(&self.name)
            .arg(&lease.id)
            .arg(weight)
            .arg(format!("{:.3}", timeout.as_secs_f64()))
            .query_async(conn)
            .await?;
        let sem = field(&reply, "semaphore").ok_or_else(|| malformed("semaphore"))?;
        Ok(Acquire {
            outcome: outcome_of(&reply)?,
            fencing_token: token_of(&reply),
            active_holds: int_field(sem, "active_holds")?,
            permits: int_field(sem, "permits")?,
        })
    }

    /// `SEM.ACQUIREALL`: `weight` permits of each of `parts` (semaphores of `lease`'s
    /// namespace), all or none, waiting server-side up to `timeout` in FIFO order across them.
    pub async fn acquire_all<C: ConnectionLike>(
        conn: &mut C,
        lease: &Lease,
        parts: &[(&Semaphore, i64)],
        timeout: Duration,
    ) -> RedisResult<AcquireAll> {
        let mut cmd = redis::cmd("SEM.ACQUIREALL");
        cmd.arg(&lease.namespace)
            .arg(&lease.id)
            .arg(format!("{:.3}", timeout.as_secs_f64()));
        for (sem, weight) in parts {
            cmd.arg(&sem.name).arg(*weight);
        }
        let reply: Value = cmd.query_async(conn).await?;
        let holds = match field(&reply, "holds") {
            Some(Value::Array(holds)) => holds,
            _ => return Err(malformed("holds")),
        };
        Ok(AcquireAll {
            outcome: outcome_of(&reply)?,
            fencing_tokens: holds.iter().map(token_of).collect(),
        })
    }

    /// [`Semaphore::with_permit`] over several semaphores at once (`SEM.ACQUIREALL`): `work`
    /// gets the fencing tokens in the order of `parts`, and every hold is released after it.
    pub async fn with_permits<C, F, Fut, T>(
        conn: &mut C,
        lease: &Lease,
        parts: &[(&Semaphore, i64)],
        timeout: Duration,
        work: F,
    ) -> RedisResult<Option<T>>
    where
        C: ConnectionLike,
        F: FnOnce(Vec<i64>) -> Fut,
        Fut: Future<Output = T>,
    {
        let a = Semaphore::acquire_all(conn, lease, parts, timeout).await?;
        let tokens: Option<Vec<i64>> = a.fencing_tokens.into_iter().collect();
        let Some(tokens) = tokens.filter(|_| a.outcome == Outcome::Acquired) else {
            return Ok(None);
        };
        let out = work(tokens).await;
        for (sem, _) in parts {
            sem.release(conn, lease).await?;
        }
        Ok(Some(out))
    }

    /// Releases every permit `lease` holds on this semaphore (`SEM.RELEASE`).
    pub async fn release<C: ConnectionLike>(&self, conn: &mut C, lease: &Lease) -> RedisResult<()> {
        let _: Value = redis::cmd("SEM.RELEASE")
            .arg(&self.namespace)
            .arg(&self.name)
            .arg(&lease.id)
            .query_async(conn)
            .await?;
        Ok(())
    }

    /// Acquires, runs `work` with the fencing token, releases, and returns what `work` returned;
    /// `None` when the permits were not acquired within `timeout` (`work` does not run).
    pub async fn with_permit<C, F, Fut, T>(
        &self,
        conn: &mut C,
        lease: &Lease,
        weight: i64,
        timeout: Duration,
        work: F,
    ) -> RedisResult<Option<T>>
    where
        C: ConnectionLike,
        F: FnOnce(i64) -> Fut,
        Fut: Future<Output = T>,
    {
        let a = self.acquire(conn, lease, weight, timeout).await?;
        let Some(token) = a.fencing_token.filter(|_| a.outcome == Outcome::Acquired) else {
            return Ok(None);
        };
        let out = work(token).await;
        self.release(conn, lease).await?;
        Ok(Some(out))
    }
}

/// Keeps a lease alive by refreshing it at a fraction of its ttl, on a connection of its own.
/// When a refresh fails with an error from the server (the lease is gone: expired or revoked),
/// the heartbeat stops and reports the loss; it retries connection errors until the lease
/// would have expired. Dropping it stops the refreshing.
pub struct Heartbeat {
    lost: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts refreshing `lease` every `ttl / 3` (or `every`).
    pub fn start(client: redis::Client, lease: Lease, every: Option<Duration>) -> Heartbeat {
        let (tx, lost) = watch::channel(None);
        let period = every.unwrap_or(Duration::from_millis(lease.ttl_secs * 1000 / 3));
        let task = tokio::spawn(async move {
            let mut conn = None;
            let mut last_ok = tokio::time::Instant::now();
            let ttl = Duration::from_secs(lease.ttl_secs);
            loop {
                tokio::time::sleep(period).await;
                if conn.is_none() {
                    conn = client.get_multiplexed_async_connection().await.ok();
                }
                let result = match conn.as_mut() {
                    Some(c) => lease.refresh(c).await,
                    None => Err(malformed("connection")),
                };
                match result {
                    Ok(_) => last_ok = tokio::time::Instant::now(),
                    // The server answered with an error: the lease is gone.
                    Err(e) if e.code().is_some() => {
                        let _ = tx.send(Some(format!("lease lost: {e}")));
                        return;
                    }
                    Err(e) => {
                        conn = None;
                        if last_ok.elapsed() >= ttl {
                            let _ = tx.send(Some(format!("lease expired unrefreshed: {e}")));
                            return;
                        }
                    }
                }
            }
        });
        Heartbeat { lost, task }
    }

    /// Whether the lease was lost.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Waits until the lease is lost; returns why.
    pub async fn lost(&mut self) -> String {
        match self.lost.wait_for(|l| l.is_some()).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "heartbeat stopped".into(),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.task.abort();
    }
}
