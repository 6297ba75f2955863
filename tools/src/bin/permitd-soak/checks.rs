//! Every reply checked against the SPEC as it arrives: the outcomes a request can have, the error
//! codes each command can give, entities that are well formed and alive.

use std::io;
use std::time::Duration;

use permitd_client::now_ns;
use permitd_client::resp::Value;

use crate::conn::Conn;
use crate::settings::NS;
use crate::shared::Shared;

fn code_of(e: &str) -> &str {
    e.split(' ').next().unwrap_or("")
}

/// A semaphore entity: `active_holds` within `permits`. Returns (permits, active_holds).
pub fn check_semaphore(sh: &Shared, what: &str, v: &Value) -> Option<(i64, i64)> {
    let (Some(permits), Some(held), Some(count)) = (
        v.int_field("permits"),
        v.int_field("active_holds"),
        v.int_field("active_holders_count"),
    ) else {
        sh.violation(format!("{what}: not a semaphore: {v:?}"));
        return None;
    };
    if permits <= 0 || held < 0 || held > permits || count < 0 || count > held {
        sh.violation(format!(
            "{what}: permits {permits}, active_holds {held}, holders {count}"
        ));
    }
    Some((permits, held))
}

/// A lease entity: well-formed id, alive when the request was sent.
pub fn check_lease(sh: &Shared, what: &str, v: &Value, sent_ns: i64) -> Option<String> {
    let id = v.text_field("lease_id");
    let expires = v.int_field("expires_at");
    match (id, expires) {
        (Some(id), Some(exp)) => {
            let shaped = id.len() == 31
                && id.starts_with("ls_")
                && id[3..].bytes().all(|b| b.is_ascii_alphanumeric());
            if !shaped {
                sh.violation(format!("{what}: lease id {id:?} is not ls_ + 28 base62"));
            }
            if exp <= sent_ns {
                sh.violation(format!(
                    "{what}: lease visible {} ms after it died",
                    (sent_ns - exp) / 1_000_000
                ));
            }
            Some(id)
        }
        _ => {
            sh.violation(format!("{what}: not a lease: {v:?}"));
            None
        }
    }
}

/// An error reply to `cmd`: its code must be one `cmd` can give in this run.
pub fn check_error(sh: &Shared, cmd: &str, e: &str, allowed: &[&str]) {
    let code = code_of(e);
    sh.error(code);
    let ok = allowed.iter().any(|a| {
        let (c, text) = a.split_once(' ').unwrap_or((a, ""));
        c == code && e.contains(text)
    });
    if !ok {
        sh.violation(format!("{cmd}: unexpected error {e:?}"));
    }
}

pub const LEASE_GONE: &str = "NOTFOUND lease not found or expired";

/// What an acquire's reply was.
pub enum Acq {
    Acquired,
    NotNow,
    LeaseGone,
    Other,
}

/// What a SEM.ACQUIRE asked for, as its reply is checked against it.
#[derive(Clone, Copy)]
pub struct Asked<'a> {
    pub sem: &'a str,
    pub weight: i64,
    pub timeout: f64,
    /// The highest token seen on `sem` before the request was sent.
    pub floor: i64,
    /// The connection's client id (CLIENT UNBLOCK may end its acquires early).
    pub client: u64,
}

/// Checks one SEM.ACQUIRE reply, which came `waited` after the request.
pub fn check_acquire(sh: &Shared, v: &Value, asked: Asked, waited: Duration) -> Acq {
    let Asked {
        sem,
        weight,
        timeout,
        floor,
        client,
    } = asked;
    if let Value::Error(e) = v {
        let unblocked = sh.unblocked.borrow().contains(&client);
        let mut allowed = vec![LEASE_GONE, "INVALIDARG weight exceeds semaphore permits"];
        if unblocked {
            allowed.push("UNBLOCKED client unblocked via CLIENT UNBLOCK");
        }
        check_error(sh, "SEM.ACQUIRE", e, &allowed);
        return if e.starts_with(LEASE_GONE) {
            Acq::LeaseGone
        } else {
            Acq::Other
        };
    }
    let outcome = v.text_field("outcome").unwrap_or_default();
    let Some(s) = v.field("semaphore") else {
        sh.violation(format!("SEM.ACQUIRE: no semaphore in {v:?}"));
        return Acq::Other;
    };
    let Some((permits, _)) = check_semaphore(sh, "SEM.ACQUIRE", s) else {
        return Acq::Other;
    };
    let token = v.int_field("fencing_token");
    match outcome.as_str() {
        "ACQUIRE_OUTCOME_ACQUIRED" => {
            sh.stats.borrow_mut().acquired += 1;
            if weight > permits {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: ACQUIRED weight {weight} with only {permits} permits"
                ));
            }
            match token {
                Some(t) if t > floor => {
                    let mut m = sh.max_token.borrow_mut();
                    let e = m.entry(sem.to_string()).or_insert(0);
                    *e = (*e).max(t);
                }
                Some(t) => sh.violation(format!(
                    "SEM.ACQUIRE {sem}: fencing token {t} not above {floor}, seen before the request"
                )),
                None => sh.violation(format!("SEM.ACQUIRE {sem}: ACQUIRED without a token")),
            }
            Acq::Acquired
        }
        "ACQUIRE_OUTCOME_UNAVAILABLE" => {
            sh.stats.borrow_mut().unavailable += 1;
            if timeout > 0.0 {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: UNAVAILABLE with timeout {timeout}"
                ));
            }
            Acq::NotNow
        }
        "ACQUIRE_OUTCOME_TIMED_OUT" => {
            sh.stats.borrow_mut().timed_out += 1;
            let want = Duration::from_secs_f64(timeout);
            if timeout == 0.0 {
                sh.violation(format!("SEM.ACQUIRE {sem}: TIMED_OUT with timeout 0"));
            } else if waited + Duration::from_millis(5) < want
                && !sh.unblocked.borrow().contains(&client)
            {
                sh.violation(format!(
                    "SEM.ACQUIRE {sem}: TIMED_OUT after {waited:?}, timeout {timeout} s"
                ));
            } else if waited > want {
                let late = (waited - want).as_millis() as u64;
                let mut st = sh.stats.borrow_mut();
                st.max_timeout_late_ms = st.max_timeout_late_ms.max(late);
            }
            if token.is_some() {
                sh.violation(format!("SEM.ACQUIRE {sem}: TIMED_OUT with a token"));
            }
            Acq::NotNow
        }
        other => {
            sh.violation(format!("SEM.ACQUIRE {sem}: outcome {other:?}"));
            Acq::Other
        }
    }
}

/// A lost connection: expected after CLIENT KILL, a violation otherwise.
pub fn lost(sh: &Shared, client: u64, what: &str, e: &io::Error) {
    if sh.killed.borrow().contains(&client) {
        sh.stats.borrow_mut().killed_seen += 1;
    } else {
        sh.violation(format!("{what}: connection {client} lost: {e}"));
    }
}

/// SEM.GET + SEM.HOLDERS in one transaction: one consistent picture.
pub async fn consistency_check(sh: &Shared, c: &mut Conn, sem: &str) -> io::Result<()> {
    let sent = now_ns();
    c.send(&["MULTI"]).await?;
    c.send(&["SEM.GET", NS, sem]).await?;
    c.send(&["SEM.HOLDERS", NS, sem, "LIMIT", "250"]).await?;
    c.send(&["EXEC"]).await?;
    for _ in 0..3 {
        let v = c.read(Duration::ZERO).await?;
        if !matches!(&v, Value::Simple(s) if s == "OK" || s == "QUEUED") {
            sh.violation(format!("MULTI: {v:?}"));
        }
    }
    for _ in 0..4 {
        sh.op();
    }
    let v = c.read(Duration::ZERO).await?;
    let Value::Array(Some(results)) = &v else {
        sh.violation(format!("EXEC: {v:?}"));
        return Ok(());
    };
    if results.len() != 2 {
        sh.violation(format!("EXEC: {v:?}"));
        return Ok(());
    }
    sh.stats.borrow_mut().consistency_checks += 1;
    let Some((permits, held)) = check_semaphore(sh, "SEM.GET", &results[0]) else {
        return Ok(());
    };
    let Some(holders) = results[1].items_field("holders") else {
        sh.violation(format!("SEM.HOLDERS: {:?}", results[1]));
        return Ok(());
    };
    let mut sum = 0;
    let mut last_token = 0;
    for h in holders {
        let (Some(w), Some(exp), Some(t)) = (
            h.int_field("weight"),
            h.int_field("expires_at"),
            h.int_field("fencing_token"),
        ) else {
            sh.violation(format!("SEM.HOLDERS: holder {h:?}"));
            continue;
        };
        sum += w;
        if exp <= sent {
            sh.violation(format!(
                "SEM.HOLDERS {sem}: holder of a lease dead for {} ms",
                (sent - exp) / 1_000_000
            ));
        }
        if t <= last_token {
            sh.violation(format!("SEM.HOLDERS {sem}: not oldest first"));
        }
        last_token = t;
    }
    let count = results[0].int_field("active_holders_count").unwrap_or(-1);
    if sum != held || count != holders.len() as i64 || held > permits {
        sh.violation(format!(
            "{sem}: active_holds {held} (count {count}) but holders sum to {sum} ({} of them), permits {permits}",
            holders.len()
        ));
    }
    Ok(())
}
