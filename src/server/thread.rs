//! A shard thread: a current-thread tokio runtime that runs one engine shard (worker.rs) and
//! serves the connections handed to it (conn.rs, each on its own task). Its main loop reads the
//! thread's inbox: connections, accepted or moving here, become tasks; requests go to the
//! shard. After many of its connections closed it trims (see [`crate::alloc::trim`]), to give
//! the allocator's free memory of the thread back to the OS.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};

use super::background::Background;
use super::conn;
use super::dispatch::Dispatch;
use super::global::Global;
use super::msg::ThreadMsg;
use super::worker::ShardCtx;
use crate::persist::{ShardState, Store};

/// How long a shard waits, once its connections fell to half their peak, before it gives memory
/// back: a burst of disconnects is trimmed once, and trimming runs at most once per delay.
const TRIM_DELAY: Duration = Duration::from_secs(1);

/// How long a stopping thread lets its connections write the replies they owe.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Starts shard thread `id`; it runs until the server shuts down.
pub fn spawn(
    id: usize,
    global: Arc<Global>,
    mut rx: mpsc::UnboundedReceiver<ThreadMsg>,
    state: ShardState,
    store: Store,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let background = Background::start(format!("shard-{id}-log"))?;
    std::thread::Builder::new()
        .name(format!("shard-{id}"))
        .spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a tokio runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async move {
                let ctx = ShardCtx::start(id, global.clone(), state, store, background);
                let thread = Rc::new(Thread {
                    ctx,
                    conns: Cell::new(0),
                    conns_high: Cell::new(0),
                    trim_wake: Notify::new(),
                });
                tokio::task::spawn_local(thread.clone().trim_loop());
                let mut shutdown = global.watch_shutdown();
                loop {
                    tokio::select! {
                        msg = rx.recv() => match msg {
                            Some(m) => thread.handle(m),
                            None => break,
                        },
                        _ = shutdown.wait_for(|s| *s) => break,
                    }
                }
                // Let connections see the shutdown, finish their in-flight replies and close.
                let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
                while global.clients.count_on_shard(id) > 0
                    && tokio::time::Instant::now() < deadline
                {
                    while let Ok(m) = rx.try_recv() {
                        thread.handle(m);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                thread.ctx.final_flush();
            });
        })
}

/// What the thread's main loop and its trim task share.
struct Thread {
    ctx: Rc<ShardCtx>,
    /// Connections served by this thread now, and their most since the last trim.
    conns: Cell<usize>,
    conns_high: Cell<usize>,
    trim_wake: Notify,
}

impl Thread {
    fn handle(self: &Rc<Self>, msg: ThreadMsg) {
        match msg {
            ThreadMsg::Accepted { stream, tls, seat } => {
                match tokio::net::TcpStream::from_std(stream) {
                    Ok(s) => self.adopt(move |ctx| conn::serve::<Dispatch>(ctx, s, tls, seat)),
                    Err(e) => tracing::warn!(error = %e, "could not adopt a connection"),
                }
            }
            ThreadMsg::Moving(m) => self.adopt(move |ctx| conn::resume::<Dispatch>(ctx, *m)),
            ThreadMsg::Shard(m) => self.ctx.handle(m),
        }
    }

    /// Serves a connection on this thread: `serve` runs it until it closes or moves away.
    fn adopt<F: std::future::Future<Output = ()> + 'static>(
        self: &Rc<Self>,
        serve: impl FnOnce(Rc<ShardCtx>) -> F + 'static,
    ) {
        let n = self.conns.get() + 1;
        self.conns.set(n);
        self.conns_high.set(self.conns_high.get().max(n));
        let thread = self.clone();
        // The connection's future is made inside the task: made outside and moved in, it
        // would be held twice (captured, then awaited), doubling each connection's task.
        tokio::task::spawn_local(async move {
            serve(thread.ctx.clone()).await;
            thread.connection_closed();
        });
    }

    /// Counts a closed connection; once the thread serves half of its peak or fewer, the memory
    /// of the others is to be given back.
    fn connection_closed(&self) {
        let n = self.conns.get() - 1;
        self.conns.set(n);
        if n * 2 <= self.conns_high.get() {
            self.trim_wake.notify_one();
        }
    }

    /// Gives back memory after connections went away: the shard's maps shrink, and the
    /// allocator returns this thread's free pages to the OS (an idle allocator thread would
    /// otherwise keep them, and never run its own delayed purges). It runs only after
    /// disconnects, never on a timer, so an idle or steady server pays nothing.
    async fn trim_loop(self: Rc<Self>) {
        loop {
            self.trim_wake.notified().await;
            tokio::time::sleep(TRIM_DELAY).await;
            self.ctx.shrink();
            crate::alloc::trim();
            self.ctx.global.trim_acceptor();
            self.conns_high.set(self.conns.get());
        }
    }
}
