//! The metrics and cluster ports under a flood of connections (issue 40, item 9), over real
//! sockets: they share the process's file descriptors with the client ports, so a stranger's
//! idle connections must not use them up, and a stranger's refused handshakes must not write a
//! log line each.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::cluster::{ok_ready, start_cluster, wait_for_leader};
use common::*;

/// The caps of src/server/metrics.rs and src/cluster/network.rs.
const METRICS_CAP: usize = 64;
const HANDSHAKE_CAP: usize = 16;

/// How many file descriptors process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .count()
}

/// Lowers the soft and hard descriptor limits of the running process `pid` to `limit`.
fn limit_fds(pid: u32, limit: usize) {
    let lim = libc::rlimit {
        rlim_cur: limit as libc::rlim_t,
        rlim_max: limit as libc::rlim_t,
    };
    // SAFETY: prlimit(2) on a child this process spawned, with a valid rlimit and no old one.
    let rc = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &lim,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0, "prlimit({pid})");
}

/// Opens `n` connections to `port` on loopback, sending `first` on each.
fn flood(port: u16, n: usize, first: &[u8]) -> Vec<TcpStream> {
    (0..n)
        .map(|_| {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.write_all(first).expect("send");
            s
        })
        .collect()
}

/// Whether the server closed `s` within `within` (EOF or reset: not a read time-out).
fn closed_by_server(s: &mut TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    }
}

/// Whether a PING on a new connection to the client port answers within a few seconds.
fn pings(server: &Server) -> bool {
    let Ok(mut s) = TcpStream::connect(server.addr()) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut got = [0u8; 7];
    s.write_all(b"PING\r\n").is_ok() && s.read_exact(&mut got).is_ok() && &got == b"+PONG\r\n"
}

/// The server's WARN lines holding `words`.
fn warnings(server: &Server, words: &str) -> Vec<String> {
    server
        .log_contents()
        .lines()
        .filter(|l| l.contains(" WARN ") && l.contains(words))
        .map(str::to_string)
        .collect()
}

/// 562 idle connections to the metrics port made PINGs time out under a 512-descriptor limit:
/// the port now holds at most its cap, closes the rest at once, and times the idle ones out.
#[test]
fn idle_metrics_connections_leave_the_clients_their_descriptors() {
    let metrics = free_port();
    let s = Server::start_with(&["--metrics-port", &metrics.to_string()]);
    let pid = s.pid().unwrap();
    let before = open_fds(pid);
    // Room for 100 more descriptors: fewer than the flood, more than the cap.
    limit_fds(pid, before + 100);
    let mut idle = flood(metrics, 200, b"");
    std::thread::sleep(Duration::from_millis(500));
    assert!(pings(&s), "a client's PING went unanswered");
    let held = open_fds(pid).saturating_sub(before);
    assert!(
        held <= METRICS_CAP + 4,
        "{held} descriptors held by the flood"
    );
    // Those over the cap were closed at once; those under it are timed out.
    for c in idle.iter_mut().take(METRICS_CAP) {
        assert!(closed_by_server(c, Duration::from_secs(30)), "idle held");
    }
    let mut scrape = TcpStream::connect(("127.0.0.1", metrics)).unwrap();
    scrape
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    scrape.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.contains("permitd_connected_clients"));
    let refusals = warnings(&s, "metrics port: refused");
    assert!(refusals.len() <= 3, "{refusals:#?}");
    drop(idle);
    assert!(pings(&s));
}

/// 4,000 refused handshakes were 4,000 WARN lines; now at most one a second, and at most
/// [`HANDSHAKE_CAP`] handshakes hold a descriptor.
#[test]
fn bogus_handshakes_on_the_cluster_port_log_a_few_lines_and_the_node_serves() {
    let ports = free_ports(2);
    let members = start_cluster(&[(ports[0], ports[1])], |_| Vec::new()).unwrap();
    wait_for_leader(&members, &[0]);
    let node = &members[0].server;
    let before = warnings(node, "cluster").len();
    // One after the other, as a scanner would: each refused by the handshake.
    for _ in 0..200 {
        let mut c = flood(ports[1], 1, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").remove(0);
        assert!(closed_by_server(&mut c, Duration::from_secs(10)));
    }
    let logged = warnings(node, "cluster").len() - before;
    assert!(
        logged <= 5,
        "{logged} WARN lines: {:#?}",
        warnings(node, "cluster")
    );
    // The next refusal past a second is told, with the count of those left out.
    std::thread::sleep(Duration::from_millis(1100));
    let mut c = flood(ports[1], 1, b"\0\0\0\x01x").remove(0);
    assert!(closed_by_server(&mut c, Duration::from_secs(10)));
    let refused = warnings(node, "cluster: refused peer");
    let last = refused.last().expect("the refusals are still told");
    assert!(
        last.contains("more since the last such line"),
        "{refused:#?}"
    );

    // Dialers that never finish hold at most the cap of handshakes.
    let pid = node.pid().unwrap();
    let fds = open_fds(pid);
    let silent = flood(ports[1], 200, b"");
    std::thread::sleep(Duration::from_millis(500));
    let held = open_fds(pid).saturating_sub(fds);
    assert!(held <= HANDSHAKE_CAP + 4, "{held} descriptors held");
    let logged = warnings(node, "cluster").len() - before;
    assert!(logged <= 10, "{logged} WARN lines");
    drop(silent);
    ok_ready(node, &["NS.CREATE", "still-serving"]);
}
