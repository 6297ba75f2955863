//! The Rust client helper (`permitd_client`) against a real server over real sockets.

mod common;

use std::time::Duration;

use common::{active_holds, call, ok, setup, Server};
use permitd_client::{Heartbeat, Lease, Outcome, Semaphore};

/// A connection whose response timeout is above any acquire timeout used here.
async fn conn(server: &Server) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(None);
    server
        .client()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect")
}

#[tokio::test]
async fn with_permit_runs_the_work_with_a_token_and_always_releases() {
    let server = Server::start();
    setup(&mut server.conn(), "team", "db", 2);
    let mut c = conn(&server).await;
    let lease = Lease::create(&mut c, "team", "worker-1", 30).await.unwrap();
    assert!(lease.id.starts_with("ls_") && lease.id.len() == 31);
    let db = Semaphore::new("team", "db");
    let srv = &server;
    let seen = db
        .with_permit(
            &mut c,
            &lease,
            2,
            Duration::from_secs(1),
            |token| async move {
                // While the work runs, the permits are held.
                (token, active_holds(&mut srv.conn(), "team", "db"))
            },
        )
        .await
        .unwrap()
        .expect("acquired");
    assert!(seen.0 > 0, "a fencing token is handed to the work");
    assert_eq!(seen.1, 2, "held during the work");
    assert_eq!(
        active_holds(&mut server.conn(), "team", "db"),
        0,
        "released after the work"
    );
}

#[tokio::test]
async fn acquire_reports_unavailable_and_timed_out_without_running_work() {
    let server = Server::start();
    setup(&mut server.conn(), "team", "db", 1);
    let mut c = conn(&server).await;
    let holder = Lease::create(&mut c, "team", "a", 30).await.unwrap();
    let other = Lease::create(&mut c, "team", "b", 30).await.unwrap();
    let db = Semaphore::new("team", "db");
    let a = db
        .acquire(&mut c, &holder, 1, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Acquired);
    assert_eq!((a.active_holds, a.permits), (1, 1));
    let b = db.acquire(&mut c, &other, 1, Duration::ZERO).await.unwrap();
    assert_eq!((b.outcome, b.fencing_token), (Outcome::Unavailable, None));
    let ran = db
        .with_permit(&mut c, &other, 1, Duration::from_millis(300), |_| async {
            1
        })
        .await
        .unwrap();
    assert_eq!(
        ran, None,
        "not acquired within the timeout: the work does not run"
    );
    assert_eq!(
        active_holds(&mut server.conn(), "team", "db"),
        1,
        "the holder keeps its permit"
    );
}

#[tokio::test]
async fn heartbeat_keeps_a_lease_alive_and_reports_its_loss() {
    let server = Server::start();
    setup(&mut server.conn(), "team", "db", 1);
    let mut c = conn(&server).await;
    let lease = Lease::create(&mut c, "team", "worker-1", 1).await.unwrap();
    let db = Semaphore::new("team", "db");
    db.acquire(&mut c, &lease, 1, Duration::ZERO).await.unwrap();
    let mut hb = Heartbeat::start(server.client(), lease.clone(), None);
    // Three ttls later the lease and its hold are still there.
    tokio::time::sleep(Duration::from_millis(3200)).await;
    assert!(!hb.is_lost());
    let mut sync = server.conn();
    assert!(call(&mut sync, &["LEASE.GET", "team", &lease.id]).is_ok());
    assert_eq!(active_holds(&mut server.conn(), "team", "db"), 1);
    // Revoked elsewhere: the next refresh finds it gone and reports it.
    ok(&mut sync, &["LEASE.REVOKE", "team", &lease.id]);
    let reason = tokio::time::timeout(Duration::from_secs(5), hb.lost())
        .await
        .expect("the loss is reported within a few refresh periods");
    assert!(reason.contains("NOTFOUND"), "{reason}");
    assert!(hb.is_lost());
}

#[tokio::test]
async fn without_a_heartbeat_the_lease_expires() {
    let server = Server::start();
    setup(&mut server.conn(), "team", "db", 1);
    let mut c = conn(&server).await;
    let lease = Lease::create(&mut c, "team", "worker-1", 1).await.unwrap();
    Semaphore::new("team", "db")
        .acquire(&mut c, &lease, 1, Duration::ZERO)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        active_holds(&mut server.conn(), "team", "db"),
        0,
        "the expired lease's permit is free"
    );
    assert!(lease.refresh(&mut c).await.is_err());
}

#[tokio::test]
async fn with_permits_takes_every_semaphore_or_none_and_releases_them() {
    let server = Server::start();
    setup(&mut server.conn(), "team", "db", 2);
    ok(&mut server.conn(), &["SEM.CREATE", "team", "cache", "1"]);
    let mut c = conn(&server).await;
    let lease = Lease::create(&mut c, "team", "worker-1", 30).await.unwrap();
    let other = Lease::create(&mut c, "team", "worker-2", 30).await.unwrap();
    let (db, cache) = (
        Semaphore::new("team", "db"),
        Semaphore::new("team", "cache"),
    );
    let parts = [(&cache, 1), (&db, 2)];
    let srv = &server;
    let seen = Semaphore::with_permits(
        &mut c,
        &lease,
        &parts,
        Duration::from_secs(1),
        |t| async move {
            let holds = (
                active_holds(&mut srv.conn(), "team", "db"),
                active_holds(&mut srv.conn(), "team", "cache"),
            );
            (t, holds)
        },
    )
    .await
    .unwrap()
    .expect("acquired");
    assert_eq!(seen.0.len(), 2);
    assert!(seen.0[0] < seen.0[1], "tokens in the order asked");
    assert_eq!(seen.1, (2, 1), "both held during the work");
    assert_eq!(active_holds(&mut server.conn(), "team", "db"), 0);
    assert_eq!(active_holds(&mut server.conn(), "team", "cache"), 0);

    // db fits, cache does not: nothing is taken and the work does not run.
    cache
        .acquire(&mut c, &lease, 1, Duration::ZERO)
        .await
        .unwrap();
    let a = Semaphore::acquire_all(&mut c, &other, &[(&db, 1), (&cache, 1)], Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Unavailable);
    assert_eq!(a.fencing_tokens, vec![None, None]);
    let ran = Semaphore::with_permits(
        &mut c,
        &other,
        &[(&db, 1), (&cache, 1)],
        Duration::from_millis(200),
        |_| async { panic!("the work must not run") },
    )
    .await
    .unwrap();
    assert_eq!(ran, None::<()>);
    assert_eq!(active_holds(&mut server.conn(), "team", "db"), 0);
}
