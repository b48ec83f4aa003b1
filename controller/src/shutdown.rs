//! The process's one shutdown signal. The first SIGTERM or SIGINT cancels a
//! [`CancellationToken`] that every task listens to (the admin servers, the leader elector, the
//! controller through its shutdown future); a second signal exits at once with status 130.

use std::future::Future;

use futures::{Stream, StreamExt};

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Exit status after a second signal (128 + SIGINT, as shells report an interrupt).
pub const FORCED_EXIT_CODE: i32 = 130;

/// Registers the SIGTERM and SIGINT handlers and returns the token they cancel. Must be
/// called inside a tokio runtime. Once registered, the signals no longer end the process on
/// their own: the first cancels the token, the second calls [`std::process::exit`].
pub fn install() -> std::io::Result<CancellationToken> {
    let term = signal(SignalKind::terminate())?;
    let int = signal(SignalKind::interrupt())?;
    let signals = futures::stream::unfold((term, int), |(mut term, mut int)| async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        Some((name, (term, int)))
    });
    let token = CancellationToken::new();
    tokio::spawn(drive(token.clone(), signals, |_| {
        std::process::exit(FORCED_EXIT_CODE)
    }));
    Ok(token)
}

/// Cancels `token` on the first item of `signals`, then calls `force` with the second: the
/// signal-independent core of [`install`], usable with any trigger.
pub async fn drive<S, F>(token: CancellationToken, signals: S, force: F)
where
    S: Stream<Item = &'static str>,
    F: FnOnce(&'static str),
{
    let mut signals = std::pin::pin!(signals);
    let Some(first) = signals.next().await else {
        return;
    };
    tracing::info!(
        signal = first,
        "shutting down gracefully (a second signal exits at once)"
    );
    token.cancel();
    if let Some(second) = signals.next().await {
        tracing::warn!(signal = second, "second signal: exiting now");
        force(second);
    }
}

/// A future that completes when `token` is cancelled, owning its clone of the token (what
/// `run_controller` and `axum::serve(..).with_graceful_shutdown` take).
pub fn cancelled(token: &CancellationToken) -> impl Future<Output = ()> + Send + Sync + 'static {
    token.clone().cancelled_owned()
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn first_signal_cancels_second_forces() {
        let token = CancellationToken::new();
        let forced = Arc::new(Mutex::new(None));
        let (tx, rx) = futures::channel::mpsc::unbounded::<&'static str>();
        let task = tokio::spawn(drive(token.clone(), rx, {
            let forced = forced.clone();
            move |s| *forced.lock().unwrap() = Some(s)
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!token.is_cancelled());
        tx.unbounded_send("SIGTERM").unwrap();
        tokio::time::timeout(Duration::from_secs(5), cancelled(&token))
            .await
            .unwrap();
        assert_eq!(*forced.lock().unwrap(), None);
        tx.unbounded_send("SIGINT").unwrap();
        task.await.unwrap();
        assert_eq!(*forced.lock().unwrap(), Some("SIGINT"));
    }

    #[tokio::test]
    async fn the_stream_ending_does_not_force() {
        let token = CancellationToken::new();
        drive(token.clone(), futures::stream::iter(["SIGTERM"]), |_| {
            panic!("forced")
        })
        .await;
        assert!(token.is_cancelled());
    }

    #[tokio::test]
    async fn a_real_sigterm_cancels_the_token() {
        let token = install().unwrap();
        // The handler installed above catches it, so the test process lives on.
        let status = std::process::Command::new("kill")
            .args(["-TERM", &std::process::id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        tokio::time::timeout(Duration::from_secs(5), token.cancelled())
            .await
            .unwrap();
    }
}
