//! Publishing Kubernetes Events, one way for every reconciler: a failure to publish is logged,
//! never fails the reconcile.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};

/// Publishes an Event of `reason` (also its action) about `reference`.
pub async fn publish(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, reason, "could not publish event");
    }
}
