//! `--maxmemory` (off by default, as in Redis): past it, commands that would add state answer
//! Redis's `-OOM` and change nothing; reads, releases, revokes and deletes keep working, so that
//! an operator (or the clients themselves) can bring the memory back down.

mod common;

use common::*;

const OOM: &str = "OOM command not allowed when used memory > 'maxmemory'.";

#[test]
fn past_maxmemory_adds_are_refused_and_everything_else_works() {
    // State made without a limit, then a restart with one the server is already past.
    let mut s = Server::start();
    let mut con = s.conn();
    setup(&mut con, "mem", "s", 2);
    let a = lease(&mut con, "mem", "a", 60);
    let b = lease(&mut con, "mem", "b", 60);
    acquire_now(&mut con, "mem", "s", &a, 1);
    acquire_now(&mut con, "mem", "s", &b, 1);
    ok(&mut con, &["SEM.CREATE", "mem", "gone", "1"]);
    drop(con);
    s.restart_with(&["--maxmemory", "1mb"]);
    let mut con = s.conn();
    assert_eq!(
        text(
            &ok(&mut con, &["CONFIG", "GET", "maxmemory"])
                .as_sequence()
                .unwrap()[1]
        ),
        "1048576"
    );
    for add in [
        &["NS.CREATE", "more"][..],
        &["SEM.CREATE", "mem", "t", "1"],
        &["LEASE.CREATE", "mem", "c", "60"],
        &["SEM.ACQUIRE", "mem", "s", &a, "2", "0"],
        &["NS.UPDATE", "mem", "VERSION", "1", "META", "k", "v"],
    ] {
        assert_eq!(fails(&mut con, add), OOM, "{add:?}");
    }
    // Nothing of it happened.
    assert_eq!(
        holders(&mut con, "mem", "s"),
        vec![(a.clone(), 1), (b.clone(), 1)]
    );
    assert!(fails(&mut con, &["NS.GET", "more"]).starts_with("NOTFOUND"));
    // Reads, releases, refreshes, revokes and deletes work.
    ok(&mut con, &["SEM.GET", "mem", "s"]);
    ok(&mut con, &["NS.LIST"]);
    ok(&mut con, &["SEM.RELEASE", "mem", "s", &a]);
    ok(&mut con, &["LEASE.REFRESH", "mem", &b, "30"]);
    ok(&mut con, &["LEASE.REVOKE", "mem", &b]);
    assert_eq!(active_holds(&mut con, "mem", "s"), 0);
    ok(&mut con, &["SEM.DELETE", "mem", "gone"]);
    // A transaction that would add state is refused whole, as Redis does at EXEC; so is
    // queueing into one.
    let mut raw = s.raw();
    assert_eq!(raw.cmd(&["MULTI"]), Resp::Simple("OK".into()));
    assert!(matches!(raw.cmd(&["SEM.GET", "mem", "s"]), Resp::Error(e) if e == OOM));
    assert!(matches!(raw.cmd(&["EXEC"]), Resp::Error(e) if e.starts_with("EXECABORT")));
    ok(&mut con, &["NS.DELETE", "mem"]);
    assert_eq!(info_int(&mut con, "maxmemory"), 1 << 20);
}

#[test]
fn adds_stop_near_the_limit() {
    // A limit some megabytes above what the idle server takes, filled with maximal leases.
    let probe = Server::start();
    let idle = probe.rss_kb() * 1024;
    drop(probe);
    let limit = idle + 24 * (1 << 20);
    let s = Server::start_with(&["--maxmemory", &limit.to_string()]);
    let mut con = s.conn();
    ok(&mut con, &["NS.CREATE", "fill"]);
    let value = "v".repeat(256);
    let mut meta: Vec<String> = Vec::new();
    for i in 0..32 {
        meta.push(format!("{i:0>128}"));
        meta.push(value.clone());
    }
    let mut created = 0;
    let refused = (0..100_000).find_map(|_| {
        let mut cmd = vec!["LEASE.CREATE", "fill", "p", "60", "META"];
        cmd.extend(meta.iter().map(String::as_str));
        match call(&mut con, &cmd) {
            Ok(_) => {
                created += 1;
                None
            }
            Err(e) => Some(err_text(&e)),
        }
    });
    assert_eq!(refused.as_deref(), Some(OOM), "after {created} leases");
    let rss = s.rss_kb() * 1024;
    assert!(
        rss < limit + 16 * (1 << 20),
        "RSS {rss} near the limit {limit} ({created} leases)"
    );
    // Deletes bring it back under: the namespace goes, and adds work again once it is freed.
    ok(&mut con, &["NS.DELETE", "fill"]);
}
