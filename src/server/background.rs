//! A shard's background thread for the log's blocking I/O: writes with their `fdatasync`, the
//! `everysec` syncs and snapshots. Like Redis's bio threads, it is made once, when the shard
//! starts, and lives as long as the shard. Jobs run one at a time, in order: a snapshot that
//! comes while an `everysec` sync runs starts after it, and the shard encoding the snapshot
//! waits for that sync once the bounded channel of pieces is full.
//!
//! tokio's blocking pool did this before. Its threads came and went with the load; a thread
//! spawned during a burst of connections left its handle and name in the burst's allocator pages,
//! which then stayed resident after the burst (`scripts/soak`).

use std::future::Future;
use std::sync::mpsc::{sync_channel, SyncSender};

use tokio::sync::oneshot;

/// A job for the background thread.
type Job = Box<dyn FnOnce() + Send>;

/// Jobs that may wait at once. A shard awaits each job it sends: its flush loop and its
/// everysec loop have at most one each outstanding, so sending never blocks the shard.
const QUEUE: usize = 4;

/// A shard's background thread (see the module docs). Dropping it ends the thread once the jobs
/// already sent are done.
pub struct Background {
    jobs: SyncSender<Job>,
}

/// The background thread is gone (a job panicked), so the job's result will never come.
#[derive(Debug)]
pub struct Gone;

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the background thread stopped")
    }
}

impl Background {
    /// Starts the thread, named `name`.
    pub fn start(name: String) -> std::io::Result<Background> {
        let (jobs, rx) = sync_channel::<Job>(QUEUE);
        std::thread::Builder::new().name(name).spawn(move || {
            for job in rx {
                job();
            }
        })?;
        Ok(Background { jobs })
    }

    /// Sends `f` to the background thread at once (not when the result is first awaited: a
    /// snapshot's writer must run while the shard feeds it); the shard goes on serving while it
    /// runs.
    pub fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> impl Future<Output = Result<T, Gone>> {
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(f());
        });
        let sent = self.jobs.send(job);
        async move {
            sent.map_err(|_| Gone)?;
            rx.await.map_err(|_| Gone)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_jobs_off_the_calling_thread_in_order() {
        let bg = Background::start("bg-test".into()).unwrap();
        let here = std::thread::current().id();
        let (there, name) = bg
            .run(|| {
                let t = std::thread::current();
                (t.id(), t.name().map(str::to_owned))
            })
            .await
            .unwrap();
        assert_ne!(there, here);
        assert_eq!(name.as_deref(), Some("bg-test"));
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for i in 0..10 {
            let log = log.clone();
            bg.run(move || log.lock().unwrap().push(i)).await.unwrap();
        }
        assert_eq!(*log.lock().unwrap(), (0..10).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_panicked_job_reports_the_thread_gone() {
        let bg = Background::start("bg-panic".into()).unwrap();
        assert!(bg.run(|| panic!("boom")).await.is_err());
        // The thread is gone: later jobs fail rather than hang.
        assert!(bg.run(|| 1).await.is_err());
    }
}
