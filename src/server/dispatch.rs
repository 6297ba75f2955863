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
//! - MULTI / EXEC / DISCARD through multi.rs, which decides what EXEC runs; EXEC runs it in
//!   queue order, what reads or changes the transaction's shard inside one batch there.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::acl::User;
use super::cluster;
use super::conn::{Conn, Service, Transport, OUT_FLUSH};
use super::info;
use super::memory;
use super::msg::{
    Call, Done, Durable, NsAnswer, Ran, ShardInfo, ShardMsg, TxAnswer, TxDone, TxItem,
};
use super::multi::{self, Step, Transaction};
use super::parking::Parking;
use super::session::check_permissions;
use super::slowlog::Runner;
use super::stats::Outcome;
use super::surface;
use crate::command::info::Sections;
use crate::command::table::{CommandSpec, Flag};
use crate::command::{self, Cmd, Request, SessionRequest};
use crate::engine::page::Page;
use crate::engine::request::EngineRequest;
use crate::engine::shard::{merge_ns_pages, ns_page_reply};
use crate::engine::{Cancel, WaiterId};
use crate::error::Error;
use crate::protocol::Reply;

/// Redis's answer to DEBUG when `enable-debug-command` does not allow it.
const DEBUG_NOT_ALLOWED: &str = "DEBUG command not allowed. If the enable-debug-command option is set to \"local\", you can run it from a local connection, otherwise you need to set this option in the configuration file, and then restart the server.";

/// A connection's routing state (see the module docs).
#[derive(Default)]
pub struct Dispatch {
    /// Non-blocking requests for shard `batch_shard`, not sent yet.
    batch_shard: usize,
    batch: VecDeque<Call>,
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
        // Timed only for the slow log and the latency monitor; a parked acquire's wait and the
        // replies of earlier commands' batches are not this command's time.
        let started = (conn.g.slowlog.on() || conn.g.latency.on()).then(Instant::now);
        conn.not_running = Duration::ZERO;
        self.run(conn, spec, &argv).await;
        if let Some(t) = started {
            let took = t.elapsed().saturating_sub(conn.not_running);
            observe(conn, spec, &argv, took);
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

/// Records a command that ran for `took` in the slow log and the latency monitor.
fn observe<S: Transport>(conn: &Conn<S>, spec: &CommandSpec, argv: &[Bytes], took: Duration) {
    let event = if spec.flags.has(Flag::Fast) {
        "fast-command"
    } else {
        "command"
    };
    conn.g.latency.record(event, took);
    if !spec.flags.has(Flag::SkipSlowlog) {
        let client = conn.session.client();
        conn.g.slowlog.record(spec.cmd, argv, took, || Runner {
            peer: client.addr(),
            name: client.name(),
        });
    }
}

/// Counts a call of `name` that started at `started` and answered `reply`, and buffers the reply.
fn ran<S: Transport>(conn: &mut Conn<S>, name: &'static str, started: Instant, reply: Reply) {
    conn.ctx.record_reply(name, started.elapsed(), &reply);
    conn.push(reply);
}

impl Dispatch {
    /// Runs a command found in the table (see the module docs).
    async fn run<S: Transport>(
        &mut self,
        conn: &mut Conn<S>,
        spec: &'static CommandSpec,
        argv: &[Bytes],
    ) {
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
                Some(user) => check_permissions(user, spec, argv).err(),
            };
            if let Some(e) = denied {
                return self.refuse(conn, spec, e).await;
            }
        }
        // As Redis: what an operator runs (CONFIG, ACL, CLIENT KILL, MONITOR) is not shown.
        if conn.g.monitors.active() && !spec.flags.has(Flag::Admin) {
            let peer = conn.session.client().addr();
            conn.g.monitors.feed(spec.cmd, argv, peer);
        }
        // As Redis Cluster, a command for a slot this node does not serve is refused before it
        // is queued in a transaction, and before --maxmemory: only the node that would run it
        // judges its memory (a follower past its limit still redirects). EXEC is refused for
        // its queued commands, with one redirect, and discards the transaction.
        let refused = match (&self.multi, spec.cmd) {
            (Some(tx), Cmd::Exec) => tx.refusal(&conn.g),
            _ => cluster::refusal(&conn.g, spec, argv),
        };
        if let Some(e) = refused {
            if spec.cmd == Cmd::Exec {
                self.multi = None;
                conn.session.client().set_multi(None);
            }
            return self.refuse(conn, spec, e).await;
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
                    let reply = tx.queue(spec, argv.to_vec(), conn.session.client());
                    return conn.push(reply);
                }
            }
        }
        let req = match command::parse(spec, argv, &conn.g.limits) {
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
            Request::Engine(req) => self.engine(conn, Call { spec, req }).await,
            other => {
                self.flush_batch(conn).await;
                let started = Instant::now();
                if let Some(reply) = self.other(conn, spec, other).await {
                    ran(conn, spec.name, started, reply);
                }
            }
        }
    }

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

    async fn engine<S: Transport>(&mut self, conn: &mut Conn<S>, r: Call) {
        let Some(ns) = r.req.namespace() else {
            // NS.LIST, which every shard answers: counted here, as one call.
            self.flush_batch(conn).await;
            let (spec, started) = (r.spec, Instant::now());
            if let Some(reply) = self.other(conn, spec, Request::Engine(r.req)).await {
                ran(conn, spec.name, started, reply);
            }
            return;
        };
        let shard = conn.g.shard_of(ns);
        conn.note_target(shard);
        // One that may park, or one of this thread's shard, runs at once and alone; the others
        // gather into one message per run of commands for the same shard.
        if r.req.may_block() || shard == conn.ctx.id {
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
        if self.batch.is_empty() {
            return;
        }
        // The batch's commands ran before the one being timed, which does not count them.
        let started = (conn.g.slowlog.on() || conn.g.latency.on()).then(Instant::now);
        self.send_batch(conn).await;
        if let Some(t) = started {
            conn.not_running += t.elapsed();
        }
    }

    /// [`Dispatch::flush_batch`]'s work.
    async fn send_batch<S: Transport>(&mut self, conn: &mut Conn<S>) {
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

    /// Runs a request of command `spec` that is not an engine command of one namespace; `None`
    /// when nothing is to be answered.
    async fn other<S: Transport>(
        &mut self,
        conn: &mut Conn<S>,
        spec: &'static CommandSpec,
        req: Request,
    ) -> Option<Reply> {
        Some(match req {
            Request::Engine(EngineRequest::NsList(list)) => ns_list(conn, list.page, None).await,
            // EXEC sends these to their shard as one batch; one run alone gets its reply here.
            Request::Engine(req) => {
                let shard = req
                    .namespace()
                    .map_or(conn.ctx.id, |ns| conn.g.shard_of(ns));
                match one(conn, shard, Call { spec, req }, false).await {
                    Done::Reply(reply) => reply,
                    // may_wait is false: it does not park, nor is refused for a kill.
                    Done::Parked(..) | Done::Killed => shutting_down(),
                }
            }
            Request::Info(sections) => info_reply(conn, &sections, None).await,
            Request::ResetStat => {
                conn.g.ask_all(|reply| ShardMsg::ResetStats { reply }).await;
                Reply::OK
            }
            Request::Monitor => {
                conn.monitor = Some(conn.g.monitors.add());
                Reply::OK
            }
            Request::ClientUnblock { id, error } => unblock(conn, id, error).await,
            // `command` runs these before anything is parsed or queued, so EXEC's queue never
            // holds one; were one to get here, the client gets Redis's answer to a nested one.
            Request::Txn(_) => Reply::Error(Error::Err(
                "Command not allowed inside a transaction".into(),
            )),
            Request::Session(SessionRequest::Reset) => {
                self.multi = None;
                conn.monitor = None;
                conn.session.client().set_multi(None);
                return surface::run(&mut conn.session, &conn.g, SessionRequest::Reset);
            }
            Request::Session(req) => {
                let kills = kills(&req);
                let reply = surface::run(&mut conn.session, &conn.g, req);
                if kills {
                    end_killed_waiters(conn).await;
                }
                return reply;
            }
        })
    }

    /// EXEC: runs the plan multi.rs makes of the transaction, in queue order. The engine
    /// commands run as one batch on their namespace's shard, acquires without waiting; the part
    /// of an NS.LIST, INFO, CLIENT UNBLOCK or kill that reads or changes that shard runs inside
    /// the batch at its place (msg.rs's `TxItem`). The other commands, and those parts on other
    /// shards (which the transaction does not change), run before the batch, in order. The
    /// engine commands are counted on their shard; the others here, each as its own call, as
    /// Redis counts the commands of a transaction.
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
        let home = plan.shard;
        let mut items = Vec::new();
        let mut answers = Vec::with_capacity(plan.steps.len());
        for step in plan.steps {
            let started = Instant::now();
            // Counted once answered (below): the commands that are not the engine's.
            let spec = match &step {
                Step::Run(spec, _) => Some(*spec),
                Step::Engine(_) | Step::Failed(..) => None,
            };
            let answer = match (step, home) {
                (Step::Failed(spec, e), _) => {
                    conn.ctx
                        .record(spec.name, Duration::ZERO, Outcome::Failed, Some(&e));
                    Answer::Now(Reply::Error(e))
                }
                (Step::Engine(r), _) => Answer::Item(push(&mut items, TxItem::Engine(r))),
                (Step::Run(_, Request::Engine(EngineRequest::NsList(list))), Some(_)) => {
                    let item = TxItem::NsList(list.page.clone(), visible_to(conn));
                    Answer::NsList(push(&mut items, item), list.page)
                }
                (Step::Run(_, Request::Info(sections)), Some(_)) => {
                    let item = TxItem::Info(sections.shows("latencystats"));
                    Answer::Info(push(&mut items, item), sections)
                }
                (Step::Run(_, Request::ClientUnblock { id, error }), Some(h)) => {
                    match parked(conn, id) {
                        Some((shard, waiter)) if shard == h => {
                            let item = TxItem::Cancel(waiter, unblock_why(error));
                            Answer::Item(push(&mut items, item))
                        }
                        _ => Answer::Now(unblock(conn, id, error).await),
                    }
                }
                (Step::Run(_, Request::Session(req)), Some(h)) if kills(&req) => {
                    let reply = surface::run(&mut conn.session, &conn.g, req);
                    for (shard, waiter) in conn.g.clients.killed_parked() {
                        if shard == h {
                            items.push(TxItem::Cancel(waiter, Cancel::Disconnected));
                        } else {
                            conn.cancel(shard, waiter, Cancel::Disconnected).await;
                        }
                    }
                    Answer::Now(reply.unwrap_or(Reply::OK))
                }
                (Step::Run(spec, req), _) => {
                    Answer::Now(self.other(conn, spec, req).await.unwrap_or(Reply::OK))
                }
            };
            answers.push((spec, started.elapsed(), answer));
        }
        let done = match home {
            Some(h) if !items.is_empty() => txn(conn, h, items).await,
            _ => Ok(Vec::new()),
        };
        let mut done: Vec<Option<TxDone>> = match done {
            Ok(done) => done.into_iter().map(Some).collect(),
            // The shard does not serve (leadership moving): nothing ran there, and EXEC answers
            // its one refusal. What ran before the batch is counted.
            Err(e) => {
                for (spec, took, answer) in &answers {
                    if let (Some(spec), Answer::Now(reply)) = (spec, answer) {
                        conn.ctx.record_reply(spec.name, *took, reply);
                    }
                }
                return Reply::Error(e);
            }
        };
        let mut take = |i: usize| done.get_mut(i).and_then(Option::take);
        let mut replies = Vec::with_capacity(answers.len());
        for (spec, before, answer) in answers {
            let started = Instant::now();
            let reply = match answer {
                Answer::Now(r) => r,
                Answer::Item(i) => match take(i) {
                    Some(TxDone::Engine(Done::Reply(r))) => r,
                    Some(TxDone::Cancel(ended)) => Reply::Int(i64::from(ended)),
                    // No parker: nothing parks inside a transaction, nor is refused for a kill.
                    _ => shutting_down(),
                },
                Answer::NsList(i, page) => match (take(i), home) {
                    (Some(TxDone::NsList(part)), Some(h)) => {
                        ns_list(conn, page, Some((h, part))).await
                    }
                    _ => shutting_down(),
                },
                Answer::Info(i, sections) => match (take(i), home) {
                    (Some(TxDone::Info(part)), Some(h)) => {
                        info_reply(conn, &sections, Some((h, *part))).await
                    }
                    _ => shutting_down(),
                },
            };
            if let Some(spec) = spec {
                conn.ctx
                    .record_reply(spec.name, before + started.elapsed(), &reply);
            }
            replies.push(reply);
        }
        Reply::Array(replies)
    }
}

/// How EXEC answers one queued command.
enum Answer {
    /// Already answered.
    Now(Reply),
    /// By the result of the transaction's item at this index.
    Item(usize),
    /// By an NS.LIST page: this shard's part is the item at the index, the others' are asked.
    NsList(usize, Page),
    /// By INFO: this shard's figures are the item at the index, the others' are asked.
    Info(usize, Sections),
}

/// Appends `item`; its index.
fn push(items: &mut Vec<TxItem>, item: TxItem) -> usize {
    items.push(item);
    items.len() - 1
}

/// Whether a surface command kills clients (their parked acquires then end).
fn kills(req: &SessionRequest) -> bool {
    matches!(
        req,
        SessionRequest::ClientKill { .. } | SessionRequest::AclDelUser(_)
    )
}

/// Where client `id` has an acquire parked.
fn parked<S: Transport>(conn: &Conn<S>, id: u64) -> Option<(usize, WaiterId)> {
    conn.g.clients.get(id)?.parking().parked()
}

/// Only the namespaces the user may see; filtered on the shards so that pages stay full.
fn visible_to<S: Transport>(conn: &Conn<S>) -> Option<Arc<User>> {
    conn.session.user().cloned().filter(|u| !u.sees_all())
}

/// Runs a transaction's items on `shard`, inline when it is this thread's (none when the shard
/// is gone, at shutdown).
async fn txn<S: Transport>(conn: &mut Conn<S>, shard: usize, items: Vec<TxItem>) -> TxAnswer {
    if shard == conn.ctx.id {
        let done = conn.ctx.exec_txn(items);
        conn.note(shard, conn.ctx.last_lsn());
        return done;
    }
    match conn
        .g
        .ask(shard, |reply| ShardMsg::Txn { items, reply })
        .await
    {
        Some(Durable { value, lsn }) => {
            conn.note(shard, lsn);
            value
        }
        None => Ok(Vec::new()),
    }
}

/// Runs one request on `shard`: inline when it is this thread's (the hot path: no batch, no
/// message), else as a message to its thread.
async fn one<S: Transport>(conn: &mut Conn<S>, shard: usize, r: Call, may_wait: bool) -> Done {
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

/// Runs requests on another shard, an acquire parking for `parker` if given; their replies come
/// back as one message (none when the shard is gone, at shutdown).
async fn remote<S: Transport>(
    conn: &mut Conn<S>,
    shard: usize,
    reqs: Vec<Call>,
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

/// NS.LIST: every shard's part, merged in name order; `known`, a shard's part already taken
/// (inside a transaction, at its place).
async fn ns_list<S: Transport>(
    conn: &mut Conn<S>,
    page: Page,
    mut known: Option<(usize, NsAnswer)>,
) -> Reply {
    let visible_to = visible_to(conn);
    let answers = conn
        .g
        .ask_all(|reply| ShardMsg::NsList {
            page: page.clone(),
            visible_to: visible_to.clone(),
            reply,
        })
        .await;
    let mut parts = Vec::with_capacity(answers.len());
    let mut refused = None;
    for (shard, Durable { value, lsn }) in answers {
        // The page may show changes of that shard that are not durable yet.
        conn.note(shard, lsn);
        match known_or(&mut known, shard, value) {
            Ok(part) => parts.push(part),
            // Cluster mode: a shard that does not serve (leadership moving) has no part.
            Err(e) => refused = Some(e),
        }
    }
    match refused {
        Some(e) => Reply::Error(e),
        None => ns_page_reply(merge_ns_pages(parts, &page)),
    }
}

/// Shard `shard`'s part: `known`'s when it is that shard's (taken inside a transaction, at its
/// place), else the one just asked for.
fn known_or<T>(known: &mut Option<(usize, T)>, shard: usize, asked: T) -> T {
    match known.take_if(|(s, _)| *s == shard) {
        Some((_, part)) => part,
        None => asked,
    }
}

/// INFO: every shard's figures, added up; `known`, a shard's figures already taken (inside a
/// transaction, at its place).
async fn info_reply<S: Transport>(
    conn: &Conn<S>,
    sections: &Sections,
    mut known: Option<(usize, ShardInfo)>,
) -> Reply {
    let latency = sections.shows("latencystats");
    let answers = conn
        .g
        .ask_all(|reply| ShardMsg::Info { latency, reply })
        .await;
    let parts: Vec<_> = answers
        .into_iter()
        .map(|(shard, p)| known_or(&mut known, shard, p))
        .collect();
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
    let ended = match parked(conn, id) {
        Some((shard, waiter)) => conn.cancel(shard, waiter, unblock_why(error)).await,
        None => false,
    };
    Reply::Int(i64::from(ended))
}

/// How CLIENT UNBLOCK ends an acquire: as a time-out, or with the UNBLOCKED error.
fn unblock_why(error: bool) -> Cancel {
    if error {
        Cancel::UnblockError
    } else {
        Cancel::UnblockTimeout
    }
}

fn shutting_down() -> Reply {
    Reply::Error(Error::Err("server is shutting down".into()))
}
