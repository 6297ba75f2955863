//! MONITOR: every command a client runs, shown live to the clients in MONITOR mode, one line
//! each in Redis's format (`replicationFeedMonitors`):
//! `+1700000000.123456 [0 127.0.0.1:50000] "SEM.ACQUIRE" "ns" "s" "ls_<redacted>" "1" "5"`.
//! Secrets are hidden as shown.rs says. Lines go to each monitor's connection through a bounded
//! queue: a monitor that falls too far behind is disconnected, as Redis drops a client past its
//! output limit, and the commands never wait for it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::shown::shown;
use crate::command::Cmd;

/// Lines a monitor may have queued before it is dropped.
const BACKLOG: usize = 65_536;

/// The clients in MONITOR mode.
#[derive(Debug, Default)]
pub struct Monitors {
    /// How many there are: the check every command makes, without the lock.
    count: AtomicUsize,
    sinks: Mutex<Vec<mpsc::Sender<Bytes>>>,
}

impl Monitors {
    fn sinks(&self) -> MutexGuard<'_, Vec<mpsc::Sender<Bytes>>> {
        self.sinks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether any client monitors.
    pub fn active(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// A new monitor: the lines it is to write. It stops getting them once it drops this.
    pub fn add(&self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(BACKLOG);
        let mut sinks = self.sinks();
        sinks.push(tx);
        self.count.store(sinks.len(), Ordering::Relaxed);
        rx
    }

    /// Shows a command `cmd` (its words `argv`) that the client at `peer` runs. Monitors gone,
    /// or too far behind, leave the list (a dropped sender closes the monitor's connection).
    pub fn feed(&self, cmd: Cmd, argv: &[Bytes], peer: SocketAddr) {
        let line = line(SystemTime::now(), peer, &shown(cmd, argv));
        let mut sinks = self.sinks();
        sinks.retain(|tx| tx.try_send(line.clone()).is_ok());
        self.count.store(sinks.len(), Ordering::Relaxed);
    }
}

/// One MONITOR line, as Redis writes it.
fn line(at: SystemTime, peer: SocketAddr, argv: &[Bytes]) -> Bytes {
    let t = at.duration_since(UNIX_EPOCH).unwrap_or_default();
    let mut out = format!("+{}.{:06} [0 {peer}]", t.as_secs(), t.subsec_micros()).into_bytes();
    for a in argv {
        out.push(b' ');
        repr(a, &mut out);
    }
    out.extend_from_slice(b"\r\n");
    Bytes::from(out)
}

/// A word quoted as Redis's `sdscatrepr` quotes it.
fn repr(s: &[u8], out: &mut Vec<u8>) {
    out.push(b'"');
    for &b in s {
        match b {
            b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x07 => out.extend_from_slice(b"\\a"),
            0x08 => out.extend_from_slice(b"\\b"),
            b' '..=b'~' => out.push(b),
            _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
    out.push(b'"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_line_as_redis_writes_it() {
        let at = UNIX_EPOCH + Duration::from_micros(1_700_000_000_012_345);
        let peer: SocketAddr = "127.0.0.1:50123".parse().unwrap();
        let argv = [
            Bytes::from_static(b"SEM.CREATE"),
            Bytes::from_static(b"ns"),
            Bytes::from_static(b"a \"b\"\\\r\n\t\x07\x08\x00\xff"),
        ];
        assert_eq!(
            &line(at, peer, &argv)[..],
            &b"+1700000000.012345 [0 127.0.0.1:50123] \"SEM.CREATE\" \"ns\" \"a \\\"b\\\"\\\\\\r\\n\\t\\a\\b\\x00\\xff\"\r\n"[..]
        );
    }

    #[test]
    fn a_monitor_that_leaves_or_falls_behind_is_dropped() {
        let m = Monitors::default();
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert!(!m.active());
        let mut rx = m.add();
        let gone = m.add();
        assert!(m.active());
        drop(gone);
        m.feed(Cmd::Ping, &[Bytes::from_static(b"PING")], peer);
        assert!(rx.try_recv().unwrap().ends_with(b" \"PING\"\r\n"));
        assert_eq!(m.count.load(Ordering::Relaxed), 1, "the one gone left");
        for _ in 0..=BACKLOG {
            m.feed(Cmd::Ping, &[Bytes::from_static(b"PING")], peer);
        }
        assert!(!m.active(), "one that does not keep up is dropped");
    }
}
