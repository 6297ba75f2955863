//! A full disk (SPEC §8), on a real 4 MiB tmpfs mounted as the data directory: the server stays
//! up, serves reads, refuses changes with `MISCONF` and changes nothing (a change applied but not
//! written is rolled back, a grant with it), parked acquires time out as usual, writes resume by
//! themselves once there is room, and what was acknowledged survives a kill -9. A server also
//! starts on a full disk. Any other failed write (`EIO`, on an ext4 image shut down under the
//! server) stops it, after an error reply. Mounting needs root, as CI runs; anyone else gets a
//! failure saying so, not a silent skip.

mod common;

use std::fs;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::disk::{ext4_image, fill, shut_down, Mount};
use common::*;
use permitd::engine::route::shard_for;
use permitd::engine::types::Name;
use redis::Value;

/// A server (2 shards) whose data directory is a fresh 4 MiB tmpfs.
fn server_on_tmpfs() -> (Server, Mount) {
    let mut server = Server::start();
    assert!(server.terminate(Duration::from_secs(10)));
    let disk = Mount::new("tmpfs", "size=4m", Path::new("tmpfs"), server.dir());
    server.restart();
    (server, disk)
}

/// Two namespace names, one on each of the 2 shards.
fn one_per_shard() -> (String, String) {
    let shard = |n: &str| shard_for(&Name::new_unchecked(Bytes::from(n.to_string())), 2);
    let names: Vec<String> = (0..).map(|i| format!("team-{i}")).take(64).collect();
    let a = names.iter().find(|n| shard(n) == 0).unwrap().clone();
    let b = names.iter().find(|n| shard(n) == 1).unwrap().clone();
    (a, b)
}

/// Everything a client can read of the namespaces.
fn observe(con: &mut redis::Connection) -> Vec<Value> {
    let list = ok(con, &["NS.LIST"]);
    let mut seen = vec![list.clone()];
    for ns in items(&field(&list, "namespaces")) {
        let name = text(&field(&ns, "name"));
        seen.push(ok(con, &["SEM.LIST", &name]));
        seen.push(ok(con, &["LEASE.LIST", &name]));
        for sem in items(&field(&seen[seen.len() - 2], "semaphores")) {
            seen.push(ok(
                con,
                &["SEM.HOLDERS", &name, &text(&field(&sem, "name"))],
            ));
        }
    }
    seen
}

/// `replies` without their `waiters` counts (a parked acquire that a rollback answered with the
/// error has left its queue; nothing else moved).
fn without_waiters(replies: Vec<Value>) -> Vec<Value> {
    fn strip(v: Value) -> Value {
        match v {
            Value::Array(items) => {
                let mut out = Vec::with_capacity(items.len());
                let mut items = items.into_iter();
                while let Some(item) = items.next() {
                    if matches!(&item, Value::BulkString(k) if k == b"waiters") {
                        items.next();
                        continue;
                    }
                    out.push(strip(item));
                }
                Value::Array(out)
            }
            other => other,
        }
    }
    replies.into_iter().map(strip).collect()
}

/// An NS.UPDATE whose record (about 12 KB of metadata) needs pages the full disk does not
/// have, whatever room the log's last page has left.
fn big_update(ns: &str) -> Vec<String> {
    let mut words: Vec<String> = ["NS.UPDATE", ns, "VERSION", "1", "META"]
        .map(String::from)
        .to_vec();
    for i in 0..32 {
        words.push(format!("{i:0>128}"));
        words.push("v".repeat(256));
    }
    words
}

fn words(w: &[String]) -> Vec<&str> {
    w.iter().map(String::as_str).collect()
}

/// INFO persistence's field `name`.
fn persistence(con: &mut redis::Connection, name: &str) -> String {
    let info = text(&ok(con, &["INFO", "persistence"]));
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .to_string()
}

fn blocked(con: &mut redis::Connection) -> i64 {
    let info = text(&ok(con, &["INFO", "clients"]));
    info.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("blocked_clients")
}

/// Waits (up to 10 s) until `n` clients are parked.
fn wait_blocked(con: &mut redis::Connection, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while blocked(con) != n {
        assert!(Instant::now() < deadline, "{n} parked clients expected");
        thread::sleep(Duration::from_millis(10));
    }
}

/// Checks that `error` is the refusal of a full data directory `dir`.
fn assert_misconf(error: &str, dir: &Path) {
    assert!(
        error.starts_with("MISCONF ")
            && error.contains(&dir.display().to_string())
            && error.contains("No space left on device"),
        "{error}"
    );
}

/// Retries `args` until it succeeds (writes resumed), within 10 s; returns how long it took.
fn until_written(con: &mut redis::Connection, args: &[&str]) -> Duration {
    let started = Instant::now();
    loop {
        match call(con, args) {
            Ok(_) => return started.elapsed(),
            Err(e) => {
                assert_misconf(&err_text(&e), Path::new(""));
                assert!(
                    started.elapsed() < Duration::from_secs(10),
                    "writes did not resume"
                );
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// An acquire on its own connection, parked in a thread; joins to its reply.
fn parked_acquire(
    server: &Server,
    ns: &str,
    lease: &str,
    timeout: &str,
) -> thread::JoinHandle<(Result<Value, String>, Duration)> {
    let mut con = server.conn();
    let args = ["SEM.ACQUIRE", ns, "pool", lease, "1", timeout].map(String::from);
    thread::spawn(move || {
        let started = Instant::now();
        let r = call(&mut con, &words(&args)).map_err(|e| err_text(&e));
        (r, started.elapsed())
    })
}

#[test]
fn a_full_disk_refuses_changes_keeps_reads_and_resumes_by_itself() {
    let (mut server, disk) = server_on_tmpfs();
    let dir = server.dir().to_path_buf();
    let mut con = server.conn();
    let (ns, other) = one_per_shard();
    setup(&mut con, &ns, "pool", 1);
    setup(&mut con, &other, "pool", 1);
    let (a, b, c) = (
        lease(&mut con, &ns, "a", 300),
        lease(&mut con, &ns, "b", 300),
        lease(&mut con, &ns, "c", 300),
    );
    acquire_now(&mut con, &ns, "pool", &a, 1);
    let waits_long = parked_acquire(&server, &ns, &b, "60");
    wait_blocked(&mut con, 1);
    let times_out = parked_acquire(&server, &ns, &c, "4");
    wait_blocked(&mut con, 2);
    let before = observe(&mut con);
    assert_eq!(persistence(&mut con, "last_write_status"), "ok");

    let filler = fill(&dir);
    // One batch that cannot be written: a release that grants b's parked acquire, and a big
    // record. Both are rolled back: the transaction and b get MISCONF, a still holds.
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["SEM.RELEASE", &ns, "pool", &a]);
    ok(&mut con, &words(&big_update(&ns)));
    assert_misconf(&fails(&mut con, &["EXEC"]), &dir);
    let (granted, _) = waits_long.join().unwrap();
    assert_misconf(&granted.expect_err("b's grant was rolled back"), &dir);
    // The other shard finds the disk full at its own next write.
    assert_misconf(&fails(&mut con, &words(&big_update(&other))), &dir);
    // Every change is refused now, on both shards, whatever it would have done.
    for change in [
        vec!["NS.CREATE", "refused"],
        vec!["NS.UPDATE", &other, "VERSION", "1"],
        vec!["NS.DELETE", &other],
        vec!["SEM.CREATE", &ns, "more", "1"],
        vec!["SEM.UPDATE", &ns, "pool", "2", "VERSION", "1"],
        vec!["SEM.DELETE", &other, "pool"],
        vec!["SEM.ACQUIRE", &ns, "pool", &c, "1", "0"],
        vec!["SEM.RELEASE", &ns, "pool", &a],
        vec!["SEM.RELEASE", &ns, "pool", &b],
        vec!["LEASE.CREATE", &other, "p", "10"],
        vec!["LEASE.REFRESH", &ns, &a, "100"],
        vec!["LEASE.REVOKE", &ns, &b],
    ] {
        assert_misconf(&fails(&mut con, &change), &dir);
    }
    // b's acquire ended with the error, c still waits; the rest is as before the disk filled.
    let pool = ok(&mut con, &["SEM.GET", &ns, "pool"]);
    assert_eq!(int(&field(&pool, "waiters")), 1);
    assert_eq!(
        without_waiters(observe(&mut con)),
        without_waiters(before),
        "reads show the state before the disk filled"
    );
    assert_eq!(persistence(&mut con, "last_write_status"), "err");
    assert_eq!(persistence(&mut con, "aof_last_write_status"), "err");
    assert!(persistence(&mut con, "last_write_error").contains("No space left on device"));
    // The acquire parked before keeps waiting, and times out as usual.
    let (timed_out, waited) = times_out.join().unwrap();
    let timed_out = timed_out.expect("an outcome, not an error");
    assert_eq!(
        text(&field(&timed_out, "outcome")),
        "ACQUIRE_OUTCOME_TIMED_OUT"
    );
    assert!(waited >= Duration::from_millis(3900), "{waited:?}");

    fs::remove_file(&filler).unwrap();
    let resumed = until_written(&mut con, &["NS.CREATE", "after"]);
    assert!(
        resumed < Duration::from_secs(3),
        "resumed after {resumed:?}"
    );
    until_written(&mut con, &["NS.CREATE", "after-too"]);
    assert_eq!(persistence(&mut con, "last_write_status"), "ok");
    ok(&mut con, &["SEM.RELEASE", &ns, "pool", &a]);
    acquire_now(&mut con, &ns, "pool", &c, 1);
    ok(&mut con, &["NS.DELETE", &other]);
    let acknowledged = observe(&mut con);

    server.kill9();
    server.restart();
    let mut con = server.conn();
    assert_eq!(observe(&mut con), acknowledged);
    fails(&mut con, &["NS.GET", "refused"]);
    drop(disk);
}

/// A pipeline for the other shard thread whose first change cannot be written: the shard runs
/// it a piece of about 64 KiB of replies at a time, and each reply of the changes rolled back
/// (or refused after) comes back as the error, one for one, the replies behind them in step.
#[test]
fn a_batch_for_another_shard_rolled_back_answers_each_request_with_the_error() {
    let (server, disk) = server_on_tmpfs();
    let dir = server.dir().to_path_buf();
    let mut con = server.conn();
    let (mut raw, home) = raw_with_home(&server, &mut con);
    let ns = namespace_on(1 - home, "far");
    ok(&mut con, &["NS.CREATE", &ns]);
    let filler = fill(&dir);
    // The big record lacks room; the 500 leases behind it run with it before the write fails.
    let update = big_update(&ns);
    let mut bytes = encode(&update.iter().map(String::as_bytes).collect::<Vec<_>>());
    for i in 0..500 {
        let process = format!("p{i}");
        bytes.extend(encode(&[
            b"LEASE.CREATE",
            ns.as_bytes(),
            process.as_bytes(),
            b"60",
        ]));
    }
    bytes.extend(encode(&[b"PING"]));
    raw.send(&bytes).unwrap();
    for i in 0..501 {
        match raw.read_reply().unwrap() {
            Resp::Error(e) => assert_misconf(&e, &dir),
            other => panic!("reply {i} is not the error: {other:?}"),
        }
    }
    assert_eq!(raw.read_reply().unwrap(), Resp::Simple("PONG".into()));
    fs::remove_file(&filler).unwrap();
    until_written(&mut con, &["NS.CREATE", "after"]);
    let leases = ok(&mut con, &["LEASE.LIST", &ns]);
    assert!(items(&field(&leases, "leases")).is_empty(), "{leases:?}");
    drop(disk);
}

#[test]
fn a_server_starts_on_a_full_disk_serves_reads_and_resumes() {
    let (mut server, disk) = server_on_tmpfs();
    let dir = server.dir().to_path_buf();
    let mut con = server.conn();
    let (ns, other) = one_per_shard();
    setup(&mut con, &ns, "pool", 2);
    setup(&mut con, &other, "pool", 2);
    let a = lease(&mut con, &ns, "a", 300);
    acquire_now(&mut con, &ns, "pool", &a, 1);
    let before = observe(&mut con);
    server.kill9();

    let filler = fill(&dir);
    server.restart();
    let mut con = server.conn();
    assert_eq!(observe(&mut con), before);
    assert_eq!(persistence(&mut con, "last_write_status"), "err");
    assert_misconf(&fails(&mut con, &["LEASE.CREATE", &ns, "p", "10"]), &dir);
    assert_misconf(&fails(&mut con, &["SEM.RELEASE", &ns, "pool", &a]), &dir);
    assert_misconf(&fails(&mut con, &["NS.DELETE", &other]), &dir);
    assert_eq!(observe(&mut con), before);

    fs::remove_file(&filler).unwrap();
    let resumed = until_written(&mut con, &["SEM.RELEASE", &ns, "pool", &a]);
    assert!(
        resumed < Duration::from_secs(3),
        "resumed after {resumed:?}"
    );
    until_written(&mut con, &["NS.DELETE", &other]);
    let acknowledged = observe(&mut con);
    assert_ne!(acknowledged, before);
    server.kill9();
    server.restart();
    let mut con = server.conn();
    assert_eq!(observe(&mut con), acknowledged);
    drop(disk);
}

#[test]
fn a_failed_write_other_than_a_full_disk_answers_an_error_and_stops_the_server() {
    let mut server = Server::start();
    assert!(server.terminate(Duration::from_secs(10)));
    let image = ext4_image(server.dir());
    let disk = Mount::new("ext4", "loop", &image, server.dir());
    server.restart();
    let mut con = server.conn();
    let (ns, _) = one_per_shard();
    setup(&mut con, &ns, "pool", 1);
    let before = observe(&mut con);

    shut_down(server.dir());
    let error = fails(&mut con, &["SEM.CREATE", &ns, "more", "1"]);
    assert!(
        error.starts_with("ERR permitd could not write the log")
            && error.contains("Input/output error")
            && error.contains("stopping"),
        "{error}"
    );
    let status = server
        .wait_exit(Duration::from_secs(15))
        .expect("the server stops");
    assert_eq!(status.code(), Some(1), "{status:?}");

    drop(disk);
    let disk = Mount::new("ext4", "loop", &image, server.dir());
    server.restart();
    let mut con = server.conn();
    assert_eq!(observe(&mut con), before, "what was acknowledged is there");
    server.kill9();
    drop(disk);
    let _ = fs::remove_file(&image);
}
