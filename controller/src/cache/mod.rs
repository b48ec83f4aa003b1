//! Watch caches of the objects the operator derives (pods, claims, Services, budgets), so a
//! reconcile reads them from memory instead of listing them, and skips applying objects that
//! already carry the desired content. Each cache is filled by one watch of the objects
//! labelled `app.kubernetes.io/managed-by=etcd-operator`, and the same watch's stream is the
//! Controller's trigger for that kind (`owns_stream`): one list and one watch per kind; pods
//! have a second, of the pods CoreOS' operator left running (`app=etcd` without
//! `app.kubernetes.io/managed-by`), which are adopted.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::borrow::Cow;

use etcd_shared::types::PodPolicy;
use etcd_shared::{EtcdCluster, EtcdClusterSpec, EtcdClusterStatus};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::Deserialize;
use serde::de::DeserializeOwned;

/// Annotation carrying the hash of the content the operator last applied to an object.
pub const APPLIED_HASH: &str = "etcd.database.coreos.com/applied-hash";

mod compact;

pub use compact::{CachedClaim, CachedPdb, CachedPod, CachedService, trim_meta};

/// The caches of derived objects.
#[derive(Clone)]
pub struct Caches {
    /// Set by each cache's stream once its first list is in the store.
    synced: [Arc<AtomicBool>; 5],
    /// Member pods.
    pub pods: Store<CachedPod>,
    /// Pods labelled `app=etcd` without `app.kubernetes.io/managed-by`: those CoreOS' operator
    /// left running (and any other with that label, which the observation leaves out).
    pub coreos_pods: Store<CachedPod>,
    /// Data claims.
    pub claims: Store<CachedClaim>,
    /// Services.
    pub services: Store<CachedService>,
    /// Disruption budgets.
    pub pdbs: Store<CachedPdb>,
}

/// The objects a cache's watch saw change (applied, or deleted), after they were written to
/// the cache: what wakes the reconcile of the cluster that owns them. Polling it drives the
/// cache; watch errors come through it (the watch restarts when it is polled again).
pub type Trigger<K> = BoxStream<'static, Result<K, watcher::Error>>;

/// The triggers of the caches of [`Caches::new`], one per kind, for the Controller's
/// `owns_stream`.
pub struct Triggers {
    /// Member pods.
    pub pods: Trigger<CachedPod>,
    /// Pods CoreOS' operator left running.
    pub coreos_pods: Trigger<CachedPod>,
    /// Data claims.
    pub claims: Trigger<CachedClaim>,
    /// Services.
    pub services: Trigger<CachedService>,
    /// Disruption budgets.
    pub pdbs: Trigger<CachedPdb>,
}

fn cached<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Trigger<K>, Arc<AtomicBool>)
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
    let synced = Arc::new(AtomicBool::new(false));
    let flag = synced.clone();
    // Only what the operator reads is kept (the cached types decode no more; `trim_meta`
    // drops the rest of the metadata). A failed watch is retried with the Controller's
    // trigger backoff, as `.owns()` would be.
    let stream = watcher(api, config)
        .modify(|o: &mut K| compact::trim_meta(o.meta_mut()))
        .reflect(writer)
        .inspect(move |event| {
            if let Ok(watcher::Event::InitDone) = event {
                flag.store(true, Ordering::Release);
            }
        })
        .touched_objects()
        .boxed();
    (store, stream, synced)
}

impl Caches {
    /// Caches of the objects `config` selects through each Api, plus CoreOS' pods through the
    /// pods' Api (`coreos_config`), and the streams that fill them: hand those to the
    /// Controller as its `owns_stream` triggers (or poll them some other way), else the caches
    /// stay empty.
    pub fn new(
        pods: Api<CachedPod>,
        claims: Api<CachedClaim>,
        services: Api<CachedService>,
        pdbs: Api<CachedPdb>,
        config: &watcher::Config,
        coreos_config: &watcher::Config,
    ) -> (Self, Triggers) {
        let (coreos_pods, cp, coreos_synced) = cached(pods.clone(), coreos_config.clone());
        let (pods, p, pods_synced) = cached(pods, config.clone());
        let (claims, c, claims_synced) = cached(claims, config.clone());
        let (services, s, services_synced) = cached(services, config.clone());
        let (pdbs, b, pdbs_synced) = cached(pdbs, config.clone());
        (
            Caches {
                synced: [
                    pods_synced,
                    claims_synced,
                    services_synced,
                    pdbs_synced,
                    coreos_synced,
                ],
                pods,
                coreos_pods,
                claims,
                services,
                pdbs,
            },
            Triggers {
                pods: p,
                coreos_pods: cp,
                claims: c,
                services: s,
                pdbs: b,
            },
        )
    }

    /// Whether every cache has listed its objects once. Read from flags the caches' streams
    /// set, not from the stores' readiness futures: polling one of those from here would take
    /// its single waker from the task that awaits it ([`Self::wait_until_ready`]).
    pub fn is_ready(&self) -> bool {
        self.synced.iter().all(|s| s.load(Ordering::Acquire))
    }

    /// Waits until every cache has listed its objects once.
    pub async fn wait_until_ready(&self) -> bool {
        self.pods.wait_until_ready().await.is_ok()
            && self.coreos_pods.wait_until_ready().await.is_ok()
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
/// spec field `desired` sets (nobody edited a field the operator owns), with the atomic
/// fields ([`ATOMIC_FIELDS`]) exactly as desired. Other fields the API server or others added
/// are ignored.
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
            let holds = ["/spec", "/metadata/labels"].iter().all(|pointer| {
                match (desired.pointer(pointer), live.pointer(pointer)) {
                    (None, _) => true,
                    (Some(want), Some(have)) => contains(have, want),
                    (Some(_), None) => false,
                }
            });
            let atomic_equal = ATOMIC_FIELDS.iter().all(|pointer| {
                match (desired.pointer(pointer), live.pointer(pointer)) {
                    (None, _) => true,
                    (Some(want), have) => have == Some(want),
                }
            });
            holds && atomic_equal
        })
}

/// Fields the API server treats as atomic (`x-kubernetes-map-type: atomic`): a Service's
/// `spec.selector` and a budget's `spec.selector`. One key added by hand changes what they
/// select (the client Service would select no member), and an apply replaces them whole, so
/// they are compared whole: a live value with an extra key is drift.
pub const ATOMIC_FIELDS: &[&str] = &["/spec/selector"];

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

/// An `EtcdCluster` as the API server stored it: decoded into this operator's types, or, when
/// that fails, only its metadata and where the decode failed. Its `Deserialize` never fails, so
/// one object our types reject (stored under CoreOS' schema-less CRD, or holding a value the
/// schema allows and the types do not) cannot fail the list of every cluster. A status that
/// does not decode reads as none (the controller writes its own); only a spec or metadata that
/// does not decode makes the object [`Undecodable`].
#[derive(Clone, Debug)]
pub struct StoredCluster(Result<EtcdCluster, Undecodable>);

/// What is known of an `EtcdCluster` whose spec does not decode. Holds no value of the object
/// beyond its metadata: the reason names the field and the kind of value, never the value.
#[derive(Clone, Debug, PartialEq)]
pub struct Undecodable {
    /// The object's metadata (what could be read of it).
    pub metadata: ObjectMeta,
    /// The field that failed, as a path (`spec.pod.resources`).
    pub field: String,
    /// Why, without the offending value (`invalid type: integer, expected a string`).
    pub reason: String,
}

impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl StoredCluster {
    /// Decodes one stored object; never fails.
    pub fn from_value(mut value: serde_json::Value) -> Self {
        if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
            // Only what the operator reads is kept: managedFields alone are most of an object.
            meta.remove("managedFields");
        }
        match EtcdCluster::deserialize(&value) {
            Ok(cluster) => StoredCluster(Ok(cluster)),
            Err(error) => {
                let status_fails = value
                    .get("status")
                    .is_some_and(|s| EtcdClusterStatus::deserialize(s).is_err());
                if status_fails && let Some(object) = value.as_object_mut() {
                    // A status this operator cannot read is one it rewrites.
                    object.remove("status");
                    if let Ok(cluster) = EtcdCluster::deserialize(&value) {
                        tracing::info!(
                            cluster = %format!(
                                "{}/{}",
                                cluster.namespace().unwrap_or_default(),
                                cluster.name_any()
                            ),
                            "the stored status does not decode; it is rewritten"
                        );
                        return StoredCluster(Ok(cluster));
                    }
                }
                let metadata = value
                    .get("metadata")
                    .and_then(|m| ObjectMeta::deserialize(m).ok())
                    .unwrap_or_default();
                StoredCluster(Err(Undecodable {
                    metadata,
                    field: locate(&value),
                    reason: without_values(&error.to_string()),
                }))
            }
        }
    }

    /// The decoded cluster, or what is known of the undecodable one.
    pub fn decoded(&self) -> Result<&EtcdCluster, &Undecodable> {
        self.0.as_ref()
    }
}

impl From<EtcdCluster> for StoredCluster {
    fn from(cluster: EtcdCluster) -> Self {
        StoredCluster(Ok(cluster))
    }
}

impl<'de> Deserialize<'de> for StoredCluster {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Fails only on input that is not JSON at all.
        Ok(StoredCluster::from_value(serde_json::Value::deserialize(
            d,
        )?))
    }
}

impl Resource for StoredCluster {
    type DynamicType = ();
    type Scope = k8s_openapi::NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        EtcdCluster::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        EtcdCluster::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        EtcdCluster::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        EtcdCluster::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match &self.0 {
            Ok(c) => &c.metadata,
            Err(u) => &u.metadata,
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match &mut self.0 {
            Ok(c) => &mut c.metadata,
            Err(u) => &mut u.metadata,
        }
    }
}

/// The path of the field that fails to decode: the top-level part (`metadata`, `spec`,
/// `status`), then the first spec field (and pod policy field) that fails on its own.
fn locate(value: &serde_json::Value) -> String {
    fn fails<T: DeserializeOwned>(v: &serde_json::Value) -> bool {
        T::deserialize(v).is_err()
    }
    /// The first key of `object` that fails to decode as `T` on its own.
    fn first_bad<T: DeserializeOwned>(object: &serde_json::Value) -> Option<&str> {
        object.as_object()?.iter().find_map(|(k, v)| {
            let alone = serde_json::Value::Object([(k.clone(), v.clone())].into_iter().collect());
            fails::<T>(&alone).then_some(k.as_str())
        })
    }
    if !value.is_object() {
        return "the object".into();
    }
    if value.get("metadata").is_some_and(fails::<ObjectMeta>) {
        return "metadata".into();
    }
    if let Some(spec) = value.get("spec")
        && fails::<EtcdClusterSpec>(spec)
    {
        return match first_bad::<EtcdClusterSpec>(spec) {
            Some("pod") => match spec.get("pod").and_then(first_bad::<PodPolicy>) {
                Some(field) => format!("spec.pod.{field}"),
                None => "spec.pod".into(),
            },
            Some(field) => format!("spec.{field}"),
            None => "spec".into(),
        };
    }
    if value.get("status").is_some_and(fails::<EtcdClusterStatus>) {
        return "status".into();
    }
    "the object".into()
}

/// serde's message without the value it quotes (`invalid type: string "s3cr3t", expected
/// i32` becomes `invalid type: string, expected i32`): an object's values (etcdEnv, for
/// example) may be secrets, and none goes into a log line, an Event or a metric.
fn without_values(message: &str) -> String {
    let expected = message.find(", expected ").map_or("", |i| &message[i..]);
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix) {
            let kind = rest.split([' ', ',']).next().unwrap_or("value");
            return format!("{prefix}{kind}{expected}");
        }
    }
    for kept in ["missing field", "invalid length", "duplicate field"] {
        if message.starts_with(kept) {
            return message.to_string();
        }
    }
    if message.starts_with("unknown variant") {
        return format!("unknown variant{expected}");
    }
    format!("a value this operator cannot read{expected}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(spec: serde_json::Value, status: serde_json::Value) -> StoredCluster {
        StoredCluster::from_value(serde_json::json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u-1",
                "managedFields": [{"manager": "kubectl"}]},
            "spec": spec,
            "status": status,
        }))
    }

    /// Issue 15, item 3: an object our types reject decodes as `Undecodable`, naming the field
    /// and never the value; what CoreOS' operator wrote decodes.
    #[test]
    fn stored_clusters_never_fail_to_decode() {
        use serde_json::json;
        // CoreOS' status, each of its phases.
        for phase in ["", "Creating", "Running", "Failed"] {
            let s = stored(
                json!({"size": 3, "version": "3.2.13"}),
                json!({"phase": phase, "reason": "", "controlPaused": false, "size": 3,
                    "members": {"ready": ["a-0"], "unready": null}, "currentVersion": "3.2.13",
                    "targetVersion": "", "serviceName": "a-client", "clientPort": 2379,
                    "conditions": [{"type": "Available", "status": "True",
                        "lastUpdateTime": "2018-01-01T00:00:00Z"}]}),
            );
            let c = s.decoded().expect("CoreOS' status decodes");
            assert_eq!(c.spec.size, Some(3), "{phase}");
            assert!(c.metadata.managed_fields.is_none());
        }
        // A status this operator cannot read at all reads as none.
        let s = stored(
            json!({"size": 1}),
            json!({"size": "three", "clientPort": []}),
        );
        assert!(s.decoded().expect("decodes").status.is_none());

        for (spec, field, reason) in [
            (
                json!({"size": 3, "pod": {"affinity": {"podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3_000_000_000_i64,
                        "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}]}}}}),
                "spec.pod.affinity",
                "invalid value: integer, expected i32",
            ),
            (
                json!({"pod": {"etcdEnv": [{"name": "PASSWORD", "value": {"s3cr3t": 1}}]}}),
                "spec.pod.etcdEnv",
                "invalid type: map, expected a string",
            ),
            (
                json!({"size": "s3cr3t"}),
                "spec.size",
                "invalid type: string, expected i32",
            ),
            (
                json!("s3cr3t"),
                "spec",
                "invalid type: string, expected struct EtcdClusterSpec",
            ),
        ] {
            let s = stored(spec.clone(), json!({"phase": "Failed"}));
            let bad = s.decoded().expect_err("undecodable");
            assert_eq!(bad.field, field, "{spec}");
            assert_eq!(bad.reason, reason, "{spec}");
            assert!(!bad.to_string().contains("s3cr3t"), "{bad}");
            assert_eq!(s.meta().name.as_deref(), Some("a"));
            assert_eq!(s.meta().uid.as_deref(), Some("u-1"));
            assert!(s.meta().managed_fields.is_none());
        }
        let s: StoredCluster = serde_json::from_str(r#"{"metadata": {"name": "x"}, "spec": 1}"#)
            .expect("Deserialize never fails on JSON");
        assert!(s.decoded().is_err());
    }

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
}
