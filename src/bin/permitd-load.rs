//! permitd-load: a load generator for permitd and for the Redis + Lua semaphore it replaces.
//!
//! One client code path drives both servers: the same connections, the same pipelining and
//! the same RESP2 reply parsing (redis-protocol's decoder); only the commands differ:
//!
//! * `--target permitd`: `SEM.ACQUIRE ns sem lease 1 0` + `SEM.RELEASE ns sem lease`, each
//!   connection under its own lease (`LEASE.CREATE`).
//! * `--target lua`: `EVALSHA` of `redis-compat/lua/acquire.lua` and `release.lua` (compiled
//!   into this binary), each connection with its own random holder id.
//!
//! Modes:
//!
//! * `throughput`: C connections, each sends P acquire/release pairs at once (a pipeline of
//!   2P commands, as `redis-benchmark -P` does), waits for all their replies, and repeats,
//!   for D seconds after a warm-up. Reports pairs/s, commands/s and the acquired ratio.
//! * `handoff` (permitd only): one lease holds the only permit of a semaphore, a second one
//!   is parked in `SEM.ACQUIRE ... 10`; measures from sending `SEM.RELEASE` to receiving the
//!   waiter's ACQUIRED reply, N times. Reports p50/p99 in microseconds.
//! * `ping`: C connections pipelining P `PING`s, for D seconds: the same client's ceiling.
//!
//! Every result is one JSON object on one line of stdout; progress goes to stderr. Traffic
//! goes only to the address given (loopback by default); every loop is bounded in time.

use std::error::Error;
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BytesMut};
use clap::{Args, Parser, Subcommand, ValueEnum};
use permitd::protocol::request::encode_request;
use redis_protocol::resp2::decode::decode_range;
use redis_protocol::resp2::types::RangeFrame;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ACQUIRE_LUA: &str = include_str!("../../redis-compat/lua/acquire.lua");
const RELEASE_LUA: &str = include_str!("../../redis-compat/lua/release.lua");

/// The lease TTL the server accepts at most (SPEC §6); runs are kept well inside it.
const MAX_LEASE_TTL: u64 = 300;

/// A reply that takes longer than this ends the run with an error instead of a hang. Longer
/// than any wait this tool asks for (a parked hand-off waiter is answered right after the
/// release that frees it).
const REPLY_TIMEOUT: Duration = Duration::from_secs(15);

type BoxError = Box<dyn Error + Send + Sync>;
type Result<T> = std::result::Result<T, BoxError>;

#[derive(Parser, Debug)]
#[command(
    name = "permitd-load",
    about = "Load generator for permitd and for the Redis + Lua semaphore baseline"
)]
struct Cli {
    /// Server address (keep it on loopback).
    #[arg(long, global = true, default_value = "127.0.0.1")]
    host: String,
    /// Server port.
    #[arg(long, short = 'p', global = true, default_value_t = 6379)]
    port: u16,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// acquire(weight 1, timeout 0) + release pairs, pipelined, for a fixed time.
    Throughput(ThroughputArgs),
    /// Release-to-waiter-grant latency on permitd.
    Handoff(HandoffArgs),
    /// Pipelined PINGs: the client's own ceiling against a server.
    Ping(PingArgs),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    /// permitd's SEM.ACQUIRE / SEM.RELEASE under leases.
    Permitd,
    /// redis-server with redis-compat/lua/{acquire,release}.lua via EVALSHA.
    Lua,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Permitd => "permitd",
            Target::Lua => "lua",
        }
    }
}

#[derive(Args, Debug, Clone)]
struct LoadArgs {
    /// Connections.
    #[arg(short = 'c', long, default_value_t = 50)]
    connections: usize,
    /// Pipeline depth: units of work in flight per connection.
    #[arg(short = 'P', long, default_value_t = 1)]
    pipeline: usize,
    /// Measured seconds (after the warm-up).
    #[arg(short = 'd', long, default_value_t = 10.0)]
    duration: f64,
    /// Warm-up seconds, not counted.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// OS threads, each running a single-threaded tokio runtime; connections are spread
    /// round-robin over them.
    #[arg(long, default_value_t = 2)]
    threads: usize,
}

#[derive(Args, Debug, Clone)]
struct ThroughputArgs {
    /// Which server speaks at --host/--port.
    #[arg(long, value_enum)]
    target: Target,
    #[command(flatten)]
    load: LoadArgs,
    /// Permits per semaphore (default: connections x pipeline, so every acquire fits).
    #[arg(long)]
    permits: Option<u64>,
    /// Semaphores to spread the connections over (connection i uses semaphore i mod K).
    #[arg(long, default_value_t = 1)]
    semaphores: usize,
    /// Namespace (permitd) / key prefix (lua).
    #[arg(long, default_value = "permitd-load")]
    ns: String,
}

#[derive(Args, Debug, Clone)]
struct HandoffArgs {
    /// Measured hand-offs.
    #[arg(short = 'n', long, default_value_t = 2000)]
    count: usize,
    /// Hand-offs before measuring, not counted.
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Seconds the waiter's SEM.ACQUIRE may park.
    #[arg(long, default_value = "10")]
    timeout: String,
    /// Upper bound on the whole run, seconds.
    #[arg(long, default_value_t = 120.0)]
    max_seconds: f64,
    /// Namespace.
    #[arg(long, default_value = "permitd-load")]
    ns: String,
    /// Idle milliseconds between the waiter parking and the release (0: release at once). With
    /// a gap, server and client sleep before each hand-off, as in bench-peers' Node client.
    #[arg(long, default_value_t = 0.0)]
    gap_ms: f64,
}

#[derive(Args, Debug, Clone)]
struct PingArgs {
    /// Which server speaks at --host/--port (only a label here: both answer PING).
    #[arg(long, value_enum)]
    target: Target,
    #[command(flatten)]
    load: LoadArgs,
}

fn main() {
    let cli = Cli::parse();
    let addr = match resolve(&cli.host, cli.port) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("permitd-load: {e}");
            std::process::exit(2);
        }
    };
    let res = match &cli.mode {
        Mode::Throughput(a) => throughput(addr, a),
        Mode::Handoff(a) => handoff(addr, a),
        Mode::Ping(a) => ping(addr, a),
    };
    if let Err(e) = res {
        eprintln!("permitd-load: {e}");
        std::process::exit(1);
    }
}

fn resolve(host: &str, port: u16) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| format!("cannot resolve {host}").into())
}

fn current_thread_runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

// ---------------------------------------------------------------------------------------------
// The connection: RESP2 out, redis-protocol's decoder in.

struct Conn {
    stream: TcpStream,
    rbuf: BytesMut,
}

impl Conn {
    async fn connect(addr: SocketAddr) -> Result<Conn> {
        let stream = tokio::time::timeout(REPLY_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                format!(
                    "connect {addr}: no answer within {} s",
                    REPLY_TIMEOUT.as_secs()
                )
            })?
            .map_err(|e| format!("connect {addr}: {e}"))?;
        Conn::from_stream(stream)
    }

    fn from_stream(stream: TcpStream) -> Result<Conn> {
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
        })
    }

    async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes).await?;
        Ok(())
    }

    /// Reads the next reply and hands it to `f` as the decoder's frame over the raw bytes.
    async fn next<T>(&mut self, f: impl FnOnce(&[u8], &RangeFrame) -> T) -> Result<T> {
        loop {
            if let Some((frame, amt)) = decode_range(&self.rbuf)? {
                let out = f(&self.rbuf[..amt], &frame);
                self.rbuf.advance(amt);
                return Ok(out);
            }
            if self.rbuf.capacity() - self.rbuf.len() < 16 * 1024 {
                self.rbuf.reserve(64 * 1024);
            }
            let read = tokio::time::timeout(REPLY_TIMEOUT, self.stream.read_buf(&mut self.rbuf))
                .await
                .map_err(|_| {
                    format!(
                        "no reply within {} s ({} bytes of a partial reply buffered): the server stalled or lost a reply",
                        REPLY_TIMEOUT.as_secs(),
                        self.rbuf.len()
                    )
                })??;
            if read == 0 {
                return Err("server closed the connection".into());
            }
        }
    }

    /// One command, one reply, as an owned value (setup and control, not the hot path).
    async fn call(&mut self, args: &[&[u8]]) -> Result<Value> {
        let mut out = Vec::new();
        encode_request(&mut out, args);
        let reply = async {
            self.send(&out).await?;
            self.next(Value::from_range).await
        };
        reply.await.map_err(|e| {
            let name = args
                .first()
                .map(|a| String::from_utf8_lossy(a).into_owned());
            format!("{}: {e}", name.unwrap_or_default()).into()
        })
    }
}

/// An owned reply, for the setup and control paths.
#[derive(Debug, Clone, PartialEq)]
enum Value {
    Str(Vec<u8>),
    Error(String),
    Int(i64),
    Array(Vec<Value>),
    Null,
}

impl Value {
    fn from_range(buf: &[u8], f: &RangeFrame) -> Value {
        match f {
            RangeFrame::SimpleString((s, e)) | RangeFrame::BulkString((s, e)) => {
                Value::Str(buf[*s..*e].to_vec())
            }
            RangeFrame::Error((s, e)) => {
                Value::Error(String::from_utf8_lossy(&buf[*s..*e]).into_owned())
            }
            RangeFrame::Integer(i) => Value::Int(*i),
            RangeFrame::Array(items) => {
                Value::Array(items.iter().map(|i| Value::from_range(buf, i)).collect())
            }
            RangeFrame::Null => Value::Null,
        }
    }

    /// The reply, or the server's error as an `Err` naming what was asked.
    fn ok(self, what: &str) -> Result<Value> {
        match self {
            Value::Error(e) => Err(format!("{what}: -{e}").into()),
            v => Ok(v),
        }
    }

    /// A field of a map reply (RESP2: a flat [field, value, ...] array).
    fn field(&self, name: &str) -> Option<&Value> {
        match self {
            Value::Array(items) => items
                .chunks_exact(2)
                .find(|kv| matches!(&kv[0], Value::Str(k) if k == name.as_bytes()))
                .map(|kv| &kv[1]),
            _ => None,
        }
    }

    fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Reply classification on the hot path: no owned copies, only the decoder's ranges.

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Outcome {
    Acquired,
    Unavailable,
    TimedOut,
}

fn range<'a>(buf: &'a [u8], f: &RangeFrame) -> Option<&'a [u8]> {
    match f {
        RangeFrame::SimpleString((s, e)) | RangeFrame::BulkString((s, e)) => Some(&buf[*s..*e]),
        _ => None,
    }
}

fn server_error(buf: &[u8], f: &RangeFrame, what: &str) -> BoxError {
    match f {
        RangeFrame::Error((s, e)) => {
            format!("{what}: -{}", String::from_utf8_lossy(&buf[*s..*e])).into()
        }
        other => format!(
            "{what}: unexpected reply {:?}",
            Value::from_range(buf, other)
        )
        .into(),
    }
}

/// permitd's acquire result: a map whose `outcome` names what happened.
fn permitd_outcome(buf: &[u8], f: &RangeFrame) -> Result<Outcome> {
    if let RangeFrame::Array(items) = f {
        for kv in items.chunks_exact(2) {
            if range(buf, &kv[0]) == Some(b"outcome") {
                return match range(buf, &kv[1]) {
                    Some(b"ACQUIRE_OUTCOME_ACQUIRED") => Ok(Outcome::Acquired),
                    Some(b"ACQUIRE_OUTCOME_UNAVAILABLE") => Ok(Outcome::Unavailable),
                    Some(b"ACQUIRE_OUTCOME_TIMED_OUT") => Ok(Outcome::TimedOut),
                    _ => Err(server_error(buf, f, "SEM.ACQUIRE: unknown outcome")),
                };
            }
        }
    }
    Err(server_error(buf, f, "SEM.ACQUIRE"))
}

/// permitd's release result: the semaphore map.
fn permitd_released(buf: &[u8], f: &RangeFrame) -> Result<()> {
    match f {
        RangeFrame::Array(_) => Ok(()),
        _ => Err(server_error(buf, f, "SEM.RELEASE")),
    }
}

/// acquire.lua's `{1|0, held}`.
fn lua_outcome(buf: &[u8], f: &RangeFrame) -> Result<Outcome> {
    match f {
        RangeFrame::Array(items) => match items.first() {
            Some(RangeFrame::Integer(1)) => Ok(Outcome::Acquired),
            Some(RangeFrame::Integer(0)) => Ok(Outcome::Unavailable),
            _ => Err(server_error(buf, f, "EVALSHA acquire.lua")),
        },
        _ => Err(server_error(buf, f, "EVALSHA acquire.lua")),
    }
}

/// release.lua's `{1|0, held}`.
fn lua_released(buf: &[u8], f: &RangeFrame) -> Result<()> {
    match f {
        RangeFrame::Array(items) if matches!(items.first(), Some(RangeFrame::Integer(_))) => Ok(()),
        _ => Err(server_error(buf, f, "EVALSHA release.lua")),
    }
}

fn pong(buf: &[u8], f: &RangeFrame) -> Result<()> {
    match range(buf, f) {
        Some(b"PONG") => Ok(()),
        _ => Err(server_error(buf, f, "PING")),
    }
}

// ---------------------------------------------------------------------------------------------
// Setup helpers.

fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).map_err(|e| format!("getrandom: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// NS.CREATE, accepting a namespace that already exists.
async fn ensure_namespace(conn: &mut Conn, ns: &str) -> Result<()> {
    match conn.call(&[b"NS.CREATE", ns.as_bytes()]).await? {
        Value::Error(e) if e.starts_with("ALREADYEXISTS") => Ok(()),
        v => v.ok("NS.CREATE").map(|_| ()),
    }
}

async fn create_semaphore(conn: &mut Conn, ns: &str, sem: &str, permits: u64) -> Result<()> {
    conn.call(&[
        b"SEM.CREATE",
        ns.as_bytes(),
        sem.as_bytes(),
        permits.to_string().as_bytes(),
    ])
    .await?
    .ok("SEM.CREATE")
    .map(|_| ())
}

async fn create_lease(conn: &mut Conn, ns: &str, process: &str, ttl: u64) -> Result<String> {
    let v = conn
        .call(&[
            b"LEASE.CREATE",
            ns.as_bytes(),
            process.as_bytes(),
            ttl.to_string().as_bytes(),
        ])
        .await?
        .ok("LEASE.CREATE")?;
    let id = v
        .field("lease_id")
        .and_then(Value::as_bytes)
        .ok_or_else(|| format!("LEASE.CREATE: no lease_id in {v:?}"))?;
    Ok(String::from_utf8_lossy(id).into_owned())
}

fn lease_ttl_for(load: &LoadArgs) -> Result<u64> {
    let need = load.warmup + load.duration + 30.0;
    if need > MAX_LEASE_TTL as f64 {
        return Err(format!(
            "warm-up + duration must stay under {} s (the longest lease TTL)",
            MAX_LEASE_TTL - 30
        )
        .into());
    }
    Ok(MAX_LEASE_TTL)
}

fn check_load(load: &LoadArgs) -> Result<()> {
    if load.connections == 0 || load.pipeline == 0 || load.threads == 0 {
        return Err("connections, pipeline and threads must be > 0".into());
    }
    let duration_ok = load.duration > 0.0 && load.duration <= 600.0;
    if !duration_ok || !(0.0..=60.0).contains(&load.warmup) {
        return Err("duration must be in (0, 600] s and warm-up in [0, 60] s".into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The timed loop shared by throughput and ping.

/// What one connection sends per round and how it reads the replies.
#[derive(Copy, Clone)]
enum Work {
    /// `pipeline` x (acquire, release) of a target.
    Pairs(Target),
    /// `pipeline` x PING.
    Ping,
}

struct Job {
    /// The connection's index, for error messages.
    id: usize,
    stream: std::net::TcpStream,
    batch: Vec<u8>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Counts {
    units: u64,
    acquired: u64,
    unavailable: u64,
    timed_out: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.units += o.units;
        self.acquired += o.acquired;
        self.unavailable += o.unavailable;
        self.timed_out += o.timed_out;
    }
}

async fn drive(
    id: usize,
    conn: Conn,
    batch: Vec<u8>,
    work: Work,
    pipeline: usize,
    measure_from: Instant,
    until: Instant,
) -> Result<Counts> {
    let mut at = (0u64, 0usize); // (round, unit) in progress, for the error message
    drive_rounds(conn, &batch, work, pipeline, measure_from, until, &mut at)
        .await
        .map_err(|e| {
            format!(
                "connection {id}, round {}, reply pair {} of {pipeline}: {e}",
                at.0 + 1,
                at.1 + 1
            )
            .into()
        })
}

async fn drive_rounds(
    mut conn: Conn,
    batch: &[u8],
    work: Work,
    pipeline: usize,
    measure_from: Instant,
    until: Instant,
    at: &mut (u64, usize),
) -> Result<Counts> {
    let mut counts = Counts::default();
    while Instant::now() < until {
        conn.send(batch).await?;
        let mut round = Counts::default();
        for unit in 0..pipeline {
            at.1 = unit;
            match work {
                Work::Pairs(t) => {
                    let outcome = match t {
                        Target::Permitd => conn.next(permitd_outcome).await??,
                        Target::Lua => conn.next(lua_outcome).await??,
                    };
                    match outcome {
                        Outcome::Acquired => round.acquired += 1,
                        Outcome::Unavailable => round.unavailable += 1,
                        Outcome::TimedOut => round.timed_out += 1,
                    }
                    match t {
                        Target::Permitd => conn.next(permitd_released).await??,
                        Target::Lua => conn.next(lua_released).await??,
                    }
                }
                Work::Ping => conn.next(pong).await??,
            }
            round.units += 1;
        }
        let done = Instant::now();
        if done >= measure_from && done <= until {
            counts.add(round);
        }
        at.0 += 1;
    }
    Ok(counts)
}

/// Runs the jobs on `threads` OS threads with one current-thread runtime each; returns the
/// summed counts and the measured seconds.
fn run_jobs(jobs: Vec<Job>, work: Work, load: &LoadArgs) -> Result<(Counts, f64)> {
    let threads = load.threads.min(jobs.len()).max(1);
    let mut per_thread: Vec<Vec<Job>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, j) in jobs.into_iter().enumerate() {
        per_thread[i % threads].push(j);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(load.warmup);
    let until = measure_from + Duration::from_secs_f64(load.duration);
    let pipeline = load.pipeline;
    let handles: Vec<_> = per_thread
        .into_iter()
        .map(|jobs| {
            std::thread::spawn(move || -> Result<Counts> {
                let rt = current_thread_runtime()?;
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for job in jobs {
                        let conn = Conn::from_stream(TcpStream::from_std(job.stream)?)?;
                        tasks.push(tokio::spawn(drive(
                            job.id,
                            conn,
                            job.batch,
                            work,
                            pipeline,
                            measure_from,
                            until,
                        )));
                    }
                    let mut total = Counts::default();
                    for t in tasks {
                        total.add(t.await.map_err(|e| format!("worker task: {e}"))??);
                    }
                    Ok(total)
                })
            })
        })
        .collect();
    let mut total = Counts::default();
    for h in handles {
        total.add(h.join().map_err(|_| "worker thread panicked")??);
    }
    Ok((total, load.duration))
}

async fn connect_all(addr: SocketAddr, n: usize) -> Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Conn::connect(addr).await?);
    }
    Ok(conns)
}

fn into_job(id: usize, conn: Conn, batch: Vec<u8>) -> Result<Job> {
    if !conn.rbuf.is_empty() {
        return Err("unread reply left on a connection".into());
    }
    Ok(Job {
        id,
        stream: conn.stream.into_std()?,
        batch,
    })
}

// ---------------------------------------------------------------------------------------------
// throughput

fn throughput(addr: SocketAddr, a: &ThroughputArgs) -> Result<()> {
    check_load(&a.load)?;
    if a.semaphores == 0 {
        return Err("--semaphores must be > 0".into());
    }
    let c = a.load.connections;
    let p = a.load.pipeline;
    let permits = a.permits.unwrap_or((c * p) as u64).max(1);
    let lease_ttl = lease_ttl_for(&a.load)?;
    let rt = current_thread_runtime()?;
    let run = unique_suffix();
    let sems: Vec<String> = (0..a.semaphores).map(|i| format!("tp_{run}_{i}")).collect();

    // Setup: one control connection, then C workers each with its own lease / holder id.
    let (jobs, mut ctl, cleanup) = rt.block_on(async {
        let mut ctl = Conn::connect(addr).await?;
        let mut conns = connect_all(addr, c).await?;
        let mut jobs = Vec::with_capacity(c);
        let mut cleanup: Vec<Vec<Vec<u8>>> = Vec::new();
        match a.target {
            Target::Permitd => {
                ensure_namespace(&mut ctl, &a.ns).await?;
                for s in &sems {
                    create_semaphore(&mut ctl, &a.ns, s, permits).await?;
                    cleanup.push(vec![
                        b"SEM.DELETE".to_vec(),
                        a.ns.clone().into(),
                        s.clone().into(),
                    ]);
                }
                for (i, conn) in conns.drain(..).enumerate() {
                    let mut conn = conn;
                    let lease =
                        create_lease(&mut conn, &a.ns, &format!("permitd-load-{i}"), lease_ttl)
                            .await?;
                    let sem = &sems[i % sems.len()];
                    let mut batch = Vec::new();
                    for _ in 0..p {
                        encode_request(
                            &mut batch,
                            &[
                                b"SEM.ACQUIRE",
                                a.ns.as_bytes(),
                                sem.as_bytes(),
                                lease.as_bytes(),
                                b"1",
                                b"0",
                            ],
                        );
                        encode_request(
                            &mut batch,
                            &[
                                b"SEM.RELEASE",
                                a.ns.as_bytes(),
                                sem.as_bytes(),
                                lease.as_bytes(),
                            ],
                        );
                    }
                    cleanup.push(vec![
                        b"LEASE.REVOKE".to_vec(),
                        a.ns.clone().into(),
                        lease.into(),
                    ]);
                    jobs.push(into_job(i, conn, batch)?);
                }
            }
            Target::Lua => {
                let acq = script_load(&mut ctl, ACQUIRE_LUA).await?;
                let rel = script_load(&mut ctl, RELEASE_LUA).await?;
                let ttl_ms = (lease_ttl * 1000).to_string();
                let permits = permits.to_string();
                for s in &sems {
                    let (hk, wk) = lua_keys(&a.ns, s);
                    cleanup.push(vec![b"DEL".to_vec(), hk.into(), wk.into()]);
                }
                for (i, conn) in conns.drain(..).enumerate() {
                    let holder = format!("h_{}", random_hex(16)?);
                    let (hk, wk) = lua_keys(&a.ns, &sems[i % sems.len()]);
                    let mut batch = Vec::new();
                    for _ in 0..p {
                        encode_request(
                            &mut batch,
                            &[
                                b"EVALSHA",
                                acq.as_bytes(),
                                b"2",
                                hk.as_bytes(),
                                wk.as_bytes(),
                                holder.as_bytes(),
                                b"1",
                                permits.as_bytes(),
                                ttl_ms.as_bytes(),
                            ],
                        );
                        encode_request(
                            &mut batch,
                            &[
                                b"EVALSHA",
                                rel.as_bytes(),
                                b"2",
                                hk.as_bytes(),
                                wk.as_bytes(),
                                holder.as_bytes(),
                            ],
                        );
                    }
                    jobs.push(into_job(i, conn, batch)?);
                }
            }
        }
        Ok::<_, BoxError>((jobs, ctl, cleanup))
    })?;

    eprintln!(
        "permitd-load: throughput target={} c={c} P={p} permits={permits} semaphores={} warmup={}s duration={}s threads={}",
        a.target.name(),
        sems.len(),
        a.load.warmup,
        a.load.duration,
        a.load.threads
    );
    let (counts, secs) = run_jobs(jobs, Work::Pairs(a.target), &a.load)?;

    // Best-effort cleanup, so a long-lived server is left as it was.
    rt.block_on(async {
        for cmd in &cleanup {
            let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
            let _ = ctl.call(&args).await;
        }
    });

    let pairs_per_sec = counts.units as f64 / secs;
    let ratio = if counts.units > 0 {
        counts.acquired as f64 / counts.units as f64
    } else {
        0.0
    };
    println!(
        "{{\"mode\":\"throughput\",\"target\":\"{}\",\"connections\":{c},\"pipeline\":{p},\"permits\":{permits},\"semaphores\":{},\"threads\":{},\"duration_s\":{secs},\"pairs\":{},\"pairs_per_sec\":{:.1},\"commands_per_sec\":{:.1},\"acquired\":{},\"unavailable\":{},\"timed_out\":{},\"acquired_ratio\":{:.4}}}",
        a.target.name(),
        sems.len(),
        a.load.threads,
        counts.units,
        pairs_per_sec,
        2.0 * pairs_per_sec,
        counts.acquired,
        counts.unavailable,
        counts.timed_out,
        ratio
    );
    Ok(())
}

fn lua_keys(prefix: &str, sem: &str) -> (String, String) {
    // One hash tag, so both keys of a semaphore share a Redis Cluster slot.
    (
        format!("{{{prefix}:{sem}}}:holders"),
        format!("{{{prefix}:{sem}}}:weights"),
    )
}

async fn script_load(conn: &mut Conn, body: &str) -> Result<String> {
    let v = conn
        .call(&[b"SCRIPT", b"LOAD", body.as_bytes()])
        .await?
        .ok("SCRIPT LOAD")?;
    v.as_bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .ok_or_else(|| format!("SCRIPT LOAD: unexpected reply {v:?}").into())
}

// ---------------------------------------------------------------------------------------------
// ping

fn ping(addr: SocketAddr, a: &PingArgs) -> Result<()> {
    check_load(&a.load)?;
    let c = a.load.connections;
    let p = a.load.pipeline;
    let rt = current_thread_runtime()?;
    let jobs = rt.block_on(async {
        let conns = connect_all(addr, c).await?;
        let mut batch = Vec::new();
        for _ in 0..p {
            encode_request(&mut batch, &[b"PING"]);
        }
        conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| into_job(i, conn, batch.clone()))
            .collect::<Result<Vec<_>>>()
    })?;
    let (counts, secs) = run_jobs(jobs, Work::Ping, &a.load)?;
    println!(
        "{{\"mode\":\"ping\",\"target\":\"{}\",\"connections\":{c},\"pipeline\":{p},\"threads\":{},\"duration_s\":{secs},\"commands\":{},\"commands_per_sec\":{:.1}}}",
        a.target.name(),
        a.load.threads,
        counts.units,
        counts.units as f64 / secs
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// handoff

fn handoff(addr: SocketAddr, a: &HandoffArgs) -> Result<()> {
    if a.count == 0 {
        return Err("--count must be > 0".into());
    }
    let rt = current_thread_runtime()?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.max_seconds.clamp(1.0, 600.0));
    let sem = format!("ho_{}", unique_suffix());
    let mut samples = rt.block_on(async {
        let mut ctl = Conn::connect(addr).await?;
        let mut x = Conn::connect(addr).await?;
        let mut y = Conn::connect(addr).await?;
        ensure_namespace(&mut ctl, &a.ns).await?;
        create_semaphore(&mut ctl, &a.ns, &sem, 1).await?;
        let lx = create_lease(&mut x, &a.ns, "permitd-load-handoff-a", MAX_LEASE_TTL).await?;
        let ly = create_lease(&mut y, &a.ns, "permitd-load-handoff-b", MAX_LEASE_TTL).await?;
        let ns = a.ns.as_bytes();
        let sb = sem.as_bytes();

        // x takes the only permit.
        let mut buf = Vec::new();
        encode_request(
            &mut buf,
            &[b"SEM.ACQUIRE", ns, sb, lx.as_bytes(), b"1", b"0"],
        );
        x.send(&buf).await?;
        if x.next(permitd_outcome).await?? != Outcome::Acquired {
            return Err("the first holder did not acquire the free permit".into());
        }

        let mut holder = (&mut x, lx.as_str());
        let mut waiter = (&mut y, ly.as_str());
        let mut park_probe = ParkProbe::Info;
        let mut samples = Vec::with_capacity(a.count);
        for i in 0..a.warmup + a.count {
            if Instant::now() > deadline {
                return Err(format!("handoff: --max-seconds reached after {i} hand-offs").into());
            }
            // The waiter parks ...
            buf.clear();
            encode_request(
                &mut buf,
                &[
                    b"SEM.ACQUIRE",
                    ns,
                    sb,
                    waiter.1.as_bytes(),
                    b"1",
                    a.timeout.as_bytes(),
                ],
            );
            waiter.0.send(&buf).await?;
            park_probe.wait_parked(&mut ctl).await?;
            if a.gap_ms > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(a.gap_ms / 1000.0)).await;
            }
            // ... the holder releases, and the clock runs until the waiter hears ACQUIRED.
            buf.clear();
            encode_request(&mut buf, &[b"SEM.RELEASE", ns, sb, holder.1.as_bytes()]);
            let t0 = Instant::now();
            holder.0.send(&buf).await?;
            let outcome = waiter.0.next(permitd_outcome).await??;
            let elapsed = t0.elapsed();
            if outcome != Outcome::Acquired {
                return Err(format!("handoff: the waiter got {outcome:?}, not ACQUIRED").into());
            }
            holder.0.next(permitd_released).await??;
            if i >= a.warmup {
                samples.push(elapsed.as_nanos() as u64);
            }
            std::mem::swap(&mut holder, &mut waiter);
        }

        // Cleanup: the semaphore and both leases.
        let _ = ctl.call(&[b"SEM.DELETE", ns, sb]).await;
        let _ = ctl.call(&[b"LEASE.REVOKE", ns, lx.as_bytes()]).await;
        let _ = ctl.call(&[b"LEASE.REVOKE", ns, ly.as_bytes()]).await;
        if park_probe == ParkProbe::Sleep {
            eprintln!("permitd-load: INFO has no blocked_clients; waited 2 ms per park instead");
        }
        Ok::<_, BoxError>(samples)
    })?;

    samples.sort_unstable();
    let us = |q: f64| percentile(&samples, q) as f64 / 1000.0;
    let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
    println!(
        "{{\"mode\":\"handoff\",\"target\":\"permitd\",\"count\":{},\"p50_us\":{:.1},\"p90_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1},\"mean_us\":{:.1}}}",
        samples.len(),
        us(0.50),
        us(0.90),
        us(0.99),
        us(1.0),
        mean
    );
    Ok(())
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How the hand-off loop knows the waiter is parked before the holder releases.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ParkProbe {
    /// Poll `INFO clients` until `blocked_clients` is at least 1.
    Info,
    /// The server's INFO has no `blocked_clients`: wait a fixed 2 ms.
    Sleep,
}

impl ParkProbe {
    async fn wait_parked(&mut self, ctl: &mut Conn) -> Result<()> {
        let give_up = Instant::now() + Duration::from_secs(5);
        loop {
            if *self == ParkProbe::Sleep {
                tokio::time::sleep(Duration::from_millis(2)).await;
                return Ok(());
            }
            let info = ctl.call(&[b"INFO", b"clients"]).await?.ok("INFO clients")?;
            match info.as_bytes().and_then(blocked_clients) {
                Some(n) if n >= 1 => return Ok(()),
                Some(_) => {}
                None => *self = ParkProbe::Sleep,
            }
            if Instant::now() > give_up {
                return Err("handoff: the waiter never showed as parked (blocked_clients)".into());
            }
        }
    }
}

fn blocked_clients(info: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(info).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(bytes: &[u8]) -> RangeFrame {
        decode_range(bytes).unwrap().unwrap().0
    }

    #[test]
    fn classifies_permitd_outcomes() {
        let acquired = b"*6\r\n$7\r\noutcome\r\n$24\r\nACQUIRE_OUTCOME_ACQUIRED\r\n$9\r\nsemaphore\r\n*0\r\n$13\r\nfencing_token\r\n:7\r\n";
        assert_eq!(
            permitd_outcome(acquired, &decode(acquired)).unwrap(),
            Outcome::Acquired
        );
        let unavailable =
            b"*4\r\n$9\r\nsemaphore\r\n*0\r\n$7\r\noutcome\r\n$27\r\nACQUIRE_OUTCOME_UNAVAILABLE\r\n";
        assert_eq!(
            permitd_outcome(unavailable, &decode(unavailable)).unwrap(),
            Outcome::Unavailable
        );
        let err = b"-NOTFOUND lease not found\r\n";
        let e = permitd_outcome(err, &decode(err)).unwrap_err().to_string();
        assert!(e.contains("NOTFOUND lease not found"), "{e}");
    }

    #[test]
    fn classifies_lua_outcomes() {
        let yes = b"*2\r\n:1\r\n:3\r\n";
        assert_eq!(lua_outcome(yes, &decode(yes)).unwrap(), Outcome::Acquired);
        let no = b"*2\r\n:0\r\n:3\r\n";
        assert_eq!(lua_outcome(no, &decode(no)).unwrap(), Outcome::Unavailable);
        assert!(lua_released(no, &decode(no)).is_ok());
    }

    #[test]
    fn encodes_commands_as_resp2_arrays() {
        let mut out = Vec::new();
        encode_request(&mut out, &[b"PING"]);
        encode_request(&mut out, &[b"ECHO", b""]);
        assert_eq!(out, b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n");
    }

    #[test]
    fn reads_map_fields_and_info() {
        let raw = b"*4\r\n$8\r\nlease_id\r\n$5\r\nls_ab\r\n$10\r\nprocess_id\r\n$1\r\np\r\n";
        let v = Value::from_range(raw, &decode(raw));
        assert_eq!(
            v.field("lease_id").and_then(Value::as_bytes),
            Some(&b"ls_ab"[..])
        );
        assert_eq!(
            blocked_clients(b"# Clients\r\nconnected_clients:3\r\nblocked_clients:1\r\n"),
            Some(1)
        );
        assert_eq!(blocked_clients(b"# Clients\r\n"), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&s, 0.5), 50);
        assert_eq!(percentile(&s, 0.99), 99);
        assert_eq!(percentile(&s, 1.0), 100);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
