//! Free loopback TCP ports for the components.

use std::collections::{HashSet, VecDeque};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::{LazyLock, Mutex, PoisonError};

/// How many of the ports handed out last are never handed out again by this process.
const REMEMBERED: usize = 4096;

/// How many ports the kernel may offer that this process handed out already, per call, before
/// giving up.
const MAX_REPEATS: usize = 256;

/// The ports this process handed out last, oldest first.
#[derive(Default)]
struct HandedOut {
    order: VecDeque<u16>,
    set: HashSet<u16>,
}

impl HandedOut {
    fn contains(&self, port: u16) -> bool {
        self.set.contains(&port)
    }

    fn remember(&mut self, port: u16) {
        if self.set.insert(port) {
            self.order.push_back(port);
        }
        while self.order.len() > REMEMBERED {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }
}

static HANDED_OUT: LazyLock<Mutex<HandedOut>> = LazyLock::new(Mutex::default);

/// Finds `N` distinct free ports on 127.0.0.1 by binding port 0, never one this process handed
/// out among its last [`REMEMBERED`].
///
/// The listeners are closed before returning, so the component binds the port some
/// milliseconds later. Within one test process, where tests and the lines of one test start
/// their components at once, that window was a real race: a port released here and not yet
/// bound by its etcd was offered again to the next caller, and one of the two members failed
/// with "address already in use" (seen in CI, 1 run in 8 of `etcd_lines`). Remembering what was
/// handed out closes it for every caller in the process; another process could still take a
/// port in the window, which a component reports as an early exit with its log.
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
    // Every listener stays open until the end, so the kernel offers each port once per call.
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    let mut repeats = 0;
    for port in &mut ports {
        loop {
            let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
            let offered = listener.local_addr()?.port();
            listeners.push(listener);
            if !handed_out.contains(offered) {
                *port = offered;
                break;
            }
            repeats += 1;
            if repeats > MAX_REPEATS {
                return Err(std::io::Error::other(format!(
                    "the kernel offered {repeats} loopback ports this process handed out already"
                )));
            }
        }
    }
    for port in ports {
        handed_out.remember(port);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports: [u16; 4] = free_ports().expect("ports");
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
        assert!(ports.iter().all(|p| *p != 0));
    }

    #[test]
    fn a_port_is_never_handed_out_twice_while_remembered() {
        // 200 calls of 8 ports, beside each other: no port is handed out twice, though every
        // listener is closed at once (the kernel is free to offer a port again).
        let mut seen = HashSet::new();
        for _ in 0..200 {
            let ports: [u16; 8] = free_ports().expect("ports");
            for port in ports {
                assert!(seen.insert(port), "port {port} handed out twice");
            }
        }
    }

    #[test]
    fn the_memory_is_bounded_oldest_first() {
        let mut handed_out = HandedOut::default();
        for port in 1..=u16::try_from(REMEMBERED + 10).expect("fits") {
            handed_out.remember(port);
        }
        assert_eq!(handed_out.order.len(), REMEMBERED);
        assert_eq!(handed_out.set.len(), REMEMBERED);
        assert!(!handed_out.contains(10), "the oldest are forgotten");
        assert!(handed_out.contains(11));
        handed_out.remember(11);
        assert_eq!(
            handed_out.order.len(),
            REMEMBERED,
            "a repeat is not counted twice"
        );
    }
}
