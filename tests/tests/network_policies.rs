//! NetworkPolicies enforced on the real node by kube-network-policies
//! ([`etcd_tests::network_policies`]): packets refused, not manifests rendered. An etcd server
//! pod and two client pods on the real node; real TCP connects from inside each client pod's
//! network namespace to the server's client port. Without a policy both connect; with a
//! NetworkPolicy selecting the server that allows ingress on 2379 only from pods labelled
//! `access: granted`, the labelled client connects and the other's SYNs are dropped by the
//! enforcer (its own `drop` verdicts counted in its metrics); with the policy deleted, both
//! connect again.
//!
//! Run: `IMAGES="pause etcd-3.6.16" hack/build-images.sh --no-build && cargo test -p
//! etcd-tests --test network_policies` (needs `hack/build-tools.sh` with the node's tools and
//! `ONLY=netpol`, Debian's runc, root).

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use etcd_tests::control_plane::ControlPlaneOptions;
use etcd_tests::network_policies::connect_from;
use etcd_tests::poll_until;
use etcd_tests::real_node::{RealNode, RealNodeOptions, control_plane_options};
use etcd_tests::suite::{Suite, TestContext};

const NODE: &str = "real-node";
const WAIT: Duration = Duration::from_secs(90);
/// How long one connect may take before it counts as refused: the enforcer answers a queued
/// SYN in well under a millisecond, so an allowed connect is immediate; a dropped SYN is
/// retransmitted after 1 s and dropped again.
const CONNECT: Duration = Duration::from_secs(2);
const PORT: u16 = 2379;

fn main() -> std::process::ExitCode {
    Suite::new()
        .with_pod_network()
        // Pods name their node: no scheduler.
        .options(ControlPlaneOptions {
            scheduler: false,
            ..control_plane_options()
        })
        .run(etcd_tests::tests![
            a_network_policy_refuses_connections_from_pods_it_does_not_allow
        ])
}

/// A pod on the real node: `container` (and `volumes`) with `labels`.
fn pod(
    name: &str,
    labels: serde_json::Value,
    container: serde_json::Value,
    volumes: serde_json::Value,
) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            "volumes": volumes
        }
    }))?)
}

/// Waits until pod `name` is Ready; returns its IP and UID.
async fn ready(pods: &Api<Pod>, name: &str) -> anyhow::Result<(IpAddr, String)> {
    let pod = poll_until(&format!("pod {name} Ready"), WAIT, || async {
        let pod = pods.get(name).await?;
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        Ok::<_, kube::Error>(ready.then_some(pod))
    })
    .await?;
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("no pod IP")?
        .parse()?;
    Ok((ip, pod.metadata.uid.context("no uid")?))
}

/// Waits until a connect from `netns` to `server` succeeds (`true`) or is refused (`false`),
/// and returns how long that took.
async fn until_connect(
    what: &str,
    netns: &Path,
    server: SocketAddr,
    connects: bool,
) -> anyhow::Result<Duration> {
    let begin = Instant::now();
    poll_until(what, WAIT, || async {
        let result = connect_from(netns, server, CONNECT).await;
        match (&result, connects) {
            (Ok(()), true) => Ok(Some(())),
            (Err(e), false) if e.kind() == std::io::ErrorKind::TimedOut => Ok(Some(())),
            // Refused otherwise than by a dropped SYN (an RST, no route): not what a
            // policy does here; shown on timeout.
            _ => Err(format!("{result:?}")),
        }
    })
    .await?;
    Ok(begin.elapsed())
}

async fn a_network_policy_refuses_connections_from_pods_it_does_not_allow(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let tools = ctx.control_plane().tools();
    let version = tools.versions().apiserver_etcd.clone();
    let started = Instant::now();
    let node = RealNode::start(
        ctx.control_plane(),
        RealNodeOptions::new(NODE, tools, &[&format!("etcd-{version}")])?
            .with_network_policies(tools)?,
    )
    .await?;
    let node_ready = started.elapsed();
    let enforcer = node
        .network_policies()
        .context("the node runs no enforcer")?;
    let result = async {
        let pods: Api<Pod> = ctx.api();
        let server = pod(
            "server",
            serde_json::json!({"app": "etcd-server"}),
            serde_json::json!({
                "name": "etcd",
                "image": format!("quay.io/coreos/etcd:v{version}"),
                "imagePullPolicy": "Never",
                "command": ["/usr/local/bin/etcd", "--name=server", "--data-dir=/var/lib/etcd/data",
                    format!("--listen-client-urls=http://0.0.0.0:{PORT}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{PORT}")],
                // The kubelet's probe comes from the node as root: never queued (upstream
                // accepts the node's own root traffic), so it passes under the policy too.
                "readinessProbe": {"httpGet": {"path": "/health", "port": PORT},
                    "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}]
            }),
            serde_json::json!([{"name": "data", "emptyDir": {}}]),
        )?;
        // The clients: the pause image's process keeps each pod's network namespace.
        let client = |name: &str, labels: serde_json::Value| {
            pod(
                name,
                labels,
                serde_json::json!({"name": "client", "image": etcd_tests::real_node::SANDBOX_IMAGE,
                    "imagePullPolicy": "Never"}),
                serde_json::json!([]),
            )
        };
        let allowed = client("allowed", serde_json::json!({"access": "granted"}))?;
        let other = client("other", serde_json::json!({"access": "none"}))?;
        for p in [&server, &allowed, &other] {
            pods.create(&PostParams::default(), p).await?;
        }
        let (server_ip, _) = ready(&pods, "server").await?;
        let (_, allowed_uid) = ready(&pods, "allowed").await?;
        let (_, other_uid) = ready(&pods, "other").await?;
        let server = SocketAddr::new(server_ip, PORT);
        let allowed = node.pod_netns(&allowed_uid)?;
        let other = node.pod_netns(&other_uid)?;

        // No policy: both connect.
        until_connect(
            "the labelled client connects, no policy",
            &allowed,
            server,
            true,
        )
        .await?;
        until_connect("the other client connects, no policy", &other, server, true).await?;
        let dropped_before = enforcer.packets("drop")?;

        // Ingress to the server on 2379 only from `access: granted`.
        let policies: Api<NetworkPolicy> = ctx.api();
        let policy: NetworkPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": "etcd-clients-only"},
            "spec": {
                "podSelector": {"matchLabels": {"app": "etcd-server"}},
                "policyTypes": ["Ingress"],
                "ingress": [{
                    "from": [{"podSelector": {"matchLabels": {"access": "granted"}}}],
                    "ports": [{"protocol": "TCP", "port": PORT}]
                }]
            }
        }))?;
        policies.create(&PostParams::default(), &policy).await?;
        let enforced = until_connect(
            "the unlabelled client refused under the policy",
            &other,
            server,
            false,
        )
        .await?;
        until_connect(
            "the labelled client connects under the policy",
            &allowed,
            server,
            true,
        )
        .await?;
        // Still refused: not a passing glitch.
        let again = connect_from(&other, server, CONNECT).await;
        ensure!(
            again
                .as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut),
            "the unlabelled client's second connect under the policy: {again:?}"
        );
        let dropped = enforcer.packets("drop")? - dropped_before;
        ensure!(
            dropped >= 2,
            "the enforcer counted {dropped} dropped packets for two refused connects"
        );
        let accepted = enforcer.packets("accept")?;
        ensure!(accepted >= 1, "the enforcer accepted no packet");

        // The policy deleted: both connect again.
        policies
            .delete("etcd-clients-only", &DeleteParams::default())
            .await?;
        let lifted = until_connect(
            "the unlabelled client connects once the policy is deleted",
            &other,
            server,
            true,
        )
        .await?;
        until_connect(
            "the labelled client connects, policy deleted",
            &allowed,
            server,
            true,
        )
        .await?;
        println!(
            "figures: real node with kube-network-policies Ready {:.1} s after start; refused \
             {:.1} s after the policy's create (a connect gives up after {} s), connecting \
             again {:.1} s after its delete; the enforcer's verdicts: {dropped} dropped under \
             the policy, {accepted} accepted",
            node_ready.as_secs_f64(),
            enforced.as_secs_f64(),
            CONNECT.as_secs(),
            lifted.as_secs_f64(),
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(40));
    }
    result
}
