//! A load connection and how its requests are written.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use permitd_client::resp::Value;
use permitd_protocol::request::encode_request;

/// A reply that takes longer than this past the request's own timeout is a violation.
pub(crate) const REPLY_GRACE: Duration = Duration::from_secs(30);

/// Read buffer room per connection: 10,000 of them stay small.
pub(crate) const READ_CHUNK: usize = 1024;

pub(crate) fn encode(args: &[&str]) -> Vec<u8> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    let mut out = Vec::new();
    encode_request(&mut out, &args);
    out
}

/// A load connection, and the client id the server gave it (the target of CLIENT KILL and
/// CLIENT UNBLOCK).
pub(crate) struct Conn {
    pub(crate) io: permitd_tools::Conn,
    pub(crate) id: u64,
}

impl Conn {
    pub(crate) async fn open(addr: SocketAddr) -> io::Result<Conn> {
        let io = permitd_tools::Conn::connect(addr, Duration::from_secs(30), READ_CHUNK).await?;
        let mut c = Conn { io, id: 0 };
        match c.cmd(&["CLIENT", "ID"], Duration::ZERO).await? {
            Value::Int(id) if id > 0 => c.id = id as u64,
            other => return Err(io::Error::other(format!("CLIENT ID answered {other:?}"))),
        }
        Ok(c)
    }

    pub(crate) async fn send(&mut self, args: &[&str]) -> io::Result<()> {
        self.io.send(&encode(args)).await
    }

    /// The next reply; `wait` is how long the request itself may take (a blocking timeout).
    pub(crate) async fn read(&mut self, wait: Duration) -> io::Result<Value> {
        self.io.reply(wait + REPLY_GRACE).await
    }

    pub(crate) async fn cmd(&mut self, args: &[&str], wait: Duration) -> io::Result<Value> {
        self.send(args).await?;
        self.read(wait).await
    }
}
