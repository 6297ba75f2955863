//! The `throughput` and `ping` modes.

use std::net::SocketAddr;

use permitd_protocol::request::encode_request;
use permitd_tools::Conn;

use crate::args::{current_thread_runtime, BoxError, PingArgs, Result, Target, ThroughputArgs};
use crate::rounds::{connect_all, into_job, run_jobs, Work};
use crate::setup::{
    call, check_load, connect, create_lease, create_semaphore, ensure_namespace, lease_ttl_for, ok,
    random_hex, unique_suffix,
};

const ACQUIRE_LUA: &str = include_str!("../../../../redis-compat/lua/acquire.lua");
const RELEASE_LUA: &str = include_str!("../../../../redis-compat/lua/release.lua");

pub fn throughput(addr: SocketAddr, a: &ThroughputArgs) -> Result<()> {
    check_load(&a.load)?;
    if a.semaphores == 0 {
        return Err("--semaphores must be > 0".into());
    }
    let c = a.load.connections;
    let p = a.load.pipeline;
    let permits = a.permits.unwrap_or((c * p) as u64).max(1);
    let lease_ttl = lease_ttl_for(&a.load)?;
    let rt = current_thread_runtime()?;
    let run = unique_suffix();
    let sems: Vec<String> = (0..a.semaphores).map(|i| format!("tp_{run}_{i}")).collect();

    // Setup: one control connection, then C workers each with its own lease / holder id.
    let (jobs, mut ctl, cleanup) = rt.block_on(async {
        let mut ctl = connect(addr).await?;
        let mut conns = connect_all(addr, c).await?;
        let mut jobs = Vec::with_capacity(c);
        let mut cleanup: Vec<Vec<Vec<u8>>> = Vec::new();
        match a.target {
            Target::Permitd | Target::PermitdAll | Target::PermitdMulti => {
                if a.target != Target::Permitd && sems.len() < 2 {
                    return Err(
                        format!("--target {} needs --semaphores >= 2", a.target.name()).into(),
                    );
                }
                ensure_namespace(&mut ctl, &a.ns).await?;
                for s in &sems {
                    create_semaphore(&mut ctl, &a.ns, s, permits).await?;
                    cleanup.push(vec![
                        b"SEM.DELETE".to_vec(),
                        a.ns.clone().into(),
                        s.clone().into(),
                    ]);
                }
                for (i, conn) in conns.drain(..).enumerate() {
                    let mut conn = conn;
                    let lease =
                        create_lease(&mut conn, &a.ns, &format!("permitd-load-{i}"), lease_ttl)
                            .await?;
                    let (s1, s2) = (&sems[i % sems.len()], &sems[(i + 1) % sems.len()]);
                    let mut batch = Vec::new();
                    for _ in 0..p {
                        permitd_unit(&mut batch, a.target, &a.ns, s1, s2, &lease);
                    }
                    cleanup.push(vec![
                        b"LEASE.REVOKE".to_vec(),
                        a.ns.clone().into(),
                        lease.into(),
                    ]);
                    jobs.push(into_job(i, conn, batch)?);
                }
            }
            Target::Lua => {
                let acq = script_load(&mut ctl, ACQUIRE_LUA).await?;
                let rel = script_load(&mut ctl, RELEASE_LUA).await?;
                let ttl_ms = (lease_ttl * 1000).to_string();
                let permits = permits.to_string();
                for s in &sems {
                    let (hk, wk) = lua_keys(&a.ns, s);
                    cleanup.push(vec![b"DEL".to_vec(), hk.into(), wk.into()]);
                }
                for (i, conn) in conns.drain(..).enumerate() {
                    let holder = format!("h_{}", random_hex(16)?);
                    let (hk, wk) = lua_keys(&a.ns, &sems[i % sems.len()]);
                    let mut batch = Vec::new();
                    for _ in 0..p {
                        encode_request(
                            &mut batch,
                            &[
                                b"EVALSHA",
                                acq.as_bytes(),
                                b"2",
                                hk.as_bytes(),
                                wk.as_bytes(),
                                holder.as_bytes(),
                                b"1",
                                permits.as_bytes(),
                                ttl_ms.as_bytes(),
                            ],
                        );
                        encode_request(
                            &mut batch,
                            &[
                                b"EVALSHA",
                                rel.as_bytes(),
                                b"2",
                                hk.as_bytes(),
                                wk.as_bytes(),
                                holder.as_bytes(),
                            ],
                        );
                    }
                    jobs.push(into_job(i, conn, batch)?);
                }
            }
        }
        Ok::<_, BoxError>((jobs, ctl, cleanup))
    })?;

    eprintln!(
        "permitd-load: throughput target={} c={c} P={p} permits={permits} semaphores={} warmup={}s duration={}s threads={}",
        a.target.name(),
        sems.len(),
        a.load.warmup,
        a.load.duration,
        a.load.threads
    );
    let (counts, secs) = run_jobs(jobs, Work::Pairs(a.target), &a.load)?;

    // Best-effort cleanup, so a long-lived server is left as it was.
    rt.block_on(async {
        for cmd in &cleanup {
            let args: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
            let _ = call(&mut ctl, &args).await;
        }
    });

    let pairs_per_sec = counts.units as f64 / secs;
    let ratio = if counts.units > 0 {
        counts.acquired as f64 / counts.units as f64
    } else {
        0.0
    };
    println!(
        "{{\"mode\":\"throughput\",\"target\":\"{}\",\"connections\":{c},\"pipeline\":{p},\"permits\":{permits},\"semaphores\":{},\"threads\":{},\"duration_s\":{secs},\"pairs\":{},\"pairs_per_sec\":{:.1},\"commands_per_sec\":{:.1},\"acquired\":{},\"unavailable\":{},\"timed_out\":{},\"acquired_ratio\":{:.4}}}",
        a.target.name(),
        sems.len(),
        a.load.threads,
        counts.units,
        pairs_per_sec,
        2.0 * pairs_per_sec,
        counts.acquired,
        counts.unavailable,
        counts.timed_out,
        ratio
    );
    Ok(())
}

/// One unit of work against permitd: acquire and release, of `s1` alone (`Permitd`) or of `s1`
/// and `s2` (`PermitdAll`: one SEM.ACQUIREALL; `PermitdMulti`: two SEM.ACQUIRE in a MULTI).
fn permitd_unit(batch: &mut Vec<u8>, t: Target, ns: &str, s1: &str, s2: &str, lease: &str) {
    let (ns, lease) = (ns.as_bytes(), lease.as_bytes());
    let acquire = |batch: &mut Vec<u8>, s: &str| {
        encode_request(
            batch,
            &[b"SEM.ACQUIRE", ns, s.as_bytes(), lease, b"1", b"0"],
        );
    };
    let release = |batch: &mut Vec<u8>, s: &str| {
        encode_request(batch, &[b"SEM.RELEASE", ns, s.as_bytes(), lease]);
    };
    match t {
        Target::Permitd => {
            acquire(batch, s1);
            release(batch, s1);
            return;
        }
        Target::PermitdAll => encode_request(
            batch,
            &[
                b"SEM.ACQUIREALL",
                ns,
                lease,
                b"0",
                s1.as_bytes(),
                b"1",
                s2.as_bytes(),
                b"1",
            ],
        ),
        Target::PermitdMulti => {
            encode_request(batch, &[b"MULTI"]);
            acquire(batch, s1);
            acquire(batch, s2);
            encode_request(batch, &[b"EXEC"]);
        }
        Target::Lua => unreachable!("lua units are EVALSHA calls"),
    }
    release(batch, s1);
    release(batch, s2);
}

fn lua_keys(prefix: &str, sem: &str) -> (String, String) {
    // One hash tag, so both keys of a semaphore share a Redis Cluster slot.
    (
        format!("{{{prefix}:{sem}}}:holders"),
        format!("{{{prefix}:{sem}}}:weights"),
    )
}

async fn script_load(conn: &mut Conn, body: &str) -> Result<String> {
    let v = ok(
        call(conn, &[b"SCRIPT", b"LOAD", body.as_bytes()]).await?,
        "SCRIPT LOAD",
    )?;
    v.bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .ok_or_else(|| format!("SCRIPT LOAD: unexpected reply {v:?}").into())
}

pub fn ping(addr: SocketAddr, a: &PingArgs) -> Result<()> {
    check_load(&a.load)?;
    let c = a.load.connections;
    let p = a.load.pipeline;
    let rt = current_thread_runtime()?;
    let jobs = rt.block_on(async {
        let conns = connect_all(addr, c).await?;
        let mut batch = Vec::new();
        for _ in 0..p {
            encode_request(&mut batch, &[b"PING"]);
        }
        conns
            .into_iter()
            .enumerate()
            .map(|(i, conn)| into_job(i, conn, batch.clone()))
            .collect::<Result<Vec<_>>>()
    })?;
    let (counts, secs) = run_jobs(jobs, Work::Ping, &a.load)?;
    println!(
        "{{\"mode\":\"ping\",\"target\":\"{}\",\"connections\":{c},\"pipeline\":{p},\"threads\":{},\"duration_s\":{secs},\"commands\":{},\"commands_per_sec\":{:.1}}}",
        a.target.name(),
        a.load.threads,
        counts.units,
        counts.units as f64 / secs
    );
    Ok(())
}
