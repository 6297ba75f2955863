//! The registry of connected clients, for CLIENT LIST / INFO / KILL / UNBLOCK and INFO.
//!
//! A connection registers once it is established (after its TLS handshake) and holds the
//! [`Registration`] for as long as it lives, across moves between shard threads; dropping the
//! registration unregisters it, on every path, a panic's unwinding included.
//!
//! CLIENT KILL and shutdown end a connection's pending read by shutting its socket down through
//! the file descriptor number kept here, so that the hot read path waits on the socket alone.
//! A number is only safe to use while it still names this client's socket: the registry uses it
//! only while the socket is *attached* (see [`Registration::detach_socket`]), and a connection
//! detaches it, under the registry's lock, before any step that can close it: dropping the
//! registration, which is declared before the socket wherever both live so that it drops first,
//! and taking the socket off an event loop or onto one (tokio closes it if either fails).
//! Keeping a `dup` of each socket in the registry instead would cost a second descriptor per
//! client, and a registry snapshot still holding it would keep a closed connection's socket open.
//!
//! A kill or an unblock ends a parked acquire on the killer's side, before its command is
//! answered, through the client's [`Parking`] (parking.rs).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::futures::Notified;
use tokio::sync::Notify;

use super::parking::Parking;
use crate::engine::WaiterId;
use crate::protocol::Proto;

/// Registered connections at which a rise counts as a burst (checked as each registers, so a
/// fast burst is not missed while the shards catch up with the accepts): what lives from before
/// it is then kept apart from what the burst allocates (see [`crate::alloc`]). The burst ends,
/// and the next one can count, once connections are back below half of this. Low, because what the burst's
/// first connections allocate before the switch lands in the old heap: `scripts/soak` 120 s
/// left 580 kB above the level before the load at 64, 448 kB at 16 (one run each).
const BURST_CONNECTIONS: usize = 16;

/// What a connection shares with the rest of the server: what CLIENT LIST shows of it, and what
/// CLIENT KILL and CLIENT UNBLOCK act on.
#[derive(Debug)]
pub struct Client {
    id: u64,
    addr: SocketAddr,
    laddr: SocketAddr,
    fd: i32,
    /// The shard thread serving the connection (it moves to the shard of its namespaces: see
    /// `conn.rs`).
    shard: AtomicUsize,
    created: Instant,
    /// Milliseconds since `created` of the last command.
    last_active_ms: AtomicU64,
    names: Mutex<Names>,
    /// Protocol version (2 or 3).
    resp: AtomicU8,
    /// The connection waits on a parked acquire (`flags=b`, `blocked_clients`).
    blocked: AtomicBool,
    /// Commands queued in MULTI, or -1.
    multi: AtomicI64,
    /// The kill flag and where the client's acquire is parked, shared with the shards.
    parking: Arc<Parking>,
    /// Wakes the connection for a kill.
    wake: Notify,
}

#[derive(Debug, Default)]
struct Names {
    name: Bytes,
    lib_name: Bytes,
    lib_ver: Bytes,
    user: Bytes,
    cmd: &'static str,
}

impl Client {
    /// The unique id (`CLIENT ID`).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The peer's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address the client connected to.
    pub fn laddr(&self) -> SocketAddr {
        self.laddr
    }

    /// Whether the client connects from this machine (127.0.0.1 or ::1), for protected mode
    /// and `--enable-debug-command local`.
    pub fn is_local(&self) -> bool {
        is_local(self.addr.ip())
    }

    fn names(&self) -> MutexGuard<'_, Names> {
        self.names.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets the connection name (`CLIENT SETNAME`, `HELLO ... SETNAME`). Like `set_lib`, it keeps
    /// a copy: the argument is a slice of the connection's read buffer, which it would pin.
    pub fn set_name(&self, name: Bytes) {
        self.names().name = Bytes::copy_from_slice(&name);
    }

    /// The connection name (empty when none was set).
    pub fn name(&self) -> Bytes {
        self.names().name.clone()
    }

    /// Sets `lib-name` (`lib_name`) or `lib-ver`.
    pub fn set_lib(&self, lib_name: bool, value: Bytes) {
        let mut n = self.names();
        if lib_name {
            n.lib_name = Bytes::copy_from_slice(&value);
        } else {
            n.lib_ver = Bytes::copy_from_slice(&value);
        }
    }

    /// Sets the name of the authenticated user.
    pub fn set_user(&self, user: Bytes) {
        self.names().user = user;
    }

    /// The name of the authenticated user (`default` before any AUTH).
    pub fn user(&self) -> Bytes {
        self.names().user.clone()
    }

    /// Records the command being run (for `cmd=` and `idle=`).
    pub fn touch(&self, cmd: &'static str) {
        let ms = self.created.elapsed().as_millis() as u64;
        self.last_active_ms.store(ms, Ordering::Relaxed);
        self.names().cmd = cmd;
    }

    /// Records the protocol the connection speaks now (`resp=`).
    pub fn set_proto(&self, proto: Proto) {
        self.resp.store(proto.number() as u8, Ordering::Relaxed);
    }

    /// Records a transaction: `Some(n)` commands queued in MULTI, or `None` outside one.
    pub fn set_multi(&self, queued: Option<usize>) {
        let v = queued.map_or(-1, |n| n as i64);
        self.multi.store(v, Ordering::Relaxed);
    }

    /// The shard thread serving the connection now.
    pub fn shard(&self) -> usize {
        self.shard.load(Ordering::Relaxed)
    }

    /// The connection moves to shard thread `shard`.
    pub fn moves_to(&self, shard: usize) {
        self.shard.store(shard, Ordering::Relaxed);
    }

    /// Whether CLIENT KILL (or ACL DELUSER) ended the connection.
    pub fn is_killed(&self) -> bool {
        self.parking.is_killed()
    }

    /// What the shards see of the client: its kill flag, and where its acquire parks.
    pub fn parking(&self) -> &Arc<Parking> {
        &self.parking
    }

    /// Resolves when a kill wakes the connection.
    pub fn woken(&self) -> Notified<'_> {
        self.wake.notified()
    }

    /// Marks the connection killed and wakes it; the registry also shuts its socket down.
    fn kill(&self) {
        self.parking.kill();
        self.wake.notify_one();
    }

    /// The `CLIENT LIST` / `CLIENT INFO` line, in Redis's format.
    pub fn info_line(&self) -> String {
        let n = self.names();
        let age = self.created.elapsed().as_secs();
        let idle_ms = (self.created.elapsed().as_millis() as u64)
            .saturating_sub(self.last_active_ms.load(Ordering::Relaxed));
        let multi = self.multi.load(Ordering::Relaxed);
        let mut flags = String::new();
        if self.blocked.load(Ordering::Relaxed) {
            flags.push('b');
        }
        if multi >= 0 {
            flags.push('x');
        }
        if flags.is_empty() {
            flags.push('N');
        }
        format!(
            "id={} addr={} laddr={} fd={} name={} age={} idle={} flags={} db=0 sub=0 psub=0 ssub=0 multi={} qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 omem=0 tot-mem=0 events=r cmd={} user={} redir=-1 resp={} lib-name={} lib-ver={}",
            self.id,
            self.addr,
            self.laddr,
            self.fd,
            String::from_utf8_lossy(&n.name),
            age,
            idle_ms / 1000,
            flags,
            multi,
            if n.cmd.is_empty() { "NULL" } else { n.cmd },
            String::from_utf8_lossy(&n.user),
            self.resp.load(Ordering::Relaxed),
            String::from_utf8_lossy(&n.lib_name),
            String::from_utf8_lossy(&n.lib_ver),
        )
    }
}

/// Whether Redis's protected mode counts `ip` as local (only 127.0.0.1 and ::1, as Redis).
pub fn is_local(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => {
            v6 == Ipv6Addr::LOCALHOST || v6.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)
        }
    }
}

/// A registered client and whether the registry may use its socket (see the module docs).
#[derive(Debug)]
struct Entry {
    client: Arc<Client>,
    attached: bool,
}

impl Entry {
    /// Shuts the socket down, which ends the connection's pending read. Only called with the
    /// registry lock held.
    fn shutdown_socket(&self, how: std::net::Shutdown) {
        if !self.attached {
            return;
        }
        // SAFETY: the registry lock is held and the socket is attached: its connection has not
        // begun any step that can close it (each first detaches it, or unregisters, under this
        // lock), so `fd` is still this client's open socket.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.client.fd) };
        let _ = socket2::SockRef::from(&fd).shutdown(how);
    }
}

/// What the registry and the registrations of its clients share.
#[derive(Debug, Default)]
struct Shared {
    entries: Mutex<BTreeMap<u64, Entry>>,
    next_id: AtomicU64,
    /// Connections parked in SEM.ACQUIRE.
    blocked: AtomicUsize,
    total_connections: AtomicU64,
    rejected_connections: AtomicU64,
    /// Seats taken (see [`Seat`]).
    seated: AtomicUsize,
}

impl Shared {
    fn entries(&self) -> MutexGuard<'_, BTreeMap<u64, Entry>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_attached(&self, id: u64, attached: bool) {
        if let Some(e) = self.entries().get_mut(&id) {
            e.attached = attached;
        }
    }
}

/// All connected clients.
#[derive(Debug, Default)]
pub struct Registry {
    shared: Arc<Shared>,
}

impl Registry {
    /// Registers a new connection whose socket is `fd`, served by shard thread `shard`. The
    /// connection is registered until the returned registration drops.
    pub fn register(
        &self,
        seat: Seat,
        addr: SocketAddr,
        laddr: SocketAddr,
        fd: i32,
        shard: usize,
    ) -> Registration {
        let s = &self.shared;
        let id = s.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let client = Arc::new(Client {
            id,
            addr,
            laddr,
            fd,
            shard: AtomicUsize::new(shard),
            created: Instant::now(),
            last_active_ms: AtomicU64::new(0),
            names: Mutex::new(Names {
                user: Bytes::from_static(b"default"),
                ..Names::default()
            }),
            resp: AtomicU8::new(2),
            blocked: AtomicBool::new(false),
            multi: AtomicI64::new(-1),
            parking: Arc::new(Parking::new(id)),
            wake: Notify::new(),
        });
        s.total_connections.fetch_add(1, Ordering::Relaxed);
        let now = {
            let mut entries = s.entries();
            let entry = Entry {
                client: client.clone(),
                attached: true,
            };
            entries.insert(id, entry);
            entries.len()
        };
        if now >= BURST_CONNECTIONS {
            crate::alloc::burst_began();
        }
        Registration {
            client,
            shared: s.clone(),
            _seat: seat,
        }
    }

    /// A seat for a connection just accepted, unless `max` are taken (a rejected connection).
    pub fn seat(&self, max: usize) -> Option<Seat> {
        let s = &self.shared;
        let taken = s
            .seated
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < max).then_some(n + 1)
            });
        match taken {
            Ok(_) => Some(Seat(s.clone())),
            Err(_) => {
                s.rejected_connections.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Closes every connection `pick` chooses: its pending read ends, and a parked acquire is
    /// cancelled. Returns how many.
    pub fn kill_where(&self, pick: impl Fn(&Client) -> bool) -> usize {
        let entries = self.shared.entries();
        let mut n = 0;
        for e in entries.values().filter(|e| pick(&e.client)) {
            e.client.kill();
            e.shutdown_socket(std::net::Shutdown::Both);
            n += 1;
        }
        n
    }

    /// Where the parked acquires of killed clients wait, for their killer to cancel them there
    /// (read after the kills: see parking.rs).
    pub fn killed_parked(&self) -> Vec<(usize, WaiterId)> {
        let entries = self.shared.entries();
        entries
            .values()
            .filter(|e| e.client.is_killed())
            .filter_map(|e| e.client.parking.parked())
            .collect()
    }

    /// Stops every connection reading (shutdown): each writes the replies it owes, then closes.
    pub fn stop_reading_all(&self) {
        for e in self.shared.entries().values() {
            e.shutdown_socket(std::net::Shutdown::Read);
        }
    }

    /// Connected clients now.
    pub fn count(&self) -> usize {
        self.shared.entries().len()
    }

    /// Connected clients served by shard thread `shard`.
    pub fn count_on_shard(&self, shard: usize) -> usize {
        let entries = self.shared.entries();
        entries
            .values()
            .filter(|e| e.client.shard() == shard)
            .count()
    }

    /// A snapshot of all clients, by id.
    pub fn all(&self) -> Vec<Arc<Client>> {
        let entries = self.shared.entries();
        entries.values().map(|e| e.client.clone()).collect()
    }

    /// The client with this id.
    pub fn get(&self, id: u64) -> Option<Arc<Client>> {
        self.shared.entries().get(&id).map(|e| e.client.clone())
    }

    /// Connections parked in SEM.ACQUIRE now (`blocked_clients`).
    pub fn blocked(&self) -> usize {
        self.shared.blocked.load(Ordering::Relaxed)
    }

    /// Connections accepted since start (`total_connections_received`).
    pub fn total_connections(&self) -> u64 {
        self.shared.total_connections.load(Ordering::Relaxed)
    }

    /// Connections refused for `--maxclients` since start (`rejected_connections`).
    pub fn rejected_connections(&self) -> u64 {
        self.shared.rejected_connections.load(Ordering::Relaxed)
    }
}

/// A connection's place under `--maxclients`, taken as it is accepted and held until it closes
/// (by its registration, which moves with it). Counted from the accept: a burst of accepts
/// outruns the shard threads' registrations, and a limit checked against those let more
/// connections in than the open-files limit was fitted for (`fdlimit.rs`).
#[derive(Debug)]
pub struct Seat(Arc<Shared>);

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.seated.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A connection's place in the registry; dropping it unregisters the connection.
#[derive(Debug)]
pub struct Registration {
    client: Arc<Client>,
    shared: Arc<Shared>,
    _seat: Seat,
}

impl Registration {
    /// The registered client.
    pub fn client(&self) -> &Arc<Client> {
        &self.client
    }

    /// Stops the registry from shutting the socket down, before a step that may close it
    /// (tokio's `into_std` and `from_std` close the socket when they fail). A kill meanwhile
    /// still marks the client, which the connection checks before its next read.
    pub fn detach_socket(&self) {
        self.shared.set_attached(self.client.id, false);
    }

    /// Lets the registry use the socket again, once it is on this thread's event loop.
    pub fn attach_socket(&self) {
        self.shared.set_attached(self.client.id, true);
    }

    /// Marks the connection waiting on a parked acquire, or no longer waiting.
    pub fn set_blocked(&self, blocked: bool) {
        self.client.blocked.store(blocked, Ordering::Relaxed);
        if blocked {
            self.shared.blocked.fetch_add(1, Ordering::Relaxed);
        } else {
            self.shared.blocked.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let left = {
            let mut entries = self.shared.entries();
            entries.remove(&self.client.id);
            entries.len()
        };
        if left < BURST_CONNECTIONS / 2 {
            crate::alloc::rearm();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "127.0.0.1:1".parse().unwrap()
    }

    fn register(registry: &Registry, fd: i32) -> Registration {
        let seat = registry.seat(usize::MAX).unwrap();
        registry.register(seat, addr(), addr(), fd, 0)
    }

    #[test]
    fn seats_stop_at_the_limit_until_one_is_given_back() {
        let registry = Registry::default();
        let seat = registry.seat(1).unwrap();
        assert!(registry.seat(1).is_none());
        assert_eq!(registry.rejected_connections(), 1);
        let reg = registry.register(seat, addr(), addr(), -1, 0);
        assert!(registry.seat(1).is_none(), "a registration holds its seat");
        drop(reg);
        assert!(registry.seat(1).is_some());
    }

    #[test]
    fn a_client_is_registered_until_its_registration_drops() {
        let registry = Registry::default();
        let reg = register(&registry, -1);
        let id = reg.client().id();
        assert!(registry.get(id).is_some());
        assert_eq!(registry.count_on_shard(0), 1);
        drop(reg);
        assert!(registry.get(id).is_none());
        assert_eq!(registry.count(), 0);
    }

    #[test]
    fn an_unwinding_panic_unregisters_too() {
        let registry = Arc::new(Registry::default());
        let r = registry.clone();
        let joined = std::thread::spawn(move || {
            let _reg = register(&r, -1);
            panic!("a connection task fails");
        })
        .join();
        assert!(joined.is_err());
        assert_eq!(registry.count(), 0);
    }

    #[test]
    fn the_killer_finds_where_a_killed_client_is_parked() {
        let registry = Registry::default();
        let reg = register(&registry, -1);
        // No socket to shut down here.
        reg.detach_socket();
        let p = reg.client().parking().clone();
        assert!(p.park(1, 7));
        assert!(registry.killed_parked().is_empty(), "not killed");
        assert_eq!(registry.kill_where(|_| true), 1);
        assert_eq!(registry.killed_parked(), vec![(1, 7)]);
        p.unpark(7);
        assert!(registry.killed_parked().is_empty());
    }

    #[test]
    fn the_registry_shuts_down_only_an_attached_socket() {
        use std::io::{Read, Write};
        use std::os::fd::AsRawFd;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut sock, _) = listener.accept().unwrap();
        let registry = Registry::default();
        let reg = register(&registry, sock.as_raw_fd());
        reg.detach_socket();
        assert_eq!(registry.kill_where(|_| true), 1);
        assert!(
            reg.client().is_killed(),
            "the kill waits for the connection to see it"
        );
        peer.write_all(b"x").unwrap();
        let mut b = [0u8; 1];
        assert_eq!(
            sock.read(&mut b).unwrap(),
            1,
            "a detached socket is left open"
        );
        reg.attach_socket();
        registry.stop_reading_all();
        assert_eq!(
            sock.read(&mut b).unwrap(),
            0,
            "an attached one is shut down"
        );
    }
}
