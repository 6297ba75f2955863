//! The timed loop shared by throughput and ping: each connection sends its batch, reads every
//! reply of it, and repeats until the time is up, on a few OS threads.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use permitd_tools::Conn;
use tokio::net::TcpStream;

use crate::args::{current_thread_runtime, LoadArgs, Result, Target, READ_CHUNK, REPLY_TIMEOUT};
use crate::replies::{
    exec_outcome, lua_outcome, lua_released, permitd_outcome, permitd_released, pong, simple,
    Outcome,
};
use crate::setup::connect;

/// What one connection sends per round and how it reads the replies.
#[derive(Copy, Clone)]
pub enum Work {
    /// `pipeline` x (acquire, release) of a target.
    Pairs(Target),
    /// `pipeline` x PING.
    Ping,
}

/// One connection's work, ready to move to a worker thread.
pub struct Job {
    /// The connection's index, for error messages.
    id: usize,
    stream: std::net::TcpStream,
    batch: Vec<u8>,
}

/// What the measured rounds got back.
#[derive(Default, Debug, Clone, Copy)]
pub struct Counts {
    /// Units of work answered: acquire/release pairs, or PINGs.
    pub units: u64,
    pub acquired: u64,
    pub unavailable: u64,
    pub timed_out: u64,
}

impl Counts {
    fn add(&mut self, o: Counts) {
        self.units += o.units;
        self.acquired += o.acquired;
        self.unavailable += o.unavailable;
        self.timed_out += o.timed_out;
    }
}

async fn drive(
    id: usize,
    conn: Conn,
    batch: Vec<u8>,
    work: Work,
    pipeline: usize,
    measure_from: Instant,
    until: Instant,
) -> Result<Counts> {
    let mut at = (0u64, 0usize); // (round, unit) in progress, for the error message
    drive_rounds(conn, &batch, work, pipeline, measure_from, until, &mut at)
        .await
        .map_err(|e| {
            format!(
                "connection {id}, round {}, reply pair {} of {pipeline}: {e}",
                at.0 + 1,
                at.1 + 1
            )
            .into()
        })
}

async fn drive_rounds(
    mut conn: Conn,
    batch: &[u8],
    work: Work,
    pipeline: usize,
    measure_from: Instant,
    until: Instant,
    at: &mut (u64, usize),
) -> Result<Counts> {
    let mut counts = Counts::default();
    while Instant::now() < until {
        conn.send(batch).await?;
        let mut round = Counts::default();
        for unit in 0..pipeline {
            at.1 = unit;
            match work {
                Work::Pairs(t) => match read_unit(&mut conn, t).await? {
                    Outcome::Acquired => round.acquired += 1,
                    Outcome::Unavailable => round.unavailable += 1,
                    Outcome::TimedOut => round.timed_out += 1,
                },
                Work::Ping => conn.next(REPLY_TIMEOUT, pong).await??,
            }
            round.units += 1;
        }
        let done = Instant::now();
        if done >= measure_from && done <= until {
            counts.add(round);
        }
        at.0 += 1;
    }
    Ok(counts)
}

/// Reads the replies of one unit of `t` (see `throughput::permitd_unit`); returns how its
/// acquire ended.
async fn read_unit(conn: &mut Conn, t: Target) -> Result<Outcome> {
    let outcome = match t {
        Target::Lua => {
            let o = conn.next(REPLY_TIMEOUT, lua_outcome).await??;
            conn.next(REPLY_TIMEOUT, lua_released).await??;
            return Ok(o);
        }
        Target::Permitd => {
            let o = conn.next(REPLY_TIMEOUT, permitd_outcome).await??;
            conn.next(REPLY_TIMEOUT, permitd_released).await??;
            return Ok(o);
        }
        Target::PermitdAll => conn.next(REPLY_TIMEOUT, permitd_outcome).await??,
        Target::PermitdMulti => {
            conn.next(REPLY_TIMEOUT, |r| simple(r, b"OK")).await??;
            for _ in 0..2 {
                conn.next(REPLY_TIMEOUT, |r| simple(r, b"QUEUED")).await??;
            }
            conn.next(REPLY_TIMEOUT, exec_outcome).await??
        }
    };
    for _ in 0..2 {
        conn.next(REPLY_TIMEOUT, permitd_released).await??;
    }
    Ok(outcome)
}

/// Runs the jobs on `threads` OS threads with one current-thread runtime each; returns the
/// summed counts and the measured seconds.
pub fn run_jobs(jobs: Vec<Job>, work: Work, load: &LoadArgs) -> Result<(Counts, f64)> {
    let threads = load.threads.min(jobs.len()).max(1);
    let mut per_thread: Vec<Vec<Job>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, j) in jobs.into_iter().enumerate() {
        per_thread[i % threads].push(j);
    }
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(load.warmup);
    let until = measure_from + Duration::from_secs_f64(load.duration);
    let pipeline = load.pipeline;
    let handles: Vec<_> = per_thread
        .into_iter()
        .map(|jobs| {
            std::thread::spawn(move || -> Result<Counts> {
                let rt = current_thread_runtime()?;
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    for job in jobs {
                        let conn = Conn::new(TcpStream::from_std(job.stream)?, READ_CHUNK)?;
                        tasks.push(tokio::spawn(drive(
                            job.id,
                            conn,
                            job.batch,
                            work,
                            pipeline,
                            measure_from,
                            until,
                        )));
                    }
                    let mut total = Counts::default();
                    for t in tasks {
                        total.add(t.await.map_err(|e| format!("worker task: {e}"))??);
                    }
                    Ok(total)
                })
            })
        })
        .collect();
    let mut total = Counts::default();
    for h in handles {
        total.add(h.join().map_err(|_| "worker thread panicked")??);
    }
    Ok((total, load.duration))
}

pub async fn connect_all(addr: SocketAddr, n: usize) -> Result<Vec<Conn>> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(connect(addr).await?);
    }
    Ok(conns)
}

pub fn into_job(id: usize, conn: Conn, batch: Vec<u8>) -> Result<Job> {
    Ok(Job {
        id,
        stream: conn.into_std()?,
        batch,
    })
}
