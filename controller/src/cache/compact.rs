//! The cached forms of the derived objects: what the operator reads of each, decoded straight
//! from the API server's JSON (the rest of an object is skipped while it is parsed, never
//! built). k8s-openapi's `Pod` is 2.4 KB before any of its strings; a cached pod keeps the few
//! fields the planner reads. Services and budgets keep their spec as compact JSON text, one
//! allocation, read back only to compare it with what the operator applies
//! ([`super::is_current`]). Claims keep their metadata alone.

use std::borrow::Cow;
use std::marker::PhantomData;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Serialize};

/// Prefix of the annotations the operator reads; cached objects keep no other annotation.
pub const OPERATOR_ANNOTATION_PREFIX: &str = "etcd.database.coreos.com/";

/// Drops from `meta` what no reconcile reads: managed fields (most of an object's size) and
/// annotations other than the operator's own.
pub fn trim_meta(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.retain(|k, _| k.starts_with(OPERATOR_ANNOTATION_PREFIX));
        if annotations.is_empty() {
            meta.annotations = None;
        }
    }
}

/// Implements [`Resource`] for a cached form, with the API coordinates of the full type.
macro_rules! resource_of {
    ($cached:ty, $full:ty) => {
        impl Resource for $cached {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::KIND.into()
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::GROUP.into()
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::VERSION.into()
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$full as k8s_openapi::Resource>::URL_PATH_SEGMENT.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// A member pod as the planner reads it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedPod {
    /// The pod's metadata (see [`trim_meta`]).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Its containers' names and images.
    #[serde(default)]
    pub spec: CachedPodSpec,
    /// Phase, IP, conditions and restart counts.
    #[serde(default)]
    pub status: CachedPodStatus,
}

resource_of!(CachedPod, k8s_openapi::api::core::v1::Pod);

/// The containers of a [`CachedPod`] and the node it is bound to.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodSpec {
    /// Names and images.
    #[serde(default)]
    pub containers: Vec<CachedContainer>,
    /// The node the pod is bound to (`spec.nodeName`), once scheduled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// The pod conditions its readiness waits for besides its containers'.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub readiness_gates: Vec<CachedReadinessGate>,
    /// Its volumes' names and the Secrets they mount.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<CachedVolume>,
}

/// A volume's name and the Secret it mounts, if it is a Secret volume.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedVolume {
    /// The volume's name.
    #[serde(default)]
    pub name: String,
    /// The Secret it mounts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<CachedSecretVolume>,
}

/// The Secret of a Secret volume.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedSecretVolume {
    /// The Secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_name: Option<String>,
}

/// A readiness gate's condition type.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedReadinessGate {
    /// The pod condition type.
    #[serde(default)]
    pub condition_type: String,
}

/// A container's name, image, command and arguments (an etcd member's flags say how it
/// speaks: [`crate::view::transport::MemberTransport::of_args`]).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedContainer {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// Its image, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Its command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub command: Vec<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
}

/// The status of a [`CachedPod`].
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedPodStatus {
    /// `Pending`, `Running`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Why the pod is in its phase (`Terminated` after a graceful node shutdown, `Evicted`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The pod's IP once it has one.
    #[serde(default, rename = "podIP", skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// Condition types and statuses (`Ready`/`True`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<CachedCondition>,
    /// Containers' restart counts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub container_statuses: Vec<CachedContainerStatus>,
}

/// A pod condition's type, status and when it last changed.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedCondition {
    /// `Ready`, `PodScheduled`, ...
    #[serde(default, rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    #[serde(default)]
    pub status: String,
    /// When the status last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// A container's name, restart count and when it started.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedContainerStatus {
    /// The container's name.
    #[serde(default)]
    pub name: String,
    /// How often the kubelet restarted it.
    #[serde(default)]
    pub restart_count: i32,
    /// Its current state's start, while it runs.
    #[serde(default)]
    pub state: CachedContainerState,
    /// Its previous run's start, after a restart.
    #[serde(default)]
    pub last_state: CachedContainerState,
}

/// When a container's run started (`state.running.startedAt` or `terminated.startedAt`).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedContainerState {
    /// The container runs, since then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<CachedStart>,
    /// The container ended; it had started then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<CachedStart>,
}

/// A start time.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CachedStart {
    /// When the run started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

impl CachedContainerStatus {
    /// The earliest start the kubelet still reports: this run's, or the previous run's.
    pub fn earliest_start(&self) -> Option<k8s_openapi::jiff::Timestamp> {
        [&self.state, &self.last_state]
            .into_iter()
            .flat_map(|s| [&s.running, &s.terminated])
            .filter_map(|run| run.as_ref()?.started_at.as_ref().map(|t| t.0))
            .min()
    }
}

impl CachedPod {
    /// Whether the pod's condition `type_` is `True`.
    pub fn condition_is_true(&self, type_: &str) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    }

    /// The value of the operator's annotation `key` (the cache keeps no other).
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    /// The status the kubelet reports of the container named `name`.
    pub fn container_status(&self, name: &str) -> Option<&CachedContainerStatus> {
        self.status
            .container_statuses
            .iter()
            .find(|c| c.name == name)
    }

    /// How the etcd member in the container named `name` speaks, from its flags.
    pub fn transport_of(&self, name: &str) -> Option<crate::view::transport::MemberTransport> {
        let container = self.spec.containers.iter().find(|c| c.name == name)?;
        crate::view::transport::MemberTransport::of_args(
            container
                .command
                .iter()
                .chain(&container.args)
                .map(String::as_str),
        )
    }

    /// The Secrets its member TLS volumes (peer, server) mount.
    pub fn tls_secrets(&self) -> Vec<String> {
        self.spec
            .volumes
            .iter()
            .filter(|v| {
                v.name == etcd_shared::names::PEER_TLS_VOLUME
                    || v.name == etcd_shared::names::SERVER_TLS_VOLUME
            })
            .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
            .collect()
    }

    /// The image of the container named `name`.
    pub fn image_of(&self, name: &str) -> Option<&str> {
        self.spec
            .containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.as_deref())
    }
}

/// A Service or disruption budget as the operator compares it with what it applies: metadata,
/// and the spec as compact JSON text (`K` names the kind).
#[derive(Debug, Deserialize, Serialize)]
#[serde(bound = "")]
pub struct CachedSpecObject<K> {
    /// The object's metadata (see [`trim_meta`]).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The spec, as JSON text; it serializes as the JSON value again.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "json_text")]
    pub spec: Option<Box<str>>,
    /// What a disruption budget's status says (empty for a Service); never written back.
    #[serde(default, skip_serializing)]
    pub status: CachedBudgetStatus,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

/// The part of a PodDisruptionBudget's status the planner reads.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CachedBudgetStatus {
    /// How many more pods a voluntary disruption may take now.
    #[serde(default)]
    pub disruptions_allowed: Option<i32>,
    /// The budget generation the disruption controller last computed it for.
    #[serde(default)]
    pub observed_generation: Option<i64>,
}

impl<K> Clone for CachedSpecObject<K> {
    fn clone(&self) -> Self {
        CachedSpecObject {
            metadata: self.metadata.clone(),
            spec: self.spec.clone(),
            status: self.status,
            kind: PhantomData,
        }
    }
}

impl CachedPdb {
    /// How many more pods a voluntary disruption may take, when the disruption controller has
    /// computed it for the current spec (`None`: not yet, or no such controller runs).
    pub fn disruptions_allowed(&self) -> Option<i32> {
        let current = self.status.observed_generation.is_some()
            && self.status.observed_generation >= self.metadata.generation;
        self.status.disruptions_allowed.filter(|_| current)
    }
}

/// (De)serializes a JSON value kept as its compact text.
mod json_text {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<str>>, D::Error> {
        Ok(Option::<serde_json::Value>::deserialize(d)?.map(|v| v.to_string().into_boxed_str()))
    }

    pub fn serialize<S: Serializer>(text: &Option<Box<str>>, s: S) -> Result<S::Ok, S::Error> {
        let value = text
            .as_deref()
            .map(serde_json::from_str::<serde_json::Value>)
            .transpose()
            .map_err(serde::ser::Error::custom)?;
        value.serialize(s)
    }
}

/// A cached Service.
pub type CachedService = CachedSpecObject<Service>;
/// A cached PodDisruptionBudget.
pub type CachedPdb = CachedSpecObject<PodDisruptionBudget>;

resource_of!(CachedService, Service);
resource_of!(CachedPdb, PodDisruptionBudget);

/// A data claim: its metadata alone (the operator reads its labels and deletion).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct CachedClaim {
    /// The claim's metadata (see [`trim_meta`]).
    #[serde(default)]
    pub metadata: ObjectMeta,
}

resource_of!(CachedClaim, PersistentVolumeClaim);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "demo-0",
                "namespace": "ns",
                "labels": {"app.kubernetes.io/name": "etcd"},
                "annotations": {
                    "etcd.database.coreos.com/created-on-version": "3.6.16",
                    "kubectl.kubernetes.io/last-applied-configuration": "{...}"
                },
                "managedFields": [{"manager": "etcd-operator"}]
            },
            "spec": {
                "hostname": "demo-0",
                "containers": [{
                    "name": "etcd",
                    "image": "quay.io/coreos/etcd:v3.6.16",
                    "args": ["--name=demo-0"],
                    "env": [{"name": "X", "value": "y"}]
                }],
                "volumes": [{"name": "data", "emptyDir": {}}]
            },
            "status": {
                "phase": "Running",
                "podIP": "10.0.0.1",
                "conditions": [
                    {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T00:00:00Z"},
                    {"type": "PodScheduled", "status": "True"}
                ],
                "containerStatuses": [{
                    "name": "etcd",
                    "image": "quay.io/coreos/etcd:v3.6.16",
                    "imageID": "x",
                    "ready": true,
                    "restartCount": 2,
                    "state": {"running": {"startedAt": "2026-12-05T00:00:00Z"}}
                }]
            }
        })
    }

    #[test]
    fn cached_pods_keep_what_the_planner_reads_and_nothing_else() {
        let mut pod: CachedPod = serde_json::from_value(pod_json()).expect("a pod decodes");
        trim_meta(&mut pod.metadata);
        assert_eq!(
            pod.spec.containers,
            vec![CachedContainer {
                name: "etcd".into(),
                image: Some("quay.io/coreos/etcd:v3.6.16".into()),
                command: Vec::new(),
                args: vec!["--name=demo-0".into()],
            }]
        );
        assert_eq!(pod.status.phase.as_deref(), Some("Running"));
        assert_eq!(pod.status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert!(pod.condition_is_true("Ready"));
        assert!(!pod.condition_is_true("ContainersReady"));
        assert_eq!(pod.status.container_statuses[0].restart_count, 2);
        assert_eq!(
            pod.status.container_statuses[0]
                .earliest_start()
                .map(|t| t.to_string()),
            Some("2026-12-05T00:00:00Z".to_string())
        );
        assert_eq!(pod.metadata.managed_fields, None);
        let annotations = pod.metadata.annotations.expect("ours are kept");
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["etcd.database.coreos.com/created-on-version"]
        );
    }

    #[test]
    fn a_pod_without_spec_or_status_decodes() {
        let pod: CachedPod =
            serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("decodes");
        assert_eq!(pod.status.phase, None);
        assert!(pod.spec.containers.is_empty());
    }

    #[test]
    fn cached_services_keep_their_spec_and_serialize_it_back() {
        let spec = json!({"selector": {"app": "etcd"}, "ports": [{"port": 2379, "protocol": "TCP"}], "clusterIP": "None"});
        let text =
            json!({"metadata": {"name": "demo"}, "spec": spec, "status": {"loadBalancer": {}}})
                .to_string();
        let service: CachedService = serde_json::from_str(&text).expect("a service decodes");
        let back = serde_json::to_value(&service).expect("serializes");
        assert_eq!(back["spec"], spec);
        assert_eq!(back.get("status"), None);
        assert_eq!(
            <CachedService as Resource>::plural(&()),
            <Service as k8s_openapi::Resource>::URL_PATH_SEGMENT
        );
        assert_eq!(<CachedPdb as Resource>::group(&()), "policy");
    }

    #[test]
    fn other_annotations_go_and_an_empty_map_is_dropped() {
        let mut meta = ObjectMeta {
            annotations: Some([("other/x".to_string(), "1".to_string())].into()),
            ..Default::default()
        };
        trim_meta(&mut meta);
        assert_eq!(meta.annotations, None);
    }
}
