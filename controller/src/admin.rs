//! The controller's admin servers: the process shell's ([`etcd_process::admin`]), the
//! probes (`/healthz`, `/readyz`) on `--health-probe-bind-address` and Prometheus' `/metrics`
//! on `--metrics-bind-address`, each listener capped at
//! [`etcd_process::connections::DEFAULT_MAX_CONNECTIONS`] connections with the shell's
//! idle and header timeouts (counted as `etcd_controller_open_connections`,
//! `etcd_controller_connections_rejected_total`, `etcd_controller_connections_idle_closed_total`).
//! Both stop gracefully when the shared shutdown token is cancelled.
//!
//! Readiness is a [`Readiness`] flag that the process sets:
//! - without leader election it turns true once the controller's watches have synced;
//! - with leader election a standby is ready as soon as it is a candidate (it is up, reached
//!   the API server and found the CRD), and the leader is ready once its watches have synced.
//!   Readiness never waits for leadership: otherwise the standby replicas would never become
//!   Ready and a rolling update of the Deployment would stall.
//!
//! `/healthz` answers 200 as long as the process serves HTTP at all.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub use etcd_process::admin::Readiness;
use etcd_process::admin::{self, AdminAddrs, ServeError, Servers};
use etcd_process::connections::{ConnectionLimits, ConnectionMetrics};
use etcd_process::listen::ListenAddress;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How long in-flight requests get, after shutdown, before their connections are dropped.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The prefix of the connection metrics of the admin listeners.
pub const METRICS_PREFIX: &str = "etcd_controller";

/// Why an admin server could not start or failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// An address cannot be bound or served.
    #[error(transparent)]
    Start(#[from] admin::AdminError),
    /// The connection metrics cannot be registered.
    #[error("registering the connection metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A server failed while serving.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Where the admin servers listen, and what to serve.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// The probes' address; [`ListenAddress::Disabled`] turns them off.
    pub health_probe_addr: ListenAddress,
    /// The metrics address; [`ListenAddress::Disabled`] turns it off.
    pub metrics_addr: ListenAddress,
    /// The readiness flag `/readyz` reports.
    pub readiness: Readiness,
    /// The metrics `/metrics` serves (the connection metrics are added to its registry).
    pub metrics: Arc<Metrics>,
}

/// The running admin servers.
#[derive(Debug)]
pub struct AdminServers {
    addrs: AdminAddrs,
    servers: Servers,
    shutdown: CancellationToken,
}

impl AdminServers {
    /// Binds both addresses (so a taken port fails here, before anything else starts) and
    /// serves until `shutdown` is cancelled. Call once per [`Metrics`].
    pub fn start(config: AdminConfig, shutdown: CancellationToken) -> Result<Self, AdminError> {
        let registry = config.metrics.registry();
        let connections = ConnectionMetrics::register(registry, METRICS_PREFIX)?;
        let mut servers = Servers::new();
        let addrs = admin::start(
            admin::AdminConfig {
                probes: config.health_probe_addr,
                metrics: config.metrics_addr,
                readiness: config.readiness,
                source: Arc::new(registry.clone()),
                limits: ConnectionLimits::default(),
                connections,
            },
            &mut servers,
        )?;
        Ok(Self {
            addrs,
            servers,
            shutdown,
        })
    }

    /// The probes' bound address (useful with port 0).
    pub fn health_probe_addr(&self) -> Option<SocketAddr> {
        self.addrs.probes
    }

    /// The metrics server's bound address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.addrs.metrics
    }

    /// Waits for the first server to fail, or for shutdown; then stops both, giving requests
    /// in flight [`SHUTDOWN_GRACE`].
    pub async fn wait(mut self) -> Result<(), AdminError> {
        let failure = tokio::select! {
            e = self.servers.stopped() => Some(e),
            () = self.shutdown.cancelled() => None,
        };
        let drained = self.servers.drain(SHUTDOWN_GRACE).await;
        match failure {
            Some(e) => Err(e.into()),
            None => Ok(drained?),
        }
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    use super::*;

    /// A GET through hyper's client: the status and the body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
        let uri: hyper::Uri = format!("http://{addr}{path}").parse().unwrap();
        let response = client.get(uri).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_controllers_metrics_and_probes() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.member_change("add");
        let readiness = Readiness::new();
        let shutdown = CancellationToken::new();
        let loopback: ListenAddress = "127.0.0.1:0".parse().unwrap();
        let servers = AdminServers::start(
            AdminConfig {
                health_probe_addr: loopback.clone(),
                metrics_addr: loopback,
                readiness: readiness.clone(),
                metrics: metrics.clone(),
            },
            shutdown.clone(),
        )
        .unwrap();
        let health = servers.health_probe_addr().unwrap();
        let metrics_addr = servers.metrics_addr().unwrap();
        let waiter = tokio::spawn(servers.wait());

        // The body the leader-election test compares.
        assert_eq!(get(health, "/healthz").await, (200, "ok\n".into()));
        assert_eq!(get(health, "/readyz").await.0, 503);
        readiness.set(true);
        assert_eq!(get(health, "/readyz").await.0, 200);
        let (status, body) = get(metrics_addr, "/metrics").await;
        assert_eq!(status, 200);
        for want in [
            "etcd_controller_member_changes_total{kind=\"add\"} 1",
            "etcd_controller_open_connections ",
            "etcd_controller_connections_rejected_total 0",
        ] {
            assert!(body.contains(want), "no {want} in {body}");
        }

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("servers stopped on shutdown")
            .unwrap()
            .unwrap();
        assert!(tokio::net::TcpStream::connect(health).await.is_err());

        // Off, and a taken port.
        let none = AdminServers::start(
            AdminConfig {
                health_probe_addr: ListenAddress::Disabled,
                metrics_addr: ListenAddress::Disabled,
                readiness: Readiness::new(),
                metrics: Arc::new(Metrics::new().unwrap()),
            },
            CancellationToken::new(),
        )
        .unwrap();
        assert_eq!(
            (none.health_probe_addr(), none.metrics_addr()),
            (None, None)
        );
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = AdminServers::start(
            AdminConfig {
                health_probe_addr: ListenAddress::Socket(taken.local_addr().unwrap()),
                metrics_addr: ListenAddress::Disabled,
                readiness: Readiness::new(),
                metrics: Arc::new(Metrics::new().unwrap()),
            },
            CancellationToken::new(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("--health-probe-bind-address"),
            "{err}"
        );
    }
}
