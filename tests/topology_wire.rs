//! The topology commands over real sockets: a server is a one-node cluster owning slots
//! 0-16383 (SPEC §7), answered byte for byte as Redis 7.0 answers them, in RESP2 and RESP3,
//! with the address the client reached, a node id stable across restarts, and Redis's CRC16
//! slots. Also redis-cli's cluster mode (`-c`) against it.

mod common;

use std::io::Read;
use std::process::Command;

use common::*;

/// Sends `args` and checks that exactly `expected` comes back.
fn exact(c: &mut RawConn, args: &[&str], expected: &str) {
    let a: Vec<&[u8]> = args.iter().map(|s| s.as_bytes()).collect();
    c.send_cmd(&a).expect("send");
    let mut got = vec![0; expected.len()];
    (&mut c.stream())
        .read_exact(&mut got)
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    assert_eq!(String::from_utf8_lossy(&got), expected, "{args:?}");
}

/// A raw connection switched to RESP3.
fn raw3(s: &Server) -> RawConn {
    let mut c = s.raw();
    let hello = c.cmd(&["HELLO", "3"]);
    assert!(matches!(hello, Resp::Map(_)), "{hello:?}");
    c
}

fn my_id(s: &Server) -> String {
    let id = text(&ok(&mut s.conn(), &["CLUSTER", "MYID"]));
    assert_eq!(id.len(), 40, "{id}");
    assert!(
        id.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id}"
    );
    id
}

/// The RESP3 verbatim string of `text`, as Redis sends INFO-like text.
fn verbatim(text: &str) -> String {
    format!("={}\r\ntxt:{text}\r\n", text.len() + 4)
}

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

#[test]
fn a_single_node_is_a_one_node_cluster_in_resp2_and_resp3() {
    let s = Server::start();
    let id = my_id(&s);
    let port = s.port();
    let (ip, p) = ("127.0.0.1", port.to_string());
    let node = format!(":{port}\r\n{}", bulk(&id));

    let mut c = s.raw();
    exact(
        &mut c,
        &["CLUSTER", "SLOTS"],
        &format!("*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n{}{node}*0\r\n", bulk(ip)),
    );
    let shard_node = |proto_map: &str| {
        format!(
            "{proto_map}7\r\n{}{}{}:{port}\r\n{}{}{}{}{}{}{}:0\r\n{}{}",
            bulk("id"),
            bulk(&id),
            bulk("port"),
            bulk("ip"),
            bulk(ip),
            bulk("endpoint"),
            bulk(ip),
            bulk("role"),
            bulk("master"),
            bulk("replication-offset"),
            bulk("health"),
            bulk("online"),
        )
    };
    let shards = |map: &str, nodes_map: &str| {
        format!(
            "*1\r\n{map}{}*2\r\n:0\r\n:16383\r\n{}*1\r\n{}",
            bulk("slots"),
            bulk("nodes"),
            shard_node(nodes_map)
        )
    };
    // RESP2: maps are flat arrays of twice their length.
    exact(
        &mut c,
        &["CLUSTER", "SHARDS"],
        &shards("*4\r\n", "*").replace("*7\r\n", "*14\r\n"),
    );
    let nodes = format!("{id} {ip}:{p}@0 myself,master - 0 0 0 connected 0-16383\n");
    exact(&mut c, &["CLUSTER", "NODES"], &bulk(&nodes));
    let info = "cluster_state:ok\r\ncluster_slots_assigned:16384\r\ncluster_slots_ok:16384\r\n\
                cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:1\r\n\
                cluster_size:1\r\ncluster_current_epoch:0\r\ncluster_my_epoch:0\r\n\
                cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n\
                total_cluster_links_buffer_limit_exceeded:0\r\n";
    exact(&mut c, &["CLUSTER", "INFO"], &bulk(info));
    exact(&mut c, &["CLUSTER", "MYID"], &bulk(&id));
    exact(&mut c, &["CLUSTER", "KEYSLOT", "foo"], ":12182\r\n");
    exact(&mut c, &["READONLY"], "+OK\r\n");
    exact(&mut c, &["READWRITE"], "+OK\r\n");
    exact(&mut c, &["ROLE"], "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");

    let mut c3 = raw3(&s);
    exact(
        &mut c3,
        &["CLUSTER", "SLOTS"],
        &format!("*1\r\n*3\r\n:0\r\n:16383\r\n*4\r\n{}{node}%0\r\n", bulk(ip)),
    );
    // RESP3: CLUSTER SHARDS is a list of maps.
    exact(&mut c3, &["CLUSTER", "SHARDS"], &shards("%2\r\n", "%"));
    exact(&mut c3, &["CLUSTER", "NODES"], &verbatim(&nodes));
    exact(&mut c3, &["CLUSTER", "INFO"], &verbatim(info));
    exact(&mut c3, &["CLUSTER", "MYID"], &bulk(&id));
    exact(&mut c3, &["CLUSTER", "KEYSLOT", "foo"], ":12182\r\n");
    exact(&mut c3, &["READONLY"], "+OK\r\n");
    exact(&mut c3, &["ROLE"], "*3\r\n$6\r\nmaster\r\n:0\r\n*0\r\n");

    // Errors as Redis's.
    let mut con = s.conn();
    assert_eq!(
        fails(&mut con, &["CLUSTER"]),
        "ERR wrong number of arguments for 'cluster' command"
    );
    assert_eq!(
        fails(&mut con, &["CLUSTER", "SLOTS", "x"]),
        "ERR wrong number of arguments for 'cluster|slots' command"
    );
    assert_eq!(
        fails(&mut con, &["CLUSTER", "KEYSLOT"]),
        "ERR wrong number of arguments for 'cluster|keyslot' command"
    );
    assert_eq!(
        fails(&mut con, &["CLUSTER", "MEET", "127.0.0.1", "7000"]),
        "ERR unknown subcommand 'MEET'. Try CLUSTER HELP."
    );
    assert_eq!(
        fails(&mut con, &["READONLY", "x"]),
        "ERR wrong number of arguments for 'readonly' command"
    );
}

#[test]
fn info_and_hello_say_cluster_and_master() {
    let s = Server::start();
    let id = my_id(&s);
    let mut con = s.conn();
    let info = text(&ok(&mut con, &["INFO", "cluster"]));
    assert_eq!(info, "# Cluster\r\ncluster_enabled:1\r\n");
    let repl = text(&ok(&mut con, &["INFO", "replication"]));
    assert_eq!(
        repl,
        format!(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\n\
             master_failover_state:no-failover\r\nmaster_replid:{id}\r\n\
             master_replid2:0000000000000000000000000000000000000000\r\n\
             master_repl_offset:0\r\nsecond_repl_offset:-1\r\nrepl_backlog_active:0\r\n"
        )
    );
    // The whole INFO has both sections, Cluster before Keyspace as in Redis.
    let all = text(&ok(&mut con, &["INFO"]));
    assert_eq!(info_value(&all, "redis_mode").as_deref(), Some("cluster"));
    assert_eq!(info_value(&all, "cluster_enabled").as_deref(), Some("1"));
    assert_eq!(info_value(&all, "role").as_deref(), Some("master"));
    let mut c3 = s.conn_resp3();
    let hello = ok(&mut c3, &["HELLO", "3"]);
    assert_eq!(text(&field(&hello, "mode")), "cluster");
    assert_eq!(text(&field(&hello, "role")), "master");
}

#[test]
fn keyslot_follows_redis_crc16_and_hash_tags() {
    let s = Server::start();
    let mut con = s.conn();
    let slot = |con: &mut redis::Connection, key: &str| int(&ok(con, &["CLUSTER", "KEYSLOT", key]));
    // Redis's tests/unit/moduleapi/misc.tcl, and its src/crc16_slottable.h: the shortest key
    // of a slot, and that key as a hash tag.
    assert_eq!(slot(&mut con, "foo"), 12182);
    for (want, key) in [(0, "06S"), (1, "Qi"), (8000, "42"), (16383, "6ZJ")] {
        assert_eq!(slot(&mut con, key), want, "{key}");
        assert_eq!(slot(&mut con, &format!("x{{{key}}}y")), want, "{key}");
    }
    // The hash tag rules of the Redis Cluster specification.
    assert_eq!(
        slot(&mut con, "{user1000}.following"),
        slot(&mut con, "{user1000}.followers")
    );
    assert_eq!(slot(&mut con, "foo{{bar}}zap"), slot(&mut con, "{bar"));
    assert_eq!(slot(&mut con, "foo{bar}{zap}"), slot(&mut con, "bar"));
    assert_ne!(slot(&mut con, "foo{}{bar}"), slot(&mut con, "bar"));
    // "123456789" has CRC16 0x31C3 (XMODEM's check value): slot 0x31C3 & 0x3FFF.
    assert_eq!(slot(&mut con, "123456789"), 0x31C3);
    // Any bytes are a key.
    let v: i64 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&b"\x00\xff{\r\n}"[..])
        .query(&mut con)
        .unwrap();
    assert!((0..16384).contains(&v));
}

#[test]
fn the_node_id_survives_a_restart_and_is_stored_nowhere() {
    let mut s = Server::start();
    let id = my_id(&s);
    ok(&mut s.conn(), &["NS.CREATE", "kept"]);
    s.restart();
    assert_eq!(my_id(&s), id);
    // Derived, not stored: no file of the data directory holds it.
    let mut stack = vec![s.dir().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).unwrap();
                assert!(
                    !bytes.windows(40).any(|w| w == id.as_bytes()),
                    "{} holds the node id",
                    p.display()
                );
            }
        }
    }
    // Another server (another directory) is another node.
    assert_ne!(my_id(&Server::start()), id);
}

#[test]
fn bound_to_every_address_each_client_is_told_the_address_it_reached() {
    // With a password, so that the server bound to every address serves only those who know
    // it, and protected mode lets in a client of 127.0.0.2 (another loopback address, which
    // protected mode, as Redis's, does not count as local).
    let s = Server::start_with(&["--bind", "0.0.0.0", "--requirepass", "topo-pw"]);
    for ip in ["127.0.0.1", "127.0.0.2"] {
        let addr = format!("{ip}:{}", s.port()).parse().unwrap();
        let mut c = RawConn::connect(addr);
        assert_eq!(c.cmd(&["AUTH", "topo-pw"]), Resp::Simple("OK".into()));
        let nodes = c.cmd(&["CLUSTER", "NODES"]).text().unwrap();
        assert!(
            nodes.contains(&format!(" {ip}:{}@0 myself,master ", s.port())),
            "{nodes}"
        );
        let slots = c.cmd(&["CLUSTER", "SLOTS"]);
        let master = slots.items().unwrap()[0].items().unwrap()[2]
            .items()
            .unwrap();
        assert_eq!(master[0].text().as_deref(), Some(ip));
        assert_eq!(master[1].int(), Some(i64::from(s.port())));
        let shards = c.cmd(&["CLUSTER", "SHARDS"]);
        let node = &shards.items().unwrap()[0]
            .field("nodes")
            .unwrap()
            .items()
            .unwrap()[0];
        assert_eq!(node.field("ip").unwrap().text().as_deref(), Some(ip));
        assert_eq!(node.field("endpoint").unwrap().text().as_deref(), Some(ip));
    }
}

#[test]
fn redis_cli_runs_in_cluster_mode() {
    let s = Server::start();
    let port = s.port().to_string();
    let cli = |args: &[&str]| {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", port.as_str()])
            .args(args)
            .output()
            .expect("redis-cli (Debian's redis-tools) runs");
        assert!(out.status.success(), "{args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert_eq!(cli(&["CLUSTER", "KEYSLOT", "foo"]), "12182\n");
    // `-c` follows the cluster: it routes by the key's slot, to this node.
    let created = cli(&["-c", "NS.CREATE", "cli-ns"]);
    assert!(created.contains("cli-ns"), "{created}");
    assert!(cli(&["-c", "NS.GET", "cli-ns"]).contains("cli-ns"));
    assert!(cli(&["CLUSTER", "INFO"]).starts_with("cluster_state:ok\r\n"));
}
