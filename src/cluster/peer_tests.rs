//! The cluster port's defences (SPEC §10, §17), in one test process: mutual TLS carries frames
//! and refuses a stranger's certificate, a certificate for another host, a peer speaking in the
//! clear and a record altered on the way; a node without the cluster's secret or certificate is
//! refused while the cluster goes on; three nodes over TLS replicate and fail over.

#[allow(dead_code)]
#[path = "../../tests/common/pki.rs"]
pub(crate) mod pki;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::auth::Secret;
use super::config::{ClusterConfig, Timing};
use super::network::Network;
use super::node::Role;
use super::test_cluster::*;
use super::tests::TempDir;
use super::tls::{is_tls_error, Transport};
use super::wire::{recv, send, Piece, MAX_FRAME};
use super::Peer;

/// Mutual TLS of a CA of its own, `name`'s, with a certificate for `sans` (files in `dir`).
fn tls(dir: &TempDir, name: &str, sans: &[&str]) -> Transport {
    let [cert, key, ca] = pki::peer_files(&dir.0, name, sans);
    Transport::tls(&cert, &key, &ca).unwrap()
}

fn piece(text: &str) -> Piece {
    Piece::Data {
        name: "f".into(),
        bytes: Bytes::from(text.to_string()),
    }
}

fn text(p: Piece) -> String {
    match p {
        Piece::Data { bytes, .. } => String::from_utf8(bytes.to_vec()).unwrap(),
        Piece::Done => panic!("a piece with no bytes"),
    }
}

/// Accepts every connection over `transport` and echoes its pieces; how each connection
/// ended (`Ok` at the dialer's close) goes to the receiver.
async fn echo_server(transport: Transport) -> (u16, mpsc::UnboundedReceiver<std::io::Result<()>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let (transport, tx) = (transport.clone(), tx.clone());
            tokio::spawn(async move {
                let served = async {
                    let mut conn = transport.accept(tcp).await?;
                    loop {
                        match recv::<Piece>(&mut conn, MAX_FRAME).await {
                            Ok(p) => send(&mut conn, &p).await?,
                            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                                return Ok(())
                            }
                            Err(e) => return Err(e),
                        }
                    }
                };
                let _ = tx.send(served.await);
            });
        }
    });
    (port, rx)
}

/// Sends `what` over a connection dialed to `addr` over `transport`, and reads the echo.
async fn round_trip(transport: &Transport, addr: &str, what: &str) -> std::io::Result<String> {
    let tcp = TcpStream::connect(addr.replace("localhost", "127.0.0.1")).await?;
    let mut conn = transport.dial(tcp, addr).await?;
    send(&mut conn, &piece(what)).await?;
    Ok(text(recv(&mut conn, MAX_FRAME).await?))
}

#[tokio::test]
async fn mutual_tls_carries_frames_and_refuses_strangers() {
    let dir = TempDir::new("tls-transport");
    let cluster = tls(&dir, "cluster", &["127.0.0.1"]);
    let (port, mut ended) = echo_server(cluster.clone()).await;
    let addr = format!("127.0.0.1:{port}");
    assert_eq!(round_trip(&cluster, &addr, "hello").await.unwrap(), "hello");
    assert!(ended.recv().await.unwrap().is_ok());

    // A certificate of another CA: the dialer trusts no listener of the cluster's.
    let stranger = tls(&dir, "stranger", &["127.0.0.1"]);
    let err = round_trip(&stranger, &addr, "x").await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("TLS"), "{err}");
    assert!(ended.recv().await.unwrap().is_err());

    // The stranger's certificate with the cluster's CA trusted: the listener refuses it, and
    // the dialer gets no answer.
    let impostor = Transport::tls(
        &dir.0.join("stranger.pem"),
        &dir.0.join("stranger-key.pem"),
        &dir.0.join("cluster-ca.pem"),
    )
    .unwrap();
    assert!(round_trip(&impostor, &addr, "x").await.is_err());
    let err = ended.recv().await.unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");

    // A certificate that does not name the host dialed.
    let err = round_trip(&cluster, &format!("localhost:{port}"), "x")
        .await
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    assert!(ended.recv().await.unwrap().is_err());

    // A peer in the clear.
    assert!(round_trip(&Transport::Plain, &addr, "x").await.is_err());
    assert!(ended.recv().await.unwrap().is_err());
}

/// A relay from a listener of its own to `to` that, once `tamper` is set, flips a bit of the
/// next chunk it passes towards `to`.
async fn tampering_relay(to: String, tamper: Arc<AtomicBool>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let (dialer, _) = listener.accept().await.unwrap();
        let target = TcpStream::connect(to).await.unwrap();
        let (mut dr, mut dw) = dialer.into_split();
        let (mut tr, mut tw) = target.into_split();
        tokio::spawn(async move { tokio::io::copy(&mut tr, &mut dw).await });
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match dr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if tamper.swap(false, Ordering::SeqCst) {
                buf[n - 1] ^= 1;
            }
            if tw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    });
    port
}

#[tokio::test]
async fn a_record_altered_on_the_way_is_refused_and_the_connection_reset() {
    let dir = TempDir::new("tls-tamper");
    for transport in [tls(&dir, "cluster", &["127.0.0.1"]), Transport::Plain] {
        let (port, mut ended) = echo_server(transport.clone()).await;
        let tamper = Arc::new(AtomicBool::new(false));
        let relay = tampering_relay(format!("127.0.0.1:{port}"), tamper.clone()).await;
        let tcp = TcpStream::connect(("127.0.0.1", relay)).await.unwrap();
        let mut conn = transport.dial(tcp, "127.0.0.1:0").await.unwrap();
        send(&mut conn, &piece("intact")).await.unwrap();
        assert_eq!(text(recv(&mut conn, MAX_FRAME).await.unwrap()), "intact");
        tamper.store(true, Ordering::SeqCst);
        send(&mut conn, &piece("altered")).await.unwrap();
        // The last byte is the payload's in the clear (a frame's CRC32C catches that much), and
        // the record's authentication tag's in TLS: refused either way, never echoed.
        let err = ended.recv().await.unwrap().unwrap_err();
        assert_eq!(is_tls_error(&err), transport.is_tls(), "{err}");
        assert!(recv::<Piece>(&mut conn, MAX_FRAME).await.is_err());
    }
}

/// Node `outsider` of the running cluster `c` comes back with `strange` settings: no peer
/// talks to it, the leader and its elections are undisturbed, and dialing the leader with them
/// is refused with `why`; with its own settings again it catches up. The cluster, all caught up.
fn an_outsider_is_refused(
    mut c: Cluster,
    strange: impl Fn(&mut ClusterConfig),
    why: &str,
) -> Cluster {
    c.start_all();
    let (leader, lid, _) = c.wait_leader(WAIT);
    let last = c.write(leader, lid, namespaces("before", 5));
    c.wait_same_state(last);

    let outsider = c.running().into_iter().find(|&id| id != leader).unwrap();
    c.stop(outsider);
    let own = c.configs[outsider as usize - 1].clone();
    strange(&mut c.configs[outsider as usize - 1]);
    c.start(outsider);
    let last = c.write(leader, lid, namespaces("after", 10));
    std::thread::sleep(Duration::from_secs(3));
    let ls = c.status(leader);
    assert_eq!(ls.role, Role::Leader);
    assert_eq!(
        ls.leader_id,
        Some(lid),
        "the outsider disturbed no election"
    );
    assert!(ls.committed >= Some(last));
    let os = c.status(outsider);
    assert!(os.applied < Some(last), "{os:?}");
    assert_ne!(os.role, Role::Leader);

    // Dialing a node with those settings is refused, and says why.
    let peer = Peer {
        raft_addr: c.node(leader).raft_addr().to_string(),
        client_addr: String::new(),
    };
    let mut net = Network::of(&c.configs[outsider as usize - 1]);
    let client = net.client(leader, &peer);
    let err = block_on(async move { client.initialized(WAIT).await }).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied);
    assert!(err.to_string().contains(why), "{err}");

    c.stop(outsider);
    c.configs[outsider as usize - 1] = ClusterConfig { init: None, ..own };
    c.start(outsider);
    c.wait_same_state(last);
    c
}

#[test]
fn a_node_with_the_wrong_secret_is_refused_and_the_cluster_goes_on() {
    an_outsider_is_refused(
        Cluster::new("secret", 3, Timing::default()),
        |c| c.secret = Secret::new("not the secret"),
        "does not know the cluster secret",
    );
}

/// Three nodes over mutual TLS replicate, refuse a node whose certificate another CA signed,
/// and fail over.
#[test]
fn over_tls_a_certificate_of_another_ca_is_refused_and_the_cluster_fails_over() {
    let dir = TempDir::new("tls-pki");
    let cluster = tls(&dir, "cluster", &["127.0.0.1"]);
    let stranger = tls(&dir, "stranger", &["127.0.0.1"]);
    let mut c = Cluster::new("tls", 3, Timing::default());
    for cfg in &mut c.configs {
        cfg.transport = cluster.clone();
    }
    let mut c = an_outsider_is_refused(c, |c| c.transport = stranger.clone(), "TLS");

    let (leader, _, _) = c.wait_leader(WAIT);
    c.stop(leader);
    let (new_leader, lid, _) = c.wait_leader(FAILOVER);
    assert_ne!(new_leader, leader);
    let last = c.write(new_leader, lid, namespaces("failed-over", 5));
    c.wait_same_state(last);
}
