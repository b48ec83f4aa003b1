//! The plain-HTTP admin servers: the probes (`/healthz`, `/readyz`) on
//! `--health-probe-bind-address` and Prometheus' `/metrics` on `--metrics-bind-address`.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How long in-flight requests get, after shutdown, before the servers are aborted.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Whether `/readyz` answers 200. Cloning shares the flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// A flag that starts not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag.
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }

    /// Reads the flag.
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// Why an admin server failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The address could not be bound.
    #[error("cannot listen on {addr} for {what}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Which server (`health probes`, `metrics`).
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("the {what} server failed: {source}")]
    Serve {
        /// Which server.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A server task panicked.
    #[error("an admin server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// The router of `/healthz` and `/readyz`.
pub fn health_router(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(ready)
}

async fn readyz(State(ready): State<Readiness>) -> impl IntoResponse {
    if ready.get() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// The router of `/metrics` (Prometheus text format 0.0.4).
pub fn metrics_router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .with_state(metrics)
}

async fn metrics_handler(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
        metrics.encode(),
    )
}

/// Binds `addr`, naming the server in the error.
pub async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, AdminError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AdminError::Bind { addr, what, source })
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then finishes in-flight
/// requests.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    what: &'static str,
    shutdown: CancellationToken,
) -> Result<(), AdminError> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
        .map_err(|source| AdminError::Serve { what, source })
}

/// Where the admin servers listen, and what to serve.
#[derive(Debug, Clone)]
pub struct AdminConfig {
    /// The probes' address; `None` disables them.
    pub health_probe_addr: Option<SocketAddr>,
    /// The metrics address; `None` disables it.
    pub metrics_addr: Option<SocketAddr>,
    /// The readiness flag `/readyz` reports.
    pub readiness: Readiness,
    /// The metrics `/metrics` serves.
    pub metrics: Arc<Metrics>,
}

/// The running admin servers.
#[derive(Debug)]
pub struct AdminServers {
    health_probe_addr: Option<SocketAddr>,
    metrics_addr: Option<SocketAddr>,
    tasks: JoinSet<Result<(), AdminError>>,
    shutdown: CancellationToken,
}

impl AdminServers {
    /// Binds both addresses (so a taken port fails here, before anything else starts) and
    /// serves until `shutdown` is cancelled.
    pub async fn start(
        config: AdminConfig,
        shutdown: CancellationToken,
    ) -> Result<Self, AdminError> {
        let health = match config.health_probe_addr {
            Some(addr) => Some(bind(addr, "health probes").await?),
            None => None,
        };
        let metrics = match config.metrics_addr {
            Some(addr) => Some(bind(addr, "metrics").await?),
            None => None,
        };
        let local = |l: &TcpListener, what| {
            l.local_addr()
                .map_err(|source| AdminError::Serve { what, source })
        };
        let health_probe_addr = health
            .as_ref()
            .map(|l| local(l, "health probes"))
            .transpose()?;
        let metrics_addr = metrics.as_ref().map(|l| local(l, "metrics")).transpose()?;
        let mut tasks = JoinSet::new();
        if let Some(listener) = health {
            tracing::info!(addr = ?health_probe_addr, "serving /healthz and /readyz");
            tasks.spawn(serve(
                listener,
                health_router(config.readiness),
                "health probes",
                shutdown.clone(),
            ));
        }
        if let Some(listener) = metrics {
            tracing::info!(addr = ?metrics_addr, "serving /metrics");
            tasks.spawn(serve(
                listener,
                metrics_router(config.metrics),
                "metrics",
                shutdown.clone(),
            ));
        }
        Ok(Self {
            health_probe_addr,
            metrics_addr,
            tasks,
            shutdown,
        })
    }

    /// The probes' bound address (useful with port 0).
    pub fn health_probe_addr(&self) -> Option<SocketAddr> {
        self.health_probe_addr
    }

    /// The metrics server's bound address.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Waits for the first server to fail, or for all to stop after shutdown. Once shutdown
    /// is cancelled the servers get [`SHUTDOWN_GRACE`] to finish, then are aborted.
    pub async fn wait(mut self) -> Result<(), AdminError> {
        loop {
            let next = tokio::select! {
                next = self.tasks.join_next() => next,
                () = self.shutdown.cancelled() => break,
            };
            match next {
                None => return Ok(()),
                Some(result) => result??,
            }
        }
        let drain = async {
            while let Some(result) = self.tasks.join_next().await {
                result??;
            }
            Ok::<(), AdminError>(())
        };
        match tokio::time::timeout(SHUTDOWN_GRACE, drain).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!("admin servers did not stop in {SHUTDOWN_GRACE:?}; aborting");
                self.tasks.abort_all();
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use http_body_util::{BodyExt, Empty};
    use hyper::body::Bytes;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    use super::*;

    type HttpClient = Client<hyper_util::client::legacy::connect::HttpConnector, Empty<Bytes>>;

    fn client() -> HttpClient {
        Client::builder(TokioExecutor::new()).build_http()
    }

    async fn get(
        client: &HttpClient,
        addr: SocketAddr,
        path: &str,
    ) -> (StatusCode, Option<String>, String) {
        let uri: hyper::Uri = format!("http://{addr}{path}").parse().unwrap();
        let response = client.get(uri).await.unwrap();
        let status = response.status();
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap().to_string());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).unwrap(),
        )
    }

    fn loopback() -> Option<SocketAddr> {
        Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    #[tokio::test]
    async fn probes_and_metrics_over_http() {
        let metrics = Arc::new(Metrics::new().unwrap());
        metrics.member_change("add");
        let readiness = Readiness::new();
        let shutdown = CancellationToken::new();
        let servers = AdminServers::start(
            AdminConfig {
                health_probe_addr: loopback(),
                metrics_addr: loopback(),
                readiness: readiness.clone(),
                metrics: metrics.clone(),
            },
            shutdown.clone(),
        )
        .await
        .unwrap();
        let health = servers.health_probe_addr().unwrap();
        let metrics_addr = servers.metrics_addr().unwrap();
        let waiter = tokio::spawn(servers.wait());
        let http = client();

        let (status, _, body) = get(&http, health, "/healthz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));

        let (status, _, _) = get(&http, health, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        readiness.set(true);
        let (status, _, body) = get(&http, health, "/readyz").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, "ok"));
        readiness.set(false);
        let (status, _, _) = get(&http, health, "/readyz").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);

        let (status, content_type, body) = get(&http, metrics_addr, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(content_type.as_deref(), Some("text/plain; version=0.0.4"));
        assert!(
            body.contains("etcd_controller_member_changes_total{kind=\"add\"} 1"),
            "{body}"
        );

        let (status, _, _) = get(&http, health, "/metrics").await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, _, _) = get(&http, metrics_addr, "/healthz").await;
        assert_eq!(status, StatusCode::NOT_FOUND);

        // Shutdown stops both servers, even with the client's keep-alive connections open.
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(3), waiter)
            .await
            .expect("servers stopped on shutdown")
            .unwrap()
            .unwrap();
        drop(http);
        assert!(tokio::net::TcpStream::connect(health).await.is_err());
        assert!(tokio::net::TcpStream::connect(metrics_addr).await.is_err());
    }

    #[tokio::test]
    async fn disabled_servers_and_taken_ports() {
        let shutdown = CancellationToken::new();
        let metrics = Arc::new(Metrics::new().unwrap());
        let none = AdminServers::start(
            AdminConfig {
                health_probe_addr: None,
                metrics_addr: None,
                readiness: Readiness::new(),
                metrics: metrics.clone(),
            },
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(none.health_probe_addr(), None);
        assert_eq!(none.metrics_addr(), None);
        none.wait().await.unwrap();

        let taken = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let err = AdminServers::start(
            AdminConfig {
                health_probe_addr: Some(taken.local_addr().unwrap()),
                metrics_addr: None,
                readiness: Readiness::new(),
                metrics,
            },
            shutdown,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                AdminError::Bind {
                    what: "health probes",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn readiness_is_shared_between_clones() {
        let a = Readiness::new();
        let b = a.clone();
        assert!(!b.get());
        a.set(true);
        assert!(b.get());
    }
}
