//! One client connection: its transport (plain TCP or TLS), its buffers, reading requests and
//! writing replies in batches, the durability gate, parking, and moving between shard threads.
//! What a request does is not decided here: the connection hands each one to its [`Service`]
//! (dispatch.rs), as Dragonfly's connection hands commands to its service interface, so that
//! this file depends on no command and the service on this file alone.
//!
//! A connection keeps reading while its replies wait to be written, as Redis does: a client may
//! write a whole pipeline before it reads a reply (redis-py does), and one that stopped both
//! reading and writing would otherwise wait on each other for ever. What waits is bounded:
//! replies past `--client-output-buffer-limit` close the client (Redis's hard limit), requests
//! past `--client-query-buffer-limit` too, and replies nobody reads for
//! `--client-output-timeout` seconds as well.
//!
//! A parked acquire holds the commands behind it (as BLPOP does in Redis) while the connection
//! keeps watching its socket, so a client that goes away is dropped from the queue at once.
//!
//! A connection whose commands keep going to one other shard moves to that shard's thread
//! (between requests, with nothing buffered), so that its commands run inline there: a release
//! that frees permits and the grant it causes then wake no other thread.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::clients::Seat;
use super::gate::Gate;
use super::global::Global;
use super::msg::{Done, Durable, Moving, ShardMsg, ThreadMsg};
use super::session::Session;
use super::worker::ShardCtx;
use crate::engine::{Cancel, WaiterId};
use crate::error::Error;
use crate::protocol::{ProtocolError, Reply, RequestParser};

/// Replies are written once this much more is buffered, even mid-pipeline; a batch for another
/// shard comes back in pieces of about this size (dispatch.rs).
pub const OUT_FLUSH: usize = 64 * 1024;

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
pub(super) async fn serve<D: Service>(ctx: Rc<ShardCtx>, stream: TcpStream, tls: bool, seat: Seat) {
    let (Ok(addr), Ok(laddr)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let g = ctx.global.clone();
    let session = || Session::new(&g.acl, g.clients.register(seat, addr, laddr, fd, ctx.id));
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

    /// Ready once a read may bring bytes, so that the read buffer gets its room only then. A
    /// stream that buffers inside (TLS) is always ready and its connections keep a read buffer.
    fn poll_readable(&self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Transport for TcpStream {
    const MOVABLE: bool = true;

    fn into_std(self) -> Option<std::net::TcpStream> {
        TcpStream::into_std(self).ok()
    }

    fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready(cx)
    }
}

impl Transport for tokio_rustls::server::TlsStream<TcpStream> {}

/// Reads what the client sent into `buf`, which gets room only once the stream is readable.
fn poll_fill<S: Transport>(
    stream: &mut S,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    ready!(stream.poll_readable(cx))?;
    // Reserving reuses the buffer's room when the parsed requests are gone, else allocates.
    buf.reserve(if buf.is_empty() { BUF_START } else { READ_MIN });
    tokio_util::io::poll_read_buf(Pin::new(stream), cx, buf)
}

/// What the socket did while a connection waited on it with replies to write.
enum Io {
    /// A read brought bytes (`Ok(n)`, n > 0), the end of the stream (`Ok(0)`), or an error.
    Read(io::Result<usize>),
    /// Some replies were written (all of them once `out` is empty), or writing failed.
    Wrote(io::Result<()>),
}

/// Writes `out` as far as the socket takes it now, then flushes the stream (a TLS stream may
/// keep records it could not send yet). Ready once it made progress (or failed), pending when
/// the socket takes nothing now.
fn poll_send<S: Transport>(
    stream: &mut S,
    out: &mut BytesMut,
    unflushed: &mut bool,
    cx: &mut Context<'_>,
) -> Poll<io::Result<()>> {
    let mut progress = false;
    loop {
        let step = if !out.is_empty() {
            match Pin::new(&mut *stream).poll_write(cx, out) {
                Poll::Ready(Ok(0)) => Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => {
                    out.advance(n);
                    *unflushed = true;
                    Poll::Ready(Ok(()))
                }
                other => other.map_ok(drop),
            }
        } else if *unflushed {
            let flushed = Pin::new(&mut *stream).poll_flush(cx);
            if let Poll::Ready(Ok(())) = flushed {
                *unflushed = false;
            }
            flushed
        } else {
            break;
        };
        match step {
            Poll::Ready(Ok(())) => progress = true,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => break,
        }
    }
    if progress {
        Poll::Ready(Ok(()))
    } else {
        Poll::Pending
    }
}

/// Reads what the client sends into `inbuf` while writing `out` as the socket takes it.
/// Resolves when a read ends or a write made progress, so that the caller sees each of them.
async fn pump<S: Transport>(
    stream: &mut S,
    inbuf: &mut BytesMut,
    out: &mut BytesMut,
    unflushed: &mut bool,
) -> Io {
    poll_fn(|cx| {
        if !out.is_empty() || *unflushed {
            if let Poll::Ready(r) = poll_send(stream, out, unflushed, cx) {
                return Poll::Ready(Io::Wrote(r));
            }
        }
        poll_fill(stream, inbuf, cx).map(Io::Read)
    })
    .await
}

/// Reads what the client sent into `buf` (with no replies to write).
/// The next MONITOR line (`None` once the monitor is dropped).
async fn next_line(monitor: &mut Option<mpsc::Receiver<Bytes>>) -> Option<Bytes> {
    match monitor {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn fill<S: Transport>(stream: &mut S, buf: &mut BytesMut) -> io::Result<usize> {
    poll_fn(|cx| poll_fill(stream, buf, cx)).await
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
    /// Encoded replies not written yet. Whenever the connection waits on its socket, the fate
    /// of every change they show is known (the gate settled them): only `send` and `finish`
    /// write, after settling.
    out: BytesMut,
    /// `out`'s length after the last write (what was left then), to write again only once
    /// another `OUT_FLUSH` came on top.
    sent: usize,
    /// Bytes went to the stream since it was last flushed.
    unflushed: bool,
    parser: RequestParser,
    shutdown: watch::Receiver<bool>,
    /// The shard of the latest engine commands and how many in a row went there (counted only
    /// for another shard than this one).
    streak: (usize, u32),
    /// Holds the buffered replies until the changes they may show are durable.
    gate: Gate,
    /// After MONITOR: the lines of the commands the server runs, written as they come.
    pub monitor: Option<mpsc::Receiver<Bytes>>,
    /// Time the command being run spent not running: parked, or waiting on an earlier
    /// command's batch (the slow log leaves it out).
    pub not_running: Duration,
}

/// What a read brought.
enum Read {
    Data,
    /// The connection is to close, once it wrote what it still owes (if it can).
    Closed,
}

/// What woke a waiting connection.
enum Event {
    /// The parked acquire's reply (None: its sender went away).
    Reply(Option<Durable<Reply>>),
    /// The socket.
    Io(Io),
    /// A kill.
    Wake,
    /// Server shutdown.
    Shutdown,
    /// Replies waited `--client-output-timeout` without a byte written.
    Stalled,
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
            sent: 0,
            unflushed: false,
            parser: RequestParser::default(),
            monitor: None,
            not_running: Duration::ZERO,
        }
    }

    /// Serves requests until the connection closes (`None`) or is to move to another shard
    /// thread (`Some(shard)`).
    async fn run<D: Service>(&mut self, service: &mut D) -> Option<usize> {
        loop {
            if let Read::Closed = self.read().await {
                self.finish().await;
                return None;
            }
            self.process(service).await;
            if self.session.close || !self.send().await {
                self.finish().await;
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
            && !self.writing()
            && self.parser.is_idle()
            && !service.batching()
            && !self.session.client().is_killed()
            && self.monitor.is_none()
            && !self.g.shutting_down())
        .then_some(to)
    }

    /// Drops the buffers' room before waiting on the client: most of many connections are
    /// idle, and a buffer that grew for one big pipeline or reply does not stay big. A partial
    /// request stays in the read buffer, and replies not written yet stay too.
    fn release_buffers(&mut self) {
        if self.inbuf.is_empty() {
            self.inbuf = BytesMut::new();
        }
        if self.out.is_empty() {
            self.out = BytesMut::new();
        }
    }

    /// Whether replies wait to go out.
    fn writing(&self) -> bool {
        !self.out.is_empty() || self.unflushed
    }

    /// Forgets the replies not written: the connection closes without them.
    fn discard_output(&mut self) {
        self.out.clear();
        self.unflushed = false;
    }

    /// Closes a client that does not read its replies, without them.
    fn drop_output(&mut self, why: &str) {
        let client = self.session.client().id();
        let unwritten = self.out.len();
        tracing::warn!(client, unwritten, "closing client that {why}");
        self.discard_output();
    }

    /// Waits for bytes or the idle timeout, writing the replies that wait meanwhile. CLIENT KILL
    /// and shutdown end this read by shutting the socket down, so the hot path (nothing to
    /// write) waits on the socket alone (no timer unless `--timeout`).
    async fn read(&mut self) -> Read {
        if self.session.client().is_killed() || self.g.shutting_down() {
            return Read::Closed;
        }
        let idle = self.g.config.timeout;
        let stall = self.g.config.client_output_timeout;
        let r = loop {
            if !self.writing() && idle == 0 && self.monitor.is_none() {
                break fill(&mut self.stream, &mut self.inbuf).await;
            }
            // Both timers start again once a write made progress: a client that reads its
            // replies, however slowly, is neither idle nor stalled.
            let io = tokio::select! {
                io = pump(&mut self.stream, &mut self.inbuf, &mut self.out, &mut self.unflushed) => io,
                _ = tokio::time::sleep(Duration::from_secs(stall)), if self.writing() && stall > 0 => {
                    self.drop_output("stopped reading its replies");
                    return Read::Closed;
                }
                _ = tokio::time::sleep(Duration::from_secs(idle)), if idle > 0 && self.monitor.is_none() => {
                    let client = self.session.client().id();
                    tracing::debug!(client, "closing idle client");
                    return Read::Closed;
                }
                line = next_line(&mut self.monitor), if self.monitor.is_some() => {
                    // None: the monitor fell too far behind and was dropped.
                    let Some(line) = line else {
                        self.drop_output("fell behind as a monitor");
                        return Read::Closed;
                    };
                    let start = self.out.len();
                    self.out.extend_from_slice(&line);
                    self.gate.buffered(start, self.out.len(), None);
                    let limit = self.g.config.client_output_buffer_limit;
                    if limit > 0 && self.out.len() > limit {
                        self.drop_output("reached the output buffer limit as a monitor");
                        return Read::Closed;
                    }
                    continue;
                }
            };
            match io {
                Io::Read(r) => break r,
                Io::Wrote(Ok(())) => self.release_buffers(),
                Io::Wrote(Err(_)) => {
                    self.discard_output();
                    return Read::Closed;
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

    /// Waits until the fate of every change the buffered replies may show is known (a reply
    /// that shows a change rolled back becomes its error: see gate.rs).
    async fn settle(&mut self) {
        let proto = self.session.proto();
        self.gate.settle(&self.g, &mut self.out, proto).await;
    }

    /// Writes what the socket takes now of the buffered replies, once the changes they may show
    /// are settled; the rest goes out while the connection reads on. False when the
    /// connection is to close: writing failed, or the replies not written passed the output
    /// buffer limit (they are dropped, as Redis drops a client past its hard limit).
    async fn send(&mut self) -> bool {
        self.settle().await;
        // What the socket takes now: nothing here waits for the client.
        let wrote = poll_fn(|cx| {
            while self.writing() {
                match poll_send(&mut self.stream, &mut self.out, &mut self.unflushed, cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
            }
            Poll::Ready(Ok(()))
        })
        .await;
        self.sent = self.out.len();
        if wrote.is_err() {
            self.discard_output();
            return false;
        }
        let limit = self.g.config.client_output_buffer_limit;
        if limit > 0 && self.out.len() > limit {
            self.drop_output("reached the output buffer limit");
            return false;
        }
        true
    }

    /// Sends the buffered replies (see [`Conn::send`]) once another [`OUT_FLUSH`] of them came
    /// since the last time. False when the connection is to close (and then marked so).
    pub async fn send_some(&mut self) -> bool {
        if self.out.len() < self.sent + OUT_FLUSH {
            return true;
        }
        let sent = self.send().await;
        if !sent {
            self.session.close = true;
        }
        sent
    }

    /// Writes what the connection still owes before it closes (a client may send a pipeline and
    /// close its side at once), for `--client-output-timeout` at most; it reads nothing more.
    async fn finish(&mut self) {
        if !self.writing() {
            return;
        }
        self.settle().await;
        let write = async {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await
        };
        // A failed write needs no word: the client is gone.
        let ended = match self.g.config.client_output_timeout {
            0 => Some(write.await),
            secs => tokio::time::timeout(Duration::from_secs(secs), write)
                .await
                .ok(),
        };
        if ended.is_none() {
            self.drop_output("stopped reading its replies");
        }
        self.discard_output();
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

    /// Buffers replies of engine requests run on `shard`, already encoded in the session's
    /// protocol (a batch's, by its shard): `replies`, each ending at one of `ends`.
    pub fn push_encoded(&mut self, shard: usize, replies: &[u8], ends: &[usize]) {
        let base = self.out.len();
        self.out.extend_from_slice(replies);
        let mut start = base;
        for &end in ends {
            self.gate.buffered(start, base + end, Some(shard));
            start = base + end;
        }
    }

    /// Runs every complete request in the input buffer (none more once the client is killed).
    async fn process<D: Service>(&mut self, service: &mut D) {
        // The replies' room at once, rather than growing it from a few bytes reply by reply.
        self.out.reserve(BUF_START);
        self.sent = self.out.len();
        while !self.session.close && !self.session.client().is_killed() {
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
            if !service.batching() && !self.send_some().await {
                break;
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
            Done::Killed => self.session.close = true,
        }
    }

    /// Waits for a parked acquire's reply while watching the socket (reading, and writing the
    /// replies before it), kills and shutdown. CLIENT UNBLOCK ends the wait on the unblocker's
    /// side (dispatch.rs): its reply comes on `rx`. `None` means the connection is to close (its
    /// waiter was removed).
    async fn wait_parked(
        &mut self,
        shard: usize,
        id: WaiterId,
        mut rx: oneshot::Receiver<Durable<Reply>>,
    ) -> Option<Reply> {
        let client = self.session.client().clone();
        if !self.send().await {
            self.cancel(shard, id, Cancel::Disconnected).await;
            client.parking().unpark(id);
            return None;
        }
        self.release_buffers();
        let stall = self.g.config.client_output_timeout;
        let parked = Instant::now();
        self.session.registration().set_blocked(true);
        let result = loop {
            let writing = self.writing();
            let ev = tokio::select! {
                r = &mut rx => Event::Reply(r.ok()),
                io = pump(&mut self.stream, &mut self.inbuf, &mut self.out, &mut self.unflushed) => Event::Io(io),
                _ = client.woken() => Event::Wake,
                _ = self.shutdown.wait_for(|s| *s) => Event::Shutdown,
                _ = tokio::time::sleep(Duration::from_secs(stall)), if writing && stall > 0 => Event::Stalled,
            };
            let gone = match ev {
                Event::Reply(Some(Durable { value, lsn })) => {
                    self.note(shard, lsn);
                    break Some(value);
                }
                Event::Reply(None) => break None,
                Event::Io(Io::Read(Ok(0) | Err(_))) | Event::Shutdown => true,
                Event::Io(Io::Read(Ok(_))) => self.over_query_limit(),
                Event::Io(Io::Wrote(Ok(()))) => {
                    self.release_buffers();
                    false
                }
                Event::Io(Io::Wrote(Err(_))) => {
                    self.discard_output();
                    true
                }
                Event::Stalled => {
                    self.drop_output("stopped reading its replies");
                    true
                }
                Event::Wake => client.is_killed(),
            };
            if gone {
                self.cancel(shard, id, Cancel::Disconnected).await;
                break None;
            }
        };
        self.session.registration().set_blocked(false);
        client.parking().unpark(id);
        self.not_running += parked.elapsed();
        result
    }

    /// Takes a parked acquire out of shard `shard`'s queue, as `why` says; whether it was still
    /// parked there (a grant or a time-out may have ended it first).
    pub async fn cancel(&self, shard: usize, waiter: WaiterId, why: Cancel) -> bool {
        if shard == self.ctx.id {
            return self.ctx.cancel(waiter, why);
        }
        let msg = |reply| ShardMsg::Cancel { waiter, why, reply };
        self.g.ask(shard, msg).await.unwrap_or(false)
    }
}
