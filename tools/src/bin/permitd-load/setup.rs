//! The control path: one command, one reply as a tree, and the setup every mode does.

use std::io;
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use permitd_client::resp::Value;
use permitd_protocol::request::encode_request;
use permitd_tools::Conn;

use crate::args::{LoadArgs, Result, MAX_LEASE_TTL, READ_CHUNK, REPLY_TIMEOUT};

pub async fn connect(addr: SocketAddr) -> Result<Conn> {
    Ok(Conn::connect(addr, REPLY_TIMEOUT, READ_CHUNK).await?)
}

/// One command, one reply (setup and control, not the hot path).
pub async fn call(conn: &mut Conn, args: &[&[u8]]) -> Result<Value> {
    let mut out = Vec::new();
    encode_request(&mut out, args);
    let reply = async {
        conn.send(&out).await?;
        conn.reply(REPLY_TIMEOUT).await
    };
    reply.await.map_err(|e: io::Error| {
        let name = args
            .first()
            .map(|a| String::from_utf8_lossy(a).into_owned());
        format!("{}: {e}", name.unwrap_or_default()).into()
    })
}

/// The reply, or the server's error as an `Err` naming what was asked.
pub fn ok(reply: Value, what: &str) -> Result<Value> {
    match reply {
        Value::Error(e) => Err(format!("{what}: -{e}").into()),
        v => Ok(v),
    }
}

pub fn unique_suffix() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("{}_{}", std::process::id(), nanos % 1_000_000_000_000)
}

pub fn random_hex(bytes: usize) -> Result<String> {
    let mut b = vec![0u8; bytes];
    getrandom::getrandom(&mut b).map_err(|e| format!("getrandom: {e}"))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// NS.CREATE, accepting a namespace that already exists.
pub async fn ensure_namespace(conn: &mut Conn, ns: &str) -> Result<()> {
    match call(conn, &[b"NS.CREATE", ns.as_bytes()]).await? {
        Value::Error(e) if e.starts_with("ALREADYEXISTS") => Ok(()),
        v => ok(v, "NS.CREATE").map(|_| ()),
    }
}

pub async fn create_semaphore(conn: &mut Conn, ns: &str, sem: &str, permits: u64) -> Result<()> {
    let reply = call(
        conn,
        &[
            b"SEM.CREATE",
            ns.as_bytes(),
            sem.as_bytes(),
            permits.to_string().as_bytes(),
        ],
    )
    .await?;
    ok(reply, "SEM.CREATE").map(|_| ())
}

pub async fn create_lease(conn: &mut Conn, ns: &str, process: &str, ttl: u64) -> Result<String> {
    let reply = call(
        conn,
        &[
            b"LEASE.CREATE",
            ns.as_bytes(),
            process.as_bytes(),
            ttl.to_string().as_bytes(),
        ],
    )
    .await?;
    let v = ok(reply, "LEASE.CREATE")?;
    v.text_field("lease_id")
        .ok_or_else(|| format!("LEASE.CREATE: no lease_id in {v:?}").into())
}

pub fn lease_ttl_for(load: &LoadArgs) -> Result<u64> {
    let need = load.warmup + load.duration + 30.0;
    if need > MAX_LEASE_TTL as f64 {
        return Err(format!(
            "warm-up + duration must stay under {} s (the longest lease TTL)",
            MAX_LEASE_TTL - 30
        )
        .into());
    }
    Ok(MAX_LEASE_TTL)
}

pub fn check_load(load: &LoadArgs) -> Result<()> {
    if load.connections == 0 || load.pipeline == 0 || load.threads == 0 {
        return Err("connections, pipeline and threads must be > 0".into());
    }
    let duration_ok = load.duration > 0.0 && load.duration <= 600.0;
    if !duration_ok || !(0.0..=60.0).contains(&load.warmup) {
        return Err("duration must be in (0, 600] s and warm-up in [0, 60] s".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_resp2_arrays() {
        let mut out = Vec::new();
        encode_request(&mut out, &[b"PING"]);
        encode_request(&mut out, &[b"ECHO", b""]);
        assert_eq!(out, b"*1\r\n$4\r\nPING\r\n*2\r\n$4\r\nECHO\r\n$0\r\n\r\n");
    }

    #[test]
    fn reads_map_fields() {
        let raw = b"*4\r\n$8\r\nlease_id\r\n$5\r\nls_ab\r\n$10\r\nprocess_id\r\n$1\r\np\r\n";
        let (v, _) = Value::parse(raw).unwrap();
        assert_eq!(
            v.field("lease_id").and_then(Value::bytes),
            Some(&b"ls_ab"[..])
        );
    }
}
