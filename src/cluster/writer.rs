//! The Raft log's writer thread: every change to the log's files runs here, in the order the
//! store asked for them (openraft's rule: a later write never overtakes an earlier one, votes
//! included). Appends are group-committed: everything queued is written, then one fdatasync
//! per file, then their `IOFlushed` callbacks fire.

use std::fs::File;
use std::io::{self, Write};
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use bytes::Bytes;
use openraft::storage::IOFlushed;
use tokio::sync::oneshot;

use super::TypeConfig;

/// A file operation other than an append, run in its turn; its result goes back to the caller.
pub type Op = Box<dyn FnOnce() -> io::Result<()> + Send>;

enum Job {
    /// Frames to append to a segment; `new_in` is the folder of a segment just created (synced
    /// with the data, so that the file itself survives a crash).
    Append {
        file: Arc<File>,
        bytes: Bytes,
        new_in: Option<PathBuf>,
        done: IOFlushed<TypeConfig>,
    },
    Op {
        op: Op,
        done: oneshot::Sender<io::Result<()>>,
    },
}

/// The handle the store queues work on; the thread ends when the handle is dropped.
pub struct Writer {
    tx: Sender<Job>,
}

impl Writer {
    /// Starts the thread.
    pub fn start() -> io::Result<Writer> {
        let (tx, rx) = channel();
        std::thread::Builder::new()
            .name("raft-log".into())
            .spawn(move || run(rx))?;
        Ok(Writer { tx })
    }

    /// Queues an append; `done` fires once it is on disk (or failed).
    pub fn append(
        &self,
        file: Arc<File>,
        bytes: Bytes,
        new_in: Option<PathBuf>,
        done: IOFlushed<TypeConfig>,
    ) {
        let job = Job::Append {
            file,
            bytes,
            new_in,
            done,
        };
        if let Err(e) = self.tx.send(job) {
            if let Job::Append { done, .. } = e.0 {
                done.io_completed(Err(stopped()));
            }
        }
    }

    /// Queues `op` after everything queued before; the receiver gets its result.
    pub fn run(&self, op: Op) -> oneshot::Receiver<io::Result<()>> {
        let (done, rx) = oneshot::channel();
        // A send fails only with the thread gone: the dropped sender then reads as `stopped`.
        let _ = self.tx.send(Job::Op { op, done });
        rx
    }
}

/// The error of a job the thread could not run.
pub fn stopped() -> io::Error {
    io::Error::other("the Raft log's writer thread has stopped")
}

/// Appends written and waiting for their sync.
#[derive(Default)]
struct Unsynced {
    files: Vec<Arc<File>>,
    dirs: Vec<PathBuf>,
    done: Vec<IOFlushed<TypeConfig>>,
}

fn run(rx: Receiver<Job>) {
    // After a failed write or sync a file's state is unknown (as `persist` holds): every later
    // job fails too, and openraft stops on the first error.
    let mut failed: Option<String> = None;
    let mut unsynced = Unsynced::default();
    while let Ok(first) = rx.recv() {
        let mut next = Some(first);
        while let Some(job) = next.take().or_else(|| rx.try_recv().ok()) {
            match job {
                Job::Append {
                    file,
                    bytes,
                    new_in,
                    done,
                } => {
                    let written = check(&failed).and_then(|()| (&*file).write_all(&bytes));
                    if let Err(e) = written {
                        failed.get_or_insert_with(|| e.to_string());
                        done.io_completed(Err(e));
                        continue;
                    }
                    if !unsynced.files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                        unsynced.files.push(file);
                    }
                    unsynced.dirs.extend(new_in);
                    unsynced.done.push(done);
                }
                Job::Op { op, done } => {
                    sync(&mut unsynced, &mut failed);
                    let r = check(&failed).and_then(|()| op());
                    if let Err(e) = &r {
                        failed.get_or_insert_with(|| e.to_string());
                    }
                    let _ = done.send(r);
                }
            }
        }
        sync(&mut unsynced, &mut failed);
    }
}

fn check(failed: &Option<String>) -> io::Result<()> {
    match failed {
        None => Ok(()),
        Some(e) => Err(io::Error::other(format!(
            "an earlier write of the Raft log failed ({e})"
        ))),
    }
}

/// fdatasyncs the files written (and the folders of new ones), then tells their callers.
fn sync(unsynced: &mut Unsynced, failed: &mut Option<String>) {
    let files = std::mem::take(&mut unsynced.files);
    let dirs = std::mem::take(&mut unsynced.dirs);
    let synced = check(failed).and_then(|()| {
        for f in &files {
            f.sync_data()?;
        }
        for d in &dirs {
            crate::persist::sync_dir(d)?;
        }
        Ok(())
    });
    if let Err(e) = &synced {
        failed.get_or_insert_with(|| e.to_string());
    }
    for done in unsynced.done.drain(..) {
        done.io_completed(match &synced {
            Ok(()) => Ok(()),
            Err(e) => Err(io::Error::new(e.kind(), e.to_string())),
        });
    }
}
