//! The registry of connected clients, for CLIENT LIST / INFO / KILL / UNBLOCK and INFO.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Notify;

/// What a connection shares with the rest of the server.
#[derive(Debug)]
pub struct Client {
    /// Unique id (`CLIENT ID`).
    pub id: u64,
    /// Peer address.
    pub addr: SocketAddr,
    /// Local address.
    pub laddr: SocketAddr,
    /// Socket file descriptor.
    pub fd: i32,
    /// The shard thread serving the connection (it moves to the shard of its namespaces: see
    /// `conn.rs`).
    shard: AtomicUsize,
    created: Instant,
    /// Milliseconds since `created` of the last command.
    last_active_ms: AtomicU64,
    names: Mutex<Names>,
    /// Protocol version (2 or 3).
    pub resp: AtomicU8,
    /// Parked in SEM.ACQUIRE.
    pub blocked: AtomicBool,
    /// Commands queued in MULTI, or -1.
    pub multi: AtomicI64,
    /// Set by CLIENT KILL.
    pub killed: AtomicBool,
    /// Pending CLIENT UNBLOCK: 0 none, 1 TIMEOUT, 2 ERROR.
    pub unblock: AtomicU8,
    /// Wakes the connection for a kill or an unblock.
    pub wake: Notify,
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
    /// Sets the connection name (`CLIENT SETNAME`, `HELLO ... SETNAME`). Like `set_lib`, it keeps
    /// a copy: the argument is a slice of the connection's read buffer, which it would pin.
    pub fn set_name(&self, name: Bytes) {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .name = Bytes::copy_from_slice(&name);
    }

    /// The connection name.
    pub fn name(&self) -> Bytes {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .name
            .clone()
    }

    /// Sets `lib-name` or `lib-ver`.
    pub fn set_lib(&self, lib_name: bool, value: Bytes) {
        let mut n = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if lib_name {
            n.lib_name = Bytes::copy_from_slice(&value);
        } else {
            n.lib_ver = Bytes::copy_from_slice(&value);
        }
    }

    /// Sets the authenticated user.
    pub fn set_user(&self, user: Bytes) {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .user = user;
    }

    /// The authenticated user.
    pub fn user(&self) -> Bytes {
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .user
            .clone()
    }

    /// Records the command being run (for `cmd=` and `idle=`).
    pub fn touch(&self, cmd: &'static str) {
        let ms = self.created.elapsed().as_millis() as u64;
        self.last_active_ms.store(ms, Ordering::Relaxed);
        self.names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .cmd = cmd;
    }

    /// The shard thread serving the connection now.
    pub fn shard(&self) -> usize {
        self.shard.load(Ordering::Relaxed)
    }

    /// The connection moves to shard thread `shard`.
    pub fn moves_to(&self, shard: usize) {
        self.shard.store(shard, Ordering::Relaxed);
    }

    /// Shuts the socket down, which ends the connection's pending read: so the hot read path
    /// waits on the socket alone. Only called with the registry lock held (see [`Registry`]).
    fn shutdown_socket(&self, how: std::net::Shutdown) {
        // SAFETY: the registry lock is held, and a connection leaves the registry before its
        // socket is closed, so `fd` is still this client's open socket.
        let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) };
        let _ = socket2::SockRef::from(&fd).shutdown(how);
    }

    /// The `CLIENT LIST` / `CLIENT INFO` line, in Redis's format.
    pub fn info_line(&self) -> String {
        let n = self.names.lock().unwrap_or_else(PoisonError::into_inner);
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

/// All connected clients.
#[derive(Debug, Default)]
pub struct Registry {
    clients: Mutex<BTreeMap<u64, Arc<Client>>>,
    next_id: AtomicU64,
    /// Connections parked in SEM.ACQUIRE.
    pub blocked: AtomicUsize,
    /// Connections accepted since start.
    pub total_connections: AtomicU64,
    /// Connections refused for maxclients.
    pub rejected_connections: AtomicU64,
}

impl Registry {
    /// Registers a new connection; `sock` is a duplicate handle of its socket.
    pub fn add(&self, addr: SocketAddr, laddr: SocketAddr, fd: i32, shard: usize) -> Arc<Client> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let c = Arc::new(Client {
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
            killed: AtomicBool::new(false),
            unblock: AtomicU8::new(0),
            wake: Notify::new(),
        });
        self.total_connections.fetch_add(1, Ordering::Relaxed);
        let now = {
            let mut clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
            clients.insert(id, c.clone());
            clients.len()
        };
        if now >= super::BURST_CONNECTIONS {
            crate::alloc::burst_began();
        }
        c
    }

    /// Closes every connection `pick` chooses: its pending read ends, and a parked acquire is
    /// cancelled. Returns how many.
    pub fn kill_where(&self, pick: impl Fn(&Client) -> bool) -> usize {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        let mut n = 0;
        for c in clients.values().filter(|c| pick(c)) {
            c.killed.store(true, Ordering::Release);
            c.shutdown_socket(std::net::Shutdown::Both);
            c.wake.notify_one();
            n += 1;
        }
        n
    }

    /// Stops every connection reading (shutdown): each writes the replies it owes, then closes.
    pub fn stop_reading_all(&self) {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        for c in clients.values() {
            c.shutdown_socket(std::net::Shutdown::Read);
        }
    }

    /// Unregisters a connection; it must be called before the connection's socket is closed.
    pub fn remove(&self, id: u64) {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Connected clients now.
    pub fn count(&self) -> usize {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Connected clients served by shard thread `shard`.
    pub fn count_on_shard(&self, shard: usize) -> usize {
        let clients = self.clients.lock().unwrap_or_else(PoisonError::into_inner);
        clients.values().filter(|c| c.shard() == shard).count()
    }

    /// A snapshot of all clients, by id.
    pub fn all(&self) -> Vec<Arc<Client>> {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// The client with this id.
    pub fn get(&self, id: u64) -> Option<Arc<Client>> {
        self.clients
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .cloned()
    }
}
