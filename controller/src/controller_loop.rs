//! The one runner of the three controllers (EtcdCluster, EtcdBackup, EtcdRestore), in the shape
//! of kubert's and Stackable's: each controller says how to reconcile one object, how to retry
//! a failure and what to forget when an object is gone ([`Reconciled`]); [`run_controller`]
//! drives kube's [`Controller`] with it, and handles its stream the same way for all: an object
//! gone from the store (a background delete) is forgotten, a failing watch is logged and
//! reported, reconcile errors are left to the error policy.

use std::future::Future;
use std::sync::Arc;

use futures::StreamExt as _;
use kube::Resource;
use kube::runtime::controller::{
    Action, Config as ControllerConfig, Controller, Error as ControllerError,
};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tracing::warn;

/// A controller's reconciler: what [`run_controller`] needs from it.
pub trait Reconciled: Send + Sync + Sized + 'static {
    /// The kind it reconciles.
    type Object: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static;
    /// Its reconcile error.
    type Error: std::error::Error + Send + Sync + 'static;
    /// The kind's name in logs (`EtcdBackup`).
    const KIND: &'static str;

    /// Reconciles one object.
    fn reconcile(
        self: Arc<Self>,
        object: Arc<Self::Object>,
    ) -> impl Future<Output = Result<Action, Self::Error>> + Send + 'static;

    /// When a failed reconcile of `object` runs again (and what is logged and counted).
    fn retry(&self, object: &Self::Object, error: &Self::Error) -> Action;

    /// Drops what is kept for an object gone from the store (backoff, metric series, ...).
    fn forget(&self, namespace: &str, name: &str);

    /// Called when a watch fails (it retries by itself); for a readiness signal.
    fn watch_failed(&self) {}
}

/// The key of an object's per-object state (backoff, reports).
pub fn object_key<K: Resource>(object: &K) -> crate::object_key::ObjectKey {
    crate::object_key::ObjectKey::of(object)
}

/// An Api for one namespace, or for all.
pub fn scoped_api<K>(client: &kube::Client, namespace: Option<&str>) -> kube::Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match namespace {
        Some(ns) => kube::Api::namespaced(client.clone(), ns),
        None => kube::Api::all(client.clone()),
    }
}

/// Runs a controller of `reconciler`'s kind that watches that kind alone (in `namespace`, or
/// in all), reconciling up to `concurrency` objects at a time, until `shutdown` resolves.
pub async fn run_kind<R: Reconciled>(
    reconciler: Arc<R>,
    client: &kube::Client,
    namespace: Option<&str>,
    concurrency: u16,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) where
    R::Object: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let controller = Controller::new(scoped_api(client, namespace), watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown);
    run_controller(controller, reconciler).await;
}

/// Runs `controller` (its watches, concurrency and shutdown already configured) with
/// `reconciler` until the controller stops.
pub async fn run_controller<R: Reconciled>(controller: Controller<R::Object>, reconciler: Arc<R>) {
    let forgetting = reconciler.clone();
    controller
        .run(
            |object, r: Arc<R>| r.reconcile(object),
            |object, error, r: Arc<R>| r.retry(&object, error),
            reconciler,
        )
        .for_each(|result| {
            match result {
                Ok(_) => {}
                // A background delete is seen only as gone from the store.
                Err(ControllerError::ObjectNotFound(gone)) => {
                    let namespace = gone.namespace.as_deref().unwrap_or_default();
                    forgetting.forget(namespace, &gone.name);
                    tracing::debug!(kind = R::KIND, object = %format!("{namespace}/{}", gone.name), "gone: forgotten");
                }
                Err(ControllerError::QueueError(e)) => {
                    forgetting.watch_failed();
                    warn!(error = %e, kind = R::KIND, "a watch failed; retrying");
                }
                // Reconcile errors are logged (and retried) by the error policy.
                Err(e) => tracing::debug!(error = %e, kind = R::KIND, "controller stream error"),
            }
            futures::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    #[test]
    fn keys_are_namespace_slash_name() {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("ns".into());
        cm.metadata.name = Some("a".into());
        assert_eq!(object_key(&cm).to_string(), "ns/a");
        cm.metadata.namespace = None;
        assert_eq!(object_key(&cm).to_string(), "/a");
    }
}
