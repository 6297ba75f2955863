//! An in-test TCP proxy: one listener forwarding every connection to one target, with faults
//! set at run time for each direction on its own.
//!
//! - **Delay**: every chunk read in that direction is written on after the delay.
//! - **Partition**: bytes in that direction are held, as TCP holds them while a link is down
//!   (its retransmissions go nowhere), while the other direction flows. [`Proxy::heal`] delivers
//!   what was held, in order, late: a request a client gave up on can still reach the server.
//!   A client's close is held with its bytes.
//! - **Drop**: [`Proxy::drop_connections`] resets every open connection; whatever was held in
//!   them is discarded. Partition then drop is a partition that loses the bytes.
//! - **Cut**: [`Proxy::cut`] resets the connections from one source address (or all) and
//!   refuses new ones from it until [`Proxy::heal`]: a cluster's nodes dial from addresses of
//!   their own (`--cluster-bind`), so a proxy in front of each node's cluster port can cut
//!   exactly the links of one node, both ways.
//! - **Record** and **tamper**, a hostile path: [`Proxy::record`] keeps a copy of every byte
//!   passed on from then on, both ways ([`Proxy::recorded`]); [`Proxy::tamper`] flips a bit of
//!   the next chunk passed on in one direction.
//!
//! Plain threads, two per connection; each polls its socket every few milliseconds, so a
//! change of faults takes effect within that.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// How often a pump looks at its socket and at the faults.
const POLL: Duration = Duration::from_millis(5);

/// A direction of a proxied connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// From the connecting side to the target (requests).
    ToTarget,
    /// From the target back (replies).
    FromTarget,
}

/// The faults of one direction.
#[derive(Debug, Clone, Copy, Default)]
struct Way {
    delay: Duration,
    held: bool,
    /// Flip a bit of the next chunk.
    tamper: bool,
}

/// One proxied connection: both sockets, so a drop can reset it.
struct Link {
    /// Where the connection came from.
    from: IpAddr,
    client: TcpStream,
    target: TcpStream,
    /// Set when the link is reset; its pumps stop.
    dead: Arc<AtomicBool>,
    /// Pumps still running; 0 once the link is gone.
    pumps: Arc<AtomicUsize>,
}

#[derive(Default)]
struct State {
    to_target: Way,
    from_target: Way,
    /// Sources refused (`None`: every source).
    cut: Vec<Option<IpAddr>>,
    links: Vec<Link>,
    /// What passed since [`Proxy::record`], both ways.
    recorded: Option<Vec<u8>>,
}

impl State {
    fn refuses(&self, from: IpAddr) -> bool {
        self.cut.iter().any(|c| c.is_none_or(|ip| ip == from))
    }

    fn way(&mut self, dir: Dir) -> &mut Way {
        match dir {
            Dir::ToTarget => &mut self.to_target,
            Dir::FromTarget => &mut self.from_target,
        }
    }
}

struct Shared {
    target: SocketAddr,
    state: Mutex<State>,
    stop: AtomicBool,
}

impl Shared {
    fn way(&self, dir: Dir) -> Way {
        *self.state.lock().unwrap().way(dir)
    }

    /// `chunk`, about to pass on in `dir`, as the recording and tampering set want it.
    fn passing(&self, dir: Dir, chunk: &mut [u8]) {
        let mut st = self.state.lock().unwrap();
        if std::mem::take(&mut st.way(dir).tamper) {
            if let Some(last) = chunk.last_mut() {
                *last ^= 1;
            }
        }
        if let Some(r) = &mut st.recorded {
            r.extend_from_slice(chunk);
        }
    }
}

/// A proxy listening on a free 127.0.0.1 port; stopped, every connection reset, on drop.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl Proxy {
    pub fn start(target: SocketAddr) -> Proxy {
        Proxy::start_on(0, target)
    }

    /// A proxy on 127.0.0.1:`port` (0: any free port).
    pub fn start_on(port: u16, target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let shared = Arc::new(Shared {
            target,
            state: Mutex::new(State::default()),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        let accept = thread::spawn(move || accept_loop(listener, s));
        Proxy {
            addr,
            shared,
            accept: Some(accept),
        }
    }

    /// Where to connect to reach the target through the proxy.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays every chunk in `dir` by `delay` from now on.
    pub fn delay(&self, dir: Dir, delay: Duration) {
        self.shared.state.lock().unwrap().way(dir).delay = delay;
    }

    /// Holds every byte in `dir` until [`Proxy::heal`].
    pub fn partition(&self, dir: Dir) {
        self.shared.state.lock().unwrap().way(dir).held = true;
    }

    /// Resets the connections from `from` (`None`: from anywhere) and refuses new ones from
    /// there until [`Proxy::heal`].
    pub fn cut(&self, from: Option<IpAddr>) {
        let mut st = self.shared.state.lock().unwrap();
        st.cut.push(from);
        let (cut, kept): (Vec<Link>, Vec<Link>) = std::mem::take(&mut st.links)
            .into_iter()
            .partition(|l| from.is_none_or(|ip| ip == l.from));
        st.links = kept;
        for link in cut {
            link.kill();
        }
    }

    /// Keeps a copy of every byte passed on from now on, both ways.
    pub fn record(&self) {
        self.shared.state.lock().unwrap().recorded = Some(Vec::new());
    }

    /// What passed on since [`Proxy::record`].
    pub fn recorded(&self) -> Vec<u8> {
        let st = self.shared.state.lock().unwrap();
        st.recorded.clone().unwrap_or_default()
    }

    /// Flips a bit of the next chunk passed on in `dir` (its last byte's lowest).
    pub fn tamper(&self, dir: Dir) {
        self.shared.state.lock().unwrap().way(dir).tamper = true;
    }

    /// Ends every partition, cut and delay; what was held flows on.
    pub fn heal(&self) {
        let mut st = self.shared.state.lock().unwrap();
        st.to_target = Way::default();
        st.from_target = Way::default();
        st.cut.clear();
    }

    /// Resets every open connection (new ones are accepted as before).
    pub fn drop_connections(&self) {
        let mut st = self.shared.state.lock().unwrap();
        for link in st.links.drain(..) {
            link.kill();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.drop_connections();
        // Wakes the accept loop, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

impl Link {
    fn kill(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.target.shutdown(Shutdown::Both);
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for client in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        let Ok(from) = client.peer_addr().map(|a| a.ip()) else {
            continue;
        };
        if shared.state.lock().unwrap().refuses(from) {
            continue;
        }
        // A target that is down (killed, restarting) refuses: so does the proxy, by closing.
        let Ok(target) = TcpStream::connect_timeout(&shared.target, Duration::from_secs(1)) else {
            continue;
        };
        if let Err(e) = open_link(&shared, from, client, target) {
            eprintln!("proxy: could not set up a link: {e}");
        }
    }
}

fn open_link(
    shared: &Arc<Shared>,
    from: IpAddr,
    client: TcpStream,
    target: TcpStream,
) -> io::Result<()> {
    for s in [&client, &target] {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(POLL))?;
        s.set_write_timeout(Some(POLL))?;
    }
    let dead = Arc::new(AtomicBool::new(false));
    let pumps = Arc::new(AtomicUsize::new(2));
    let pairs = [
        (Dir::ToTarget, client.try_clone()?, target.try_clone()?),
        (Dir::FromTarget, target.try_clone()?, client.try_clone()?),
    ];
    {
        let mut st = shared.state.lock().unwrap();
        st.links.retain(|l| l.pumps.load(Ordering::SeqCst) > 0);
        st.links.push(Link {
            from,
            client,
            target,
            dead: dead.clone(),
            pumps: pumps.clone(),
        });
    }
    for (dir, src, dst) in pairs {
        let pump = Pump {
            dir,
            src,
            dst,
            shared: shared.clone(),
            dead: dead.clone(),
        };
        let pumps = pumps.clone();
        thread::spawn(move || {
            pump.run();
            pumps.fetch_sub(1, Ordering::SeqCst);
        });
    }
    Ok(())
}

/// Copies one direction of a link, applying its faults.
struct Pump {
    dir: Dir,
    src: TcpStream,
    dst: TcpStream,
    shared: Arc<Shared>,
    dead: Arc<AtomicBool>,
}

impl Pump {
    fn stopped(&self) -> bool {
        self.dead.load(Ordering::SeqCst) || self.shared.stop.load(Ordering::SeqCst)
    }

    fn run(self) {
        // Chunks read and not yet written on, each with the instant it may go.
        let mut queue: VecDeque<(Instant, Vec<u8>)> = VecDeque::new();
        let mut src_closed = false;
        let mut buf = vec![0u8; 16 * 1024];
        while !self.stopped() {
            if !src_closed {
                match (&self.src).read(&mut buf) {
                    Ok(0) => src_closed = true,
                    Ok(n) => {
                        let due = Instant::now() + self.shared.way(self.dir).delay;
                        queue.push_back((due, buf[..n].to_vec()));
                    }
                    Err(e) if is_poll_timeout(&e) => {}
                    Err(_) => src_closed = true,
                }
            } else {
                thread::sleep(POLL);
            }
            if self.shared.way(self.dir).held {
                continue;
            }
            while queue.front().is_some_and(|(due, _)| *due <= Instant::now()) {
                let (_, mut chunk) = queue.pop_front().unwrap();
                self.shared.passing(self.dir, &mut chunk);
                if self.write_all(&chunk).is_err() {
                    self.reset();
                    return;
                }
            }
            if src_closed && queue.is_empty() {
                // Passes the close on; the other direction carries on until its own close.
                let _ = self.dst.shutdown(Shutdown::Write);
                return;
            }
        }
    }

    /// Writes all of `bytes`, waiting while the receiver does not read (a SIGSTOPped server),
    /// but giving up when the link is reset.
    fn write_all(&self, mut bytes: &[u8]) -> io::Result<()> {
        let mut dst = &self.dst;
        while !bytes.is_empty() {
            if self.stopped() {
                return Err(io::ErrorKind::ConnectionAborted.into());
            }
            match dst.write(bytes) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if is_poll_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Ends both directions: the receiver is gone.
    fn reset(&self) {
        self.dead.store(true, Ordering::SeqCst);
        let _ = self.src.shutdown(Shutdown::Both);
        let _ = self.dst.shutdown(Shutdown::Both);
    }
}

fn is_poll_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}
