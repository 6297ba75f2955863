//! Redis 7.0's introspection surface over real sockets, after its own tests
//! (tests/unit/introspection.tcl, introspection-2.tcl): COMMAND LIST and its filters, CLIENT
//! KILL and CLIENT LIST with their filters, TIME, and the CLIENT switches permitd accepts.

mod common;

use std::io::Read;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use redis::Value;

fn list(con: &mut redis::Connection, args: &[&str]) -> Vec<String> {
    let mut all = vec!["COMMAND", "LIST"];
    all.extend_from_slice(args);
    strings(&ok(con, &all))
}

fn id_of(con: &mut redis::Connection) -> i64 {
    int(&ok(con, &["CLIENT", "ID"]))
}

/// Whether `con` still answers (a killed connection does not).
fn alive(con: &mut redis::Connection) -> bool {
    call(con, &["PING"]).is_ok()
}

fn listed_ids(con: &mut redis::Connection, args: &[&str]) -> Vec<i64> {
    let mut all = vec!["CLIENT", "LIST"];
    all.extend_from_slice(args);
    text(&ok(con, &all))
        .lines()
        .map(|l| {
            let id = l.split(' ').next().unwrap().strip_prefix("id=").unwrap();
            id.parse().unwrap()
        })
        .collect()
}

#[test]
fn command_list_names_subcommands_and_filters_as_redis() {
    let s = Server::start();
    for mut con in [s.conn(), s.conn_resp3()] {
        let all = list(&mut con, &[]);
        for name in [
            "sem.acquire",
            "client",
            "client|list",
            "cluster|slots",
            "time",
        ] {
            assert!(all.iter().any(|n| n == name), "{name} in {all:?}");
        }
        // Every command and subcommand once.
        let mut unique = all.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), all.len());
        let count = int(&ok(&mut con, &["COMMAND", "COUNT"]));
        assert!((all.len() as i64) > count, "subcommands are listed too");

        // ACLCAT: the commands of the category, subcommands included; none for an unknown one.
        let conn_cat = list(&mut con, &["FILTERBY", "ACLCAT", "connection"]);
        assert!(conn_cat.iter().any(|n| n == "client|id"), "{conn_cat:?}");
        assert!(conn_cat.iter().any(|n| n == "ping"));
        assert!(!conn_cat.iter().any(|n| n == "sem.acquire"));
        assert_eq!(
            list(&mut con, &["filterby", "aclcat", "SEMAPHORE"]),
            list(&mut con, &["FILTERBY", "ACLCAT", "semaphore"])
        );
        assert!(list(&mut con, &["FILTERBY", "ACLCAT", "non_existing_category"]).is_empty());

        // PATTERN: a glob over full names, any case.
        assert_eq!(list(&mut con, &["FILTERBY", "PATTERN", "ping"]), ["ping"]);
        let cl = list(&mut con, &["FILTERBY", "PATTERN", "cl*"]);
        for name in ["client", "client|kill", "cluster", "cluster|keyslot"] {
            assert!(cl.iter().any(|n| n == name), "{name} in {cl:?}");
        }
        assert!(cl.iter().all(|n| n.starts_with("cl")), "{cl:?}");
        assert_eq!(
            list(&mut con, &["FILTERBY", "PATTERN", "CLUSTER|*SLOT*"]),
            ["cluster|slots", "cluster|keyslot"]
        );
        assert!(list(&mut con, &["FILTERBY", "PATTERN", "non_exists*"]).is_empty());

        // MODULE: no module is loaded.
        assert!(list(&mut con, &["FILTERBY", "MODULE", "non_existing_module"]).is_empty());

        // Redis's syntax errors.
        for bad in [
            &["bad_arg"][..],
            &["filterby", "bad_arg"],
            &["filterby", "bad_arg", "bad_arg2"],
            &["filterby", "pattern", "x", "extra"],
        ] {
            let mut args = vec!["COMMAND", "LIST"];
            args.extend_from_slice(bad);
            assert_eq!(fails(&mut con, &args), "ERR syntax error", "{bad:?}");
        }
    }
}

#[test]
fn every_container_answers_the_help_its_errors_point_to() {
    let s = Server::start();
    for mut con in [s.conn(), s.conn_resp3()] {
        for container in [
            "CLIENT", "CLUSTER", "COMMAND", "ACL", "CONFIG", "SLOWLOG", "LATENCY",
        ] {
            let hint = fails(&mut con, &[container, "NOSUCH"]);
            assert!(hint.ends_with(&format!("Try {container} HELP.")), "{hint}");
            // Redis's layout: a header naming the command, two lines per subcommand, HELP's
            // own two last; every line a status reply.
            let help = items(&ok(&mut con, &[container, "help"]));
            assert!(
                help.iter().all(|l| matches!(l, Value::SimpleString(_))),
                "{help:?}"
            );
            let lines = strings(&ok(&mut con, &[container, "HELP"]));
            assert_eq!(
                lines[0],
                format!("{container} <subcommand> [<arg> [value] [opt] ...]. Subcommands are:")
            );
            assert_eq!(lines[lines.len() - 2..], ["HELP", "    Prints this help."]);
            assert!(lines.len() > 3 && lines.len() % 2 == 1, "{lines:?}");
        }
        let client = strings(&ok(&mut con, &["CLIENT", "HELP"]));
        assert!(client.iter().any(|l| l.starts_with("KILL ")), "{client:?}");
        assert_eq!(
            list(&mut con, &["FILTERBY", "PATTERN", "cl*help"]),
            ["client|help", "cluster|help"]
        );
    }
}

#[test]
fn client_kill_rejects_bad_filters_and_kills_nobody() {
    let s = Server::start();
    let mut con = s.conn();
    let mut other = s.conn();
    // Redis's tests/unit/introspection.tcl "CLIENT KILL with illegal arguments", and what
    // Redis 7.0 answers to each.
    let cases: &[(&[&str], &str)] = &[
        (
            &[],
            "ERR wrong number of arguments for 'client|kill' command",
        ),
        (&["id", "10", "wrong_arg"], "ERR syntax error"),
        (&["id", "str"], "ERR client-id should be greater than 0"),
        (&["id", "-1"], "ERR client-id should be greater than 0"),
        (&["id", "0"], "ERR client-id should be greater than 0"),
        (
            &["type", "wrong_type"],
            "ERR Unknown client type 'wrong_type'",
        ),
        (&["user", "wrong_user"], "ERR No such user 'wrong_user'"),
        (&["skipme", "yes_or_no"], "ERR syntax error"),
        // The first bad pair decides.
        (
            &["type", "bogus", "skipme", "x"],
            "ERR Unknown client type 'bogus'",
        ),
        // MAXAGE came with Redis 7.4: 7.0 knows no such filter. It was once ignored here,
        // which killed every other client.
        (&["maxage", "10"], "ERR syntax error"),
        (&["skipme", "yes", "maxage", "10"], "ERR syntax error"),
        // Redis checks a USER as it reaches its pair: an unknown one before a bad pair is the
        // answer.
        (
            &["user", "nosuch", "bogus", "x"],
            "ERR No such user 'nosuch'",
        ),
        (&["user", "nosuch", "id", "0"], "ERR No such user 'nosuch'"),
        // The old form: an address no client has, however malformed.
        (&["000.123.321.567:0000"], "ERR No such client"),
        (&["127.0.0.1:"], "ERR No such client"),
    ];
    for (words, want) in cases {
        let mut args = vec!["CLIENT", "KILL"];
        args.extend_from_slice(words);
        assert_eq!(fails(&mut con, &args), *want, "{words:?}");
    }
    assert!(alive(&mut other), "a refused CLIENT KILL kills nobody");
    assert!(alive(&mut con));
}

#[test]
fn client_kill_type_matches_only_normal_clients() {
    let s = Server::start();
    let mut con = s.conn();
    let mut others: Vec<_> = (0..2).map(|_| s.conn()).collect();
    // No client of permitd subscribes, replicates or is a master's link: those types match
    // none, whatever else is asked.
    for kind in ["pubsub", "master", "replica", "slave", "PUBSUB"] {
        assert_eq!(
            int(&ok(&mut con, &["CLIENT", "KILL", "TYPE", kind])),
            0,
            "{kind}"
        );
        assert_eq!(
            int(&ok(
                &mut con,
                &["CLIENT", "KILL", "TYPE", kind, "SKIPME", "no"]
            )),
            0
        );
    }
    assert!(others.iter_mut().all(alive));
    // TYPE normal is every client; SKIPME yes (the default) spares the caller.
    assert_eq!(int(&ok(&mut con, &["CLIENT", "KILL", "TYPE", "normal"])), 2);
    assert!(others.iter_mut().all(|c| !alive(c)));
    assert!(alive(&mut con));
}

#[test]
fn client_kill_filters_combine() {
    let s = Server::start();
    let mut admin = s.conn();
    ok(
        &mut admin,
        &["ACL", "SETUSER", "bob", "on", ">bob-pw", "allkeys", "+@all"],
    );
    let mut bob = connect_url(&format!("redis://bob:bob-pw@127.0.0.1:{}", s.port()));
    let mut raw = s.raw();
    assert_eq!(raw.cmd(&["PING"]), Resp::Simple("PONG".into()));
    let raw_addr = raw.local_addr().to_string();
    let bob_id = id_of(&mut bob);

    // USER and ID must both match.
    assert_eq!(
        int(&ok(
            &mut admin,
            &[
                "CLIENT",
                "KILL",
                "USER",
                "default",
                "ID",
                &bob_id.to_string()
            ]
        )),
        0
    );
    // LADDR is the server's end: every client here, so with ADDR it is the one client.
    let laddr = format!("127.0.0.1:{}", s.port());
    assert_eq!(
        int(&ok(
            &mut admin,
            &["CLIENT", "KILL", "LADDR", &laddr, "ADDR", &raw_addr]
        )),
        1
    );
    let (_, end) = raw.read_to_end(Duration::from_secs(10));
    assert_ne!(end, End::TimedOut, "the raw client was closed");
    assert!(alive(&mut bob));
    assert_eq!(int(&ok(&mut admin, &["CLIENT", "KILL", "USER", "bob"])), 1);
    assert!(!alive(&mut bob));
    assert!(alive(&mut admin));
}

/// Sends `args` on `c` followed by a PING, and returns all that comes back before the server
/// closes the connection.
fn kill_self(c: &mut RawConn, args: &[&str]) -> Vec<u8> {
    let mut bytes = encode(&args.iter().map(|a| a.as_bytes()).collect::<Vec<_>>());
    bytes.extend_from_slice(&encode(&[b"PING"]));
    c.send(&bytes).unwrap();
    let (got, end) = c.read_to_end(Duration::from_secs(10));
    assert_ne!(end, End::TimedOut, "{args:?}: the caller is closed");
    got
}

#[test]
fn client_kill_of_the_caller_answers_then_closes() {
    let s = Server::start();
    let mut watcher = s.conn();

    // New form with SKIPME no: the count, then EOF; the PING behind it is not run.
    let mut c = s.raw();
    let Resp::Int(id) = c.cmd(&["CLIENT", "ID"]) else {
        panic!()
    };
    let got = kill_self(
        &mut c,
        &["CLIENT", "KILL", "ID", &id.to_string(), "SKIPME", "no"],
    );
    assert_eq!(String::from_utf8_lossy(&got), ":1\r\n");

    // SKIPME yes (the default) spares the caller.
    let mut c = s.raw();
    let Resp::Int(id) = c.cmd(&["CLIENT", "ID"]) else {
        panic!()
    };
    assert_eq!(
        c.cmd(&["CLIENT", "KILL", "ID", &id.to_string()]),
        Resp::Int(0)
    );
    assert_eq!(c.cmd(&["PING"]), Resp::Simple("PONG".into()));

    // The old form on its own address: +OK, then EOF.
    let addr = c.local_addr().to_string();
    let got = kill_self(&mut c, &["CLIENT", "KILL", &addr]);
    assert_eq!(String::from_utf8_lossy(&got), "+OK\r\n");

    // Under RESP3 as well.
    let mut c = s.raw();
    assert!(matches!(c.cmd(&["HELLO", "3"]), Resp::Map(_)));
    let addr = c.local_addr().to_string();
    let got = kill_self(&mut c, &["CLIENT", "KILL", "ADDR", &addr, "SKIPME", "no"]);
    assert_eq!(String::from_utf8_lossy(&got), ":1\r\n");

    // Killing everyone, the caller included: Redis's "CLIENT KILL SKIPME YES/NO will kill all
    // clients". The caller is counted and closed after the reply.
    let mut others: Vec<_> = (0..2).map(|_| s.conn()).collect();
    let before = info_int(&mut watcher, "connected_clients");
    let mut c = s.raw();
    let got = kill_self(&mut c, &["CLIENT", "KILL", "SKIPME", "no"]);
    assert_eq!(
        String::from_utf8_lossy(&got),
        format!(":{}\r\n", before + 1)
    );
    assert!(others.iter_mut().all(|o| !alive(o)));
}

#[test]
fn client_list_filters_by_type_and_ids() {
    let s = Server::start();
    let mut con = s.conn();
    let mut other = s.conn();
    let (me, them) = (id_of(&mut con), id_of(&mut other));
    let all = listed_ids(&mut con, &[]);
    assert!(all.contains(&me) && all.contains(&them), "{all:?}");
    assert_eq!(listed_ids(&mut con, &["TYPE", "normal"]), all);
    for kind in ["pubsub", "master", "replica", "slave"] {
        assert_eq!(text(&ok(&mut con, &["CLIENT", "LIST", "TYPE", kind])), "");
    }
    // IDs in the order given, repeated ones repeated, unknown ones left out (as Redis).
    let (m, t) = (me.to_string(), them.to_string());
    assert_eq!(
        listed_ids(&mut con, &["ID", &t, "999999", &m, &t]),
        [them, me, them]
    );
    assert_eq!(
        fails(&mut con, &["CLIENT", "LIST", "TYPE", "bogus"]),
        "ERR Unknown client type 'bogus'"
    );
    assert_eq!(
        fails(&mut con, &["CLIENT", "LIST", "ID", "x"]),
        "ERR Invalid client ID"
    );
    assert_eq!(
        fails(&mut con, &["CLIENT", "LIST", "TYPE", "normal", "x"]),
        "ERR syntax error"
    );
    assert_eq!(
        fails(&mut con, &["CLIENT", "LIST", "bogus"]),
        "ERR syntax error"
    );
    // Under RESP3, a verbatim string.
    let mut c3 = s.conn_resp3();
    assert!(matches!(
        ok(&mut c3, &["CLIENT", "LIST", "TYPE", "pubsub"]),
        Value::VerbatimString { .. }
    ));
}

#[test]
fn time_is_two_bulk_strings() {
    let s = Server::start();
    let mut c = s.raw();
    let mut c3 = s.raw();
    assert!(matches!(c3.cmd(&["HELLO", "3"]), Resp::Map(_)));
    for conn in [&mut c, &mut c3] {
        conn.send_cmd(&[b"TIME"]).unwrap();
        let head = conn.read_line().unwrap();
        assert_eq!(head, "*2");
        let mut parts = Vec::new();
        for _ in 0..2 {
            let len = conn.read_line().unwrap();
            let value = conn.read_line().unwrap();
            assert_eq!(len, format!("${}", value.len()), "a bulk string");
            parts.push(value.parse::<u64>().unwrap());
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        assert!(now.as_secs().abs_diff(parts[0]) <= 2, "{parts:?}");
        assert!(parts[1] < 1_000_000, "{parts:?}");
    }
    let mut con = s.conn();
    assert_eq!(
        fails(&mut con, &["TIME", "x"]),
        "ERR wrong number of arguments for 'time' command"
    );
}

#[test]
fn client_switches_are_accepted() {
    let s = Server::start();
    for mut con in [s.conn(), s.conn_resp3()] {
        for sub in ["NO-EVICT", "NO-TOUCH"] {
            for arg in ["on", "OFF"] {
                assert_eq!(ok(&mut con, &["CLIENT", sub, arg]), Value::Okay);
            }
            assert_eq!(
                fails(&mut con, &["CLIENT", sub, "maybe"]),
                "ERR syntax error"
            );
            assert_eq!(
                fails(&mut con, &["CLIENT", sub]),
                format!(
                    "ERR wrong number of arguments for 'client|{}' command",
                    sub.to_lowercase()
                )
            );
        }
        // What redis-py, go-redis, Jedis and Lettuce send on connect.
        assert_eq!(
            ok(
                &mut con,
                &[
                    "CLIENT",
                    "MAINT_NOTIFICATIONS",
                    "ON",
                    "moving-endpoint-type",
                    "internal-ip"
                ]
            ),
            Value::Okay
        );
        assert_eq!(
            ok(&mut con, &["CLIENT", "MAINT_NOTIFICATIONS", "off"]),
            Value::Okay
        );
        assert_eq!(
            fails(
                &mut con,
                &["CLIENT", "MAINT_NOTIFICATIONS", "on", "dangling"]
            ),
            "ERR syntax error"
        );
    }
    // The raw bytes: a plain +OK.
    let mut raw = s.raw();
    raw.send_cmd(&[b"CLIENT", b"NO-EVICT", b"on"]).unwrap();
    let mut got = [0u8; 5];
    (&mut raw.stream()).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"+OK\r\n");
}
