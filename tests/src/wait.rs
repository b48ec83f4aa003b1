//! Condition-based waiting with deadlines (no fixed sleeps): a generic poller and a
//! time-bounded wrapper around `kube::runtime::wait::await_condition`.

use std::fmt::Display;
use std::time::{Duration, Instant};

use kube::runtime::wait::Condition;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// How often [`poll_until`] re-checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// A wait that did not finish in time, or whose watch failed.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The deadline passed.
    #[error("timed out after {waited:?} waiting for {what} (last: {last})")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long we waited.
        waited: Duration,
        /// The last check's result.
        last: String,
    },
    /// The watch behind `await_condition` failed.
    #[error("watching for {what}: {source}")]
    Watch {
        /// What was awaited.
        what: String,
        /// The watch error.
        source: kube::runtime::wait::Error,
    },
}

/// Calls `check` every [`POLL_INTERVAL`] until it returns `Ok(Some(value))`, and returns that
/// value. `Ok(None)` means "not yet"; an `Err` is remembered (shown on timeout) and retried.
pub async fn poll_until<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, WaitError>
where
    E: Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
{
    let begin = Instant::now();
    loop {
        let remaining = timeout.saturating_sub(begin.elapsed());
        let last = match tokio::time::timeout(remaining, check()).await {
            Ok(Ok(Some(value))) => return Ok(value),
            Ok(Ok(None)) => String::from("condition not met"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => String::from("check still running at the deadline"),
        };
        if begin.elapsed() >= timeout {
            return Err(WaitError::Timeout {
                what: what.to_owned(),
                waited: begin.elapsed(),
                last,
            });
        }
        tokio::time::sleep(POLL_INTERVAL.min(timeout.saturating_sub(begin.elapsed()))).await;
    }
}

/// `kube::runtime::wait::await_condition` with a deadline: watches `name` until `condition`
/// holds and returns the object (`None` if it holds for a missing object, as for `is_deleted`).
pub async fn await_condition<K>(
    api: Api<K>,
    name: &str,
    condition: impl Condition<K>,
    timeout: Duration,
) -> Result<Option<K>, WaitError>
where
    K: Clone + std::fmt::Debug + Send + DeserializeOwned + Resource + 'static,
    K::DynamicType: Default,
{
    let what = format!("{} {name}", K::kind(&Default::default()));
    match tokio::time::timeout(
        timeout,
        kube::runtime::wait::await_condition(api, name, condition),
    )
    .await
    {
        Ok(Ok(object)) => Ok(object),
        Ok(Err(source)) => Err(WaitError::Watch { what, source }),
        Err(_) => Err(WaitError::Timeout {
            what,
            waited: timeout,
            last: String::from("condition not met"),
        }),
    }
}

/// [`poll_until`] for checks that cannot fail: `None` means "not yet".
pub async fn wait_for_some<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, WaitError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(what, timeout, || {
        let fut = check();
        async move { Ok::<_, std::convert::Infallible>(fut.await) }
    })
    .await
}
