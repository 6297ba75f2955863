//! How a kill or an unblock reaches a parked acquire, which may wait on another thread than
//! the killer's: a client's kill flag and where its parked acquire waits. Its connection, the
//! client registry (clients.rs) and the shard that parks the acquire (worker.rs) share it; the
//! shard sees nothing else of the client.
//!
//! A killer sets the flag, then reads where the client waits and cancels the waiter there
//! before it answers (dispatch.rs). A shard parking an acquire records where it waits and reads
//! the flag under the same lock, so one of the two always sees the other: a killed client's
//! waiter is either found by its killer or never left waiting.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::engine::{ClientId, WaiterId};

/// See the module docs.
#[derive(Debug)]
pub struct Parking {
    /// The client's id, which its parked acquire is shown under (SEM.WAITERS).
    client: ClientId,
    killed: AtomicBool,
    /// The shard and waiter id of the client's parked acquire. It may outlive the wait until the
    /// connection clears it; cancelling a waiter that ended is a no-op.
    at: Mutex<Option<(usize, WaiterId)>>,
}

impl Parking {
    /// The parking of client `client`, neither killed nor parked.
    pub fn new(client: ClientId) -> Parking {
        Parking {
            client,
            killed: AtomicBool::new(false),
            at: Mutex::new(None),
        }
    }

    /// The client's id.
    pub fn client(&self) -> ClientId {
        self.client
    }

    fn at(&self) -> MutexGuard<'_, Option<(usize, WaiterId)>> {
        self.at.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether CLIENT KILL (or ACL DELUSER) ended the client.
    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    /// Marks the client killed; whoever kills it then cancels what [`Parking::parked`] shows.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::Release);
    }

    /// Records that the client's acquire parked as `waiter` on `shard` (called by that shard as
    /// it parks it). False when the client was killed: the shard then takes the waiter out at
    /// once, since its killer may have looked before this.
    pub fn park(&self, shard: usize, waiter: WaiterId) -> bool {
        let mut at = self.at();
        if self.is_killed() {
            return false;
        }
        *at = Some((shard, waiter));
        true
    }

    /// The client's wait on `waiter` ended (its connection saw the reply or cancelled it).
    pub fn unpark(&self, waiter: WaiterId) {
        let mut at = self.at();
        if at.is_some_and(|(_, w)| w == waiter) {
            *at = None;
        }
    }

    /// Where the client's parked acquire waits, if it may still wait.
    pub fn parked(&self) -> Option<(usize, WaiterId)> {
        *self.at()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kill_finds_the_parked_acquire_or_keeps_it_from_parking() {
        let p = Parking::new(1);
        assert!(p.park(1, 7));
        assert_eq!(p.parked(), Some((1, 7)));
        p.unpark(6);
        assert_eq!(p.parked(), Some((1, 7)), "another wait's end leaves it");
        p.kill();
        assert_eq!(p.parked(), Some((1, 7)), "the killer finds it");
        p.unpark(7);
        assert_eq!(p.parked(), None);
        assert!(
            !p.park(0, 8),
            "a killed client's acquire is not left parked"
        );
        assert_eq!(p.parked(), None);
    }
}
