//! Starting and stopping: loads the certificate, binds the HTTPS, metrics and probe listeners,
//! serves them until the shared [`Shutdown`] is triggered, then drains them together.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum_server::tls_rustls::RustlsConfig;
use axum_server::{Control, Handle};
use etcd_shared::EtcdCluster;
use etcd_shared::admission::{AdmissionPolicy, Defaults};
use etcd_shared::version::EtcdVersion;
use tokio::task::JoinSet;
use tracing::{error, info};

use crate::admission::Reviewer;
use crate::args::{Args, ListenAddress};
use crate::http::{Readiness, WebhookState, metrics_router, probe_router, webhook_router};
use crate::metrics::Metrics;
use crate::shutdown::Shutdown;
use crate::tls::{CertReloader, CertResolver, TlsError, server_config};

/// Time allowed for an HTTP/1 client to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

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
    #[error("cannot listen on {address} ({flag}): {source}")]
    Bind {
        /// The flag of the address.
        flag: &'static str,
        /// The address.
        address: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The metrics cannot be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// A server failed while serving.
    #[error("the {server} server failed: {source}")]
    Serve {
        /// Which server.
        server: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A server stopped without being asked to.
    #[error("the {server} server stopped unexpectedly")]
    Stopped {
        /// Which server.
        server: &'static str,
    },
}

/// A started webhook: its addresses, its metrics and the means to stop it.
#[derive(Debug)]
pub struct RunningServer {
    tls_addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    probe_addr: Option<SocketAddr>,
    metrics: Metrics,
    resolver: Arc<CertResolver>,
    readiness: Arc<Readiness>,
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
        self.readiness.is_ready()
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
            Err(e) => Err(ServerError::Serve {
                server: "supervisor",
                source: std::io::Error::other(e.to_string()),
            }),
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

fn bind(
    flag: &'static str,
    address: &ListenAddress,
) -> Result<Option<std::net::TcpListener>, ServerError> {
    address.bind().map_err(|source| ServerError::Bind {
        flag,
        address: address.to_string(),
        source,
    })
}

fn local_addr(
    flag: &'static str,
    listener: &std::net::TcpListener,
) -> Result<SocketAddr, ServerError> {
    listener.local_addr().map_err(|source| ServerError::Bind {
        flag,
        address: "?".into(),
        source,
    })
}

/// Loads the certificate, binds every listener and starts serving. Fails, before anything is
/// served, when a flag is unusable, the certificate pair cannot be loaded or a listener cannot be
/// bound. `shutdown` stops the servers started here.
pub async fn start(args: &Args, shutdown: Shutdown) -> Result<RunningServer, ServerError> {
    let policy = policy_from_args(args)?;
    let metrics = Metrics::new()?;
    let (reloader, resolver) = CertReloader::start(
        &args.tls_cert_file,
        &args.tls_private_key_file,
        metrics.clone(),
    )?;
    let tls = RustlsConfig::from_config(Arc::new(server_config(resolver.clone())?));

    let tls_listener =
        bind("--bind-address", &args.bind_address)?.ok_or_else(|| ServerError::Config {
            flag: "--bind-address",
            message: "the admission server cannot be turned off".into(),
        })?;
    let metrics_listener = bind("--metrics-bind-address", &args.metrics_bind_address)?;
    let probe_listener = bind(
        "--health-probe-bind-address",
        &args.health_probe_bind_address,
    )?;
    let tls_addr = local_addr("--bind-address", &tls_listener)?;
    let metrics_addr = metrics_listener
        .as_ref()
        .map(|l| local_addr("--metrics-bind-address", l))
        .transpose()?;
    let probe_addr = probe_listener
        .as_ref()
        .map(|l| local_addr("--health-probe-bind-address", l))
        .transpose()?;

    let control = Control::new();
    let readiness = Arc::new(Readiness::default());
    let mut servers = JoinSet::new();

    let state = Arc::new(WebhookState {
        reviewer: Reviewer::new(policy),
        metrics: metrics.clone(),
        max_body_bytes: args.max_request_body_size,
        request_timeout: args.request_timeout,
    });
    let tls_handle: Handle<SocketAddr> = Handle::with_control(control.clone());
    let mut server =
        axum_server::from_tcp_rustls(tls_listener, tls).map_err(|source| ServerError::Bind {
            flag: "--bind-address",
            address: tls_addr.to_string(),
            source,
        })?;
    server
        .http_builder()
        .http1()
        .header_read_timeout(Some(HEADER_READ_TIMEOUT));
    let app = webhook_router(state);
    let handle = tls_handle.clone();
    servers.spawn(async move {
        let result = server.handle(handle).serve(app.into_make_service()).await;
        ("admission", result)
    });

    if let Some(listener) = metrics_listener {
        let server = plain_server(listener, "--metrics-bind-address")?;
        let handle = Handle::with_control(control.clone());
        let app = metrics_router(metrics.clone());
        servers.spawn(async move {
            (
                "metrics",
                server.handle(handle).serve(app.into_make_service()).await,
            )
        });
    }
    if let Some(listener) = probe_listener {
        let server = plain_server(listener, "--health-probe-bind-address")?;
        let handle = Handle::with_control(control.clone());
        let app = probe_router(readiness.clone());
        servers.spawn(async move {
            (
                "probe",
                server.handle(handle).serve(app.into_make_service()).await,
            )
        });
    }

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
        control,
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

fn plain_server(
    listener: std::net::TcpListener,
    flag: &'static str,
) -> Result<axum_server::Server<SocketAddr>, ServerError> {
    let address = listener
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let mut server = axum_server::from_tcp(listener).map_err(|source| ServerError::Bind {
        flag,
        address,
        source,
    })?;
    server
        .http_builder()
        .http1()
        .header_read_timeout(Some(HEADER_READ_TIMEOUT));
    Ok(server)
}

struct Supervision {
    servers: JoinSet<(&'static str, std::io::Result<()>)>,
    control: Control,
    shutdown: Shutdown,
    readiness: Arc<Readiness>,
    delay: Duration,
    grace: Duration,
    reload_stop: tokio_util::sync::CancellationToken,
}

/// Runs until shutdown (or a server's failure), then drains every server together.
async fn supervise(mut s: Supervision) -> Result<(), ServerError> {
    let mut failure = tokio::select! {
        _ = s.shutdown.triggered() => None,
        Some(joined) = s.servers.join_next() => Some(server_error(joined)),
    };
    s.readiness.set(false);
    if failure.is_none() && !s.delay.is_zero() {
        info!(delay = ?s.delay, "shutting down: still serving while endpoints are updated");
        tokio::time::sleep(s.delay).await;
    }
    info!(grace = ?s.grace, "shutting down: listeners closed, finishing in-flight requests");
    s.control.graceful_shutdown(Some(s.grace));
    s.reload_stop.cancel();
    while let Some(joined) = s.servers.join_next().await {
        if let Err(e) = flatten(joined)
            && failure.is_none()
        {
            failure = Some(e);
        }
    }
    match failure {
        Some(e) => {
            error!(error = %e, "etcd-webhook stopped");
            Err(e)
        }
        None => {
            info!("etcd-webhook stopped");
            Ok(())
        }
    }
}

type Joined = Result<(&'static str, std::io::Result<()>), tokio::task::JoinError>;

/// A server that ended before shutdown: its error, or [`ServerError::Stopped`].
fn server_error(joined: Joined) -> ServerError {
    match flatten(joined) {
        Err(e) => e,
        Ok(server) => ServerError::Stopped { server },
    }
}

fn flatten(joined: Joined) -> Result<&'static str, ServerError> {
    match joined {
        Ok((server, Ok(()))) => Ok(server),
        Ok((server, Err(source))) => Err(ServerError::Serve { server, source }),
        Err(e) => Err(ServerError::Serve {
            server: "task",
            source: std::io::Error::other(e.to_string()),
        }),
    }
}
