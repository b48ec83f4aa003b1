//! The EtcdCluster admission webhook: an HTTPS service the API server calls on every create and
//! update of an `EtcdCluster` (`etcd.database.coreos.com/v1beta2`).
//!
//! - `POST /validate` applies [`etcd_shared::admission::AdmissionPolicy::validate`]: refusals name
//!   the field and the rule, warnings are passed on to `kubectl`.
//! - `POST /mutate` applies [`etcd_shared::admission::AdmissionPolicy::defaulted`] and answers a
//!   JSONPatch that only adds what is missing (and drops a leading `v` from the version).
//!
//! The webhook holds no rules of its own. Modules, one job each:
//!
//! - [`args`]: the command line (every flag has an `ETCD_WEBHOOK_*` environment variable).
//! - [`admission`]: AdmissionReview in, AdmissionReview out; no HTTP, no I/O.
//! - [`http`]: the axum router of the admission server (the metrics and probe servers are the
//!   process shell's, [`etcd_process::admin`]).
//! - [`inflight`]: the memory budget of the requests in flight (429 when exhausted).
//! - [`connections`]: the cap on open connections and the idle timeout of every listener
//!   (the process shell's, [`etcd_process::connections`]).
//! - [`tls`]: certificate loading, the SNI-less certificate resolver, hot reload.
//! - [`metrics`]: the Prometheus registry and its metrics.
//! - [`server`]: binds the three listeners and runs them until shutdown.
//! - [`shutdown`]: the one shutdown signal shared by every server, SIGTERM/SIGINT (the process
//!   shell's, [`etcd_process::signals`]).
//! - [`registration`]: the Validating/MutatingWebhookConfiguration objects that point the API
//!   server at this webhook.
//!
//! Listen addresses, durations, logging, signals and the admin servers are the process shell's
//! ([`etcd_process`]), the same as the controller's.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod args;
pub use etcd_process::connections;
pub mod http;
pub mod inflight;
pub mod metrics;
pub mod registration;
pub mod server;
pub use etcd_process::signals as shutdown;
pub mod tls;

use std::process::ExitCode;

pub use args::Args;
pub use etcd_process::signals::Shutdown;
pub use server::{RunningServer, ServerError};

/// Runs the webhook until SIGTERM or SIGINT, then drains it: what the binary's `main` calls.
/// Returns success after a clean shutdown and failure (with the reason logged and printed)
/// when the configuration, the certificate or a listener is unusable.
pub fn main(args: Args) -> ExitCode {
    if let Err(e) = etcd_process::logging::init(args.log_format, args.log_level.as_deref()) {
        eprintln!("etcd-webhook: {e}");
        return ExitCode::from(2);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(n) = args.worker_threads {
        builder.worker_threads(usize::from(n));
    }
    let runtime = match builder.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("etcd-webhook: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "etcd-webhook failed");
            ExitCode::FAILURE
        }
    }
}

/// Starts every server, waits for SIGTERM or SIGINT and shuts down gracefully.
pub async fn run(args: Args) -> Result<(), ServerError> {
    let shutdown = Shutdown::new();
    shutdown::install(&shutdown).map_err(ServerError::Signals)?;
    let server = server::start(&args, shutdown).await?;
    server.wait().await
}
