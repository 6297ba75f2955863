//! What permitd's two tools share: a connection that writes requests as bytes and reads whole
//! replies with the client crate's reader ([`permitd_client::resp`]).

#![warn(missing_docs)]

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use bytes::{Buf, BytesMut};
use permitd_client::resp::{self, ReadError, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

/// The first address `host:port` resolves to.
pub fn resolve(host: &str, port: u16) -> io::Result<SocketAddr> {
    (host, port)
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("cannot resolve {host}")))
}

/// A TCP connection to a server, with Nagle off: requests go out as bytes, replies come back
/// whole.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    /// How much room the read buffer gets when it runs low: a few KiB for each of the soak's
    /// 10,000 connections, tens of KiB for the load generator's deep pipelines.
    chunk: usize,
}

impl Conn {
    /// Connects to `addr`, giving up after `timeout`; see [`Conn::new`] for `chunk`.
    pub async fn connect(addr: SocketAddr, timeout: Duration, chunk: usize) -> io::Result<Conn> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "connect {addr}: no answer within {} s",
                        timeout.as_secs_f64()
                    ),
                )
            })?
            .map_err(|e| io::Error::new(e.kind(), format!("connect {addr}: {e}")))?;
        Conn::new(stream, chunk)
    }

    /// A connection over `stream`, whose read buffer grows `chunk` bytes at a time.
    pub fn new(stream: TcpStream, chunk: usize) -> io::Result<Conn> {
        stream.set_nodelay(true)?;
        Ok(Conn {
            stream,
            buf: BytesMut::with_capacity(chunk),
            chunk,
        })
    }

    /// Writes `bytes` (one or more encoded requests).
    pub async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Waits up to `timeout` until the next reply is here whole, and hands its bytes to `read`.
    pub async fn next<T>(
        &mut self,
        timeout: Duration,
        read: impl FnOnce(&[u8]) -> T,
    ) -> io::Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            match resp::reply_len(&self.buf) {
                Ok(n) => {
                    let out = read(&self.buf[..n]);
                    self.buf.advance(n);
                    return Ok(out);
                }
                Err(ReadError::Incomplete) => {}
                Err(e) => return Err(io::Error::new(io::ErrorKind::InvalidData, e)),
            }
            if self.buf.capacity() - self.buf.len() < self.chunk / 4 {
                self.buf.reserve(self.chunk);
            }
            let read = tokio::time::timeout_at(deadline, self.stream.read_buf(&mut self.buf))
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no reply within {} s ({} bytes of a partial reply buffered): the \
                             server stalled or lost a reply",
                            timeout.as_secs_f64(),
                            self.buf.len()
                        ),
                    )
                })??;
            if read == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ));
            }
        }
    }

    /// The next reply as a tree, waiting up to `timeout` for it.
    pub async fn reply(&mut self, timeout: Duration) -> io::Result<Value> {
        let parsed = self.next(timeout, Value::parse).await?;
        let (value, _) = parsed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(value)
    }

    /// The socket, to hand to another runtime; an error if reply bytes are still unread (they
    /// would be lost).
    pub fn into_std(self) -> io::Result<std::net::TcpStream> {
        if !self.buf.is_empty() {
            return Err(io::Error::other("unread reply left on a connection"));
        }
        self.stream.into_std()
    }
}
