//! Security over real sockets with real clients: users and ACLs (namespace patterns, command
//! categories, NS.LIST filtering, MULTI), passwords (AUTH, HELLO AUTH, hashed storage, ACL
//! DELUSER, `--aclfile` with ACL SAVE / ACL LOAD), protected mode (a client from 127.0.0.2), and
//! TLS (certificates made here with rcgen; redis-cli and redis-py as the TLS clients).
//!
//! redis-py runs from `PERMITD_TEST_PYTHON` when set, else from a venv made once under
//! `target/pytls-venv` (`python3 -m venv`, then `pip install redis==REDIS_PY`).

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use common::pki::{ca, leaf};
use common::*;
use redis::Value;
use sha2::{Digest, Sha256};

const ACQUIRED: &str = "ACQUIRE_OUTCOME_ACQUIRED";

/// The redis-py release the TLS test installs (the one redis-compat/python pins).
const REDIS_PY: &str = "8.1.0";

/// How long something that should happen "at once" may take (generous on purpose).
const PROMPT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A `redis` crate connection logged in as `user` (the client sends AUTH user pass itself).
fn login(s: &Server, user: &str, pass: &str) -> redis::Connection {
    connect_url(&format!("redis://{user}:{pass}@127.0.0.1:{}", s.port()))
}

/// The same, negotiating RESP3 (`HELLO 3 AUTH user pass`).
fn login_resp3(s: &Server, user: &str, pass: &str) -> redis::Connection {
    connect_url(&format!(
        "redis://{user}:{pass}@127.0.0.1:{}/?protocol=resp3",
        s.port()
    ))
}

/// `ACL LIST` as lines.
fn acl_list(con: &mut redis::Connection) -> Vec<String> {
    strings(&ok(con, &["ACL", "LIST"]))
}

/// `ACL USERS` as a set.
fn acl_users(con: &mut redis::Connection) -> BTreeSet<String> {
    items(&ok(con, &["ACL", "USERS"]))
        .iter()
        .map(text)
        .collect()
}

/// A plain TCP connection to `server` whose source address is `from` (e.g. 127.0.0.2: Linux
/// accepts any 127/8 address on loopback).
fn connect_from(from: Ipv4Addr, server: SocketAddr) -> TcpStream {
    use socket2::{Domain, Protocol, SockAddr, Socket, Type};
    let sock = Socket::new(Domain::IPV4, Type::STREAM, Some(Protocol::TCP)).expect("socket");
    sock.bind(&SockAddr::from(SocketAddrV4::new(from, 0)))
        .unwrap_or_else(|e| panic!("bind {from}:0: {e}"));
    sock.connect_timeout(&SockAddr::from(server), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("connect {server} from {from}: {e}"));
    let stream: TcpStream = sock.into();
    stream.set_read_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(CLIENT_TIMEOUT)).unwrap();
    assert_eq!(stream.local_addr().unwrap().ip(), from);
    stream
}

/// Sends one inline command and reads one reply line (enough for `+`, `-` and `:` replies).
fn line_cmd(r: &mut BufReader<TcpStream>, cmd: &str) -> String {
    r.get_mut()
        .write_all(format!("{cmd}\r\n").as_bytes())
        .unwrap_or_else(|e| panic!("send {cmd:?}: {e}"));
    let mut line = String::new();
    r.read_line(&mut line)
        .unwrap_or_else(|e| panic!("read the reply to {cmd:?}: {e}"));
    line.trim_end().to_string()
}

/// Reads a connection until the server closes it or `timeout` passes; returns what came and
/// whether the server closed it.
fn read_until_closed(s: &mut TcpStream, timeout: Duration) -> (String, bool) {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        match s.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            // Reset: closed too.
            Err(_) => break true,
        }
    };
    (String::from_utf8_lossy(&out).into_owned(), closed)
}

/// A temp directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> TempDir {
        TempDir(unique_temp_dir())
    }
    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// What an external program did.
struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn all(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Runs a program, killing it after `limit`.
fn run(program: &Path, args: &[String], limit: Duration) -> Run {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", program.display()));
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out_t = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_t = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait") {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(20));
    };
    let stdout = out_t.join().unwrap();
    let mut stderr = err_t.join().unwrap();
    if status.is_none() {
        stderr.push_str(&format!("\n[killed after {limit:?}]"));
    }
    Run {
        success: status.is_some_and(|s| s.success()),
        stdout,
        stderr,
    }
}

/// Runs redis-cli with `args`.
fn redis_cli(args: &[&str]) -> Run {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    run(Path::new("redis-cli"), &args, Duration::from_secs(20))
}

// ---------------------------------------------------------------------------------------------
// 1. Namespace patterns and command categories
// ---------------------------------------------------------------------------------------------

/// Everything an admin can see of namespace team-b-x (a rejected command must change none of it).
/// Creates user `alice` (password `alice-pw`), confined to the `team-a-*` namespaces with the
/// semaphore and connection commands, plus `extra` rules.
fn team_a_user(admin: &mut redis::Connection, extra: &[&str]) {
    let mut words = vec![
        "ACL",
        "SETUSER",
        "alice",
        "on",
        ">alice-pw",
        "~team-a-*",
        "+@semaphore",
        "+@connection",
    ];
    words.extend_from_slice(extra);
    ok(admin, &words);
}

fn team_b_state(admin: &mut redis::Connection, lease_id: &str) -> Vec<Value> {
    [
        &["NS.GET", "team-b-x"][..],
        &["SEM.GET", "team-b-x", "s"],
        &["SEM.HOLDERS", "team-b-x", "s"],
        &["SEM.LIST", "team-b-x"],
        &["LEASE.LIST", "team-b-x"],
        &["LEASE.GET", "team-b-x", lease_id],
    ]
    .iter()
    .map(|c| ok(admin, c))
    .collect()
}

#[test]
fn a_user_confined_to_team_a_cannot_touch_team_b() {
    let s = Server::start();
    let mut admin = s.conn();
    team_a_user(&mut admin, &[]);

    // team-b-x, made by the admin: a semaphore with one holder.
    ok(&mut admin, &["NS.CREATE", "team-b-x"]);
    ok(&mut admin, &["SEM.CREATE", "team-b-x", "s", "5"]);
    let b_lease = lease(&mut admin, "team-b-x", "b-worker", 60);
    let r = ok(
        &mut admin,
        &["SEM.ACQUIRE", "team-b-x", "s", &b_lease, "2", "0"],
    );
    assert_eq!(text(&field(&r, "outcome")), ACQUIRED);
    let before = team_b_state(&mut admin, &b_lease);

    let mut alice = login(&s, "alice", "alice-pw");
    let denied = "NOPERM No permissions to access namespace 'team-b-x'";
    let attempts: Vec<Vec<&str>> = vec![
        vec!["NS.GET", "team-b-x"],
        vec!["SEM.GET", "team-b-x", "s"],
        // Knowing a live lease id of team-b does not help.
        vec!["SEM.ACQUIRE", "team-b-x", "s", &b_lease, "1", "0"],
        vec!["SEM.RELEASE", "team-b-x", "s", &b_lease],
        vec!["SEM.HOLDERS", "team-b-x", "s"],
        vec!["LEASE.CREATE", "team-b-x", "alice-worker", "60"],
        vec!["LEASE.LIST", "team-b-x"],
        vec!["SEM.LIST", "team-b-x"],
        vec!["LEASE.REFRESH", "team-b-x", &b_lease, "5"],
        vec!["LEASE.REVOKE", "team-b-x", &b_lease],
        vec!["SEM.UPDATE", "team-b-x", "s", "1", "VERSION", "1"],
        vec!["SEM.DELETE", "team-b-x", "s"],
        vec!["NS.DELETE", "team-b-x"],
    ];
    for cmd in &attempts {
        let e = fails(&mut alice, cmd);
        assert_eq!(e, denied, "{cmd:?}");
        assert!(!e.contains(&b_lease), "the error shows the lease id: {e}");
    }
    // A namespace it may not create is not created.
    assert_eq!(
        fails(&mut alice, &["NS.CREATE", "team-b-new"]),
        "NOPERM No permissions to access namespace 'team-b-new'"
    );
    assert!(fails(&mut admin, &["NS.GET", "team-b-new"]).starts_with("NOTFOUND"));

    // The admin sees team-b-x exactly as before: same holder, active_holds, leases, versions.
    assert_eq!(team_b_state(&mut admin, &b_lease), before);
    assert_eq!(
        holders(&mut admin, "team-b-x", "s"),
        vec![(b_lease.clone(), 2)]
    );
    assert_eq!(active_holds(&mut admin, "team-b-x", "s"), 2);

    // In team-a-x every one of those commands works for alice.
    ok(&mut alice, &["NS.CREATE", "team-a-x", "DESC", "alice's"]);
    assert_eq!(
        text(&field(&ok(&mut alice, &["NS.GET", "team-a-x"]), "name")),
        "team-a-x"
    );
    ok(&mut alice, &["SEM.CREATE", "team-a-x", "s", "3"]);
    let a_lease = lease(&mut alice, "team-a-x", "a-worker", 60);
    let r = ok(
        &mut alice,
        &["SEM.ACQUIRE", "team-a-x", "s", &a_lease, "2", "0"],
    );
    assert_eq!(text(&field(&r, "outcome")), ACQUIRED);
    assert!(int(&field(&r, "fencing_token")) > 0);
    assert_eq!(
        holders(&mut alice, "team-a-x", "s"),
        vec![(a_lease.clone(), 2)]
    );
    assert_eq!(active_holds(&mut alice, "team-a-x", "s"), 2);
    let leases = ok(&mut alice, &["LEASE.LIST", "team-a-x"]);
    let ids: Vec<String> = items(&field(&leases, "leases"))
        .iter()
        .map(|l| text(&field(l, "lease_id")))
        .collect();
    assert_eq!(ids, vec![a_lease.clone()]);
    let sems = ok(&mut alice, &["SEM.LIST", "team-a-x"]);
    let names: Vec<String> = items(&field(&sems, "semaphores"))
        .iter()
        .map(|x| text(&field(x, "name")))
        .collect();
    assert_eq!(names, vec!["s"]);
    let r = ok(&mut alice, &["SEM.RELEASE", "team-a-x", "s", &a_lease]);
    assert_eq!(int(&field(&r, "active_holds")), 0);
    // And the admin sees alice's work.
    assert_eq!(active_holds(&mut admin, "team-a-x", "s"), 0);
    assert_eq!(
        text(&field(
            &ok(&mut admin, &["NS.GET", "team-a-x"]),
            "description"
        )),
        "alice's"
    );
}

/// Pages through NS.LIST with LIMIT `limit`: the names of each page, and the cursor each page
/// was asked with.
fn ns_pages(con: &mut redis::Connection, limit: usize) -> (Vec<Vec<String>>, Vec<String>) {
    let limit = limit.to_string();
    let mut pages: Vec<Vec<String>> = Vec::new();
    let mut cursors: Vec<String> = Vec::new();
    let mut cursor = String::new();
    loop {
        let mut args = vec!["NS.LIST", "LIMIT", limit.as_str()];
        if !cursor.is_empty() {
            args.extend(["CURSOR", cursor.as_str()]);
        }
        let page = ok(con, &args);
        let names: Vec<String> = items(&field(&page, "namespaces"))
            .iter()
            .map(|n| text(&field(n, "name")))
            .collect();
        cursors.push(cursor.clone());
        pages.push(names);
        cursor = text(&field(&page, "next_cursor"));
        if cursor.is_empty() {
            return (pages, cursors);
        }
        assert!(pages.len() < 50, "NS.LIST never ends: {pages:?}");
    }
}

#[test]
fn ns_list_shows_only_permitted_namespaces_in_full_pages() {
    let s = Server::start();
    let mut admin = s.conn();
    team_a_user(&mut admin, &[]);
    // Visible ones, and invisible ones sorting before, after and right next to them.
    let visible: Vec<String> = (1..=7).map(|i| format!("team-a-{i:02}")).collect();
    let invisible = [
        "aaa",
        "team-a",
        "team-a_z",
        "team-b-01",
        "team-b-02",
        "team-b-03",
        "team-b-04",
        "team-b-05",
        "zzz",
    ];
    for ns in visible.iter().map(String::as_str).chain(invisible) {
        ok(&mut admin, &["NS.CREATE", ns]);
    }

    let mut alice = login(&s, "alice", "alice-pw");
    let (pages, cursors) = ns_pages(&mut alice, 2);
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![2, 2, 2, 1], "pages: {pages:?}");
    assert_eq!(pages.concat(), visible, "pages: {pages:?}");

    // previous_cursor of the last page gives the page before it again.
    let mut args = vec!["NS.LIST", "LIMIT", "2"];
    let last = cursors.last().unwrap().clone();
    args.extend(["CURSOR", last.as_str()]);
    let prev = text(&field(&ok(&mut alice, &args), "previous_cursor"));
    let page = ok(&mut alice, &["NS.LIST", "LIMIT", "2", "CURSOR", &prev]);
    let names: Vec<String> = items(&field(&page, "namespaces"))
        .iter()
        .map(|n| text(&field(n, "name")))
        .collect();
    assert_eq!(names, pages[pages.len() - 2]);

    // One big page: still only team-a-*.
    let page = ok(&mut alice, &["NS.LIST"]);
    let names: Vec<String> = items(&field(&page, "namespaces"))
        .iter()
        .map(|n| text(&field(n, "name")))
        .collect();
    assert_eq!(names, visible);
    // The admin sees them all.
    let page = ok(&mut admin, &["NS.LIST"]);
    assert_eq!(
        items(&field(&page, "namespaces")).len(),
        visible.len() + invisible.len()
    );

    // With a multiple of LIMIT visible, the last full page is the last (no empty page after it,
    // though invisible namespaces follow).
    ok(&mut admin, &["NS.DELETE", "team-a-07"]);
    let (pages, _) = ns_pages(&mut alice, 2);
    assert_eq!(pages.concat(), visible[..6], "pages: {pages:?}");
    assert_eq!(pages.len(), 3, "pages: {pages:?}");
    let (pages, _) = ns_pages(&mut alice, 3);
    assert_eq!(pages.iter().map(Vec::len).collect::<Vec<_>>(), vec![3, 3]);
}

#[test]
fn a_denied_command_inside_multi_aborts_the_transaction() {
    let s = Server::start();
    let mut admin = s.conn();
    team_a_user(&mut admin, &["+@transaction"]);
    ok(&mut admin, &["NS.CREATE", "team-a-x"]);
    ok(&mut admin, &["SEM.CREATE", "team-a-x", "s", "3"]);
    ok(&mut admin, &["NS.CREATE", "team-b-x"]);
    ok(&mut admin, &["SEM.CREATE", "team-b-x", "s", "3"]);
    let a_lease = lease(&mut admin, "team-a-x", "w", 60);
    let b_lease = lease(&mut admin, "team-b-x", "w", 60);

    let mut alice = login(&s, "alice", "alice-pw");
    ok(&mut alice, &["MULTI"]);
    let queued = ok(
        &mut alice,
        &["SEM.ACQUIRE", "team-a-x", "s", &a_lease, "1", "0"],
    );
    assert_eq!(text(&queued), "QUEUED");
    assert_eq!(
        fails(
            &mut alice,
            &["SEM.ACQUIRE", "team-b-x", "s", &b_lease, "1", "0"]
        ),
        "NOPERM No permissions to access namespace 'team-b-x'"
    );
    assert_eq!(
        fails(&mut alice, &["EXEC"]),
        "EXECABORT Transaction discarded because of previous errors."
    );
    // Nothing ran: neither the allowed acquire nor the denied one.
    assert_eq!(active_holds(&mut admin, "team-a-x", "s"), 0);
    assert_eq!(active_holds(&mut admin, "team-b-x", "s"), 0);
    // The connection is out of the transaction and still works.
    let r = ok(
        &mut alice,
        &["SEM.ACQUIRE", "team-a-x", "s", &a_lease, "1", "0"],
    );
    assert_eq!(text(&field(&r, "outcome")), ACQUIRED);
}

/// Redis checks ACLs again at EXEC ("ACLs rules changed between the moment the transaction was
/// accumulated and the EXEC call"): a command the user lost the right to while it was queued
/// must not run.
#[test]
fn permissions_revoked_after_queueing_are_enforced_at_exec() {
    let s = Server::start();
    let mut admin = s.conn();
    team_a_user(&mut admin, &["+@transaction"]);
    ok(&mut admin, &["NS.CREATE", "team-a-x"]);
    let mut alice = login(&s, "alice", "alice-pw");
    ok(&mut alice, &["MULTI"]);
    ok(&mut alice, &["SEM.CREATE", "team-a-x", "late", "3"]);
    ok(
        &mut admin,
        &["ACL", "SETUSER", "alice", "resetkeys", "~team-c-*"],
    );
    let r = call(&mut alice, &["EXEC"]);
    // Either the whole EXEC or the queued command is refused; the semaphore must not exist.
    if let Ok(v) = &r {
        let replies = items(v);
        assert!(
            matches!(&replies[0], Value::ServerError(e) if e.code() == "NOPERM"),
            "EXEC ran a command alice may no longer run: {replies:?}"
        );
    }
    assert!(fails(&mut admin, &["SEM.GET", "team-a-x", "late"]).starts_with("NOTFOUND"));
}

#[test]
fn a_confined_user_cannot_run_admin_commands() {
    let s = Server::start();
    let mut admin = s.conn();
    team_a_user(&mut admin, &[]);
    let acl_before = acl_list(&mut admin);
    let admin_id = int(&ok(&mut admin, &["CLIENT", "ID"]));
    let mut alice = login(&s, "alice", "alice-pw");
    let deny =
        |cmd: &str| format!("NOPERM User alice has no permissions to run the '{cmd}' command");
    assert_eq!(
        fails(&mut alice, &["CONFIG", "GET", "*"]),
        deny("config|get")
    );
    assert_eq!(
        fails(&mut alice, &["ACL", "SETUSER", "alice", "allkeys", "+@all"]),
        deny("acl|setuser")
    );
    assert_eq!(
        fails(&mut alice, &["CLIENT", "KILL", "ID", &admin_id.to_string()]),
        deny("client|kill")
    );
    assert_eq!(fails(&mut alice, &["ACL", "LIST"]), deny("acl|list"));
    assert_eq!(fails(&mut alice, &["SHUTDOWN", "NOSAVE"]), deny("shutdown"));
    // Nothing happened: alice's rules are the same, the admin is still connected, the server up.
    assert_eq!(acl_list(&mut admin), acl_before);
    assert_eq!(text(&ok(&mut admin, &["PING"])), "PONG");
    assert_eq!(text(&ok(&mut alice, &["PING"])), "PONG");
    // Connection commands are hers to run.
    assert_eq!(
        int(&ok(&mut alice, &["CLIENT", "ID"])),
        int(&ok(&mut alice, &["CLIENT", "ID"]))
    );
}

#[test]
fn command_rules_apply_in_order_with_subcommands() {
    let s = Server::start();
    let mut admin = s.conn();
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "ops",
            "on",
            ">ops-pw",
            "allkeys",
            "+@semaphore",
            "-sem.delete",
            "+@connection",
            "+client|list",
        ],
    );
    ok(&mut admin, &["NS.CREATE", "ops-ns"]);
    ok(&mut admin, &["SEM.CREATE", "ops-ns", "s", "1"]);
    let mut ops = login(&s, "ops", "ops-pw");
    assert_eq!(
        fails(&mut ops, &["SEM.DELETE", "ops-ns", "s"]),
        "NOPERM User ops has no permissions to run the 'sem.delete' command"
    );
    assert_eq!(active_holds(&mut admin, "ops-ns", "s"), 0); // still there
    ok(&mut ops, &["SEM.CREATE", "ops-ns", "t", "1"]);
    // +client|list allows that subcommand only.
    assert!(text(&ok(&mut ops, &["CLIENT", "LIST"])).contains("user=ops"));
    assert_eq!(
        fails(&mut ops, &["CLIENT", "KILL", "ID", "1"]),
        "NOPERM User ops has no permissions to run the 'client|kill' command"
    );
    // A rule naming no category or command is refused, and changes nothing.
    let before = acl_list(&mut admin);
    assert!(fails(
        &mut admin,
        &["ACL", "SETUSER", "ops", "-sem.get", "+@nosuch"]
    )
    .starts_with("ERR"));
    assert_eq!(acl_list(&mut admin), before);
    ok(&mut ops, &["SEM.GET", "ops-ns", "t"]);
    // ACL CAT names the categories of the contract.
    let cats: BTreeSet<String> = items(&ok(&mut admin, &["ACL", "CAT"]))
        .iter()
        .map(text)
        .collect();
    for c in [
        "read",
        "write",
        "semaphore",
        "admin",
        "dangerous",
        "connection",
        "fast",
        "slow",
        "blocking",
        "transaction",
    ] {
        assert!(cats.contains(c), "ACL CAT lacks {c}: {cats:?}");
    }
    let blocking: Vec<String> = items(&ok(&mut admin, &["ACL", "CAT", "blocking"]))
        .iter()
        .map(text)
        .collect();
    assert!(
        blocking.contains(&"sem.acquire".to_string()),
        "{blocking:?}"
    );
}

/// An empty `ACL SETUSER` rule is a syntax error like any bad rule. (It once panicked while the
/// ACL lock was held, poisoning it, so the server stopped answering anyone.)
#[test]
fn an_empty_acl_rule_is_an_error_not_a_crash() {
    let s = Server::start();
    let mut admin = s.conn();
    let mut raw = s.raw();
    raw.stream()
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    match raw
        .send_cmd(&[b"ACL", b"SETUSER", b"x", b""])
        .and_then(|()| raw.read_reply())
    {
        Ok(Resp::Error(e)) => assert!(e.starts_with("ERR"), "{e}"),
        other => panic!("ACL SETUSER x \"\" answered {other:?}"),
    }
    assert_eq!(text(&ok(&mut admin, &["PING"])), "PONG");
    let mut fresh = s.raw();
    assert_eq!(fresh.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

// ---------------------------------------------------------------------------------------------
// 2. Passwords
// ---------------------------------------------------------------------------------------------

#[test]
fn noauth_before_auth_and_wrongpass_on_a_wrong_password() {
    let s = Server::start_with(&["--requirepass", "s3cret-pw"]);
    let noauth = Resp::Error("NOAUTH Authentication required.".into());
    let wrongpass =
        Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into());

    let mut raw = s.raw();
    assert_eq!(raw.cmd(&["PING"]), noauth);
    assert_eq!(raw.cmd(&["NS.CREATE", "sneaky"]), noauth);
    assert_eq!(raw.cmd(&["SEM.GET", "sneaky", "s"]), noauth);
    assert_eq!(raw.cmd(&["AUTH", "wrong"]), wrongpass);
    assert_eq!(raw.cmd(&["AUTH", "default", "wrong"]), wrongpass);
    assert_eq!(raw.cmd(&["AUTH", "nosuchuser", "s3cret-pw"]), wrongpass);
    assert_eq!(raw.cmd(&["PING"]), noauth);
    assert_eq!(raw.cmd(&["AUTH", "s3cret-pw"]), Resp::Simple("OK".into()));
    assert_eq!(raw.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let mut raw2 = s.raw();
    assert_eq!(
        raw2.cmd(&["AUTH", "default", "s3cret-pw"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(
        raw2.cmd(&["ACL", "WHOAMI"]),
        Resp::Bulk(Some(b"default".to_vec()))
    );

    // What a redis crate user sees: a wrong password fails the connect, the right one works.
    let e = redis::Client::open(format!("redis://:wrong@127.0.0.1:{}", s.port()))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10))
        .err()
        .expect("a wrong password must fail the connect");
    assert_eq!(e.kind(), redis::ErrorKind::AuthenticationFailed, "{e}");
    let mut con = connect_url(&format!("redis://:s3cret-pw@127.0.0.1:{}", s.port()));
    ok(&mut con, &["NS.CREATE", "fine"]);
    // The NOAUTH'd NS.CREATE above created nothing.
    assert!(fails(&mut con, &["NS.GET", "sneaky"]).starts_with("NOTFOUND"));

    // A disabled user cannot log in even with its password.
    ok(
        &mut con,
        &[
            "ACL", "SETUSER", "offuser", "off", ">off-pw", "allkeys", "+@all",
        ],
    );
    assert_eq!(raw.cmd(&["AUTH", "offuser", "off-pw"]), wrongpass);
}

#[test]
fn hello_3_auth_logs_in_and_switches_protocol() {
    let s = Server::start_with(&["--requirepass", "s3cret-pw"]);
    let mut admin = login(&s, "default", "s3cret-pw");
    team_a_user(&mut admin, &["+acl|whoami"]);

    // On the wire: HELLO 3 before AUTH is NOAUTH; with a wrong password WRONGPASS; then the
    // right one answers a RESP3 map and the connection is alice's.
    let mut raw = s.raw();
    match raw.cmd(&["HELLO", "3"]) {
        Resp::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("HELLO 3 before AUTH: {other:?}"),
    }
    assert_eq!(
        raw.cmd(&["HELLO", "3", "AUTH", "alice", "wrong"]),
        Resp::Error("WRONGPASS invalid username-password pair or user is disabled.".into())
    );
    raw.send_cmd(&[b"HELLO", b"3", b"AUTH", b"alice", b"alice-pw"])
        .unwrap();
    let first = raw.read_line().unwrap();
    assert!(
        first.starts_with('%'),
        "HELLO 3 must answer a RESP3 map, got {first:?}"
    );
    let (rest, _) = raw.read_to_end(Duration::from_millis(300));
    let rest = String::from_utf8_lossy(&rest).into_owned();
    assert!(rest.contains("proto\r\n:3\r\n"), "{rest:?}");
    assert_eq!(
        raw.cmd(&["ACL", "WHOAMI"]),
        Resp::Bulk(Some(b"alice".to_vec()))
    );

    // The redis crate with ?protocol=resp3 and credentials does the same.
    let mut alice = login_resp3(&s, "alice", "alice-pw");
    assert_eq!(text(&ok(&mut alice, &["ACL", "WHOAMI"])), "alice");
    ok(&mut alice, &["NS.CREATE", "team-a-r3"]);
    assert!(matches!(
        ok(&mut alice, &["NS.GET", "team-a-r3"]),
        Value::Map(_)
    ));
    assert_eq!(
        fails(&mut alice, &["NS.GET", "team-b-r3"]),
        "NOPERM No permissions to access namespace 'team-b-r3'"
    );
}

#[test]
fn acl_list_shows_password_hashes_never_passwords() {
    let s = Server::start_with(&["--requirepass", "Req-Pass-1"]);
    let mut admin = login(&s, "default", "Req-Pass-1");
    let third = "Third-Pw-3";
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "alice",
            "on",
            ">Alice-Secret-9",
            ">Second-Pw-2",
            &format!("#{}", sha256_hex(third)),
            "~team-a-*",
            "+@semaphore",
            "+@connection",
        ],
    );
    let lines = acl_list(&mut admin);
    let all = lines.join("\n");
    for clear in ["Req-Pass-1", "Alice-Secret-9", "Second-Pw-2", third] {
        assert!(!all.contains(clear), "ACL LIST shows {clear:?}:\n{all}");
    }
    let alice = lines
        .iter()
        .find(|l| l.starts_with("user alice "))
        .expect("alice in ACL LIST");
    assert!(alice.starts_with("user alice on "), "{alice}");
    for pw in ["Alice-Secret-9", "Second-Pw-2", third] {
        assert!(alice.contains(&format!("#{}", sha256_hex(pw))), "{alice}");
    }
    assert!(
        alice.contains("~team-a-*") && alice.contains("+@semaphore"),
        "{alice}"
    );
    let default = lines
        .iter()
        .find(|l| l.starts_with("user default "))
        .expect("default in ACL LIST");
    assert!(
        default.contains(&format!("#{}", sha256_hex("Req-Pass-1"))),
        "{default}"
    );
    assert!(!default.contains("nopass"), "{default}");

    // Each of the three passwords logs in, the one given as a hash too.
    for pw in ["Alice-Secret-9", "Second-Pw-2", third] {
        let mut r = s.raw();
        assert_eq!(
            r.cmd(&["AUTH", "alice", pw]),
            Resp::Simple("OK".into()),
            "{pw}"
        );
    }
    // <pass removes one; resetpass removes all.
    ok(&mut admin, &["ACL", "SETUSER", "alice", "<Second-Pw-2"]);
    let mut r = s.raw();
    assert!(
        matches!(r.cmd(&["AUTH", "alice", "Second-Pw-2"]), Resp::Error(e) if e.starts_with("WRONGPASS"))
    );
    assert!(!acl_list(&mut admin)
        .join("\n")
        .contains(&sha256_hex("Second-Pw-2")));
    ok(&mut admin, &["ACL", "SETUSER", "alice", "resetpass"]);
    assert!(
        matches!(r.cmd(&["AUTH", "alice", "Alice-Secret-9"]), Resp::Error(e) if e.starts_with("WRONGPASS"))
    );
    // Nor does the log show any of them (failed logins included).
    let log = s.log_contents();
    for clear in ["Alice-Secret-9", "Second-Pw-2", third] {
        assert!(!log.contains(clear), "the log shows {clear:?}:\n{log}");
    }
}

#[test]
fn acl_deluser_closes_the_users_connections() {
    let s = Server::start();
    let mut admin = s.conn();
    for user in ["alice", "bob"] {
        ok(
            &mut admin,
            &[
                "ACL",
                "SETUSER",
                user,
                "on",
                &format!(">{user}-pw"),
                "allkeys",
                "+@semaphore",
                "+@connection",
            ],
        );
    }
    ok(&mut admin, &["NS.CREATE", "del"]);
    ok(&mut admin, &["SEM.CREATE", "del", "s", "2"]);
    let blocker = lease(&mut admin, "del", "blocker", 60);
    ok(&mut admin, &["SEM.ACQUIRE", "del", "s", &blocker, "2", "0"]);
    let alice_lease = lease(&mut admin, "del", "alice", 60);

    // alice: one idle connection, one parked in SEM.ACQUIRE.
    let mut idle = s.raw();
    assert_eq!(
        idle.cmd(&["AUTH", "alice", "alice-pw"]),
        Resp::Simple("OK".into())
    );
    assert_eq!(idle.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let mut parked = s.raw();
    assert_eq!(
        parked.cmd(&["AUTH", "alice", "alice-pw"]),
        Resp::Simple("OK".into())
    );
    parked
        .send_cmd(&[
            b"SEM.ACQUIRE",
            b"del",
            b"s",
            alice_lease.as_bytes(),
            b"1",
            b"60",
        ])
        .unwrap();
    assert!(
        wait_until(PROMPT, || info_text(&mut admin, "blocked_clients") == "1"),
        "alice's acquire never parked"
    );
    let mut bob = login(&s, "bob", "bob-pw");

    assert_eq!(int(&ok(&mut admin, &["ACL", "DELUSER", "alice"])), 1);
    for (what, con) in [("idle", &mut idle), ("parked", &mut parked)] {
        let start = Instant::now();
        let (bytes, end) = con.read_to_end(PROMPT);
        assert_ne!(end, End::TimedOut, "alice's {what} connection stayed open");
        assert!(start.elapsed() < PROMPT);
        assert!(
            bytes.is_empty(),
            "alice's {what} connection got {:?}",
            String::from_utf8_lossy(&bytes)
        );
    }
    // The parked acquire left the queue and is never granted.
    assert!(wait_until(PROMPT, || info_text(
        &mut admin,
        "blocked_clients"
    ) == "0"));
    assert_eq!(info_text(&mut admin, "waiters"), "0");
    ok(&mut admin, &["SEM.RELEASE", "del", "s", &blocker]);
    assert_eq!(holders(&mut admin, "del", "s"), vec![]);

    // alice is gone; bob and the admin are untouched.
    assert!(!acl_users(&mut admin).contains("alice"));
    let mut r = s.raw();
    assert!(
        matches!(r.cmd(&["AUTH", "alice", "alice-pw"]), Resp::Error(e) if e.starts_with("WRONGPASS"))
    );
    assert_eq!(text(&ok(&mut bob, &["PING"])), "PONG");
    assert_eq!(int(&ok(&mut admin, &["ACL", "DELUSER", "nosuch"])), 0);
    assert!(fails(&mut admin, &["ACL", "DELUSER", "default"]).starts_with("ERR"));
    assert!(acl_users(&mut admin).contains("default"));
    assert_eq!(text(&ok(&mut admin, &["PING"])), "PONG");
}

#[test]
fn aclfile_users_load_at_start_and_acl_save_writes_them_back() {
    let tmp = TempDir::new();
    let file = tmp.path("users.acl");
    fs::write(
        &file,
        format!(
            "user alice on >alice-pw ~team-a-* +@semaphore +@connection\n\
             user bob off >bob-pw ~* +@all\n\
             user carol on #{} ~* +@read +@connection\n",
            sha256_hex("carol-pw")
        ),
    )
    .unwrap();
    let file_arg = tmp.arg("users.acl");
    let mut s = Server::start_with(&["--aclfile", &file_arg]);
    let mut admin = s.conn();
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(
        acl_users(&mut admin),
        names(&["alice", "bob", "carol", "default"])
    );

    // The file's rules are in force.
    let mut alice = login(&s, "alice", "alice-pw");
    ok(&mut alice, &["NS.CREATE", "team-a-file"]);
    assert_eq!(
        fails(&mut alice, &["NS.CREATE", "team-b-file"]),
        "NOPERM No permissions to access namespace 'team-b-file'"
    );
    let mut raw = s.raw();
    assert!(
        matches!(raw.cmd(&["AUTH", "bob", "bob-pw"]), Resp::Error(e) if e.starts_with("WRONGPASS"))
    );
    assert_eq!(
        raw.cmd(&["AUTH", "carol", "carol-pw"]),
        Resp::Simple("OK".into())
    );
    assert!(matches!(raw.cmd(&["NS.CREATE", "carols"]), Resp::Error(e) if e.starts_with("NOPERM")));
    assert!(matches!(
        raw.cmd(&["NS.GET", "team-a-file"]),
        Resp::Array(_)
    ));

    // Change the users, save, and read the file.
    ok(
        &mut admin,
        &[
            "ACL",
            "SETUSER",
            "dave",
            "on",
            ">dave-pw",
            "~team-d-*",
            "+@all",
        ],
    );
    ok(&mut admin, &["ACL", "DELUSER", "bob"]);
    assert_eq!(text(&ok(&mut admin, &["ACL", "SAVE"])), "OK");
    let saved = fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = saved.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!(
                "user alice on #{} ~team-a-* +@semaphore +@connection",
                sha256_hex("alice-pw")
            ),
            format!(
                "user carol on #{} ~* +@read +@connection",
                sha256_hex("carol-pw")
            ),
            format!("user dave on #{} ~team-d-* +@all", sha256_hex("dave-pw")),
            "user default on nopass ~* +@all".to_string(),
        ],
        "saved file:\n{saved}"
    );
    for clear in ["alice-pw", "carol-pw", "dave-pw", "bob-pw"] {
        assert!(!saved.contains(clear), "the file shows {clear:?}:\n{saved}");
    }
    assert_eq!(lines, acl_list(&mut admin));

    // A restart loads what was saved.
    s.restart();
    let mut admin = s.conn();
    assert_eq!(
        acl_users(&mut admin),
        names(&["alice", "carol", "dave", "default"])
    );
    let mut dave = login(&s, "dave", "dave-pw");
    ok(&mut dave, &["NS.CREATE", "team-d-1"]);
    let mut alice = login(&s, "alice", "alice-pw");
    assert_eq!(
        fails(&mut alice, &["NS.GET", "team-d-1"]),
        "NOPERM No permissions to access namespace 'team-d-1'"
    );

    // ACL LOAD reads an edited file; a broken file is refused and changes nothing.
    fs::write(&file, format!("{saved}user erin on >erin-pw ~* +@all\n")).unwrap();
    assert_eq!(text(&ok(&mut admin, &["ACL", "LOAD"])), "OK");
    login(&s, "erin", "erin-pw");
    fs::write(&file, "user frank on >frank-pw +@nosuch\n").unwrap();
    assert!(fails(&mut admin, &["ACL", "LOAD"]).starts_with("ERR"));
    assert!(acl_users(&mut admin).contains("erin"));
    assert!(!acl_users(&mut admin).contains("frank"));
}

#[test]
fn aclfile_takes_what_redis_7_acl_save_writes() {
    // As redis-server 7.0.15 wrote them (ACL SAVE), and the `sanitize-payload` of 7.2.
    let tmp = TempDir::new();
    let file = tmp.path("users.acl");
    let redis_file = format!(
        "user alice on #{} ~team-a:* resetchannels -@all +ping\n\
         user bob off skip-sanitize-payload #{} ~* resetchannels &news.* +@all\n\
         user default on nopass sanitize-payload ~* &* +@all\n",
        sha256_hex("alice-pw"),
        sha256_hex("bob-pw")
    );
    fs::write(&file, &redis_file).unwrap();
    let s = Server::start_with(&["--aclfile", &tmp.arg("users.acl")]);
    let mut admin = s.conn();
    assert_eq!(text(&ok(&mut admin, &["PING"])), "PONG");
    let mut alice = login(&s, "alice", "alice-pw");
    assert_eq!(text(&ok(&mut alice, &["PING"])), "PONG");
    assert!(fails(&mut alice, &["NS.CREATE", "team-a:x"]).starts_with("NOPERM"));
    let mut raw = s.raw();
    assert!(
        matches!(raw.cmd(&["AUTH", "bob", "bob-pw"]), Resp::Error(e) if e.starts_with("WRONGPASS")),
        "bob is off"
    );

    // What ACL SAVE writes, ACL LOAD reads back as it was.
    let listed = acl_list(&mut admin);
    assert_eq!(text(&ok(&mut admin, &["ACL", "SAVE"])), "OK");
    assert_eq!(text(&ok(&mut admin, &["ACL", "LOAD"])), "OK");
    assert_eq!(acl_list(&mut admin), listed);
    let saved = fs::read_to_string(&file).unwrap();
    assert_eq!(saved.lines().collect::<Vec<_>>(), listed);
    login(&s, "alice", "alice-pw");
}

#[test]
fn lease_ids_stay_out_of_errors_and_logs() {
    let s = Server::start_with(&["--log-level", "info"]);
    let mut admin = s.conn();
    team_a_user(&mut admin, &[]);
    ok(&mut admin, &["NS.CREATE", "team-b-x"]);
    ok(&mut admin, &["SEM.CREATE", "team-b-x", "s", "1"]);
    let l = lease(&mut admin, "team-b-x", "w", 60);
    ok(&mut admin, &["SEM.ACQUIRE", "team-b-x", "s", &l, "1", "0"]);
    let mut alice = login(&s, "alice", "alice-pw");
    let mut errors = vec![
        fails(&mut alice, &["SEM.RELEASE", "team-b-x", "s", &l]),
        fails(&mut alice, &["LEASE.REVOKE", "team-b-x", &l]),
        fails(&mut alice, &["LEASE.GET", "team-b-x", &l]),
    ];
    // Lease errors of a permitted user.
    ok(&mut admin, &["LEASE.REVOKE", "team-b-x", &l]);
    errors.push(fails(&mut admin, &["LEASE.GET", "team-b-x", &l]));
    errors.push(fails(&mut admin, &["LEASE.REFRESH", "team-b-x", &l, "10"]));
    errors.push(fails(
        &mut admin,
        &["SEM.ACQUIRE", "team-b-x", "s", &l, "1", "0"],
    ));
    errors.push(fails(&mut admin, &["LEASE.REVOKE", "team-b-x", &l]));
    for e in &errors {
        assert!(!e.contains(&l), "an error shows the lease id: {e}");
    }
    assert!(
        errors[0].starts_with("NOPERM") && errors[3].starts_with("NOTFOUND"),
        "{errors:?}"
    );
    let log = s.log_contents();
    assert!(
        !log.contains(&l),
        "the info-level log shows the lease id:\n{log}"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Protected mode
// ---------------------------------------------------------------------------------------------

const OTHER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

#[test]
fn protected_mode_refuses_non_local_clients_without_a_password() {
    let s = Server::start();
    let mut c = connect_from(OTHER, s.addr());
    let (text_got, closed) = read_until_closed(&mut c, PROMPT);
    assert!(
        closed,
        "the refused connection stayed open; got {text_got:?}"
    );
    assert!(
        text_got.starts_with("-DENIED permitd is running in protected mode"),
        "{text_got:?}"
    );
    assert!(
        text_got.ends_with("\r\n") && text_got.lines().count() == 1,
        "{text_got:?}"
    );
    // It says how to open up.
    for how in ["--requirepass", "--protected-mode no", "--bind"] {
        assert!(
            text_got.contains(how),
            "DENIED does not mention {how}: {text_got:?}"
        );
    }
    // 127.0.0.1 is served as usual.
    let mut local = s.raw();
    assert_eq!(local.cmd(&["PING"]), Resp::Simple("PONG".into()));

    // Once the default user has a password, protected mode no longer applies (as Redis).
    let mut admin = s.conn();
    ok(&mut admin, &["ACL", "SETUSER", "default", ">now-pw"]);
    let mut r = BufReader::new(connect_from(OTHER, s.addr()));
    assert_eq!(line_cmd(&mut r, "PING"), "-NOAUTH Authentication required.");
    assert_eq!(line_cmd(&mut r, "AUTH now-pw"), "+OK");
    assert_eq!(line_cmd(&mut r, "PING"), "+PONG");
}

#[test]
fn protected_mode_serves_non_local_clients_with_a_password() {
    let s = Server::start_with(&["--requirepass", "pm-pw"]);
    let mut r = BufReader::new(connect_from(OTHER, s.addr()));
    assert_eq!(line_cmd(&mut r, "PING"), "-NOAUTH Authentication required.");
    assert_eq!(line_cmd(&mut r, "AUTH pm-pw"), "+OK");
    assert_eq!(line_cmd(&mut r, "PING"), "+PONG");
    assert_eq!(line_cmd(&mut r, "CLIENT ID").chars().next(), Some(':'));
}

/// `--protected-mode no`, as documented and as the DENIED message advises, turns protected mode
/// off.
#[test]
fn protected_mode_no_serves_non_local_clients() {
    let s = Server::start_with(&["--protected-mode", "no"]);
    let mut r = BufReader::new(connect_from(OTHER, s.addr()));
    assert_eq!(line_cmd(&mut r, "PING"), "+PONG");
    let mut admin = s.conn();
    let list = text(&ok(&mut admin, &["CLIENT", "LIST"]));
    assert!(list.contains("addr=127.0.0.2:"), "{list}");
}

// ---------------------------------------------------------------------------------------------
// 4. TLS
// ---------------------------------------------------------------------------------------------

/// Certificates for the TLS tests, as PEM files in a temp dir: a CA, a server certificate for
/// 127.0.0.1/localhost signed by it, a client certificate signed by it, and a second CA with a
/// client certificate of its own (the "wrong" ones).
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Pki {
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let dir = TempDir::new();
        let write = |name: &str, pem: &str| fs::write(dir.path(name), pem).unwrap();
        let (ca_cert, ca_issuer) = ca("permitd test CA");
        write("ca.pem", &ca_cert.pem());
        let (cert, key) = leaf(
            &ca_issuer,
            "permitd test server",
            &["localhost", "127.0.0.1"],
            &[ServerAuth],
        );
        write("server.pem", &cert);
        write("server-key.pem", &key);
        let (cert, key) = leaf(&ca_issuer, "permitd test client", &[], &[ClientAuth]);
        write("client.pem", &cert);
        write("client-key.pem", &key);
        let (other_cert, other_issuer) = ca("some other CA");
        write("other-ca.pem", &other_cert.pem());
        let (cert, key) = leaf(&other_issuer, "stranger", &[], &[ClientAuth]);
        write("other-client.pem", &cert);
        write("other-client-key.pem", &key);
        Pki { dir }
    }

    fn file(&self, name: &str) -> String {
        self.dir.arg(name)
    }

    /// A server with a TLS port (and client certificates required when `mutual`).
    fn server(&self, mutual: bool) -> (Server, u16) {
        let tls_port = free_port().to_string();
        let (cert, key, ca) = (
            self.file("server.pem"),
            self.file("server-key.pem"),
            self.file("ca.pem"),
        );
        let mut args = vec![
            "--tls-port",
            tls_port.as_str(),
            "--tls-cert-file",
            cert.as_str(),
            "--tls-key-file",
            key.as_str(),
        ];
        if mutual {
            args.extend(["--tls-ca-cert-file", ca.as_str()]);
        }
        let s = Server::start_with(&args);
        (s, tls_port.parse().unwrap())
    }
}

/// redis-cli against the TLS port with the given extra arguments, then the command.
fn cli_tls(port: u16, opts: &[&str], cmd: &[&str]) -> Run {
    let port = port.to_string();
    let mut args = vec!["-h", "127.0.0.1", "-p", port.as_str()];
    args.extend_from_slice(opts);
    args.extend_from_slice(cmd);
    redis_cli(&args)
}

/// The value after `key` in redis-cli's raw output of a RESP2 map (one item per line).
fn cli_field(out: &str, key: &str) -> String {
    let lines: Vec<&str> = out.lines().collect();
    let i = lines
        .iter()
        .position(|l| *l == key)
        .unwrap_or_else(|| panic!("{key} missing in redis-cli output:\n{out}"));
    lines[i + 1].to_string()
}

#[test]
fn redis_cli_over_tls() {
    let pki = Pki::new();
    let (s, tls) = pki.server(false);
    let ca = pki.file("ca.pem");
    let tls_ok = ["--tls", "--cacert", ca.as_str()];

    let r = cli_tls(tls, &tls_ok, &["PING"]);
    assert!(r.success && r.stdout.trim() == "PONG", "{}", r.all());

    // Plain text against the TLS port: no PONG.
    let r = cli_tls(tls, &[], &["PING"]);
    assert!(
        !r.stdout.contains("PONG"),
        "plain PING on the TLS port: {}",
        r.all()
    );

    // A CA that did not sign the server's certificate: refused.
    let other = pki.file("other-ca.pem");
    let r = cli_tls(tls, &["--tls", "--cacert", other.as_str()], &["PING"]);
    assert!(!r.success && !r.stdout.contains("PONG"), "{}", r.all());
    assert!(r.all().contains("certificate verify failed"), "{}", r.all());

    // A cluster client is sent to the port it came in on (as Redis with `tls-cluster yes`),
    // and CLUSTER SHARDS names both ports.
    let r = cli_tls(tls, &tls_ok, &["CLUSTER", "SLOTS"]);
    assert_eq!(
        cli_field(&r.stdout, "127.0.0.1"),
        tls.to_string(),
        "{}",
        r.all()
    );
    let mut plain = s.conn();
    let slots = ok(&mut plain, &["CLUSTER", "SLOTS"]);
    let master = items(&items(&items(&slots)[0])[2]);
    assert_eq!(int(&master[1]), i64::from(s.port()));
    let shards = ok(&mut plain, &["CLUSTER", "SHARDS"]);
    let node = &items(&field(&items(&shards)[0], "nodes"))[0];
    assert_eq!(int(&field(node, "port")), i64::from(s.port()));
    assert_eq!(int(&field(node, "tls-port")), i64::from(tls));

    // A semaphore round trip over TLS.
    for cmd in [
        &["NS.CREATE", "tls-ns"][..],
        &["SEM.CREATE", "tls-ns", "s", "3"],
    ] {
        let r = cli_tls(tls, &tls_ok, cmd);
        assert!(
            r.success && r.stdout.contains("name"),
            "{cmd:?}: {}",
            r.all()
        );
    }
    let r = cli_tls(
        tls,
        &tls_ok,
        &["LEASE.CREATE", "tls-ns", "tls-worker", "60"],
    );
    let lease_id = cli_field(&r.stdout, "lease_id");
    assert!(lease_id.starts_with("ls_"), "{}", r.all());
    let r = cli_tls(
        tls,
        &tls_ok,
        &["SEM.ACQUIRE", "tls-ns", "s", &lease_id, "2", "1"],
    );
    assert_eq!(cli_field(&r.stdout, "outcome"), ACQUIRED, "{}", r.all());
    assert!(
        cli_field(&r.stdout, "fencing_token")
            .parse::<i64>()
            .unwrap()
            > 0
    );
    let r = cli_tls(tls, &tls_ok, &["SEM.HOLDERS", "tls-ns", "s"]);
    assert!(r.stdout.contains(&lease_id), "{}", r.all());
    // The same state through the plain port.
    let mut con = s.conn();
    assert_eq!(
        holders(&mut con, "tls-ns", "s"),
        vec![(lease_id.clone(), 2)]
    );
    let r = cli_tls(tls, &tls_ok, &["SEM.RELEASE", "tls-ns", "s", &lease_id]);
    assert_eq!(cli_field(&r.stdout, "active_holds"), "0", "{}", r.all());
    assert_eq!(active_holds(&mut con, "tls-ns", "s"), 0);
    // The failed handshakes hurt nobody.
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
}

#[test]
fn tls_client_certificates_are_required_with_a_ca_file() {
    let pki = Pki::new();
    let (s, tls) = pki.server(true);
    let ca = pki.file("ca.pem");
    let (cert, key) = (pki.file("client.pem"), pki.file("client-key.pem"));
    let (ocert, okey) = (
        pki.file("other-client.pem"),
        pki.file("other-client-key.pem"),
    );

    let r = cli_tls(tls, &["--tls", "--cacert", &ca], &["PING"]);
    assert!(
        !r.stdout.contains("PONG"),
        "no client certificate: {}",
        r.all()
    );
    let r = cli_tls(
        tls,
        &["--tls", "--cacert", &ca, "--cert", &ocert, "--key", &okey],
        &["PING"],
    );
    assert!(
        !r.stdout.contains("PONG"),
        "a foreign client certificate: {}",
        r.all()
    );
    let with_cert = ["--tls", "--cacert", &ca, "--cert", &cert, "--key", &key];
    let r = cli_tls(tls, &with_cert, &["PING"]);
    assert!(r.success && r.stdout.trim() == "PONG", "{}", r.all());
    let r = cli_tls(tls, &with_cert, &["NS.CREATE", "mtls"]);
    assert!(r.success && r.stdout.contains("mtls"), "{}", r.all());
    // The plain port does not ask for certificates.
    let mut con = s.conn();
    ok(&mut con, &["NS.GET", "mtls"]);
}

/// The Python interpreter with redis-py: `PERMITD_TEST_PYTHON`, or a venv made once under
/// `target/pytls-venv`.
fn python() -> PathBuf {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        if let Some(p) = std::env::var_os("PERMITD_TEST_PYTHON") {
            return PathBuf::from(p);
        }
        // The test binary is target/<profile>/deps/security-*.
        let exe = std::env::current_exe().expect("current exe");
        let target = exe
            .ancestors()
            .nth(3)
            .map(Path::to_path_buf)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
        let venv = target.join("pytls-venv");
        let marker = format!("redis-py-{REDIS_PY}.installed");
        let py = venv.join("bin").join("python");
        if venv.join(&marker).exists() && py.exists() {
            return py;
        }
        // Built aside and renamed, so an interrupted install is never taken for a good one.
        let tmp = target.join(format!("pytls-venv.tmp-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        let limit = Duration::from_secs(300);
        let r = run(
            Path::new("python3"),
            &["-m".into(), "venv".into(), tmp.display().to_string()],
            limit,
        );
        assert!(r.success, "python3 -m venv {}: {}", tmp.display(), r.all());
        let r = run(
            &tmp.join("bin").join("python"),
            &[
                "-m".into(),
                "pip".into(),
                "install".into(),
                "--disable-pip-version-check".into(),
                "--quiet".into(),
                format!("redis=={REDIS_PY}"),
            ],
            limit,
        );
        assert!(r.success, "pip install redis=={REDIS_PY}: {}", r.all());
        fs::write(tmp.join(&marker), "").unwrap();
        let _ = fs::remove_dir_all(&venv);
        if fs::rename(&tmp, &venv).is_err() {
            // Another test process got there first.
            let _ = fs::remove_dir_all(&tmp);
        }
        assert!(venv.join(&marker).exists(), "no venv at {}", venv.display());
        py
    })
    .clone()
}

const PY_TLS: &str = r#"
import sys, redis
host, port, ca, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def fields(v):
    if isinstance(v, dict):
        return {k.decode() if isinstance(k, bytes) else k: v for k, v in v.items()}
    return {v[i].decode(): v[i + 1] for i in range(0, len(v), 2)}

def s(v):
    return v.decode() if isinstance(v, bytes) else str(v)

if mode == "verified":
    r = redis.Redis(host=host, port=port, ssl=True, ssl_ca_certs=ca, socket_timeout=10)
    print("PING", r.ping())
    r.execute_command("NS.CREATE", "py-tls")
    r.execute_command("SEM.CREATE", "py-tls", "s", 3)
    lease = s(fields(r.execute_command("LEASE.CREATE", "py-tls", "py-worker", 60))["lease_id"])
    print("LEASE", lease)
    got = fields(r.execute_command("SEM.ACQUIRE", "py-tls", "s", lease, 2, 1))
    print("OUTCOME", s(got["outcome"]))
    print("TOKEN", got["fencing_token"])
else:
    try:
        r = redis.Redis(host=host, port=port, ssl=True, socket_timeout=10)
        print("PING", r.ping())
    except Exception as e:
        print("ERROR", type(e).__name__, e)
"#;

#[test]
fn redis_py_over_tls() {
    let pki = Pki::new();
    let (s, tls) = pki.server(false);
    let script = pki.dir.path("tls_check.py");
    fs::write(&script, PY_TLS).unwrap();
    let py = python();
    let go = |mode: &str| {
        run(
            &py,
            &[
                script.display().to_string(),
                "127.0.0.1".into(),
                tls.to_string(),
                pki.file("ca.pem"),
                mode.into(),
            ],
            Duration::from_secs(60),
        )
    };

    let r = go("verified");
    assert!(r.success, "redis-py over TLS: {}", r.all());
    let line = |key: &str| {
        r.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{key} ")))
            .unwrap_or_else(|| panic!("{key} missing: {}", r.all()))
            .to_string()
    };
    assert_eq!(line("PING"), "True");
    assert_eq!(line("OUTCOME"), ACQUIRED);
    assert!(line("TOKEN").parse::<i64>().unwrap() > 0);
    let lease_id = line("LEASE");
    let mut con = s.conn();
    assert_eq!(holders(&mut con, "py-tls", "s"), vec![(lease_id, 2)]);

    // Without the CA, the server's certificate does not verify.
    let r = go("unverified");
    assert!(!r.stdout.contains("PING True"), "{}", r.all());
    assert!(
        r.stdout.contains("certificate verify failed"),
        "{}",
        r.all()
    );
}

/// A user name or key pattern with a space, a newline or a NUL is refused as Redis refuses it:
/// saved, a newline would have written a line of its own to the ACL file, which the next start
/// reads as another user (an enabled, passwordless `+@all` one here), or refuses to read.
#[test]
fn acl_names_and_patterns_with_spaces_or_newlines_are_refused() {
    let tmp = TempDir::new();
    let file = tmp.path("users.acl");
    fs::write(&file, "").unwrap();
    let file_arg = tmp.arg("users.acl");
    let mut s = Server::start_with(&["--aclfile", &file_arg]);
    let mut admin = s.conn();
    for name in ["a a", "evil\nuser", "tab\tname", "nul\0name"] {
        assert_eq!(
            fails(&mut admin, &["ACL", "SETUSER", name, "on"]),
            "ERR Usernames can't contain spaces or null characters",
            "{name:?}"
        );
    }
    let injected = "~ns-*\nuser evil on nopass ~* +@all";
    assert_eq!(
        fails(
            &mut admin,
            &["ACL", "SETUSER", "bob", "on", ">pw", injected]
        ),
        // An error line carries no newline: Redis and permitd write a space instead.
        format!(
            "ERR Error in ACL SETUSER modifier '{}': Syntax error",
            injected.replace('\n', " ")
        )
    );
    assert_eq!(
        fails(&mut admin, &["ACL", "SETUSER", "bob", "on", "~a b"]),
        "ERR Error in ACL SETUSER modifier '~a b': Syntax error"
    );
    // Nothing of the refused calls was applied.
    assert_eq!(
        acl_users(&mut admin),
        BTreeSet::from(["default".to_string()])
    );
    ok(
        &mut admin,
        &["ACL", "SETUSER", "bob", "on", ">pw", "~ns-*", "+@all"],
    );
    assert_eq!(text(&ok(&mut admin, &["ACL", "SAVE"])), "OK");
    drop(admin);
    s.restart();
    let mut admin = s.conn();
    assert_eq!(
        acl_users(&mut admin),
        BTreeSet::from(["bob".to_string(), "default".to_string()])
    );
}

/// Glob patterns match in linear time, where backtracking on every `*` was exponential:
/// `CONFIG GET '*?*?...!'` took seconds and stalled every client of its shard, and an ACL
/// `~pattern` ran on names clients choose. These patterns would take hours that way; the
/// replies must come within the client's read timeout.
#[test]
fn pathological_glob_patterns_answer_at_once() {
    let s = Server::start();
    let mut admin = s.conn();
    let config_pattern = format!("{}!", "*?".repeat(40));
    assert!(items(&ok(&mut admin, &["CONFIG", "GET", &config_pattern])).is_empty());
    let ns_pattern = format!("~{}b", "*a".repeat(30));
    ok(
        &mut admin,
        &["ACL", "SETUSER", "glob", "on", ">pw", &ns_pattern, "+@all"],
    );
    let mut user = login(&s, "glob", "pw");
    let name = "a".repeat(60);
    assert_eq!(
        fails(&mut user, &["NS.GET", &name]),
        format!("NOPERM No permissions to access namespace '{name}'")
    );
    let matching = format!("{}b", "a".repeat(59));
    assert!(fails(&mut user, &["NS.GET", &matching]).starts_with("NOTFOUND"));
}
