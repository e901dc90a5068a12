//! Picking loopback ports for throwaway servers.

use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, MutexGuard};

/// Ports a test server must never use. Tests must not talk to (or flush!) a
/// developer's real Redis or Sentinel that happens to run on the default
/// ports, nor collide with the cluster bus of a default-port node.
const FORBIDDEN_PORTS: &[u16] = &[6379, 16379, 26379];

/// Ports handed out to servers of this process that are still alive. The OS
/// only guarantees a port is free while we hold the listener, so without
/// this two servers started at the same moment could be offered the same
/// port and one of them would lose the race.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

fn reserved() -> MutexGuard<'static, BTreeSet<u16>> {
    // A panic while holding the lock cannot leave the set inconsistent.
    RESERVED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether `port` may be given to a test server.
pub(crate) fn is_acceptable(port: u16) -> bool {
    port != 0 && !FORBIDDEN_PORTS.contains(&port)
}

/// A loopback port that no other server of this process will be given
/// until the reservation is dropped.
#[derive(Debug)]
pub(crate) struct PortReservation {
    port: u16,
}

impl PortReservation {
    /// Asks the OS for a free port on 127.0.0.1 and reserves it.
    ///
    /// The port is free when this returns, but another process may bind it
    /// before the server does; callers must be prepared to retry.
    pub(crate) fn new() -> io::Result<Self> {
        const ATTEMPTS: usize = 64;
        for _ in 0..ATTEMPTS {
            let port = {
                let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
                listener.local_addr()?.port()
            };
            if is_acceptable(port) && reserved().insert(port) {
                return Ok(Self { port });
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("could not find a free port on 127.0.0.1 in {ATTEMPTS} attempts"),
        ))
    }

    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        reserved().remove(&self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_redis_ports_are_never_acceptable() {
        assert!(!is_acceptable(6379));
        assert!(!is_acceptable(26379));
        assert!(!is_acceptable(16379));
        assert!(!is_acceptable(0));
        assert!(is_acceptable(40000));
    }

    #[test]
    fn live_reservations_are_distinct() {
        let reservations: Vec<_> = (0..32).map(|_| PortReservation::new().unwrap()).collect();
        let ports: BTreeSet<u16> = reservations.iter().map(PortReservation::port).collect();
        assert_eq!(ports.len(), reservations.len());
        assert!(ports.iter().all(|&p| is_acceptable(p)));
        assert!(ports.iter().all(|p| reserved().contains(p)));
    }

    #[test]
    fn dropping_a_reservation_releases_the_port() {
        // Port 1 is privileged, so `bind(0)` never hands it to a concurrent
        // test and the assertions below cannot race with one.
        assert!(reserved().insert(1));
        drop(PortReservation { port: 1 });
        assert!(!reserved().contains(&1));
    }
}
