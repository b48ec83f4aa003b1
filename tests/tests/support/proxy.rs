//! A TCP proxy on loopback that holds each new connection for a while before it reaches its
//! upstream: a slow network path to a backup target, so a test can make something fail while
//! the operator waits on it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

/// A running proxy; stops when dropped.
pub struct DelayingProxy {
    address: SocketAddr,
    connected: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for DelayingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DelayingProxy {
    /// Listens on a free loopback port; each connection waits `delay` before it is joined to
    /// `upstream`.
    pub async fn start(upstream: SocketAddr, delay: Duration) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let connected = Arc::new(Notify::new());
        let notify = connected.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                notify.notify_waiters();
                notify.notify_one();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self {
            address,
            connected,
            task,
        })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    /// Resolves once a connection has arrived (after this call, or one not yet waited for).
    pub async fn connection(&self) {
        self.connected.notified().await;
    }
}
