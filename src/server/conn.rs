//! One client connection: its transport (plain TCP or TLS), its buffers, reading requests and
//! writing replies in batches, the durability gate, parking, and moving between shard threads.
//! What a request does is not decided here: the connection hands each one to its [`Service`]
//! (dispatch.rs), as Dragonfly's connection hands commands to its service interface, so that
//! this file depends on no command and the service on this file alone.
//!
//! A parked acquire holds the commands behind it (as BLPOP does in Redis) while the connection
//! keeps watching its socket, so a client that goes away is dropped from the queue at once.
//!
//! A connection whose commands keep going to one other shard moves to that shard's thread
//! (between requests, with nothing buffered), so that its commands run inline there: a release
//! that frees permits and the grant it causes then wake no other thread.

use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

use super::clients::Unblock;
use super::gate::Gate;
use super::global::Global;
use super::msg::{Done, Durable, Moving, ShardMsg, ThreadMsg};
use super::session::Session;
use super::worker::ShardCtx;
use crate::engine::{Cancel, WaiterId};
use crate::error::Error;
use crate::protocol::{ProtocolError, Reply, RequestParser};

/// Replies are written once this much is buffered, even mid-pipeline.
const OUT_FLUSH: usize = 64 * 1024;

/// Room for one read into an empty read buffer, and for the replies to it. 8 KiB blocks live in
/// mimalloc's 64 KiB small pages (blocks up to 10 KiB), so a buffer alive after a disconnect
/// burst pins one of those, not a 512 KiB medium page. Bigger pipelines grow the buffers; they
/// are dropped once idle.
const BUF_START: usize = 8 * 1024;

/// Least room given to a read that continues a partial request.
const READ_MIN: usize = 1024;

/// Consecutive engine commands for one other shard (none for this one in between) after which
/// a connection moves there: a client that alternates between shards stays put, and one that
/// sends a few commands and leaves is not worth a move (which registers the socket with another
/// event loop and builds the connection again there).
pub const MOVE_AFTER: u32 = 32;

/// How long a TLS client may take to finish its handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection runs its requests through. Implemented by dispatch.rs's `Dispatch`; a
/// connection makes a new one when it starts on a thread (none of its state outlives a move).
pub(super) trait Service: Default {
    /// Runs one request, given as the words read.
    async fn command<S: Transport>(&mut self, conn: &mut Conn<S>, argv: Vec<Bytes>);

    /// Sends what the requests so far left waiting (a batch for another shard), and answers it.
    async fn flush<S: Transport>(&mut self, conn: &mut Conn<S>);

    /// Whether requests wait in a batch.
    fn batching(&self) -> bool;

    /// Whether a transaction is open.
    fn in_transaction(&self) -> bool;
}

/// Serves one accepted connection until it closes; `tls` connections first do the handshake.
pub(super) async fn serve<D: Service>(ctx: Rc<ShardCtx>, stream: TcpStream, tls: bool) {
    let (Ok(addr), Ok(laddr)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let g = ctx.global.clone();
    let session = || Session::new(&g.acl, g.clients.register(addr, laddr, fd, ctx.id));
    if !tls {
        let session = session();
        return serve_conn::<_, D>(Conn::new(ctx, stream, session)).await;
    }
    let Some(config) = g.tls.clone() else {
        return;
    };
    let handshake = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(s)) => {
            let session = session();
            serve_conn::<_, D>(Conn::new(ctx, s, session)).await
        }
        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
    }
}

/// Serves a connection that moved here from another shard thread.
pub(super) async fn resume<D: Service>(ctx: Rc<ShardCtx>, m: Moving) {
    let Moving { session, stream } = m;
    let stream = match TcpStream::from_std(stream) {
        Ok(s) => s,
        Err(e) => {
            // The socket could not join this thread's event loop, and is closed: it was
            // detached from the registry before it left the old thread, and dropping `session`
            // unregisters the client.
            let client = session.client().id();
            tracing::warn!(client, error = %e, "could not adopt a moving connection");
            return;
        }
    };
    session.registration().attach_socket();
    serve_conn::<_, D>(Conn::new(ctx, stream, session)).await;
}

/// A client's byte stream.
pub(super) trait Transport: AsyncRead + AsyncWrite + Unpin + Sized {
    /// Whether a connection on this stream can move to another shard thread.
    const MOVABLE: bool = false;

    /// The socket, taken off this thread's event loop to move to another one (`None`: it
    /// cannot move, or the event loop failed to let it go, and it is closed).
    fn into_std(self) -> Option<std::net::TcpStream> {
        None
    }

    /// Waits until a read may bring bytes, so that the read buffer gets its room only then. A
    /// stream that buffers inside (TLS) returns at once and its connections keep a read buffer.
    async fn wait_readable(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Transport for TcpStream {
    const MOVABLE: bool = true;

    fn into_std(self) -> Option<std::net::TcpStream> {
        TcpStream::into_std(self).ok()
    }

    async fn wait_readable(&self) -> std::io::Result<()> {
        self.readable().await
    }
}

impl Transport for tokio_rustls::server::TlsStream<TcpStream> {}

/// Reads what the client sent into `buf`, which gets room only once the stream is readable.
async fn fill<S: Transport>(stream: &mut S, buf: &mut BytesMut) -> std::io::Result<usize> {
    stream.wait_readable().await?;
    // Reserving reuses the buffer's room when the parsed requests are gone, else allocates.
    buf.reserve(if buf.is_empty() { BUF_START } else { READ_MIN });
    stream.read_buf(buf).await
}

/// Runs `conn` until it closes or moves to another shard thread.
async fn serve_conn<S: Transport, D: Service>(mut conn: Conn<S>) {
    let Some(to) = conn.run(&mut D::default()).await else {
        // Dropping `conn` unregisters the client, then closes the socket.
        return;
    };
    let g = conn.g.clone();
    let Conn {
        session, stream, ..
    } = conn;
    // Detached before it leaves the event loop: `into_std` closes the socket if it fails.
    session.registration().detach_socket();
    let Some(stream) = stream.into_std() else {
        return;
    };
    session.client().moves_to(to);
    let moving = Moving { session, stream };
    if let Err(unsent) = g.send(to, ThreadMsg::Moving(Box::new(moving))) {
        // The server is stopping: the connection closes, after it is unregistered.
        drop(unsent);
    }
}

/// A connection being served on this thread.
pub(super) struct Conn<S> {
    /// Declared first, so that it drops first: the client leaves the registry before `stream`
    /// closes its socket (see clients.rs).
    pub session: Session,
    stream: S,
    /// This thread's shard.
    pub ctx: Rc<ShardCtx>,
    /// Server-wide state.
    pub g: Arc<Global>,
    inbuf: BytesMut,
    out: BytesMut,
    parser: RequestParser,
    shutdown: watch::Receiver<bool>,
    /// The shard of the latest engine commands and how many in a row went there (counted only
    /// for another shard than this one).
    streak: (usize, u32),
    /// Holds the buffered replies until the changes they may show are durable.
    gate: Gate,
}

/// What a read brought.
enum Read {
    Data,
    Closed,
}

/// What woke a waiting connection.
enum Event {
    /// The parked acquire's reply (None: its sender went away).
    Reply(Option<Durable<Reply>>),
    /// Bytes or end of stream.
    Read(std::io::Result<usize>),
    /// A kill or CLIENT UNBLOCK.
    Wake,
    /// Server shutdown.
    Shutdown,
}

impl<S: Transport> Conn<S> {
    fn new(ctx: Rc<ShardCtx>, stream: S, session: Session) -> Conn<S> {
        let g = ctx.global.clone();
        Conn {
            session,
            shutdown: g.watch_shutdown(),
            streak: (ctx.id, 0),
            gate: Gate::new(g.shard_count()),
            ctx,
            g,
            stream,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            parser: RequestParser::default(),
        }
    }

    /// Serves requests until the connection closes (`None`) or is to move to another shard
    /// thread (`Some(shard)`).
    async fn run<D: Service>(&mut self, service: &mut D) -> Option<usize> {
        loop {
            if let Read::Closed = self.read().await {
                return None;
            }
            self.process(service).await;
            if self.write_out().await.is_err() || self.session.close {
                return None;
            }
            self.release_buffers();
            if let Some(to) = self.move_target(service) {
                return Some(to);
            }
        }
    }

    /// Counts an engine command for `shard` toward moving there.
    pub fn note_target(&mut self, shard: usize) {
        self.streak = match self.streak {
            (s, n) if s == shard && shard != self.ctx.id => (s, n.saturating_add(1)),
            _ => (shard, u32::from(shard != self.ctx.id)),
        };
    }

    /// The shard to move to, once the commands kept going there and nothing is in flight: the
    /// replies are written, no request is partly read, no transaction is open.
    fn move_target<D: Service>(&self, service: &D) -> Option<usize> {
        let (to, n) = self.streak;
        (S::MOVABLE
            && n >= MOVE_AFTER
            && to != self.ctx.id
            && !service.in_transaction()
            && self.inbuf.is_empty()
            && self.parser.is_idle()
            && !service.batching()
            && !self.session.client().is_killed()
            && !self.g.shutting_down())
        .then_some(to)
    }

    /// Drops the buffers' room before waiting on the client (the replies are written): most of
    /// many connections are idle, and a buffer that grew for one big pipeline or reply does not
    /// stay big. A partial request stays in the read buffer.
    fn release_buffers(&mut self) {
        if self.inbuf.is_empty() {
            self.inbuf = BytesMut::new();
        }
        self.out = BytesMut::new();
    }

    /// Waits for bytes or the idle timeout. CLIENT KILL and shutdown end this read by shutting
    /// the socket down, so the hot path waits on the socket alone (no timer unless `--timeout`).
    async fn read(&mut self) -> Read {
        if self.session.client().is_killed() || self.g.shutting_down() {
            return Read::Closed;
        }
        let r = match self.g.config.timeout {
            0 => fill(&mut self.stream, &mut self.inbuf).await,
            secs => {
                let read = fill(&mut self.stream, &mut self.inbuf);
                match tokio::time::timeout(Duration::from_secs(secs), read).await {
                    Ok(r) => r,
                    Err(_) => {
                        let client = self.session.client().id();
                        tracing::debug!(client, "closing idle client");
                        return Read::Closed;
                    }
                }
            }
        };
        match r {
            Ok(0) | Err(_) => Read::Closed,
            Ok(_) if self.over_query_limit() => Read::Closed,
            Ok(_) => Read::Data,
        }
    }

    /// Past the query-buffer limit the client gets an error and is disconnected.
    fn over_query_limit(&mut self) -> bool {
        let used = self.inbuf.len() + self.parser.pending_bytes();
        if used <= self.g.config.client_query_buffer_limit {
            return false;
        }
        tracing::warn!(
            client = self.session.client().id(),
            used,
            "closing client that reached the query buffer limit"
        );
        self.push(Reply::Error(Error::Err(
            "Protocol error: query buffer limit exceeded".into(),
        )));
        true
    }

    /// Writes the buffered replies once every change they may show is durable.
    async fn write_out(&mut self) -> std::io::Result<()> {
        let proto = self.session.proto();
        self.gate.settle(&self.g, &mut self.out, proto).await;
        if !self.out.is_empty() {
            let limit = self.g.config.client_output_timeout;
            if limit == 0 {
                self.stream.write_all(&self.out).await?;
            } else {
                let client = self.session.client().id();
                tokio::time::timeout(Duration::from_secs(limit), self.stream.write_all(&self.out))
                    .await
                    .map_err(|_| {
                        tracing::warn!(client, "closing client that stopped reading its replies");
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading")
                    })??;
            }
            self.out.clear();
        }
        Ok(())
    }

    /// Buffers a reply, encoded in the session's protocol.
    pub fn push(&mut self, r: Reply) {
        self.push_from(r, None);
    }

    /// Buffers a reply, of an engine request run on `shard` if given.
    fn push_from(&mut self, r: Reply, shard: Option<usize>) {
        let start = self.out.len();
        r.encode(self.session.proto(), &mut self.out);
        self.gate.buffered(start, self.out.len(), shard);
    }

    /// Runs every complete request in the input buffer.
    async fn process<D: Service>(&mut self, service: &mut D) {
        // The replies' room at once, rather than growing it from a few bytes reply by reply.
        self.out.reserve(BUF_START);
        while !self.session.close {
            let authed = self.session.is_authenticated();
            match self
                .parser
                .next(&mut self.inbuf, &self.g.request_limits, authed)
            {
                Ok(Some(argv)) => service.command(self, argv).await,
                Ok(None) => break,
                Err(ProtocolError(m)) => {
                    service.flush(self).await;
                    self.push(Reply::Error(Error::Err(format!("Protocol error: {m}"))));
                    self.session.close = true;
                }
            }
            if self.out.len() >= OUT_FLUSH && !service.batching() && self.write_out().await.is_err()
            {
                self.session.close = true;
            }
        }
        service.flush(self).await;
    }

    /// Records that the buffered replies may show changes up to `lsn` of `shard`.
    pub fn note(&mut self, shard: usize, lsn: u64) {
        self.gate.note(shard, lsn);
    }

    /// Buffers the reply of an engine request run on `shard`, waiting for it if it parked.
    pub async fn answer(&mut self, shard: usize, done: Done) {
        match done {
            Done::Reply(r) => self.push_from(r, Some(shard)),
            Done::Parked(rx, id) => match self.wait_parked(shard, id, rx).await {
                Some(r) => self.push_from(r, Some(shard)),
                None => self.session.close = true,
            },
        }
    }

    /// Waits for a parked acquire's reply while watching the socket, kills, CLIENT UNBLOCK and
    /// shutdown. `None` means the connection is to close (its waiter was removed).
    async fn wait_parked(
        &mut self,
        shard: usize,
        id: WaiterId,
        mut rx: oneshot::Receiver<Durable<Reply>>,
    ) -> Option<Reply> {
        if self.write_out().await.is_err() {
            self.cancel(shard, id, Cancel::Disconnected).await;
            return None;
        }
        self.release_buffers();
        let client = self.session.client().clone();
        self.session.registration().set_blocked(true);
        let result = loop {
            let ev = tokio::select! {
                r = &mut rx => Event::Reply(r.ok()),
                r = fill(&mut self.stream, &mut self.inbuf) => Event::Read(r),
                _ = client.woken() => Event::Wake,
                _ = self.shutdown.wait_for(|s| *s) => Event::Shutdown,
            };
            let gone = match ev {
                Event::Reply(Some(Durable { value, lsn })) => {
                    self.note(shard, lsn);
                    break Some(value);
                }
                Event::Reply(None) => break None,
                Event::Read(Ok(0) | Err(_)) | Event::Shutdown => true,
                Event::Read(Ok(_)) => self.over_query_limit(),
                Event::Wake if client.is_killed() => true,
                Event::Wake => {
                    if let Some(why) = client.take_unblock() {
                        let why = match why {
                            Unblock::Timeout => Cancel::UnblockTimeout,
                            Unblock::Error => Cancel::UnblockError,
                        };
                        // The reply (time-out, error, or a grant that came first) arrives on `rx`.
                        self.cancel(shard, id, why).await;
                    }
                    false
                }
            };
            if gone {
                self.cancel(shard, id, Cancel::Disconnected).await;
                break None;
            }
        };
        self.session.registration().set_blocked(false);
        result
    }

    /// Takes a parked acquire out of shard `shard`'s queue.
    async fn cancel(&self, shard: usize, waiter: WaiterId, why: Cancel) -> bool {
        if shard == self.ctx.id {
            return self.ctx.cancel(waiter, why);
        }
        let msg = |reply| ShardMsg::Cancel { waiter, why, reply };
        self.g.ask(shard, msg).await.unwrap_or(false)
    }
}
