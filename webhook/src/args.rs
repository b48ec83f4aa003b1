//! The command line. Flags follow Kubernetes conventions (`--tls-cert-file`,
//! `--metrics-bind-address`, ...) and each has an `ETCD_WEBHOOK_*` environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
pub use etcd_process::listen::ListenAddress;
pub use etcd_process::logging::LogFormat;
use etcd_shared::duration::parse_duration;
use etcd_shared::version::{DEFAULT_REPOSITORY, DEFAULT_VERSION};

/// Default `--max-request-body-size`: 4 MiB. The API server stores objects of up to 1.5 MiB
/// (etcd's default request limit); an UPDATE review carries the object and the old object.
pub const DEFAULT_MAX_REQUEST_BODY: usize = 4 * 1024 * 1024;

/// The EtcdCluster admission webhook: validates and defaults etcd.database.coreos.com/v1beta2
/// EtcdCluster objects for the Kubernetes API server, over HTTPS.
///
/// Endpoints: POST /validate and POST /mutate (AdmissionReview admission.k8s.io/v1) on the TLS
/// address; GET /metrics (Prometheus text) on the metrics address; GET /healthz and GET /readyz
/// on the probe address.
#[derive(Parser, Debug, Clone)]
#[command(name = "etcd-webhook", version, max_term_width = 100)]
pub struct Args {
    /// PEM file with the serving certificate, leaf first, then any intermediates. Re-read
    /// every --cert-reload-interval: a changed pair is used for new connections.
    #[arg(long, env = "ETCD_WEBHOOK_TLS_CERT_FILE", value_name = "PATH")]
    pub tls_cert_file: PathBuf,

    /// PEM file with the private key of the serving certificate (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "ETCD_WEBHOOK_TLS_PRIVATE_KEY_FILE", value_name = "PATH")]
    pub tls_private_key_file: PathBuf,

    /// Address of the HTTPS admission server: IP:PORT, [IPv6]:PORT, HOST:PORT, or :PORT for
    /// every interface (IPv6 and IPv4, or IPv4 alone on a host without IPv6).
    #[arg(
        long,
        env = "ETCD_WEBHOOK_BIND_ADDRESS",
        value_name = "HOST:PORT",
        default_value = "0.0.0.0:9443"
    )]
    pub bind_address: ListenAddress,

    /// Address of the plain-HTTP metrics server (GET /metrics), HOST:PORT or :PORT; 0 turns
    /// it off.
    #[arg(
        long,
        env = "ETCD_WEBHOOK_METRICS_BIND_ADDRESS",
        value_name = "HOST:PORT",
        default_value = ":8080"
    )]
    pub metrics_bind_address: ListenAddress,

    /// Address of the plain-HTTP probe server, HOST:PORT or :PORT; 0 turns it off. GET
    /// /healthz answers while the process runs; GET /readyz once the HTTPS listener is bound,
    /// and no longer once shutdown has begun.
    #[arg(
        long,
        env = "ETCD_WEBHOOK_HEALTH_PROBE_BIND_ADDRESS",
        value_name = "HOST:PORT",
        default_value = ":8081"
    )]
    pub health_probe_bind_address: ListenAddress,

    /// etcd version that defaulting fills in when spec.version is missing.
    #[arg(long, env = "ETCD_WEBHOOK_DEFAULT_VERSION", value_name = "VERSION", default_value = DEFAULT_VERSION)]
    pub default_version: String,

    /// Image repository that defaulting fills in when spec.repository is missing.
    #[arg(long, env = "ETCD_WEBHOOK_DEFAULT_REPOSITORY", value_name = "REPOSITORY", default_value = DEFAULT_REPOSITORY)]
    pub default_repository: String,

    /// How often the certificate and key files are re-read (cert-manager and kubelet replace
    /// Secret volumes through a `..data` symlink swap, so the files are polled, not watched).
    /// A duration in Go's grammar, such as 10s, 500ms, 1.5s or 1m30s (every duration flag).
    #[arg(long, env = "ETCD_WEBHOOK_CERT_RELOAD_INTERVAL", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub cert_reload_interval: Duration,

    /// Largest request body accepted, in bytes or with a Ki/Mi suffix; larger bodies get 413.
    /// The default, 4Mi, fits an UPDATE review of two objects at the API server's 1.5 MiB limit.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_REQUEST_BODY_SIZE", value_name = "BYTES", default_value = "4Mi", value_parser = parse_size)]
    pub max_request_body_size: usize,

    /// Memory the admission requests in flight may reserve together, bytes or with a Ki/Mi
    /// suffix (a quarter of it for bodies up to 64 KiB). A request reserves the most its body
    /// can cost before reading it, then 4 bytes per body byte, 300 per JSON value and 64 KiB
    /// (measured peaks: docs/development/benchmarks.md); one that cannot get its share within
    /// 1 s is answered 429 with Retry-After. One request of the largest size is always
    /// admitted alone.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_IN_FLIGHT_MEMORY", value_name = "BYTES", default_value = "48Mi", value_parser = parse_size)]
    pub max_in_flight_memory: usize,

    /// Most connections open at once on the admission listener; more are closed as soon as
    /// accepted.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_CONNECTIONS", value_name = "N", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Most connections open at once on the metrics listener and on the probe listener, each
    /// (Prometheus and the kubelet need a few). Their HTTP/1 buffers are hyper's defaults, up
    /// to about 400 KiB per connection while a request head is being received, so this caps
    /// what these plain listeners can hold.
    #[arg(long, env = "ETCD_WEBHOOK_MAX_ADMIN_CONNECTIONS", value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_admin_connections: u32,

    /// A connection that moves no byte for this long is closed (HTTP/1 keep-alive, HTTP/2, a
    /// TLS connection that never sends a request). Must be longer than --request-timeout. The
    /// API server's HTTP/2 client pings every 30 s, so its connections stay open.
    #[arg(long, env = "ETCD_WEBHOOK_IDLE_TIMEOUT", value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// Time allowed to receive and answer one request; a slower request gets 408.
    #[arg(long, env = "ETCD_WEBHOOK_REQUEST_TIMEOUT", value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// On SIGTERM, keep serving this long (with /readyz failing) before closing the listeners,
    /// so the API server stops picking this endpoint first. 0s closes them at once.
    #[arg(long, env = "ETCD_WEBHOOK_SHUTDOWN_DELAY", value_name = "DURATION", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Once the listeners are closed, how long in-flight requests may take to finish before
    /// their connections are dropped.
    #[arg(long, env = "ETCD_WEBHOOK_SHUTDOWN_GRACE_PERIOD", value_name = "DURATION", default_value = "15s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,

    /// Log format: text (human-readable) or json (one object per line).
    #[arg(long, env = "ETCD_WEBHOOK_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in tracing EnvFilter syntax, for example info or
    /// info,etcd_webhook=debug (debug logs one line per request). Without it, $RUST_LOG when
    /// set, else info. Text lines are coloured only on a terminal.
    #[arg(long, env = "ETCD_WEBHOOK_LOG_LEVEL", value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Threads of the async runtime; defaults to the CPUs this process may use.
    #[arg(long, env = "ETCD_WEBHOOK_WORKER_THREADS", value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub worker_threads: Option<u16>,
}

/// Parses a size in bytes: a number, optionally with `Ki`, `Mi` or `Gi` (powers of 1024) or
/// `k`, `M`, `G` (powers of 1000).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let err = || format!("must be a size in bytes such as 4194304 or 4Mi, got {s:?}");
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: usize = digits.parse().map_err(|_| err())?;
    let scale: usize = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        _ => return Err(err()),
    };
    match n.checked_mul(scale) {
        Some(0) | None => Err(err()),
        Some(v) => Ok(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4Mi"), Ok(4 << 20));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("0").is_err());
        assert!(parse_size("4MB").is_err());
    }

    #[test]
    fn defaults_and_environment() {
        let args = Args::try_parse_from([
            "etcd-webhook",
            "--tls-cert-file=c",
            "--tls-private-key-file=k",
        ])
        .unwrap();
        assert_eq!(
            args.bind_address,
            ListenAddress::Socket("0.0.0.0:9443".parse().unwrap())
        );
        assert_eq!(args.metrics_bind_address, ListenAddress::AnyInterface(8080));
        assert_eq!(
            args.health_probe_bind_address,
            ListenAddress::AnyInterface(8081)
        );
        assert_eq!(args.default_version, DEFAULT_VERSION);
        assert_eq!(args.max_request_body_size, DEFAULT_MAX_REQUEST_BODY);
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.log_level, None);
        assert_eq!(args.cert_reload_interval, Duration::from_secs(10));
        assert_eq!(
            (args.max_connections, args.max_admin_connections),
            (256, 32)
        );
        let fractional = Args::try_parse_from([
            "etcd-webhook",
            "--tls-cert-file=c",
            "--tls-private-key-file=k",
            "--shutdown-delay=1.5s",
            "--log-level=debug",
        ])
        .unwrap();
        assert_eq!(fractional.shutdown_delay, Duration::from_millis(1500));
        assert_eq!(fractional.log_level.as_deref(), Some("debug"));
        // Every flag has a documented ETCD_WEBHOOK_* variable.
        let cmd = Args::command();
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let want = format!("ETCD_WEBHOOK_{}", id.to_uppercase());
            assert_eq!(env.as_deref(), Some(want.as_str()), "--{id}");
            assert!(arg.get_help().is_some(), "--{id} has no help");
        }
        cmd.debug_assert();
    }
}
