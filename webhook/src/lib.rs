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
//! - [`http`]: the axum routers of the webhook, metrics and probe servers.
//! - [`tls`]: certificate loading, the SNI-less certificate resolver, hot reload.
//! - [`metrics`]: the Prometheus registry and its metrics.
//! - [`server`]: binds the three listeners and runs them until shutdown.
//! - [`shutdown`]: the one shutdown signal shared by every server, SIGTERM/SIGINT.
//! - [`registration`]: the Validating/MutatingWebhookConfiguration objects that point the API
//!   server at this webhook.
//! - [`logging`]: tracing in text or JSON.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod args;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod registration;
pub mod server;
pub mod shutdown;
pub mod tls;

use std::process::ExitCode;

pub use args::Args;
pub use server::{RunningServer, ServerError};
pub use shutdown::Shutdown;

/// Runs the webhook until SIGTERM or SIGINT, then drains it: what the binary's `main` calls.
/// Returns success after a clean shutdown and failure (with the reason logged and printed)
/// when the configuration, the certificate or a listener is unusable.
pub fn main(args: Args) -> ExitCode {
    if let Err(e) = logging::init(args.log_format, &args.log_level) {
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
    let server = server::start(&args, shutdown.clone()).await?;
    tokio::spawn(shutdown::on_signal(shutdown));
    server.wait().await
}
