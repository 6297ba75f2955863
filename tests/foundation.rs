//! The Redis surface that clients rely on (SPEC §4, §5, §7, §9), checked over real sockets with
//! a real client (the `redis` crate) and, where bytes matter, raw TCP.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;

/// Parses one `CLIENT LIST` / `CLIENT INFO` line into its `key=value` pairs, in order.
fn client_line(line: &str) -> Vec<(String, String)> {
    line.split(' ')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let (k, v) = w
                .split_once('=')
                .unwrap_or_else(|| panic!("not key=value: {w:?} in {line:?}"));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn client_lines(list: &str) -> Vec<BTreeMap<String, String>> {
    list.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| client_line(l).into_iter().collect())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// HELLO and protocols
// ---------------------------------------------------------------------------------------------

fn check_hello(reply: &Value, proto: i64, id: i64) {
    let f = fields(reply);
    let keys: Vec<&str> = f.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["server", "version", "proto", "id", "mode", "role", "modules"],
        "HELLO reply fields: {reply:?}"
    );
    let m = to_map(reply);
    assert!(!text(&m["server"]).is_empty());
    assert!(
        matches!(m["version"], Value::BulkString(_) | Value::SimpleString(_)),
        "version must be a string, got {:?}",
        m["version"]
    );
    assert!(!text(&m["version"]).is_empty());
    assert_eq!(int(&m["proto"]), proto);
    assert_eq!(int(&m["id"]), id);
    assert!(!text(&m["mode"]).is_empty());
    assert_eq!(text(&m["role"]), "master");
    items(&m["modules"]);
}

#[test]
fn hello_2_and_3_answer_the_handshake_map() {
    let server = Server::start();
    let mut con = server.conn();
    let id = int(&ok(&mut con, &["CLIENT", "ID"]));

    let h2 = ok(&mut con, &["HELLO", "2"]);
    assert!(
        matches!(h2, Value::Array(_)),
        "RESP2 HELLO is a flat array: {h2:?}"
    );
    check_hello(&h2, 2, id);

    let h3 = ok(&mut con, &["HELLO", "3"]);
    assert!(matches!(h3, Value::Map(_)), "RESP3 HELLO is a map: {h3:?}");
    check_hello(&h3, 3, id);

    // The connection now speaks RESP3: entities come back as maps ...
    let ns = ok(&mut con, &["NS.CREATE", "hello-ns"]);
    assert!(matches!(ns, Value::Map(_)), "{ns:?}");
    // ... and HELLO without a version reports the current protocol.
    check_hello(&ok(&mut con, &["HELLO"]), 3, id);

    // Back to RESP2: flat arrays again.
    check_hello(&ok(&mut con, &["HELLO", "2"]), 2, id);
    let ns = ok(&mut con, &["NS.GET", "hello-ns"]);
    assert!(matches!(ns, Value::Array(_)), "{ns:?}");
    assert_eq!(text(&field(&ns, "name")), "hello-ns");

    // Unsupported versions: NOPROTO, and the connection goes on.
    for v in ["4", "1"] {
        let e = fails(&mut con, &["HELLO", v]);
        assert!(e.starts_with("NOPROTO"), "HELLO {v}: {e}");
    }
    assert!(fails(&mut con, &["HELLO", "abc"]).starts_with("ERR"));
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");

    // SETNAME inside HELLO names the connection.
    ok(&mut con, &["HELLO", "3", "SETNAME", "hello-client"]);
    assert_eq!(text(&ok(&mut con, &["CLIENT", "GETNAME"])), "hello-client");
}

#[test]
fn resp3_url_connections_work() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
    let h = ok(&mut con, &["HELLO"]);
    assert_eq!(int(&field(&h, "proto")), 3);
    let ns = ok(&mut con, &["NS.CREATE", "r3"]);
    assert!(matches!(ns, Value::Map(_)), "{ns:?}");
    let sem = ok(&mut con, &["SEM.CREATE", "r3", "s", "2"]);
    assert!(matches!(sem, Value::Map(_)), "{sem:?}");
    assert!(matches!(field(&sem, "metadata"), Value::Map(_)));
    assert_eq!(int(&field(&sem, "permits")), 2);
}

#[tokio::test]
async fn async_resp3_connection_acquires_and_waits() {
    let server = Server::start();
    let mut a = server.async_conn(true).await;
    let mut b = server.async_conn(true).await;
    let pong: String = redis::cmd("PING").query_async(&mut a).await.unwrap();
    assert_eq!(pong, "PONG");

    let q = |args: &[&str]| {
        let mut c = redis::cmd(args[0]);
        for x in &args[1..] {
            c.arg(*x);
        }
        c
    };
    let _: Value = q(&["NS.CREATE", "as"]).query_async(&mut a).await.unwrap();
    let _: Value = q(&["SEM.CREATE", "as", "gate", "1"])
        .query_async(&mut a)
        .await
        .unwrap();
    let l1: Value = q(&["LEASE.CREATE", "as", "p1", "30"])
        .query_async(&mut a)
        .await
        .unwrap();
    let l2: Value = q(&["LEASE.CREATE", "as", "p2", "30"])
        .query_async(&mut a)
        .await
        .unwrap();
    let (l1, l2) = (text(&field(&l1, "lease_id")), text(&field(&l2, "lease_id")));

    let r: Value = q(&["SEM.ACQUIRE", "as", "gate", &l1, "1", "0"])
        .query_async(&mut a)
        .await
        .unwrap();
    assert!(matches!(r, Value::Map(_)), "{r:?}");
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_ACQUIRED");
    let t1 = int(&field(&r, "fencing_token"));

    // b parks for up to 10 s; a releases after a moment; b is granted well before its timeout.
    let started = Instant::now();
    let waiter = tokio::spawn({
        let l2 = l2.clone();
        async move {
            let r: Value = redis::cmd("SEM.ACQUIRE")
                .arg("as")
                .arg("gate")
                .arg(&l2)
                .arg(1)
                .arg(10)
                .query_async(&mut b)
                .await
                .unwrap();
            r
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rel: Value = q(&["SEM.RELEASE", "as", "gate", &l1])
        .query_async(&mut a)
        .await
        .unwrap();
    assert!(matches!(rel, Value::Map(_)));
    let r = tokio::time::timeout(Duration::from_secs(15), waiter)
        .await
        .expect("parked acquire answered")
        .unwrap();
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_ACQUIRED");
    assert!(int(&field(&r, "fencing_token")) > t1);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "the release should have woken the waiter, not its timeout"
    );
}

// ---------------------------------------------------------------------------------------------
// Pipelining and inline commands
// ---------------------------------------------------------------------------------------------

#[test]
fn pipeline_of_10000_commands_is_answered_in_order() {
    let server = Server::start();
    let mut con = server.conn();
    let mut p = redis::pipe();
    for i in 0..10_000 {
        if i % 10 == 9 {
            p.cmd("PING");
        } else {
            p.cmd("ECHO").arg(format!("msg-{i}"));
        }
    }
    let replies: Vec<Value> = p.query(&mut con).unwrap();
    assert_eq!(replies.len(), 10_000);
    for (i, r) in replies.iter().enumerate() {
        let want = if i % 10 == 9 {
            "PONG".to_string()
        } else {
            format!("msg-{i}")
        };
        assert_eq!(text(r), want, "reply {i}");
    }
    // The connection is still in step afterwards.
    assert_eq!(text(&ok(&mut con, &["ECHO", "after"])), "after");
}

#[tokio::test]
async fn async_pipeline_of_10000_commands_is_answered_in_order() {
    let server = Server::start();
    let mut con = server.async_conn(true).await;
    let mut p = redis::pipe();
    for i in 0..10_000 {
        p.cmd("ECHO").arg(i);
    }
    let replies: Vec<String> = p.query_async(&mut con).await.unwrap();
    let want: Vec<String> = (0..10_000).map(|i| i.to_string()).collect();
    assert_eq!(replies, want);
}

#[test]
fn inline_commands_on_a_raw_socket() {
    let server = Server::start();
    let mut raw = server.raw();
    raw.send(b"PING\r\n").unwrap();
    assert_eq!(raw.read_line().unwrap(), "+PONG");
    // Bare LF also ends an inline command (as telnet/nc may send).
    raw.send(b"PING\n").unwrap();
    assert_eq!(raw.read_line().unwrap(), "+PONG");
    // Quoted inline arguments, as redis-cli and telnet users type them.
    raw.send(b"ECHO \"hello world\"\r\n").unwrap();
    assert_eq!(
        raw.read_reply().unwrap(),
        Resp::Bulk(Some(b"hello world".to_vec()))
    );
    // Inline and multibulk mixed in one write, answered in order.
    raw.send(b"PING\r\n*2\r\n$4\r\nECHO\r\n$2\r\nhi\r\nping\r\n")
        .unwrap();
    assert_eq!(raw.read_reply().unwrap(), Resp::Simple("PONG".into()));
    assert_eq!(raw.read_reply().unwrap(), Resp::Bulk(Some(b"hi".to_vec())));
    assert_eq!(raw.read_reply().unwrap(), Resp::Simple("PONG".into()));
    // An inline semaphore command works too.
    raw.send(b"NS.CREATE inline-ns\r\n").unwrap();
    match raw.read_reply().unwrap() {
        Resp::Array(Some(a)) => assert!(a.contains(&Resp::Bulk(Some(b"inline-ns".to_vec())))),
        other => panic!("NS.CREATE inline: {other:?}"),
    }
}

#[test]
fn quit_and_reset() {
    let server = Server::start();
    let mut raw = server.raw();
    raw.send(b"HELLO 3\r\n").unwrap();
    // Skip the RESP3 map: read until the connection answers a marker ECHO.
    raw.send(b"CLIENT SETNAME before-reset\r\n").unwrap();
    raw.send(b"RESET\r\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        assert!(Instant::now() < deadline, "no +RESET reply");
        if raw.read_line().unwrap() == "+RESET" {
            break;
        }
    }
    // After RESET: RESP2 again, no name.
    assert_eq!(raw.cmd(&["CLIENT", "GETNAME"]), Resp::Bulk(None));
    match raw.cmd(&["HELLO"]) {
        Resp::Array(Some(a)) => {
            let i = a
                .iter()
                .position(|x| *x == Resp::Bulk(Some(b"proto".to_vec())))
                .expect("proto field");
            assert_eq!(a[i + 1], Resp::Int(2));
        }
        other => panic!("HELLO after RESET under RESP2 is a flat array: {other:?}"),
    }
    assert_eq!(raw.cmd(&["QUIT"]), Resp::Simple("OK".into()));
    let (rest, end) = raw.read_to_end(Duration::from_secs(10));
    assert!(rest.is_empty(), "nothing after QUIT's +OK: {rest:?}");
    assert_ne!(end, End::TimedOut, "QUIT must close the connection");
}

// ---------------------------------------------------------------------------------------------
// AUTH
// ---------------------------------------------------------------------------------------------

#[test]
fn auth_with_a_configured_password() {
    let server = Server::start_with(&["--requirepass", "s3cret"]);
    let mut con = server.conn();
    let e = fails(&mut con, &["PING"]);
    assert!(e.starts_with("NOAUTH"), "PING before AUTH: {e}");
    let e = fails(&mut con, &["NS.CREATE", "a"]);
    assert!(e.starts_with("NOAUTH"), "NS.CREATE before AUTH: {e}");

    let e = fails(&mut con, &["AUTH", "wrong"]);
    assert!(e.starts_with("WRONGPASS"), "AUTH wrong: {e}");
    let e = fails(&mut con, &["AUTH", "default", "wrong"]);
    assert!(e.starts_with("WRONGPASS"), "AUTH default wrong: {e}");
    let e = fails(&mut con, &["AUTH", "someone", "s3cret"]);
    assert!(e.starts_with("WRONGPASS"), "AUTH unknown user: {e}");
    let e = fails(&mut con, &["PING"]);
    assert!(e.starts_with("NOAUTH"), "still unauthenticated: {e}");

    assert_eq!(ok(&mut con, &["AUTH", "s3cret"]), Value::Okay);
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
    assert_eq!(
        text(&field(&ok(&mut con, &["NS.CREATE", "a"]), "name")),
        "a"
    );

    // AUTH user pass form.
    let mut con2 = server.conn();
    assert_eq!(ok(&mut con2, &["AUTH", "default", "s3cret"]), Value::Okay);
    assert_eq!(text(&field(&ok(&mut con2, &["NS.GET", "a"]), "name")), "a");

    // A password in the URL: the client authenticates on connect (RESP2 with AUTH, RESP3 with
    // HELLO 3 AUTH).
    let port = server.port();
    let mut con3 = connect_url(&format!("redis://:s3cret@127.0.0.1:{port}"));
    assert_eq!(text(&ok(&mut con3, &["PING"])), "PONG");
    let mut con4 = connect_url(&format!("redis://:s3cret@127.0.0.1:{port}/?protocol=resp3"));
    assert_eq!(text(&ok(&mut con4, &["PING"])), "PONG");
    assert_eq!(int(&field(&ok(&mut con4, &["HELLO"]), "proto")), 3);

    // A wrong password in the URL: connecting fails.
    let bad = redis::Client::open(format!("redis://:nope@127.0.0.1:{port}"))
        .unwrap()
        .get_connection_with_timeout(Duration::from_secs(10));
    assert!(bad.is_err(), "connecting with a wrong password must fail");

    // HELLO 3 AUTH on a raw unauthenticated connection.
    let mut raw = server.raw();
    match raw.cmd(&["HELLO", "3", "AUTH", "default", "wrong"]) {
        Resp::Error(e) => assert!(e.starts_with("WRONGPASS"), "{e}"),
        other => panic!("HELLO 3 AUTH wrong: {other:?}"),
    }
    match raw.cmd(&["PING"]) {
        Resp::Error(e) => assert!(e.starts_with("NOAUTH"), "{e}"),
        other => panic!("PING after failed HELLO AUTH: {other:?}"),
    }
    match raw.cmd(&["HELLO", "2", "AUTH", "default", "s3cret"]) {
        Resp::Array(Some(a)) => assert!(a.contains(&Resp::Bulk(Some(b"proto".to_vec())))),
        other => panic!("HELLO 2 AUTH: {other:?}"),
    }
    assert_eq!(raw.cmd(&["PING"]), Resp::Simple("PONG".into()));
}

#[test]
fn auth_without_a_configured_password() {
    let server = Server::start();
    let mut con = server.conn();
    let e = fails(&mut con, &["AUTH", "x"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert!(
        e.contains("called without any password configured"),
        "Redis's wording: {e}"
    );
    // Nothing is required: commands work before and after.
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
}

// ---------------------------------------------------------------------------------------------
// Errors: unknown command, arity
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_command_and_wrong_arity_use_redis_wording() {
    let server = Server::start();
    let mut con = server.conn();
    let e = fails(&mut con, &["foo", "a", "b"]);
    assert!(
        e.starts_with("ERR unknown command 'foo', with args beginning with: 'a' 'b'"),
        "{e}"
    );
    let e = fails(&mut con, &["foo"]);
    assert!(
        e.starts_with("ERR unknown command 'foo', with args beginning with:"),
        "{e}"
    );

    // Arity errors name the command in lowercase, however it was sent.
    for cmd in [
        &["SEM.ACQUIRE", "ns", "sem"][..],
        &["sem.acquire", "ns", "sem", "lease", "1"],
        &["Sem.Acquire"],
    ] {
        assert_eq!(
            fails(&mut con, cmd),
            "ERR wrong number of arguments for 'sem.acquire' command",
            "{cmd:?}"
        );
    }
    assert_eq!(
        fails(&mut con, &["NS.GET"]),
        "ERR wrong number of arguments for 'ns.get' command"
    );
    assert_eq!(
        fails(&mut con, &["ns.get", "a", "b"]),
        "ERR wrong number of arguments for 'ns.get' command"
    );
    assert_eq!(
        fails(&mut con, &["SEM.RELEASE", "a", "b"]),
        "ERR wrong number of arguments for 'sem.release' command"
    );
    // Errors leave the connection usable.
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
}

// ---------------------------------------------------------------------------------------------
// CLIENT
// ---------------------------------------------------------------------------------------------

#[test]
fn client_setname_getname_id_info_and_list() {
    let server = Server::start();
    let mut a = server.conn();
    let id_a = int(&ok(&mut a, &["CLIENT", "ID"]));
    assert!(id_a > 0);
    assert_eq!(ok(&mut a, &["CLIENT", "GETNAME"]), Value::Nil);
    assert_eq!(ok(&mut a, &["CLIENT", "SETNAME", "worker-1"]), Value::Okay);
    assert_eq!(text(&ok(&mut a, &["CLIENT", "GETNAME"])), "worker-1");
    let e = fails(&mut a, &["CLIENT", "SETNAME", "bad name"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_eq!(text(&ok(&mut a, &["CLIENT", "GETNAME"])), "worker-1");

    // A second client on a raw socket, so its address is known.
    let mut b = server.raw();
    assert_eq!(
        b.cmd(&["CLIENT", "SETNAME", "raw-b"]),
        Resp::Simple("OK".into())
    );
    let id_b = match b.cmd(&["CLIENT", "ID"]) {
        Resp::Int(i) => i,
        other => panic!("CLIENT ID: {other:?}"),
    };
    assert_ne!(id_a, id_b);

    let list = text(&ok(&mut a, &["CLIENT", "LIST"]));
    let lines: Vec<&str> = list.lines().filter(|l| !l.is_empty()).collect();
    assert!(lines.len() >= 2, "both clients listed: {list}");
    for line in &lines {
        let keys: Vec<String> = client_line(line).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            keys[..9],
            ["id", "addr", "laddr", "fd", "name", "age", "idle", "flags", "db"],
            "Redis's field order: {line}"
        );
        assert!(keys.contains(&"cmd".to_string()), "{line}");
    }
    let parsed = client_lines(&list);
    let la = parsed
        .iter()
        .find(|l| l["id"] == id_a.to_string())
        .unwrap_or_else(|| panic!("client {id_a} in {list}"));
    assert_eq!(la["name"], "worker-1");
    assert_eq!(la["db"], "0");
    assert!(la["addr"].starts_with("127.0.0.1:"), "{}", la["addr"]);
    assert_eq!(la["laddr"], format!("127.0.0.1:{}", server.port()));
    assert!(la["cmd"].starts_with("client"), "cmd={}", la["cmd"]);
    la["fd"].parse::<i64>().expect("fd is a number");
    la["age"].parse::<u64>().expect("age is a number");
    la["idle"].parse::<u64>().expect("idle is a number");

    let lb = parsed
        .iter()
        .find(|l| l["id"] == id_b.to_string())
        .unwrap_or_else(|| panic!("client {id_b} in {list}"));
    assert_eq!(lb["addr"], b.local_addr().to_string());
    assert_eq!(lb["name"], "raw-b");

    // CLIENT INFO: this connection's own line.
    let info = text(&ok(&mut a, &["CLIENT", "INFO"]));
    let own: BTreeMap<String, String> = client_line(info.trim_end()).into_iter().collect();
    assert_eq!(own["id"], id_a.to_string());
    assert_eq!(own["name"], "worker-1");

    // Under RESP3, CLIENT INFO is a verbatim string (as INFO).
    let mut a3 = server.conn_resp3();
    match ok(&mut a3, &["CLIENT", "INFO"]) {
        Value::VerbatimString { format, text } => {
            assert_eq!(format, redis::VerbatimFormat::Text);
            assert!(text.starts_with("id="), "{text}");
        }
        other => panic!("RESP3 CLIENT INFO must be a verbatim string, got {other:?}"),
    }

    // An empty name clears it.
    assert_eq!(ok(&mut a, &["CLIENT", "SETNAME", ""]), Value::Okay);
    assert_eq!(ok(&mut a, &["CLIENT", "GETNAME"]), Value::Nil);

    // SETINFO is accepted (clients send it on connect); caching subcommands are a clean ERR.
    assert_eq!(
        ok(&mut a, &["CLIENT", "SETINFO", "LIB-NAME", "tests"]),
        Value::Okay
    );
    let e = fails(&mut a, &["CLIENT", "TRACKING", "ON"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_eq!(text(&ok(&mut a, &["PING"])), "PONG");
}

#[test]
fn client_kill_closes_only_the_victim() {
    let server = Server::start();
    let mut killer = server.conn();

    // By id (new form): the reply counts the killed clients.
    let mut victim = server.conn();
    let vid = int(&ok(&mut victim, &["CLIENT", "ID"]));
    assert_eq!(
        int(&ok(
            &mut killer,
            &["CLIENT", "KILL", "ID", &vid.to_string()]
        )),
        1
    );
    assert!(
        call(&mut victim, &["PING"]).is_err(),
        "the killed connection must be closed"
    );
    assert_eq!(text(&ok(&mut killer, &["PING"])), "PONG");
    let list = text(&ok(&mut killer, &["CLIENT", "LIST"]));
    assert!(
        wait_until(Duration::from_secs(5), || {
            !client_lines(&text(&ok(&mut killer, &["CLIENT", "LIST"])))
                .iter()
                .any(|l| l["id"] == vid.to_string())
        }),
        "killed client still listed: {list}"
    );

    // By address (old form): +OK, and the socket sees EOF.
    let mut raw = server.raw();
    assert_eq!(raw.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let addr = raw.local_addr().to_string();
    assert_eq!(ok(&mut killer, &["CLIENT", "KILL", &addr]), Value::Okay);
    let (_, end) = raw.read_to_end(Duration::from_secs(10));
    assert_ne!(end, End::TimedOut, "killed raw connection must be closed");

    // Nobody to kill.
    assert_eq!(
        int(&ok(&mut killer, &["CLIENT", "KILL", "ID", "999999"])),
        0
    );
    let e = fails(&mut killer, &["CLIENT", "KILL", "10.1.2.3:4567"]);
    assert!(e.starts_with("ERR"), "{e}");
    assert_eq!(text(&ok(&mut killer, &["PING"])), "PONG");
}

// ---------------------------------------------------------------------------------------------
// SELECT, ECHO
// ---------------------------------------------------------------------------------------------

#[test]
fn select_and_echo() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(ok(&mut con, &["SELECT", "0"]), Value::Okay);
    assert!(fails(&mut con, &["SELECT", "1"]).starts_with("ERR"));
    assert!(fails(&mut con, &["SELECT", "x"]).starts_with("ERR"));
    assert_eq!(text(&ok(&mut con, &["ECHO", "hello"])), "hello");
    let bin: Vec<u8> = redis::cmd("ECHO")
        .arg(&b"a\r\nb\0c\xff"[..])
        .query(&mut con)
        .unwrap();
    assert_eq!(bin, b"a\r\nb\0c\xff");
    assert_eq!(
        fails(&mut con, &["ECHO"]),
        "ERR wrong number of arguments for 'echo' command"
    );
}

// ---------------------------------------------------------------------------------------------
// COMMAND
// ---------------------------------------------------------------------------------------------

const SEM_COMMANDS: [&str; 19] = [
    "ns.create",
    "ns.get",
    "ns.list",
    "ns.update",
    "ns.delete",
    "sem.create",
    "sem.get",
    "sem.list",
    "sem.update",
    "sem.delete",
    "sem.acquire",
    "sem.release",
    "sem.holders",
    "sem.waiters",
    "lease.create",
    "lease.get",
    "lease.list",
    "lease.refresh",
    "lease.revoke",
];

#[test]
fn command_count_list_and_info() {
    let server = Server::start();
    let mut con = server.conn();
    let count = int(&ok(&mut con, &["COMMAND", "COUNT"]));
    assert!(count >= 18, "COMMAND COUNT = {count}");
    let all = items(&ok(&mut con, &["COMMAND"]));
    assert_eq!(
        all.len() as i64,
        count,
        "COMMAND lists COMMAND COUNT entries"
    );

    let list = strings(&ok(&mut con, &["COMMAND", "LIST"]));
    for c in SEM_COMMANDS {
        assert!(list.iter().any(|n| n == c), "{c} in COMMAND LIST {list:?}");
    }
    for c in ["ping", "hello", "client", "info", "multi", "exec"] {
        assert!(list.iter().any(|n| n == c), "{c} in COMMAND LIST");
    }

    let info = items(&ok(&mut con, &["COMMAND", "INFO", "sem.acquire"]));
    assert_eq!(info.len(), 1);
    let e = items(&info[0]);
    assert_eq!(text(&e[0]), "sem.acquire");
    assert_eq!(int(&e[1]), -6);
    let flags = strings(&e[2]);
    assert!(flags.iter().any(|f| f == "blocking"), "flags {flags:?}");
    assert!(flags.iter().any(|f| f == "write"), "flags {flags:?}");
    assert_eq!((int(&e[3]), int(&e[4]), int(&e[5])), (1, 1, 1));

    // The same entry whatever the case of the name.
    let upper = items(&ok(&mut con, &["COMMAND", "INFO", "SEM.ACQUIRE"]));
    assert_eq!(items(&upper[0])[..6], e[..6]);

    // Arity conventions (SPEC §9) and key positions.
    let expect = [
        ("ns.create", -2, 1),
        ("ns.get", 2, 1),
        ("sem.release", 4, 1),
        ("lease.create", -4, 1),
        ("lease.refresh", 4, 1),
        ("ns.list", -1, 0),
    ];
    let mut args = vec!["COMMAND", "INFO"];
    args.extend(expect.iter().map(|(n, _, _)| *n));
    let infos = items(&ok(&mut con, &args));
    assert_eq!(infos.len(), expect.len());
    for ((name, arity, key), entry) in expect.iter().zip(&infos) {
        let e = items(entry);
        assert_eq!(text(&e[0]), *name);
        assert_eq!(int(&e[1]), *arity, "arity of {name}");
        assert_eq!(
            (int(&e[3]), int(&e[4]), int(&e[5])),
            (*key, *key, *key),
            "key positions of {name}"
        );
    }
    let flags_of = |con: &mut redis::Connection, c: &str| {
        strings(&items(&items(&ok(con, &["COMMAND", "INFO", c]))[0])[2])
    };
    assert!(flags_of(&mut con, "ns.get").contains(&"readonly".to_string()));
    assert!(flags_of(&mut con, "sem.get").contains(&"readonly".to_string()));
    assert!(flags_of(&mut con, "ns.create").contains(&"write".to_string()));
    assert!(!flags_of(&mut con, "sem.get").contains(&"write".to_string()));

    // Unknown names: a nil entry.
    let none = items(&ok(&mut con, &["COMMAND", "INFO", "nosuch"]));
    assert_eq!(none, vec![Value::Nil]);

    // GETKEYS: the namespace is the key.
    let keys = strings(&ok(
        &mut con,
        &[
            "COMMAND",
            "GETKEYS",
            "SEM.ACQUIRE",
            "ns1",
            "s1",
            "ls_x",
            "1",
            "0",
        ],
    ));
    assert_eq!(keys, ["ns1"]);
}

fn check_docs(reply: &Value) {
    let top = fields(reply);
    assert_eq!(top.len(), 1, "{reply:?}");
    assert_eq!(top[0].0, "sem.acquire");
    let doc = &top[0].1;
    let summary = text(&field(doc, "summary"));
    assert!(!summary.is_empty());
    let args = items(&field(doc, "arguments"));
    assert!(args.len() >= 5, "positional arguments documented: {args:?}");
    for a in &args {
        assert!(!text(&field(a, "name")).is_empty(), "{a:?}");
        assert!(!text(&field(a, "type")).is_empty(), "{a:?}");
    }
    assert_eq!(
        text(&field(&args[0], "type")),
        "key",
        "the namespace is the key"
    );
}

#[test]
fn command_docs_has_summary_and_arguments() {
    let server = Server::start();
    let mut con = server.conn();
    let d2 = ok(&mut con, &["COMMAND", "DOCS", "sem.acquire"]);
    assert!(matches!(d2, Value::Array(_)));
    check_docs(&d2);
    let mut con3 = server.conn_resp3();
    let d3 = ok(&mut con3, &["COMMAND", "DOCS", "sem.acquire"]);
    assert!(matches!(d3, Value::Map(_)), "{d3:?}");
    check_docs(&d3);
}

// ---------------------------------------------------------------------------------------------
// INFO, CONFIG GET
// ---------------------------------------------------------------------------------------------

#[test]
fn info_sections() {
    let server = Server::start();
    let mut con = server.conn();
    ok(&mut con, &["NS.CREATE", "i1"]);
    ok(&mut con, &["SEM.CREATE", "i1", "s1", "5"]);
    ok(&mut con, &["SEM.CREATE", "i1", "s2", "5"]);
    ok(&mut con, &["LEASE.CREATE", "i1", "p", "30"]);

    let info = text(&ok(&mut con, &["INFO"]));
    for needle in [
        "# Server",
        "redis_version:",
        "# Clients",
        "blocked_clients:",
        "# Persistence",
        "loading:0",
        "# Stats",
        "# Semaphores",
    ] {
        assert!(info.contains(needle), "INFO lacks {needle:?}:\n{info}");
    }
    assert!(info.contains("\r\n"), "INFO lines end in CRLF");
    assert_eq!(info_value(&info, "namespaces").as_deref(), Some("1"));
    assert_eq!(info_value(&info, "semaphores").as_deref(), Some("2"));
    assert_eq!(info_value(&info, "leases").as_deref(), Some("1"));
    assert_eq!(info_value(&info, "holders").as_deref(), Some("0"));
    assert_eq!(info_value(&info, "waiters").as_deref(), Some("0"));
    assert_eq!(info_value(&info, "blocked_clients").as_deref(), Some("0"));
    for stat in [
        "acquire_acquired",
        "acquire_unavailable",
        "acquire_timed_out",
        "leases_expired",
        "clients_unblocked",
    ] {
        assert!(info_value(&info, stat).is_some(), "INFO lacks {stat}");
    }

    // One section.
    let srv = text(&ok(&mut con, &["INFO", "server"]));
    assert!(srv.contains("redis_version:"));
    assert!(!srv.contains("# Semaphores"));
    let sems = text(&ok(&mut con, &["INFO", "semaphores"]));
    assert!(sems.contains("# Semaphores"));
    assert!(!sems.contains("redis_version:"));

    // Under RESP3, INFO is a verbatim string.
    let mut con3 = server.conn_resp3();
    match ok(&mut con3, &["INFO"]) {
        Value::VerbatimString { format, text } => {
            assert_eq!(format, redis::VerbatimFormat::Text);
            assert!(text.contains("redis_version:"));
        }
        other => panic!("RESP3 INFO must be a verbatim string, got {other:?}"),
    }
}

#[test]
fn config_get() {
    let server = Server::start();
    let mut con = server.conn();
    let port = fields(&ok(&mut con, &["CONFIG", "GET", "port"]));
    assert_eq!(
        port,
        vec![(
            "port".to_string(),
            Value::BulkString(server.port().to_string().into_bytes())
        )]
    );
    let save = fields(&ok(&mut con, &["CONFIG", "GET", "save"]));
    assert_eq!(save.len(), 1);
    assert_eq!(save[0].0, "save");

    let all = to_map(&ok(&mut con, &["CONFIG", "GET", "*"]));
    for k in ["port", "bind", "maxclients", "dir", "save", "appendonly"] {
        assert!(all.contains_key(k), "CONFIG GET * lacks {k}: {all:?}");
    }
    assert_eq!(text(&all["bind"]), "127.0.0.1");
    assert_eq!(
        std::fs::canonicalize(text(&all["dir"])).unwrap(),
        std::fs::canonicalize(server.dir()).unwrap()
    );

    let none = ok(&mut con, &["CONFIG", "GET", "nosuch"]);
    assert!(fields(&none).is_empty(), "{none:?}");

    let glob = to_map(&ok(&mut con, &["CONFIG", "GET", "max*"]));
    assert!(glob.contains_key("maxclients"));
    assert!(!glob.contains_key("port"));

    // Under RESP3 it is a map.
    let mut con3 = server.conn_resp3();
    let p3 = ok(&mut con3, &["CONFIG", "GET", "port"]);
    assert!(matches!(p3, Value::Map(_)), "{p3:?}");
    assert_eq!(text(&field(&p3, "port")), server.port().to_string());
}

// ---------------------------------------------------------------------------------------------
// MULTI / EXEC
// ---------------------------------------------------------------------------------------------

#[test]
fn multi_exec_nested_multi_execabort_discard_crossslot() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(ok(&mut con, &["MULTI"]), Value::Okay);
    assert_eq!(
        fails(&mut con, &["MULTI"]),
        "ERR MULTI calls can not be nested"
    );
    assert_eq!(text(&ok(&mut con, &["PING"])), "QUEUED");
    assert_eq!(text(&ok(&mut con, &["ECHO", "x"])), "QUEUED");
    let r = items(&ok(&mut con, &["EXEC"]));
    assert_eq!(r.len(), 2);
    assert_eq!(text(&r[0]), "PONG");
    assert_eq!(text(&r[1]), "x");

    // A queued syntax error aborts the transaction at EXEC.
    ok(&mut con, &["MULTI"]);
    assert!(fails(&mut con, &["foo"]).starts_with("ERR unknown command"));
    ok(&mut con, &["NS.CREATE", "never"]);
    let e = fails(&mut con, &["EXEC"]);
    assert!(e.starts_with("EXECABORT"), "{e}");
    assert!(fails(&mut con, &["NS.GET", "never"]).starts_with("NOTFOUND"));

    // DISCARD drops the queue.
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["NS.CREATE", "discarded"]);
    assert_eq!(ok(&mut con, &["DISCARD"]), Value::Okay);
    assert_eq!(fails(&mut con, &["EXEC"]), "ERR EXEC without MULTI");
    assert!(fails(&mut con, &["NS.GET", "discarded"]).starts_with("NOTFOUND"));

    // One namespace per transaction; otherwise CROSSSLOT and nothing runs.
    ok(&mut con, &["NS.CREATE", "ta"]);
    ok(&mut con, &["NS.CREATE", "tb"]);
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["SEM.CREATE", "ta", "s", "1"]);
    ok(&mut con, &["SEM.CREATE", "tb", "s", "1"]);
    let e = fails(&mut con, &["EXEC"]);
    assert!(e.starts_with("CROSSSLOT"), "{e}");
    assert!(fails(&mut con, &["SEM.GET", "ta", "s"]).starts_with("NOTFOUND"));
    assert!(fails(&mut con, &["SEM.GET", "tb", "s"]).starts_with("NOTFOUND"));

    // SEM.ACQUIRE inside a transaction never waits: a 30 s timeout acts as 0.
    let l1 = text(&field(
        &ok(&mut con, &["LEASE.CREATE", "ta", "p1", "60"]),
        "lease_id",
    ));
    let l2 = text(&field(
        &ok(&mut con, &["LEASE.CREATE", "ta", "p2", "60"]),
        "lease_id",
    ));
    ok(&mut con, &["SEM.CREATE", "ta", "one", "1"]);
    ok(&mut con, &["SEM.ACQUIRE", "ta", "one", &l1, "1", "0"]);
    ok(&mut con, &["MULTI"]);
    ok(&mut con, &["SEM.ACQUIRE", "ta", "one", &l2, "1", "30"]);
    let started = Instant::now();
    let r = items(&ok(&mut con, &["EXEC"]));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "EXEC must not wait for the acquire's timeout"
    );
    assert_eq!(
        text(&field(&r[0], "outcome")),
        "ACQUIRE_OUTCOME_UNAVAILABLE"
    );

    // The client's own atomic pipeline (MULTI ... EXEC) in one namespace.
    let r: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("SEM.CREATE")
        .arg("ta")
        .arg("s")
        .arg(2)
        .cmd("SEM.GET")
        .arg("ta")
        .arg("s")
        .query(&mut con)
        .unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(int(&field(&r[1], "permits")), 2);
}

// ---------------------------------------------------------------------------------------------
// Semaphore commands end to end
// ---------------------------------------------------------------------------------------------

fn is_base62(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric())
}

fn semaphore_round_trip(con: &mut redis::Connection, resp3: bool) {
    let shape_ok = |v: &Value| {
        if resp3 {
            matches!(v, Value::Map(_))
        } else {
            matches!(v, Value::Array(_))
        }
    };
    let before = now_ns();
    let ns = ok(con, &["NS.CREATE", "orders", "DESC", "order workers"]);
    assert!(shape_ok(&ns), "{ns:?}");
    let m = to_map(&ns);
    for k in [
        "name",
        "description",
        "metadata",
        "version",
        "created_at",
        "updated_at",
    ] {
        assert!(m.contains_key(k), "namespace lacks {k}: {ns:?}");
    }
    assert_eq!(text(&m["name"]), "orders");
    assert_eq!(text(&m["description"]), "order workers");
    assert!(fields(&m["metadata"]).is_empty());
    assert!(shape_ok(&m["metadata"]), "metadata: {:?}", m["metadata"]);
    assert_eq!(int(&m["version"]), 1);
    let created = int(&m["created_at"]);
    assert_eq!(created, int(&m["updated_at"]));
    assert!(
        created >= before - 5_000_000_000 && created <= now_ns() + 5_000_000_000,
        "created_at is nanoseconds since the epoch: {created}"
    );

    let sem = ok(con, &["SEM.CREATE", "orders", "db-pool", "3"]);
    assert!(shape_ok(&sem), "{sem:?}");
    let s = to_map(&sem);
    assert_eq!(text(&s["name"]), "db-pool");
    assert_eq!(int(&s["permits"]), 3);
    assert_eq!(int(&s["active_holds"]), 0);
    assert_eq!(int(&s["active_holders_count"]), 0);
    assert_eq!(int(&s["version"]), 1);
    assert_eq!(text(&s["description"]), "");
    assert_eq!(int(&s["created_at"]), int(&s["updated_at"]));
    assert_eq!(int(&s["created_at"]), int(&s["last_activity_at"]));

    let lease = ok(con, &["LEASE.CREATE", "orders", "worker-1", "30"]);
    assert!(shape_ok(&lease), "{lease:?}");
    let l = to_map(&lease);
    let l1 = text(&l["lease_id"]);
    assert!(
        l1.starts_with("ls_") && l1.len() == 31 && is_base62(&l1[3..]),
        "{l1}"
    );
    assert_eq!(text(&l["process_id"]), "worker-1");
    let ttl_ns = int(&l["expires_at"]) - int(&l["created_at"]);
    assert!(
        (29_000_000_000..=31_000_000_000).contains(&ttl_ns),
        "expires_at = created_at + 30 s, got {ttl_ns} ns"
    );
    let l2 = text(&field(
        &ok(con, &["LEASE.CREATE", "orders", "worker-2", "30"]),
        "lease_id",
    ));
    assert_ne!(l1, l2);

    let r = ok(con, &["SEM.ACQUIRE", "orders", "db-pool", &l1, "2", "0"]);
    assert!(shape_ok(&r), "{r:?}");
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_ACQUIRED");
    let t1 = int(&field(&r, "fencing_token"));
    let rs = field(&r, "semaphore");
    assert!(shape_ok(&rs), "nested semaphore: {rs:?}");
    assert_eq!(int(&field(&rs, "active_holds")), 2);
    assert_eq!(int(&field(&rs, "active_holders_count")), 1);

    // Not enough left for weight 2: UNAVAILABLE (a reply, not an error), no token.
    let r = ok(con, &["SEM.ACQUIRE", "orders", "db-pool", &l2, "2", "0"]);
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_UNAVAILABLE");
    assert!(!to_map(&r).contains_key("fencing_token"), "{r:?}");
    assert_eq!(int(&field(&field(&r, "semaphore"), "active_holds")), 2);

    // Weight 1 fits; its token is higher.
    let r = ok(con, &["SEM.ACQUIRE", "orders", "db-pool", &l2, "1", "0"]);
    assert_eq!(text(&field(&r, "outcome")), "ACQUIRE_OUTCOME_ACQUIRED");
    assert!(int(&field(&r, "fencing_token")) > t1);
    assert_eq!(int(&field(&field(&r, "semaphore"), "active_holds")), 3);

    // More than the semaphore has: INVALIDARG at once.
    let e = fails(con, &["SEM.ACQUIRE", "orders", "db-pool", &l1, "4", "0"]);
    assert_eq!(e, "INVALIDARG weight exceeds semaphore permits");

    let rel = ok(con, &["SEM.RELEASE", "orders", "db-pool", &l1]);
    assert!(shape_ok(&rel), "{rel:?}");
    assert_eq!(int(&field(&rel, "active_holds")), 1);
    assert_eq!(int(&field(&rel, "active_holders_count")), 1);
    let got = ok(con, &["SEM.GET", "orders", "db-pool"]);
    assert_eq!(int(&field(&got, "active_holds")), 1);
    assert_eq!(
        int(&field(&got, "version")),
        1,
        "acquire/release keep version"
    );

    assert!(fails(con, &["NS.GET", "nosuch"]).starts_with("NOTFOUND"));
    assert!(fails(con, &["NS.CREATE", "orders"]).starts_with("ALREADYEXISTS"));
}

#[test]
fn semaphore_commands_end_to_end_resp2() {
    let server = Server::start();
    let mut con = server.conn();
    semaphore_round_trip(&mut con, false);
}

#[test]
fn semaphore_commands_end_to_end_resp3() {
    let server = Server::start();
    let mut con = server.conn_resp3();
    semaphore_round_trip(&mut con, true);
}

/// A lease ttl or acquire timeout option past what nanoseconds since 1970 can hold is refused at
/// start, naming the option: `--max-lease-ttl` above about 9.2e9 s once overflowed `ttl * 1e9`,
/// and a lease was acknowledged with a negative `expires_at`, dead at once. The longest allowed
/// (100 years) gives a live lease.
#[test]
fn duration_options_past_what_nanoseconds_hold_are_refused_at_start() {
    for (option, value) in [
        ("--max-lease-ttl", "9300000000"),
        ("--min-lease-ttl", "9300000000"),
        ("--max-acquire-timeout", "1e12"),
        ("--max-acquire-timeout", "nan"),
    ] {
        let (status, stderr) = Server::refused(&[option, value]);
        assert!(!status.success(), "{option} {value}: {status}");
        assert!(stderr.contains(option), "{option} {value}: {stderr}");
    }
    let longest = "3153600000";
    let s = Server::start_with(&["--max-lease-ttl", longest]);
    let mut con = s.conn();
    ok(&mut con, &["NS.CREATE", "long"]);
    let lease = ok(&mut con, &["LEASE.CREATE", "long", "p", longest]);
    let (created, expires) = (
        int(&field(&lease, "created_at")),
        int(&field(&lease, "expires_at")),
    );
    assert_eq!(
        expires - created,
        3_153_600_000 * 1_000_000_000,
        "{lease:?}"
    );
    let id = text(&field(&lease, "lease_id"));
    ok(&mut con, &["LEASE.GET", "long", &id]);
}
