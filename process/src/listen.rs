//! Listen addresses as Kubernetes components take them (`--metrics-bind-address=:8080`):
//!
//! | written | meaning |
//! | --- | --- |
//! | `0` | the server is off |
//! | `:PORT` | every interface: `[::]:PORT` (IPv6 and IPv4 on a dual-stack host), else `0.0.0.0:PORT` |
//! | `IP:PORT`, `[IPv6]:PORT` | that address |
//! | `HOST:PORT` | the first address `HOST` resolves to that can be bound, resolved when binding |
//!
//! [`ListenAddress`] implements [`FromStr`], so clap uses it as the value parser of a field of
//! that type.

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, ToSocketAddrs};
use std::str::FromStr;

/// A listen address as Kubernetes components take it (see the module documentation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddress {
    /// `0`: the server is off.
    Disabled,
    /// `:PORT`: every interface (IPv6 and IPv4 where the host has IPv6, else IPv4).
    AnyInterface(u16),
    /// `IP:PORT` or `[IPv6]:PORT`.
    Socket(SocketAddr),
    /// `HOSTNAME:PORT`, resolved when binding.
    Host(String, u16),
}

/// Why a listen address does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("must be HOST:PORT, :PORT or 0, got {0:?}")]
pub struct ParseListenAddressError(String);

/// Why a listener could not be bound, naming the flag it was configured by.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {address} ({flag}): {source}")]
pub struct BindError {
    /// The flag of the address, such as `--metrics-bind-address`.
    pub flag: &'static str,
    /// The address as written.
    pub address: String,
    /// The I/O error.
    #[source]
    pub source: io::Error,
}

impl FromStr for ListenAddress {
    type Err = ParseListenAddressError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let s = input.trim();
        let err = || ParseListenAddressError(input.to_string());
        if s == "0" {
            return Ok(ListenAddress::Disabled);
        }
        if let Ok(addr) = s.parse::<SocketAddr>() {
            return Ok(ListenAddress::Socket(addr));
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(err)?;
        let port: u16 = port.parse().map_err(|_| err())?;
        if host.is_empty() {
            Ok(ListenAddress::AnyInterface(port))
        } else if host.contains([':', '[', ']', '/']) || host.contains(char::is_whitespace) {
            Err(err())
        } else {
            Ok(ListenAddress::Host(host.to_string(), port))
        }
    }
}

impl fmt::Display for ListenAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddress::Disabled => write!(f, "0"),
            ListenAddress::AnyInterface(port) => write!(f, ":{port}"),
            ListenAddress::Socket(addr) => write!(f, "{addr}"),
            ListenAddress::Host(host, port) => write!(f, "{host}:{port}"),
        }
    }
}

impl ListenAddress {
    /// The port, unless the server is off.
    pub fn port(&self) -> Option<u16> {
        match self {
            ListenAddress::Disabled => None,
            ListenAddress::AnyInterface(port) | ListenAddress::Host(_, port) => Some(*port),
            ListenAddress::Socket(addr) => Some(addr.port()),
        }
    }

    /// Whether two servers configured with `self` and `other` would want the same socket:
    /// the same fixed port (not 0) on overlapping hosts (one of them every interface, or the
    /// same host).
    pub fn overlaps(&self, other: &ListenAddress) -> bool {
        use ListenAddress::*;
        let (Some(a), Some(b)) = (self.port(), other.port()) else {
            return false;
        };
        if a != b || a == 0 {
            return false;
        }
        let any = |x: &ListenAddress| match x {
            AnyInterface(_) => true,
            Socket(addr) => addr.ip().is_unspecified(),
            _ => false,
        };
        any(self) || any(other) || self == other
    }

    /// Binds a non-blocking TCP listener, or returns `None` for [`ListenAddress::Disabled`].
    pub fn bind(&self) -> io::Result<Option<TcpListener>> {
        self.bind_with(TcpListener::bind)
    }

    /// [`bind`](Self::bind), naming `flag` in the error.
    pub fn bind_flag(&self, flag: &'static str) -> Result<Option<TcpListener>, BindError> {
        self.bind().map_err(|source| BindError {
            flag,
            address: self.to_string(),
            source,
        })
    }

    /// [`bind`](Self::bind) with the socket call given (so a test can play a host without IPv6).
    pub fn bind_with<F>(&self, bind: F) -> io::Result<Option<TcpListener>>
    where
        F: Fn(SocketAddr) -> io::Result<TcpListener>,
    {
        let listener = match self {
            ListenAddress::Disabled => return Ok(None),
            ListenAddress::AnyInterface(port) => {
                // `[::]` accepts IPv4 too on Linux (bindv6only=0); a host without IPv6 gets
                // `0.0.0.0`. A port in use or forbidden is reported as it is.
                match bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, *port))) {
                    Ok(listener) => listener,
                    Err(e) if is_final(&e) => return Err(e),
                    Err(_) => bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, *port)))?,
                }
            }
            ListenAddress::Socket(addr) => bind(*addr)?,
            ListenAddress::Host(host, port) => {
                let mut last = None;
                let mut bound = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match bind(addr) {
                        Ok(listener) => {
                            bound = Some(listener);
                            break;
                        }
                        Err(e) => last = Some(e),
                    }
                }
                match bound {
                    Some(listener) => listener,
                    None => {
                        return Err(last.unwrap_or_else(|| {
                            io::Error::new(
                                io::ErrorKind::AddrNotAvailable,
                                format!("{host} resolves to no address"),
                            )
                        }));
                    }
                }
            }
        };
        listener.set_nonblocking(true)?;
        Ok(Some(listener))
    }
}

/// Errors that binding the IPv4 address instead would not cure.
fn is_final(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::AddrInUse | io::ErrorKind::PermissionDenied
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_table() {
        let socket = |s: &str| ListenAddress::Socket(s.parse().unwrap());
        for (input, want) in [
            ("0", ListenAddress::Disabled),
            (":8080", ListenAddress::AnyInterface(8080)),
            (" :8081 ", ListenAddress::AnyInterface(8081)),
            ("127.0.0.1:0", socket("127.0.0.1:0")),
            ("0.0.0.0:9443", socket("0.0.0.0:9443")),
            ("[::1]:9443", socket("[::1]:9443")),
            ("[::]:9091", socket("[::]:9091")),
            (
                "localhost:9443",
                ListenAddress::Host("localhost".into(), 9443),
            ),
            ("10.0.0.1:80", socket("10.0.0.1:80")),
        ] {
            assert_eq!(input.parse(), Ok(want.clone()), "{input:?}");
            // Display writes what parses back to the same address.
            assert_eq!(want.to_string().parse(), Ok(want), "{input:?}");
        }
        for bad in [
            "",
            ":",
            "8080",
            ":http",
            "a:b:1",
            "host:99999",
            "::1:80",
            "[::1:80",
            "1.2.3.4",
            ":99999",
            "a b:1",
        ] {
            assert!(bad.parse::<ListenAddress>().is_err(), "{bad:?} parsed");
        }
        assert_eq!(ListenAddress::AnyInterface(8080).to_string(), ":8080");

        let any: ListenAddress = ":9000".parse().unwrap();
        let all_v4: ListenAddress = "0.0.0.0:9000".parse().unwrap();
        let lo: ListenAddress = "127.0.0.1:9000".parse().unwrap();
        let lo_other: ListenAddress = "127.0.0.2:9000".parse().unwrap();
        let ephemeral: ListenAddress = "127.0.0.1:0".parse().unwrap();
        assert!(any.overlaps(&all_v4) && all_v4.overlaps(&lo) && lo.overlaps(&lo));
        assert!(!lo.overlaps(&lo_other));
        assert!(!ephemeral.overlaps(&ephemeral));
        assert!(!ListenAddress::Disabled.overlaps(&ListenAddress::Disabled));
    }

    #[test]
    fn binds_with_ipv4_fallback() {
        // Loopback stands in for "every interface", so the test opens nothing to the network.
        let loopback = |addr: SocketAddr| {
            let ip: std::net::IpAddr = if addr.is_ipv4() {
                Ipv4Addr::LOCALHOST.into()
            } else {
                Ipv6Addr::LOCALHOST.into()
            };
            (ip, addr.port())
        };
        // A host without IPv6: `[::]` fails, `0.0.0.0` is bound.
        let no_ipv6 = |addr: SocketAddr| {
            if addr.is_ipv6() {
                Err(io::Error::other("address family not supported"))
            } else {
                TcpListener::bind(loopback(addr))
            }
        };
        let any = ListenAddress::AnyInterface(0);
        let listener = any.bind_with(no_ipv6).unwrap().unwrap();
        assert!(listener.local_addr().unwrap().is_ipv4());
        // A port in use is not hidden by the fallback.
        let in_use = |_: SocketAddr| Err(io::Error::from(io::ErrorKind::AddrInUse));
        let err = any.bind_with(in_use).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
        // The IPv6 wildcard is tried first.
        let tried = std::sync::Mutex::new(Vec::new());
        let _ = any.bind_with(|addr| {
            tried.lock().unwrap().push(addr);
            Err(io::Error::other("no"))
        });
        assert_eq!(
            *tried.lock().unwrap(),
            [
                "[::]:0".parse().unwrap(),
                "0.0.0.0:0".parse::<SocketAddr>().unwrap()
            ]
        );

        assert!(ListenAddress::Disabled.bind().unwrap().is_none());
        let bound = "127.0.0.1:0"
            .parse::<ListenAddress>()
            .unwrap()
            .bind()
            .unwrap()
            .unwrap();
        let taken = ListenAddress::Socket(bound.local_addr().unwrap());
        let err = taken.bind_flag("--metrics-bind-address").unwrap_err();
        assert!(
            err.to_string().contains("(--metrics-bind-address)"),
            "{err}"
        );
    }
}
