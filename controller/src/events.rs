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
    publish_related(recorder, reference, type_, reason, note, None).await;
}

/// [`publish`] naming, besides, the object the event concerns (`related`: a member's pod), so
/// that events of one reason about different members never merge into one series (the
/// Recorder keys a series by object, reason and related object, not by note).
pub async fn publish_related(
    recorder: &Recorder,
    reference: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
    related: Option<ObjectReference>,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: related,
    };
    if let Err(e) = recorder.publish(&event, reference).await {
        tracing::warn!(error = %e, reason, "could not publish event");
    }
}
