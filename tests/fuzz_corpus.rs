//! Replays every committed fuzz input (`fuzz/corpus/<target>/*`, and any crash reproducer kept
//! under `fuzz/regressions/<target>/`) through the same target bodies the libFuzzer targets
//! run (`fuzz/src/lib.rs`), so `cargo test` catches a regression without cargo-fuzz.

#[path = "../fuzz/src/lib.rs"]
mod bodies;

use std::fs;
use std::path::{Path, PathBuf};

fn inputs(target: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut files = Vec::new();
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for e in entries {
            let path = e.expect("read corpus dir").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        files.len() >= 5,
        "fuzz/corpus/{target} has {} seed inputs; expected the committed seeds",
        files.len()
    );
    for f in &files {
        let data = fs::read(f).expect("read corpus file");
        let r = std::panic::catch_unwind(|| body(&data));
        if let Err(e) = r {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panic!("{target}: input {} fails: {msg}", f.display());
        }
    }
}

#[test]
fn request_parser_corpus() {
    replay("request_parser", bodies::request_parser);
}

#[test]
fn command_parser_corpus() {
    replay("command_parser", bodies::command_parser);
}

/// The engine seeds must reach every situation the invariants are about, or replaying them
/// proves little.
#[test]
fn engine_corpus() {
    bodies::take_engine_hits();
    replay("engine", bodies::engine);
    let hits = bodies::take_engine_hits();
    eprintln!("engine corpus reaches: {hits:#?}");
    for what in [
        "parked",
        "parked behind others",
        "waiter granted",
        "waiter timed out",
        "waiter ended: lease gone",
        "waiter ended: semaphore deleted",
        "waiter ended: namespace deleted",
        "waiter ended: permits lowered",
        "waiter ended: unblocked",
        "cancel: client gone",
        "cancel: CLIENT UNBLOCK",
        "unavailable",
        "re-acquire",
        "lease expired",
        "holders over several pages",
        "journal: lease deleted",
        "journal: hold set",
        "journal: hold released",
    ] {
        assert!(
            hits.contains_key(what),
            "the engine corpus never reaches: {what}"
        );
    }
}

/// Short and degenerate inputs (empty, one byte, ...) are valid inputs too.
#[test]
fn bodies_take_any_bytes() {
    for len in 0..64usize {
        let data: Vec<u8> = (0..len).map(|i| (i * 37 + len) as u8).collect();
        bodies::request_parser(&data);
        bodies::command_parser(&data);
        bodies::engine(&data);
    }
}

/// What the corpus a fuzz run grew (`fuzz/corpus-work/engine`, not committed) reaches:
/// `cargo test --test fuzz_corpus -- --ignored --nocapture`.
#[test]
#[ignore]
fn engine_work_corpus_reach() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus-work/engine");
    let Ok(entries) = fs::read_dir(&dir) else {
        eprintln!("no {}", dir.display());
        return;
    };
    bodies::take_engine_hits();
    let mut n = 0;
    for e in entries {
        let data = fs::read(e.expect("dir entry").path()).expect("read input");
        bodies::engine(&data);
        n += 1;
    }
    eprintln!("{n} inputs reach: {:#?}", bodies::take_engine_hits());
}
