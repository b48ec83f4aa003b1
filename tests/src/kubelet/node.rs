//! The kubelet's Node: registration (Ready, capacity, addresses, `kubernetes.io/hostname`),
//! its status (conditions as a kubelet posts them), the heartbeat Lease in `kube-node-lease`
//! (kept fresh by [`super::heartbeat`]), and the binder that stands in for kube-scheduler on
//! a single node by binding pending pods to it through `pods/binding`.
//!
//! The binder honours `nodeSelector` (a pod whose selector does not match the node's labels
//! stays Pending with `PodScheduled=False`, reason `Unschedulable`) and binds only pods for the
//! default scheduler. Affinity, anti-affinity, taints, topology spread and resource requests
//! are ignored: there is one node and it takes every pod (a real scheduler would refuse, for
//! example, a second member of a cluster with required anti-affinity on the hostname). Suites
//! with several nodes turn it off and run the real kube-scheduler (see [`super::nodes`]).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{
    Binding, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec, NodeStatus,
    NodeSystemInfo, ObjectReference, Pod,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt as _};

use super::log::KubeletLog;

/// Namespace of the node heartbeat leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
/// Default lease duration (what a kubelet uses by default, `nodeLeaseDurationSeconds`).
pub const LEASE_DURATION_SECONDS: i32 = 40;
/// Default lease renew interval (a kubelet renews every quarter of the duration).
pub const LEASE_RENEW_INTERVAL: Duration = Duration::from_secs(10);
/// Default `nodeStatusReportFrequency`: how often the status is posted when nothing changed.
pub const NODE_STATUS_REPORT_FREQUENCY: Duration = Duration::from_secs(300);
/// The condition types the kubelet owns, with the status it reports for each.
pub const CONDITIONS: [(&str, &str); 4] = [
    ("MemoryPressure", "False"),
    ("DiskPressure", "False"),
    ("PIDPressure", "False"),
    ("Ready", "True"),
];
/// The scheduler name whose pods the binder takes.
pub const DEFAULT_SCHEDULER: &str = "default-scheduler";

/// How the Node is registered.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Node name (also its `kubernetes.io/hostname` label).
    pub name: String,
    /// Extra labels.
    pub labels: BTreeMap<String, String>,
    /// `InternalIP`.
    pub ip: Ipv4Addr,
    /// Capacity and allocatable (e.g. `cpu`, `memory`, `pods`).
    pub capacity: BTreeMap<String, Quantity>,
    /// Reported `kubeletVersion`.
    pub kubelet_version: String,
    /// `spec.podCIDR`.
    pub pod_cidr: String,
}

impl NodeConfig {
    /// Every label of the node: the well-known ones, then [`Self::labels`].
    pub fn all_labels(&self) -> BTreeMap<String, String> {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            other => other,
        };
        let mut labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), self.name.clone()),
            ("kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("kubernetes.io/arch".to_owned(), arch.to_owned()),
            ("beta.kubernetes.io/os".to_owned(), "linux".to_owned()),
            ("beta.kubernetes.io/arch".to_owned(), arch.to_owned()),
        ]);
        labels.extend(self.labels.clone());
        labels
    }

    /// The status a kubelet posts now: every condition with a fresh heartbeat; the transition
    /// time of a condition whose status is the same in `previous` (the Node as last seen) is
    /// kept.
    pub fn status(&self, previous: &[NodeCondition]) -> NodeStatus {
        let now = Time(Timestamp::now());
        let cond = |type_: &str, status: &str, reason: &str, message: &str| NodeCondition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: Some(reason.to_owned()),
            message: Some(message.to_owned()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(
                previous
                    .iter()
                    .find(|c| c.type_ == type_ && c.status == status)
                    .and_then(|c| c.last_transition_time.clone())
                    .unwrap_or_else(|| now.clone()),
            ),
        };
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        NodeStatus {
            capacity: Some(self.capacity.clone()),
            allocatable: Some(self.capacity.clone()),
            conditions: Some(vec![
                cond(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                cond(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                cond(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                cond(
                    "Ready",
                    "True",
                    "KubeletReady",
                    "etcd-tests kubelet is posting ready status",
                ),
            ]),
            addresses: Some(vec![
                NodeAddress {
                    type_: "InternalIP".into(),
                    address: self.ip.to_string(),
                },
                NodeAddress {
                    type_: "Hostname".into(),
                    address: self.name.clone(),
                },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints::default()),
            node_info: Some(NodeSystemInfo {
                architecture: std::env::consts::ARCH.to_owned(),
                boot_id: String::new(),
                container_runtime_version: "etcd-tests://processes".into(),
                kernel_version: kernel,
                kube_proxy_version: String::new(),
                kubelet_version: self.kubelet_version.clone(),
                machine_id: String::new(),
                operating_system: "linux".into(),
                os_image: "etcd-tests process kubelet".into(),
                system_uuid: String::new(),
                swap: None,
            }),
            ..NodeStatus::default()
        }
    }
}

/// Creates (or takes over) the Node and writes its status. Returns the Node.
pub async fn register(client: &kube::Client, config: &NodeConfig) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            labels: Some(config.all_labels()),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(config.pod_cidr.clone()),
            pod_cidrs: Some(vec![config.pod_cidr.clone()]),
            ..NodeSpec::default()
        }),
        status: Some(config.status(&[])),
    };
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = serde_json::json!({ "metadata": { "labels": config.all_labels() } });
            nodes
                .patch(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        Err(e) => return Err(e),
    }
    post_status(client, config, &[]).await
}

/// Posts the node status (`nodes/status`); `previous` are the conditions last seen (see
/// [`NodeConfig::status`]). Returns the Node.
pub async fn post_status(
    client: &kube::Client,
    config: &NodeConfig,
    previous: &[NodeCondition],
) -> Result<Node, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = serde_json::json!({ "status": config.status(previous) });
    nodes
        .patch_status(&config.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// Whether `node`'s conditions differ from what the kubelet reports (see [`CONDITIONS`]): a
/// condition is missing or has another status (e.g. `Ready` set `Unknown` by the node
/// lifecycle controller while the kubelet was silent).
pub fn status_differs(node: &Node) -> bool {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    CONDITIONS.iter().any(|(type_, status)| {
        !conditions
            .iter()
            .any(|c| c.type_ == *type_ && c.status == *status)
    })
}

/// The status of `node`'s `Ready` condition (`None` without one).
pub fn ready_status(node: &Node) -> Option<&str> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.status.as_str())
}

/// Creates or renews the node's Lease, `duration_seconds` long.
pub async fn renew_lease(
    client: &kube::Client,
    node: &Node,
    duration_seconds: i32,
) -> Result<(), kube::Error> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);
    let name = node.name_any();
    let now = MicroTime(Timestamp::now());
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(LEASE_NAMESPACE.into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: name.clone(),
                uid: node.metadata.uid.clone().unwrap_or_default(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(name.clone()),
            lease_duration_seconds: Some(duration_seconds),
            renew_time: Some(now.clone()),
            ..LeaseSpec::default()
        }),
    };
    match leases.create(&PostParams::default(), &lease).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let patch = serde_json::json!({ "spec": {
                "holderIdentity": name,
                "leaseDurationSeconds": duration_seconds,
                "renewTime": now,
            }});
            leases
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
        }
        Err(e) => Err(e),
    }
}

/// Whether `pod`'s `nodeSelector` matches `labels`.
pub fn selector_matches(pod: &Pod, labels: &BTreeMap<String, String>) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_selector.as_ref())
        .is_none_or(|selector| selector.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

/// Binds pending pods to `node` as they appear, forever.
pub async fn bind_pending(client: kube::Client, config: NodeConfig, log: KubeletLog) {
    let pods: Api<Pod> = Api::all(client.clone());
    let labels = config.all_labels();
    let stream = watcher::watcher(pods, watcher::Config::default().fields("spec.nodeName="))
        .default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let pod = match event {
            Ok(Event::Apply(pod) | Event::InitApply(pod)) => pod,
            Ok(_) => continue,
            Err(e) => {
                log.line(format_args!("binder watch: {e}"));
                continue;
            }
        };
        let scheduler = pod
            .spec
            .as_ref()
            .and_then(|s| s.scheduler_name.as_deref())
            .unwrap_or(DEFAULT_SCHEDULER);
        if pod.metadata.deletion_timestamp.is_some() || scheduler != DEFAULT_SCHEDULER {
            continue;
        }
        let (Some(ns), name) = (pod.namespace(), pod.name_any()) else {
            continue;
        };
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        if !selector_matches(&pod, &labels) {
            let already = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                    })
                });
            if !already {
                let patch = serde_json::json!({ "status": { "conditions": [{
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": format!("0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector (node {} has labels {:?}).", config.name, labels),
                    "lastTransitionTime": Time(Timestamp::now()),
                }]}});
                if let Err(e) = api
                    .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
                    .await
                {
                    log.line(format_args!("marking {ns}/{name} unschedulable: {e}"));
                }
            }
            continue;
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.clone()),
                uid: pod.metadata.uid.clone(),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(config.name.clone()),
                ..ObjectReference::default()
            },
        };
        match api
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                &name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            Ok(_) => log.line(format_args!("bound {ns}/{name} to {}", config.name)),
            // Already bound (409) or gone (404): nothing to do.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => log.line(format_args!("binding {ns}/{name}: {e}")),
        }
    }
}
