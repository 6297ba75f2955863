//! What a start guards, over real processes: one permitd per `--dir` (a second one, single node
//! or cluster node, is refused while the first runs, and not after a `kill -9`).

mod common;

use common::cluster::start_cluster;
use common::*;

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
