//! The control connection: sets the namespace up, starts the load, watches INFO and the server's
//! memory while it runs, then checks that the server is back where it started.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use permitd_client::now_ns;
use permitd_client::resp::Value;
use tokio::time::sleep;

use crate::checks::{check_error, check_lease, consistency_check, LEASE_GONE};
use crate::conn::Conn;
use crate::conn::REPLY_GRACE;
use crate::load::{chaos, parker, worker, Chaos};
use crate::settings::{NS, SEMS};
use crate::shared::Shared;

/// Descriptors the server has open, and its limit (soft RLIMIT_NOFILE).
fn server_fds(pid: u32) -> (u64, u64) {
    let open = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    let limit = std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0);
    (open, limit)
}

/// A memory figure of the server from /proc/PID/status (`key` is `VmRSS:` or `VmHWM:`), in KiB.
fn rss_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn info_map(v: &Value) -> HashMap<String, String> {
    v.text()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

async fn info(c: &mut Conn) -> io::Result<HashMap<String, String>> {
    Ok(info_map(&c.cmd(&["INFO"], Duration::ZERO).await?))
}

fn num(m: &HashMap<String, String>, k: &str) -> i64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(-1)
}

#[derive(Default)]
struct Peaks {
    connected: i64,
    blocked: i64,
    waiters: i64,
    rss_kb: u64,
    fds: u64,
}

async fn monitor(sh: Rc<Shared>, peaks: Rc<RefCell<Peaks>>) {
    let Ok(mut c) = Conn::open(sh.addr).await else {
        sh.violation("monitor could not connect".into());
        return;
    };
    let mut close = sh.close.subscribe();
    loop {
        tokio::select! {
            _ = close.wait_for(|c| *c) => return,
            _ = sleep(Duration::from_secs(1)) => {}
        }
        match info(&mut c).await {
            Ok(m) => {
                let mut p = peaks.borrow_mut();
                p.connected = p.connected.max(num(&m, "connected_clients"));
                p.blocked = p.blocked.max(num(&m, "blocked_clients"));
                p.waiters = p.waiters.max(num(&m, "waiters"));
                p.rss_kb = p.rss_kb.max(rss_kb(sh.cli.server_pid, "VmRSS:"));
                p.fds = p.fds.max(server_fds(sh.cli.server_pid).0);
            }
            Err(e) => {
                sh.violation(format!("monitor INFO: {e}"));
                return;
            }
        }
    }
}

/// Polls INFO until `ok` holds or `secs` pass; returns the last INFO.
async fn wait_info(
    c: &mut Conn,
    secs: u64,
    ok: impl Fn(&HashMap<String, String>) -> bool,
) -> io::Result<HashMap<String, String>> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let m = info(c).await?;
        if ok(&m) || Instant::now() > deadline {
            return Ok(m);
        }
        sleep(Duration::from_millis(100)).await;
    }
}

async fn setup(c: &mut Conn) -> io::Result<()> {
    c.cmd(&["NS.DELETE", NS], Duration::ZERO).await?;
    let v = c.cmd(&["NS.CREATE", NS], Duration::ZERO).await?;
    if let Value::Error(e) = v {
        return Err(io::Error::other(format!("NS.CREATE: {e}")));
    }
    for (sem, permits) in SEMS {
        let v = c
            .cmd(
                &["SEM.CREATE", NS, sem, &permits.to_string()],
                Duration::ZERO,
            )
            .await?;
        if let Value::Error(e) = v {
            return Err(io::Error::other(format!("SEM.CREATE: {e}")));
        }
    }
    Ok(())
}

/// Every lease of the namespace, page by page.
async fn all_leases(sh: &Shared, c: &mut Conn) -> io::Result<Vec<String>> {
    let mut out = Vec::new();
    let mut cursor = String::new();
    for _ in 0..100_000 {
        let sent = now_ns();
        let mut args = vec!["LEASE.LIST", NS, "LIMIT", "250"];
        if !cursor.is_empty() {
            args.extend(["CURSOR", cursor.as_str()]);
        }
        let v = c.cmd(&args, Duration::ZERO).await?;
        let Some(ls) = v.items_field("leases") else {
            sh.violation(format!("LEASE.LIST: {v:?}"));
            break;
        };
        for l in ls {
            if let Some(id) = check_lease(sh, "final LEASE.LIST", l, sent) {
                out.push(id);
            }
        }
        cursor = v.text_field("next_cursor").unwrap_or_default();
        if cursor.is_empty() {
            break;
        }
    }
    Ok(out)
}

pub async fn run(sh: Rc<Shared>) -> io::Result<()> {
    let cli = sh.cli.clone();
    let pid = cli.server_pid;
    let mut admin = Conn::open(sh.addr).await?;
    setup(&mut admin).await?;
    sleep(Duration::from_secs(2)).await;
    let rss_before = rss_kb(pid, "VmRSS:");
    let started = Instant::now();

    let peaks = Rc::new(RefCell::new(Peaks::default()));
    tokio::task::spawn_local(monitor(sh.clone(), peaks.clone()));
    let chaos_kinds = [Chaos::Kill, Chaos::Unblock, Chaos::Revoke, Chaos::Update];
    let parkers = cli.parkers.min(cli.connections - chaos_kinds.len());
    let workers = cli.connections - parkers - chaos_kinds.len();
    let mut handles = Vec::new();
    for i in 0..parkers {
        handles.push(tokio::task::spawn_local(parker(sh.clone(), i)));
    }
    for i in 0..workers {
        handles.push(tokio::task::spawn_local(worker(sh.clone(), i)));
    }
    for (i, k) in chaos_kinds.into_iter().enumerate() {
        handles.push(tokio::task::spawn_local(chaos(sh.clone(), k, i)));
    }
    let total = handles.len();
    // All connections open first, then the load starts at once.
    let open_deadline = Instant::now() + Duration::from_secs(120);
    while sh.connected.get() < total && Instant::now() < open_deadline {
        sleep(Duration::from_millis(100)).await;
    }
    let m = wait_info(&mut admin, 10, |m| {
        num(m, "connected_clients") >= total as i64 + 2
    })
    .await?;
    let opened = num(&m, "connected_clients") - 2;
    eprintln!(
        "soak: {opened} load connections open after {:.1} s; load for {} s",
        started.elapsed().as_secs_f64(),
        cli.seconds
    );
    if opened != total as i64 {
        let (fds, limit) = server_fds(pid);
        sh.violation(format!(
            "{opened} connections open of {total} ({} connect failures; the server has {fds} \
             descriptors open, its limit is {limit})",
            sh.stats.borrow().connect_failures
        ));
    }
    let _ = sh.start.send(true);
    let load_start = Instant::now();
    let mut next_report = 30;
    while load_start.elapsed() < Duration::from_secs(cli.seconds) && !sh.stop.get() {
        sleep(Duration::from_secs(1)).await;
        let e = load_start.elapsed().as_secs();
        if e >= next_report {
            next_report += 30;
            let p = peaks.borrow();
            let s = sh.stats.borrow();
            eprintln!(
                "soak: {e} s ops={} acquired={} timed_out={} peak_blocked={} rss={} kB violations={}",
                s.ops,
                s.acquired,
                s.timed_out,
                p.blocked,
                rss_kb(pid, "VmRSS:"),
                s.violations
            );
        }
    }
    sh.stop.set(true);
    // Tasks finish what they are doing (a parked acquire ends within its timeout).
    let drain_limit =
        Duration::from_secs_f64(cli.max_timeout) + REPLY_GRACE + Duration::from_secs(15);
    let drain_start = Instant::now();
    while sh.resting.get() < total && drain_start.elapsed() < drain_limit {
        sleep(Duration::from_millis(100)).await;
    }
    if sh.resting.get() < total {
        sh.violation(format!(
            "{} of {total} load tasks did not finish",
            total - sh.resting.get()
        ));
    }

    // 1. INFO: nothing parked, every connection accounted for (load + admin + monitor).
    let expected = total as i64 + 2;
    let m = wait_info(&mut admin, 10, |m| {
        num(m, "blocked_clients") == 0
            && num(m, "waiters") == 0
            && num(m, "connected_clients") == expected
    })
    .await?;
    for (k, want) in [
        ("blocked_clients", 0),
        ("waiters", 0),
        ("connected_clients", expected),
    ] {
        if num(&m, k) != want {
            sh.violation(format!(
                "after the load INFO {k}:{} (want {want})",
                num(&m, k)
            ));
        }
    }
    let leases_expired = num(&m, "leases_expired");
    // 2. Every semaphore: active_holds is the sum of its holders, none of a dead lease.
    for (sem, _) in SEMS {
        consistency_check(&sh, &mut admin, sem).await?;
    }
    // 3. No lease is visible past its death; revoking all of them frees every permit.
    let leases = all_leases(&sh, &mut admin).await?;
    for chunk in leases.chunks(256) {
        for l in chunk {
            admin.send(&["LEASE.REVOKE", NS, l]).await?;
        }
        for _ in chunk {
            match admin.read(Duration::ZERO).await? {
                Value::Simple(_) => {}
                Value::Error(e) => check_error(&sh, "final LEASE.REVOKE", &e, &[LEASE_GONE]),
                v => sh.violation(format!("LEASE.REVOKE: {v:?}")),
            }
        }
    }
    for (sem, _) in SEMS {
        let v = admin.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await?;
        let held = v.int_field("active_holds");
        let count = v.int_field("active_holders_count");
        if held != Some(0) || count != Some(0) {
            sh.violation(format!(
                "{sem}: after revoking every lease active_holds {held:?}, holders {count:?}"
            ));
        }
    }
    let m = info(&mut admin).await?;
    for k in ["leases", "holders", "waiters"] {
        if num(&m, k) != 0 {
            sh.violation(format!(
                "after revoking every lease INFO {k}:{}",
                num(&m, k)
            ));
        }
    }

    // 4. Close the load's connections; memory must come back.
    let _ = sh.close.send(true);
    for h in handles {
        let _ = h.await;
    }
    let m = wait_info(&mut admin, 30, |m| num(m, "connected_clients") == 1).await?;
    if num(&m, "connected_clients") != 1 {
        sh.violation(format!(
            "after closing the load INFO connected_clients:{} (want 1)",
            num(&m, "connected_clients")
        ));
    }
    // What the server keeps about the load on purpose, as an operator can reset it: the slow
    // log's entries (made during the peak, they pin allocator pages: 1.9 MB after a 30 s run)
    // and the per-command statistics (latency histograms made on first use: 0.65 MB). What
    // must come back is everything else.
    for reset in [&["SLOWLOG", "RESET"][..], &["CONFIG", "RESETSTAT"][..]] {
        admin.cmd(reset, Duration::ZERO).await?;
    }
    // Give the allocator a moment, then take the lowest of a few readings.
    let mut rss_after = u64::MAX;
    for _ in 0..10 {
        sleep(Duration::from_secs(1)).await;
        rss_after = rss_after.min(rss_kb(pid, "VmRSS:"));
    }
    let rss_peak = rss_kb(pid, "VmHWM:").max(peaks.borrow().rss_kb);
    let limit = (rss_before as f64 * (1.0 + cli.rss_tolerance)) as u64;
    if rss_after > limit {
        sh.violation(format!(
            "RSS after the load {rss_after} kB > {rss_before} kB before + {:.0}%",
            cli.rss_tolerance * 100.0
        ));
    }

    let s = sh.stats.borrow();
    let p = peaks.borrow();
    let errors: Vec<String> = s.errors.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    println!(
        "soak: seconds={} connections={total} parkers={parkers} peak_connected={} peak_parked={} peak_waiters={} \
         ops={} acquired={} timed_out={} unavailable={} errors={{{}}} kills={}/{} killed_seen={} \
         unblocks={}/{} disconnects={} revokes={} updates={}/{} leases_expired={} consistency_checks={} \
         reconnects={} connect_failures={} max_timeout_late_ms={} server_fds(peak={} limit={}) \
         rss_kb(before={rss_before} peak={rss_peak} after={rss_after}) \
         violations={}",
        cli.seconds,
        p.connected,
        p.blocked,
        p.waiters,
        s.ops,
        s.acquired,
        s.timed_out,
        s.unavailable,
        errors.join(","),
        s.kills_hit,
        s.kills_sent,
        s.killed_seen,
        s.unblocks_hit,
        s.unblocks_sent,
        s.disconnects,
        s.revokes,
        s.updates_ok,
        s.updates_ok + s.updates_rejected,
        leases_expired,
        s.consistency_checks,
        s.connects.saturating_sub(total as u64),
        s.connect_failures,
        s.max_timeout_late_ms,
        p.fds,
        server_fds(pid).1,
        s.violations,
    );
    Ok(())
}
