//! SLOWLOG: the commands that took at least `--slowlog-log-slower-than` microseconds to run,
//! the newest first, at most `--slowlog-max-len` of them, each as Redis's slowlog.c keeps one:
//! id, unix time, duration, the words (at most 32, each cut at 128 bytes, secrets hidden as
//! shown.rs says), the client's address and name.
//!
//! The duration is the command's own run, measured by its connection (dispatch.rs): the time a
//! parked acquire waits is not in it, as Redis leaves a blocked command's wait out.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;

use super::shown::shown;
use crate::command::Cmd;
use crate::protocol::Reply;

/// Words kept of a command (the last one says how many more there were).
const MAX_ARGC: usize = 32;
/// Bytes kept of a word.
const MAX_STRING: usize = 128;

/// One slow command.
#[derive(Debug)]
struct Entry {
    id: u64,
    time: i64,
    micros: u64,
    argv: Vec<Bytes>,
    peer: String,
    name: Bytes,
}

#[derive(Debug, Default)]
struct Entries {
    newest_first: VecDeque<Entry>,
    next_id: u64,
}

/// The slow log (see the module docs).
#[derive(Debug)]
pub struct SlowLog {
    /// Microseconds; negative: off.
    slower_than: i64,
    max_len: usize,
    entries: Mutex<Entries>,
}

/// Who ran a command, as an entry names them.
pub struct Runner {
    /// Its address.
    pub peer: SocketAddr,
    /// Its CLIENT SETNAME.
    pub name: Bytes,
}

impl SlowLog {
    /// A slow log of commands slower than `slower_than` µs (negative: none), keeping `max_len`.
    pub fn new(slower_than: i64, max_len: usize) -> SlowLog {
        SlowLog {
            slower_than,
            max_len,
            entries: Mutex::default(),
        }
    }

    fn entries(&self) -> MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether commands are to be timed for it.
    pub fn on(&self) -> bool {
        self.slower_than >= 0 && self.max_len > 0
    }

    /// Logs command `cmd` (its words `argv`) if it took `took` or longer.
    pub fn record(&self, cmd: Cmd, argv: &[Bytes], took: Duration, who: impl FnOnce() -> Runner) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if !self.on() || micros < self.slower_than as u64 {
            return;
        }
        let Runner { peer, name } = who();
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let argv = trimmed(&shown(cmd, argv));
        let mut e = self.entries();
        let id = e.next_id;
        e.next_id += 1;
        e.newest_first.push_front(Entry {
            id,
            time,
            micros,
            argv,
            peer: peer.to_string(),
            name,
        });
        e.newest_first.truncate(self.max_len);
    }

    /// `SLOWLOG GET [count]`: the newest `count` entries (10 when left out, -1 for all).
    pub fn get(&self, count: Option<i64>) -> Reply {
        let e = self.entries();
        let n = match count {
            None => 10,
            Some(-1) => e.newest_first.len(),
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Reply::Array(
            e.newest_first
                .iter()
                .take(n)
                .map(|en| {
                    Reply::Array(vec![
                        Reply::Int(en.id as i64),
                        Reply::Int(en.time),
                        Reply::Int(en.micros as i64),
                        Reply::Array(en.argv.iter().cloned().map(Reply::Bulk).collect()),
                        Reply::bulk(en.peer.clone()),
                        Reply::Bulk(en.name.clone()),
                    ])
                })
                .collect(),
        )
    }

    /// `SLOWLOG LEN`.
    pub fn len(&self) -> usize {
        self.entries().newest_first.len()
    }

    /// `SLOWLOG RESET`: empties it (ids go on rising, as Redis's) and frees its room, which a
    /// load filled and which would otherwise keep an allocator page of that load's.
    pub fn reset(&self) {
        self.entries().newest_first = VecDeque::new();
    }
}

/// A command's words as an entry keeps them (slowlog.c's limits), copied: a word is a slice of
/// its connection's read buffer, which an entry would otherwise keep alive (128 entries pinned
/// 7.9 MB after `scripts/soak 30`, against 0.6 MB with the slow log off).
fn trimmed(argv: &[Bytes]) -> Vec<Bytes> {
    let keep = if argv.len() > MAX_ARGC {
        MAX_ARGC - 1
    } else {
        argv.len()
    };
    let mut out: Vec<Bytes> = argv[..keep]
        .iter()
        .map(|a| {
            if a.len() > MAX_STRING {
                let mut s = a[..MAX_STRING].to_vec();
                s.extend_from_slice(
                    format!("... ({} more bytes)", a.len() - MAX_STRING).as_bytes(),
                );
                Bytes::from(s)
            } else {
                Bytes::copy_from_slice(a)
            }
        })
        .collect();
    if argv.len() > MAX_ARGC {
        let more = argv.len() - MAX_ARGC + 1;
        out.push(Bytes::from(format!("... ({more} more arguments)")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runner() -> Runner {
        Runner {
            peer: "127.0.0.1:7".parse().unwrap(),
            name: Bytes::from_static(b"me"),
        }
    }

    #[test]
    fn keeps_the_newest_up_to_its_length_and_only_the_slow() {
        let log = SlowLog::new(1000, 2);
        let ping = [Bytes::from_static(b"PING")];
        log.record(Cmd::Ping, &ping, Duration::from_micros(999), runner);
        assert_eq!(log.len(), 0, "faster than the threshold");
        for us in [1000, 2000, 3000] {
            log.record(Cmd::Ping, &ping, Duration::from_micros(us), runner);
        }
        assert_eq!(log.len(), 2);
        let Reply::Array(got) = log.get(None) else {
            panic!()
        };
        let Reply::Array(first) = &got[0] else {
            panic!()
        };
        assert_eq!(first[0], Reply::Int(2), "newest first, ids from 0");
        assert_eq!(first[2], Reply::Int(3000));
        assert_eq!(first[4], Reply::bulk("127.0.0.1:7".to_string()));
        assert_eq!(first[5], Reply::Bulk(Bytes::from_static(b"me")));
        let Reply::Array(one) = log.get(Some(1)) else {
            panic!()
        };
        assert_eq!(one.len(), 1);
        log.reset();
        assert_eq!(log.len(), 0);
        assert!(!SlowLog::new(-1, 128).on());
        assert!(!SlowLog::new(0, 0).on());
    }

    #[test]
    fn long_commands_are_cut_as_redis_cuts_them() {
        let argv: Vec<Bytes> = (0..40).map(|i| Bytes::from(format!("a{i}"))).collect();
        let t = trimmed(&argv);
        assert_eq!(t.len(), 32);
        assert_eq!(t[31], Bytes::from_static(b"... (9 more arguments)"));
        let long = trimmed(&[Bytes::from(vec![b'x'; 130])]);
        assert_eq!(long[0].len(), 128 + "... (2 more bytes)".len());
    }
}
