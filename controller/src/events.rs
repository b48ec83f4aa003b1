//! Publishing Kubernetes Events, one way for every reconciler: a failure to publish is logged,
//! never fails the reconcile.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

use crate::conditions::bounded_message;

/// The Events of one object, published with one recorder.
pub struct Events<'a> {
    recorder: &'a Recorder,
    reference: ObjectReference,
}

impl<'a> Events<'a> {
    /// The Events of `object`.
    pub fn of<K: Resource<DynamicType = ()>>(recorder: &'a Recorder, object: &K) -> Self {
        let reference = object.object_ref(&());
        Events {
            recorder,
            reference,
        }
    }

    /// Publishes a Normal Event of `reason`.
    pub async fn normal(&self, reason: &str, note: String) {
        self.publish(EventType::Normal, reason, note, None).await;
    }

    /// Publishes a Warning Event of `reason`.
    pub async fn warning(&self, reason: &str, note: String) {
        self.publish(EventType::Warning, reason, note, None).await;
    }

    /// Publishes an Event of `reason` (also its action) naming, besides, the object it concerns
    /// when `related` (a member's pod), so that events of one reason about different members
    /// never merge into one series (the Recorder keys a series by object, reason and related
    /// object, not by note).
    pub async fn publish(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(bounded_message(note)),
            action: reason.into(),
            secondary: related,
        };
        if let Err(e) = self.recorder.publish(&event, &self.reference).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}
