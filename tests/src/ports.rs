//! Free loopback TCP ports for the components.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};

/// Finds `n` distinct free ports on 127.0.0.1 by binding port 0 `n` times.
///
/// The listeners are closed before returning, so another process could in principle grab a port
/// before the component binds it; holding all `n` open until the end at least guarantees the
/// ports are distinct. This is the approach envtest takes; a bind failure shows up as a
/// component that exits early, which the readiness wait reports with its log.
pub fn free_ports(n: usize) -> std::io::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))
        .collect::<std::io::Result<Vec<_>>>()?;
    listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct_and_nonzero() {
        let ports = super::free_ports(4).expect("ports");
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 4);
        assert!(ports.iter().all(|p| *p != 0));
    }
}
