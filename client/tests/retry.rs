//! The helper's cluster-mode retries (`permitd_client::retry`), each through the real `redis`
//! client over real sockets against a scripted fake cluster node on 127.0.0.1. The fake answers
//! what a permitd node answers in cluster mode (SPEC §10: `-MOVED <slot> <host:port>`,
//! `-CLUSTERDOWN no leader`, `-TRYAGAIN ...`, `-LEADERCHANGED outcome unknown`), and otherwise
//! replies shaped as the real server's (RESP2 flat maps, copied from a running permitd).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use permitd_client::{Heartbeat, Lease, Outcome, Retry, Semaphore};
use redis::{ErrorKind, ServerErrorKind};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};

const LEASE_ID: &str = "ls_L9P4qojbIruxZVCkJA2zPFn8pdIg";
const CLUSTERDOWN: &str = "CLUSTERDOWN no leader";
const LEADERCHANGED: &str = "LEADERCHANGED outcome unknown";

/// What the fake node does with one command.
enum Answer {
    /// Writes these bytes back.
    Reply(String),
    /// Writes these bytes back after a while (as to an acquire parked that long).
    Late(Duration, String),
    /// Closes the connection without answering.
    Drop,
}

type Script = Box<dyn FnMut(&[String]) -> Answer + Send>;

/// A fake cluster node: answers the client's handshake itself and every other command from its
/// script, recording each one.
struct Fake {
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Vec<String>>>>,
    /// The node its CLUSTER SLOTS names as serving every slot (itself while `None`).
    leader: Arc<Mutex<Option<SocketAddr>>>,
}

impl Fake {
    async fn start(script: impl FnMut(&[String]) -> Answer + Send + 'static) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Mutex<Script>> = Arc::new(Mutex::new(Box::new(script)));
        let leader = Arc::new(Mutex::new(None));
        let (sent, slots) = (log.clone(), leader.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, script.clone(), sent.clone(), slots.clone()));
            }
        });
        Fake { addr, log, leader }
    }

    fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://{}", self.addr)).unwrap()
    }

    /// A plain connection, with no response timeout (acquires may wait).
    async fn conn(&self) -> redis::aio::MultiplexedConnection {
        let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
        self.client()
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .unwrap()
    }

    /// Every command named `name` the node received, in order.
    fn sent(&self, name: &str) -> Vec<Vec<String>> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|c| c[0] == name).cloned().collect()
    }
}

async fn serve(
    stream: TcpStream,
    script: Arc<Mutex<Script>>,
    log: Arc<Mutex<Vec<Vec<String>>>>,
    leader: Arc<Mutex<Option<SocketAddr>>>,
) {
    let stream_addr = stream.local_addr().unwrap();
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    while let Some(cmd) = read_command(&mut read).await {
        let answer = match cmd[0].as_str() {
            "CLIENT" => Answer::Reply("+OK\r\n".into()),
            "PING" => Answer::Reply("+PONG\r\n".into()),
            // A cluster client's CLUSTER SLOTS: one node serves every slot.
            "CLUSTER" => {
                let at = leader.lock().unwrap().unwrap_or(stream_addr);
                Answer::Reply(format!(
                    "*1\r\n*3\r\n:0\r\n:16383\r\n*2\r\n{}{}",
                    bulk(&at.ip().to_string()),
                    int(at.port().into())
                ))
            }
            _ => {
                log.lock().unwrap().push(cmd.clone());
                (script.lock().unwrap())(&cmd)
            }
        };
        match answer {
            Answer::Reply(bytes) => {
                if write.write_all(bytes.as_bytes()).await.is_err() {
                    return;
                }
            }
            Answer::Late(after, bytes) => {
                tokio::time::sleep(after).await;
                if write.write_all(bytes.as_bytes()).await.is_err() {
                    return;
                }
            }
            Answer::Drop => return,
        }
    }
}

/// One command as the client sends it (an array of bulk strings), its name upper-cased.
async fn read_command(read: &mut BufReader<tokio::net::tcp::OwnedReadHalf>) -> Option<Vec<String>> {
    let mut line = String::new();
    read.read_line(&mut line).await.ok()?;
    let count: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut bytes = vec![0; len + 2];
        read.read_exact(&mut bytes).await.ok()?;
        bytes.truncate(len);
        args.push(String::from_utf8(bytes).ok()?);
    }
    args[0] = args[0].to_ascii_uppercase();
    Some(args)
}

// --- replies as permitd gives them (RESP2) ------------------------------------------------

fn bulk(s: &str) -> String {
    format!("${}\r\n{s}\r\n", s.len())
}

fn int(n: i64) -> String {
    format!(":{n}\r\n")
}

fn entity(fields: &[(&str, String)]) -> String {
    let mut out = format!("*{}\r\n", fields.len() * 2);
    for (name, value) in fields {
        out += &bulk(name);
        out += value;
    }
    out
}

fn err(text: &str) -> Answer {
    Answer::Reply(format!("-{text}\r\n"))
}

fn semaphore(name: &str, permits: i64, holds: i64) -> String {
    let t = 1_796_140_588_913_151_543;
    entity(&[
        ("name", bulk(name)),
        ("description", bulk("")),
        ("permits", int(permits)),
        ("active_holds", int(holds)),
        ("active_holders_count", int(holds.min(1))),
        ("waiters", int(0)),
        ("version", int(1)),
        ("created_at", int(t)),
        ("updated_at", int(t)),
        ("last_activity_at", int(t)),
        ("metadata", "*0\r\n".into()),
    ])
}

fn acquired(name: &str, token: i64) -> Answer {
    Answer::Reply(entity(&[
        ("outcome", bulk("ACQUIRE_OUTCOME_ACQUIRED")),
        ("semaphore", semaphore(name, 2, 1)),
        ("fencing_token", int(token)),
    ]))
}

fn unavailable(name: &str) -> Answer {
    Answer::Reply(entity(&[
        ("outcome", bulk("ACQUIRE_OUTCOME_UNAVAILABLE")),
        ("semaphore", semaphore(name, 2, 2)),
    ]))
}

fn acquired_all(parts: &[(&str, i64)]) -> Answer {
    let mut holds = format!("*{}\r\n", parts.len());
    for (name, token) in parts {
        holds += &entity(&[
            ("semaphore", semaphore(name, 2, 1)),
            ("fencing_token", int(*token)),
        ]);
    }
    Answer::Reply(entity(&[
        ("outcome", bulk("ACQUIRE_OUTCOME_ACQUIRED")),
        ("holds", holds),
    ]))
}

fn lease_reply() -> Answer {
    let now = permitd_client::now_ns();
    Answer::Reply(entity(&[
        ("lease_id", bulk(LEASE_ID)),
        ("process_id", bulk("w1")),
        ("created_at", int(now)),
        ("expires_at", int(now + 30_000_000_000)),
        ("metadata", "*0\r\n".into()),
    ]))
}

fn lease(ttl_secs: u64) -> Lease {
    Lease {
        namespace: "team".into(),
        id: LEASE_ID.into(),
        ttl_secs,
        retry: Retry::default(),
    }
}

/// The timeout argument of each SEM.ACQUIRE (or SEM.ACQUIREALL) received.
fn timeouts(sent: &[Vec<String>], at: usize) -> Vec<f64> {
    sent.iter().map(|c| c[at].parse().unwrap()).collect()
}

// --- not run: re-sent, acquires with the time left ----------------------------------------

#[tokio::test]
async fn tryagain_then_success_resends_the_acquire_with_the_time_left() {
    let mut n = 0;
    let fake = Fake::start(move |_| {
        n += 1;
        match n {
            1 => err("TRYAGAIN the new leader is not ready yet"),
            _ => acquired("db", 7),
        }
    })
    .await;
    let mut c = fake.conn().await;
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!((a.outcome, a.fencing_token), (Outcome::Acquired, Some(7)));
    let sent = fake.sent("SEM.ACQUIRE");
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0][..5],
        sent[1][..5],
        "the same ns, sem, lease and weight"
    );
    let t = timeouts(&sent, 5);
    assert_eq!(t[0], 2.0);
    assert!(
        t[1] < 2.0 - 0.04 && t[1] > 1.0,
        "the re-send carries the time left: {t:?}"
    );
}

#[tokio::test]
async fn clusterdown_a_few_times_then_success() {
    let (mut creates, mut acquires) = (0, 0);
    let fake = Fake::start(move |cmd| match cmd[0].as_str() {
        "LEASE.CREATE" => {
            creates += 1;
            if creates <= 3 {
                err(CLUSTERDOWN)
            } else {
                lease_reply()
            }
        }
        _ => {
            acquires += 1;
            if acquires <= 3 {
                err(CLUSTERDOWN)
            } else {
                acquired_all(&[("db", 3), ("cache", 4)])
            }
        }
    })
    .await;
    let mut c = fake.conn().await;
    let lease = Lease::create(&mut c, "team", "w1", 30).await.unwrap();
    assert_eq!(lease.id, LEASE_ID);
    assert_eq!(fake.sent("LEASE.CREATE").len(), 4);

    let (db, cache) = (
        Semaphore::new("team", "db"),
        Semaphore::new("team", "cache"),
    );
    let all = Semaphore::acquire_all(
        &mut c,
        &lease,
        &[(&db, 1), (&cache, 2)],
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    assert_eq!(all.outcome, Outcome::Acquired);
    assert_eq!(all.fencing_tokens, vec![Some(3), Some(4)]);
    let sent = fake.sent("SEM.ACQUIREALL");
    assert_eq!(sent.len(), 4);
    for c in &sent {
        assert_eq!(c[1..3], [String::from("team"), LEASE_ID.into()]);
        assert_eq!(c[4..], ["db", "1", "cache", "2"]);
    }
    let t = timeouts(&sent, 3);
    assert!(
        t.windows(2).all(|w| w[1] < w[0]) && t[3] > 2.0,
        "each re-send carries less time: {t:?}"
    );
}

// --- outcome unknown ----------------------------------------------------------------------

#[tokio::test]
async fn leaderchanged_on_acquire_resends_the_same_lease_and_weight() {
    let mut n = 0;
    let fake = Fake::start(move |_| {
        n += 1;
        match n {
            1 => err(LEADERCHANGED),
            // The first try had committed: the re-send finds the hold and its token.
            _ => acquired("db", 41),
        }
    })
    .await;
    let mut c = fake.conn().await;
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 2, Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!((a.outcome, a.fencing_token), (Outcome::Acquired, Some(41)));
    let sent = fake.sent("SEM.ACQUIRE");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[1][1..5], ["team", "db", LEASE_ID, "2"]);
}

#[tokio::test]
async fn leaderchanged_on_revoke_or_delete_then_notfound_is_done() {
    let mut n = 0;
    let fake = Fake::start(move |_| {
        n += 1;
        match n {
            1 | 3 => err(LEADERCHANGED),
            2 => err("NOTFOUND lease not found or expired in namespace 'team'"),
            _ => err("NOTFOUND namespace 'team' not found"),
        }
    })
    .await;
    let mut c = fake.conn().await;
    lease(30).revoke(&mut c).await.unwrap();
    assert_eq!(fake.sent("LEASE.REVOKE").len(), 2);
    Semaphore::new("team", "db").delete(&mut c).await.unwrap();
    assert_eq!(fake.sent("SEM.DELETE").len(), 2);

    // A NOTFOUND that is the first answer is the caller's to see, as on a single node.
    let e = lease(30).revoke(&mut c).await.unwrap_err();
    assert_eq!(e.code(), Some("NOTFOUND"));
    assert_eq!(fake.sent("LEASE.REVOKE").len(), 3, "not re-sent");
}

#[tokio::test]
async fn alreadyexists_after_leaderchanged_on_create_is_checked_with_get() {
    let mut creates = 0;
    let fake = Fake::start(move |cmd| match cmd[0].as_str() {
        "SEM.CREATE" => {
            creates += 1;
            // Every odd send loses its outcome; the even one finds the semaphore made.
            if creates % 2 == 1 {
                err(LEADERCHANGED)
            } else {
                err("ALREADYEXISTS semaphore 'db' already exists in namespace 'team'")
            }
        }
        _ => Answer::Reply(semaphore("db", 2, 0)),
    })
    .await;
    let mut c = fake.conn().await;
    let db = Semaphore::new("team", "db");
    db.create(&mut c, 2).await.unwrap();
    assert_eq!(fake.sent("SEM.GET").len(), 1);

    let e = db.create(&mut c, 3).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some("ALREADYEXISTS"),
        "other settings than asked: {e}"
    );
    assert_eq!(fake.sent("SEM.GET").len(), 2);
    assert_eq!(fake.sent("SEM.CREATE").len(), 4);
}

#[tokio::test]
async fn alreadyexists_as_the_first_answer_is_an_error_without_a_get() {
    let fake =
        Fake::start(|_| err("ALREADYEXISTS semaphore 'db' already exists in namespace 'team'"))
            .await;
    let mut c = fake.conn().await;
    let e = Semaphore::new("team", "db")
        .create(&mut c, 2)
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some("ALREADYEXISTS"));
    assert_eq!(
        fake.log.lock().unwrap().len(),
        1,
        "one SEM.CREATE, no SEM.GET"
    );
}

#[tokio::test]
async fn a_connection_dropped_after_an_acquire_was_sent_is_resent_on_the_new_one() {
    let mut n = 0;
    let fake = Fake::start(move |_| {
        n += 1;
        match n {
            1 => Answer::Drop,
            _ => acquired("db", 9),
        }
    })
    .await;
    let config = redis::aio::ConnectionManagerConfig::new().set_response_timeout(None);
    let mut c = fake
        .client()
        .get_connection_manager_with_config(config)
        .await
        .unwrap();
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!((a.outcome, a.fencing_token), (Outcome::Acquired, Some(9)));
    let sent = fake.sent("SEM.ACQUIRE");
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0][..5], sent[1][..5]);
}

/// A node that answers the first acquire `LEADERCHANGED` after `parked` (a grant whose fate
/// the old leader never learnt), then `LEADERCHANGED` at once until `settled` has passed since
/// the first send, then `answer`.
fn leaderchanged_until(
    parked: Duration,
    settled: Duration,
    answer: fn() -> Answer,
) -> impl FnMut(&[String]) -> Answer + Send + 'static {
    let (mut n, mut first) = (0, None);
    move |_| {
        n += 1;
        let since = first.get_or_insert_with(Instant::now).elapsed();
        match n {
            1 => Answer::Late(parked, format!("-{LEADERCHANGED}\r\n")),
            _ if since < settled => err(LEADERCHANGED),
            _ => answer(),
        }
    }
}

/// Runs an acquire of `timeout` against `fake`, with a retry budget of `budget`; returns the
/// result, how long it took, and the timeouts the node received.
async fn acquire_on(
    fake: &Fake,
    timeout: Duration,
    budget: Duration,
) -> (
    redis::RedisResult<permitd_client::Acquire>,
    Duration,
    Vec<f64>,
) {
    let mut c = fake.conn().await;
    let lease = Lease {
        retry: Retry {
            budget,
            ..Retry::default()
        },
        ..lease(30)
    };
    let start = Instant::now();
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease, 2, timeout)
        .await;
    let took = start.elapsed();
    let sent = fake.sent("SEM.ACQUIRE");
    assert!(
        sent.iter()
            .all(|c| c[1..5] == ["team", "db", LEASE_ID, "2"]),
        "every send has the same lease and weight: {sent:?}"
    );
    (a, took, timeouts(&sent, 5))
}

#[tokio::test]
async fn leaderchanged_near_the_deadline_is_settled_past_it_and_acquired_answers_the_hold() {
    let (timeout, settled) = (Duration::from_millis(500), Duration::from_millis(900));
    let fake = Fake::start(leaderchanged_until(
        Duration::from_millis(450),
        settled,
        || acquired("db", 77),
    ))
    .await;
    let (a, took, t) = acquire_on(&fake, timeout, Duration::from_secs(5)).await;
    let a = a.unwrap();
    assert_eq!((a.outcome, a.fencing_token), (Outcome::Acquired, Some(77)));
    assert!(took >= settled && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(t[0], 0.5);
    let past = t.iter().filter(|&&s| s == 0.0).count();
    assert!(
        past >= 2 && t.last() == Some(&0.0),
        "re-sent with timeout 0 past the deadline: {t:?}"
    );
}

#[tokio::test]
async fn leaderchanged_near_the_deadline_then_unavailable_is_timed_out() {
    let (timeout, settled) = (Duration::from_millis(500), Duration::from_millis(900));
    let fake = Fake::start(leaderchanged_until(
        Duration::from_millis(450),
        settled,
        || unavailable("db"),
    ))
    .await;
    let (a, took, t) = acquire_on(&fake, timeout, Duration::from_secs(5)).await;
    let a = a.unwrap();
    assert_eq!((a.outcome, a.fencing_token), (Outcome::TimedOut, None));
    assert!(took >= settled && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(t.last(), Some(&0.0), "{t:?}");
}

#[tokio::test]
async fn leaderchanged_past_the_deadline_and_the_budget_fails_saying_the_lease_may_hold() {
    let (timeout, budget) = (Duration::from_millis(300), Duration::from_millis(1500));
    let sends = Arc::new(Mutex::new(Vec::new()));
    let at = sends.clone();
    let fake = Fake::start(move |_| {
        at.lock().unwrap().push(Instant::now());
        err(LEADERCHANGED)
    })
    .await;
    let (a, took, t) = acquire_on(&fake, timeout, budget).await;
    let e = a.unwrap_err();
    assert!(e.is_timeout(), "{e}");
    assert!(e.to_string().contains("LEADERCHANGED"), "{e}");
    assert!(e.to_string().contains("may hold the permits"), "{e}");
    assert!(
        took >= timeout + budget - Duration::from_millis(50) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert!(t.iter().filter(|&&s| s == 0.0).count() >= 2, "{t:?}");
    // The pauses between sends: 50 ms, doubling, at most 500 ms (the last one cut to the end).
    let sends = sends.lock().unwrap();
    let gaps: Vec<u128> = sends
        .windows(2)
        .map(|w| (w[1] - w[0]).as_millis())
        .collect();
    assert!(gaps[0] >= 50 && gaps[0] < 100, "{gaps:?}");
    for (gap, least) in gaps.iter().zip([50, 100, 200, 400, 500]) {
        assert!(*gap >= least, "{gaps:?}");
    }
    assert!(gaps.iter().all(|&g| g < 700), "{gaps:?}");
    assert!(gaps.iter().filter(|&&g| g >= 450).count() >= 2, "{gaps:?}");
}

// --- bounded ------------------------------------------------------------------------------

#[tokio::test]
async fn clusterdown_until_the_deadline_times_the_acquire_out_in_bounded_time() {
    let fake = Fake::start(|_| err(CLUSTERDOWN)).await;
    let mut c = fake.conn().await;
    let start = Instant::now();
    let e = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_millis(600))
        .await
        .unwrap_err();
    let took = start.elapsed();
    assert!(e.is_timeout(), "{e}");
    assert!(e.to_string().contains("CLUSTERDOWN"), "{e}");
    assert!(e.to_string().contains("nothing was acquired"), "{e}");
    assert!(
        took >= Duration::from_millis(550) && took < Duration::from_secs(3),
        "{took:?}"
    );
    let t = timeouts(&fake.sent("SEM.ACQUIRE"), 5);
    assert!(t.len() >= 3, "re-sent until the deadline: {t:?}");
    assert!(t.windows(2).all(|w| w[1] <= w[0]), "{t:?}");

    // Other calls keep to the retry budget, then give the last error as it came.
    let sem = Semaphore {
        retry: Retry {
            budget: Duration::from_millis(300),
            ..Retry::default()
        },
        ..Semaphore::new("team", "db")
    };
    let start = Instant::now();
    let e = sem.release(&mut c, &lease(30)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::ClusterDown));
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(fake.sent("SEM.RELEASE").len() >= 3);
}

#[tokio::test]
async fn moved_on_a_plain_connection_ends_soon_saying_what_to_do() {
    let fake = Fake::start(|_| err("MOVED 8454 127.0.0.1:7002")).await;
    let mut c = fake.conn().await;
    let start = Instant::now();
    let e = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "not the whole timeout"
    );
    assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::Moved));
    assert_eq!(e.redirect_node(), Some(("127.0.0.1:7002", 8454)));
    assert!(e.to_string().contains("ClusterConnection"), "{e}");
    assert_eq!(fake.sent("SEM.ACQUIRE").len(), 4, "three re-sends");
}

// --- the heartbeat ------------------------------------------------------------------------

#[tokio::test]
async fn the_heartbeat_keeps_beating_through_clusterdown_and_a_dropped_connection() {
    let mut n = 0;
    let fake = Fake::start(move |_| {
        n += 1;
        match n {
            2..=4 => err(CLUSTERDOWN),
            5 => Answer::Drop,
            _ => lease_reply(),
        }
    })
    .await;
    let hb = Heartbeat::start(fake.client(), lease(2), Some(Duration::from_millis(200)));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!hb.is_lost(), "the window is shorter than the ttl");
    let refreshes = fake.sent("LEASE.REFRESH").len();
    assert!(
        refreshes >= 8,
        "refreshing again after the window: {refreshes}"
    );
}

#[tokio::test]
async fn the_heartbeat_reports_notfound_as_lost() {
    let fake =
        Fake::start(|_| err("NOTFOUND lease not found or expired in namespace 'team'")).await;
    let mut hb = Heartbeat::start(fake.client(), lease(30), Some(Duration::from_millis(100)));
    let reason = tokio::time::timeout(Duration::from_secs(3), hb.lost())
        .await
        .expect("reported");
    assert!(reason.contains("NOTFOUND"), "{reason}");
    assert_eq!(fake.sent("LEASE.REFRESH").len(), 1, "not re-sent");
}

#[tokio::test]
async fn the_heartbeat_follows_moved_to_the_leader() {
    let leader = Fake::start(|_| lease_reply()).await;
    let moved = format!("MOVED 8454 {}", leader.addr);
    let follower = Fake::start(move |_| err(&moved)).await;
    let hb = Heartbeat::start(
        follower.client(),
        lease(2),
        Some(Duration::from_millis(200)),
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!hb.is_lost());
    assert!(follower.sent("LEASE.REFRESH").len() <= 2);
    assert!(leader.sent("LEASE.REFRESH").len() >= 3);
}

// --- the redis crate's cluster connection -------------------------------------------------

/// A cluster connection to `fake`, with the redis crate's own retries or `retries`.
async fn cluster(fake: &Fake, retries: Option<u32>) -> redis::cluster_async::ClusterConnection {
    let builder = redis::cluster::ClusterClientBuilder::new(vec![format!("redis://{}", fake.addr)]);
    let builder = match retries {
        Some(n) => builder.retries(n),
        None => builder,
    };
    builder
        .build()
        .unwrap()
        .get_async_connection()
        .await
        .unwrap()
}

fn tryagain_once() -> impl FnMut(&[String]) -> Answer + Send + 'static {
    let mut n = 0;
    move |_| {
        n += 1;
        match n {
            1 => err("TRYAGAIN the new leader is not ready yet"),
            _ => acquired("db", 5),
        }
    }
}

#[tokio::test]
async fn a_cluster_connection_resends_the_first_timeout_itself_unless_built_with_no_retries() {
    // Its own retries: the library sleeps (at least 1.28 s) and re-sends the acquire as first
    // sent, with the whole timeout again; the helper never sees the TRYAGAIN.
    let fake = Fake::start(tryagain_once()).await;
    let mut c = cluster(&fake, None).await;
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(a.fencing_token, Some(5));
    assert_eq!(timeouts(&fake.sent("SEM.ACQUIRE"), 5), [2.0, 2.0]);

    // retries(0): the TRYAGAIN comes back to the helper, which re-sends with the time left.
    let fake = Fake::start(tryagain_once()).await;
    let mut c = cluster(&fake, Some(0)).await;
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(a.fencing_token, Some(5));
    let t = timeouts(&fake.sent("SEM.ACQUIRE"), 5);
    assert!(t.len() == 2 && t[1] < 2.0 - 0.04, "{t:?}");
}

#[tokio::test]
async fn a_cluster_connection_with_no_retries_finds_the_new_leader_for_the_helper() {
    let leader = Fake::start(|cmd| match cmd[0].as_str() {
        "SEM.ACQUIRE" => acquired("db", 12),
        _ => lease_reply(),
    })
    .await;
    let moved = format!("MOVED 8454 {}", leader.addr);
    let old = Fake::start(move |_| err(&moved)).await;
    let mut c = cluster(&old, Some(0)).await;
    // Leadership moves: the old node now names the new leader.
    *old.leader.lock().unwrap() = Some(leader.addr);
    let a = Semaphore::new("team", "db")
        .acquire(&mut c, &lease(30), 1, Duration::from_secs(2))
        .await
        .unwrap();
    assert_eq!(a.fencing_token, Some(12));
    let (before, after) = (old.sent("SEM.ACQUIRE"), leader.sent("SEM.ACQUIRE"));
    assert!(!before.is_empty() && before.len() <= 3, "{before:?}");
    assert_eq!(after.len(), 1);
    assert!(timeouts(&after, 5)[0] < 2.0, "sent with the time left");

    // A heartbeat on the cluster connection refreshes on the leader.
    let hb = Heartbeat::start_on(c.clone(), lease(2), Some(Duration::from_millis(100)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!hb.is_lost());
    assert!(leader.sent("LEASE.REFRESH").len() >= 2);
    assert!(old.sent("LEASE.REFRESH").is_empty());
}
