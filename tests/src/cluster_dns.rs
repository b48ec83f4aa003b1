//! Cluster DNS for a real node (issue 25): CoreDNS from `hack/build-images.sh`'s image as a
//! Deployment in `kube-system` behind the `kube-dns` Service, as kubeadm installs it, serving
//! the `cluster.local` zone from the API server (Services, the members' `MEMBER.NAME.NS.svc`
//! names of a headless Service, pods). The node's kubelet gives pods its ClusterIP
//! ([`crate::real_node::RealNodeOptions::cluster_dns`]).

use std::net::Ipv4Addr;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::poll_until;

/// The `kube-dns` Service's ClusterIP (in the harness's `10.96.0.0/16`).
pub const CLUSTER_DNS_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

/// The CoreDNS image `hack/build-images.sh` builds for `version` (`COREDNS_VERSION`).
pub fn image(version: &str) -> String {
    format!("registry.k8s.io/coredns/coredns:v{version}")
}

/// The Corefile: the cluster zone (answers for names outside it are refused: this network has
/// no upstream).
const COREFILE: &str = ".:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loadbalance
}
";

/// Creates (server-side apply, field manager `etcd-tests`) CoreDNS's ServiceAccount, RBAC,
/// Corefile, Deployment and `kube-dns` Service, and waits until its pod is ready.
pub async fn deploy(client: &Client, image: &str, wait: Duration) -> anyhow::Result<()> {
    let ns = "kube-system";
    let params = PatchParams::apply("etcd-tests").force();
    let labels = json!({"k8s-app": "kube-dns"});
    Api::<ServiceAccount>::namespaced(client.clone(), ns)
        .patch(
            "coredns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "coredns"}
            })),
        )
        .await
        .context("CoreDNS ServiceAccount")?;
    Api::<ClusterRole>::all(client.clone())
        .patch(
            "system:coredns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "system:coredns"},
                "rules": [
                    {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                     "verbs": ["list", "watch"]},
                    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                     "verbs": ["list", "watch"]}
                ]
            })),
        )
        .await
        .context("CoreDNS ClusterRole")?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "system:coredns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "system:coredns"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "system:coredns"},
                "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}]
            })),
        )
        .await
        .context("CoreDNS ClusterRoleBinding")?;
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "coredns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "coredns"},
                "data": {"Corefile": COREFILE}
            })),
        )
        .await
        .context("CoreDNS ConfigMap")?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .patch(
            "coredns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "coredns", "labels": labels},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "serviceAccountName": "coredns",
                            "dnsPolicy": "Default",
                            "priorityClassName": "system-cluster-critical",
                            // Port 53 as 65532, without a capability.
                            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"},
                                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start",
                                    "value": "0"}]},
                            "containers": [{
                                "name": "coredns",
                                "image": image,
                                "imagePullPolicy": "Never",
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"}
                                ],
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 1},
                                "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                    "periodSeconds": 10},
                                "resources": {"requests": {"cpu": "10m", "memory": "32Mi"},
                                    "limits": {"memory": "128Mi"}},
                                "securityContext": {"readOnlyRootFilesystem": true,
                                    "allowPrivilegeEscalation": false,
                                    "capabilities": {"drop": ["ALL"]}},
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                    "readOnly": true}]
                            }],
                            "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]
                        }
                    }
                }
            })),
        )
        .await
        .context("CoreDNS Deployment")?;
    Api::<Service>::namespaced(client.clone(), ns)
        .patch(
            "kube-dns",
            &params,
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "kube-dns", "labels": labels},
                "spec": {
                    "clusterIP": CLUSTER_DNS_IP.to_string(),
                    "selector": labels,
                    "ports": [
                        {"name": "dns", "port": 53, "protocol": "UDP"},
                        {"name": "dns-tcp", "port": 53, "protocol": "TCP"}
                    ]
                }
            })),
        )
        .await
        .context("kube-dns Service")?;
    poll_until("CoreDNS ready", wait, || async {
        let d = deployments.get("coredns").await?;
        let ready = d
            .status
            .as_ref()
            .and_then(|s| s.ready_replicas)
            .unwrap_or(0);
        Ok::<_, kube::Error>((ready >= 1).then_some(()))
    })
    .await?;
    Ok(())
}
