//! The `handoff` mode: the latency from a release to the grant of the acquire parked behind it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use permitd_protocol::request::encode_request;
use permitd_tools::Conn;

use crate::args::{
    current_thread_runtime, BoxError, HandoffArgs, Result, MAX_LEASE_TTL, REPLY_TIMEOUT,
};
use crate::replies::{permitd_outcome, permitd_released, Outcome};
use crate::setup::{
    call, connect, create_lease, create_semaphore, ensure_namespace, ok, unique_suffix,
};

pub fn handoff(addr: SocketAddr, a: &HandoffArgs) -> Result<()> {
    if a.count == 0 {
        return Err("--count must be > 0".into());
    }
    let rt = current_thread_runtime()?;
    let deadline = Instant::now() + Duration::from_secs_f64(a.max_seconds.clamp(1.0, 600.0));
    let sem = format!("ho_{}", unique_suffix());
    let mut samples = rt.block_on(async {
        let mut ctl = connect(addr).await?;
        let mut x = connect(addr).await?;
        let mut y = connect(addr).await?;
        ensure_namespace(&mut ctl, &a.ns).await?;
        create_semaphore(&mut ctl, &a.ns, &sem, 1).await?;
        let lx = create_lease(&mut x, &a.ns, "permitd-load-handoff-a", MAX_LEASE_TTL).await?;
        let ly = create_lease(&mut y, &a.ns, "permitd-load-handoff-b", MAX_LEASE_TTL).await?;
        let ns = a.ns.as_bytes();
        let sb = sem.as_bytes();

        // x takes the only permit.
        let mut buf = Vec::new();
        encode_request(
            &mut buf,
            &[b"SEM.ACQUIRE", ns, sb, lx.as_bytes(), b"1", b"0"],
        );
        x.send(&buf).await?;
        if x.next(REPLY_TIMEOUT, permitd_outcome).await?? != Outcome::Acquired {
            return Err("the first holder did not acquire the free permit".into());
        }

        let mut holder = (&mut x, lx.as_str());
        let mut waiter = (&mut y, ly.as_str());
        let mut park_probe = ParkProbe::Info;
        let mut samples = Vec::with_capacity(a.count);
        for i in 0..a.warmup + a.count {
            if Instant::now() > deadline {
                return Err(format!("handoff: --max-seconds reached after {i} hand-offs").into());
            }
            // The waiter parks ...
            buf.clear();
            encode_request(
                &mut buf,
                &[
                    b"SEM.ACQUIRE",
                    ns,
                    sb,
                    waiter.1.as_bytes(),
                    b"1",
                    a.timeout.as_bytes(),
                ],
            );
            waiter.0.send(&buf).await?;
            park_probe.wait_parked(&mut ctl).await?;
            if a.gap_ms > 0.0 {
                tokio::time::sleep(Duration::from_secs_f64(a.gap_ms / 1000.0)).await;
            }
            // ... the holder releases, and the clock runs until the waiter hears ACQUIRED.
            buf.clear();
            encode_request(&mut buf, &[b"SEM.RELEASE", ns, sb, holder.1.as_bytes()]);
            let t0 = Instant::now();
            holder.0.send(&buf).await?;
            let outcome = waiter.0.next(REPLY_TIMEOUT, permitd_outcome).await??;
            let elapsed = t0.elapsed();
            if outcome != Outcome::Acquired {
                return Err(format!("handoff: the waiter got {outcome:?}, not ACQUIRED").into());
            }
            holder.0.next(REPLY_TIMEOUT, permitd_released).await??;
            if i >= a.warmup {
                samples.push(elapsed.as_nanos() as u64);
            }
            std::mem::swap(&mut holder, &mut waiter);
        }

        // Cleanup: the semaphore and both leases.
        let _ = call(&mut ctl, &[b"SEM.DELETE", ns, sb]).await;
        let _ = call(&mut ctl, &[b"LEASE.REVOKE", ns, lx.as_bytes()]).await;
        let _ = call(&mut ctl, &[b"LEASE.REVOKE", ns, ly.as_bytes()]).await;
        if park_probe == ParkProbe::Sleep {
            eprintln!("permitd-load: INFO has no blocked_clients; waited 2 ms per park instead");
        }
        Ok::<_, BoxError>(samples)
    })?;

    samples.sort_unstable();
    let us = |q: f64| percentile(&samples, q) as f64 / 1000.0;
    let mean = samples.iter().sum::<u64>() as f64 / samples.len() as f64 / 1000.0;
    println!(
        "{{\"mode\":\"handoff\",\"target\":\"permitd\",\"count\":{},\"p50_us\":{:.1},\"p90_us\":{:.1},\"p99_us\":{:.1},\"max_us\":{:.1},\"mean_us\":{:.1}}}",
        samples.len(),
        us(0.50),
        us(0.90),
        us(0.99),
        us(1.0),
        mean
    );
    Ok(())
}

/// Nearest-rank percentile of sorted samples.
pub(crate) fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// How the hand-off loop knows the waiter is parked before the holder releases.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum ParkProbe {
    /// Poll `INFO clients` until `blocked_clients` is at least 1.
    Info,
    /// The server's INFO has no `blocked_clients`: wait a fixed 2 ms.
    Sleep,
}

impl ParkProbe {
    async fn wait_parked(&mut self, ctl: &mut Conn) -> Result<()> {
        let give_up = Instant::now() + Duration::from_secs(5);
        loop {
            if *self == ParkProbe::Sleep {
                tokio::time::sleep(Duration::from_millis(2)).await;
                return Ok(());
            }
            let info = ok(call(ctl, &[b"INFO", b"clients"]).await?, "INFO clients")?;
            match info.bytes().and_then(blocked_clients) {
                Some(n) if n >= 1 => return Ok(()),
                Some(_) => {}
                None => *self = ParkProbe::Sleep,
            }
            if Instant::now() > give_up {
                return Err("handoff: the waiter never showed as parked (blocked_clients)".into());
            }
        }
    }
}

fn blocked_clients(info: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(info).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("blocked_clients:"))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_blocked_clients_from_info() {
        assert_eq!(
            blocked_clients(b"# Clients\r\nconnected_clients:3\r\nblocked_clients:1\r\n"),
            Some(1)
        );
        assert_eq!(blocked_clients(b"# Clients\r\n"), None);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let s: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&s, 0.5), 50);
        assert_eq!(percentile(&s, 0.99), 99);
        assert_eq!(percentile(&s, 1.0), 100);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
