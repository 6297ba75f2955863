//! One client connection: reads requests, runs them in order, writes replies in batches.
//!
//! Commands of namespaces owned by this thread's shard run inline; consecutive non-blocking
//! commands for another shard travel as one message. A parked acquire holds the commands behind
//! it (as BLPOP does in Redis) while the connection keeps watching its socket, so a client that
//! goes away is dropped from the queue at once.
//!
//! A connection whose commands keep going to one other shard moves to that shard's thread
//! (between requests, with nothing buffered), so that its commands run inline there: a release
//! that frees permits and the grant it causes then wake no other thread.

use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch};

use super::acl::{self, User};
use super::clients::Client;
use super::info;
use super::shard::{Done, Durable, ShardCtx, ShardMsg};
use super::Global;
use crate::command::{self, docs, Cmd, CommandSpec, KillFilter, Request};
use crate::engine::page::Page;
use crate::engine::request::EngineRequest;
use crate::engine::shard::{merge_ns_pages, ns_page_reply};
use crate::engine::{Cancel, WaiterId};
use crate::error::Error;
use crate::protocol::{Proto, ProtocolError, Reply, RequestParser};

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

/// Serves one accepted connection until it closes; `tls` connections first do the handshake.
pub async fn serve(ctx: Rc<ShardCtx>, stream: TcpStream, tls: bool) {
    let (Ok(addr), Ok(laddr)) = (stream.peer_addr(), stream.local_addr()) else {
        return;
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    let g = ctx.global.clone();
    let shard = ctx.id;
    if !tls {
        return run(ctx, stream, g.clients.add(addr, laddr, fd, shard)).await;
    }
    let Some(config) = g.tls.clone() else {
        return;
    };
    let handshake = tokio_rustls::TlsAcceptor::from(config).accept(stream);
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(s)) => run(ctx, s, g.clients.add(addr, laddr, fd, shard)).await,
        Ok(Err(e)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(%addr, "TLS handshake timed out"),
    }
}

/// A client's byte stream.
trait Transport: AsyncRead + AsyncWrite + Unpin + Sized {
    /// Whether a connection on this stream can move to another shard thread.
    const MOVABLE: bool = false;

    /// The socket, taken off this thread's event loop to move to another one.
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

/// What a connection carries when it moves to another shard thread.
#[derive(Debug)]
pub struct Moving {
    /// The socket, off the old thread's event loop.
    stream: std::net::TcpStream,
    client: Arc<Client>,
    user: Option<Arc<User>>,
    acl_version: u64,
    proto: Proto,
}

/// Serves a connection that moved here from another shard thread.
pub async fn resume(ctx: Rc<ShardCtx>, m: Moving) {
    let g = ctx.global.clone();
    let stream = match TcpStream::from_std(m.stream) {
        Ok(s) => s,
        Err(e) => {
            // The socket could not join this thread's event loop (and is closed).
            tracing::warn!(client = m.client.id, error = %e, "could not adopt a moving connection");
            g.clients.remove(m.client.id);
            return;
        }
    };
    let mut conn = Conn::new(ctx, stream, m.client);
    conn.user = m.user;
    conn.acl_version = m.acl_version;
    conn.proto = m.proto;
    serve_conn(g, conn).await;
}

async fn run<S: Transport>(ctx: Rc<ShardCtx>, stream: S, client: Arc<Client>) {
    let g = ctx.global.clone();
    serve_conn(g, Conn::new(ctx, stream, client)).await;
}

/// Runs `conn` until it closes or moves to another shard thread.
async fn serve_conn<S: Transport>(g: Arc<Global>, mut conn: Conn<S>) {
    let client = conn.client.clone();
    let Some(to) = conn.run().await else {
        // Unregistered while its socket is still open (see `Registry::remove`).
        g.clients.remove(client.id);
        return;
    };
    // Only fails if the event loop refuses to let go of the socket, which it then closes.
    let Some(stream) = conn.stream.into_std() else {
        g.clients.remove(client.id);
        return;
    };
    let moving = Moving {
        stream,
        client: conn.client,
        user: conn.user,
        acl_version: conn.acl_version,
        proto: conn.proto,
    };
    client.moves_to(to);
    if let Err(unsent) = g.shards[to].send(ShardMsg::Move(Box::new(moving))) {
        // The server is stopping: the connection closes, after it is unregistered.
        g.clients.remove(client.id);
        drop(unsent);
    }
}

/// A transaction being queued.
struct Multi {
    queued: Vec<(&'static CommandSpec, Vec<Bytes>)>,
    dirty: bool,
}

struct Conn<S> {
    ctx: Rc<ShardCtx>,
    g: Arc<Global>,
    client: Arc<Client>,
    stream: S,
    inbuf: BytesMut,
    out: BytesMut,
    parser: RequestParser,
    proto: Proto,
    /// The logged-in user; `None` until AUTH when the default user has a password.
    user: Option<Arc<User>>,
    /// The ACL version `user` was read at.
    acl_version: u64,
    multi: Option<Multi>,
    /// Close once the replies so far are written.
    close: bool,
    shutdown: watch::Receiver<bool>,
    /// The shard of the latest engine commands and how many in a row went there (counted only
    /// for another shard than this one).
    streak: (usize, u32),
    /// Non-blocking requests for shard `batch_shard`, not sent yet.
    batch_shard: usize,
    batch: Vec<EngineRequest>,
    /// Per shard, the LSN that must be durable before the buffered replies go out.
    need: Vec<u64>,
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
    fn new(ctx: Rc<ShardCtx>, stream: S, client: Arc<Client>) -> Conn<S> {
        let g = ctx.global.clone();
        // Logged in as the default user at once when it needs no password.
        let user = g.acl.get("default").filter(|u| u.is_open());
        Conn {
            acl_version: g.acl.version(),
            user,
            shutdown: g.shutdown.subscribe(),
            streak: (ctx.id, 0),
            ctx,
            g: g.clone(),
            client,
            stream,
            inbuf: BytesMut::new(),
            out: BytesMut::new(),
            parser: RequestParser::default(),
            proto: Proto::Resp2,
            multi: None,
            close: false,
            batch_shard: 0,
            batch: Vec::new(),
            need: vec![0; g.shards.len()],
        }
    }

    /// Serves requests until the connection closes (`None`) or is to move to another shard
    /// thread (`Some(shard)`).
    async fn run(&mut self) -> Option<usize> {
        loop {
            if let Read::Closed = self.read().await {
                return None;
            }
            self.process().await;
            if self.write_out().await.is_err() || self.close {
                return None;
            }
            self.release_buffers();
            if let Some(to) = self.move_target() {
                return Some(to);
            }
        }
    }

    /// Counts an engine command for `shard` toward moving there.
    fn note_target(&mut self, shard: usize) {
        self.streak = match self.streak {
            (s, n) if s == shard && shard != self.ctx.id => (s, n.saturating_add(1)),
            _ => (shard, u32::from(shard != self.ctx.id)),
        };
    }

    /// The shard to move to, once the commands kept going there and nothing is in flight: the
    /// replies are written, no request is partly read, no transaction is open.
    fn move_target(&self) -> Option<usize> {
        let (to, n) = self.streak;
        (S::MOVABLE
            && n >= MOVE_AFTER
            && to != self.ctx.id
            && self.multi.is_none()
            && self.inbuf.is_empty()
            && self.parser.is_idle()
            && self.batch.is_empty()
            && !self.client.killed.load(Ordering::Acquire)
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
        if self.client.killed.load(Ordering::Acquire) || self.g.shutting_down() {
            return Read::Closed;
        }
        let r = match self.g.config.timeout {
            0 => fill(&mut self.stream, &mut self.inbuf).await,
            secs => {
                let read = fill(&mut self.stream, &mut self.inbuf);
                match tokio::time::timeout(Duration::from_secs(secs), read).await {
                    Ok(r) => r,
                    Err(_) => {
                        tracing::debug!(client = self.client.id, "closing idle client");
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
            client = self.client.id,
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
        for (shard, need) in self.need.iter_mut().enumerate() {
            if *need > 0 {
                let durable = &self.g.durable[shard];
                if *durable.borrow() < *need {
                    let target = *need;
                    let _ = durable.subscribe().wait_for(|d| *d >= target).await;
                }
                *need = 0;
            }
        }
        if !self.out.is_empty() {
            let limit = self.g.config.client_output_timeout;
            if limit == 0 {
                self.stream.write_all(&self.out).await?;
            } else {
                tokio::time::timeout(Duration::from_secs(limit), self.stream.write_all(&self.out))
                    .await
                    .map_err(|_| {
                        tracing::warn!(
                            client = self.client.id,
                            "closing client that stopped reading its replies"
                        );
                        std::io::Error::new(std::io::ErrorKind::TimedOut, "client stopped reading")
                    })??;
            }
            self.out.clear();
        }
        Ok(())
    }

    fn push(&mut self, r: Reply) {
        r.encode(self.proto, &mut self.out);
    }

    /// Runs every complete request in the input buffer.
    async fn process(&mut self) {
        // The replies' room at once, rather than growing it from a few bytes reply by reply.
        self.out.reserve(BUF_START);
        while !self.close {
            let authed = self.user.is_some();
            match self
                .parser
                .next(&mut self.inbuf, &self.g.request_limits, authed)
            {
                Ok(Some(argv)) => self.command(argv).await,
                Ok(None) => break,
                Err(ProtocolError(m)) => {
                    self.flush_batch().await;
                    self.push(Reply::Error(Error::Err(format!("Protocol error: {m}"))));
                    self.close = true;
                }
            }
            if self.out.len() >= OUT_FLUSH
                && self.batch.is_empty()
                && self.write_out().await.is_err()
            {
                self.close = true;
            }
        }
        self.flush_batch().await;
    }

    async fn command(&mut self, argv: Vec<Bytes>) {
        self.ctx.commands.set(self.ctx.commands.get() + 1);
        let spec = match command::resolve(&argv) {
            Ok(s) => s,
            Err(e) => return self.reject(e, true).await,
        };
        self.client.touch(spec.name);
        if !spec.flags.has(command::table::Flag::NoAuth) {
            let denied = match self.current_user() {
                None => Some(Error::NoAuth("Authentication required.".into())),
                Some(user) => check_permissions(user, spec, &argv).err(),
            };
            if let Some(e) = denied {
                return self.reject(e, true).await;
            }
        }
        match spec.cmd {
            Cmd::Multi => return self.multi_start().await,
            Cmd::Exec => return self.exec().await,
            Cmd::Discard => return self.discard().await,
            Cmd::Quit | Cmd::Reset => {}
            _ => {
                if let Some(m) = &mut self.multi {
                    if spec.flags.has(command::table::Flag::NoMulti) {
                        m.dirty = true;
                        self.push(Reply::Error(Error::Err(
                            "Command not allowed inside a transaction".into(),
                        )));
                    } else {
                        m.queued.push((spec, argv));
                        self.client
                            .multi
                            .store(m.queued.len() as i64, Ordering::Relaxed);
                        self.push(Reply::Simple("QUEUED"));
                    }
                    return;
                }
            }
        }
        let req = match command::parse(spec, &argv, &self.g.limits) {
            Ok(r) => r,
            Err(e) => return self.reject(e, false).await,
        };
        match req {
            Request::Engine(r) => self.engine(r).await,
            other => {
                self.flush_batch().await;
                if let Some(reply) = self.surface(other).await {
                    self.push(reply);
                }
            }
        }
    }

    /// The logged-in user, re-read when the ACL changed (a deleted user is logged out).
    fn current_user(&mut self) -> Option<&User> {
        let v = self.g.acl.version();
        if v != self.acl_version {
            self.acl_version = v;
            self.user = self.user.take().and_then(|u| self.g.acl.get(&u.name));
        }
        self.user.as_deref()
    }

    /// Answers an error; one found while queueing (`in_queue`) aborts the transaction.
    async fn reject(&mut self, e: Error, in_queue: bool) {
        self.flush_batch().await;
        if in_queue {
            if let Some(m) = &mut self.multi {
                m.dirty = true;
            }
        }
        self.push(Reply::Error(e));
    }

    async fn engine(&mut self, r: EngineRequest) {
        let Some(ns) = r.namespace() else {
            self.flush_batch().await;
            if let EngineRequest::NsList(list) = r {
                let reply = self.ns_list(list.page).await;
                self.push(reply);
            }
            return;
        };
        let shard = self.g.shard_of(ns);
        self.note_target(shard);
        if r.may_block() {
            self.flush_batch().await;
            let done = if shard == self.ctx.id {
                self.exec_local(r, true)
            } else {
                match self.remote(shard, vec![r], true).await.pop() {
                    Some(d) => d,
                    None => Done::Reply(shutting_down()),
                }
            };
            self.finish(shard, done).await;
        } else if shard == self.ctx.id {
            self.flush_batch().await;
            let done = self.exec_local(r, true);
            self.finish(shard, done).await;
        } else {
            if !self.batch.is_empty() && self.batch_shard != shard {
                self.flush_batch().await;
            }
            self.batch_shard = shard;
            self.batch.push(r);
        }
    }

    /// Sends the pending batch to its shard and writes its replies.
    async fn flush_batch(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let reqs = std::mem::take(&mut self.batch);
        let n = reqs.len();
        let shard = self.batch_shard;
        let results = self.remote(shard, reqs, true).await;
        let missing = n - results.len();
        for d in results {
            self.finish(shard, d).await;
        }
        for _ in 0..missing {
            self.push(shutting_down());
        }
    }

    /// Runs a request of this thread's shard inline.
    fn exec_local(&mut self, r: EngineRequest, may_wait: bool) -> Done {
        let done = self.ctx.exec(r, may_wait);
        self.note(self.ctx.id, self.ctx.last_lsn());
        done
    }

    /// Records that the buffered replies may show changes up to `lsn` of `shard`.
    fn note(&mut self, shard: usize, lsn: u64) {
        let n = &mut self.need[shard];
        *n = (*n).max(lsn);
    }

    /// Runs requests on another shard; their replies come back as one message.
    async fn remote(
        &mut self,
        shard: usize,
        reqs: Vec<EngineRequest>,
        may_wait: bool,
    ) -> Vec<Done> {
        let msg = |reply| ShardMsg::Exec {
            reqs,
            may_wait,
            reply,
        };
        match ask(&self.g, shard, msg).await {
            Some((done, lsn)) => {
                self.note(shard, lsn);
                done
            }
            None => Vec::new(),
        }
    }

    async fn finish(&mut self, shard: usize, done: Done) {
        match done {
            Done::Reply(r) => self.push(r),
            Done::Parked(rx, id) => match self.wait_parked(shard, id, rx).await {
                Some(r) => self.push(r),
                None => self.close = true,
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
        self.client.blocked.store(true, Ordering::Release);
        self.g.clients.blocked.fetch_add(1, Ordering::Relaxed);
        let result = loop {
            let ev = tokio::select! {
                r = &mut rx => Event::Reply(r.ok()),
                r = fill(&mut self.stream, &mut self.inbuf) => Event::Read(r),
                _ = self.client.wake.notified() => Event::Wake,
                _ = self.shutdown.wait_for(|s| *s) => Event::Shutdown,
            };
            let gone = match ev {
                Event::Reply(Some((r, lsn))) => {
                    self.note(shard, lsn);
                    break Some(r);
                }
                Event::Reply(None) => break None,
                Event::Read(Ok(0) | Err(_)) | Event::Shutdown => true,
                Event::Read(Ok(_)) => self.over_query_limit(),
                Event::Wake if self.client.killed.load(Ordering::Acquire) => true,
                Event::Wake => {
                    let why = match self.client.unblock.swap(0, Ordering::AcqRel) {
                        1 => Some(Cancel::UnblockTimeout),
                        2 => Some(Cancel::UnblockError),
                        _ => None,
                    };
                    if let Some(why) = why {
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
        self.client.blocked.store(false, Ordering::Release);
        self.client.unblock.store(0, Ordering::Release);
        self.g.clients.blocked.fetch_sub(1, Ordering::Relaxed);
        result
    }

    async fn cancel(&self, shard: usize, waiter: WaiterId, why: Cancel) -> bool {
        if shard == self.ctx.id {
            return self.ctx.cancel(waiter, why);
        }
        let msg = |reply| ShardMsg::Cancel { waiter, why, reply };
        ask(&self.g, shard, msg).await.unwrap_or(false)
    }

    /// NS.LIST: every shard's part, merged in name order.
    async fn ns_list(&mut self, page: Page) -> Reply {
        // Only the namespaces the user may see; filtered on the shards so that pages stay full.
        let visible_to = self.user.clone().filter(|u| !u.sees_all());
        let answers = ask_all(&self.g, |reply| ShardMsg::NsList {
            page: page.clone(),
            visible_to: visible_to.clone(),
            reply,
        })
        .await;
        let mut parts = Vec::with_capacity(answers.len());
        for (shard, (p, lsn)) in answers {
            // The page may show changes of that shard that are not durable yet.
            self.note(shard, lsn);
            parts.push(p);
        }
        ns_page_reply(merge_ns_pages(parts, &page))
    }

    async fn info(&self, sections: &[Bytes]) -> Reply {
        let answers = ask_all(&self.g, |reply| ShardMsg::Info { reply }).await;
        let parts: Vec<_> = answers.into_iter().map(|(_, p)| p).collect();
        let totals = info::sum(&parts);
        Reply::Verbatim(info::info_text(&self.g, sections, totals).into())
    }

    async fn multi_start(&mut self) {
        self.flush_batch().await;
        if self.multi.is_some() {
            // As Redis: an error, and the transaction goes on.
            self.push(Reply::Error(Error::Err(
                "MULTI calls can not be nested".into(),
            )));
            return;
        }
        self.multi = Some(Multi {
            queued: Vec::new(),
            dirty: false,
        });
        self.client.multi.store(0, Ordering::Relaxed);
        self.push(Reply::OK);
    }

    async fn discard(&mut self) {
        self.flush_batch().await;
        if self.multi.take().is_none() {
            self.push(Reply::Error(Error::Err("DISCARD without MULTI".into())));
            return;
        }
        self.client.multi.store(-1, Ordering::Relaxed);
        self.push(Reply::OK);
    }

    /// EXEC: the queued commands of one namespace run atomically on its shard, acquires without
    /// waiting; commands of several namespaces are refused with CROSSSLOT and nothing runs.
    async fn exec(&mut self) {
        self.flush_batch().await;
        let Some(m) = self.multi.take() else {
            self.push(Reply::Error(Error::Err("EXEC without MULTI".into())));
            return;
        };
        self.client.multi.store(-1, Ordering::Relaxed);
        if m.dirty {
            self.push(Reply::Error(Error::ExecAbort(
                "Transaction discarded because of previous errors.".into(),
            )));
            return;
        }
        // Permissions are checked again: the ACL may have changed since the commands were queued.
        let user = self.current_user().cloned();
        let parsed: Vec<Result<Request, Error>> = m
            .queued
            .iter()
            .map(|(spec, argv)| {
                let Some(user) = &user else {
                    return Err(Error::NoAuth("Authentication required.".into()));
                };
                check_permissions(user, spec, argv).map_err(|_| {
                    Error::NoPerm(format!(
                        "ACLs rules changed between the moment the transaction was accumulated and the EXEC call. This command is no longer allowed for the following user: '{}'",
                        user.name
                    ))
                })?;
                command::parse(spec, argv, &self.g.limits)
            })
            .collect();
        let mut namespace = None;
        for r in parsed.iter().flatten() {
            if let Request::Engine(e) = r {
                if let Some(ns) = e.namespace() {
                    if namespace.is_some_and(|n| n != ns) {
                        self.push(Reply::Error(Error::CrossSlot(
                            "Keys in request don't hash to the same slot".into(),
                        )));
                        return;
                    }
                    namespace = Some(ns);
                }
            }
        }
        let shard = namespace.map(|ns| self.g.shard_of(ns));
        let mut engine_reqs = Vec::new();
        let mut rest = Vec::with_capacity(parsed.len());
        for r in parsed {
            match r {
                Ok(Request::Engine(e)) if e.namespace().is_some() => {
                    engine_reqs.push(e);
                    rest.push(None);
                }
                other => rest.push(Some(other)),
            }
        }
        let n_engine = engine_reqs.len();
        let mut engine_done = match shard {
            Some(s) if s == self.ctx.id => {
                let done = self.ctx.exec_batch(engine_reqs, false);
                self.note(s, self.ctx.last_lsn());
                done
            }
            Some(s) => self.remote(s, engine_reqs, false).await,
            None => Vec::new(),
        }
        .into_iter();
        let mut replies = Vec::with_capacity(rest.len());
        for slot in rest {
            let reply = match slot {
                None => match engine_done.next() {
                    Some(Done::Reply(r)) => r,
                    // may_wait is false: nothing parks inside a transaction.
                    Some(Done::Parked(..)) | None => shutting_down(),
                },
                Some(Err(e)) => Reply::Error(e),
                Some(Ok(Request::Engine(EngineRequest::NsList(list)))) => {
                    self.ns_list(list.page).await
                }
                Some(Ok(other)) => self.surface(other).await.unwrap_or(Reply::OK),
            };
            replies.push(reply);
        }
        debug_assert!(n_engine == 0 || engine_done.next().is_none());
        self.push(Reply::Array(replies));
    }

    /// Runs a connection- or server-level command; `None` when nothing is to be answered.
    async fn surface(&mut self, req: Request) -> Option<Reply> {
        Some(match req {
            Request::Ping(None) => Reply::Simple("PONG"),
            Request::Ping(Some(m)) | Request::Echo(m) => Reply::Bulk(m),
            Request::Quit => {
                self.close = true;
                Reply::OK
            }
            Request::Reset => {
                self.multi = None;
                self.client.multi.store(-1, Ordering::Relaxed);
                self.set_proto(Proto::Resp2);
                self.client.set_name(Bytes::new());
                self.user = self.g.acl.get("default").filter(|u| u.is_open());
                self.client.set_user(Bytes::from_static(b"default"));
                Reply::Simple("RESET")
            }
            Request::Select(0) => Reply::OK,
            Request::Select(_) => Reply::Error(Error::Err("DB index is out of range".into())),
            Request::Auth { user, pass } => match self.auth(user.as_ref(), &pass, false) {
                Ok(()) => Reply::OK,
                Err(e) => Reply::Error(e),
            },
            Request::Hello {
                proto,
                auth,
                setname,
            } => self.hello(proto, auth, setname),
            Request::ClientId => Reply::Int(self.client.id as i64),
            Request::ClientSetName(n) => {
                self.client.set_name(n);
                Reply::OK
            }
            Request::ClientGetName => {
                let n = self.client.name();
                if n.is_empty() {
                    Reply::Null
                } else {
                    Reply::Bulk(n)
                }
            }
            Request::ClientSetInfo { lib_name, value } => {
                self.client.set_lib(lib_name, value);
                Reply::OK
            }
            Request::ClientInfo => Reply::Verbatim(format!("{}\n", self.client.info_line()).into()),
            Request::ClientList(ids) => {
                let mut text = String::new();
                for c in self.g.clients.all() {
                    if ids.as_ref().is_none_or(|ids| ids.contains(&c.id)) {
                        text.push_str(&c.info_line());
                        text.push('\n');
                    }
                }
                Reply::Verbatim(text.into())
            }
            Request::ClientKill(f) => self.client_kill(&f),
            Request::ClientUnblock { id, error } => {
                let unblocked = match self.g.clients.get(id) {
                    Some(c) if c.blocked.load(Ordering::Acquire) => {
                        c.unblock
                            .store(if error { 2 } else { 1 }, Ordering::Release);
                        c.wake.notify_one();
                        1
                    }
                    _ => 0,
                };
                Reply::Int(unblocked)
            }
            Request::ClientUnsupported(what) => Reply::Error(Error::Err(format!(
                "permitd does not support {what} (CLIENT TRACKING and related subcommands)"
            ))),
            Request::Command => docs::info_reply(&[]),
            Request::CommandCount => docs::count_reply(),
            Request::CommandInfo(names) => docs::info_reply(&names),
            Request::CommandDocs(names) => docs::docs_reply(&names),
            Request::CommandList => docs::list_reply(),
            Request::CommandGetKeys(argv) => docs::getkeys_reply(&argv).into(),
            Request::Info(sections) => self.info(&sections).await,
            Request::ConfigGet(patterns) => info::config_get(&self.g, &patterns),
            Request::AclSetUser(name, rules) => {
                self.g.acl.setuser(&name, &rules).map(|()| Reply::OK).into()
            }
            Request::AclDelUser(names) => match self.g.acl.deluser(&names) {
                Ok(n) => {
                    // As Redis: the connections of a deleted user are closed.
                    self.g
                        .clients
                        .kill_where(|c| names.iter().any(|u| u.as_bytes() == c.user().as_ref()));
                    Reply::Int(n as i64)
                }
                Err(e) => Reply::Error(e),
            },
            Request::AclList => lines(self.g.acl.list()),
            Request::AclUsers => lines(self.g.acl.names()),
            Request::AclWhoami => Reply::bulk(self.client.user()),
            Request::AclCat(None) => lines(acl::categories()),
            Request::AclCat(Some(cat)) => {
                if !acl::categories().contains(&cat) {
                    Reply::Error(Error::Err(format!("Unknown category '{cat}'")))
                } else {
                    lines(
                        acl::commands_in(&cat)
                            .into_iter()
                            .map(String::from)
                            .collect(),
                    )
                }
            }
            Request::AclLoad => self.g.acl.load().map(|()| Reply::OK).into(),
            Request::AclSave => self.g.acl.save().map(|()| Reply::OK).into(),
            Request::Shutdown => {
                tracing::info!(client = self.client.id, "User requested shutdown...");
                self.g.begin_shutdown();
                self.close = true;
                return None;
            }
            Request::Multi | Request::Exec | Request::Discard | Request::Engine(_) => {
                unreachable!("handled by `command`")
            }
        })
    }

    fn set_proto(&mut self, p: Proto) {
        self.proto = p;
        self.client.resp.store(p.number() as u8, Ordering::Relaxed);
    }

    /// Logs in as `user` (the default user when left out) if `pass` is one of its passwords.
    fn auth(&mut self, user: Option<&Bytes>, pass: &Bytes, from_hello: bool) -> Result<(), Error> {
        if user.is_none() && !from_hello && self.g.acl.default_is_open() {
            return Err(Error::Err(
                "AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?".into(),
            ));
        }
        let name = user.map_or("default".into(), |u| {
            String::from_utf8_lossy(u).into_owned()
        });
        let found = self.g.acl.get(&name).filter(|u| u.check_password(pass));
        let Some(found) = found else {
            return Err(Error::WrongPass(
                "invalid username-password pair or user is disabled.".into(),
            ));
        };
        self.user = Some(found);
        self.acl_version = self.g.acl.version();
        self.client.set_user(Bytes::from(name));
        Ok(())
    }

    fn hello(
        &mut self,
        proto: Option<i64>,
        auth: Option<(Bytes, Bytes)>,
        setname: Option<Bytes>,
    ) -> Reply {
        let p = match proto {
            None => self.proto,
            Some(2) => Proto::Resp2,
            Some(3) => Proto::Resp3,
            Some(_) => return Reply::Error(Error::NoProto("unsupported protocol version".into())),
        };
        if let Some((user, pass)) = auth {
            if let Err(e) = self.auth(Some(&user), &pass, true) {
                return Reply::Error(e);
            }
        }
        if self.user.is_none() {
            return Reply::Error(Error::NoAuth("HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time".into()));
        }
        if let Some(n) = setname {
            if n.iter().any(|&b| b <= b' ' || b > b'~') {
                return Reply::Error(Error::Err(
                    "Client names cannot contain spaces, newlines or special characters.".into(),
                ));
            }
            self.client.set_name(n);
        }
        self.set_proto(p);
        info::hello(self.client.id, p)
    }

    fn client_kill(&self, f: &KillFilter) -> Reply {
        let me = self.client.id;
        let killed = self.g.clients.kill_where(|c| {
            f.id.is_none_or(|id| id == c.id)
                && f.addr
                    .as_ref()
                    .is_none_or(|a| a.as_ref() == c.addr.to_string().as_bytes())
                && f.laddr
                    .as_ref()
                    .is_none_or(|a| a.as_ref() == c.laddr.to_string().as_bytes())
                && f.user.as_ref().is_none_or(|u| *u == c.user())
                && !(f.skipme && c.id == me)
        }) as i64;
        if f.old_form {
            if killed == 0 {
                return Reply::Error(Error::Err("No such client".into()));
            }
            return Reply::OK;
        }
        Reply::Int(killed)
    }
}

/// Sends shard `shard` a message carrying a reply channel and waits for the answer (`None` when
/// the shard is gone, at shutdown).
async fn ask<T>(
    g: &Global,
    shard: usize,
    msg: impl FnOnce(oneshot::Sender<T>) -> ShardMsg,
) -> Option<T> {
    let (tx, rx) = oneshot::channel();
    g.shards[shard].send(msg(tx)).ok()?;
    rx.await.ok()
}

/// Asks every shard at once, then gathers the answers with their shard's index.
async fn ask_all<T>(g: &Global, msg: impl Fn(oneshot::Sender<T>) -> ShardMsg) -> Vec<(usize, T)> {
    let mut waits = Vec::with_capacity(g.shards.len());
    for (shard, inbox) in g.shards.iter().enumerate() {
        let (tx, rx) = oneshot::channel();
        if inbox.send(msg(tx)).is_ok() {
            waits.push((shard, rx));
        }
    }
    let mut answers = Vec::with_capacity(waits.len());
    for (shard, rx) in waits {
        if let Ok(a) = rx.await {
            answers.push((shard, a));
        }
    }
    answers
}

/// Whether `user` may run `spec` with these arguments (its namespace is the first key).
fn check_permissions(user: &User, spec: &CommandSpec, argv: &[Bytes]) -> Result<(), Error> {
    if !user.can_run(spec) {
        return Err(Error::NoPerm(format!(
            "User {} has no permissions to run the '{}' command",
            user.name, spec.name
        )));
    }
    if spec.first_key > 0 {
        if let Some(ns) = argv.get(spec.first_key as usize) {
            if !user.can_access(ns) {
                return Err(Error::NoPerm(format!(
                    "No permissions to access namespace '{}'",
                    String::from_utf8_lossy(&ns[..ns.len().min(128)])
                )));
            }
        }
    }
    Ok(())
}

/// An array of bulk strings.
fn lines(items: Vec<String>) -> Reply {
    Reply::Array(items.into_iter().map(Reply::bulk).collect())
}

fn shutting_down() -> Reply {
    Reply::Error(Error::Err("server is shutting down".into()))
}
