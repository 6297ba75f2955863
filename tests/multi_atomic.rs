//! MULTI/EXEC is atomic (SPEC §7), also with respect to time: a lease that dies while a
//! transaction runs dies before it or after it, never between two of its commands.
//!
//! The transaction here is thousands of `SEM.GET`s of a semaphore whose only holder's lease
//! dies about when EXEC runs; every `SEM.GET` of one EXEC must show the same `active_holds`.
//! (Found by scripts/soak: `MULTI; SEM.GET; SEM.HOLDERS; EXEC` showed `active_holds` from
//! before a lease's death and holders from after it.)

mod common;

use std::io::Write;
use std::thread;
use std::time::{Duration, Instant};

use common::{field, int, now_ns, ok, text, Resp, Server};

const GETS: usize = 4000;

/// Queues MULTI + `GETS` x SEM.GET on `raw` (without EXEC) and reads the QUEUED replies.
fn queue(raw: &mut common::RawConn) {
    let mut out = common::encode(&[b"MULTI"]);
    for _ in 0..GETS {
        out.extend(common::encode(&[b"SEM.GET", b"ma", b"s"]));
    }
    raw.send(&out).unwrap();
    for _ in 0..=GETS {
        let r = raw.read_reply().unwrap();
        assert!(
            matches!(&r, Resp::Simple(s) if s == "OK" || s == "QUEUED"),
            "{r:?}"
        );
    }
}

/// Sends EXEC; returns each SEM.GET's active_holds, and how long until the reply's first byte
/// (about how long the server took to run the transaction).
fn exec(raw: &mut common::RawConn) -> (Vec<i64>, Duration) {
    let t = Instant::now();
    raw.stream().write_all(&common::encode(&[b"EXEC"])).unwrap();
    raw.stream().peek(&mut [0u8; 1]).unwrap();
    let ran = t.elapsed();
    let Resp::Array(Some(replies)) = raw.read_reply().unwrap() else {
        panic!("EXEC did not answer an array");
    };
    let holds = replies
        .iter()
        .map(|r| {
            let Resp::Array(Some(f)) = r else {
                panic!("{r:?}")
            };
            let i = f
                .iter()
                .position(|x| *x == Resp::Bulk(Some(b"active_holds".to_vec())))
                .expect("active_holds");
            match &f[i + 1] {
                Resp::Int(n) => *n,
                other => panic!("{other:?}"),
            }
        })
        .collect();
    (holds, ran)
}

#[test]
fn a_lease_never_dies_in_the_middle_of_a_transaction() {
    let server = Server::start();
    let mut admin = server.conn();
    ok(&mut admin, &["NS.CREATE", "ma"]);
    ok(&mut admin, &["SEM.CREATE", "ma", "s", "1"]);
    let mut raw = server.raw();

    // How long one such EXEC takes, to aim the next ones at a lease's death.
    queue(&mut raw);
    let (_, took) = exec(&mut raw);

    let mut torn = Vec::new();
    for attempt in 0..8 {
        let l = ok(&mut admin, &["LEASE.CREATE", "ma", "p", "1"]);
        let lease = text(&field(&l, "lease_id"));
        let dies = int(&field(&l, "expires_at"));
        ok(&mut admin, &["SEM.ACQUIRE", "ma", "s", &lease, "1", "0"]);
        queue(&mut raw);
        // EXEC so that the lease's death falls in the middle of the run.
        let aim = dies - (took.as_nanos() as i64) * (8 - attempt) / 16;
        let wait = aim - now_ns();
        if wait > 0 {
            thread::sleep(Duration::from_nanos(wait as u64));
        }
        let (holds, _) = exec(&mut raw);
        assert_eq!(holds.len(), GETS);
        let first = holds[0];
        if let Some(i) = holds.iter().position(|h| *h != first) {
            torn.push(format!(
                "attempt {attempt}: one EXEC saw active_holds {first} up to SEM.GET {i}, then {}",
                holds[i]
            ));
        }
        // Let the lease die before the next attempt.
        while now_ns() <= dies {
            thread::sleep(Duration::from_millis(10));
        }
    }
    assert!(
        torn.is_empty(),
        "a lease died in the middle of a transaction (EXEC ~{took:?}):\n{}",
        torn.join("\n")
    );
}
