//! The process's one shutdown trigger. [`install`] registers the SIGTERM and SIGINT handlers
//! before it returns (so a signal sent as soon as the process says it serves is never missed):
//! the first signal pulls the [`Shutdown`] trigger every task waits on, a second one exits at
//! once with status [`FORCED_EXIT_CODE`], for an operator who does not want to wait.

use std::future::Future;

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

/// Exit status after a second signal (128 + SIGINT, as shells report an interrupt).
pub const FORCED_EXIT_CODE: i32 = 130;

/// A shutdown trigger that every part of the process waits on. Clones share the trigger.
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

    /// A future that resolves once shutdown has begun, owning its share of the trigger (what
    /// `with_graceful_shutdown` and kube-runtime's `graceful_shutdown_on` take).
    pub fn triggered_owned(&self) -> impl Future<Output = ()> + Send + Sync + 'static {
        self.0.clone().cancelled_owned()
    }

    /// A token cancelled with the trigger, for tasks that take one.
    pub fn token(&self) -> CancellationToken {
        self.0.clone()
    }
}

/// Registers the SIGTERM and SIGINT handlers now and spawns the task that pulls `shutdown` on
/// the first signal and exits with [`FORCED_EXIT_CODE`] on the second. Must be called inside a
/// tokio runtime. Once registered, the signals no longer end the process on their own.
pub fn install(shutdown: &Shutdown) -> std::io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate())?;
    let int = signal(SignalKind::interrupt())?;
    let signals = futures::stream::unfold((term, int), |(mut term, mut int)| async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        Some((name, (term, int)))
    });
    tokio::spawn(drive(shutdown.clone(), signals, |_| {
        std::process::exit(FORCED_EXIT_CODE)
    }));
    Ok(())
}

/// Pulls `shutdown` on the first item of `signals`, then calls `force` with the second: the
/// signal-independent core of [`install`], usable with any trigger.
pub async fn drive<S, F>(shutdown: Shutdown, signals: S, force: F)
where
    S: Stream<Item = &'static str>,
    F: FnOnce(&'static str),
{
    let mut signals = std::pin::pin!(signals);
    let Some(first) = signals.next().await else {
        return;
    };
    // One message for both binaries (the webhook's tests and log searches look for it).
    tracing::info!(signal = first, "shutdown signal received: draining");
    shutdown.trigger();
    if let Some(second) = signals.next().await {
        tracing::warn!(signal = second, "second signal: exiting without waiting");
        force(second);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn installed_before_returning_first_triggers_second_forces() {
        // The real handlers: a SIGTERM sent right after `install` returns is caught (the test
        // process lives on) and pulls the trigger.
        let real = Shutdown::new();
        install(&real).unwrap();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(5), real.triggered())
            .await
            .expect("SIGTERM pulled the trigger");

        // The second signal forces, through the same core (without exiting the test).
        let shutdown = Shutdown::new();
        let forced = Arc::new(Mutex::new(None));
        let (tx, rx) = futures::channel::mpsc::unbounded::<&'static str>();
        let task = tokio::spawn(drive(shutdown.clone(), rx, {
            let forced = forced.clone();
            move |s| *forced.lock().unwrap() = Some(s)
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!shutdown.is_triggered());
        tx.unbounded_send("SIGTERM").unwrap();
        tokio::time::timeout(Duration::from_secs(5), shutdown.triggered_owned())
            .await
            .unwrap();
        assert_eq!(*forced.lock().unwrap(), None);
        tx.unbounded_send("SIGINT").unwrap();
        task.await.unwrap();
        assert_eq!(*forced.lock().unwrap(), Some("SIGINT"));
        // Signals that stop coming do not force.
        let once = Shutdown::new();
        drive(once.clone(), futures::stream::iter(["SIGINT"]), |_| {
            panic!("forced")
        })
        .await;
        assert!(once.is_triggered() && once.token().is_cancelled());
    }
}
