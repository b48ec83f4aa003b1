//! The one shutdown signal shared by every server: triggered by SIGTERM or SIGINT (or by a
//! test), it makes readiness fail, closes the listeners, lets in-flight requests finish and
//! stops the certificate reloader.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// A shutdown trigger that every part of the webhook waits on. Clones share the signal.
#[derive(Clone, Debug, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    /// A trigger not yet pulled.
    pub fn new() -> Self {
        Shutdown::default()
    }

    /// Starts the graceful shutdown. Pulling it again does nothing.
    pub fn trigger(&self) {
        self.0.cancel();
    }

    /// Whether shutdown has begun.
    pub fn is_triggered(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Resolves once shutdown has begun.
    pub async fn triggered(&self) {
        self.0.cancelled().await;
    }

    /// A token cancelled with the trigger, for tasks that take one.
    pub fn token(&self) -> CancellationToken {
        self.0.clone()
    }
}

/// Waits for SIGTERM or SIGINT and triggers `shutdown`. A second signal exits at once with
/// status 130, for an operator who does not want to wait for in-flight requests.
pub async fn on_signal(shutdown: Shutdown) {
    let name = match next_signal().await {
        Ok(name) => name,
        Err(e) => {
            warn!(error = %e, "cannot listen for SIGTERM/SIGINT; shut down by killing the process");
            return;
        }
    };
    info!(signal = name, "shutdown signal received: draining");
    shutdown.trigger();
    if let Ok(name) = next_signal().await {
        warn!(signal = name, "second signal: exiting without waiting");
        std::process::exit(130);
    }
}

async fn next_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}
