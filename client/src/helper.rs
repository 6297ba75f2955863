//! The helper on the `redis` crate: typed calls for leases and semaphores, a scoped permit and a
//! lease heartbeat (the crate documentation shows them in use). Each call re-sends what a
//! cluster did not run or whose outcome it lost, as the [`retry`](crate::retry) module says.

use std::future::Future;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    Cmd, ConnectionAddr, RedisError, RedisFuture, RedisResult, ServerErrorKind, ToRedisArgs, Value,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::retry::{fate, send, Fate, Retry, Until};

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
    /// How its refreshes and its revoke are re-sent in cluster mode.
    pub retry: Retry,
}

impl Lease {
    /// Creates a lease for `process_id` (`LEASE.CREATE`), alive for `ttl_secs` unless refreshed,
    /// with the default [`Retry`]. In cluster mode a re-send after a lost outcome may leave the
    /// first try's lease behind, unused until its ttl ends it.
    pub async fn create<C: ConnectionLike>(
        conn: &mut C,
        namespace: &str,
        process_id: &str,
        ttl_secs: u64,
    ) -> RedisResult<Lease> {
        let retry = Retry::default();
        let reply = send(conn, &retry, Until::Budget, |_| {
            command("LEASE.CREATE", (namespace, process_id, ttl_secs))
        })
        .await
        .result?;
        Ok(Lease {
            namespace: namespace.to_string(),
            id: text_field(&reply, "lease_id")?,
            ttl_secs,
            retry,
        })
    }

    fn refresh_cmd(&self) -> Cmd {
        command("LEASE.REFRESH", (&self.namespace, &self.id, self.ttl_secs))
    }

    /// `LEASE.REFRESH` for the lease's ttl; returns the new `expires_at` (ns since the epoch).
    pub async fn refresh<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<i64> {
        let sent = send(conn, &self.retry, Until::Budget, |_| self.refresh_cmd()).await;
        int_field(&sent.result?, "expires_at")
    }

    /// `LEASE.REVOKE`: releases every hold of the lease.
    pub async fn revoke<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<()> {
        send(conn, &self.retry, Until::Budget, |_| {
            command("LEASE.REVOKE", (&self.namespace, &self.id))
        })
        .await
        .ok_if("NOTFOUND")?;
        Ok(())
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

/// An acquire reply's `outcome`, for a call that asked for `timeout`: a re-send at or past the
/// deadline carries timeout 0, so `UNAVAILABLE` then means the wait timed out.
fn outcome_of(reply: &Value, timeout: Duration) -> RedisResult<Outcome> {
    match text_field(reply, "outcome")?.as_str() {
        "ACQUIRE_OUTCOME_ACQUIRED" => Ok(Outcome::Acquired),
        "ACQUIRE_OUTCOME_UNAVAILABLE" if timeout.is_zero() => Ok(Outcome::Unavailable),
        "ACQUIRE_OUTCOME_UNAVAILABLE" | "ACQUIRE_OUTCOME_TIMED_OUT" => Ok(Outcome::TimedOut),
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
    /// How its commands other than acquires are re-sent in cluster mode.
    pub retry: Retry,
}

/// The command `name` with `args` (a tuple for several).
fn command(name: &str, args: impl ToRedisArgs) -> Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

/// An acquire timeout as the server reads it: seconds, to the millisecond.
fn seconds(timeout: Duration) -> String {
    format!("{:.3}", timeout.as_secs_f64())
}

impl Semaphore {
    /// Names a semaphore ([`Semaphore::create`] makes it), with the default [`Retry`].
    pub fn new(namespace: &str, name: &str) -> Semaphore {
        Semaphore {
            namespace: namespace.to_string(),
            name: name.to_string(),
            retry: Retry::default(),
        }
    }

    /// `SEM.CREATE` with `permits`. In cluster mode, `ALREADYEXISTS` after a lost outcome is
    /// checked with `SEM.GET`: the same permits (no description, no metadata) count as created.
    pub async fn create<C: ConnectionLike>(&self, conn: &mut C, permits: i64) -> RedisResult<()> {
        let sent = send(conn, &self.retry, Until::Budget, |_| {
            command("SEM.CREATE", (&self.namespace, &self.name, permits))
        })
        .await;
        match sent.result {
            Err(e) if sent.maybe_ran && e.code() == Some("ALREADYEXISTS") => {
                let sem = send(conn, &self.retry, Until::Budget, |_| {
                    command("SEM.GET", (&self.namespace, &self.name))
                })
                .await
                .result?;
                let unset = |name| match field(&sem, name) {
                    Some(Value::BulkString(b)) => b.is_empty(),
                    Some(Value::Array(items)) => items.is_empty(),
                    Some(Value::Map(pairs)) => pairs.is_empty(),
                    _ => false,
                };
                let same = int_field(&sem, "permits")? == permits
                    && unset("description")
                    && unset("metadata");
                if same {
                    Ok(())
                } else {
                    Err(e)
                }
            }
            r => r.map(drop),
        }
    }

    /// `SEM.DELETE`: deletes the semaphore (`Ok` also when it did not exist).
    pub async fn delete<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<()> {
        send(conn, &self.retry, Until::Budget, |_| {
            command("SEM.DELETE", (&self.namespace, &self.name))
        })
        .await
        .ok_if("NOTFOUND")?;
        Ok(())
    }

    /// `SEM.ACQUIRE`: waits server-side (FIFO) up to `timeout` for `weight` permits.
    pub async fn acquire<C: ConnectionLike>(
        &self,
        conn: &mut C,
        lease: &Lease,
        weight: i64,
        timeout: Duration,
    ) -> RedisResult<Acquire> {
        let deadline = Until::Deadline(Instant::now() + timeout);
        let reply = send(conn, &lease.retry, deadline, |left| {
            command(
                "SEM.ACQUIRE",
                (
                    &self.namespace,
                    &self.name,
                    &lease.id,
                    weight,
                    seconds(left),
                ),
            )
        })
        .await
        .result?;
        let sem = field(&reply, "semaphore").ok_or_else(|| malformed("semaphore"))?;
        Ok(Acquire {
            outcome: outcome_of(&reply, timeout)?,
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
        let deadline = Until::Deadline(Instant::now() + timeout);
        let reply = send(conn, &lease.retry, deadline, |left| {
            let mut cmd = command(
                "SEM.ACQUIREALL",
                (&lease.namespace, &lease.id, seconds(left)),
            );
            for (sem, weight) in parts {
                cmd.arg(&sem.name).arg(*weight);
            }
            cmd
        })
        .await
        .result?;
        let holds = match field(&reply, "holds") {
            Some(Value::Array(holds)) => holds,
            _ => return Err(malformed("holds")),
        };
        Ok(AcquireAll {
            outcome: outcome_of(&reply, timeout)?,
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
        send(conn, &self.retry, Until::Budget, |_| {
            command("SEM.RELEASE", (&self.namespace, &self.name, &lease.id))
        })
        .await
        .result?;
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

/// Keeps a lease alive by refreshing it every `ttl / 3` (or `every`), on a connection of its
/// own. A refresh that fails for a reason that may pass (a lost connection; in cluster mode
/// `MOVED`, `CLUSTERDOWN`, `TRYAGAIN`, `LEADERCHANGED`) is sent again after short pauses until
/// the lease would have expired. A definite error from the server (`NOTFOUND`: the lease expired
/// or was revoked) stops the heartbeat and reports the loss, and so does a lease left
/// unrefreshed for its whole ttl. Dropping it stops the refreshing.
pub struct Heartbeat {
    lost: watch::Receiver<Option<String>>,
    task: JoinHandle<()>,
}

impl Heartbeat {
    /// Starts refreshing `lease` on connections opened from `client`. In cluster mode a `MOVED`
    /// answer sends the next refreshes to the leader it names (with `client`'s settings), and a
    /// failed connection goes back to `client`'s own address.
    pub fn start(client: redis::Client, lease: Lease, every: Option<Duration>) -> Heartbeat {
        let own = Own {
            given: client,
            leader: None,
            conn: None,
        };
        Heartbeat::start_on(own, lease, every)
    }

    /// Starts refreshing `lease` on `conn`, which should reconnect by itself: in cluster mode a
    /// `redis::cluster_async::ClusterConnection`, which finds the leader wherever it is.
    pub fn start_on<C>(mut conn: C, lease: Lease, every: Option<Duration>) -> Heartbeat
    where
        C: ConnectionLike + Send + 'static,
    {
        let (tx, lost) = watch::channel(None);
        let period = every.unwrap_or(Duration::from_millis(lease.ttl_secs * 1000 / 3));
        let task = tokio::spawn(async move {
            let ttl = Duration::from_secs(lease.ttl_secs);
            let mut last_ok = Instant::now();
            let mut wait = period;
            let why = loop {
                tokio::time::sleep(wait).await;
                let expiry = Until::Expiry(last_ok + ttl);
                match send(&mut conn, &lease.retry, expiry, |_| lease.refresh_cmd())
                    .await
                    .result
                {
                    Ok(_) => {
                        last_ok = Instant::now();
                        wait = period;
                    }
                    Err(e) if fate(&e) == Fate::Final => break format!("lease lost: {e}"),
                    Err(e) if last_ok.elapsed() >= ttl => {
                        break format!("lease expired unrefreshed: {e}")
                    }
                    // MOVED more often than one call follows it: ask again after a pause.
                    Err(_) => wait = lease.retry.max_pause,
                }
            };
            let _ = tx.send(Some(why));
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

/// [`Heartbeat::start`]'s connection: opened from the client it was given, moved to the leader
/// a `MOVED` answer names, and opened anew from the given client after any other failure.
struct Own {
    given: redis::Client,
    leader: Option<redis::Client>,
    conn: Option<MultiplexedConnection>,
}

impl Own {
    async fn connected(&mut self) -> RedisResult<&mut MultiplexedConnection> {
        if self.conn.is_none() {
            let client = self.leader.as_ref().unwrap_or(&self.given);
            match client.get_multiplexed_async_connection().await {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.leader = None;
                    return Err(e);
                }
            }
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    async fn call(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let reply = self.connected().await?.req_packed_command(cmd).await;
        match &reply {
            Err(_) => {
                self.conn = None;
                self.leader = None;
            }
            Ok(Value::ServerError(e)) if e.kind() == Some(ServerErrorKind::Moved) => {
                self.conn = None;
                self.leader = e
                    .details()
                    .and_then(|d| d.split_ascii_whitespace().nth(1))
                    .and_then(|addr| redirected(&self.given, addr));
            }
            Ok(_) => {}
        }
        reply
    }
}

impl ConnectionLike for Own {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let conn = self.connected().await?;
            conn.req_packed_commands(cmd, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        self.given.get_connection_info().redis_settings().db()
    }
}

/// A client with `client`'s settings for the `host:port` a `MOVED` answer names.
fn redirected(client: &redis::Client, addr: &str) -> Option<redis::Client> {
    let (host, port) = addr.rsplit_once(':')?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = port.parse().ok()?;
    let info = client.get_connection_info().clone();
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    redis::Client::open(info.set_addr(addr)).ok()
}
