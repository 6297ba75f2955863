//! Shared harness for the integration tests: starts the real `permitd` binary on a free
//! loopback port with its own data directory, and gives tests real clients for it (the `redis`
//! crate, and raw TCP sockets for wire-level checks, read with the client crate's reply reader),
//! and the helpers several test files use.
//!
//! Each test file includes it with `mod common;`. Not every file uses every helper, hence the
//! `dead_code` allowance below.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// Not every test file uses it (as with `dead_code` above).
#[allow(unused_imports)]
pub use permitd_client::now_ns;
use permitd_client::resp::ReadError;
/// A reply read off a raw socket, RESP2 or RESP3.
pub use permitd_client::resp::Value as Resp;
use redis::Value;

pub mod cluster;
pub mod disk;
pub mod pki;

/// How long a server may take to answer its first PING after being spawned.
pub const START_TIMEOUT: Duration = Duration::from_secs(15);

/// Read timeout given to the clients handed out here, so a server that never answers fails the
/// test instead of hanging it.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(30);

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A running `permitd` process with its own temp directory; killed and removed on drop.
pub struct Server {
    child: Option<Child>,
    port: u16,
    root: PathBuf,
    dir: PathBuf,
    log: PathBuf,
    extra: Vec<String>,
    /// The open-files limit (RLIMIT_NOFILE: soft, hard) it runs under, when not this process's.
    nofile: Option<(u64, u64)>,
}

impl Server {
    /// Starts a server with the default options (`--shards 2`).
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts a server with extra command-line options after the harness's own
    /// (`--bind 127.0.0.1 --port P --dir D --shards 2`; pass `--bind` or `--shards` to override
    /// those).
    pub fn start_with(args: &[&str]) -> Server {
        Server::start_with_nofile(None, args)
    }

    /// [`Server::start_with`] under the open-files limit `nofile` (RLIMIT_NOFILE, soft and
    /// hard), set in the server's process before permitd runs (`ulimit -Sn`/`-Hn`).
    pub fn start_with_nofile(nofile: Option<(u64, u64)>, args: &[&str]) -> Server {
        // The free port is found by binding and dropping a listener, so another process may
        // take it before the server binds it: retry with a new port if the server dies early.
        let mut last_err = String::new();
        for _ in 0..3 {
            match Server::start_at_nofile(free_port(), args, nofile) {
                Ok(server) => return server,
                Err(e) => last_err = e,
            }
        }
        panic!("permitd did not start: {last_err}");
    }

    /// Like [`Server::start_with`] on the given port, once: for a caller that chose its ports
    /// beforehand (a cluster's nodes name each other's). The error carries the server's log.
    pub fn start_at(port: u16, args: &[&str]) -> Result<Server, String> {
        Server::start_at_nofile(port, args, None)
    }

    fn start_at_nofile(
        port: u16,
        args: &[&str],
        nofile: Option<(u64, u64)>,
    ) -> Result<Server, String> {
        let root = unique_temp_dir();
        let dir = root.join("data");
        fs::create_dir_all(&dir).expect("create server data dir");
        let log = root.join("permitd.log");
        let mut server = Server {
            child: None,
            port,
            root,
            dir,
            log,
            extra: args.iter().map(|s| s.to_string()).collect(),
            nofile,
        };
        server
            .spawn_and_wait()
            .map_err(|e| format!("{e}\n--- server log ---\n{}", server.log_tail(60)))?;
        Ok(server)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The server's data directory (`--dir`).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Sends the running server signal `sig` (SIGSTOP freezes it: its sockets stay open and
    /// nothing answers; SIGCONT thaws it).
    pub fn signal(&self, sig: libc::c_int) {
        let pid = self.pid().expect("the server is not running");
        // SAFETY: kill(2) with a pid this process spawned and still owns (not reaped).
        let rc = unsafe { libc::kill(pid as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({pid}, {sig}) failed");
    }

    /// Whether the server process is still alive (not exited, not killed).
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Runs the server with `args` and expects it to refuse to start: returns its exit status
    /// and what it wrote to stderr. Panics if it is still running after [`START_TIMEOUT`].
    pub fn refused(args: &[&str]) -> (std::process::ExitStatus, String) {
        let root = unique_temp_dir();
        let refusal = refused_on(&root.join("data"), args);
        let _ = fs::remove_dir_all(&root);
        refusal
    }

    /// Runs another server with `args` on this one's data directory (and a port of its own),
    /// and expects it to refuse to start, as [`Server::refused`].
    pub fn refused_beside(&self, args: &[&str]) -> (std::process::ExitStatus, String) {
        refused_on(&self.dir, args)
    }

    /// Starts the server again on its port and data directory (SIGKILLing it first if it still
    /// runs) with `args` in place of its extra options, and expects it to refuse to start:
    /// returns its exit status and what it wrote to stderr, as [`Server::refused`]. The options
    /// it was started with stay those of a later [`Server::restart`].
    pub fn refused_restart_with(&mut self, args: &[&str]) -> (std::process::ExitStatus, String) {
        self.kill9();
        let extra: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        wait_refusal(&mut self.command(&extra), args)
    }

    /// Waits up to `timeout` for the server to exit by itself, and returns how it exited
    /// (`None`: still running). Added for tests/panic.rs (DEBUG PANIC).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Some(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The server's resident memory (VmRSS from /proc), in KiB.
    pub fn rss_kb(&self) -> u64 {
        let pid = self.pid().expect("server is not running");
        let status =
            fs::read_to_string(format!("/proc/{pid}/status")).expect("read /proc/PID/status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/PID/status")
    }

    /// Everything the server has logged (stderr) so far, across restarts.
    pub fn log_contents(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The lines of the server's log that hold one of `words`.
    pub fn log_lines_with(&self, words: &[&str]) -> String {
        let all = self.log_contents();
        let hits: Vec<&str> = all
            .lines()
            .filter(|l| words.iter().any(|w| l.contains(w)))
            .collect();
        hits[hits.len().saturating_sub(20)..].join("\n")
    }

    /// The last `n` lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        let all = self.log_contents();
        let lines: Vec<&str> = all.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Kills the server with SIGKILL (no chance to flush anything) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks the server to stop with SIGTERM and waits up to `timeout` for it to exit; returns
    /// whether it exited by itself (it is SIGKILLed otherwise).
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Starts the server again on the same port and data directory (SIGKILLing it first if it
    /// still runs), and waits until it answers.
    pub fn restart(&mut self) {
        self.kill9();
        // The port was just released; a few tries cover a slow release.
        let mut last_err = String::new();
        for _ in 0..3 {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(e) => {
                    last_err = e;
                    thread::sleep(Duration::from_millis(300));
                }
            }
        }
        panic!(
            "permitd did not restart: {last_err}\n--- what it said went wrong ---\n{}\n--- server \
             log ---\n{}",
            self.log_lines_with(&["panicked", "ERROR", "WARN"]),
            self.log_tail(60)
        );
    }

    /// [`Server::restart`] with `args` in place of the extra options it was started with.
    pub fn restart_with(&mut self, args: &[&str]) {
        self.extra = args.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// A `redis` crate client for this server (RESP2, no password).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("redis client")
    }

    /// A synchronous connection (RESP2) with a read timeout.
    pub fn conn(&self) -> redis::Connection {
        connect_url(&self.url())
    }

    /// A synchronous connection that negotiated RESP3 (`?protocol=resp3`).
    pub fn conn_resp3(&self) -> redis::Connection {
        connect_url(&format!("{}/?protocol=resp3", self.url()))
    }

    /// An async multiplexed connection (tokio); `resp3` picks the protocol.
    pub async fn async_conn(&self, resp3: bool) -> redis::aio::MultiplexedConnection {
        let url = if resp3 {
            format!("{}/?protocol=resp3", self.url())
        } else {
            self.url()
        };
        redis::Client::open(url)
            .expect("redis client")
            .get_multiplexed_async_connection()
            .await
            .expect("async connection")
    }

    /// A raw TCP connection with read/write timeouts.
    pub fn raw(&self) -> RawConn {
        RawConn::connect(self.addr())
    }

    /// The server's command line on its port and data directory, with `extra` options.
    fn command(&self, extra: &[String]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_permitd"));
        if !extra.iter().any(|a| a == "--bind") {
            cmd.arg("--bind").arg("127.0.0.1");
        }
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--dir")
            .arg(&self.dir);
        if !extra.iter().any(|a| a == "--shards") {
            cmd.arg("--shards").arg("2");
        }
        cmd.args(extra);
        if let Some((soft, hard)) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = libc::rlimit {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: between fork and exec the closure only calls setrlimit(2), which is
            // async-signal-safe, on a limit it owns.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(io::Error::last_os_error())
                    }
                });
            }
        }
        cmd
    }

    fn spawn_and_wait(&mut self) -> Result<(), String> {
        let stderr = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("open log: {e}"))?;
        let mut cmd = self.command(&self.extra);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr));
        let child = cmd.spawn().map_err(|e| format!("spawn permitd: {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("permitd exited early with {status}"));
            }
            if ping_once(self.addr()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill9();
                return Err(format!(
                    "no answer to PING on port {} within {START_TIMEOUT:?}",
                    self.port
                ));
            }
            thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        if thread::panicking() {
            eprintln!(
                "--- permitd log (last lines, {}) ---\n{}",
                self.log.display(),
                self.log_tail(40)
            );
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// `count` distinct ports that were free a moment ago.
pub fn free_ports(count: usize) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::with_capacity(count);
    while ports.len() < count {
        let p = free_port();
        if !ports.contains(&p) {
            ports.push(p);
        }
    }
    ports
}

/// A port that was free a moment ago on 127.0.0.1, never handed out before in this process,
/// and below the kernel's ephemeral range (32768 and up): a port from that range may become
/// the source port of any outgoing connection (another test's nodes dialing their peers)
/// between this check and the server's bind. That failed a cluster start with "Address
/// already in use" on a node's cluster port, which a cluster cannot retry alone (its nodes
/// name each other's ports).
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let p = 10_000 + (h.finish() % 22_000) as u16;
        if !given.contains(&p) && TcpListener::bind(("127.0.0.1", p)).is_ok() {
            given.push(p);
            return p;
        }
    }
}

/// A new, empty directory under the system temp dir, unique to this process and call.
pub fn unique_temp_dir() -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let p = std::env::temp_dir().join(format!(
        "permitd-test-{}-{}-{}",
        std::process::id(),
        n,
        nanos
    ));
    fs::create_dir_all(&p).expect("create temp dir");
    p
}

/// Runs a server on `dir` (a free port) with `args`, expecting it to refuse to start: its exit
/// status and stderr.
fn refused_on(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_permitd"));
    let port = free_port().to_string();
    cmd.args(["--bind", "127.0.0.1", "--port", &port, "--dir"])
        .arg(dir)
        .args(args);
    wait_refusal(&mut cmd, args)
}

/// Runs `cmd`, a server started with `args` that should refuse to start, and waits for it to
/// exit: its exit status and what it wrote to stderr. Panics (killing it) if it still runs
/// after [`START_TIMEOUT`].
fn wait_refusal(cmd: &mut Command, args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn permitd");
    let deadline = Instant::now() + START_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for permitd") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("permitd started with {args:?}, where it should have refused");
        }
        thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    let _ = child
        .stderr
        .take()
        .map(|mut e| e.read_to_string(&mut stderr));
    (status, stderr)
}

/// One PING over a fresh connection; true when the server answered (`+PONG`, or `-NOAUTH` when a
/// password is configured).
fn ping_once(addr: SocketAddr) -> bool {
    let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    let mut w = &s;
    if w.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut line = String::new();
    match BufReader::new(&s).read_line(&mut line) {
        Ok(_) => line.starts_with("+PONG") || line.starts_with("-NOAUTH"),
        Err(_) => false,
    }
}

/// A synchronous `redis` connection for `url`, with read/write timeouts.
pub fn connect_url(url: &str) -> redis::Connection {
    let con = redis::Client::open(url)
        .expect("redis client")
        .get_connection_with_timeout(Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("connect {url}: {e}"));
    con.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    con.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    con
}

// ---------------------------------------------------------------------------------------------
// Reading replies from the `redis` crate.
// ---------------------------------------------------------------------------------------------

/// An error as the user sees it: `CODE detail` (e.g. `ERR unknown command ...`, `NOTFOUND ...`).
pub fn err_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

/// Text of a string-like reply (bulk, simple, verbatim, `OK`).
pub fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::Okay => "OK".to_string(),
        other => panic!("expected a string reply, got {other:?}"),
    }
}

/// An integer reply.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

/// The items of an array or set reply.
pub fn items(v: &Value) -> Vec<Value> {
    match v {
        Value::Array(a) | Value::Set(a) => a.clone(),
        other => panic!("expected an array reply, got {other:?}"),
    }
}

/// The texts of an array reply's items.
pub fn strings(v: &Value) -> Vec<String> {
    items(v).iter().map(text).collect()
}

/// Whether a reply is an entity under either protocol: a RESP3 map or a RESP2 flat array of
/// field/value pairs.
pub fn is_map_like(v: &Value) -> bool {
    match v {
        Value::Map(_) => true,
        Value::Array(a) => a.len() % 2 == 0,
        _ => false,
    }
}

/// The fields of an entity reply, in order: a RESP3 map or a RESP2 flat array
/// `[field, value, ...]`.
pub fn fields(v: &Value) -> Vec<(String, Value)> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Value::Array(a) => {
            assert!(
                a.len() % 2 == 0,
                "expected a flat field/value array, got odd length: {v:?}"
            );
            a.chunks(2).map(|p| (text(&p[0]), p[1].clone())).collect()
        }
        other => panic!("expected a map reply, got {other:?}"),
    }
}

/// The fields of an entity reply by name.
pub fn to_map(v: &Value) -> BTreeMap<String, Value> {
    fields(v).into_iter().collect()
}

/// One field of an entity reply; panics naming the field when it is missing.
pub fn field(v: &Value, name: &str) -> Value {
    fields(v)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("field {name:?} missing in {v:?}"))
}

/// Runs one command given as words and returns its reply.
pub fn call(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// Runs one command that must succeed.
pub fn ok(con: &mut redis::Connection, args: &[&str]) -> Value {
    call(con, args).unwrap_or_else(|e| panic!("{args:?} failed: {}", err_text(&e)))
}

/// Runs one command that must fail, and returns its error as `CODE detail`.
pub fn fails(con: &mut redis::Connection, args: &[&str]) -> String {
    match call(con, args) {
        Ok(v) => panic!("{args:?} should have failed, got {v:?}"),
        Err(e) => err_text(&e),
    }
}

// ---------------------------------------------------------------------------------------------
// Semaphores, leases and INFO, as several test files read them.
// ---------------------------------------------------------------------------------------------

/// NS.CREATE ns, SEM.CREATE ns sem permits.
pub fn setup(con: &mut redis::Connection, ns: &str, sem: &str, permits: u32) {
    ok(con, &["NS.CREATE", ns]);
    ok(con, &["SEM.CREATE", ns, sem, &permits.to_string()]);
}

/// LEASE.CREATE ns process ttl, returning the lease id.
pub fn lease(con: &mut redis::Connection, ns: &str, process: &str, ttl: u32) -> String {
    let v = ok(con, &["LEASE.CREATE", ns, process, &ttl.to_string()]);
    let id = text(&field(&v, "lease_id"));
    assert!(id.starts_with("ls_"), "lease id shape: {id:?}");
    id
}

/// Acquires at once (timeout 0), which must succeed, and returns the fencing token.
pub fn acquire_now(
    con: &mut redis::Connection,
    ns: &str,
    sem: &str,
    lease: &str,
    weight: u32,
) -> i64 {
    let r = ok(
        con,
        &["SEM.ACQUIRE", ns, sem, lease, &weight.to_string(), "0"],
    );
    assert_eq!(
        text(&field(&r, "outcome")),
        "ACQUIRE_OUTCOME_ACQUIRED",
        "immediate acquire: {r:?}"
    );
    int(&field(&r, "fencing_token"))
}

/// The `outcome` of an acquire's reply (`ACQUIRE_OUTCOME_...`).
pub fn outcome(reply: &Value) -> String {
    text(&field(reply, "outcome"))
}

/// An acquire run on a connection of its own, in a thread, where it may park: its result and
/// how long it took.
pub type Parked = thread::JoinHandle<(redis::RedisResult<Value>, Duration)>;

/// Runs `SEM.ACQUIRE ns sem lease weight timeout` on connection `con` in a thread.
pub fn park_on(
    mut con: redis::Connection,
    ns: &str,
    sem: &str,
    lease: &str,
    weight: u32,
    timeout: &str,
) -> Parked {
    let words: Vec<String> = ["SEM.ACQUIRE", ns, sem, lease, &weight.to_string(), timeout]
        .iter()
        .map(|w| w.to_string())
        .collect();
    thread::spawn(move || {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let t0 = Instant::now();
        let r = call(&mut con, &words);
        (r, t0.elapsed())
    })
}

/// Like `park_on` with a new connection to `server`.
pub fn park(
    server: &Server,
    ns: &str,
    sem: &str,
    lease: &str,
    weight: u32,
    timeout: &str,
) -> Parked {
    park_on(server.conn(), ns, sem, lease, weight, timeout)
}

/// Waits for a parked acquire's result, and how long it took.
pub fn join(h: Parked) -> (redis::RedisResult<Value>, Duration) {
    h.join().expect("waiter thread panicked")
}

/// Waits for a parked acquire's reply, which must not be an error.
pub fn join_reply(h: Parked) -> Value {
    join(h)
        .0
        .unwrap_or_else(|e| panic!("parked acquire failed: {}", err_text(&e)))
}

/// The permits in use on a semaphore (SEM.GET's `active_holds`).
pub fn active_holds(con: &mut redis::Connection, ns: &str, sem: &str) -> i64 {
    int(&field(&ok(con, &["SEM.GET", ns, sem]), "active_holds"))
}

/// The holder entities of a semaphore (SEM.HOLDERS, first page), oldest first.
fn holder_entries(con: &mut redis::Connection, ns: &str, sem: &str) -> Vec<Value> {
    items(&field(&ok(con, &["SEM.HOLDERS", ns, sem]), "holders"))
}

/// The (lease_id, weight) of every holder of a semaphore, oldest first.
pub fn holders(con: &mut redis::Connection, ns: &str, sem: &str) -> Vec<(String, i64)> {
    holder_entries(con, ns, sem)
        .iter()
        .map(|h| (text(&field(h, "lease_id")), int(&field(h, "weight"))))
        .collect()
}

/// The (lease_id, weight, fencing_token) of every holder of a semaphore, oldest first.
pub fn holders_with_tokens(
    con: &mut redis::Connection,
    ns: &str,
    sem: &str,
) -> Vec<(String, i64, i64)> {
    holder_entries(con, ns, sem)
        .iter()
        .map(|h| {
            (
                text(&field(h, "lease_id")),
                int(&field(h, "weight")),
                int(&field(h, "fencing_token")),
            )
        })
        .collect()
}

/// The value of `key` in the text of an INFO reply (its `key:value` lines).
pub fn info_value(info: &str, key: &str) -> Option<String> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
}

/// The value of `key` in the server's INFO now; panics naming the key when INFO lacks it.
pub fn info_text(con: &mut redis::Connection, key: &str) -> String {
    let info = text(&ok(con, &["INFO"]));
    info_value(&info, key).unwrap_or_else(|| panic!("{key} missing in INFO:\n{info}"))
}

/// A number of the server's INFO now.
pub fn info_int(con: &mut redis::Connection, key: &str) -> i64 {
    let v = info_text(con, key);
    v.parse()
        .unwrap_or_else(|_| panic!("INFO {key}:{v} is not a number"))
}

/// Waits up to 10 s until INFO shows exactly `n` parked waiters and `n` blocked clients.
pub fn wait_parked(con: &mut redis::Connection, n: i64) {
    let mut last = (0, 0);
    let seen = wait_until(Duration::from_secs(10), || {
        last = (info_int(con, "waiters"), info_int(con, "blocked_clients"));
        last == (n, n)
    });
    assert!(
        seen,
        "expected waiters:{n} and blocked_clients:{n} in INFO, last seen (waiters, blocked) = {last:?}"
    );
}

/// Clients per shard thread, from INFO's `clients_per_shard`.
pub fn clients_per_shard(con: &mut redis::Connection) -> Vec<i64> {
    let info = text(&ok(con, &["INFO", "clients"]));
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix("clients_per_shard:"))
        .unwrap_or_else(|| panic!("INFO has no clients_per_shard line:\n{info}"))
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// A new raw connection and the shard thread that serves it (of 2), seen from `admin`.
pub fn raw_with_home(server: &Server, admin: &mut redis::Connection) -> (RawConn, usize) {
    let before = clients_per_shard(admin);
    let raw = server.raw();
    let mut after = before.clone();
    assert!(wait_until(Duration::from_secs(10), || {
        after = clients_per_shard(admin);
        after.iter().sum::<i64>() == before.iter().sum::<i64>() + 1
    }));
    let home = (0..2).find(|&s| after[s] == before[s] + 1).unwrap();
    (raw, home)
}

/// A namespace name that shard `shard` of 2 owns: `prefix` and the first number that makes one.
pub fn namespace_on(shard: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|n| {
            let name = permitd::engine::types::Name::new_unchecked(bytes::Bytes::from(n.clone()));
            permitd::engine::route::shard_for(&name, 2) == shard
        })
        .unwrap()
}

/// A field of an entity reply read off a raw socket; panics naming the field when it is missing.
pub fn resp_field<'a>(reply: &'a Resp, name: &str) -> &'a Resp {
    reply
        .field(name)
        .unwrap_or_else(|| panic!("field {name:?} missing in {reply:?}"))
}

// ---------------------------------------------------------------------------------------------
// Raw sockets.
// ---------------------------------------------------------------------------------------------

/// How reading a connection to its end went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The server closed the connection (EOF).
    Closed,
    /// The connection was reset (the server closed it with unread input).
    Reset,
    /// Nothing more came, and the connection stayed open, until the timeout.
    TimedOut,
}

/// A raw TCP client: write any bytes, read replies or whatever comes back.
pub struct RawConn {
    stream: TcpStream,
    /// Bytes read but not consumed yet: the start of the next reply or line.
    buf: Vec<u8>,
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> RawConn {
        RawConn::try_connect(addr).expect("raw connect")
    }

    /// [`RawConn::connect`] for a caller that expects the server to be away at times.
    pub fn try_connect(addr: SocketAddr) -> io::Result<RawConn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        s.set_write_timeout(Some(CLIENT_TIMEOUT))?;
        s.set_nodelay(true)?;
        Ok(RawConn {
            stream: s,
            buf: Vec::new(),
        })
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.stream.local_addr().unwrap()
    }

    /// Writes bytes; errors (the server may already have closed) are returned, not panicked.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Sends one command as a RESP multibulk array.
    pub fn send_cmd(&mut self, args: &[&[u8]]) -> io::Result<()> {
        self.send(&encode(args))
    }

    /// Sends one command and reads its reply.
    pub fn cmd(&mut self, args: &[&str]) -> Resp {
        let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
        self.send_cmd(&a).expect("send command");
        self.read_reply().expect("read reply")
    }

    /// Reads more bytes into the buffer; the end of the stream is an error.
    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "EOF"));
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }

    /// Reads one line up to LF (without its CR LF); at the end of the stream, what came before it.
    pub fn read_line(&mut self) -> io::Result<String> {
        let end = loop {
            if let Some(i) = self.buf.iter().position(|&b| b == b'\n') {
                break i + 1;
            }
            match self.fill() {
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && !self.buf.is_empty() => {
                    break self.buf.len()
                }
                other => other?,
            }
        };
        let mut line: Vec<u8> = self.buf.drain(..end).collect();
        if line.ends_with(b"\r\n") {
            line.truncate(line.len() - 2);
        }
        Ok(String::from_utf8_lossy(&line).into_owned())
    }

    /// Reads one reply.
    pub fn read_reply(&mut self) -> io::Result<Resp> {
        loop {
            match Resp::parse(&self.buf) {
                Ok((reply, used)) => {
                    self.buf.drain(..used);
                    return Ok(reply);
                }
                Err(ReadError::Incomplete) => self.fill()?,
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
        }
    }

    /// Reads everything until the server closes the connection, or until nothing arrives for
    /// `timeout`. Returns the bytes read and how it ended.
    pub fn read_to_end(&mut self, timeout: Duration) -> (Vec<u8>, End) {
        let mut out = std::mem::take(&mut self.buf);
        let s = &mut self.stream;
        s.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 16 * 1024];
        let end = loop {
            match s.read(&mut buf) {
                Ok(0) => break End::Closed,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::BrokenPipe
                    ) =>
                {
                    break End::Reset
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break End::TimedOut
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break End::Reset,
            }
        };
        let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
        (out, end)
    }
}

/// Encodes a command as a RESP multibulk array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    permitd::protocol::request::encode_request(&mut out, args);
    out
}

/// Polls `f` every 20 ms until it returns true or `timeout` passes; returns the last result.
pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(20));
    }
}
