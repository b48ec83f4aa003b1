//! NetworkPolicies enforced on the real node by kube-network-policies
//! ([`etcd_tests::network_policies`]): packets refused, not manifests rendered. Real TCP
//! connects from inside pods' network namespaces (and from the node itself).
//!
//! A hand-written policy: an etcd server pod and two client pods on the real node. Without a
//! policy both connect; with a NetworkPolicy selecting the server that allows ingress on 2379
//! only from pods labelled `access: granted`, the labelled client connects and the other's SYNs
//! are dropped by the enforcer (its own `drop` verdicts counted in its metrics); with the
//! policy deleted, both connect again.
//!
//! The operator's policy: the in-process controller runs a 3-member etcd 3.6 cluster on the
//! node with `spec.network.clientSelectors: [{podSelector: {matchLabels: {access: granted}}}]`
//! and keeps its NAME-members NetworkPolicy: an unlabelled pod reaches neither the peer nor the
//! client port; a labelled one the client port only; a pod of the operator's namespace the
//! client port only; a member another member's peer port (the cluster stays Available with 3
//! ready members: its peers talk); the metrics port stays open (no monitoring namespace). From
//! the node itself, only root passes: upstream accepts every packet of a root-owned socket on
//! the node before any policy (`meta skuid 0 accept`, for kubelet probes), and judges any other
//! node traffic as from outside the cluster, refused by selectors. So the in-process controller
//! (root, on the node) reaches its members by that exemption, not by its namespace. With
//! `spec.network.policy: None` the policy is gone and the unlabelled pod connects. A pod labelled
//! as the operator's PVC backup pod (made in the cluster's namespace, it dials a member's client
//! port) connects when `clientSelectors` is set (this test found it refused at first).
//!
//! The tests take the real node in turn ([`ONE_NODE`]) and leave it without pods.
//!
//! Run: `IMAGES="pause coredns etcd-3.6.16" hack/build-images.sh --no-build && cargo test -p
//! etcd-tests --test network_policies` (needs `hack/build-tools.sh` with the node's tools and
//! `ONLY=netpol`, Debian's runc, root).

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::net::{IpAddr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use etcd_shared::EtcdCluster;
use etcd_tests::cluster_dns;
use etcd_tests::namespace::Namespace;
use etcd_tests::network_policies::connect_from;
use etcd_tests::poll_until;
use etcd_tests::real_node::{RealNode, RealNodeOptions, control_plane_options};
use etcd_tests::suite::{Suite, TestContext};

use support::operator::{Controller, create_cluster, install};
use support::{member_pods, pinned_etcd, settled, wait_until};

const NODE: &str = "real-node";
const WAIT: Duration = Duration::from_secs(90);
/// How long one connect may take before it counts as refused: the enforcer answers a queued
/// SYN in well under a millisecond, so an allowed connect is immediate; a dropped SYN is
/// retransmitted after 1 s and dropped again.
const CONNECT: Duration = Duration::from_secs(2);
const PORT: u16 = 2379;
const PEER_PORT: u16 = 2380;
const METRICS_PORT: u16 = 2381;
const CLUSTER: &str = "guarded";

/// One real node at a time: each test starts its own, on the same name, addresses, bridge and
/// nftables table.
static ONE_NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn main() -> std::process::ExitCode {
    Suite::new()
        .with_pod_network()
        // The scheduler places the operator's members and CoreDNS (the hand-written test's
        // pods name their node).
        .options(control_plane_options())
        .test_timeout(Duration::from_secs(600))
        .run(etcd_tests::tests![
            a_network_policy_refuses_connections_from_pods_it_does_not_allow,
            the_operators_policy_admits_only_members_to_peers_and_named_clients
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
    let _one_node = ONE_NODE.lock().await;
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
        leave_no_pod(&pods).await
    }
    .await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(40));
    }
    result
}

/// Deletes every pod of `pods`' namespace and waits until they are gone, while the node still
/// runs: none is left for the next test's node (same name) to start.
async fn leave_no_pod(pods: &Api<Pod>) -> anyhow::Result<()> {
    pods.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    poll_until("the namespace's pods gone", WAIT, || async {
        let left = pods.list(&ListParams::default()).await?.items.len();
        Ok::<_, kube::Error>((left == 0).then_some(()))
    })
    .await?;
    Ok(())
}

/// Where a test connect starts.
#[derive(Clone)]
enum Source {
    /// Inside a pod's network namespace.
    Pod(PathBuf),
    /// The node itself (the suite's network namespace), from a socket owned by this uid: a
    /// socket belongs to its creator's fsuid, what nftables' `meta skuid` reads.
    Node(u32),
}

/// A TCP connect from the node, its socket made by a thread whose fsuid is `uid`
/// (`setfsuid(2)` changes the calling thread only).
async fn connect_from_node(
    uid: u32,
    address: SocketAddr,
    timeout: Duration,
) -> std::io::Result<()> {
    tokio::task::spawn_blocking(move || {
        std::thread::spawn(move || {
            nix::unistd::setfsuid(nix::unistd::Uid::from_raw(uid));
            TcpStream::connect_timeout(&address, timeout).map(drop)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

async fn connect(source: &Source, address: SocketAddr) -> std::io::Result<()> {
    match source {
        Source::Pod(netns) => connect_from(netns, address, CONNECT).await,
        Source::Node(uid) => connect_from_node(*uid, address, CONNECT).await,
    }
}

/// One connect from `source` to `address`: it must connect (`connects`) or have its SYNs
/// dropped (a timeout; an RST or no route is not what a policy does here).
async fn expect(
    what: String,
    source: Source,
    address: SocketAddr,
    connects: bool,
) -> anyhow::Result<()> {
    let result = connect(&source, address).await;
    match (&result, connects) {
        (Ok(()), true) => Ok(()),
        (Err(e), false) if e.kind() == std::io::ErrorKind::TimedOut => Ok(()),
        _ => bail!(
            "{what} ({address}): {result:?}, expected {}",
            if connects {
                "a connection"
            } else {
                "its SYNs dropped"
            }
        ),
    }
}

/// The first member pod with an IP: its name and IP.
async fn first_member_ip(pods: &Api<Pod>) -> anyhow::Result<(String, IpAddr)> {
    Ok(poll_until("a member pod with an IP", WAIT, || async {
        let members = member_pods(pods, CLUSTER).await?;
        anyhow::Ok(members.into_iter().find_map(|(name, p)| {
            let ip = p.status?.pod_ip?.parse().ok()?;
            Some((name, ip))
        }))
    })
    .await?)
}

async fn the_operators_policy_admits_only_members_to_peers_and_named_clients(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let _one_node = ONE_NODE.lock().await;
    let tools = ctx.control_plane().tools();
    let version = pinned_etcd("3.6")?;
    let started = Instant::now();
    let node = RealNode::start(
        ctx.control_plane(),
        RealNodeOptions::new(NODE, tools, &["coredns", &format!("etcd-{version}")])?
            .with_cluster_dns()
            .with_network_policies(tools)?,
    )
    .await?;
    let node_ready = started.elapsed();
    // The operator's namespace: the policy admits it to the client port. A pause pod there
    // stands for the operator's own pod.
    let operator_ns = Namespace::create(ctx.client(), "netpol-operator").await?;
    install(&ctx).await?;
    // In process, the controller does not know its namespace: told one, it admits that
    // namespace to the client port (unknown, it would leave the client port open).
    let admitted = operator_ns.name().to_owned();
    let controller = Controller::start_with(&ctx, move |config| {
        config.network.operator_namespace = Some(admitted);
    })?;
    let result = operators_policy(&ctx, &node, &version, operator_ns.name(), node_ready).await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(40));
        for args in [
            vec!["get", "pods", "-A", "-o", "wide"],
            vec!["get", "networkpolicies", "-A", "-o", "yaml"],
        ] {
            if let Ok(out) = ctx.kubectl().args(&args).output() {
                eprintln!(
                    "--- kubectl {}\n{}{}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
    // With the controller still running (it lets the cluster go) and the node too.
    let emptied = leave_the_node_empty(&ctx, operator_ns.name()).await;
    drop(controller);
    if let Err(e) = operator_ns.delete().await {
        eprintln!("cleanup: {e}");
    }
    result.and(emptied)
}

/// Nothing left for the next test's node: the cluster (its members), every pod of the test's
/// and the operator's namespaces, CoreDNS.
async fn leave_the_node_empty(ctx: &TestContext, operator_ns: &str) -> anyhow::Result<()> {
    let clusters: Api<EtcdCluster> = ctx.api();
    match clusters.delete(CLUSTER, &DeleteParams::default()).await {
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        other => drop(other?),
    }
    let pods: Api<Pod> = ctx.api();
    poll_until("the members gone", WAIT, || async {
        anyhow::Ok(member_pods(&pods, CLUSTER).await?.is_empty().then_some(()))
    })
    .await?;
    leave_no_pod(&pods).await?;
    leave_no_pod(&Api::namespaced(ctx.client(), operator_ns)).await?;
    let deployments: Api<Deployment> = Api::namespaced(ctx.client(), "kube-system");
    match deployments
        .delete("coredns", &DeleteParams::default())
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        other => drop(other?),
    }
    let system: Api<Pod> = Api::namespaced(ctx.client(), "kube-system");
    poll_until("CoreDNS gone", WAIT, || async {
        let left = system
            .list(&ListParams::default().labels("k8s-app=kube-dns"))
            .await?
            .items
            .len();
        Ok::<_, kube::Error>((left == 0).then_some(()))
    })
    .await?;
    Ok(())
}

async fn operators_policy(
    ctx: &TestContext,
    node: &RealNode,
    version: &str,
    operator_ns: &str,
    node_ready: Duration,
) -> anyhow::Result<()> {
    let versions = ctx.control_plane().tools().versions().clone();
    let dns = Instant::now();
    cluster_dns::deploy(&ctx.client(), &cluster_dns::image(&versions.coredns), WAIT).await?;
    let dns_ready = dns.elapsed();
    let enforcer = node
        .network_policies()
        .context("the node runs no enforcer")?;

    // The clients: pause pods (their process keeps the pod's network namespace).
    let pause = |name: &str, labels: serde_json::Value| {
        pod(
            name,
            labels,
            serde_json::json!({"name": "client", "image": etcd_tests::real_node::SANDBOX_IMAGE,
                "imagePullPolicy": "Never"}),
            serde_json::json!([]),
        )
    };
    let pods: Api<Pod> = ctx.api();
    let operator_pods: Api<Pod> = Api::namespaced(ctx.client(), operator_ns);
    pods.create(
        &PostParams::default(),
        &pause("unlabelled", serde_json::json!({"access": "none"}))?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pause("granted", serde_json::json!({"access": "granted"}))?,
    )
    .await?;
    operator_pods
        .create(
            &PostParams::default(),
            &pause("operator", serde_json::json!({"app": "etcd-operator"}))?,
        )
        .await?;
    // Labelled as the operator's PVC backup pod (`NAME-backup`, made in the cluster's
    // namespace, which dials a member's client port).
    pods.create(
        &PostParams::default(),
        &pause(
            "backup-stand-in",
            serde_json::json!({"app.kubernetes.io/managed-by": "etcd-operator",
                "app.kubernetes.io/component": "backup"}),
        )?,
    )
    .await?;
    let (_, unlabelled) = ready(&pods, "unlabelled").await?;
    let (_, granted) = ready(&pods, "granted").await?;
    let (_, operator) = ready(&operator_pods, "operator").await?;
    let unlabelled_netns = node.pod_netns(&unlabelled)?;
    let unlabelled = Source::Pod(unlabelled_netns.clone());
    let granted = Source::Pod(node.pod_netns(&granted)?);
    let operator = Source::Pod(node.pod_netns(&operator)?);
    let (_, backup) = ready(&pods, "backup-stand-in").await?;
    let backup = Source::Pod(node.pod_netns(&backup)?);

    // The cluster, clients named by label.
    let creating = Instant::now();
    create_cluster(
        ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  size: 3\n  version: \"{version}\"\n  network:\n    clientSelectors:\n    - podSelector:\n        matchLabels:\n          access: granted\n"
        ),
    )
    .await?;
    let policies: Api<NetworkPolicy> = ctx.api();
    let policy_name = format!("{CLUSTER}-members");
    let policy = poll_until("the operator's NetworkPolicy", WAIT, || async {
        policies.get_opt(&policy_name).await
    })
    .await?;
    let policy_made = creating.elapsed();
    let rules = policy
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .unwrap_or_default();
    println!(
        "the operator's policy ({:.1} s after the cluster's create): {}",
        policy_made.as_secs_f64(),
        serde_json::to_string(&rules)?
    );

    // Enforced from the first member's start: its client port refuses the unlabelled pod
    // (before etcd listens, an unpoliced connect gets an RST: retried).
    let dropped_before = enforcer.packets("drop")?;
    let (first, first_ip) = first_member_ip(&pods).await?;
    let ip_known = Instant::now();
    let attempts = AtomicU32::new(0);
    poll_until(
        "the unlabelled pod refused by the first member's client port",
        WAIT,
        || async {
            attempts.fetch_add(1, Ordering::Relaxed);
            let result = connect(&unlabelled, SocketAddr::new(first_ip, PORT)).await;
            match result {
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Ok(Some(())),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let first_refused = ip_known.elapsed();
    let attempts = attempts.load(Ordering::Relaxed);

    // Healthy under the policy: 3 voters Ready, Available (peers talk; the controller reads
    // each member's status on its client port).
    let clusters: Api<EtcdCluster> = ctx.api();
    wait_until(&clusters, CLUSTER, "3 members Running, Available", |c| {
        settled(c, 3, version)
    })
    .await?;
    let healthy = creating.elapsed();

    let members = member_pods(&pods, CLUSTER).await?;
    ensure!(members.len() == 3, "members: {:?}", members.keys());
    let member_ip = |p: &Pod| -> anyhow::Result<IpAddr> {
        Ok(p.status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .context("a member without an IP")?
            .parse()?)
    };
    let mut others = members.iter().filter(|(name, _)| **name != first);
    let (second, second_pod) = others.next().context("a second member")?;
    let second_netns = Source::Pod(
        node.pod_netns(
            second_pod
                .metadata
                .uid
                .as_deref()
                .context("a member without a uid")?,
        )?,
    );
    let mut checks = Vec::new();
    for (name, member) in &members {
        let ip = member_ip(member)?;
        let at = |port| SocketAddr::new(ip, port);
        checks.extend([
            (
                format!("unlabelled -> {name} client"),
                unlabelled.clone(),
                at(PORT),
                false,
            ),
            (
                format!("unlabelled -> {name} peer"),
                unlabelled.clone(),
                at(PEER_PORT),
                false,
            ),
            (
                format!("unlabelled -> {name} metrics"),
                unlabelled.clone(),
                at(METRICS_PORT),
                true,
            ),
            (
                format!("granted -> {name} client"),
                granted.clone(),
                at(PORT),
                true,
            ),
            (
                format!("granted -> {name} peer"),
                granted.clone(),
                at(PEER_PORT),
                false,
            ),
            (
                format!("operator's namespace -> {name} client"),
                operator.clone(),
                at(PORT),
                true,
            ),
            (
                format!("operator's namespace -> {name} peer"),
                operator.clone(),
                at(PEER_PORT),
                false,
            ),
            (
                format!("root on the node -> {name} client"),
                Source::Node(0),
                at(PORT),
                true,
            ),
            (
                format!("uid 65534 on the node -> {name} client"),
                Source::Node(65534),
                at(PORT),
                false,
            ),
            (
                format!("uid 65534 on the node -> {name} peer"),
                Source::Node(65534),
                at(PEER_PORT),
                false,
            ),
        ]);
        if name != second {
            checks.push((
                format!("member {second} -> {name} peer"),
                second_netns.clone(),
                at(PEER_PORT),
                true,
            ));
        }
    }
    let refused = checks.iter().filter(|c| !c.3).count();
    let total = checks.len();
    let checking = Instant::now();
    let outcomes = futures::future::join_all(
        checks
            .into_iter()
            .map(|(what, source, address, connects)| expect(what, source, address, connects)),
    )
    .await;
    let failures: Vec<String> = outcomes
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    ensure!(
        failures.is_empty(),
        "{} of {total} connects went against the policy:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let checked = checking.elapsed();
    // The operator's PVC backup pod streams its snapshot from a member's client port.
    ensure!(
        connect(&backup, SocketAddr::new(first_ip, PORT))
            .await
            .is_ok(),
        "the operator's backup pod is refused {first}'s client port under the policy"
    );
    let dropped = enforcer.packets("drop")? - dropped_before;
    ensure!(
        dropped >= u64::try_from(refused)? * 2,
        "the enforcer counted {dropped} dropped packets for {refused} refused connects"
    );
    // Still healthy after all of that.
    wait_until(&clusters, CLUSTER, "still 3 members, Available", |c| {
        settled(c, 3, version)
    })
    .await?;

    // `policy: None` (the webhook refuses clientSelectors beside it: they go): the operator
    // deletes its policy; the unlabelled pod connects.
    let lifting = Instant::now();
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!(
                {"spec": {"network": {"policy": "None", "clientSelectors": null}}}
            )),
        )
        .await?;
    poll_until("the operator's NetworkPolicy deleted", WAIT, || async {
        Ok::<_, kube::Error>(
            policies
                .get_opt(&policy_name)
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await?;
    let deleted = lifting.elapsed();
    until_connect(
        "the unlabelled pod connects once the policy is gone",
        &unlabelled_netns,
        SocketAddr::new(first_ip, PORT),
        true,
    )
    .await?;
    let lifted = lifting.elapsed();
    for (name, member) in &members {
        let ip = member_ip(member)?;
        expect(
            format!("unlabelled -> {name} peer, no policy"),
            unlabelled.clone(),
            SocketAddr::new(ip, PEER_PORT),
            true,
        )
        .await?;
    }
    wait_until(&clusters, CLUSTER, "3 members, Available, no policy", |c| {
        settled(c, 3, version)
    })
    .await?;
    println!(
        "figures: real node with kube-network-policies Ready {:.1} s, CoreDNS {:.1} s; the \
         operator's policy made {:.1} s after the cluster's create; the unlabelled pod refused \
         by the first member ({first}) {:.1} s after its IP was known, on attempt {attempts} (a \
         refused connect gives up after {} s); 3 members Available {:.1} s after create under \
         the policy; {total} connects as the policy says in {:.1} s, {refused} refused with \
         {dropped} packets dropped by the enforcer; policy: None -> policy deleted {:.1} s, \
         unlabelled pod connecting {:.1} s after the patch",
        node_ready.as_secs_f64(),
        dns_ready.as_secs_f64(),
        policy_made.as_secs_f64(),
        first_refused.as_secs_f64(),
        CONNECT.as_secs(),
        healthy.as_secs_f64(),
        checked.as_secs_f64(),
        deleted.as_secs_f64(),
        lifted.as_secs_f64(),
    );

    Ok(())
}
