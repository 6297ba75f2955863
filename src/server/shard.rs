//! A shard thread: a current-thread tokio runtime that owns one engine shard, serves the
//! connections accepted onto it, runs its own namespaces' commands inline, answers the other
//! shards' messages, and fires the engine's deadlines with a timer (no periodic sweep).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, Notify};

use super::Global;
use crate::command::EngineRequest;
use crate::engine::page::{Page, PageOf};
use crate::engine::state::FastMap;
use crate::engine::types::{Name, Nanos};
use crate::engine::{Cancel, Counts, Exec, Shard, Stats, WaiterId};
use crate::protocol::Reply;

/// The result of one engine request run by a shard.
#[derive(Debug)]
pub enum Done {
    /// Answered.
    Reply(Reply),
    /// Parked: the reply comes on the receiver; the id cancels it.
    Parked(oneshot::Receiver<Reply>, WaiterId),
}

/// Messages a shard thread accepts.
#[derive(Debug)]
pub enum ShardMsg {
    /// A new connection to serve on this thread.
    Conn(std::net::TcpStream),
    /// Run requests in order (stopping after one that parks); answer with their results.
    Exec {
        /// Requests, all for namespaces of this shard.
        reqs: Vec<EngineRequest>,
        /// False inside MULTI: acquires never wait.
        may_wait: bool,
        /// Results, one per request run.
        reply: oneshot::Sender<Vec<Done>>,
    },
    /// Take a parked acquire out of its queue.
    Cancel {
        /// The parked acquire.
        waiter: WaiterId,
        /// Why.
        why: Cancel,
        /// Whether it was still parked.
        reply: oneshot::Sender<bool>,
    },
    /// This shard's part of an NS.LIST page.
    NsList {
        /// The page asked for.
        page: Page,
        /// This shard's candidates.
        reply: oneshot::Sender<PageOf<Name, (Name, Reply)>>,
    },
    /// Counters and sizes for INFO.
    Info {
        /// Answer.
        reply: oneshot::Sender<(Counts, Stats)>,
    },
}

/// What a shard thread's tasks share.
pub struct ShardCtx {
    /// This shard's index.
    pub id: usize,
    /// Server-wide state.
    pub global: Arc<Global>,
    engine: RefCell<Shard>,
    parked: RefCell<FastMap<WaiterId, oneshot::Sender<Reply>>>,
    timer_wake: Notify,
    /// The deadline the timer task sleeps until (None: no deadline).
    scheduled: Cell<Option<Nanos>>,
    last_now: Cell<Nanos>,
}

/// Wall-clock nanoseconds since the Unix epoch.
pub fn wall_nanos() -> Nanos {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as Nanos)
}

impl ShardCtx {
    fn new(id: usize, global: Arc<Global>) -> ShardCtx {
        let engine = Shard::new(global.limits.clone(), global.namespace_count.clone());
        ShardCtx {
            id,
            global,
            engine: RefCell::new(engine),
            parked: RefCell::new(FastMap::default()),
            timer_wake: Notify::new(),
            scheduled: Cell::new(None),
            last_now: Cell::new(0),
        }
    }

    /// The engine's `now`: the wall clock, never moving backwards on this shard.
    fn now(&self) -> Nanos {
        let now = wall_nanos().max(self.last_now.get());
        self.last_now.set(now);
        now
    }

    /// Runs one request of this shard's namespaces.
    pub fn exec(&self, req: EngineRequest, may_wait: bool) -> Done {
        let now = self.now();
        let exec = self.engine.borrow_mut().execute(now, req, may_wait);
        let done = match exec {
            Exec::Reply(r) => Done::Reply(r),
            Exec::Parked(id) => {
                let (tx, rx) = oneshot::channel();
                self.parked.borrow_mut().insert(id, tx);
                Done::Parked(rx, id)
            }
        };
        self.settle();
        done
    }

    /// Runs requests in order, stopping after the first that parks.
    pub fn exec_batch(&self, reqs: Vec<EngineRequest>, may_wait: bool) -> Vec<Done> {
        let mut out = Vec::with_capacity(reqs.len());
        for r in reqs {
            let d = self.exec(r, may_wait);
            let parked = matches!(d, Done::Parked(..));
            out.push(d);
            if parked {
                break;
            }
        }
        out
    }

    /// Takes a parked acquire of this shard out of its queue.
    pub fn cancel(&self, waiter: WaiterId, why: Cancel) -> bool {
        let now = self.now();
        let was = self.engine.borrow_mut().cancel(now, waiter, why);
        if why == Cancel::Disconnected {
            self.parked.borrow_mut().remove(&waiter);
        }
        self.settle();
        was
    }

    /// Delivers the engine's replies to parked clients and re-arms the timer if needed.
    fn settle(&self) {
        let outbox = self.engine.borrow_mut().take_outbox();
        if !outbox.is_empty() {
            let mut parked = self.parked.borrow_mut();
            for (id, reply) in outbox {
                if let Some(tx) = parked.remove(&id) {
                    // A client that left meanwhile drops the reply; the engine moved on.
                    let _ = tx.send(reply);
                }
            }
        }
        let next = self.engine.borrow().next_deadline();
        if let Some(n) = next {
            if self.scheduled.get().is_none_or(|s| n < s) {
                self.timer_wake.notify_one();
            }
        }
    }

    /// Fires deadlines on time: sleeps until the engine's next one, or until woken because an
    /// earlier one appeared.
    async fn timer_loop(self: Rc<Self>) {
        loop {
            let next = self.engine.borrow().next_deadline();
            self.scheduled.set(next);
            match next {
                None => self.timer_wake.notified().await,
                Some(t) => {
                    let wait = t - wall_nanos();
                    if wait > 0 {
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_nanos(wait as u64)) => {}
                            _ = self.timer_wake.notified() => {}
                        }
                    }
                }
            }
            let now = self.now();
            self.engine.borrow_mut().advance(now);
            self.settle();
        }
    }

    fn handle(self: &Rc<Self>, msg: ShardMsg) {
        match msg {
            ShardMsg::Conn(stream) => match tokio::net::TcpStream::from_std(stream) {
                Ok(s) => {
                    tokio::task::spawn_local(super::conn::serve(self.clone(), s));
                }
                Err(e) => tracing::warn!(error = %e, "could not adopt a connection"),
            },
            ShardMsg::Exec {
                reqs,
                may_wait,
                reply,
            } => {
                let _ = reply.send(self.exec_batch(reqs, may_wait));
            }
            ShardMsg::Cancel { waiter, why, reply } => {
                let _ = reply.send(self.cancel(waiter, why));
            }
            ShardMsg::NsList { page, reply } => {
                let now = self.now();
                let mut engine = self.engine.borrow_mut();
                engine.advance(now);
                let _ = reply.send(engine.ns_list_part(&page));
                drop(engine);
                self.settle();
            }
            ShardMsg::Info { reply } => {
                let now = self.now();
                let mut engine = self.engine.borrow_mut();
                engine.advance(now);
                let _ = reply.send((engine.counts(), engine.stats()));
                drop(engine);
                self.settle();
            }
        }
    }
}

/// Starts shard thread `id`; it runs until the server shuts down.
pub fn spawn(
    id: usize,
    global: Arc<Global>,
    mut rx: mpsc::UnboundedReceiver<ShardMsg>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("shard-{id}"))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let ctx = Rc::new(ShardCtx::new(id, global.clone()));
                tokio::task::spawn_local(ctx.clone().timer_loop());
                let mut shutdown = global.shutdown.subscribe();
                loop {
                    tokio::select! {
                        msg = rx.recv() => match msg {
                            Some(m) => ctx.handle(m),
                            None => break,
                        },
                        _ = shutdown.wait_for(|s| *s) => break,
                    }
                }
                // Let connections see the shutdown, finish their in-flight replies and close.
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                while global.clients.count_on_shard(id) > 0
                    && tokio::time::Instant::now() < deadline
                {
                    while let Ok(m) = rx.try_recv() {
                        ctx.handle(m);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            });
        })
}
