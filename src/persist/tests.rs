//! Replay, restart and re-sharding of real data directories, and the records' room.

use super::*;
use crate::command::{parse_argv, Request};
use crate::engine::request::EngineRequest;
use crate::engine::types::{LeaseId, Limits, NANOS_PER_SEC};
use crate::engine::{Exec, Shard};
use crate::protocol::Reply;
use std::sync::atomic::AtomicUsize;

fn request(words: &str) -> EngineRequest {
    let argv: Vec<Bytes> = words
        .split(' ')
        .map(|w| Bytes::from(w.to_string()))
        .collect();
    let Ok((_, Request::Engine(req))) = parse_argv(&argv, &Limits::default()) else {
        panic!("bad test command {words}");
    };
    req
}

fn run(shard: &mut Shard, now: i64, words: &str) -> Exec {
    shard.execute(now, request(words), Some(1))
}

fn lease(shard: &mut Shard, now: i64, n: u64, ttl: i64) -> String {
    let id = LeaseId::from_counter(n);
    let req = EngineRequest::LeaseCreate(crate::engine::request::LeaseCreate {
        ns: Name::new_unchecked(Bytes::from("team")),
        id,
        process_id: Bytes::from("p"),
        ttl: ttl * NANOS_PER_SEC,
        meta: Default::default(),
    });
    shard.execute(now, req, Some(1));
    String::from_utf8(id.to_bytes().to_vec()).unwrap()
}

/// A workload touching every record type, with expiry, waiters and deletes (the cluster's
/// tests replay it through Raft entries too).
pub(crate) fn workload(shard: &mut Shard) -> Vec<Record> {
    let s = NANOS_PER_SEC;
    let mut journal = Vec::new();
    run(shard, s, "NS.CREATE team DESC d META k v");
    run(shard, s, "SEM.CREATE team db 5");
    run(shard, s, "SEM.CREATE team gone 1");
    let a = lease(shard, s, 1, 10);
    let b = lease(shard, s, 2, 2);
    let c = lease(shard, s, 3, 100);
    run(
        shard,
        2 * s,
        &format!("SEM.ACQUIRE team db {a} 3 0 META host x"),
    );
    run(shard, 2 * s, &format!("SEM.ACQUIRE team db {b} 2 0"));
    run(shard, 2 * s, &format!("SEM.ACQUIRE team db {c} 4 10"));
    run(shard, 2 * s, &format!("SEM.ACQUIRE team gone {c} 1 0"));
    run(shard, 3 * s, &format!("LEASE.REFRESH team {a} 20"));
    run(shard, 3 * s, "SEM.DELETE team gone");
    // b expires at 3 s: c (waiting for 4) still does not fit beside a's 3.
    run(shard, 4 * s, &format!("SEM.ACQUIRE team db {a} 1 0"));
    run(shard, 5 * s, "SEM.UPDATE team db 6 VERSION 1 DESC more");
    run(shard, 5 * s, "NS.UPDATE team VERSION 1");
    run(shard, 6 * s, &format!("SEM.RELEASE team db {a}"));
    run(shard, 6 * s, &format!("LEASE.REVOKE team {a}"));
    run(shard, 7 * s, "NS.CREATE tmp");
    run(shard, 7 * s, "NS.DELETE tmp");
    // The wall clock steps a minute ahead: c, still alive, dies a minute later.
    shard.shift_time(68 * s, 60 * s);
    journal.extend(shard.take_journal());
    journal
}

#[test]
fn replaying_the_journal_rebuilds_the_live_state() {
    let count = Arc::new(AtomicUsize::new(0));
    let mut live = Shard::new(Arc::new(Limits::default()), count);
    let journal = workload(&mut live);
    let kinds: std::collections::BTreeSet<String> = journal
        .iter()
        .map(|r| {
            format!("{r:?}")
                .split([' ', '{'])
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert!(
        kinds.len() >= 10,
        "every record type is exercised: {kinds:?}"
    );
    let mut replayed = BTreeMap::new();
    let mut hwm = 0;
    for r in journal {
        apply(&mut replayed, &mut hwm, r).unwrap();
    }
    let (nss, live_hwm) = live.state();
    assert_eq!(hwm, live_hwm);
    assert_eq!(
        snapshot::to_bytes(&replayed, hwm, 7),
        snapshot::to_bytes(nss, live_hwm, 7)
    );
}

#[test]
fn snapshot_plus_log_survives_restart_and_resharding() {
    let dir = std::env::temp_dir().join(format!("permitd-persist-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let first = load(&dir, 2, false).unwrap();
    assert!(first.shards.iter().all(|s| s.namespaces.is_empty()));
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = workload(&mut live);
    let home = shard_for(&Name::new_unchecked(Bytes::from("team")), 2);
    let mut store = Store::open(&first.gen_dir, home, 0, Fsync::Always, 1 << 20).unwrap();
    // Half the journal goes into a snapshot, the rest into the log after it.
    let (head, tail) = journal.split_at(journal.len() / 2);
    let mut snap_state = BTreeMap::new();
    let mut hwm = 0;
    for r in head {
        apply(&mut snap_state, &mut hwm, r.clone()).unwrap();
    }
    let snap_lsn = store.append(head.to_vec());
    let _ = store.take();
    let mut pieces = Vec::new();
    snapshot::encode(&snap_state, hwm, snap_lsn, |p| {
        pieces.push(p);
        true
    });
    install_snapshot(&store.snapshot_path(), pieces, &store.file()).unwrap();
    store.append(tail.to_vec());
    let batch = store.take();
    write_batch(&store.file(), &batch.bytes, true).unwrap();
    drop(store);
    for shards in [3, 1, 2] {
        let again = load(&dir, shards, false).unwrap();
        let home = shard_for(&Name::new_unchecked(Bytes::from("team")), shards);
        let (nss, live_hwm) = live.state();
        assert_eq!(again.shards[home].hwm, live_hwm);
        assert_eq!(
            snapshot::to_bytes(&again.shards[home].namespaces, 0, 0),
            snapshot::to_bytes(nss, 0, 0),
            "state after reloading with {shards} shards"
        );
    }
    let _ = fs::remove_dir_all(&dir);
}

/// The fencing token in an acquire's reply (RESP3 map form of the engine's reply).
fn token_of(reply: &Reply) -> i64 {
    let Reply::Map(fields) = reply else {
        panic!("an acquire answers a map: {reply:?}");
    };
    fields
        .iter()
        .find_map(|(k, v)| match (k, v) {
            (Reply::Bulk(k), Reply::Int(t)) if &k[..] == b"fencing_token" => Some(*t),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no fencing_token in {reply:?}"))
}

/// A server's shards over a data directory, reduced to what tokens need: each request runs
/// on its namespace's shard and its journal is written before the next one.
struct Node {
    shards: Vec<(Shard, Store)>,
}

impl Node {
    fn start(dir: &Path, count: usize) -> Node {
        let loaded = load(dir, count, false).unwrap();
        let namespaces = Arc::new(AtomicUsize::new(0));
        let shards = loaded
            .shards
            .into_iter()
            .enumerate()
            .map(|(id, st)| {
                let limits = Arc::new(Limits::default());
                let shard = Shard::restore(limits, namespaces.clone(), st.namespaces, st.hwm);
                let store = Store::open(&loaded.gen_dir, id, 0, Fsync::No, 1 << 30).unwrap();
                (shard, store)
            })
            .collect();
        Node { shards }
    }

    fn run(&mut self, words: &str) -> Reply {
        let req = request(words);
        let home = shard_for(req.namespace().expect("one namespace"), self.shards.len());
        let (shard, store) = &mut self.shards[home];
        let Exec::Reply(reply) = shard.execute(NANOS_PER_SEC, req, None) else {
            panic!("{words} parked");
        };
        store.append(shard.take_journal());
        let batch = store.take();
        write_batch(&store.file(), &batch.bytes, false).unwrap();
        reply
    }

    /// A fresh lease's id in namespace `ns`.
    fn lease(&mut self, ns: &str) -> String {
        let reply = self.run(&format!("LEASE.CREATE {ns} worker 300"));
        let Reply::Map(fields) = &reply else {
            panic!("{reply:?}");
        };
        match &fields[0] {
            (_, Reply::Bulk(id)) => String::from_utf8(id.to_vec()).unwrap(),
            other => panic!("{other:?}"),
        }
    }

    /// Acquires `sem` of `ns` under a new lease and releases it; returns the token.
    fn token(&mut self, ns: &str, sem: &str) -> i64 {
        let id = self.lease(ns);
        let token = token_of(&self.run(&format!("SEM.ACQUIRE {ns} {sem} {id} 1 0")));
        self.run(&format!("SEM.RELEASE {ns} {sem} {id}"));
        token
    }
}

#[test]
fn fencing_tokens_count_up_across_restart_recreate_and_resharding() {
    let dir = std::env::temp_dir().join(format!("permitd-tokens-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut node = Node::start(&dir, 2);
    node.run("NS.CREATE team");
    node.run("SEM.CREATE team db 1");
    let mut tokens = vec![node.token("team", "db"), node.token("team", "db")];
    assert_eq!(tokens, [1, 2], "a fresh data directory counts from 1");
    node.run("SEM.DELETE team db");
    node.run("SEM.CREATE team db 1");
    tokens.push(node.token("team", "db"));
    node.run("NS.DELETE team");
    node.run("NS.CREATE team");
    node.run("SEM.CREATE team db 1");
    tokens.push(node.token("team", "db"));
    // Restarts: with the same shard count, then re-sharded to 3 and to 1.
    for count in [2, 3, 1] {
        drop(node);
        node = Node::start(&dir, count);
        tokens.push(node.token("team", "db"));
    }
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "strictly rising on team/db: {tokens:?}"
    );
    assert!(
        tokens.iter().all(|&t| t < 1 << 53),
        "below 2^53: {tokens:?}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn tokens_of_a_data_directory_from_clock_tokens_keep_rising() {
    // An earlier permitd's tokens were nanosecond clock readings; the mark never goes down.
    let old = 1_796_037_003_305_164_005;
    let mut shard = Shard::restore(
        Arc::new(Limits::default()),
        Arc::new(AtomicUsize::new(0)),
        BTreeMap::new(),
        old,
    );
    run(&mut shard, NANOS_PER_SEC, "NS.CREATE team");
    run(&mut shard, NANOS_PER_SEC, "SEM.CREATE team db 1");
    let id = lease(&mut shard, NANOS_PER_SEC, 1, 60);
    let acquire = format!("SEM.ACQUIRE team db {id} 1 0");
    let Exec::Reply(reply) = run(&mut shard, NANOS_PER_SEC, &acquire) else {
        panic!("{acquire} parked");
    };
    assert_eq!(token_of(&reply), old + 1);
}

#[test]
fn a_burst_of_records_does_not_keep_its_room() {
    let dir = std::env::temp_dir().join(format!("permitd-pending-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let loaded = load(&dir, 1, false).unwrap();
    let mut store = Store::open(&loaded.gen_dir, 0, 0, Fsync::No, 1 << 30).unwrap();
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = workload(&mut live);
    store.append(journal.clone());
    let small = store.take().bytes.len();
    assert!(small > 0 && small < PENDING_KEEP);
    // A burst grows the buffer past the limit: the batch takes all of it.
    while store.pending.len() <= PENDING_KEEP {
        store.append(journal.clone());
    }
    let framed = store.pending.len();
    let batch = store.take();
    assert_eq!(batch.bytes.len(), framed);
    assert_eq!(
        store.pending.capacity(),
        0,
        "the burst's room goes with its batch"
    );
    write_batch(&store.file(), &batch.bytes, false).unwrap();
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn corrupt_log_stops_the_start_with_file_and_offset() {
    let dir = std::env::temp_dir().join(format!("permitd-corrupt-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let first = load(&dir, 1, false).unwrap();
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = workload(&mut live);
    let mut store = Store::open(&first.gen_dir, 0, 0, Fsync::Always, 1 << 20).unwrap();
    store.append(journal);
    let batch = store.take();
    write_batch(&store.file(), &batch.bytes, true).unwrap();
    let path = log_path(&first.gen_dir, 0);
    let mut bytes = fs::read(&path).unwrap();
    bytes[40] ^= 0xff;
    fs::write(&path, &bytes).unwrap();
    let err = load(&dir, 1, false)
        .err()
        .expect("corruption stops the start");
    assert!(
        err.contains("shard-0.log") && err.contains("offset"),
        "{err}"
    );
    let repaired = load(&dir, 1, true).unwrap();
    assert!(
        repaired.shards[0].namespaces.is_empty(),
        "cut before the first record"
    );
    let _ = fs::remove_dir_all(&dir);
}

/// A data directory with the workload's state in generation 2 (its log holds the changes),
/// and the shard that holds namespace `team`.
fn saved_workload(dir: &Path) -> usize {
    let _ = fs::remove_dir_all(dir);
    let first = load(dir, 2, false).unwrap();
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let home = shard_for(&Name::new_unchecked(Bytes::from("team")), 2);
    let mut store = Store::open(&first.gen_dir, home, 0, Fsync::Always, 1 << 20).unwrap();
    store.append(workload(&mut live));
    write_batch(&store.file(), &store.take().bytes, true).unwrap();
    home
}

#[test]
fn a_file_named_by_the_manifest_but_missing_stops_the_start_and_keeps_the_rest() {
    let dir = std::env::temp_dir().join(format!("permitd-missing-{}", std::process::id()));
    for (what, gone) in [
        ("log", "gen-1/shard-H.log"),
        ("snapshot", "gen-1/shard-H.snap"),
        ("generation", "gen-1"),
    ] {
        let home = saved_workload(&dir);
        let gone = dir.join(gone.replace('H', &home.to_string()));
        if gone.is_dir() {
            fs::remove_dir_all(&gone).unwrap();
        } else {
            fs::remove_file(&gone).unwrap();
        }
        let err = load(&dir, 2, false)
            .err()
            .expect("a missing {what} stops the start");
        assert!(
            err.contains(&gone.display().to_string()) && err.contains("missing"),
            "{what}: {err}"
        );
        // Nothing was written or removed: putting the file back would start as before.
        assert!(
            !dir.join("gen-2").exists(),
            "{what}: a new generation was written"
        );
        let manifest = fs::read_to_string(dir.join("MANIFEST")).unwrap();
        assert!(manifest.contains("generation 1"), "{what}: {manifest}");
    }
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_corrupt_snapshot_stops_the_start_and_says_what_can_be_done() {
    let dir = std::env::temp_dir().join(format!("permitd-badsnap-{}", std::process::id()));
    let home = saved_workload(&dir);
    // A new generation moves the state into its snapshots.
    let loaded = load(&dir, 2, false).unwrap();
    let path = snap_path(&loaded.gen_dir, home);
    let mut bytes = fs::read(&path).unwrap();
    let at = bytes.len() - 5;
    bytes[at] ^= 1;
    fs::write(&path, &bytes).unwrap();
    let err = load(&dir, 2, false)
        .err()
        .expect("corruption stops the start");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("checksum") && err.contains("backup") && err.contains("operations.md"),
        "{err}"
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn the_saved_state_of_a_shard_is_what_its_files_hold() {
    let dir = std::env::temp_dir().join(format!("permitd-saved-{}", std::process::id()));
    let home = saved_workload(&dir);
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    workload(&mut live);
    let (nss, hwm) = load_saved(&dir.join("gen-1"), home).unwrap();
    let (live_nss, live_hwm) = live.state();
    assert_eq!(hwm, live_hwm);
    assert_eq!(
        snapshot::to_bytes(&nss, 0, 0),
        snapshot::to_bytes(live_nss, 0, 0)
    );
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn a_roll_back_keeps_the_waiters_that_parked_before_and_ends_the_others() {
    let s = NANOS_PER_SEC;
    let mut shard = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    run(&mut shard, s, "NS.CREATE team");
    run(&mut shard, s, "SEM.CREATE team db 1");
    let (a, b, c) = (
        lease(&mut shard, s, 1, 100),
        lease(&mut shard, s, 2, 100),
        lease(&mut shard, s, 3, 100),
    );
    run(&mut shard, s, &format!("SEM.ACQUIRE team db {a} 1 0"));
    let Exec::Parked(early) = run(&mut shard, s, &format!("SEM.ACQUIRE team db {b} 1 50")) else {
        panic!("b waits")
    };
    // What is saved: everything so far.
    let mut saved = BTreeMap::new();
    let mut hwm = 0;
    for r in shard.take_journal() {
        apply(&mut saved, &mut hwm, r).unwrap();
    }
    // Not saved: c's wait, and a's release, which grants b.
    let Exec::Parked(late) = run(&mut shard, 2 * s, &format!("SEM.ACQUIRE team db {c} 1 50"))
    else {
        panic!("c waits")
    };
    shard.hold_grants();
    run(&mut shard, 3 * s, &format!("SEM.RELEASE team db {a}"));
    assert!(shard.take_outbox().is_empty(), "grants are held");
    let dropped = shard.roll_back(saved, hwm, |id| id == early);
    assert_eq!(dropped, vec![late]);
    shard.check();
    assert_eq!(shard.counts().waiters, 1);
    assert_eq!(
        shard.counts().holders,
        1,
        "a holds again: its release is rolled back"
    );
    // b keeps its place and its deadline: it times out at 51 s, as it would have.
    shard.advance(50 * s);
    assert!(shard.take_outbox().is_empty());
    shard.advance(51 * s);
    let out = shard.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, early);
    assert!(
        format!("{:?}", out[0].1).contains("TIMED_OUT"),
        "{:?}",
        out[0].1
    );
}

#[test]
fn resuming_grants_serves_the_queues_at_once() {
    let s = NANOS_PER_SEC;
    let mut shard = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    run(&mut shard, s, "NS.CREATE team");
    run(&mut shard, s, "SEM.CREATE team db 1");
    let (a, b) = (lease(&mut shard, s, 1, 5), lease(&mut shard, s, 2, 100));
    run(&mut shard, s, &format!("SEM.ACQUIRE team db {a} 1 0"));
    let Exec::Parked(waiter) = run(&mut shard, s, &format!("SEM.ACQUIRE team db {b} 1 50")) else {
        panic!("b waits")
    };
    shard.hold_grants();
    // a expires at 6 s: its permit stays free while grants are held.
    shard.advance(10 * s);
    assert!(shard.take_outbox().is_empty());
    assert_eq!(shard.counts().holders, 0);
    shard.resume_grants(11 * s);
    let out = shard.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, waiter);
    assert!(
        format!("{:?}", out[0].1).contains("ACQUIRED"),
        "{:?}",
        out[0].1
    );
    assert_eq!(shard.counts().holders, 1);
}

#[test]
fn a_roll_back_keeps_a_parked_acquireall_in_every_queue_and_resuming_serves_it() {
    let s = NANOS_PER_SEC;
    let mut shard = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    run(&mut shard, s, "NS.CREATE team");
    run(&mut shard, s, "SEM.CREATE team db 1");
    run(&mut shard, s, "SEM.CREATE team cache 1");
    let (a, b) = (lease(&mut shard, s, 1, 100), lease(&mut shard, s, 2, 100));
    run(&mut shard, s, &format!("SEM.ACQUIRE team cache {a} 1 0"));
    let Exec::Parked(w) = run(
        &mut shard,
        s,
        &format!("SEM.ACQUIREALL team {b} 50 db 1 cache 1"),
    ) else {
        panic!("b waits for cache")
    };
    let mut saved = BTreeMap::new();
    let mut hwm = 0;
    for r in shard.take_journal() {
        apply(&mut saved, &mut hwm, r).unwrap();
    }
    shard.hold_grants();
    // Not saved: a's release, which would grant b both.
    run(&mut shard, 2 * s, &format!("SEM.RELEASE team cache {a}"));
    assert!(shard.take_outbox().is_empty(), "grants are held");
    assert!(shard.roll_back(saved, hwm, |_| true).is_empty());
    shard.check();
    assert_eq!(shard.counts().waiters, 1);
    run(&mut shard, 3 * s, &format!("SEM.RELEASE team cache {a}"));
    shard.resume_grants(3 * s);
    let out = shard.take_outbox();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, w);
    assert!(
        format!("{:?}", out[0].1).contains("ACQUIRED"),
        "{:?}",
        out[0].1
    );
    assert_eq!(shard.counts().holders, 2, "b holds db and cache");
    shard.check();
}

#[test]
fn the_changes_refused_on_a_full_disk_are_the_write_commands_of_the_table() {
    for (spec, req) in crate::command::one_of_each() {
        let write = spec.flags.has(crate::command::table::Flag::Write);
        assert_eq!(req.is_write(), write, "{}", spec.name);
    }
}

#[test]
fn room_is_reserved_past_the_log_or_probed_with_a_file_that_goes_away() {
    let dir = std::env::temp_dir().join(format!("permitd-room-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("shard-0.log"))
        .unwrap();
    let beside = dir.join("shard-0.room");
    reserve(&log, &beside, 1 << 20).unwrap();
    // The room is kept past the end: the log's size is what was written.
    assert_eq!(log.metadata().unwrap().len(), 0);
    // Where fallocate is missing, a file of that size is written and removed.
    probe_room(&beside, 1 << 20).unwrap();
    assert!(!beside.exists());
    let _ = fs::remove_dir_all(&dir);
}

/// A store in cluster mode (proposing instead of writing) in a fresh folder named for `name`.
fn proposing_store(name: &str) -> (PathBuf, Store) {
    let dir = std::env::temp_dir().join(format!("permitd-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let loaded = load(&dir, 1, false).unwrap();
    let mut store = Store::open(&loaded.gen_dir, 0, 0, Fsync::Always, 1 << 30).unwrap();
    store.propose_instead();
    (dir, store)
}

#[test]
fn in_cluster_mode_records_wait_for_a_proposal_and_reads_get_one_of_their_own() {
    let (dir, mut store) = proposing_store("propose");
    assert!(!store.has_pending() && store.take_proposal().is_none());
    // A read with nothing pending takes an LSN of its own, once, and waits for a proposal.
    store.note_read();
    store.note_read();
    assert_eq!(store.last_lsn(), 1);
    assert_eq!(store.take_proposal(), Some((Vec::new(), 1)));
    // Records go into the next proposal, not into frames; a read then shares their LSN.
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = workload(&mut live);
    assert_eq!(store.append(journal.clone()), 2);
    store.note_read();
    assert_eq!(store.last_lsn(), 2);
    assert!(
        store.pending.is_empty(),
        "nothing framed for the shard's own log"
    );
    assert_eq!(store.take_proposal(), Some((journal, 2)));
    assert!(!store.has_pending());
    store.committed(2);
    assert_eq!(store.saved_lsn(), 2);
    // A roll-back drops what waits; its LSNs are not handed out again.
    store.note_read();
    store.drop_pending();
    assert!(store.take_proposal().is_none());
    assert_eq!(store.append(Vec::new()), 3);
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn in_cluster_mode_the_store_knows_the_first_change_not_known_committed() {
    let (dir, mut store) = proposing_store("first-change");
    let mut live = Shard::new(Arc::new(Limits::default()), Arc::new(AtomicUsize::new(0)));
    let journal = workload(&mut live);
    // Reads alone: no change waits.
    store.note_read();
    assert_eq!(store.take_proposal().map(|p| p.1), Some(1));
    assert_eq!(store.first_unsaved_change(), None);
    // A read (LSN 2), then two changes (3, 4) in one proposal, then a read with a change (5)
    // not proposed yet: the first change is 3 until that proposal commits, then 5.
    store.note_read();
    store.append(journal.clone());
    store.append(journal.clone());
    assert_eq!(store.first_unsaved_change(), Some(3));
    assert_eq!(store.take_proposal().map(|p| p.1), Some(4));
    assert_eq!(store.append(journal.clone()), 5);
    assert_eq!(store.first_unsaved_change(), Some(3));
    store.committed(1);
    assert_eq!(store.first_unsaved_change(), Some(3));
    store.committed(4);
    assert_eq!(store.first_unsaved_change(), Some(5));
    // A roll-back forgets them all.
    store.take_proposal();
    store.drop_pending();
    assert_eq!(store.first_unsaved_change(), None);
    let _ = fs::remove_dir_all(&dir);
}
