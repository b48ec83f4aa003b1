//! What the backup and restore controllers do with their reconcile streams: forget the state
//! kept for an object once it is gone (a background delete is seen only as gone from the
//! store), log failing watches; reconcile errors are handled by each error policy.

use futures::{Stream, StreamExt as _};
use kube::runtime::controller::{Action, Error as ControllerError};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tracing::warn;

/// Drains `results`, calling `forget(namespace, name)` for each object gone from the store.
pub async fn drain<K, E, S, F>(results: S, kind: &'static str, forget: F)
where
    K: kube::Resource,
    E: std::error::Error + 'static,
    S: Stream<Item = Result<(ObjectRef<K>, Action), ControllerError<E, watcher::Error>>>,
    F: Fn(&str, &str),
{
    results
        .for_each(|result| {
            match result {
                Ok(_) => {}
                Err(ControllerError::ObjectNotFound(gone)) => {
                    forget(gone.namespace.as_deref().unwrap_or_default(), &gone.name);
                }
                Err(ControllerError::QueueError(e)) => {
                    warn!(error = %e, kind, "a watch failed; retrying");
                }
                Err(e) => tracing::debug!(error = %e, kind, "controller stream error"),
            }
            futures::future::ready(())
        })
        .await;
}
