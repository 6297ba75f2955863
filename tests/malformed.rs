//! Malformed input on raw TCP sockets (SPEC §5, §7, §9): a malformed frame gets
//! `-ERR Protocol error: ...` and then only the offending connection is closed; the server stays
//! up, other clients are served throughout, and memory does not balloon on hostile lengths.

mod common;

use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use common::*;

/// How long a connection may take to be closed after a malformed frame.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends `input` on a new connection (from a writer thread, so a server that answers while we
/// are still writing can never deadlock us), then reads until the server closes it.
fn send_and_read_to_end(server: &Server, input: Vec<u8>, half_close: bool) -> (Vec<u8>, End) {
    let mut conn = server.raw();
    let mut w = conn.stream().try_clone().expect("clone socket");
    let writer = thread::spawn(move || {
        // The server may close before all is written: write errors are expected then.
        let _ = w.write_all(&input);
        let _ = w.flush();
        if half_close {
            let _ = w.shutdown(Shutdown::Write);
        }
    });
    let out = conn.read_to_end(CLOSE_TIMEOUT);
    writer.join().unwrap();
    out
}

/// The server answers exactly `-ERR Protocol error: <msg>` and closes the connection.
fn expect_protocol_error(server: &Server, input: &[u8], msg: &str) {
    let (out, end) = send_and_read_to_end(server, input.to_vec(), false);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("-ERR Protocol error: {msg}\r\n"),
        "reply to {:?}",
        String::from_utf8_lossy(&input[..input.len().min(80)])
    );
    assert_ne!(
        end,
        End::TimedOut,
        "the connection must be closed after a protocol error ({msg})"
    );
}

/// The server closes the connection; if its error reply made it through before the close (a
/// close with unread input may reset the connection), it is a protocol error.
fn expect_close_maybe_error(server: &Server, input: Vec<u8>, msg_prefix: &str) {
    let (out, end) = send_and_read_to_end(server, input, false);
    assert_ne!(end, End::TimedOut, "the connection must be closed");
    if !out.is_empty() {
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with(&format!("-ERR Protocol error: {msg_prefix}"))
                && text.ends_with("\r\n"),
            "unexpected reply before close: {:?}",
            &text[..text.len().min(200)]
        );
        assert_eq!(text.matches("\r\n").count(), 1, "one error line: {text:?}");
    }
}

/// A client that PINGs the server every few milliseconds until stopped, counting failures.
struct Bystander {
    stop: Arc<AtomicBool>,
    pings: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    handle: Option<thread::JoinHandle<()>>,
}

impl Bystander {
    fn start(server: &Server) -> Bystander {
        let mut conn = server.raw();
        let stop = Arc::new(AtomicBool::new(false));
        let pings = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let handle = thread::spawn({
            let (stop, pings, failures) = (stop.clone(), pings.clone(), failures.clone());
            move || {
                while !stop.load(Ordering::Relaxed) {
                    let r = conn
                        .send(b"*1\r\n$4\r\nPING\r\n")
                        .and_then(|_| conn.read_reply());
                    match r {
                        Ok(Resp::Simple(s)) if s == "PONG" => {
                            pings.fetch_add(1, Ordering::Relaxed);
                        }
                        other => {
                            failures.lock().unwrap().push(format!("{other:?}"));
                            return;
                        }
                    }
                    thread::sleep(Duration::from_millis(5));
                }
            }
        });
        Bystander {
            stop,
            pings,
            failures,
            handle: Some(handle),
        }
    }

    fn assert_healthy(&self, after: &str) {
        let f = self.failures.lock().unwrap();
        assert!(f.is_empty(), "bystander failed after {after}: {f:?}");
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().unwrap().join().unwrap();
        self.assert_healthy("the end");
        self.pings.load(Ordering::Relaxed)
    }
}

fn connected_clients(con: &mut RawConn) -> Option<u64> {
    match con.cmd(&["INFO", "clients"]) {
        Resp::Bulk(Some(b)) => String::from_utf8_lossy(&b)
            .lines()
            .find_map(|l| l.strip_prefix("connected_clients:"))
            .and_then(|v| v.trim().parse().ok()),
        other => panic!("INFO clients: {other:?}"),
    }
}

/// Deterministic pseudo-random bytes (xorshift), so a failure can be replayed.
fn noise(len: usize, mut seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        out.extend_from_slice(&seed.to_le_bytes());
    }
    out.truncate(len);
    out
}

#[test]
fn malformed_frames_close_only_the_offender() {
    let mut server = Server::start();
    let mut watcher = server.raw();
    assert_eq!(watcher.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let bystander = Bystander::start(&server);
    let rss_before = server.rss_kb();

    let check = |server: &mut Server, watcher: &mut RawConn, what: &str| {
        assert!(server.is_running(), "server died after {what}");
        assert_eq!(
            watcher.cmd(&["PING"]),
            Resp::Simple("PONG".into()),
            "watcher after {what}"
        );
        bystander.assert_healthy(what);
    };

    // Garbage where a frame should be.
    expect_protocol_error(&server, b"*1\r\n+PING\r\n", "expected '$', got '+'");
    check(&mut server, &mut watcher, "a simple string in a request");
    expect_protocol_error(&server, b"*abc\r\n", "invalid multibulk length");
    check(&mut server, &mut watcher, "*abc");
    expect_protocol_error(
        &server,
        b"*2\r\n$4\r\nECHO\r\n:1\r\n",
        "expected '$', got ':'",
    );
    check(&mut server, &mut watcher, "an integer argument");

    // Negative and absurd lengths: refused on the header, nothing allocated for them.
    expect_protocol_error(&server, b"*1\r\n$-5\r\n", "invalid bulk length");
    check(&mut server, &mut watcher, "$-5");
    expect_protocol_error(&server, b"*1\r\n$1000000000000\r\n", "invalid bulk length");
    check(&mut server, &mut watcher, "a bulk of 10^12 bytes");
    expect_protocol_error(&server, b"*1000000000\r\n", "invalid multibulk length");
    check(&mut server, &mut watcher, "an array of 10^9 elements");
    expect_protocol_error(
        &server,
        b"*1\r\n$99999999999999999999999\r\n",
        "invalid bulk length",
    );
    check(&mut server, &mut watcher, "a bulk length past i64");
    // One byte over the default 4 MiB bulk limit.
    expect_protocol_error(
        &server,
        b"*2\r\n$4\r\nECHO\r\n$4194305\r\n",
        "invalid bulk length",
    );
    check(&mut server, &mut watcher, "a bulk of 4 MiB + 1");

    // Unbalanced quotes in an inline command.
    expect_protocol_error(&server, b"ECHO \"abc\r\n", "unbalanced quotes in request");
    check(&mut server, &mut watcher, "unbalanced quotes");

    // An inline line longer than 64 KiB with no newline.
    expect_close_maybe_error(&server, vec![b'a'; 70 * 1024], "too big inline request");
    check(&mut server, &mut watcher, "a 70 KiB inline line");
    // A length line longer than 64 KiB with no CR.
    let mut long_len = b"*1\r\n$".to_vec();
    long_len.extend(std::iter::repeat_n(b'1', 70 * 1024));
    expect_close_maybe_error(&server, long_len, "too big");
    check(&mut server, &mut watcher, "a 70 KiB length line");

    // A frame cut in half, then the socket closed at once.
    {
        let mut c = server.raw();
        c.send(b"*3\r\n$3\r\nSET\r\n$5\r\nhel").unwrap();
    }
    check(&mut server, &mut watcher, "a frame cut in half then closed");
    // A frame cut in half, then the write side shut: the server closes its side too.
    let (out, end) = send_and_read_to_end(&server, b"*2\r\n$4\r\nECHO\r\n$5\r\nhe".to_vec(), true);
    assert!(out.is_empty(), "no reply to half a frame: {out:?}");
    assert_ne!(
        end,
        End::TimedOut,
        "EOF from the client ends the connection"
    );
    check(
        &mut server,
        &mut watcher,
        "a frame cut in half then half-closed",
    );

    // 1 MiB of binary noise: whatever it is parsed as, it ends in a protocol error and a close,
    // and every reply before it is an error.
    let (out, end) = send_and_read_to_end(&server, noise(1 << 20, 0x9E37_79B9_7F4A_7C15), false);
    assert_ne!(end, End::TimedOut, "1 MiB of noise must end in a close");
    for line in String::from_utf8_lossy(&out)
        .split("\r\n")
        .filter(|l| !l.is_empty())
    {
        assert!(line.starts_with('-'), "non-error reply to noise: {line:?}");
    }
    check(&mut server, &mut watcher, "1 MiB of noise");

    // An inline line of junk bytes is just an unknown command: an error, and the connection
    // goes on.
    let mut junk = server.raw();
    junk.send(b"\x01\x02garbage\xff\xfe\r\nPING\r\n").unwrap();
    match junk.read_reply().unwrap() {
        Resp::Error(e) => assert!(e.starts_with("ERR unknown command"), "{e}"),
        other => panic!("junk inline command: {other:?}"),
    }
    assert_eq!(junk.read_reply().unwrap(), Resp::Simple("PONG".into()));
    drop(junk);
    check(&mut server, &mut watcher, "a junk inline command");

    // The largest allowed bulk (4 MiB) is still served.
    let mut big = server.raw();
    let payload = vec![b'x'; 4 * 1024 * 1024];
    big.send_cmd(&[b"ECHO", &payload]).unwrap();
    assert_eq!(big.read_reply().unwrap(), Resp::Bulk(Some(payload)));
    drop(big);
    check(&mut server, &mut watcher, "a 4 MiB ECHO");

    // Memory: the hostile lengths above allocated nothing like what they announced.
    let rss_after = server.rss_kb();
    assert!(
        rss_after < rss_before + 100 * 1024,
        "RSS grew from {rss_before} KiB to {rss_after} KiB across malformed input"
    );

    // Every offending connection is gone; the watcher and the bystander remain.
    let mut last = None;
    let gone = wait_until(Duration::from_secs(5), || {
        last = connected_clients(&mut watcher);
        last == Some(2)
    });
    assert!(
        gone,
        "connected_clients should be 2 (watcher, bystander), is {last:?}"
    );

    check(&mut server, &mut watcher, "everything");
    let pings = bystander.finish();
    assert!(pings > 0, "the bystander was served");
}

#[test]
fn unauthenticated_clients_get_tight_request_limits() {
    let server = Server::start_with(&["--requirepass", "pw"]);
    let mut watcher = server.raw();
    assert_eq!(watcher.cmd(&["AUTH", "pw"]), Resp::Simple("OK".into()));

    expect_protocol_error(&server, b"*11\r\n", "unauthenticated multibulk length");
    expect_protocol_error(&server, b"*1\r\n$16385\r\n", "unauthenticated bulk length");
    expect_protocol_error(&server, b"*1000000000\r\n", "invalid multibulk length");
    assert_eq!(watcher.cmd(&["PING"]), Resp::Simple("PONG".into()));

    // Within the limits, an unauthenticated client just gets NOAUTH and stays connected.
    let mut c = server.raw();
    // (Ten arguments, a known command with a valid arity: as in Redis, unknown commands and
    // arity errors are reported before authentication is checked.)
    let ten = [
        "SEM.CREATE",
        "ns",
        "s",
        "1",
        "META",
        "k1",
        "v1",
        "k2",
        "v2",
        "k3",
    ];
    match c.cmd(&ten) {
        Resp::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("10 args before AUTH: {other:?}"),
    }
    // Once authenticated, the ordinary limits apply: 12 arguments is a plain arity error.
    assert_eq!(c.cmd(&["AUTH", "pw"]), Resp::Simple("OK".into()));
    let mut twelve = vec!["ECHO"];
    twelve.extend(std::iter::repeat_n("x", 11));
    assert_eq!(
        c.cmd(&twelve),
        Resp::Error("ERR wrong number of arguments for 'echo' command".into())
    );
    let big = "y".repeat(20_000);
    assert_eq!(
        c.cmd(&["ECHO", &big]),
        Resp::Bulk(Some(big.clone().into_bytes()))
    );
    assert_eq!(watcher.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

#[test]
fn proto_max_bulk_len_is_a_server_option() {
    let mut server = Server::start_with(&["--proto-max-bulk-len", "1024"]);
    let mut c = server.raw();
    let ok = "z".repeat(1024);
    assert_eq!(
        c.cmd(&["ECHO", &ok]),
        Resp::Bulk(Some(ok.clone().into_bytes()))
    );
    expect_protocol_error(
        &server,
        b"*2\r\n$4\r\nECHO\r\n$1025\r\n",
        "invalid bulk length",
    );
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));
    assert!(server.is_running());
}

#[test]
fn client_query_buffer_limit_closes_the_offender() {
    let mut server = Server::start_with(&["--client-query-buffer-limit", "1048576"]);
    let mut watcher = server.raw();
    let rss_before = server.rss_kb();

    // One request of 600 arguments of 4 KiB each: 2.4 MiB, over the 1 MiB query buffer.
    let arg = vec![b'q'; 4096];
    let mut args: Vec<&[u8]> = vec![b"ECHO"];
    args.extend(std::iter::repeat_n(&arg[..], 599));
    let (out, end) = send_and_read_to_end(&server, encode(&args), false);
    assert_ne!(end, End::TimedOut, "the over-limit client must be closed");
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.is_empty() || text.starts_with("-ERR"),
        "only an error may come before the close: {:?}",
        &text[..text.len().min(200)]
    );
    assert!(server.is_running());
    assert_eq!(watcher.cmd(&["PING"]), Resp::Simple("PONG".into()));
    // A request under the limit still works.
    let small = "s".repeat(500_000);
    assert_eq!(
        watcher.cmd(&["ECHO", &small]),
        Resp::Bulk(Some(small.clone().into_bytes()))
    );
    assert!(server.rss_kb() < rss_before + 100 * 1024);
}

#[test]
fn many_connections_dropping_mid_frame_leave_the_server_healthy() {
    let mut server = Server::start();
    let mut watcher = server.raw();
    for i in 0..200 {
        let mut c = server.raw();
        // Announce a big argument, send part of it, vanish.
        c.send(b"*2\r\n$4\r\nECHO\r\n$100000\r\n").unwrap();
        c.send(&vec![b'p'; 1000 + i]).unwrap();
    }
    assert!(server.is_running());
    assert_eq!(watcher.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let mut last = None;
    assert!(
        wait_until(Duration::from_secs(10), || {
            last = connected_clients(&mut watcher);
            last == Some(1)
        }),
        "dropped connections should be gone, connected_clients = {last:?}"
    );
}
