//! What operators watch, over real sockets with real clients (SPEC §7 observability, §11):
//! SEM.WAITERS and the `waiters` count, MONITOR through the real `redis-cli MONITOR`, SLOWLOG and
//! LATENCY in Redis's reply shapes, INFO's `# CPU`.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use common::*;
use redis::Value;

/// How long a test waits for something that should happen at once. Generous on purpose.
const PROMPT: Duration = Duration::from_secs(10);

/// `(lease_id, client_id)` of every parked acquire on `ns`/`sem`, in serving order.
fn waiters(con: &mut redis::Connection, ns: &str, sem: &str) -> Vec<(String, i64)> {
    items(&field(&ok(con, &["SEM.WAITERS", ns, sem]), "waiters"))
        .iter()
        .map(|w| (text(&field(w, "lease_id")), int(&field(w, "client_id"))))
        .collect()
}

#[test]
fn sem_waiters_lists_parked_clients_in_fifo_order_and_drops_each_way_they_leave() {
    let server = Server::start();
    let mut admin = server.conn();
    setup(&mut admin, "wait", "s", 1);
    let holder = lease(&mut admin, "wait", "holder", 60);
    acquire_now(&mut admin, "wait", "s", &holder, 1);
    assert!(waiters(&mut admin, "wait", "s").is_empty());

    let leases: Vec<String> = (0..4)
        .map(|i| lease(&mut admin, "wait", &format!("w{i}"), 60))
        .collect();
    // Parked one after the other, each with its CLIENT ID: each is in the queue before the
    // next is sent.
    let mut parked = Vec::new();
    for (i, l) in leases.iter().take(3).enumerate() {
        let mut con = server.conn();
        let id = int(&ok(&mut con, &["CLIENT", "ID"]));
        parked.push((id, park_on(con, "wait", "s", l, 1, "30")));
        wait_parked(&mut admin, i as i64 + 1);
    }
    // The fourth on a raw socket, which the test then closes.
    let mut raw = server.raw();
    raw.send_cmd(&[
        b"SEM.ACQUIRE",
        b"wait",
        b"s",
        leases[3].as_bytes(),
        b"1",
        b"30",
    ])
    .unwrap();
    wait_parked(&mut admin, 4);
    let got = waiters(&mut admin, "wait", "s");
    let want_leases: Vec<&String> = leases.iter().collect();
    assert_eq!(got.iter().map(|w| &w.0).collect::<Vec<_>>(), want_leases);
    for (i, (id, _)) in parked.iter().enumerate() {
        assert_eq!(got[i].1, *id, "client_id is the parked client's CLIENT ID");
    }
    let entry = &items(&field(
        &ok(&mut admin, &["SEM.WAITERS", "wait", "s"]),
        "waiters",
    ))[0];
    assert_eq!(text(&field(entry, "process_id")), "w0");
    assert_eq!(int(&field(entry, "weight")), 1);
    let (parked_at, deadline) = (
        int(&field(entry, "parked_at")),
        int(&field(entry, "deadline")),
    );
    assert_eq!(
        deadline - parked_at,
        30_000_000_000,
        "deadline = parked_at + timeout"
    );
    let sem = ok(&mut admin, &["SEM.GET", "wait", "s"]);
    assert_eq!(int(&field(&sem, "waiters")), 4);
    // Paged as SEM.HOLDERS: two pages of two.
    let p1 = ok(&mut admin, &["SEM.WAITERS", "wait", "s", "LIMIT", "2"]);
    let next = text(&field(&p1, "next_cursor"));
    let p2 = ok(
        &mut admin,
        &["SEM.WAITERS", "wait", "s", "CURSOR", &next, "LIMIT", "2"],
    );
    let second: Vec<String> = items(&field(&p2, "waiters"))
        .iter()
        .map(|w| text(&field(w, "lease_id")))
        .collect();
    assert_eq!(second, leases[2..4].to_vec());
    assert_eq!(text(&field(&p2, "next_cursor")), "");

    // Disconnect: the raw client goes.
    drop(raw);
    assert!(wait_until(PROMPT, || waiters(&mut admin, "wait", "s")
        .len()
        == 3));
    // CLIENT UNBLOCK: the third leaves.
    let third = parked[2].0.to_string();
    assert_eq!(int(&ok(&mut admin, &["CLIENT", "UNBLOCK", &third])), 1);
    let left: Vec<String> = waiters(&mut admin, "wait", "s")
        .into_iter()
        .map(|w| w.0)
        .collect();
    assert_eq!(left, leases[0..2].to_vec());
    // Granted: the head gets the permit and leaves the queue.
    ok(&mut admin, &["SEM.RELEASE", "wait", "s", &holder]);
    let reply = join_reply(parked.remove(0).1);
    assert_eq!(text(&field(&reply, "outcome")), "ACQUIRE_OUTCOME_ACQUIRED");
    let left: Vec<String> = waiters(&mut admin, "wait", "s")
        .into_iter()
        .map(|w| w.0)
        .collect();
    assert_eq!(left, leases[1..2].to_vec());
    // Time-out: one parked for 3 s leaves by itself.
    let late = lease(&mut admin, "wait", "late", 60);
    let timed = park(&server, "wait", "s", &late, 1, "3");
    wait_parked(&mut admin, 2);
    let reply = join_reply(timed);
    assert_eq!(text(&field(&reply, "outcome")), "ACQUIRE_OUTCOME_TIMED_OUT");
    let left: Vec<String> = waiters(&mut admin, "wait", "s")
        .into_iter()
        .map(|w| w.0)
        .collect();
    assert_eq!(left, leases[1..2].to_vec());
    assert!(fails(&mut admin, &["SEM.WAITERS", "wait", "nope"]).starts_with("NOTFOUND"));
    assert!(
        fails(&mut admin, &["SEM.WAITERS", "wait", "s", "LIMIT", "0"]).starts_with("INVALIDARG")
    );
}

#[test]
fn redis_cli_monitor_shows_acquires_live_with_lease_ids_redacted() {
    let server = Server::start();
    let mut admin = server.conn();
    setup(&mut admin, "mon", "s", 1);
    let holder = lease(&mut admin, "mon", "holder", 60);
    let waiter = lease(&mut admin, "mon", "waiter", 60);
    acquire_now(&mut admin, "mon", "s", &holder, 1);

    let mut cli = Command::new("redis-cli")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port().to_string(),
            "MONITOR",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("redis-cli (Debian's redis-tools) runs");
    let (tx, lines) = mpsc::channel();
    let out = cli.stdout.take().unwrap();
    thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(lines.recv_timeout(PROMPT).unwrap(), "OK");
    // The monitor is registered once its OK is out: what runs from now on shows.
    let reply = park(&server, "mon", "s", &waiter, 1, "30");
    wait_parked(&mut admin, 1);
    let mut seen = Vec::new();
    let acquire = loop {
        let line = lines
            .recv_timeout(PROMPT)
            .expect("the acquire shows while it is parked");
        seen.push(line.clone());
        if line.contains("\"SEM.ACQUIRE\"") {
            break line;
        }
    };
    // Still parked: shown live, not when it ends.
    assert!(!reply.is_finished());
    // `1700000000.123456 [0 127.0.0.1:port] "SEM.ACQUIRE" ...` (redis-cli prints the line
    // without its leading `+`).
    let (stamp, rest) = acquire.split_once(' ').unwrap();
    let (secs, micros) = stamp.split_once('.').unwrap();
    assert!(
        secs.len() == 10 && secs.bytes().all(|b| b.is_ascii_digit()),
        "{acquire}"
    );
    assert!(
        micros.len() == 6 && micros.bytes().all(|b| b.is_ascii_digit()),
        "{acquire}"
    );
    let (client, words) = rest.split_once("] ").unwrap();
    assert!(client.starts_with("[0 127.0.0.1:"), "{acquire}");
    assert_eq!(
        words,
        "\"SEM.ACQUIRE\" \"mon\" \"s\" \"ls_<redacted>\" \"1\" \"30\""
    );
    ok(&mut admin, &["SEM.RELEASE", "mon", "s", &holder]);
    join_reply(reply);
    let release = loop {
        let line = lines.recv_timeout(PROMPT).expect("the release shows");
        seen.push(line.clone());
        if line.contains("\"SEM.RELEASE\"") {
            break line;
        }
    };
    assert!(release.ends_with("\"SEM.RELEASE\" \"mon\" \"s\" \"ls_<redacted>\""));
    for line in &seen {
        assert!(
            !line.contains(&holder) && !line.contains(&waiter),
            "a lease id in MONITOR: {line}"
        );
    }
    cli.kill().unwrap();
    cli.wait().unwrap();
}

#[test]
fn slowlog_and_latency_answer_as_redis() {
    // Every command is slow enough for the log; spikes of 1 ms or more reach the monitor.
    let server = Server::start_with(&["--slowlog-log-slower-than", "0", "--slowlog-max-len", "3"]);
    let mut con = server.conn();
    ok(&mut con, &["CLIENT", "SETNAME", "watcher"]);
    assert_eq!(ok(&mut con, &["SLOWLOG", "RESET"]), Value::Okay);
    setup(&mut con, "slow", "s", 1);
    let l = lease(&mut con, "slow", "p", 60);
    acquire_now(&mut con, "slow", "s", &l, 1);
    assert_eq!(
        int(&ok(&mut con, &["SLOWLOG", "LEN"])),
        3,
        "max-len keeps 3"
    );
    let entries = items(&ok(&mut con, &["SLOWLOG", "GET", "-1"]));
    assert_eq!(entries.len(), 3);
    // Newest first: SLOWLOG LEN itself (Redis logs it too), then the acquire.
    let words = |e: &Value| strings(&items(e)[3]);
    assert_eq!(words(&entries[0]), ["SLOWLOG", "LEN"]);
    let acquire = items(&entries[1]);
    assert_eq!(acquire.len(), 6, "id, time, duration, words, peer, name");
    assert!(int(&items(&entries[0])[0]) > int(&acquire[0]), "ids rise");
    assert_eq!(
        words(&entries[1]),
        ["SEM.ACQUIRE", "slow", "s", "ls_<redacted>", "1", "0"]
    );
    assert!(text(&acquire[4]).starts_with("127.0.0.1:"));
    assert_eq!(text(&acquire[5]), "watcher");
    assert_eq!(items(&ok(&mut con, &["SLOWLOG", "GET", "1"])).len(), 1);
    assert_eq!(
        fails(&mut con, &["SLOWLOG", "GET", "-2"]),
        "ERR count should be greater than or equal to -1"
    );
    let config = fields(&ok(&mut con, &["CONFIG", "GET", "slowlog-*"]));
    let config: Vec<(String, String)> = config.into_iter().map(|(k, v)| (k, text(&v))).collect();
    assert!(
        config.contains(&("slowlog-log-slower-than".into(), "0".into())),
        "{config:?}"
    );
    assert!(
        config.contains(&("slowlog-max-len".into(), "3".into())),
        "{config:?}"
    );
    let threshold = fields(&ok(
        &mut con,
        &["CONFIG", "GET", "latency-monitor-threshold"],
    ));
    assert_eq!(text(&threshold[0].1), "0", "off by default");
    // Off: no events, and RESET forgets none.
    assert_eq!(items(&ok(&mut con, &["LATENCY", "LATEST"])).len(), 0);
    assert_eq!(int(&ok(&mut con, &["LATENCY", "RESET"])), 0);

    // A parked acquire's wait is not its run time (as Redis leaves blocked time out).
    let strict = Server::start_with(&["--slowlog-log-slower-than", "1000000"]);
    let mut c = strict.conn();
    setup(&mut c, "slow", "s", 1);
    let (a, b) = (
        lease(&mut c, "slow", "a", 60),
        lease(&mut c, "slow", "b", 60),
    );
    acquire_now(&mut c, "slow", "s", &a, 1);
    let r = join_reply(park(&strict, "slow", "s", &b, 1, "3"));
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_TIMED_OUT");
    assert_eq!(
        int(&ok(&mut c, &["SLOWLOG", "LEN"])),
        0,
        "3 s parked is not 1 s of work"
    );

    // By default only commands of 10 ms and more are logged.
    let quiet = Server::start();
    let mut q = quiet.conn();
    ok(&mut q, &["PING"]);
    assert_eq!(int(&ok(&mut q, &["SLOWLOG", "LEN"])), 0);
}

#[test]
fn slowlog_hides_passwords_as_redis_7() {
    let server = Server::start_with(&["--slowlog-log-slower-than", "0"]);
    let mut con = server.conn();
    let rules = ["on", ">alice-secret", "~*", "+@all"];
    ok(
        &mut con,
        &[&["ACL", "SETUSER", "alice"][..], &rules].concat(),
    );
    // A refused SETUSER is logged too, its words hidden all the same.
    fails(
        &mut con,
        &["ACL", "SETUSER", "bob", ">bob-secret", "+nosuch"],
    );
    let mut raw = server.raw();
    assert_eq!(
        raw.cmd(&["AUTH", "alice", "alice-secret"]),
        Resp::Simple("OK".into())
    );
    let entries = items(&ok(&mut con, &["SLOWLOG", "GET", "-1"]));
    let logged: Vec<Vec<String>> = entries.iter().map(|e| strings(&items(e)[3])).collect();
    assert!(
        !format!("{logged:?}").contains("secret"),
        "a password in SLOWLOG: {logged:?}"
    );
    // As Redis 7 records them: every word after ACL SETUSER, and AUTH's.
    let r = "(redacted)";
    for shown in [
        vec!["ACL", "SETUSER", r, r, r, r, r],
        vec!["ACL", "SETUSER", r, r, r],
        vec!["AUTH", r, r],
    ] {
        assert!(
            logged.contains(&shown.iter().map(|w| w.to_string()).collect()),
            "{shown:?} in {logged:?}"
        );
    }
}

#[test]
fn info_cpu_is_redis_7_s_section() {
    let server = Server::start();
    let mut con = server.conn();
    let info = text(&ok(&mut con, &["INFO", "cpu"]));
    assert!(info.starts_with("# CPU\r\n"), "{info}");
    for key in [
        "used_cpu_sys",
        "used_cpu_user",
        "used_cpu_sys_children",
        "used_cpu_user_children",
        "used_cpu_sys_main_thread",
        "used_cpu_user_main_thread",
    ] {
        let v = info_value(&info, key).unwrap_or_else(|| panic!("{key} in {info}"));
        let (s, us) = v.split_once('.').unwrap();
        assert!(s.parse::<u64>().is_ok() && us.len() == 6, "{key}:{v}");
    }
    let total: f64 = info_value(&info, "used_cpu_user").unwrap().parse().unwrap();
    let sys: f64 = info_value(&info, "used_cpu_sys").unwrap().parse().unwrap();
    assert!(total + sys > 0.0, "a started server has used some CPU");
}
