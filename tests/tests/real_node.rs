//! A real node (issue 25, item 2): the pinned kubelet on containerd 2.x and runc runs a pod of
//! this repository's etcd image, as a node enforces it: the image's user is replaced by the
//! pod's (65532, read from `/proc`), the root filesystem is read-only, the memory limit is a
//! cgroup limit, Pod Security `restricted` admits it, `kubectl logs` reads it through the API
//! server, and deleting the pod stops its process. Then the controller's image in a pod finds
//! the API server as a pod on a cluster does: the `kubernetes` Service's ClusterIP through
//! kube-proxy, its ServiceAccount's token, the cluster CA.
//!
//! Run: `hack/build-images.sh && cargo test -p etcd-tests --test real_node` (needs
//! `hack/build-tools.sh` with the node's tools, Debian's runc, root).

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};

use etcd_tests::control_plane::ControlPlaneOptions;
use etcd_tests::kubelet::netns::NODE_IP;
use etcd_tests::poll_until;
use etcd_tests::real_node::{RealNode, RealNodeOptions, memory_cgroup, proc_status, process_in};
use etcd_tests::suite::{Suite, TestContext};

const NODE: &str = "real-node";
const WAIT: Duration = Duration::from_secs(90);

fn main() -> std::process::ExitCode {
    Suite::new()
        .with_pod_network()
        .options(ControlPlaneOptions {
            // The `kubernetes` Service's endpoint must be reachable from pods: the pod
            // network's node IP, not loopback.
            extra_apiserver_args: vec![
                "--bind-address=0.0.0.0".into(),
                format!("--advertise-address={NODE_IP}"),
                // ... and published (the harness turns the reconciler off for loopback).
                "--endpoint-reconciler-type=lease".into(),
            ],
            ..ControlPlaneOptions::default()
        })
        .run(etcd_tests::tests![
            our_images_run_on_a_real_node_as_their_pods_say
        ])
}

/// A file of `pid`'s memory cgroup (v1).
fn memory_cgroup_file(pid: u32, file: &str) -> anyhow::Result<String> {
    Ok(std::fs::read_to_string(memory_cgroup(pid)?.join(file))?
        .trim()
        .to_string())
}

async fn our_images_run_on_a_real_node_as_their_pods_say(ctx: TestContext) -> anyhow::Result<()> {
    let tools = ctx.control_plane().tools();
    let version = tools.versions().apiserver_etcd.clone();
    let started = Instant::now();
    let node = RealNode::start(
        ctx.control_plane(),
        RealNodeOptions::new(NODE, tools, &[&format!("etcd-{version}"), "controller"])?,
    )
    .await?;
    let node_ready = started.elapsed();

    // Pod Security `restricted` enforced: the pod passes it, as the operator's members do.
    let namespaces: Api<Namespace> = Api::all(ctx.client());
    let labels = serde_json::json!({ "metadata": { "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    namespaces
        .patch(ctx.ns(), &PatchParams::default(), &Patch::Merge(&labels))
        .await?;

    // The image runs as root (as upstream's); the pod says 65532.
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "etcd-on-a-real-node"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": true,
                "fsGroup": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "etcd",
                "image": format!("quay.io/coreos/etcd:v{version}"),
                "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/etcd", "--name=real", "--data-dir=/var/lib/etcd/data",
                    "--listen-client-urls=http://0.0.0.0:2379",
                    "--advertise-client-urls=http://127.0.0.1:2379"],
                "securityContext": {"readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"memory": "128Mi", "cpu": "500m"},
                    "requests": {"memory": "64Mi", "cpu": "100m"}},
                "readinessProbe": {"httpGet": {"path": "/health", "port": 2379},
                    "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}]
            }],
            "volumes": [{"name": "data", "emptyDir": {}}]
        }
    }))?;
    let pods: Api<Pod> = ctx.api();
    let created = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    let result = async {
        let ready = poll_until("the pod Ready on the real node", WAIT, || async {
            let pod = pods.get("etcd-on-a-real-node").await?;
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            Ok::<_, kube::Error>(ready.then_some(pod))
        })
        .await?;
        let to_ready = created.elapsed();
        ensure!(
            ready.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE),
            "not on the real node"
        );

        // The container's process, as the kernel sees it.
        let pid = process_in(node.cgroup(), "--data-dir=/var/lib/etcd/data")
            .context("no etcd process in the node's cgroups")?;
        let uid = proc_status(pid, "Uid")?;
        ensure!(uid == "65532\t65532\t65532\t65532", "etcd runs as {uid}");
        let limit: u64 = memory_cgroup_file(pid, "memory.limit_in_bytes")?.parse()?;
        ensure!(limit == 128 * 1024 * 1024, "memory limit {limit}");
        let usage: u64 = memory_cgroup_file(pid, "memory.usage_in_bytes")?.parse()?;
        // The root filesystem is read-only: etcd's own mount table says so.
        let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts"))?;
        let root = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("/"))
            .context("no root mount")?;
        ensure!(
            root.split_whitespace()
                .nth(3)
                .is_some_and(|o| o.split(',').any(|o| o == "ro")),
            "root filesystem not read-only: {root}"
        );

        // `kubectl logs` through the API server and the kubelet.
        let out = ctx
            .kubectl()
            .args(["logs", "etcd-on-a-real-node", "--tail=200"])
            .output()?;
        let logs = String::from_utf8_lossy(&out.stdout);
        ensure!(
            out.status.success() && logs.contains("serving client"),
            "kubectl logs: {logs} {}",
            String::from_utf8_lossy(&out.stderr)
        );

        // Deleting the pod stops its process.
        pods.delete("etcd-on-a-real-node", &DeleteParams::default())
            .await?;
        poll_until("the etcd process gone", WAIT, || async {
            Ok::<_, std::convert::Infallible>(
                process_in(node.cgroup(), "--data-dir=/var/lib/etcd/data")
                    .is_none()
                    .then_some(()),
            )
        })
        .await?;
        println!(
            "figures: real node Ready {:.1} s after start; etcd {version} pod Ready {:.1} s after \
             create; uid 65532; memory cgroup usage {:.1} MiB of a 128 MiB limit",
            node_ready.as_secs_f64(),
            to_ready.as_secs_f64(),
            usage as f64 / 1048576.0
        );
        the_controller_finds_the_api_server_by_its_service(&ctx, &pods).await
    }
    .await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(40));
    }
    result
}

/// The controller's image in a pod, with its ServiceAccount and no kubeconfig: in-cluster
/// configuration (`KUBERNETES_SERVICE_HOST` = the `kubernetes` Service's ClusterIP, routed by
/// kube-proxy; the projected token and CA). The ServiceAccount has no RBAC here, so the
/// controller stops at its first check with the API server's refusal, which names the
/// ServiceAccount: the request reached the API server and was authenticated by the token.
async fn the_controller_finds_the_api_server_by_its_service(
    ctx: &TestContext,
    pods: &Api<Pod>,
) -> anyhow::Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "controller-on-a-real-node"},
        "spec": {
            "nodeName": NODE,
            "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "controller",
                "image": format!("etcd-operator/etcd-controller:{version}"),
                "imagePullPolicy": "Never",
                "args": ["--leader-elect=false", format!("--namespace={}", ctx.ns()),
                    "--metrics-bind-address=0.0.0.0:8080",
                    "--health-probe-bind-address=0.0.0.0:8081"],
                "securityContext": {"readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
                "resources": {"limits": {"memory": "128Mi"}, "requests": {"memory": "32Mi"}}
            }]
        }
    }))?;
    let created = Instant::now();
    pods.create(&PostParams::default(), &pod).await?;
    let user = format!("system:serviceaccount:{}:default", ctx.ns());
    let said = poll_until(
        "the API server's answer in the controller's log",
        WAIT,
        || async {
            let out = ctx
                .kubectl()
                .args(["logs", "controller-on-a-real-node"])
                .output()?;
            let logs = String::from_utf8_lossy(&out.stdout).into_owned();
            Ok::<_, std::io::Error>(
                (logs.contains("not allowed to list EtcdClusters") && logs.contains(&user))
                    .then_some(logs),
            )
        },
    )
    .await?;
    let answered = created.elapsed();
    ensure!(
        said.contains("Kubernetes API server server=https://10.96.0.1/"),
        "the controller did not use the Service's ClusterIP: {said}"
    );
    println!(
        "figures: the controller pod on the real node answered by the API server through \
         10.96.0.1 (kube-proxy) {:.1} s after create: {}",
        answered.as_secs_f64(),
        said.lines()
            .find(|l| l.contains("not allowed"))
            .unwrap_or_default()
            .chars()
            .take(240)
            .collect::<String>()
    );
    pods.delete("controller-on-a-real-node", &DeleteParams::default())
        .await?;
    Ok(())
}
