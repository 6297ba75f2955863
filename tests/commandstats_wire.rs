//! INFO's `# Commandstats`, `# Errorstats` and `# Latencystats` as Redis 7.0 answers them, after
//! its own tests (tests/unit/info.tcl): calls, failed and rejected calls, error counts by code,
//! latency percentiles, which sections INFO shows by default, and figures added up over the
//! shard threads.

mod common;

use std::thread;

use common::*;

/// The value of `key` in `INFO <section>`, if present.
fn stat(con: &mut redis::Connection, section: &str, key: &str) -> Option<String> {
    info_value(&text(&ok(con, &["INFO", section])), key)
}

fn cmdstat(con: &mut redis::Connection, cmd: &str) -> Option<String> {
    stat(con, "commandstats", &format!("cmdstat_{cmd}"))
}

fn errorstat(con: &mut redis::Connection, code: &str) -> Option<String> {
    stat(con, "errorstats", &format!("errorstat_{code}"))
}

/// `calls=..,rejected_calls=..,failed_calls=..` of a commandstats line, checking its shape.
fn counts(line: &str) -> (u64, u64, u64) {
    let fields: Vec<(&str, &str)> = line
        .split(',')
        .map(|f| f.split_once('=').expect("key=value"))
        .collect();
    let keys: Vec<&str> = fields.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "calls",
            "usec",
            "usec_per_call",
            "rejected_calls",
            "failed_calls"
        ],
        "{line}"
    );
    let per_call = fields[2].1;
    assert!(
        per_call.split_once('.').is_some_and(|(_, d)| d.len() == 2),
        "usec_per_call has 2 decimals: {line}"
    );
    let n = |i: usize| fields[i].1.parse::<u64>().expect("an integer");
    (n(0), n(3), n(4))
}

#[test]
fn calls_failures_and_rejections_are_counted_as_redis() {
    let s = Server::start();
    let mut con = s.conn();
    // An unknown command: an error, of no command.
    fails(&mut con, &["ASDF"]);
    assert_eq!(errorstat(&mut con, "ERR").as_deref(), Some("count=1"));
    assert_eq!(cmdstat(&mut con, "asdf"), None);
    // Wrong arity: a rejected call; calls that run after it are counted.
    fails(&mut con, &["SEM.GET", "shop"]);
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (0, 1, 0));
    ok(&mut con, &["NS.CREATE", "shop"]);
    fails(&mut con, &["SEM.GET", "shop", "nope"]);
    fails(&mut con, &["SEM.GET", "shop", "nope"]);
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (2, 1, 2));
    assert_eq!(errorstat(&mut con, "NOTFOUND").as_deref(), Some("count=2"));
    assert_eq!(errorstat(&mut con, "ERR").as_deref(), Some("count=2"));
    // A bad argument is found as the command runs: a failed call.
    fails(&mut con, &["SEM.CREATE", "shop", "pool", "zero"]);
    assert_eq!(counts(&cmdstat(&mut con, "sem.create").unwrap()), (1, 0, 1));
    // NS.LIST asks every shard and counts once.
    ok(&mut con, &["NS.LIST"]);
    assert_eq!(counts(&cmdstat(&mut con, "ns.list").unwrap()), (1, 0, 0));
    // Subcommands are named container|sub.
    ok(&mut con, &["CLIENT", "ID"]);
    assert_eq!(counts(&cmdstat(&mut con, "client|id").unwrap()), (1, 0, 0));
    let errors: i64 = info_text(&mut con, "total_error_replies").parse().unwrap();
    assert_eq!(errors, 5);
}

#[test]
fn transactions_count_their_commands_and_their_abort() {
    let s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "shop", "pool", 1);
    // A rejected command inside MULTI aborts EXEC.
    ok(&mut con, &["MULTI"]);
    fails(&mut con, &["SEM.GET", "shop"]);
    assert!(fails(&mut con, &["EXEC"]).starts_with("EXECABORT"));
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (0, 1, 0));
    assert_eq!(counts(&cmdstat(&mut con, "multi").unwrap()), (1, 0, 0));
    assert_eq!(counts(&cmdstat(&mut con, "exec").unwrap()), (1, 0, 1));
    assert_eq!(errorstat(&mut con, "EXECABORT").as_deref(), Some("count=1"));
    // A failure inside EXEC is the command's; EXEC itself succeeded.
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["SEM.GET", "shop", "pool"]);
    ok(&mut con, &["ECHO", "x"]);
    ok(&mut con, &["EXEC"]);
    // The redis crate reads the error inside EXEC's array as a failed EXEC: use a raw socket.
    drop(con);
    let mut raw = s.raw();
    for cmd in [&["MULTI"][..], &["SEM.GET", "shop", "nope"], &["EXEC"]] {
        raw.cmd(cmd);
    }
    let mut con = s.conn();
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (2, 1, 1));
    assert_eq!(counts(&cmdstat(&mut con, "exec").unwrap()), (3, 0, 1));
    assert_eq!(counts(&cmdstat(&mut con, "echo").unwrap()), (1, 0, 0));
}

#[test]
fn permission_refusals_are_rejected_calls() {
    let s = Server::start();
    let mut con = s.conn();
    ok(
        &mut con,
        &[
            "ACL", "SETUSER", "alice", "on", ">pw", "+ping", "+info", "allkeys",
        ],
    );
    let mut alice = s.conn();
    ok(&mut alice, &["AUTH", "alice", "pw"]);
    assert!(fails(&mut alice, &["SEM.GET", "shop", "pool"]).starts_with("NOPERM"));
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (0, 1, 0));
    assert_eq!(errorstat(&mut con, "NOPERM").as_deref(), Some("count=1"));
}

#[test]
fn a_parked_acquire_ended_by_an_error_is_a_failed_call() {
    let s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "shop", "pool", 1);
    let holder = lease(&mut con, "shop", "holder", 60);
    let waiter = lease(&mut con, "shop", "waiter", 60);
    acquire_now(&mut con, "shop", "pool", &holder, 1);
    let mut other = s.conn();
    let parked = thread::spawn(move || {
        call(
            &mut other,
            &["SEM.ACQUIRE", "shop", "pool", &waiter, "1", "60"],
        )
        .map_err(|e| err_text(&e))
    });
    wait_parked(&mut con, 1);
    ok(&mut con, &["SEM.DELETE", "shop", "pool"]);
    let e = parked.join().unwrap().unwrap_err();
    assert!(e.starts_with("NOTFOUND"), "{e}");
    // Two calls (the acquire at once, the parked one), one failed when its semaphore went.
    assert_eq!(
        counts(&cmdstat(&mut con, "sem.acquire").unwrap()),
        (2, 0, 1)
    );
    assert_eq!(errorstat(&mut con, "NOTFOUND").as_deref(), Some("count=1"));
}

/// A parked SEM.ACQUIREALL is counted under its own name however it ends: CLIENT UNBLOCK
/// ERROR is a failed call of sem.acquireall (issue 32), TIMEOUT an answered one; sem.acquire is
/// left alone.
#[test]
fn a_parked_acquireall_is_counted_under_its_own_name() {
    let s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "shop", "pool", 1);
    let holder = lease(&mut con, "shop", "holder", 60);
    let waiter = lease(&mut con, "shop", "waiter", 60);
    acquire_now(&mut con, "shop", "pool", &holder, 1);
    let before = counts(&cmdstat(&mut con, "sem.acquire").unwrap());
    // The figures after each unblock: (calls, rejected, failed), the same counter both times.
    for (how, figures) in [("ERROR", (1, 0, 1)), ("TIMEOUT", (2, 0, 1))] {
        let mut other = s.conn();
        let id = int(&ok(&mut other, &["CLIENT", "ID"])).to_string();
        let waiter = waiter.clone();
        let parked = thread::spawn(move || {
            let words = ["SEM.ACQUIREALL", "shop", waiter.as_str(), "60", "pool", "1"];
            call(&mut other, &words).map_err(|e| err_text(&e))
        });
        wait_parked(&mut con, 1);
        assert_eq!(int(&ok(&mut con, &["CLIENT", "UNBLOCK", &id, how])), 1);
        let ended = parked.join().unwrap();
        match how {
            "ERROR" => assert!(ended.unwrap_err().starts_with("UNBLOCKED"), "{how}"),
            _ => assert_eq!(outcome(&ended.unwrap()), "ACQUIRE_OUTCOME_TIMED_OUT"),
        }
        assert_eq!(
            counts(&cmdstat(&mut con, "sem.acquireall").unwrap()),
            figures,
            "after CLIENT UNBLOCK {how}"
        );
        assert_eq!(counts(&cmdstat(&mut con, "sem.acquire").unwrap()), before);
    }
    assert_eq!(errorstat(&mut con, "UNBLOCKED").as_deref(), Some("count=1"));
}

#[test]
fn latency_percentiles_are_in_redis_format() {
    let s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "shop", "pool", 1);
    for _ in 0..10 {
        ok(&mut con, &["SEM.GET", "shop", "pool"]);
    }
    let line = stat(&mut con, "latencystats", "latency_percentiles_usec_sem.get").unwrap();
    let values: Vec<(&str, f64)> = line
        .split(',')
        .map(|f| {
            let (k, v) = f.split_once('=').unwrap();
            let (_, decimals) = v.split_once('.').expect("a decimal");
            assert_eq!(decimals.len(), 3, "3 decimals: {line}");
            (k, v.parse().unwrap())
        })
        .collect();
    let keys: Vec<&str> = values.iter().map(|(k, _)| *k).collect();
    assert_eq!(keys, ["p50", "p99", "p99.9"]);
    assert!(values[0].1 > 0.0 && values[0].1 <= values[1].1 && values[1].1 <= values[2].1);
}

#[test]
fn default_info_leaves_out_commandstats_and_latencystats_as_redis_7() {
    let s = Server::start();
    let mut con = s.conn();
    ok(&mut con, &["PING"]);
    fails(&mut con, &["ASDF"]);
    let titles = |con: &mut redis::Connection, args: &[&str]| -> Vec<String> {
        text(&ok(con, args))
            .lines()
            .filter_map(|l| l.strip_prefix("# ").map(|t| t.trim().to_string()))
            .collect()
    };
    for args in [&["INFO"][..], &["INFO", "default"]] {
        let t = titles(&mut con, args);
        assert!(t.contains(&"Errorstats".to_string()), "{t:?}");
        assert!(!t.contains(&"Commandstats".to_string()), "{t:?}");
        assert!(!t.contains(&"Latencystats".to_string()), "{t:?}");
    }
    for all in ["all", "everything"] {
        let t = titles(&mut con, &["INFO", all]);
        let at = |name: &str| t.iter().position(|x| x == name).unwrap();
        // Redis 7's order: stats sections after replication, before cluster and keyspace.
        assert!(at("Replication") < at("Commandstats"));
        assert!(at("Commandstats") < at("Errorstats"));
        assert!(at("Errorstats") < at("Latencystats"));
        assert!(at("Latencystats") < at("Cluster"));
    }
    assert_eq!(
        titles(&mut con, &["INFO", "COMMANDSTATS"]),
        ["Commandstats"]
    );
}

/// A misspelt section is an error naming it (Redis answers an empty text, which reads as a
/// section with nothing in it: issue 32); Redis's sections that have nothing here stay empty,
/// for the clients and exporters that ask for them, and every section of ours answers.
#[test]
fn a_misspelt_info_section_is_an_error_and_redis_s_own_are_empty() {
    let s = Server::start();
    let mut con = s.conn();
    let e = fails(&mut con, &["INFO", "server", "comandstats"]);
    assert_eq!(e, "ERR unknown INFO section 'comandstats'");
    assert_eq!(
        counts(&cmdstat(&mut con, "info").unwrap()).2,
        1,
        "a failed call"
    );
    for redis_only in ["modules", "MODULES", "sentinel", "keysizes"] {
        assert_eq!(
            text(&ok(&mut con, &["INFO", redis_only])),
            "",
            "{redis_only}"
        );
    }
    let ours = [
        "default",
        "all",
        "everything",
        "server",
        "clients",
        "memory",
        "persistence",
        "stats",
        "replication",
        "cpu",
        "semaphores",
        "commandstats",
        "errorstats",
        "latencystats",
        "cluster",
        "raft",
        "keyspace",
    ];
    for section in ours {
        ok(&mut con, &["INFO", section]);
    }
}

#[test]
fn figures_add_up_over_the_shard_threads() {
    let s = Server::start();
    let mut con = s.conn();
    let (a, b) = (namespace_on(0, "a"), namespace_on(1, "b"));
    for ns in [&a, &b] {
        ok(&mut con, &["NS.CREATE", ns]);
        fails(&mut con, &["SEM.GET", ns, "nope"]);
    }
    assert_eq!(counts(&cmdstat(&mut con, "ns.create").unwrap()), (2, 0, 0));
    assert_eq!(counts(&cmdstat(&mut con, "sem.get").unwrap()), (2, 0, 2));
    assert_eq!(errorstat(&mut con, "NOTFOUND").as_deref(), Some("count=2"));
}

/// CONFIG RESETSTAT starts every thread's figures again from zero, as in Redis: what ran before
/// is gone from commandstats, errorstats and latencystats; the reset itself is counted after it.
#[test]
fn config_resetstat_starts_the_figures_again() {
    let s = Server::start();
    let mut con = s.conn();
    for shard in 0..2 {
        let ns = namespace_on(shard, "reset");
        ok(&mut con, &["NS.CREATE", &ns]);
        ok(&mut con, &["NS.GET", &ns]);
    }
    fails(&mut con, &["NS.GET", "nosuch"]);
    assert!(cmdstat(&mut con, "ns.get").is_some());
    assert!(errorstat(&mut con, "NOTFOUND").is_some());
    assert_eq!(text(&ok(&mut con, &["CONFIG", "RESETSTAT"])), "OK");
    let all = text(&ok(&mut con, &["INFO", "commandstats"]));
    let lines: Vec<&str> = all
        .lines()
        .map(str::trim_end)
        .filter(|l| l.starts_with("cmdstat_"))
        .collect();
    assert_eq!(lines.len(), 1, "{all}");
    assert!(
        lines[0].starts_with("cmdstat_config|resetstat:calls=1,"),
        "{all}"
    );
    assert_eq!(errorstat(&mut con, "NOTFOUND"), None);
    assert_eq!(
        stat(&mut con, "latencystats", "latency_percentiles_usec_ns.get"),
        None
    );
    assert_eq!(
        stat(&mut con, "stats", "total_error_replies").as_deref(),
        Some("0")
    );
}
