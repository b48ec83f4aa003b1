//! Free loopback TCP ports for the components.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// Finds `N` distinct free ports on 127.0.0.1 by binding port 0 `N` times.
///
/// The listeners are closed before returning, so another process could in principle grab a port
/// before the component binds it; holding all `N` open until the end at least guarantees the
/// ports are distinct. This is the approach envtest takes; a bind failure shows up as a
/// component that exits early, which the readiness wait reports with its log.
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let mut listeners = Vec::with_capacity(N);
    let mut ports = [0; N];
    for port in &mut ports {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        *port = listener.local_addr()?.port();
        listeners.push(listener);
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports: [u16; 4] = super::free_ports().expect("ports");
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
        assert!(ports.iter().all(|p| *p != 0));
    }
}
