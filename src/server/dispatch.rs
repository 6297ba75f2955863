//! What a connection's requests do, in the order Redis's `processCommand` checks them: find the
//! command, refuse DEBUG unless enabled, check that the user may run it, queue it inside MULTI,
//! parse it, then run it where it belongs:
//!
//! - an engine command on its namespace's shard: inline when that is this thread's shard, else
//!   sent to the other thread; consecutive non-blocking commands for one other shard travel as
//!   one message (a batch), flushed before anything else is answered, whose replies come back
//!   encoded, a piece of about `OUT_FLUSH` at a time;
//! - CLIENT KILL, ACL DELUSER and CLIENT UNBLOCK end parked acquires on their shards, and wait
//!   for it, before they are answered: a release right behind them frees no permit for a
//!   waiter that is gone;
//! - NS.LIST and INFO on every shard at once, their parts merged;
//! - the rest on the connection's session (surface.rs);
//! - MULTI / EXEC / DISCARD through multi.rs, which decides what EXEC runs.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::conn::{Conn, Service, Transport, OUT_FLUSH};
use super::info;
use super::memory;
use super::msg::{Done, Durable, Ran, ShardMsg};
use super::multi::{self, Step, Transaction};
use super::parking::Parking;
use super::session::check_permissions;
use super::stats::Outcome;
use super::surface;
use crate::command::table::Flag;
use crate::command::{self, Cmd, CommandSpec, Request, SessionRequest};
use crate::engine::page::Page;
use crate::engine::request::EngineRequest;
use crate::engine::shard::{merge_ns_pages, ns_page_reply};
use crate::engine::Cancel;
use crate::error::Error;
use crate::protocol::Reply;

/// Redis's answer to DEBUG when `enable-debug-command` does not allow it.
const DEBUG_NOT_ALLOWED: &str = "DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.";

/// A connection's routing state (see the module docs).
#[derive(Default)]
pub struct Dispatch {
    /// Non-blocking requests for shard `batch_shard`, not sent yet.
    batch_shard: usize,
    batch: VecDeque<EngineRequest>,
    /// The transaction being queued.
    multi: Option<Transaction>,
}

impl Service for Dispatch {
    async fn command<S: Transport>(&mut self, conn: &mut Conn<S>, argv: Vec<Bytes>) {
        conn.ctx.count_command();
        let spec = match command::resolve(&argv) {
            Ok(s) => s,
            Err(e) => {
                // An arity error counts as a rejected call of the command, as in Redis; an
                // unknown command only as an error.
                match command::known(&argv) {
                    Some(spec) => {
                        conn.ctx
                            .record(spec.name, Duration::ZERO, Outcome::Rejected, Some(&e))
                    }
                    None => conn.ctx.count_error(&e),
                }
                return self.reject(conn, e, true).await;
            }
        };
        conn.session.client().touch(spec.name);
        if spec.cmd == Cmd::Debug {
            let local = conn.session.client().is_local();
            if !conn.g.config.enable_debug_command.allows(local) {
                let e = Error::Err(DEBUG_NOT_ALLOWED.into());
                return self.refuse(conn, spec, e).await;
            }
        }
        if !spec.flags.has(Flag::NoAuth) {
            let denied = match conn.session.current_user(&conn.g.acl) {
                None => Some(Error::NoAuth("Authentication required.".into())),
                Some(user) => check_permissions(user, spec, &argv).err(),
            };
            if let Some(e) = denied {
                return self.refuse(conn, spec, e).await;
            }
        }
        // Past --maxmemory: what would add state is refused, and so is queueing anything into a
        // transaction (the queue grows), as Redis does; EXEC, DISCARD, QUIT and RESET always go
        // through.
        let ends = matches!(spec.cmd, Cmd::Exec | Cmd::Discard | Cmd::Quit | Cmd::Reset);
        let queues = self.multi.is_some() && !ends;
        if (spec.flags.has(Flag::DenyOom) || queues) && conn.g.memory.exceeded() {
            return self
                .refuse(conn, spec, Error::Oom(memory::OOM.into()))
                .await;
        }
        let started = Instant::now();
        match spec.cmd {
            Cmd::Multi => {
                self.flush_batch(conn).await;
                let reply = multi::start(&mut self.multi, conn.session.client());
                return ran(conn, spec.name, started, reply);
            }
            Cmd::Exec => {
                self.flush_batch(conn).await;
                let reply = self.exec(conn).await;
                return ran(conn, spec.name, started, reply);
            }
            Cmd::Discard => {
                self.flush_batch(conn).await;
                let reply = multi::discard(&mut self.multi, conn.session.client());
                return ran(conn, spec.name, started, reply);
            }
            Cmd::Quit | Cmd::Reset => {}
            _ => {
                if let Some(tx) = &mut self.multi {
                    let reply = tx.queue(spec, argv, conn.session.client());
                    return conn.push(reply);
                }
            }
        }
        let req = match command::parse(spec, &argv, &conn.g.limits) {
            Ok(r) => r,
            Err(e) => {
                // A bad argument is found as the command runs, in Redis: a failed call.
                conn.ctx
                    .record(spec.name, started.elapsed(), Outcome::Failed, Some(&e));
                return self.reject(conn, e, false).await;
            }
        };
        match req {
            // Counted where it runs, on its shard (worker.rs).
            Request::Engine(r) => self.engine(conn, r).await,
            other => {
                self.flush_batch(conn).await;
                let started = Instant::now();
                if let Some(reply) = self.other(conn, other).await {
                    ran(conn, spec.name, started, reply);
                }
            }
        }
    }

    async fn flush<S: Transport>(&mut self, conn: &mut Conn<S>) {
        self.flush_batch(conn).await;
    }

    fn batching(&self) -> bool {
        !self.batch.is_empty()
    }

    fn in_transaction(&self) -> bool {
        self.multi.is_some()
    }
}

/// Counts a call of `name` that started at `started` and answered `reply`, and buffers the reply.
fn ran<S: Transport>(conn: &mut Conn<S>, name: &'static str, started: Instant, reply: Reply) {
    conn.ctx.record_reply(name, started.elapsed(), &reply);
    conn.push(reply);
}

impl Dispatch {
    /// Refuses `spec` before it runs (a rejected call, in Redis's statistics); inside MULTI this
    /// aborts the transaction.
    async fn refuse<S: Transport>(&mut self, conn: &mut Conn<S>, spec: &CommandSpec, e: Error) {
        conn.ctx
            .record(spec.name, Duration::ZERO, Outcome::Rejected, Some(&e));
        self.reject(conn, e, true).await;
    }

    /// Answers an error; one found while queueing (`in_queue`) aborts the transaction.
    async fn reject<S: Transport>(&mut self, conn: &mut Conn<S>, e: Error, in_queue: bool) {
        self.flush_batch(conn).await;
        if in_queue {
            if let Some(tx) = &mut self.multi {
                tx.abort();
            }
        }
        conn.push(Reply::Error(e));
    }

    async fn engine<S: Transport>(&mut self, conn: &mut Conn<S>, r: EngineRequest) {
        let Some(ns) = r.namespace() else {
            // NS.LIST, which every shard answers: counted here, as one call.
            self.flush_batch(conn).await;
            let (name, started) = (command::engine_command_name(&r), Instant::now());
            if let Some(reply) = self.other(conn, Request::Engine(r)).await {
                ran(conn, name, started, reply);
            }
            return;
        };
        let shard = conn.g.shard_of(ns);
        conn.note_target(shard);
        // One that may park, or one of this thread's shard, runs at once and alone; the others
        // gather into one message per run of commands for the same shard.
        if r.may_block() || shard == conn.ctx.id {
            self.flush_batch(conn).await;
            let done = one(conn, shard, r, true).await;
            conn.answer(shard, done).await;
        } else {
            if !self.batch.is_empty() && self.batch_shard != shard {
                self.flush_batch(conn).await;
            }
            self.batch_shard = shard;
            self.batch.push_back(r);
        }
    }

    /// Sends the pending batch to its shard and buffers its replies. The shard runs it until
    /// the replies reach `OUT_FLUSH` bytes and sends back what is left, which goes again once
    /// those replies are buffered (and written as far as the client reads them): what a
    /// pipeline for another shard builds before a write is one piece, not all of its replies.
    async fn flush_batch<S: Transport>(&mut self, conn: &mut Conn<S>) {
        let mut reqs = std::mem::take(&mut self.batch);
        let shard = self.batch_shard;
        while !reqs.is_empty() {
            let n = reqs.len();
            let proto = conn.session.proto();
            let msg = |reply| ShardMsg::Batch {
                reqs,
                proto,
                budget: OUT_FLUSH,
                reply,
            };
            let Some(Durable { value, lsn }) = conn.g.ask(shard, msg).await else {
                for _ in 0..n {
                    conn.push(shutting_down());
                }
                return;
            };
            let Ran { out, ends, rest } = value;
            conn.note(shard, lsn);
            conn.push_encoded(shard, &out, &ends);
            if !conn.send_some().await {
                // The client is closed (past its output limit): the rest never runs.
                return;
            }
            reqs = rest;
        }
        // The room the batch grew to stays for the next one.
        self.batch = reqs;
    }

    /// Runs a request that is not an engine command of one namespace; `None` when nothing is
    /// to be answered.
    async fn other<S: Transport>(&mut self, conn: &mut Conn<S>, req: Request) -> Option<Reply> {
        Some(match req {
            Request::Engine(EngineRequest::NsList(list)) => ns_list(conn, list.page).await,
            // EXEC sends these to their shard as one batch; one run alone gets its reply here.
            Request::Engine(r) => {
                let shard = r.namespace().map_or(conn.ctx.id, |ns| conn.g.shard_of(ns));
                match one(conn, shard, r, false).await {
                    Done::Reply(reply) => reply,
                    // may_wait is false: it does not park, nor is refused for a kill.
                    Done::Parked(..) | Done::Killed => shutting_down(),
                }
            }
            Request::Info(sections) => info_reply(conn, &sections).await,
            Request::ClientUnblock { id, error } => unblock(conn, id, error).await,
            // `command` runs these before anything is parsed or queued, so EXEC's queue never
            // holds one; were one to get here, the client gets Redis's answer to a nested one.
            Request::Txn(_) => Reply::Error(Error::Err(
                "Command not allowed inside a transaction".into(),
            )),
            Request::Session(SessionRequest::Reset) => {
                self.multi = None;
                conn.session.client().set_multi(None);
                return surface::run(&mut conn.session, &conn.g, SessionRequest::Reset);
            }
            Request::Session(req) => {
                let kills = matches!(
                    req,
                    SessionRequest::ClientKill(_) | SessionRequest::AclDelUser(_)
                );
                let reply = surface::run(&mut conn.session, &conn.g, req);
                if kills {
                    end_killed_waiters(conn).await;
                }
                return reply;
            }
        })
    }

    /// EXEC: runs the plan multi.rs makes of the transaction; the engine commands go to their
    /// shard as one batch, acquires without waiting (and are counted there); the others are
    /// counted here, each as its own call, as Redis counts the commands of a transaction.
    async fn exec<S: Transport>(&mut self, conn: &mut Conn<S>) -> Reply {
        let tx = match multi::take(&mut self.multi, conn.session.client()) {
            Ok(tx) => tx,
            Err(reply) => return reply,
        };
        if tx.adds_state() && conn.g.memory.exceeded() {
            let why = format!("Transaction discarded because of: OOM {}", memory::OOM);
            return Reply::Error(Error::ExecAbort(why));
        }
        let user = conn.session.current_user(&conn.g.acl).cloned();
        let plan = match tx.plan(user.as_ref(), &conn.g) {
            Ok(p) => p,
            Err(reply) => return reply,
        };
        let mut engine_done = match plan.shard {
            Some(s) => on_shard(conn, s, plan.engine).await,
            None => Vec::new(),
        }
        .into_iter();
        let mut replies = Vec::with_capacity(plan.steps.len());
        for step in plan.steps {
            let reply = match step {
                Step::Engine => match engine_done.next() {
                    Some(Done::Reply(r)) => r,
                    // No parker: nothing parks inside a transaction, nor is refused for a kill.
                    Some(Done::Parked(..) | Done::Killed) | None => shutting_down(),
                },
                Step::Failed(name, e) => {
                    conn.ctx
                        .record(name, Duration::ZERO, Outcome::Failed, Some(&e));
                    Reply::Error(e)
                }
                Step::Run(name, req) => {
                    let started = Instant::now();
                    let reply = self.other(conn, req).await.unwrap_or(Reply::OK);
                    conn.ctx.record_reply(name, started.elapsed(), &reply);
                    reply
                }
            };
            replies.push(reply);
        }
        debug_assert!(engine_done.next().is_none());
        Reply::Array(replies)
    }
}

/// Runs one request on `shard`: inline when it is this thread's (the hot path: no batch, no
/// message), else as a message to its thread.
async fn one<S: Transport>(
    conn: &mut Conn<S>,
    shard: usize,
    r: EngineRequest,
    may_wait: bool,
) -> Done {
    if shard != conn.ctx.id {
        let parker = may_wait.then(|| conn.session.client().parking().clone());
        let mut done = remote(conn, shard, vec![r], parker).await;
        return done.pop().unwrap_or_else(|| Done::Reply(shutting_down()));
    }
    let done = conn
        .ctx
        .exec(r, may_wait.then(|| conn.session.client().parking()));
    conn.note(shard, conn.ctx.last_lsn());
    done
}

/// Runs requests of `shard` in order, inline when it is this thread's (none when the shard is
/// gone, at shutdown).
async fn on_shard<S: Transport>(
    conn: &mut Conn<S>,
    shard: usize,
    reqs: Vec<EngineRequest>,
) -> Vec<Done> {
    if shard != conn.ctx.id {
        return remote(conn, shard, reqs, None).await;
    }
    let done = conn.ctx.exec_batch(reqs, None);
    conn.note(shard, conn.ctx.last_lsn());
    done
}

/// Runs requests on another shard, an acquire parking for `parker` if given; their replies come
/// back as one message (none when the shard is gone, at shutdown).
async fn remote<S: Transport>(
    conn: &mut Conn<S>,
    shard: usize,
    reqs: Vec<EngineRequest>,
    parker: Option<Arc<Parking>>,
) -> Vec<Done> {
    let msg = |reply| ShardMsg::Exec {
        reqs,
        parker,
        reply,
    };
    match conn.g.ask(shard, msg).await {
        Some(Durable { value, lsn }) => {
            conn.note(shard, lsn);
            value
        }
        None => Vec::new(),
    }
}

/// NS.LIST: every shard's part, merged in name order.
async fn ns_list<S: Transport>(conn: &mut Conn<S>, page: Page) -> Reply {
    // Only the namespaces the user may see; filtered on the shards so that pages stay full.
    let visible_to = conn.session.user().cloned().filter(|u| !u.sees_all());
    let answers = conn
        .g
        .ask_all(|reply| ShardMsg::NsList {
            page: page.clone(),
            visible_to: visible_to.clone(),
            reply,
        })
        .await;
    let mut parts = Vec::with_capacity(answers.len());
    for (shard, Durable { value, lsn }) in answers {
        // The page may show changes of that shard that are not durable yet.
        conn.note(shard, lsn);
        parts.push(value);
    }
    ns_page_reply(merge_ns_pages(parts, &page))
}

/// INFO: every shard's figures, added up.
async fn info_reply<S: Transport>(conn: &Conn<S>, sections: &[Bytes]) -> Reply {
    let latency = info::wants_latency(sections);
    let answers = conn
        .g
        .ask_all(|reply| ShardMsg::Info { latency, reply })
        .await;
    let parts: Vec<_> = answers.into_iter().map(|(_, p)| p).collect();
    let totals = info::sum(&parts);
    Reply::Verbatim(info::info_text(&conn.g, sections, totals).into())
}

/// Ends, each on its shard, the parked acquires of the clients a kill just marked, and waits
/// for the shards' answers, so that no command after the kill can grant them (the kill marked
/// them first: parking.rs says why every waiter is found here or never left parked).
async fn end_killed_waiters<S: Transport>(conn: &Conn<S>) {
    for (shard, waiter) in conn.g.clients.killed_parked() {
        conn.cancel(shard, waiter, Cancel::Disconnected).await;
    }
}

/// CLIENT UNBLOCK: ends the client's parked acquire on its shard as a time-out (or with the
/// UNBLOCKED error) and answers 1 only when this ended it: the waiter was still parked, not
/// granted or timed out first. Its reply then reaches the client as any parked reply does.
async fn unblock<S: Transport>(conn: &Conn<S>, id: u64, error: bool) -> Reply {
    let why = if error {
        Cancel::UnblockError
    } else {
        Cancel::UnblockTimeout
    };
    let ended = match conn.g.clients.get(id).and_then(|c| c.parking().parked()) {
        Some((shard, waiter)) => conn.cancel(shard, waiter, why).await,
        None => false,
    };
    Reply::Int(i64::from(ended))
}

fn shutting_down() -> Reply {
    Reply::Error(Error::Err("server is shutting down".into()))
}
