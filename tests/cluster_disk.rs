//! A cluster node's disk that fills or fails (SPEC §8's rules in cluster mode), on a real file
//! system mounted as a follower's data directory: a full disk is waited out (the node stays
//! up, the cluster goes on without it, and it catches up by itself within seconds once there
//! is room); any other failed write (`EIO`, an ext4 image shut down under it) stops the node
//! with a non-zero exit, so that its supervisor restarts it, and the restart catches up.
//! Mounting needs root, as CI runs.

mod cluster_harness;
mod common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use cluster_harness::nodes::Nodes;
use common::cluster::run_ready_at;
use common::disk::{ext4_image, fill, shut_down, Mount};
use common::*;

/// Long descriptions: a few writes outgrow the zeros a Raft log segment keeps ahead (2 MiB).
const ARGS: [&str; 2] = ["--max-description-len", "65536"];

/// Node `i`, stopped, restarted on a file system `mount` makes on its data directory, with its
/// files copied over.
fn onto(nodes: &mut Nodes, i: usize, mount: impl FnOnce(&Path) -> Mount) -> Mount {
    nodes.kill9(i);
    let dir = nodes.dir(i).to_path_buf();
    let saved = dir.with_extension("saved");
    let copy = |from: &Path, to: &Path| {
        let ok = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .status()
            .unwrap();
        assert!(ok.success(), "cp -a {} {}", from.display(), to.display());
    };
    copy(&dir, &saved);
    let disk = mount(&dir);
    copy(&saved.join("."), &dir);
    // On disk before the node runs there, as its own writes are (cp writes no further).
    assert!(Command::new("sync").status().unwrap().success());
    fs::remove_dir_all(&saved).unwrap();
    nodes.restart(i);
    disk
}

/// Writes `n` namespaces `<prefix>-<k>` with 60 KiB descriptions through the leader.
fn write_big(nodes: &Nodes, leader: usize, prefix: &str, n: usize) {
    let desc = "d".repeat(60 << 10);
    for k in 0..n {
        let name = format!("{prefix}-{k}");
        run_ready_at(nodes.addr(leader), &["NS.CREATE", &name, "DESC", &desc])
            .unwrap_or_else(|e| panic!("NS.CREATE {name}: {e}"));
    }
}

fn raft_index(nodes: &Nodes, i: usize, field: &str) -> i64 {
    let mut con = connect_url(&format!("redis://{}", nodes.addr(i)));
    info_int(&mut con, field)
}

/// Waits until node `f` applied what the leader committed.
fn caught_up(nodes: &Nodes, f: usize, leader: usize, within: Duration) -> bool {
    let committed = raft_index(nodes, leader, "raft_commit_index");
    wait_until(within, || {
        raft_index(nodes, f, "raft_applied_index") >= committed
    })
}

#[test]
fn a_follower_whose_disk_fills_waits_for_room_and_catches_up_by_itself() {
    let mut nodes = Nodes::cluster(3, &ARGS);
    let leader = nodes.wait_for_leader();
    let f = (leader + 1) % 3;
    let disk = onto(&mut nodes, f, |dir| {
        Mount::new("tmpfs", "size=24m", Path::new("tmpfs"), dir)
    });
    write_big(&nodes, leader, "before", 3);
    assert!(caught_up(&nodes, f, leader, Duration::from_secs(30)));

    let filler = fill(nodes.dir(f));
    // The cluster goes on without it; it stays up, and says why it waits.
    write_big(&nodes, leader, "full", 60);
    assert!(
        wait_until(Duration::from_secs(10), || {
            !nodes.log_lines_with(f, &["no room on the disk"]).is_empty()
        }),
        "node {f} says it waits for room"
    );
    assert!(
        raft_index(&nodes, f, "raft_applied_index")
            < raft_index(&nodes, leader, "raft_commit_index")
    );
    let mut con = connect_url(&format!("redis://{}", nodes.addr(f)));
    assert_eq!(info_text(&mut con, "raft_role"), "follower");

    fs::remove_file(filler).unwrap();
    assert!(
        caught_up(&nodes, f, leader, Duration::from_secs(15)),
        "node {f} catches up once there is room"
    );
    assert!(!nodes
        .log_lines_with(f, &["room on the disk again"])
        .is_empty());
    // And it is a voter like the others: without the old leader it and the third elect one,
    // which serves everything.
    nodes.kill9(leader);
    let new_leader = nodes.wait_for_leader();
    let got = run_ready_at(nodes.addr(new_leader), &["NS.GET", "full-59"]).unwrap();
    assert_eq!(text(&field(&got, "name")), "full-59");
    nodes.kill9(f);
    drop(disk);
}

#[test]
fn a_follower_whose_disk_fails_exits_non_zero_and_its_restart_catches_up() {
    let mut nodes = Nodes::cluster(3, &ARGS);
    let leader = nodes.wait_for_leader();
    let f = (leader + 1) % 3;
    let image = ext4_image(nodes.dir(f));
    let disk = onto(&mut nodes, f, |dir| Mount::new("ext4", "loop", &image, dir));
    write_big(&nodes, leader, "before", 3);
    assert!(caught_up(&nodes, f, leader, Duration::from_secs(30)));

    shut_down(nodes.dir(f));
    write_big(&nodes, leader, "failed", 3);
    let status = nodes
        .wait_exit(f, Duration::from_secs(15))
        .expect("the node stops");
    assert_eq!(status.code(), Some(1), "{status:?}");
    assert!(!nodes
        .log_lines_with(f, &["the Raft node stopped"])
        .is_empty());

    drop(disk);
    let disk = Mount::new("ext4", "loop", &image, nodes.dir(f));
    nodes.restart(f);
    assert!(
        caught_up(&nodes, f, leader, Duration::from_secs(30)),
        "the restarted node catches up"
    );
    nodes.kill9(f);
    drop(disk);
    let _ = fs::remove_file(&image);
}
