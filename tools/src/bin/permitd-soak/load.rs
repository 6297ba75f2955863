//! The load tasks: parkers that loop on blocking SEM.ACQUIRE, workers that do everything else,
//! and the chaos connections that kill, unblock, revoke and change permits under them.

use std::io;
use std::rc::Rc;
use std::time::{Duration, Instant};

use permitd_client::now_ns;
use permitd_client::resp::Value;
use tokio::time::sleep;

use crate::checks::{
    check_acquire, check_error, check_lease, check_semaphore, consistency_check, lost, Acq, Asked,
    LEASE_GONE,
};
use crate::conn::Conn;
use crate::settings::{MAX_WEIGHT, NS, SEMS};
use crate::shared::{Rng, Shared};

/// Waits for the start, keeps a connection, and at the end rests with it open until `close`.
async fn rest(sh: &Shared, conn: &mut Option<Conn>) {
    if conn.is_none() {
        for _ in 0..50 {
            if let Some(c) = sh.connect().await {
                *conn = Some(c);
                break;
            }
            sleep(Duration::from_millis(200)).await;
        }
        if conn.is_none() {
            sh.violation("could not reconnect at the end".into());
        }
    }
    sh.resting.set(sh.resting.get() + 1);
    let mut close = sh.close.subscribe();
    let _ = close.wait_for(|c| *c).await;
    drop(conn.take());
}

async fn first_connect(sh: &Shared) -> Option<Conn> {
    let mut conn = None;
    for _ in 0..20 {
        if let Some(c) = sh.connect().await {
            conn = Some(c);
            break;
        }
        sleep(Duration::from_millis(500)).await;
    }
    sh.connected.set(sh.connected.get() + 1);
    let mut start = sh.start.subscribe();
    let _ = start.wait_for(|s| *s).await;
    conn
}

fn pick_sem(sh: &Shared, rng: &mut Rng) -> (&'static str, i64) {
    let (name, _) = SEMS[rng.below(SEMS.len())];
    let permits = sh.permits.borrow().get(name).copied().unwrap_or(1);
    (name, permits)
}

pub async fn parker(sh: Rc<Shared>, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 1) << 20);
    let mut conn = first_connect(&sh).await;
    // The lease this parker acquires under, and whether its ttl is short (left to expire).
    let mut lease: Option<(String, bool)> = None;
    while !sh.stop.get() {
        let Some(c) = conn.as_mut() else {
            sh.parker_ids.borrow_mut()[i] = 0;
            conn = sh.connect().await;
            if conn.is_none() {
                sleep(Duration::from_millis(200)).await;
            }
            continue;
        };
        let id = c.id;
        sh.parker_ids.borrow_mut()[i] = id;
        if lease.is_none() {
            let short = rng.chance(0.3);
            let ttl = if short {
                rng.range(1, 3)
            } else {
                rng.range(20, 60)
            };
            let sent = now_ns();
            sh.op();
            let proc_id = format!("parker-{i}");
            match c
                .cmd(
                    &["LEASE.CREATE", NS, &proc_id, &ttl.to_string()],
                    Duration::ZERO,
                )
                .await
            {
                Ok(Value::Error(e)) => check_error(&sh, "LEASE.CREATE", &e, &[]),
                Ok(v) => {
                    if let Some(l) = check_lease(&sh, "LEASE.CREATE", &v, sent) {
                        sh.add_lease(l.clone());
                        lease = Some((l, short));
                    }
                }
                Err(e) => {
                    lost(&sh, id, "LEASE.CREATE", &e);
                    conn = None;
                }
            }
            continue;
        }
        let (l, short) = lease.clone().expect("set above");
        let (sem, permits) = pick_sem(&sh, &mut rng);
        let weight = 1 + rng.below(MAX_WEIGHT.min(permits) as usize) as i64;
        let timeout = if rng.chance(0.03) {
            0.0
        } else {
            (rng.range(10, (sh.cli.max_timeout * 100.0) as u64) as f64) / 100.0
        };
        let timeout_text = format!("{timeout:.2}");
        let floor = sh.token_floor(sem);
        sh.op();
        let sent = Instant::now();
        if let Err(e) = c
            .send(&[
                "SEM.ACQUIRE",
                NS,
                sem,
                &l,
                &weight.to_string(),
                &timeout_text,
            ])
            .await
        {
            lost(&sh, id, "SEM.ACQUIRE", &e);
            conn = None;
            lease = None;
            continue;
        }
        // Now and then the client goes away while parked (maybe just as it is granted: the
        // hold is then unknown, so the lease is given up).
        let leave_after = rng.chance(0.03).then(|| rng.ms(0, 2000));
        let wait = Duration::from_secs_f64(timeout);
        let reply = match leave_after {
            None => Some(c.read(wait).await),
            Some(d) => tokio::select! {
                r = c.read(wait) => Some(r),
                _ = sleep(d) => None,
            },
        };
        let waited = sent.elapsed();
        let reply = match reply {
            None => {
                sh.stats.borrow_mut().disconnects += 1;
                conn = None;
                lease = None;
                continue;
            }
            Some(Err(e)) => {
                lost(&sh, id, "SEM.ACQUIRE", &e);
                conn = None;
                lease = None;
                continue;
            }
            Some(Ok(v)) => v,
        };
        let asked = Asked {
            sem,
            weight,
            timeout,
            floor,
            client: id,
        };
        match check_acquire(&sh, &reply, asked, waited) {
            Acq::LeaseGone => lease = None,
            Acq::NotNow | Acq::Other => {}
            Acq::Acquired => {
                sleep(rng.ms(0, 400)).await;
                let what = rng.below(100);
                let c = conn.as_mut().expect("connected");
                sh.op();
                if what < 15 && short {
                    // Leave the hold to die with the lease.
                    lease = None;
                } else if what < 30 {
                    sh.stats.borrow_mut().revokes += 1;
                    match c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await {
                        Ok(Value::Simple(s)) if s == "OK" => {}
                        Ok(Value::Error(e)) => check_error(&sh, "LEASE.REVOKE", &e, &[LEASE_GONE]),
                        Ok(v) => sh.violation(format!("LEASE.REVOKE: {v:?}")),
                        Err(e) => {
                            lost(&sh, id, "LEASE.REVOKE", &e);
                            conn = None;
                        }
                    }
                    lease = None;
                } else {
                    match c.cmd(&["SEM.RELEASE", NS, sem, &l], Duration::ZERO).await {
                        Ok(Value::Error(e)) => {
                            check_error(&sh, "SEM.RELEASE", &e, &[LEASE_GONE]);
                            lease = None;
                        }
                        Ok(v) => {
                            check_semaphore(&sh, "SEM.RELEASE", &v);
                        }
                        Err(e) => {
                            lost(&sh, id, "SEM.RELEASE", &e);
                            conn = None;
                            lease = None;
                        }
                    }
                }
            }
        }
    }
    // Done: give back what is held (a revoke covers it), then rest.
    if let (Some(c), Some((l, _))) = (conn.as_mut(), lease.take()) {
        let _ = c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await;
    }
    sh.parker_ids.borrow_mut()[i] = 0;
    rest(&sh, &mut conn).await;
}

pub async fn worker(sh: Rc<Shared>, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 1) << 40);
    let mut conn = first_connect(&sh).await;
    let mut lease: Option<(String, Instant)> = None;
    let mut held: Option<&'static str> = None;
    // Spread the first operations out.
    sleep(rng.ms(0, 2000)).await;
    while !sh.stop.get() {
        sleep(rng.ms(200, 2000)).await;
        if sh.stop.get() {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = sh.connect().await;
            continue;
        };
        let id = c.id;
        let op = rng.below(100);
        let sent = now_ns();
        sh.op();
        let r: io::Result<()> = async {
            match op {
                0..=14 => match c.cmd(&["PING"], Duration::ZERO).await? {
                    Value::Simple(s) if s == "PONG" => {}
                    v => sh.violation(format!("PING: {v:?}")),
                },
                15..=24 => {
                    let (sem, _) = pick_sem(&sh, &mut rng);
                    match c.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await? {
                        Value::Error(e) => check_error(&sh, "SEM.GET", &e, &[]),
                        v => {
                            check_semaphore(&sh, "SEM.GET", &v);
                        }
                    }
                }
                25..=44 => {
                    // Own lease: create or refresh it when needed.
                    let stale = lease
                        .as_ref()
                        .is_none_or(|(_, at)| at.elapsed() > Duration::from_secs(20));
                    if stale && held.is_none() {
                        let v = match &lease {
                            Some((l, _)) => {
                                c.cmd(&["LEASE.REFRESH", NS, l, "60"], Duration::ZERO)
                                    .await?
                            }
                            None => {
                                let p = format!("worker-{i}");
                                c.cmd(&["LEASE.CREATE", NS, &p, "60"], Duration::ZERO)
                                    .await?
                            }
                        };
                        match v {
                            Value::Error(e) => {
                                check_error(&sh, "LEASE.REFRESH", &e, &[LEASE_GONE]);
                                lease = None;
                            }
                            v => {
                                if let Some(l) = check_lease(&sh, "LEASE.CREATE", &v, sent) {
                                    if lease.is_none() {
                                        sh.add_lease(l.clone());
                                    }
                                    lease = Some((l, Instant::now()));
                                }
                            }
                        }
                    } else if let Some((l, _)) = &lease {
                        if let Some(sem) = held.take() {
                            match c.cmd(&["SEM.RELEASE", NS, sem, l], Duration::ZERO).await? {
                                Value::Error(e) => {
                                    check_error(&sh, "SEM.RELEASE", &e, &[LEASE_GONE]);
                                    lease = None;
                                }
                                v => {
                                    check_semaphore(&sh, "SEM.RELEASE", &v);
                                }
                            }
                        } else {
                            let (sem, _) = pick_sem(&sh, &mut rng);
                            let floor = sh.token_floor(sem);
                            let t = Instant::now();
                            let v = c
                                .cmd(&["SEM.ACQUIRE", NS, sem, l, "1", "0"], Duration::ZERO)
                                .await?;
                            let asked = Asked {
                                sem,
                                weight: 1,
                                timeout: 0.0,
                                floor,
                                client: id,
                            };
                            match check_acquire(&sh, &v, asked, t.elapsed()) {
                                Acq::Acquired => held = Some(sem),
                                Acq::LeaseGone => lease = None,
                                _ => {}
                            }
                        }
                    }
                }
                45..=54 => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        let ttl = rng.range(1, 60).to_string();
                        match c
                            .cmd(&["LEASE.REFRESH", NS, &l, &ttl], Duration::ZERO)
                            .await?
                        {
                            Value::Error(e) => check_error(&sh, "LEASE.REFRESH", &e, &[LEASE_GONE]),
                            v => {
                                check_lease(&sh, "LEASE.REFRESH", &v, sent);
                            }
                        }
                    }
                }
                55..=64 => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        match c.cmd(&["LEASE.GET", NS, &l], Duration::ZERO).await? {
                            Value::Error(e) => check_error(&sh, "LEASE.GET", &e, &[LEASE_GONE]),
                            v => {
                                check_lease(&sh, "LEASE.GET", &v, sent);
                            }
                        }
                    }
                }
                65..=79 => {
                    let (sem, _) = pick_sem(&sh, &mut rng);
                    consistency_check(&sh, c, sem).await?;
                }
                80..=84 => {
                    match c
                        .cmd(&["LEASE.LIST", NS, "LIMIT", "100"], Duration::ZERO)
                        .await?
                    {
                        Value::Error(e) => check_error(&sh, "LEASE.LIST", &e, &[]),
                        v => match v.items_field("leases") {
                            Some(ls) => {
                                for l in ls {
                                    check_lease(&sh, "LEASE.LIST", l, sent);
                                }
                            }
                            None => sh.violation(format!("LEASE.LIST: {v:?}")),
                        },
                    }
                }
                85 => {
                    // A random disconnect (what it held stays with its lease).
                    sh.stats.borrow_mut().disconnects += 1;
                    return Err(io::Error::other("disconnect"));
                }
                _ => {}
            }
            Ok(())
        }
        .await;
        if let Err(e) = r {
            if e.to_string() != "disconnect" {
                lost(&sh, id, "worker", &e);
            }
            conn = None;
            held = None;
            lease = None;
        }
    }
    if let (Some(c), Some((l, _))) = (conn.as_mut(), lease.take()) {
        let _ = c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await;
    }
    rest(&sh, &mut conn).await;
}

#[derive(Clone, Copy)]
pub enum Chaos {
    Kill,
    Unblock,
    Revoke,
    Update,
}

pub async fn chaos(sh: Rc<Shared>, kind: Chaos, i: usize) {
    let mut rng = Rng::new(sh.cli.seed ^ (i as u64 + 7) << 50);
    let mut conn = first_connect(&sh).await;
    let every = match kind {
        Chaos::Kill => Duration::from_millis(100),
        Chaos::Unblock => Duration::from_millis(150),
        Chaos::Revoke => Duration::from_millis(40),
        Chaos::Update => Duration::from_millis(300),
    };
    while !sh.stop.get() {
        sleep(every).await;
        if sh.stop.get() {
            break;
        }
        let Some(c) = conn.as_mut() else {
            conn = sh.connect().await;
            continue;
        };
        let id = c.id;
        sh.op();
        let r: io::Result<()> = async {
            match kind {
                Chaos::Kill | Chaos::Unblock => {
                    let target = {
                        let ids = sh.parker_ids.borrow();
                        ids[rng.below(ids.len())]
                    };
                    if target == 0 {
                        return Ok(());
                    }
                    let t = target.to_string();
                    let v = if let Chaos::Kill = kind {
                        sh.killed.borrow_mut().insert(target);
                        sh.stats.borrow_mut().kills_sent += 1;
                        c.cmd(&["CLIENT", "KILL", "ID", &t], Duration::ZERO).await?
                    } else {
                        sh.unblocked.borrow_mut().insert(target);
                        sh.stats.borrow_mut().unblocks_sent += 1;
                        let how = if rng.chance(0.5) { "TIMEOUT" } else { "ERROR" };
                        c.cmd(&["CLIENT", "UNBLOCK", &t, how], Duration::ZERO)
                            .await?
                    };
                    match (v, kind) {
                        (Value::Int(0), _) => {}
                        (Value::Int(1), Chaos::Kill) => sh.stats.borrow_mut().kills_hit += 1,
                        (Value::Int(1), _) => sh.stats.borrow_mut().unblocks_hit += 1,
                        (v, _) => sh.violation(format!("CLIENT KILL/UNBLOCK: {v:?}")),
                    }
                }
                Chaos::Revoke => {
                    if let Some(l) = sh.random_lease(&mut rng) {
                        sh.stats.borrow_mut().revokes += 1;
                        match c.cmd(&["LEASE.REVOKE", NS, &l], Duration::ZERO).await? {
                            Value::Simple(s) if s == "OK" => {}
                            Value::Error(e) => check_error(&sh, "LEASE.REVOKE", &e, &[LEASE_GONE]),
                            v => sh.violation(format!("LEASE.REVOKE: {v:?}")),
                        }
                    }
                }
                Chaos::Update => {
                    let (sem, base) = SEMS[rng.below(SEMS.len())];
                    let v = c.cmd(&["SEM.GET", NS, sem], Duration::ZERO).await?;
                    let Some(version) = v.int_field("version") else {
                        sh.violation(format!("SEM.GET: {v:?}"));
                        return Ok(());
                    };
                    let permits = rng.range((base / 2).max(1) as u64, base as u64 * 2) as i64;
                    let v = c
                        .cmd(
                            &[
                                "SEM.UPDATE",
                                NS,
                                sem,
                                &permits.to_string(),
                                "VERSION",
                                &version.to_string(),
                            ],
                            Duration::ZERO,
                        )
                        .await?;
                    match v {
                        Value::Error(e) => {
                            sh.stats.borrow_mut().updates_rejected += 1;
                            check_error(
                                &sh,
                                "SEM.UPDATE",
                                &e,
                                &["INVALIDARG version mismatch", "INVALIDARG permits"],
                            );
                        }
                        v => {
                            sh.stats.borrow_mut().updates_ok += 1;
                            if let Some((p, _)) = check_semaphore(&sh, "SEM.UPDATE", &v) {
                                if p != permits {
                                    sh.violation(format!("SEM.UPDATE {sem}: permits {p}"));
                                }
                                sh.permits.borrow_mut().insert(sem.to_string(), p);
                            }
                        }
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = r {
            lost(&sh, id, "chaos", &e);
            conn = None;
        }
    }
    rest(&sh, &mut conn).await;
}
