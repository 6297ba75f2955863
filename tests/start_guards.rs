//! What a start guards, over real processes: one permitd per `--dir` (a second one, single node
//! or cluster node, is refused while the first runs, and not after a `kill -9`), and the
//! open-files limit (RLIMIT_NOFILE) fitted to `--maxclients` as Redis fits it.

mod common;

use std::time::{Duration, Instant};

use common::cluster::start_cluster;
use common::*;

/// How long a client waits for a reply the server should send at once.
const PROMPT: Duration = Duration::from_secs(5);

/// The refusal of a second server on `server`'s `--dir`, as it must read.
fn assert_dir_in_use(server: &Server, (status, stderr): (std::process::ExitStatus, String)) {
    assert!(!status.success(), "a second permitd ran on the same --dir");
    let pid = server.pid().unwrap();
    let want = format!(
        "--dir {} is in use by another permitd (pid {pid})",
        server.dir().display()
    );
    assert!(stderr.contains(&want), "{want:?} not in:\n{stderr}");
}

#[test]
fn a_second_server_on_the_same_dir_is_refused_and_the_first_keeps_its_data() {
    let mut first = Server::start();
    let mut con = first.conn();
    setup(&mut con, "locked", "s", 3);
    assert_dir_in_use(&first, first.refused_beside(&[]));
    // The first still serves, and what it wrote is still there after its restart, which
    // SIGKILLs it: the kernel drops its lock with it.
    ok(&mut con, &["SEM.CREATE", "locked", "t", "5"]);
    first.restart();
    let mut con = first.conn();
    for sem in ["s", "t"] {
        ok(&mut con, &["SEM.GET", "locked", sem]);
    }
    assert_dir_in_use(&first, first.refused_beside(&[]));
}

#[test]
fn a_second_cluster_node_on_the_same_dir_is_refused() {
    let ports = free_ports(3);
    let members = start_cluster(&[(ports[0], ports[1])], |_| Vec::new()).unwrap();
    let node = &members[0].server;
    let cport = ports[2].to_string();
    let again = ["--cluster-node-id", "1", "--cluster-port", &cport];
    assert_dir_in_use(node, node.refused_beside(&again));
}

/// Sends PING on `clients` fresh connections at once and returns each one's reply (or error),
/// all read within [`PROMPT`].
fn ping_all(server: &Server, clients: usize) -> Vec<Result<Resp, String>> {
    let mut conns: Vec<RawConn> = (0..clients).map(|_| server.raw()).collect();
    for c in &mut conns {
        // One the server refused may be closed already: its reply tells.
        let _ = c.send_cmd(&[b"PING"]);
    }
    let deadline = Instant::now() + PROMPT;
    conns
        .iter_mut()
        .map(|c| {
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = left.max(Duration::from_millis(10));
            c.stream().set_read_timeout(Some(wait)).unwrap();
            c.read_reply().map_err(|e| e.to_string())
        })
        .collect()
}

fn maxclients(server: &Server) -> String {
    let got = fields(&ok(&mut server.conn(), &["CONFIG", "GET", "maxclients"]));
    text(&got[0].1)
}

/// This process's hard open-files limit.
fn hard_nofile() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit(2) writes the struct it is given.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    l.rlim_max
}

#[test]
fn a_low_soft_open_files_limit_is_raised_for_maxclients() {
    let hard = hard_nofile();
    assert!(
        hard >= 1032,
        "the test needs a hard limit of 1032, not {hard}"
    );
    let server = Server::start_with_nofile(Some((256, hard)), &["--maxclients", "1000"]);
    assert_eq!(maxclients(&server), "1000");
    let replies = ping_all(&server, 300);
    let pong = Ok(Resp::Simple("PONG".into()));
    assert!(
        replies.iter().all(|r| *r == pong),
        "{} of 300 clients got no PONG: {:?}",
        replies.iter().filter(|r| **r != pong).count(),
        replies.iter().find(|r| **r != pong)
    );
}

#[test]
fn a_low_hard_open_files_limit_lowers_maxclients_as_redis() {
    let server = Server::start_with_nofile(Some((256, 256)), &[]);
    // As Redis says it, with the room kept for the server's own descriptors (more than
    // Redis's 32: each shard has some).
    let log = server.log_lines_with(&["maxclients"]);
    let reduced: usize = log
        .split("maxclients has been reduced to ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reduced maxclients in the log: {log}"));
    assert!(
        log.contains("WARN") && log.contains("You requested maxclients of 10000"),
        "{log}"
    );
    assert!(reduced <= 256 - 32, "{reduced}");
    assert_eq!(maxclients(&server), reduced.to_string());
    // Past it a client is told so at once, not left hanging in the kernel's queue.
    let replies = ping_all(&server, 300);
    let pong = Ok(Resp::Simple("PONG".into()));
    let full = Ok(Resp::Error("ERR max number of clients reached".into()));
    assert!(
        replies.iter().all(|r| *r == pong || *r == full),
        "{:?}",
        replies.iter().find(|r| **r != pong && **r != full)
    );
    let pongs = replies.iter().filter(|r| **r == pong).count();
    assert!(pongs > 0 && pongs <= reduced, "{pongs} PONGs");
}
