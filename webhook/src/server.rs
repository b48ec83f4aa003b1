//! Starting and stopping: loads the certificate, binds the HTTPS, metrics and probe listeners,
//! serves them until the shared [`Shutdown`] is triggered, then drains them together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::{RustlsAcceptor, RustlsConfig};
use etcd_process::admin::{
    self, AdminConfig, AdminError, MetricsSource, Readiness, ServeError, Servers,
};
use etcd_process::listen::BindError;
use etcd_shared::EtcdCluster;
use etcd_shared::admission::{AdmissionPolicy, Defaults};
use etcd_shared::version::EtcdVersion;
use tracing::{error, info};

use crate::admission::Reviewer;
use crate::args::Args;
use crate::connections::{ConnectionLimits, GuardAcceptor};
use crate::http::{WebhookState, webhook_router};
use crate::inflight::InflightBudget;
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::tls::{CertReloader, CertResolver, TlsError, server_config};

/// Time allowed for the TLS handshake (the header-read and first-request timeouts are the
/// process shell's, [`admin::http_server`]).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request waits for its share of the memory budget before it is answered 429.
const BUDGET_WAIT: Duration = Duration::from_secs(1);

/// The most an HTTP/1 connection of the admission listener buffers of a request's head (and
/// reads at once of its body), bytes: hyper's default (408 KiB) let every connection hold that
/// much in a slowly sent head, outside the memory budget. The API server's heads are under
/// 2 KiB; a larger one is answered 431.
pub const HTTP1_MAX_BUF_BYTES: usize = 64 * 1024;

/// The most streams one HTTP/2 connection of the admission listener has open at once
/// (hyper's default is 200). The API server opens another connection when it needs more.
pub const HTTP2_MAX_CONCURRENT_STREAMS: u32 = 8;

/// The largest header list an HTTP/2 request may carry, bytes (hyper's default is 16 KiB).
pub const HTTP2_MAX_HEADER_LIST_BYTES: u32 = 8 * 1024;

/// HTTP/2 flow-control windows of the admission listener, bytes, for the connection and for
/// each stream: what a client can make the webhook buffer of bodies not yet read (hyper's
/// default is 1 MiB per connection, outside the memory budget). A body is read as fast as it
/// arrives once its request has its share of the budget: a 4 MiB body takes 64 round trips.
pub const HTTP2_WINDOW_BYTES: u32 = 64 * 1024;

/// The most of one HTTP/2 response buffered before the client takes it, bytes (hyper's
/// default is 400 KiB per stream; an answer is at most about 30 KiB).
pub const HTTP2_MAX_SEND_BUF_BYTES: usize = 64 * 1024;

/// Why the webhook cannot start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A flag has an unusable value.
    #[error("invalid {flag}: {message}")]
    Config {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: String,
    },
    /// The serving certificate cannot be used.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// A listener cannot be bound.
    #[error(transparent)]
    Bind(#[from] BindError),
    /// The metrics or probe server cannot start.
    #[error(transparent)]
    Admin(#[from] AdminError),
    /// The metrics cannot be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A server failed, or stopped without being asked to.
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The SIGTERM/SIGINT handlers cannot be installed.
    #[error("cannot listen for SIGTERM and SIGINT: {0}")]
    Signals(std::io::Error),
}

/// `/metrics` serves the webhook's registry.
impl MetricsSource for Metrics {
    fn render(&self) -> Result<String, prometheus::Error> {
        self.encode()
    }
}

/// A started webhook: its addresses, its metrics and the means to stop it.
#[derive(Debug)]
pub struct RunningServer {
    tls_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    probe_addr: Option<SocketAddr>,
    metrics: Metrics,
    resolver: Arc<CertResolver>,
    readiness: Readiness,
    shutdown: Shutdown,
    supervisor: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl RunningServer {
    /// Address of the HTTPS admission listener.
    pub fn tls_addr(&self) -> SocketAddr {
        self.tls_addr
    }

    /// Address of the metrics listener, unless turned off.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// Address of the probe listener, unless turned off.
    pub fn probe_addr(&self) -> Option<SocketAddr> {
        self.probe_addr
    }

    /// The webhook's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The resolver serving the current certificate.
    pub fn resolver(&self) -> &Arc<CertResolver> {
        &self.resolver
    }

    /// Whether `/readyz` answers ready.
    pub fn is_ready(&self) -> bool {
        self.readiness.get()
    }

    /// The shutdown trigger shared by every server of this webhook.
    pub fn shutdown_handle(&self) -> &Shutdown {
        &self.shutdown
    }

    /// Starts the graceful shutdown (the same as SIGTERM).
    pub fn shutdown(&self) {
        self.shutdown.trigger();
    }

    /// Waits until the webhook has stopped: after a shutdown, once in-flight requests are done
    /// (or the grace period ran out); or when a server fails, with its error.
    pub async fn wait(self) -> Result<(), ServerError> {
        match self.supervisor.await {
            Ok(result) => result,
            Err(e) => Err(ServeError::Task(e).into()),
        }
    }
}

/// The admission policy the flags ask for. The defaults must themselves pass the rules: a
/// default version of an unknown line, or a repository with a tag, would default every object
/// into a refusal.
pub fn policy_from_args(args: &Args) -> Result<AdmissionPolicy, ServerError> {
    let version: EtcdVersion =
        args.default_version
            .parse()
            .map_err(
                |e: etcd_shared::version::ParseVersionError| ServerError::Config {
                    flag: "--default-version",
                    message: e.to_string(),
                },
            )?;
    let policy = AdmissionPolicy::new(Defaults {
        version: version.to_string(),
        repository: args.default_repository.clone(),
        ..Defaults::default()
    });
    let probe = EtcdCluster::new("defaults", Default::default());
    if let Err(refusal) = policy.validate(&policy.defaulted(&probe), None) {
        let flag = if refusal.0.iter().any(|v| v.field == "spec.repository") {
            "--default-repository"
        } else {
            "--default-version"
        };
        return Err(ServerError::Config {
            flag,
            message: format!("the defaults break the admission rules: {refusal}"),
        });
    }
    Ok(policy)
}

/// Loads the certificate, binds every listener and starts serving. Fails, before anything is
/// served, when a flag is unusable, the certificate pair cannot be loaded or a listener cannot be
/// bound. `shutdown` stops the servers started here.
pub async fn start(args: &Args, shutdown: Shutdown) -> Result<RunningServer, ServerError> {
    let policy = policy_from_args(args)?;
    check_timeouts(args)?;
    let metrics = Metrics::new()?;
    let (reloader, resolver) = CertReloader::start(
        &args.tls_cert_file,
        &args.tls_private_key_file,
        metrics.clone(),
    )?;
    let tls = RustlsConfig::from_config(Arc::new(server_config(resolver.clone())?));
    let (tls_listener, tls_addr) = bind_admission(args)?;

    let readiness = Readiness::new();
    let mut servers = Servers::new();
    let limits = ConnectionLimits {
        max: args.max_connections as usize,
        idle_timeout: args.idle_timeout,
    };
    let state = webhook_state(args, policy, &metrics);
    let tls_handle = serve_admission(args, tls_listener, tls, state, limits, &mut servers)?;
    let admin = admin::start(
        admin_config(args, &readiness, &metrics, limits),
        &mut servers,
    )?;
    let (metrics_addr, probe_addr) = (admin.metrics, admin.probes);

    let reload_stop = shutdown.token().child_token();
    tokio::spawn(reloader.run(args.cert_reload_interval, reload_stop.clone()));

    // Ready once the HTTPS server is accepting.
    if tls_handle.listening().await.is_some() && !shutdown.is_triggered() {
        readiness.set(true);
    }
    info!(
        admission = %tls_addr,
        metrics = ?metrics_addr,
        probes = ?probe_addr,
        default_version = %args.default_version,
        "etcd-webhook serving"
    );

    let supervisor = tokio::spawn(supervise(Supervision {
        servers,
        shutdown: shutdown.clone(),
        readiness: readiness.clone(),
        delay: args.shutdown_delay,
        grace: args.shutdown_grace_period,
        reload_stop,
    }));
    Ok(RunningServer {
        tls_addr,
        metrics_addr,
        probe_addr,
        metrics,
        resolver,
        readiness,
        shutdown,
        supervisor,
    })
}

/// The flag of the admission listener's address.
const TLS_FLAG: &str = "--bind-address";

/// `--idle-timeout` is longer than `--request-timeout`: a connection is not closed as idle
/// while its request is being answered.
fn check_timeouts(args: &Args) -> Result<(), ServerError> {
    if args.idle_timeout <= args.request_timeout {
        return Err(ServerError::Config {
            flag: "--idle-timeout",
            message: format!(
                "{:?} must be longer than --request-timeout ({:?}), or requests being answered would be cut",
                args.idle_timeout, args.request_timeout
            ),
        });
    }
    Ok(())
}

/// Binds the admission listener (it cannot be turned off), with its address.
fn bind_admission(args: &Args) -> Result<(std::net::TcpListener, SocketAddr), ServerError> {
    let listener = args
        .bind_address
        .bind_flag(TLS_FLAG)?
        .ok_or_else(|| ServerError::Config {
            flag: TLS_FLAG,
            message: "the admission server cannot be turned off".into(),
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| admission_bind_error(args, source))?;
    Ok((listener, addr))
}

/// A failure of the admission listener, named by its flag and address.
fn admission_bind_error(args: &Args, source: std::io::Error) -> BindError {
    BindError {
        flag: TLS_FLAG,
        address: args.bind_address.to_string(),
        source,
    }
}

/// What the admission handlers share: the rules, the metrics, the request bounds and the
/// memory budget of the requests in flight.
fn webhook_state(args: &Args, policy: AdmissionPolicy, metrics: &Metrics) -> Arc<WebhookState> {
    Arc::new(WebhookState {
        reviewer: Reviewer::new(policy),
        metrics: metrics.clone(),
        max_body_bytes: args.max_request_body_size,
        request_timeout: args.request_timeout,
        budget: InflightBudget::new(
            args.max_in_flight_memory,
            BUDGET_WAIT,
            metrics.reserved_bytes().clone(),
        ),
    })
}

/// Serves the admission router over TLS on `listener` as the server `admission`: the
/// handshake timeout, the bounded connection buffers and the connection cap; answers the
/// handle that tells when it is accepting.
fn serve_admission(
    args: &Args,
    listener: std::net::TcpListener,
    tls: RustlsConfig,
    state: Arc<WebhookState>,
    limits: ConnectionLimits,
    servers: &mut Servers,
) -> Result<axum_server::Handle<SocketAddr>, ServerError> {
    let handle = servers.handle();
    let tls_acceptor = RustlsAcceptor::new(tls).handshake_timeout(HANDSHAKE_TIMEOUT);
    let connections = state.metrics.connections().clone();
    let mut server =
        admin::http_server(listener).map_err(|source| admission_bind_error(args, source))?;
    bound_connection_buffers(server.http_builder());
    let server = server
        .acceptor(GuardAcceptor::new(limits, connections).acceptor(tls_acceptor))
        .handle(handle.clone());
    servers.spawn(
        "admission",
        server.serve(webhook_router(state).into_make_service()),
    );
    Ok(handle)
}

/// The metrics and probe servers: their flags, the readiness `/readyz` answers, the metrics
/// `/metrics` renders, and the admission listener's `limits` with `--max-admin-connections`.
fn admin_config(
    args: &Args,
    readiness: &Readiness,
    metrics: &Metrics,
    limits: ConnectionLimits,
) -> AdminConfig {
    AdminConfig {
        probes: args.health_probe_bind_address.clone(),
        metrics: args.metrics_bind_address.clone(),
        readiness: readiness.clone(),
        source: Arc::new(metrics.clone()),
        limits: ConnectionLimits {
            max: args.max_admin_connections as usize,
            ..limits
        },
        connections: metrics.connections().clone(),
    }
}

/// What one connection of the admission listener may buffer: [`HTTP1_MAX_BUF_BYTES`] of an
/// HTTP/1 request's head, and for HTTP/2 [`HTTP2_MAX_CONCURRENT_STREAMS`] streams of
/// [`HTTP2_MAX_HEADER_LIST_BYTES`] of headers, [`HTTP2_WINDOW_BYTES`] of bodies and
/// [`HTTP2_MAX_SEND_BUF_BYTES`] of each answer. With the connection cap this bounds the
/// memory of connections outside the in-flight budget (figures: docs/development/benchmarks.md).
pub fn bound_connection_buffers(
    builder: &mut hyper_util::server::conn::auto::Builder<hyper_util::rt::TokioExecutor>,
) {
    builder.http1().max_buf_size(HTTP1_MAX_BUF_BYTES);
    builder
        .http2()
        .max_concurrent_streams(HTTP2_MAX_CONCURRENT_STREAMS)
        .max_header_list_size(HTTP2_MAX_HEADER_LIST_BYTES)
        .initial_connection_window_size(HTTP2_WINDOW_BYTES)
        .initial_stream_window_size(HTTP2_WINDOW_BYTES)
        .max_send_buf_size(HTTP2_MAX_SEND_BUF_BYTES);
}

struct Supervision {
    servers: Servers,
    shutdown: Shutdown,
    readiness: Readiness,
    delay: Duration,
    grace: Duration,
    reload_stop: tokio_util::sync::CancellationToken,
}

/// Runs until shutdown (or a server's failure), then drains every server together.
async fn supervise(mut s: Supervision) -> Result<(), ServerError> {
    let failure = tokio::select! {
        _ = s.shutdown.triggered() => None,
        e = s.servers.stopped() => Some(e),
    };
    s.readiness.set(false);
    if failure.is_none() && !s.delay.is_zero() {
        info!(delay = ?s.delay, "shutting down: still serving while endpoints are updated");
        tokio::time::sleep(s.delay).await;
    }
    info!(grace = ?s.grace, "shutting down: listeners closed, finishing in-flight requests");
    s.reload_stop.cancel();
    let drained = s.servers.drain(s.grace).await;
    match failure.map_or(drained, Err) {
        Err(e) => {
            error!(error = %e, "etcd-webhook stopped");
            Err(e.into())
        }
        Ok(()) => {
            info!("etcd-webhook stopped");
            Ok(())
        }
    }
}
