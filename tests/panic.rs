//! A panic ends the server process (the hook in main.rs), so that a restart replays the log;
//! DEBUG PANIC triggers one, and DEBUG is refused unless `--enable-debug-command` allows it.

mod common;

use std::time::Duration;

use common::{call, err_text, fails, field, int, items, ok, text, Resp, Server};

/// Redis's reply to DEBUG when the option does not allow it.
const NOT_ALLOWED: &str = "ERR DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.";

#[test]
fn debug_panic_ends_the_process_and_a_restart_serves_what_was_acknowledged() {
    let mut server = Server::start_with(&["--enable-debug-command", "yes"]);
    let mut con = server.conn();
    // Namespaces on both shards, so that both logs must be replayed.
    for ns in ["alpha", "beta", "gamma", "delta"] {
        ok(&mut con, &["NS.CREATE", ns]);
        ok(&mut con, &["SEM.CREATE", ns, "db", "3"]);
    }
    let lease = ok(&mut con, &["LEASE.CREATE", "alpha", "worker-1", "60"]);
    let lease = text(&field(&lease, "lease_id"));
    ok(&mut con, &["SEM.ACQUIRE", "alpha", "db", &lease, "2", "0"]);

    let crashed = call(&mut con, &["DEBUG", "PANIC"]);
    assert!(crashed.is_err(), "DEBUG PANIC answered: {crashed:?}");
    let status = server
        .wait_exit(Duration::from_secs(30))
        .expect("the server still runs 30 s after DEBUG PANIC");
    assert!(!status.success(), "exit status {status}");
    let log = server.log_contents();
    assert!(
        log.contains("panicked: DEBUG PANIC called at Unix time"),
        "the log does not name the panic:\n{log}"
    );
    assert!(
        log.contains("surface.rs"),
        "the log lacks the location:\n{log}"
    );

    server.restart();
    let mut con = server.conn();
    for ns in ["alpha", "beta", "gamma", "delta"] {
        let sem = ok(&mut con, &["SEM.GET", ns, "db"]);
        assert_eq!(int(&field(&sem, "permits")), 3, "{ns}");
    }
    let held = ok(&mut con, &["SEM.HOLDERS", "alpha", "db"]);
    assert!(
        format!("{held:?}").contains(&lease),
        "the acquire was acknowledged before the panic: {held:?}"
    );
}

#[test]
fn debug_is_refused_by_default_and_the_server_keeps_serving() {
    let mut server = Server::start();
    let mut con = server.conn();
    assert_eq!(fails(&mut con, &["DEBUG", "PANIC"]), NOT_ALLOWED);
    // Refused before the subcommand is looked at, as Redis.
    assert_eq!(fails(&mut con, &["DEBUG", "NOSUCH"]), NOT_ALLOWED);
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
    let conf = ok(&mut con, &["CONFIG", "GET", "enable-debug-command"]);
    assert_eq!(text(&field(&conf, "enable-debug-command")), "no");

    // On the wire it is Redis's error line; inside MULTI it aborts the transaction, as any
    // command refused while queueing.
    let mut raw = server.raw();
    assert_eq!(raw.cmd(&["MULTI"]), Resp::Simple("OK".into()));
    assert_eq!(
        raw.cmd(&["DEBUG", "PANIC"]),
        Resp::Error(NOT_ALLOWED.into())
    );
    match raw.cmd(&["EXEC"]) {
        Resp::Error(e) => assert!(e.starts_with("EXECABORT"), "{e}"),
        other => panic!("EXEC answered {other:?}"),
    }
    assert!(server.is_running());
}

#[test]
fn debug_local_allows_a_loopback_client_and_unknown_subcommands_are_errors() {
    let server = Server::start_with(&["--enable-debug-command", "local"]);
    let mut con = server.conn();
    let e = fails(&mut con, &["DEBUG", "NOSUCH"]);
    assert_eq!(
        e,
        "ERR unknown subcommand or wrong number of arguments for 'NOSUCH'. Try DEBUG HELP."
    );
    let e = fails(&mut con, &["DEBUG", "PANIC", "now"]);
    assert!(
        e.starts_with("ERR unknown subcommand or wrong number"),
        "{e}"
    );
    assert!(err_text(&call(&mut con, &["DEBUG"]).unwrap_err()).contains("wrong number"));
    let help = items(&ok(&mut con, &["DEBUG", "HELP"]));
    assert!(help.iter().any(|l| text(l) == "PANIC"), "{help:?}");
    assert_eq!(text(&ok(&mut con, &["PING"])), "PONG");
}
