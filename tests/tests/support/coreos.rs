//! A cluster as CoreOS' operator made and left it (its last source: `pkg/util/k8sutil`'s
//! `newEtcdPod`, `CreatePeerService`, `CreateClientService`; `pod_util.go`'s `newEtcdProbe`):
//! bare member pods named `NAME-<10 random characters>`, labels `app=etcd`,
//! `etcd_cluster=NAME`, `etcd_node=MEMBER`, annotation `etcd.version`, `hostname`/`subdomain`,
//! `restartPolicy: Never`, a controller reference to the EtcdCluster, CoreOS' command line and
//! TLS layout; the Services `NAME` and `NAME-client` with CoreOS' selector; bootstrapped as
//! CoreOS did (a seed with `new`, then a MemberAdd and a pod with `existing` per member, each
//! Ready before the next); and CoreOS' status on the EtcdCluster.
//!
//! Where the process kubelet differs from a node, so do the pods: no `check-dns` init container
//! (it needs a busybox image; names resolve through the harness's hosts file from the start),
//! etcd listens on the pod IP instead of `0.0.0.0` (the process kubelet's pods share one
//! network namespace), and the probes run etcdctl directly against the member's name (no shell
//! in the process kubelet's images) with `ETCDCTL_API=3` in the container's environment.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

use etcd_shared::EtcdCluster;
use etcd_tests::suite::TestContext;

use super::{Access, WAIT, connect_with};

/// The alphabet of Kubernetes' `utilrand.String`, which CoreOS' member names end in.
const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// Where CoreOS' pods mount the TLS secrets.
const PEER_TLS_DIR: &str = "/etc/etcdtls/member/peer-tls";
const SERVER_TLS_DIR: &str = "/etc/etcdtls/member/server-tls";
const OPERATOR_TLS_DIR: &str = "/etc/etcdtls/operator/etcd-tls";

/// A member name as CoreOS' `UniqueMemberName` makes one: `NAME-` and 10 random characters.
pub fn member_name(cluster: &str) -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut seed = hasher.finish();
    let suffix: String = (0..10)
        .map(|_| {
            let c = ALPHANUMS[(seed % ALPHANUMS.len() as u64) as usize] as char;
            seed /= ALPHANUMS.len() as u64;
            if seed == 0 {
                seed = RandomState::new().build_hasher().finish();
            }
            c
        })
        .collect();
    format!("{cluster}-{suffix}")
}

/// The CoreOS-made cluster of an EtcdCluster.
pub struct CoreosCluster {
    /// The cluster (and peer Service) name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// The member (pod) names, the seed first.
    pub members: Vec<String>,
    /// How clients reach the members.
    pub access: Access,
    /// Whether peers and clients use TLS (`spec.TLS.static`).
    pub tls: bool,
}

impl CoreosCluster {
    fn host(&self, member: &str) -> String {
        format!("{member}.{}.{}.svc", self.name, self.namespace)
    }

    fn peer_url(&self, member: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:2380", self.host(member))
    }

    fn client_url(&self, member: &str) -> String {
        format!("{}://{}:2379", self.access.scheme(), self.host(member))
    }

    /// The client URLs of the members, by pod IP.
    pub async fn endpoints(&self, pods: &Api<Pod>) -> anyhow::Result<Vec<String>> {
        let mut urls = Vec::new();
        for member in &self.members {
            if let Some(ip) = pods.get_opt(member).await?.and_then(|p| p.status?.pod_ip) {
                urls.push(format!("{}://{ip}:2379", self.access.scheme()));
            }
        }
        Ok(urls)
    }
}

/// CoreOS' two Services of `cluster` (owned by it, selector `app=etcd, etcd_cluster=NAME`).
fn services(cluster: &EtcdCluster) -> anyhow::Result<[Service; 2]> {
    let name = cluster.name_any();
    let owner = owner(cluster)?;
    let labels = json!({"app": "etcd", "etcd_cluster": name});
    let service = |svc_name: String, cluster_ip: Option<&str>, ports: Value| {
        let mut spec = json!({"ports": ports, "selector": labels});
        if let Some(ip) = cluster_ip {
            spec["clusterIP"] = json!(ip);
        }
        serde_json::from_value::<Service>(json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {
                "name": svc_name,
                "labels": labels,
                "annotations": {"service.alpha.kubernetes.io/tolerate-unready-endpoints": "true"},
                "ownerReferences": [owner],
            },
            "spec": spec,
        }))
    };
    let client_port =
        json!({"name": "client", "port": 2379, "targetPort": 2379, "protocol": "TCP"});
    let peer_port = json!({"name": "peer", "port": 2380, "targetPort": 2380, "protocol": "TCP"});
    Ok([
        service(name.clone(), Some("None"), json!([client_port, peer_port]))?,
        service(format!("{name}-client"), None, json!([client_port]))?,
    ])
}

/// CoreOS' owner reference to `cluster` (`addOwnerRefToObject` with `AsOwner`).
fn owner(cluster: &EtcdCluster) -> anyhow::Result<Value> {
    Ok(json!({
        "apiVersion": "etcd.database.coreos.com/v1beta2",
        "kind": "EtcdCluster",
        "name": cluster.name_any(),
        "uid": cluster.meta().uid.clone().context("the cluster has no uid")?,
        "controller": true,
        "blockOwnerDeletion": true,
    }))
}

/// A member pod as CoreOS' `newEtcdPod` makes it (with the deviations of the module docs).
fn member_pod(
    cluster: &EtcdCluster,
    coreos: &CoreosCluster,
    member: &str,
    initial_cluster: &[String],
    state: &str,
    token: &str,
    version: &str,
) -> anyhow::Result<Pod> {
    let scheme_peer = if coreos.tls { "https" } else { "http" };
    let scheme_client = coreos.access.scheme();
    let mut command = vec![
        "/usr/local/bin/etcd".to_string(),
        "--data-dir=/var/etcd/data".into(),
        format!("--name={member}"),
        format!("--initial-advertise-peer-urls={}", coreos.peer_url(member)),
        format!("--listen-peer-urls={scheme_peer}://$(POD_IP):2380"),
        format!("--listen-client-urls={scheme_client}://$(POD_IP):2379"),
        format!("--advertise-client-urls={}", coreos.client_url(member)),
        format!("--initial-cluster={}", initial_cluster.join(",")),
        format!("--initial-cluster-state={state}"),
        "--strict-reconfig-check=true".into(),
    ];
    // CoreOS' last source adds a metrics listener, a flag etcd has from 3.3 on.
    if !version.starts_with("3.2.") {
        command.push("--listen-metrics-urls=http://$(POD_IP):2381".into());
    }
    let mut mounts = vec![json!({"name": "etcd-data", "mountPath": "/var/etcd"})];
    let mut volumes = vec![json!({"name": "etcd-data", "emptyDir": {}})];
    let tls = cluster
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.static_tls.as_ref())
        .filter(|_| coreos.tls);
    let mut probe = vec![
        "etcdctl".to_string(),
        format!("--endpoints={}", coreos.client_url(member)),
    ];
    if let Some(tls) = tls {
        let member_tls = tls.member.as_ref().context("spec.TLS.static.member")?;
        command.extend([
            "--peer-client-cert-auth=true".into(),
            format!("--peer-trusted-ca-file={PEER_TLS_DIR}/peer-ca.crt"),
            format!("--peer-cert-file={PEER_TLS_DIR}/peer.crt"),
            format!("--peer-key-file={PEER_TLS_DIR}/peer.key"),
            "--client-cert-auth=true".into(),
            format!("--trusted-ca-file={SERVER_TLS_DIR}/server-ca.crt"),
            format!("--cert-file={SERVER_TLS_DIR}/server.crt"),
            format!("--key-file={SERVER_TLS_DIR}/server.key"),
        ]);
        mounts.extend([
            json!({"name": "member-peer-tls", "mountPath": PEER_TLS_DIR}),
            json!({"name": "member-server-tls", "mountPath": SERVER_TLS_DIR}),
            json!({"name": "etcd-client-tls", "mountPath": OPERATOR_TLS_DIR}),
        ]);
        volumes.extend([
            json!({"name": "member-peer-tls", "secret": {"secretName": member_tls.peer_secret}}),
            json!({"name": "member-server-tls", "secret": {"secretName": member_tls.server_secret}}),
            json!({"name": "etcd-client-tls", "secret": {"secretName": tls.operator_secret}}),
        ]);
        probe.extend([
            format!("--cert={OPERATOR_TLS_DIR}/etcd-client.crt"),
            format!("--key={OPERATOR_TLS_DIR}/etcd-client.key"),
            format!("--cacert={OPERATOR_TLS_DIR}/etcd-client-ca.crt"),
        ]);
    }
    if state == "new" {
        command.push(format!("--initial-cluster-token={token}"));
    }
    probe.extend(["endpoint".into(), "status".into()]);
    let probe_with = |initial: i32, timeout: i32, period: i32| {
        json!({"exec": {"command": probe}, "initialDelaySeconds": initial,
            "timeoutSeconds": timeout, "periodSeconds": period, "failureThreshold": 3})
    };
    let repository = cluster
        .spec
        .repository
        .clone()
        .unwrap_or_else(|| "quay.io/coreos/etcd".into());
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": member,
            "labels": {"app": "etcd", "etcd_node": member, "etcd_cluster": coreos.name},
            "annotations": {"etcd.version": version},
            "ownerReferences": [owner(cluster)?],
        },
        "spec": {
            "containers": [{
                "name": "etcd",
                "image": format!("{repository}:v{version}"),
                "command": command,
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "ETCDCTL_API", "value": "3"},
                ],
                "ports": [
                    {"name": "server", "containerPort": 2380, "protocol": "TCP"},
                    {"name": "client", "containerPort": 2379, "protocol": "TCP"},
                ],
                "volumeMounts": mounts,
                "livenessProbe": probe_with(10, 10, 60),
                "readinessProbe": probe_with(1, 5, 5),
            }],
            "restartPolicy": "Never",
            "volumes": volumes,
            "hostname": member,
            "subdomain": coreos.name,
            "automountServiceAccountToken": false,
        },
    }))?)
}

async fn until_ready(pods: &Api<Pod>, name: &str) -> anyhow::Result<()> {
    etcd_tests::poll_until(&format!("CoreOS member {name} Ready"), WAIT, || async {
        let pod = pods.get_opt(name).await?;
        let ready = pod
            .and_then(|p| p.status?.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        anyhow::Ok(ready.then_some(()))
    })
    .await?;
    Ok(())
}

/// Makes `size` members of `cluster` at `version` as CoreOS' operator did, with its Services,
/// each Ready before the next; `access` is how the test (and CoreOS' operator) reaches them.
pub async fn make(
    ctx: &TestContext,
    cluster: &EtcdCluster,
    size: usize,
    version: &str,
    access: Access,
) -> anyhow::Result<CoreosCluster> {
    let name = cluster.name_any();
    let services_api: Api<Service> = ctx.api();
    for service in services(cluster)? {
        services_api
            .create(&PostParams::default(), &service)
            .await?;
    }
    let tls = matches!(access, Access::Tls { .. });
    let mut coreos = CoreosCluster {
        name: name.clone(),
        namespace: ctx.ns().to_string(),
        members: Vec::new(),
        access,
        tls,
    };
    let pods: Api<Pod> = ctx.api();
    let token = format!("{name}-coreos-{}", member_name("t"));
    for i in 0..size {
        let member = member_name(&name);
        let mut initial: Vec<String> = coreos
            .members
            .iter()
            .map(|m| format!("{m}={}", coreos.peer_url(m)))
            .collect();
        initial.push(format!("{member}={}", coreos.peer_url(&member)));
        let state = if i == 0 {
            "new"
        } else {
            // CoreOS' operator added the member through the API, then made its pod; with
            // --strict-reconfig-check etcd refuses the add until the last member has been
            // connected a while ("unhealthy cluster"), and CoreOS tried again later.
            let endpoints = coreos.endpoints(&pods).await?;
            let peer_url = coreos.peer_url(&member);
            etcd_tests::poll_until(&format!("etcd to take member {member}"), WAIT, || async {
                let mut client = connect_with(&endpoints, &coreos.access).await?;
                match client.member_add([peer_url.clone()], None).await {
                    Ok(_) => anyhow::Ok(Some(())),
                    Err(e) if e.to_string().contains("unhealthy cluster") => Ok(None),
                    Err(e) => Err(e).with_context(|| format!("adding member {member}")),
                }
            })
            .await?;
            "existing"
        };
        let pod = member_pod(cluster, &coreos, &member, &initial, state, &token, version)?;
        pods.create(&PostParams::default(), &pod).await?;
        until_ready(&pods, &member).await?;
        coreos.members.push(member);
    }
    Ok(coreos)
}

/// The status CoreOS' operator wrote for a running cluster of `members` at `version`: with its
/// own CRD (no status subresource) in the object itself, else through `/status`.
pub async fn write_status(
    api: &Api<EtcdCluster>,
    name: &str,
    members: &[String],
    version: &str,
    status_subresource: bool,
) -> anyhow::Result<()> {
    let now = "2024-05-01T10:00:00Z";
    let status = json!({
        "phase": "Running",
        "controlPaused": false,
        "conditions": [{"type": "Available", "status": "True", "lastUpdateTime": now,
            "lastTransitionTime": now}],
        "size": members.len(),
        "serviceName": format!("{name}-client"),
        "clientPort": 2379,
        "members": {"ready": members},
        "currentVersion": version,
        "targetVersion": "",
    });
    let patch = Patch::Merge(json!({"status": status}));
    if status_subresource {
        api.patch_status(name, &PatchParams::default(), &patch)
            .await?;
    } else {
        api.patch(name, &PatchParams::default(), &patch).await?;
    }
    Ok(())
}

/// How long the samplers of a take-over wait between two samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
