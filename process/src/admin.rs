//! The plain-HTTP admin servers of both binaries, and the supervision of every server of the
//! process:
//!
//! - the probes on `--health-probe-bind-address`: `GET /healthz` answers 200 while the process
//!   serves HTTP at all, `GET /readyz` 200 while the [`Readiness`] flag is set, 503 otherwise;
//! - the metrics on `--metrics-bind-address`: `GET /metrics` in the Prometheus text format, from
//!   a [`MetricsSource`] (a `prometheus::Registry` is one).
//!
//! Every listener is bounded the same way: a [`GuardAcceptor`] (at most
//! [`ConnectionLimits::max`] connections open, each closed after
//! [`ConnectionLimits::idle_timeout`] without a byte), [`HEADER_READ_TIMEOUT`] for an HTTP/1
//! request's headers and [`FIRST_REQUEST_TIMEOUT`] from the accept to the first request.
//! [`Servers`] runs them (and the process's other servers) under one shutdown control.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum_server::{Control, Handle};
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::task::JoinSet;

use crate::connections::{ConnectionLimits, ConnectionMetrics, GuardAcceptor};
use crate::listen::{BindError, ListenAddress};

/// The flag of the probe server's address.
pub const PROBE_FLAG: &str = "--health-probe-bind-address";

/// The flag of the metrics server's address.
pub const METRICS_FLAG: &str = "--metrics-bind-address";

/// Time allowed for an HTTP/1 client to send a request's headers (also the keep-alive idle
/// time of an HTTP/1 connection between requests).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Time allowed from the accept (or the end of a TLS handshake) to the first request, over
/// HTTP/1 or HTTP/2 (hyper's protocol detection is not timed otherwise).
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The content type of `/metrics`: Prometheus text format 0.0.4.
pub const METRICS_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The body of `/healthz`.
pub const HEALTHZ_BODY: &str = "ok\n";

/// The body of a ready `/readyz` (the same as `/healthz`).
pub const READYZ_BODY: &str = HEALTHZ_BODY;

/// Whether `/readyz` answers 200: the flag is set and nothing blocks it. Starts not ready;
/// clones share the state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    flag: Arc<AtomicBool>,
    /// Why the process must not be taken as ready whatever the flag says (a precondition that
    /// only a human can fix), said in the `/readyz` body.
    blocker: Arc<std::sync::Mutex<Option<String>>>,
}

/// The longest blocker message `/readyz` repeats (bounded like any other output).
const MAX_BLOCKER_LEN: usize = 2048;

impl Readiness {
    /// A flag that starts not ready.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag.
    pub fn set(&self, ready: bool) {
        self.flag.store(ready, Ordering::SeqCst);
    }

    /// Whether `/readyz` answers 200: the flag is set and nothing blocks.
    pub fn get(&self) -> bool {
        self.flag.load(Ordering::SeqCst) && self.blocker().is_none()
    }

    /// Blocks readiness with a message that says why (or lifts the block with `None`).
    /// Returns whether the message changed, so the caller logs only changes.
    pub fn block(&self, why: Option<String>) -> bool {
        let why = why.map(|mut w| {
            if w.len() > MAX_BLOCKER_LEN {
                let mut end = MAX_BLOCKER_LEN;
                while !w.is_char_boundary(end) {
                    end -= 1;
                }
                w.truncate(end);
            }
            w
        });
        let mut blocker = self.blocker.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *blocker != why;
        *blocker = why;
        changed
    }

    /// Why readiness is blocked, if it is.
    pub fn blocker(&self) -> Option<String> {
        self.blocker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// What `/metrics` serves.
pub trait MetricsSource: Send + Sync + 'static {
    /// Every metric in the Prometheus text exposition format (version 0.0.4).
    fn render(&self) -> Result<String, prometheus::Error>;
}

impl MetricsSource for Registry {
    fn render(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::with_capacity(4096);
        TextEncoder::new().encode(&self.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text.to_string(),
    )
        .into_response()
}

async fn not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "not found\n")
}

/// The probe router: `GET /healthz` and `GET /readyz` (see [`Readiness`]).
pub fn probe_router(readiness: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { HEALTHZ_BODY }))
        .route("/readyz", get(readyz))
        .fallback(not_found)
        .with_state(readiness)
}

async fn readyz(State(readiness): State<Readiness>) -> Response {
    if let Some(why) = readiness.blocker() {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!("not ready: {why}\n"),
        )
    } else if readiness.get() {
        plain(StatusCode::OK, READYZ_BODY)
    } else {
        plain(StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// The metrics router: `GET /metrics` in the Prometheus text format.
pub fn metrics_router(source: Arc<dyn MetricsSource>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(source)
}

async fn metrics(State(source): State<Arc<dyn MetricsSource>>) -> Response {
    match source.render() {
        Ok(text) => ([(header::CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response(),
        Err(e) => plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("cannot encode the metrics: {e}\n"),
        ),
    }
}

/// An HTTP server on `listener` with the header-read and first-request timeouts set (every
/// server of the process starts here; give it an acceptor with [`axum_server::Server::acceptor`]).
pub fn http_server(listener: std::net::TcpListener) -> io::Result<axum_server::Server<SocketAddr>> {
    let mut server = axum_server::from_tcp(listener)?.first_request_timeout(FIRST_REQUEST_TIMEOUT);
    server
        .http_builder()
        .http1()
        .header_read_timeout(Some(HEADER_READ_TIMEOUT));
    Ok(server)
}

/// Why a server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A server failed while serving.
    #[error("the {server} server failed: {source}")]
    Failed {
        /// Which server.
        server: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// A server stopped without being asked to.
    #[error("the {server} server stopped unexpectedly")]
    Stopped {
        /// Which server.
        server: &'static str,
    },
    /// A server task panicked or was aborted.
    #[error("a server task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

type Joined = Result<(&'static str, io::Result<()>), tokio::task::JoinError>;

fn outcome(joined: Joined) -> Result<&'static str, ServeError> {
    match joined? {
        (server, Ok(())) => Ok(server),
        (server, Err(source)) => Err(ServeError::Failed { server, source }),
    }
}

/// Every server of the process under one shutdown control: [`Servers::stopped`] reports the
/// first to end on its own, [`Servers::drain`] stops them all together.
#[derive(Debug, Default)]
pub struct Servers {
    tasks: JoinSet<(&'static str, io::Result<()>)>,
    control: Control,
}

impl Servers {
    /// No servers yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A handle under this set's control, for a server spawned with [`Servers::spawn`].
    pub fn handle(&self) -> Handle<SocketAddr> {
        Handle::with_control(self.control.clone())
    }

    /// Runs `serving` (a server given a [`Servers::handle`]) as the server named `name`.
    pub fn spawn<F>(&mut self, name: &'static str, serving: F)
    where
        F: Future<Output = io::Result<()>> + Send + 'static,
    {
        self.tasks.spawn(async move { (name, serving.await) });
    }

    /// Serves `app` on `listener`, bounded by `limits` and counted in `metrics`.
    pub fn spawn_plain(
        &mut self,
        name: &'static str,
        listener: std::net::TcpListener,
        app: Router,
        limits: ConnectionLimits,
        metrics: ConnectionMetrics,
    ) -> io::Result<()> {
        let server = http_server(listener)?
            .acceptor(GuardAcceptor::new(limits, metrics))
            .handle(self.handle());
        self.spawn(name, server.serve(app.into_make_service()));
        Ok(())
    }

    /// Resolves when the first server ends on its own: with its error, or
    /// [`ServeError::Stopped`]. Never resolves while none runs (select it against the shutdown
    /// trigger).
    pub async fn stopped(&mut self) -> ServeError {
        match self.tasks.join_next().await {
            Some(joined) => match outcome(joined) {
                Err(e) => e,
                Ok(server) => ServeError::Stopped { server },
            },
            None => std::future::pending().await,
        }
    }

    /// Closes every listener and gives the requests in flight `grace` to finish before their
    /// connections are dropped; then the first error of a server, if any.
    pub async fn drain(mut self, grace: Duration) -> Result<(), ServeError> {
        self.control.graceful_shutdown(Some(grace));
        let join_all = async {
            let mut first = Ok(());
            while let Some(joined) = self.tasks.join_next().await {
                if let Err(e) = outcome(joined)
                    && first.is_ok()
                {
                    first = Err(e);
                }
            }
            first
        };
        // axum-server drops the connections once `grace` is over; the margin covers the rest.
        match tokio::time::timeout(grace + Duration::from_secs(1), join_all).await {
            Ok(result) => result,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "servers did not stop after the grace period; aborting"
                );
                self.tasks.abort_all();
                Ok(())
            }
        }
    }
}

/// What the admin servers serve, and where.
#[derive(Clone)]
pub struct AdminConfig {
    /// The probes' address ([`PROBE_FLAG`]); [`ListenAddress::Disabled`] turns them off.
    pub probes: ListenAddress,
    /// The metrics address ([`METRICS_FLAG`]); [`ListenAddress::Disabled`] turns it off.
    pub metrics: ListenAddress,
    /// The flag `/readyz` reports.
    pub readiness: Readiness,
    /// What `/metrics` serves.
    pub source: Arc<dyn MetricsSource>,
    /// The bounds of each of the two listeners (each has its own cap).
    pub limits: ConnectionLimits,
    /// Where the listeners' connections are counted.
    pub connections: ConnectionMetrics,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("probes", &self.probes)
            .field("metrics", &self.metrics)
            .field("readiness", &self.readiness)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// Where the admin servers listen (useful with port 0); `None` for a server turned off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminAddrs {
    /// The probes' bound address.
    pub probes: Option<SocketAddr>,
    /// The metrics server's bound address.
    pub metrics: Option<SocketAddr>,
}

/// Why the admin servers cannot start.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// An address cannot be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// A bound listener cannot be served.
    #[error("cannot serve {flag}: {source}")]
    Serve {
        /// The flag of the address.
        flag: &'static str,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
}

/// Binds both admin addresses (a taken port fails here, before anything is served) and runs the
/// servers in `servers`, named `metrics` and `probe`.
pub fn start(config: AdminConfig, servers: &mut Servers) -> Result<AdminAddrs, AdminError> {
    let metrics = config.metrics.bind_flag(METRICS_FLAG)?;
    let probes = config.probes.bind_flag(PROBE_FLAG)?;
    let mut addrs = AdminAddrs {
        probes: None,
        metrics: None,
    };
    for (name, flag, listener, app, addr) in [
        (
            "metrics",
            METRICS_FLAG,
            metrics,
            metrics_router(config.source),
            &mut addrs.metrics,
        ),
        (
            "probe",
            PROBE_FLAG,
            probes,
            probe_router(config.readiness),
            &mut addrs.probes,
        ),
    ] {
        let Some(listener) = listener else { continue };
        let serve_err = |source| AdminError::Serve { flag, source };
        *addr = Some(listener.local_addr().map_err(serve_err)?);
        servers
            .spawn_plain(
                name,
                listener,
                app,
                config.limits,
                config.connections.clone(),
            )
            .map_err(serve_err)?;
    }
    tracing::info!(probes = ?addrs.probes, metrics = ?addrs.metrics, "admin servers listening");
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    /// One HTTP/1.0 GET on a new connection: the status and the body.
    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        (status, head.to_ascii_lowercase(), body.to_string())
    }

    #[tokio::test]
    async fn probes_metrics_readiness_and_cap_over_loopback() {
        let registry = Registry::new();
        let connections = ConnectionMetrics::register(&registry, "test").unwrap();
        let hits = prometheus::IntCounter::new("test_hits_total", "Hits.").unwrap();
        registry.register(Box::new(hits.clone())).unwrap();
        hits.inc();
        let readiness = Readiness::new();
        let mut servers = Servers::new();
        let loopback: ListenAddress = "127.0.0.1:0".parse().unwrap();
        let addrs = start(
            AdminConfig {
                probes: loopback.clone(),
                metrics: loopback,
                readiness: readiness.clone(),
                source: Arc::new(registry.clone()),
                limits: ConnectionLimits {
                    max: 1,
                    idle_timeout: Duration::from_secs(30),
                },
                connections: connections.clone(),
            },
            &mut servers,
        )
        .unwrap();
        let (probes, metrics) = (addrs.probes.unwrap(), addrs.metrics.unwrap());

        assert_eq!(get(probes, "/healthz").await.0, 200);
        assert_eq!(get(probes, "/healthz").await.2, HEALTHZ_BODY);
        assert_eq!(get(probes, "/readyz").await.0, 503);
        readiness.set(true);
        let (status, _, body) = get(probes, "/readyz").await;
        assert_eq!((status, body.as_str()), (200, READYZ_BODY));
        readiness.clone().set(false);
        assert_eq!(get(probes, "/readyz").await.0, 503);
        // A blocker keeps it unready, whatever the flag, and says why.
        readiness.set(true);
        assert!(readiness.block(Some("the installed CRD is not ours".into())));
        assert!(!readiness.block(Some("the installed CRD is not ours".into())));
        let (status, _, body) = get(probes, "/readyz").await;
        assert_eq!(
            (status, body.as_str()),
            (503, "not ready: the installed CRD is not ours\n")
        );
        assert!(readiness.block(None));
        assert_eq!(get(probes, "/readyz").await.0, 200);

        let (status, head, body) = get(metrics, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.contains(&format!("content-type: {METRICS_CONTENT_TYPE}")),
            "{head}"
        );
        assert!(body.contains("test_hits_total 1"), "{body}");
        assert_eq!(get(probes, "/metrics").await.0, 404);
        assert_eq!(get(metrics, "/readyz").await.0, 404);

        // Each listener has its own cap: one connection held open, the next closed at once.
        let held = TcpStream::connect(probes).await.unwrap();
        let mut refused = TcpStream::connect(probes).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), refused.read(&mut buf))
            .await
            .expect("closed at once");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert_eq!(connections.rejected.get(), 1);
        assert_eq!(get(metrics, "/metrics").await.0, 200);

        // Draining stops both servers, the held connection included.
        tokio::time::timeout(
            Duration::from_secs(5),
            servers.drain(Duration::from_secs(1)),
        )
        .await
        .expect("drained")
        .unwrap();
        drop(held);
        // Nothing of ours listens any more. (A connect may still succeed: the freed port can be
        // taken at once by a listener of a test running beside this one; ours accepts nothing.)
        let rejected = connections.rejected.get();
        for addr in [probes, metrics] {
            if let Ok(stream) = TcpStream::connect(addr).await {
                drop(stream);
            }
        }
        assert_eq!(connections.open.get(), 0);
        assert_eq!(connections.rejected.get(), rejected);

        // A taken port fails before anything is served, naming the flag.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let err = start(
            AdminConfig {
                probes: ListenAddress::Socket(taken.local_addr().unwrap()),
                metrics: ListenAddress::Disabled,
                readiness,
                source: Arc::new(registry),
                limits: ConnectionLimits::default(),
                connections,
            },
            &mut Servers::new(),
        )
        .unwrap_err();
        assert!(err.to_string().contains(PROBE_FLAG), "{err}");
    }
}
