//! The server's start and its front door: loading the data, starting the shard threads, and
//! the accept loop that hands each connection to one of them.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::acl::Acl;
use super::clients::is_local;
use super::global::Global;
use super::msg::ThreadMsg;
use super::topology::{NodeId, Topology};
use super::{cluster, fdlimit, metrics, thread, tls};
use crate::config::Config;
use crate::ratelimit::RateLimited;

/// Runs the server until SIGTERM, SIGINT or SHUTDOWN. A shard thread trims (see
/// [`crate::alloc::trim`]) after many of its connections closed, then the accepting thread does,
/// to give the allocator's free memory of each thread back to the OS.
pub fn run(mut config: Config) -> std::io::Result<()> {
    let addr: SocketAddr = format!("{}:{}", config.bind, config.port)
        .parse()
        .map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("--bind/--port: {e}"),
            )
        })?;
    // What CONFIG GET and INFO show from here on is the maxclients the limit allows.
    config.maxclients =
        fdlimit::fit(config.maxclients, config.shard_count()).map_err(std::io::Error::other)?;
    let acl = Acl::new(config.requirepass.clone(), config.aclfile.clone())
        .map_err(|e| std::io::Error::other(format!("--aclfile: {e}")))?;
    let tls = tls::server_config(&config)?;
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let tls_listener = match config.tls_port {
        Some(port) => {
            let l = std::net::TcpListener::bind((addr.ip(), port))?;
            l.set_nonblocking(true)?;
            tracing::info!(addr = %l.local_addr()?, "TLS port ready");
            Some(l)
        }
        None => None,
    };
    let metrics_listener = match config.metrics_port {
        Some(port) => {
            let l = std::net::TcpListener::bind((addr.ip(), port))?;
            l.set_nonblocking(true)?;
            tracing::info!(addr = %l.local_addr()?, "metrics ready: GET /metrics, GET /health");
            Some(l)
        }
        None => None,
    };
    let n = config.shard_count();
    // Before anything is written to --dir (loading writes a new generation of it): options
    // that do not fit together, and a --dir that is another node's, are refused leaving it
    // as it was; then a --dir another process serves, by its lock (held until we exit).
    let node_cfg = cluster::settings(&config, n).map_err(std::io::Error::other)?;
    cluster::check_dir(&config).map_err(std::io::Error::other)?;
    let _lock = crate::persist::lock::lock_dir(&config.dir).map_err(std::io::Error::other)?;
    let started = Instant::now();
    let loaded = crate::persist::load(&config.dir, n, config.repair_log).map_err(|e| {
        std::io::Error::other(format!(
            "cannot load the data in {}: {e}",
            config.dir.display()
        ))
    })?;
    tracing::info!(
        dir = %config.dir.display(),
        replayed = loaded.replayed,
        ms = started.elapsed().as_millis() as u64,
        "DB loaded from disk"
    );
    // Loading read whole files and built the state on this thread, which then mostly sleeps in
    // the accept loop: its freed buffers go back to the OS now or never.
    crate::alloc::trim();
    let mut inboxes = Vec::with_capacity(n);
    let mut senders = Vec::with_capacity(n);
    for _ in 0..n {
        let (tx, rx) = mpsc::unbounded_channel();
        senders.push(tx);
        inboxes.push(rx);
    }
    let tls_port = match &tls_listener {
        Some(l) => Some(l.local_addr()?.port()),
        None => None,
    };
    let id = NodeId::derive(&config.dir, local.port());
    let topology = Topology::single(id, local.port(), tls_port);
    let global = Arc::new(Global::new(
        config,
        acl,
        tls,
        local.port(),
        topology,
        senders,
    ));
    let node = match node_cfg {
        Some(mut cfg) => {
            cfg.wall = global.wall();
            cluster::check_no_single_node_data(&loaded.shards, &global.config.dir)
                .map_err(std::io::Error::other)?;
            cluster::record_id(&cfg.dir, cfg.id).map_err(std::io::Error::other)?;
            let node = crate::cluster::node::Node::start(cfg).map_err(std::io::Error::other)?;
            tracing::info!(addr = %node.raft_addr(), "cluster port ready");
            // Before the shards start: in cluster mode they replicate through it.
            global.set_cluster(node.handle().clone());
            Some(node)
        }
        None => None,
    };
    let mut threads = Vec::with_capacity(n);
    for ((id, rx), state) in inboxes.into_iter().enumerate().zip(loaded.shards) {
        let store = crate::persist::Store::open(
            &loaded.gen_dir,
            id,
            state.lsn,
            global.config.fsync,
            global.config.snapshot_threshold,
        )?;
        threads.push(thread::spawn(id, global.clone(), rx, state, store)?);
    }
    tracing::info!(addr = %local, shards = n, "Ready to accept connections");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    if let Some(node) = &node {
        let (g, handle) = (global.clone(), node.handle().clone());
        let port = local.port();
        rt.spawn(async move { cluster::follow_topology(&g, handle, port, tls_port).await });
        let (g, handle) = (global.clone(), node.handle().clone());
        rt.spawn(async move { cluster::stop_when_raft_fails(&g, handle).await });
    }
    // Scrapes are served beside the accept loop, on its thread, which mostly sleeps.
    if let Some(l) = metrics_listener {
        rt.spawn(metrics::serve(global.clone(), l));
    }
    rt.block_on(accept_loop(global.clone(), listener, tls_listener))?;
    if let Some(node) = node {
        if rt.block_on(cluster::hand_over(node.handle())) {
            rt.block_on(cluster::answer_parked(&global));
        }
        node.shutdown();
    }
    global.begin_shutdown();
    for t in threads {
        let _ = t.join();
    }
    if global.failed() {
        return Err(std::io::Error::other(
            "stopped after a failed write to the data directory",
        ));
    }
    tracing::info!("permitd is now ready to exit, bye bye...");
    Ok(())
}

/// Failed accepts (out of descriptors, say), logged at most once a second.
static ACCEPT_FAILED: RateLimited = RateLimited::new();

/// What a protected server answers a non-local client before closing.
const DENIED: &[u8] = b"-DENIED permitd is running in protected mode because the default user has no password: only connections from 127.0.0.1 and ::1 are accepted. To accept other clients, set a password (--requirepass, or users with --aclfile) or turn protected mode off (--protected-mode no), and bind to an address they can reach (--bind).\r\n";

/// Accepts connections (plain and TLS) and hands them round-robin to the shard threads, until
/// shutdown.
async fn accept_loop(
    global: Arc<Global>,
    listener: std::net::TcpListener,
    tls_listener: Option<std::net::TcpListener>,
) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let tls_listener = tls_listener
        .map(tokio::net::TcpListener::from_std)
        .transpose()?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut shutdown = global.watch_shutdown();
    let mut stop_asked = global.watch_stop_asked();
    let mut next = 0usize;
    loop {
        tokio::select! {
            _ = term.recv() => { tracing::info!("Received SIGTERM scheduling shutdown..."); break; }
            _ = int.recv() => { tracing::info!("Received SIGINT scheduling shutdown..."); break; }
            _ = shutdown.wait_for(|s| *s) => break,
            _ = stop_asked.wait_for(|s| *s) => break,
            _ = global.acceptor_trim_asked() => {
                crate::alloc::trim();
            }
            accepted = accept_either(&listener, tls_listener.as_ref()) => {
                let (accepted, tls) = accepted;
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // EMFILE and friends: back off briefly instead of spinning, and say
                        // so once a second, not at every try.
                        if let Some(more) = ACCEPT_FAILED.allow() {
                            tracing::warn!(error = %e, "accept failed{more}");
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                if global.config.protected_mode
                    && !is_local(peer.ip())
                    && global.acl.default_is_open()
                {
                    tracing::warn!(%peer, "protected mode: refused a non-local client");
                    let mut s = stream;
                    use tokio::io::AsyncWriteExt;
                    let _ = s.write_all(DENIED).await;
                    continue;
                }
                let Some(seat) = global.clients.seat(global.config.maxclients) else {
                    let mut s = stream;
                    use tokio::io::AsyncWriteExt;
                    let _ = s.write_all(b"-ERR max number of clients reached\r\n").await;
                    continue;
                };
                let _ = stream.set_nodelay(true);
                if global.config.tcp_keepalive > 0 {
                    let every = std::time::Duration::from_secs(global.config.tcp_keepalive);
                    let ka = socket2::TcpKeepalive::new().with_time(every).with_interval(every);
                    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&ka);
                }
                tracing::debug!(%peer, "accepted");
                match stream.into_std() {
                    Ok(std_stream) => {
                        let shard = next % global.shard_count();
                        next = next.wrapping_add(1);
                        let msg = ThreadMsg::Accepted { stream: std_stream, tls, seat };
                        let _ = global.send(shard, msg);
                    }
                    Err(e) => tracing::warn!(error = %e, "could not hand over a connection"),
                }
            }
        }
    }
    Ok(())
}

/// The next connection from either listener, and whether it came on the TLS one.
async fn accept_either(
    plain: &tokio::net::TcpListener,
    tls: Option<&tokio::net::TcpListener>,
) -> (std::io::Result<(tokio::net::TcpStream, SocketAddr)>, bool) {
    match tls {
        None => (plain.accept().await, false),
        Some(t) => tokio::select! {
            r = plain.accept() => (r, false),
            r = t.accept() => (r, true),
        },
    }
}
