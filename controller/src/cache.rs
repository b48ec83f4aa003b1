//! Watch caches of the objects the operator derives (pods, claims, Services, budgets), so a
//! reconcile reads them from memory instead of listing them, and skips applying objects that
//! already carry the desired content. The caches are filled by their own watches of objects
//! labelled `app.kubernetes.io/managed-by=etcd-operator`.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;

/// Annotation carrying the hash of the content the operator last applied to an object.
pub const APPLIED_HASH: &str = "etcd.database.coreos.com/applied-hash";

/// The caches of derived objects.
#[derive(Clone)]
pub struct Caches {
    /// Member pods.
    pub pods: Store<Pod>,
    /// Data claims.
    pub claims: Store<PersistentVolumeClaim>,
    /// Services.
    pub services: Store<Service>,
    /// Disruption budgets.
    pub pdbs: Store<PodDisruptionBudget>,
}

fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: fn(&mut K),
) -> (Store<K>, impl Stream<Item = ()> + Send)
where
    K: Resource<DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (store, writer) = reflector::store();
    // Only what the operator reads is kept: managedFields alone are most of an object.
    let stream = reflector::reflector(
        writer,
        watcher(api, config)
            .default_backoff()
            .modify(move |o: &mut K| {
                o.meta_mut().managed_fields = None;
                strip(o);
            }),
    )
    .map(|_| ());
    (store, stream)
}

/// Keeps of a pod what the planner reads: containers' names and images, phase, IP,
/// conditions, containers' restart counts.
fn strip_pod(pod: &mut Pod) {
    if let Some(spec) = pod.spec.as_mut() {
        let containers = std::mem::take(&mut spec.containers)
            .into_iter()
            .map(|c| k8s_openapi::api::core::v1::Container {
                name: c.name,
                image: c.image,
                ..Default::default()
            })
            .collect();
        *spec = k8s_openapi::api::core::v1::PodSpec {
            containers,
            ..Default::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            pod_ip: status.pod_ip.take(),
            conditions: status.conditions.take(),
            container_statuses: status.container_statuses.take().map(|cs| {
                cs.into_iter()
                    .map(|c| k8s_openapi::api::core::v1::ContainerStatus {
                        name: c.name,
                        restart_count: c.restart_count,
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        };
    }
}

fn strip_claim(claim: &mut PersistentVolumeClaim) {
    claim.spec = None;
    claim.status = None;
}

/// Services and budgets keep their spec (a few hundred bytes): [`is_current`] compares it with
/// what the operator applies, so a hand edit of a field it owns is seen and reverted.
fn strip_service(service: &mut Service) {
    service.status = None;
}

fn strip_pdb(pdb: &mut PodDisruptionBudget) {
    pdb.status = None;
}

impl Caches {
    /// Caches over `api_for(kind)`, and the future that keeps them filled (run it until shutdown).
    pub fn new(
        pods: Api<Pod>,
        claims: Api<PersistentVolumeClaim>,
        services: Api<Service>,
        pdbs: Api<PodDisruptionBudget>,
        config: watcher::Config,
    ) -> (Self, impl std::future::Future<Output = ()> + Send) {
        let (pods, p) = cached(pods, config.clone(), strip_pod);
        let (claims, c) = cached(claims, config.clone(), strip_claim);
        let (services, s) = cached(services, config.clone(), strip_service);
        let (pdbs, b) = cached(pdbs, config, strip_pdb);
        let driver =
            futures::stream::select(futures::stream::select(p, c), futures::stream::select(s, b))
                .for_each(|()| async {});
        (
            Caches {
                pods,
                claims,
                services,
                pdbs,
            },
            driver,
        )
    }

    /// Waits until every cache has listed its objects once.
    pub async fn wait_until_ready(&self) -> bool {
        self.pods.wait_until_ready().await.is_ok()
            && self.claims.wait_until_ready().await.is_ok()
            && self.services.wait_until_ready().await.is_ok()
            && self.pdbs.wait_until_ready().await.is_ok()
    }
}

/// The cached objects of `namespace` whose labels include every `selector` pair.
pub fn select<K>(
    store: &Store<K>,
    namespace: &str,
    selector: &BTreeMap<String, String>,
) -> Vec<Arc<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    store
        .state()
        .into_iter()
        .filter(|o| o.meta().namespace.as_deref() == Some(namespace))
        .filter(|o| {
            let labels = o.meta().labels.as_ref();
            selector
                .iter()
                .all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v))
        })
        .collect()
}

/// Whether the cached object `name` already is what the operator applies: it carries the
/// content hash of `desired` (nothing changed on our side) and still holds every label and
/// spec field `desired` sets (nobody edited a field the operator owns). Fields the API server
/// or others added are ignored.
pub fn is_current<K>(
    store: &Store<K>,
    namespace: &str,
    name: &str,
    hash: &str,
    desired: &serde_json::Value,
) -> bool
where
    K: Resource<DynamicType = ()> + Clone + serde::Serialize,
{
    let Some(live) = store.get(&ObjectRef::new(name).within(namespace)) else {
        return false;
    };
    let hashed = live
        .meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(APPLIED_HASH))
        .is_some_and(|h| h == hash);
    hashed
        && serde_json::to_value(live.as_ref()).is_ok_and(|live| {
            ["spec", "metadata/labels"].iter().all(|path| {
                let pointer = format!("/{path}");
                match (desired.pointer(&pointer), live.pointer(&pointer)) {
                    (None, _) => true,
                    (Some(want), Some(have)) => contains(have, want),
                    (Some(_), None) => false,
                }
            })
        })
}

/// Whether `have` holds everything `want` sets: objects key by key (extra keys allowed),
/// arrays element by element (same length), other values equal.
pub fn contains(have: &serde_json::Value, want: &serde_json::Value) -> bool {
    use serde_json::Value;
    match (have, want) {
        (Value::Object(have), Value::Object(want)) => want
            .iter()
            .all(|(k, w)| have.get(k).is_some_and(|h| contains(h, w))),
        (Value::Array(have), Value::Array(want)) => {
            have.len() == want.len() && have.iter().zip(want).all(|(h, w)| contains(h, w))
        }
        (have, want) => have == want,
    }
}

/// A hash of an object's serialized content (stable within one build of the operator).
pub fn content_hash(value: &serde_json::Value) -> String {
    let mut hasher = DefaultHasher::new();
    value.to_string().hash(&mut hasher);
    format!("{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_ignores_added_fields_and_sees_edits() {
        use serde_json::json;
        let want =
            json!({"selector": {"app": "etcd"}, "ports": [{"port": 2379, "name": "client"}]});
        for (have, holds) in [
            (
                json!({"selector": {"app": "etcd"}, "ports": [{"port": 2379, "name": "client", "protocol": "TCP"}], "clusterIP": "10.0.0.1"}),
                true,
            ),
            (
                json!({"selector": {"app": "etcd", "extra": "x"}, "ports": [{"port": 2379, "name": "client"}]}),
                true,
            ),
            (
                json!({"selector": {"app": "other"}, "ports": [{"port": 2379, "name": "client"}]}),
                false,
            ),
            (
                json!({"selector": {"app": "etcd"}, "ports": [{"port": 2380, "name": "client"}]}),
                false,
            ),
            (json!({"selector": {"app": "etcd"}, "ports": []}), false),
            (json!({"ports": [{"port": 2379, "name": "client"}]}), false),
        ] {
            assert_eq!(contains(&have, &want), holds, "{have}");
        }
    }
    use k8s_openapi::api::core::v1::{Container, ContainerStatus, PodSpec, PodStatus};

    #[test]
    fn stripped_pods_keep_what_the_planner_reads() {
        let mut pod = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "etcd".into(),
                    image: Some("quay.io/coreos/etcd:v3.6.16".into()),
                    args: Some(vec!["--name=demo-0".into()]),
                    ..Default::default()
                }],
                hostname: Some("demo-0".into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                pod_ip: Some("10.0.0.1".into()),
                container_statuses: Some(vec![ContainerStatus {
                    name: "etcd".into(),
                    image: "quay.io/coreos/etcd:v3.6.16".into(),
                    restart_count: 2,
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        strip_pod(&mut pod);
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname, None);
        assert_eq!(spec.containers[0].args, None);
        assert_eq!(
            spec.containers[0].image.as_deref(),
            Some("quay.io/coreos/etcd:v3.6.16")
        );
        let status = pod.status.as_ref().unwrap();
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        let c = &status.container_statuses.as_ref().unwrap()[0];
        assert_eq!((c.name.as_str(), c.restart_count), ("etcd", 2));
        assert!(c.image.is_empty());
    }
}
