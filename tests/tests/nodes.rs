//! Node faults as a real cluster produces them (issue 32): three process kubelets in three
//! zones, pods placed by the real kube-scheduler, a node silenced (a paused or partitioned
//! kubelet) until the node lifecycle controller marks it `Unknown` and the taint-eviction
//! controller evicts its pods, a pod force-deleted while its node is silent, and network
//! partitions between pods.
//!
//! Run: `cargo test -p etcd-tests --test nodes` (needs `hack/build-tools.sh` first, root for
//! the pod cgroups the partitions match on). The timings are [`NodesOptions::default`]'s:
//! Lease renewed every 2 s, a node silent for 10 s is `Unknown`, pods tolerate an unreachable
//! node for 5 s. The tests run one at a time (node faults are suite-wide).

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::runtime::wait::conditions;
use kube::runtime::watcher;
use kube::{Api, ResourceExt as _};

use etcd_tests::kubelet::node::ready_status;
use etcd_tests::kubelet::nodes::{NodesOptions, ZONE_LABEL};
use etcd_tests::kubelet::{ImageMapping, Kubelet};
use etcd_tests::suite::{Suite, TestContext};
use etcd_tests::{await_condition, poll_until};

/// Deadline of waits that involve no node fault.
const WAIT: Duration = Duration::from_secs(60);
/// The etcd of the member pods.
const ETCD_IMAGE: &str = "quay.io/coreos/etcd:v3.6.16";
/// How soon a resumed node must be Ready again (a real kubelet posts its status within
/// seconds of coming back).
const READY_AFTER_RESUME: Duration = Duration::from_secs(5);
/// How long a connection attempt may take before it counts as hanging.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

fn main() -> std::process::ExitCode {
    Suite::new()
        .with_nodes(NodesOptions::default())
        .run(etcd_tests::tests![
            three_nodes_in_three_zones_and_anti_affinity_leaves_a_fourth_pod_pending,
            a_silenced_node_goes_unknown_and_its_evicted_pods_run_until_it_resumes,
            a_node_silent_longer_than_its_lease_is_ready_within_seconds_of_resuming,
            a_pod_force_deleted_on_a_silenced_node_runs_until_the_node_resumes,
            a_partition_cuts_two_etcd_pods_apart_until_healed,
        ])
}

/// Prints how long a wait took, on a line the project's figures are collected from.
fn duration(what: &str, took: Duration) {
    println!("duration: {what}: {:.1} s", took.as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Pods.

/// The image of the sleeping pods, per namespace: `/bin/sleep` of this machine.
fn sleep_image(ns: &str) -> String {
    format!("registry.example/{ns}/sleep:1")
}

/// Maps [`sleep_image`] to `/bin/sleep` (the image map is shared by every node).
fn map_sleep_image(ctx: &TestContext) -> anyhow::Result<()> {
    ctx.kubelet()?.images().register_repository(
        format!("/{}/sleep", ctx.ns()),
        ImageMapping::new("/bin/sleep", "/bin/sleep"),
    );
    Ok(())
}

/// A pod sleeping for an hour, on `node` when given (a `nodeSelector` on the hostname, so
/// kube-scheduler places it), with `extra` merged into its spec.
fn sleep_pod(
    ns: &str,
    name: &str,
    node: Option<&str>,
    extra: serde_json::Value,
) -> anyhow::Result<Pod> {
    let mut spec = serde_json::json!({
        "containers": [{
            "name": "sleep",
            "image": sleep_image(ns),
            "command": ["/bin/sleep", "3600"],
        }],
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
    });
    if let Some(node) = node {
        spec["nodeSelector"] = serde_json::json!({ "kubernetes.io/hostname": node });
    }
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    pod(name, &[("app", "sleep")], spec)
}

/// A single-member etcd on its pod IP, on `node`, with an emptyDir data volume and a 2 s grace
/// period.
fn etcd_pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    let spec = serde_json::json!({
        "nodeSelector": { "kubernetes.io/hostname": node },
        "containers": [{
            "name": "etcd",
            "image": ETCD_IMAGE,
            "command": ["/usr/local/bin/etcd"],
            "args": [
                format!("--name={name}"),
                "--data-dir=/var/lib/etcd/data",
                "--listen-peer-urls=http://$(POD_IP):2380",
                "--listen-client-urls=http://$(POD_IP):2379",
                "--advertise-client-urls=http://$(POD_IP):2379",
                "--initial-advertise-peer-urls=http://$(POD_IP):2380",
                format!("--initial-cluster={name}=http://$(POD_IP):2380"),
                "--listen-metrics-urls=http://$(POD_IP):2381",
            ],
            "env": [{ "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } }],
            "ports": [
                { "name": "client", "containerPort": 2379 },
                { "name": "peer", "containerPort": 2380 },
            ],
            "volumeMounts": [{ "name": "data", "mountPath": "/var/lib/etcd" }],
            "readinessProbe": {
                "tcpSocket": { "port": 2379 },
                "periodSeconds": 1,
            },
        }],
        "volumes": [{ "name": "data", "emptyDir": {} }],
        "terminationGracePeriodSeconds": 2,
        "automountServiceAccountToken": false,
        "enableServiceLinks": false,
    });
    pod(name, &[("app", "etcd")], spec)
}

fn pod(name: &str, labels: &[(&str, &str)], spec: serde_json::Value) -> anyhow::Result<Pod> {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), serde_json::Value::from(*v)))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": labels },
        "spec": spec,
    }))
    .with_context(|| format!("pod {name}"))
}

fn condition<'a>(
    pod: &'a Pod,
    type_: &str,
) -> Option<&'a k8s_openapi::api::core::v1::PodCondition> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn is_ready(pod: &Pod) -> bool {
    condition(pod, "Ready").is_some_and(|c| c.status == "True")
}

fn pod_ip(pod: &Pod) -> anyhow::Result<Ipv4Addr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("no podIP")?
        .parse()
        .context("podIP")
}

/// Waits until pod `name` is Ready; returns it.
async fn wait_ready(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    await_condition(
        api.clone(),
        name,
        |p: Option<&Pod>| p.is_some_and(is_ready),
        WAIT,
    )
    .await
    .with_context(|| format!("waiting for pod {name} to be Ready"))?
    .context("pod vanished")
}

/// Creates `pod` and waits until it is Ready; returns it.
async fn run_pod(ctx: &TestContext, pod: Pod) -> anyhow::Result<Pod> {
    let api: Api<Pod> = ctx.api();
    let name = pod.name_any();
    api.create(&PostParams::default(), &pod).await?;
    wait_ready(&api, &name).await
}

// ---------------------------------------------------------------------------------------------
// Nodes.

/// Waits until every node is Ready and carries no taint (the node lifecycle controller takes
/// off a resumed node's taints a moment after it is Ready): what each test starts from.
async fn wait_nodes_healthy(ctx: &TestContext) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client());
    let names: Vec<String> = ctx
        .nodes()?
        .iter()
        .map(|k| k.node_name().to_owned())
        .collect();
    poll_until("every node Ready and untainted", WAIT, || {
        let nodes = nodes.clone();
        let names = names.clone();
        async move {
            for name in &names {
                let node = nodes.get(name).await?;
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|t| !t.is_empty());
                if ready_status(&node) != Some("True") || tainted {
                    return Ok::<_, kube::Error>(None);
                }
            }
            Ok(Some(()))
        }
    })
    .await?;
    Ok(())
}

/// Waits until node `name`'s Ready condition satisfies `want`; returns its status.
async fn wait_node_ready_status(
    ctx: &TestContext,
    name: &str,
    what: &str,
    timeout: Duration,
    want: impl Fn(&str) -> bool + Send + Sync + 'static,
) -> anyhow::Result<String> {
    let node = await_condition(
        Api::<Node>::all(ctx.client()),
        name,
        move |n: Option<&Node>| n.and_then(ready_status).is_some_and(&want),
        timeout,
    )
    .await
    .with_context(|| format!("waiting for node {name}: {what}"))?
    .context("node vanished")?;
    Ok(ready_status(&node).unwrap_or_default().to_owned())
}

/// Waits until node `name`'s Lease has expired (renew time plus duration is past).
async fn wait_lease_expired(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    let leases: Api<Lease> = Api::namespaced(ctx.client(), "kube-node-lease");
    poll_until("the node's Lease to expire", WAIT, || {
        let leases = leases.clone();
        async move {
            let spec = leases.get(name).await?.spec.unwrap_or_default();
            let (Some(renewed), Some(seconds)) = (spec.renew_time, spec.lease_duration_seconds)
            else {
                return Ok::<_, anyhow::Error>(None);
            };
            let expiry = renewed.0 + k8s_openapi::jiff::SignedDuration::from_secs(seconds.into());
            Ok((expiry < k8s_openapi::jiff::Timestamp::now()).then_some(()))
        }
    })
    .await?;
    Ok(())
}

/// Starts recording every version of pod `name` until it is deleted (at most [`WAIT`]);
/// returns once the recorder has listed the pod.
async fn record_versions(
    api: Api<Pod>,
    name: &str,
) -> anyhow::Result<tokio::task::JoinHandle<anyhow::Result<Vec<Pod>>>> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let (listed, on_listed) = tokio::sync::oneshot::channel();
    let recorder = tokio::spawn(async move {
        let stream = watcher::watcher(api, config);
        futures::pin_mut!(stream);
        let mut listed = Some(listed);
        let mut versions = Vec::new();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(deadline, stream.next()).await {
                Ok(Some(Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)))) => {
                    versions.push(pod);
                }
                Ok(Some(Ok(watcher::Event::InitDone))) => {
                    if let Some(listed) = listed.take() {
                        let _ = listed.send(());
                    }
                }
                Ok(Some(Ok(watcher::Event::Delete(_))) | None) => return Ok(versions),
                Ok(Some(Ok(watcher::Event::Init))) => {}
                Ok(Some(Err(e))) => bail!("watching the pod: {e}"),
                Err(_) => bail!("the pod was not deleted within {WAIT:?}"),
            }
        }
    });
    tokio::time::timeout(WAIT, on_listed)
        .await
        .context("the pod recorder did not list the pod")?
        .context("the pod recorder failed")?;
    Ok(recorder)
}

/// Whether process `pid` is alive (not gone, not a zombie).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next())
        })
        .is_some_and(|state| state != 'Z' && state != 'X')
}

/// The state letter of process `pid` (`T` when stopped).
fn process_state(pid: u32) -> Option<char> {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()?
        .rsplit_once(") ")?
        .1
        .chars()
        .next()
}

/// Whether etcd answers a status request on `ip:2379` within a few seconds.
async fn etcd_answers(ip: Ipv4Addr) -> anyhow::Result<()> {
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(3))
        .with_timeout(Duration::from_secs(3));
    let mut client = etcd_client::Client::connect([format!("http://{ip}:2379")], Some(options))
        .await
        .with_context(|| format!("connecting to etcd on {ip}"))?;
    client
        .status()
        .await
        .with_context(|| format!("status of etcd on {ip}"))?;
    Ok(())
}

/// Whether a TCP connection to `addr` from this process succeeds within [`CONNECT_TIMEOUT`].
async fn connects(addr: SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr)).await,
        Ok(Ok(_))
    )
}

/// What a connection attempt met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    /// Connected.
    Connected,
    /// No answer within [`CONNECT_TIMEOUT`] (packets dropped).
    Hung,
    /// Refused or another error.
    Failed,
}

/// A TCP connection to `addr` from inside pod `pod` (its cgroup, so partitions apply): bash's
/// `/dev/tcp` under `timeout`.
async fn reach_from(ctx: &TestContext, pod: &str, addr: SocketAddr) -> anyhow::Result<Reach> {
    let kubelet = kubelet_of(ctx, pod)?;
    let mut command = kubelet.pod_command(ctx.ns(), pod, "timeout")?;
    command.args([
        format!("{}", CONNECT_TIMEOUT.as_secs()),
        "bash".to_owned(),
        "-c".to_owned(),
        format!("exec 3<>/dev/tcp/{}/{}", addr.ip(), addr.port()),
    ]);
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    Ok(match output.status.code() {
        Some(0) => Reach::Connected,
        Some(124) => Reach::Hung,
        _ => Reach::Failed,
    })
}

/// The kubelet that runs pod `pod` of the test's namespace.
fn kubelet_of<'a>(ctx: &'a TestContext, pod: &str) -> anyhow::Result<&'a Kubelet> {
    ctx.nodes()?
        .iter()
        .find(|k| k.pod_ip(ctx.ns(), pod).is_some())
        .map(AsRef::as_ref)
        .with_context(|| format!("no kubelet runs pod {pod}"))
}

// ---------------------------------------------------------------------------------------------
// Tests.

/// Three nodes register Ready, in zones a, b and c, each with its own IP and Lease; four pods
/// with required anti-affinity on the hostname: kube-scheduler puts three on three nodes, whose
/// kubelets (and only those) run them, and leaves the fourth Pending.
async fn three_nodes_in_three_zones_and_anti_affinity_leaves_a_fourth_pod_pending(
    ctx: TestContext,
) -> anyhow::Result<()> {
    wait_nodes_healthy(&ctx).await?;
    let options = NodesOptions::default();
    let nodes: Api<Node> = Api::all(ctx.client());
    let leases: Api<Lease> = Api::namespaced(ctx.client(), "kube-node-lease");
    let kubelets = ctx.nodes()?;
    ensure!(kubelets.len() == 3, "{} nodes", kubelets.len());
    let mut ips = BTreeSet::new();
    for (kubelet, zone) in kubelets.iter().zip(&options.zones) {
        let node = nodes.get(kubelet.node_name()).await?;
        ensure!(
            ready_status(&node) == Some("True"),
            "{} not Ready",
            kubelet.node_name()
        );
        ensure!(
            node.labels().get(ZONE_LABEL) == Some(zone),
            "node {} labels {:?}",
            kubelet.node_name(),
            node.labels()
        );
        let internal_ip = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
            .map(|a| a.address.clone());
        ensure!(
            internal_ip == Some(kubelet.node_ip().to_string()),
            "node {} InternalIP {internal_ip:?}, kubelet {}",
            kubelet.node_name(),
            kubelet.node_ip()
        );
        ips.insert(kubelet.node_ip());
        let lease = leases.get(kubelet.node_name()).await?;
        let spec = lease.spec.unwrap_or_default();
        ensure!(
            spec.lease_duration_seconds == Some(8)
                && spec.holder_identity.as_deref() == Some(kubelet.node_name()),
            "lease of {}: {spec:?}",
            kubelet.node_name()
        );
    }
    ensure!(ips.len() == 3, "node IPs {ips:?}");

    map_sleep_image(&ctx)?;
    let api: Api<Pod> = ctx.api();
    let anti_affinity = serde_json::json!({ "affinity": { "podAntiAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": { "matchLabels": { "app": "sleep" } },
            "topologyKey": "kubernetes.io/hostname",
        }],
    }}});
    let names: Vec<String> = (1..=4).map(|i| format!("spread-{i}")).collect();
    let started = Instant::now();
    for name in &names {
        let pod = sleep_pod(ctx.ns(), name, None, anti_affinity.clone())?;
        api.create(&PostParams::default(), &pod).await?;
    }
    let (running, pending) = poll_until("three pods Ready and one Unschedulable", WAIT, || {
        let api = api.clone();
        async move {
            let pods = api.list(&ListParams::default()).await?.items;
            let running: Vec<Pod> = pods.iter().filter(|p| is_ready(p)).cloned().collect();
            let pending: Vec<Pod> = pods
                .iter()
                .filter(|p| {
                    condition(p, "PodScheduled").is_some_and(|c| {
                        c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
                .cloned()
                .collect();
            Ok::<_, kube::Error>(
                (running.len() == 3 && pending.len() == 1).then_some((running, pending)),
            )
        }
    })
    .await?;
    duration(
        "three anti-affine pods Ready on three nodes",
        started.elapsed(),
    );
    let placed: BTreeSet<String> = running
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    ensure!(placed.len() == 3, "the Ready pods are on {placed:?}");
    for pod in &running {
        let name = pod.name_any();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("no nodeName")?;
        let owner = ctx.node(&node)?;
        let host_ip = pod.status.as_ref().and_then(|s| s.host_ip.clone());
        ensure!(
            host_ip == Some(owner.node_ip().to_string()),
            "{name} on {node}: hostIP {host_ip:?}, node IP {}",
            owner.node_ip()
        );
        for kubelet in kubelets.iter() {
            let runs = kubelet.pod_ip(ctx.ns(), &name).is_some();
            ensure!(
                runs == (kubelet.node_name() == node),
                "{name} is bound to {node}, yet kubelet {} runs it: {runs}",
                kubelet.node_name()
            );
        }
    }
    let message = condition(&pending[0], "PodScheduled")
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    ensure!(
        message.contains("anti-affinity")
            && pending[0]
                .spec
                .as_ref()
                .and_then(|s| s.node_name.as_ref())
                .is_none(),
        "{} pending: {message}",
        pending[0].name_any()
    );
    println!("{} stays Pending: {message}", pending[0].name_any());
    Ok(())
}

/// A silenced node goes `Unknown` within the grace period; the taint-eviction controller
/// deletes its etcd pod once the toleration ran out, and the pod stays Terminating while etcd
/// keeps answering on its pod IP; the other nodes and their pods are untouched. Resumed, the
/// node is Ready within seconds, stops etcd and removes the pod.
async fn a_silenced_node_goes_unknown_and_its_evicted_pods_run_until_it_resumes(
    ctx: TestContext,
) -> anyhow::Result<()> {
    wait_nodes_healthy(&ctx).await?;
    let options = NodesOptions::default();
    map_sleep_image(&ctx)?;
    let kubelets = ctx.nodes()?;
    let (victim, bystander) = (&kubelets[1], &kubelets[2]);
    let api: Api<Pod> = ctx.api();
    let member = run_pod(&ctx, etcd_pod("member", victim.node_name())?).await?;
    run_pod(
        &ctx,
        sleep_pod(
            ctx.ns(),
            "other",
            Some(bystander.node_name()),
            serde_json::json!({}),
        )?,
    )
    .await?;
    let other_pid = bystander.container_pid(ctx.ns(), "other");
    let ip = pod_ip(&member)?;
    let uid = member.uid().context("no uid")?;
    let pid = victim
        .container_pid(ctx.ns(), "member")
        .context("no etcd process")?;
    etcd_answers(ip).await?;

    let silenced = Instant::now();
    victim.silence();
    let status = wait_node_ready_status(
        &ctx,
        victim.node_name(),
        "not Ready",
        options.node_monitor_grace_period + Duration::from_secs(20),
        |s| s != "True",
    )
    .await?;
    let not_ready = silenced.elapsed();
    duration("silenced node NotReady", not_ready);
    ensure!(status == "Unknown", "Ready is {status}, not Unknown");
    // The grace period runs from the last renewal, at most one renew interval before.
    ensure!(
        not_ready >= options.node_monitor_grace_period - options.lease_renew_interval,
        "NotReady after {not_ready:?}, before the grace period"
    );

    let evicted = await_condition(
        api.clone(),
        "member",
        |p: Option<&Pod>| p.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        options.unreachable_toleration + Duration::from_secs(30),
    )
    .await
    .context("waiting for the eviction")?
    .context("the evicted pod is gone already (nothing should confirm its deletion)")?;
    duration(
        "silenced node's pod evicted (since the silence)",
        silenced.elapsed(),
    );
    duration(
        "silenced node's pod evicted (since NotReady)",
        silenced.elapsed() - not_ready,
    );
    let disruption = condition(&evicted, "DisruptionTarget")
        .and_then(|c| c.reason.clone())
        .unwrap_or_default();
    ensure!(
        disruption == "DeletionByTaintManager",
        "DisruptionTarget reason {disruption:?}"
    );
    // Past the grace period, nothing confirms the deletion: the pod stays Terminating.
    let grace = Duration::from_secs(2);
    let deleted = tokio::time::timeout(
        grace + Duration::from_secs(2),
        await_condition(api.clone(), "member", conditions::is_deleted(&uid), WAIT),
    )
    .await;
    ensure!(
        deleted.is_err(),
        "the evicted pod went away while its node was silent"
    );
    ensure!(
        alive(pid),
        "etcd (pid {pid}) stopped while its node is silent"
    );
    etcd_answers(ip)
        .await
        .context("the evicted member stopped answering while its node is silent")?;
    ensure!(
        victim.container_pid(ctx.ns(), "member") == Some(pid),
        "the silent kubelet restarted or dropped etcd"
    );

    let bystander_node = Api::<Node>::all(ctx.client())
        .get(bystander.node_name())
        .await?;
    ensure!(
        ready_status(&bystander_node) == Some("True"),
        "the other node is not Ready"
    );
    let other_now = api.get("other").await?;
    ensure!(
        is_ready(&other_now) && other_now.metadata.deletion_timestamp.is_none(),
        "the other node's pod was touched: {:?}",
        other_now.status
    );
    ensure!(
        other_pid.is_some() && bystander.container_pid(ctx.ns(), "other") == other_pid,
        "the other pod's process changed"
    );

    let history = record_versions(api.clone(), "member").await?;
    let resumed = Instant::now();
    victim.resume();
    wait_node_ready_status(&ctx, victim.node_name(), "Ready", READY_AFTER_RESUME, |s| {
        s == "True"
    })
    .await
    .context("the resumed node did not post Ready within seconds")?;
    duration("resumed node Ready", resumed.elapsed());
    await_condition(api.clone(), "member", conditions::is_deleted(&uid), WAIT)
        .await
        .context("the resumed kubelet did not remove the evicted pod")?;
    duration("evicted pod removed after the resume", resumed.elapsed());
    let history = history.await??;
    ensure!(
        !history.is_empty(),
        "no version of the evicted pod was seen"
    );
    if let Some(flipped) = history
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_some() && is_ready(p))
    {
        bail!(
            "the resumed kubelet flipped the evicted pod back to Ready: {:?}",
            flipped.status
        );
    }
    poll_until("etcd to stop", WAIT, || async {
        Ok::<_, std::convert::Infallible>((!alive(pid)).then_some(()))
    })
    .await?;
    ensure!(
        !connects(SocketAddr::from((ip, 2379))).await,
        "something still listens on the evicted pod's {ip}:2379"
    );
    wait_nodes_healthy(&ctx).await?;
    duration("resumed node untainted", resumed.elapsed());
    Ok(())
}

/// The old harness's bug: a kubelet silent for longer than its Lease renewed the Lease when
/// it came back but never posted its status again, so its Node stayed NotReady (and, later,
/// every pod on it was evicted). Now: Ready within seconds, the node's pods (which tolerate
/// the taint) Ready again, the taints gone.
async fn a_node_silent_longer_than_its_lease_is_ready_within_seconds_of_resuming(
    ctx: TestContext,
) -> anyhow::Result<()> {
    wait_nodes_healthy(&ctx).await?;
    let options = NodesOptions::default();
    map_sleep_image(&ctx)?;
    let kubelet = &ctx.nodes()?[2];
    let api: Api<Pod> = ctx.api();
    let tolerate = serde_json::json!({ "tolerations": [
        { "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600 },
        { "key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 600 },
    ]});
    run_pod(
        &ctx,
        sleep_pod(ctx.ns(), "patient", Some(kubelet.node_name()), tolerate)?,
    )
    .await?;
    let pid = kubelet
        .container_pid(ctx.ns(), "patient")
        .context("no process")?;

    let silenced = Instant::now();
    kubelet.silence();
    wait_node_ready_status(
        &ctx,
        kubelet.node_name(),
        "Unknown",
        options.node_monitor_grace_period + Duration::from_secs(20),
        |s| s == "Unknown",
    )
    .await?;
    duration("silenced node NotReady", silenced.elapsed());
    // The node lifecycle controller marks the pods of an Unknown node not ready.
    await_condition(
        api.clone(),
        "patient",
        |p: Option<&Pod>| p.is_some_and(|p| !is_ready(p)),
        WAIT,
    )
    .await
    .context("the pod of the Unknown node was not marked unready")?;
    wait_lease_expired(&ctx, kubelet.node_name()).await?;
    let silent_for = silenced.elapsed();
    duration("silenced node's Lease expired", silent_for);

    let resumed = Instant::now();
    kubelet.resume();
    wait_node_ready_status(
        &ctx,
        kubelet.node_name(),
        "Ready",
        READY_AFTER_RESUME,
        |s| s == "True",
    )
    .await
    .with_context(|| {
        format!(
            "node {} silent for {silent_for:?} (lease {:?}) is not Ready {READY_AFTER_RESUME:?} \
             after resuming",
            kubelet.node_name(),
            options.lease_duration
        )
    })?;
    duration(
        "node Ready after a silence longer than its Lease",
        resumed.elapsed(),
    );
    wait_ready(&api, "patient").await?;
    duration("its pod Ready again", resumed.elapsed());
    ensure!(
        kubelet.container_pid(ctx.ns(), "patient") == Some(pid),
        "the pod's process changed"
    );
    wait_nodes_healthy(&ctx).await?;
    duration("resumed node untainted", resumed.elapsed());
    let pod = api.get("patient").await?;
    ensure!(
        pod.metadata.deletion_timestamp.is_none(),
        "the tolerating pod was evicted"
    );
    Ok(())
}

/// `kubectl delete --force --grace-period=0` of a pod whose node is silent removes the object
/// at once while its process keeps running and serving, and a pod bound to the node meanwhile
/// does not start; the resumed kubelet stops the first and starts the second.
async fn a_pod_force_deleted_on_a_silenced_node_runs_until_the_node_resumes(
    ctx: TestContext,
) -> anyhow::Result<()> {
    wait_nodes_healthy(&ctx).await?;
    let kubelet = &ctx.nodes()?[0];
    let api: Api<Pod> = ctx.api();
    let member = run_pod(&ctx, etcd_pod("forced", kubelet.node_name())?).await?;
    let ip = pod_ip(&member)?;
    let pid = kubelet
        .container_pid(ctx.ns(), "forced")
        .context("no etcd process")?;

    kubelet.silence();
    let output = ctx
        .kubectl()
        .args([
            "delete",
            "pod",
            "forced",
            "--force",
            "--grace-period=0",
            "--wait=false",
        ])
        .output()?;
    ensure!(
        output.status.success(),
        "kubectl delete --force: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        api.get_opt("forced").await?.is_none(),
        "the pod object is still there"
    );
    ensure!(alive(pid), "etcd stopped although its node is silent");
    etcd_answers(ip)
        .await
        .context("the force-deleted member stopped answering while its node is silent")?;
    ensure!(
        kubelet.container_pid(ctx.ns(), "forced") == Some(pid),
        "the silent kubelet dropped the process"
    );
    map_sleep_image(&ctx)?;
    let mut newcomer = sleep_pod(ctx.ns(), "newcomer", None, serde_json::json!({}))?;
    if let Some(spec) = newcomer.spec.as_mut() {
        // Bound directly: kube-scheduler is not involved.
        spec.node_name = Some(kubelet.node_name().to_owned());
    }
    api.create(&PostParams::default(), &newcomer).await?;
    // What the kubelet would have done by now had it heard of the pod: started it.
    let started = tokio::time::timeout(Duration::from_secs(2), wait_ready(&api, "newcomer")).await;
    ensure!(
        started.is_err() && kubelet.pod_ip(ctx.ns(), "newcomer").is_none(),
        "the silent kubelet started a pod bound to it meanwhile"
    );

    let resumed = Instant::now();
    kubelet.resume();
    poll_until("the force-deleted pod's etcd to stop", WAIT, || async {
        Ok::<_, std::convert::Infallible>((!alive(pid)).then_some(()))
    })
    .await?;
    duration(
        "force-deleted pod's process stopped after the resume",
        resumed.elapsed(),
    );
    poll_until("the kubelet to forget the pod", WAIT, || async {
        Ok::<_, std::convert::Infallible>(
            kubelet
                .container_pid(ctx.ns(), "forced")
                .is_none()
                .then_some(()),
        )
    })
    .await?;
    ensure!(
        !connects(SocketAddr::from((ip, 2379))).await,
        "something still listens on {ip}:2379"
    );
    wait_ready(&api, "newcomer").await?;
    duration(
        "pod bound while silent Ready after the resume",
        resumed.elapsed(),
    );
    Ok(())
}

/// Two etcd pods: partitioned, neither reaches the other's peer port (the connection hangs),
/// both still reach everything else; healed, they do again and the rules are gone. Isolating
/// one from every pod and the API server cuts exactly that; dropping the handle heals too. A
/// paused (SIGSTOP) member stops answering and answers again once continued.
async fn a_partition_cuts_two_etcd_pods_apart_until_healed(ctx: TestContext) -> anyhow::Result<()> {
    wait_nodes_healthy(&ctx).await?;
    let kubelets = ctx.nodes()?;
    let a = run_pod(&ctx, etcd_pod("a", kubelets[0].node_name())?).await?;
    let b = run_pod(&ctx, etcd_pod("b", kubelets[1].node_name())?).await?;
    let (ip_a, ip_b) = (pod_ip(&a)?, pod_ip(&b)?);
    let peer = |ip: Ipv4Addr| SocketAddr::from((ip, 2380));
    let apiserver = ctx.control_plane().apiserver_addr();
    let network = ctx.network()?;
    let expect = |what: &str, got: Reach, want: Reach| -> anyhow::Result<()> {
        ensure!(got == want, "{what}: {got:?}, expected {want:?}");
        Ok(())
    };

    expect(
        "a -> b before",
        reach_from(&ctx, "a", peer(ip_b)).await?,
        Reach::Connected,
    )?;
    expect(
        "b -> a before",
        reach_from(&ctx, "b", peer(ip_a)).await?,
        Reach::Connected,
    )?;

    let partition = network.partition(&[ip_a], &[ip_b])?;
    let rules = network.partition_rules()?;
    println!(
        "partition {}: rules:\n{}",
        partition.description(),
        rules.join("\n")
    );
    ensure!(
        rules.iter().any(|r| r.contains("DROP")),
        "no DROP rule listed: {rules:?}"
    );
    let cut = Instant::now();
    expect(
        "a -> b partitioned",
        reach_from(&ctx, "a", peer(ip_b)).await?,
        Reach::Hung,
    )?;
    duration("a partitioned connect timing out", cut.elapsed());
    expect(
        "b -> a partitioned",
        reach_from(&ctx, "b", peer(ip_a)).await?,
        Reach::Hung,
    )?;
    expect(
        "a -> apiserver partitioned from b",
        reach_from(&ctx, "a", apiserver).await?,
        Reach::Connected,
    )?;
    ensure!(
        connects(peer(ip_a)).await && connects(peer(ip_b)).await,
        "the test process is cut off too"
    );
    partition.heal()?;
    let rules = network.partition_rules()?;
    ensure!(rules.is_empty(), "rules left after heal: {rules:?}");
    expect(
        "a -> b healed",
        reach_from(&ctx, "a", peer(ip_b)).await?,
        Reach::Connected,
    )?;
    expect(
        "b -> a healed",
        reach_from(&ctx, "b", peer(ip_a)).await?,
        Reach::Connected,
    )?;

    let isolation = network.isolate(ip_a, Some(apiserver))?;
    println!(
        "isolation {}: rules:\n{}",
        isolation.description(),
        network.partition_rules()?.join("\n")
    );
    expect(
        "a -> b isolated",
        reach_from(&ctx, "a", peer(ip_b)).await?,
        Reach::Hung,
    )?;
    expect(
        "b -> a isolated",
        reach_from(&ctx, "b", peer(ip_a)).await?,
        Reach::Hung,
    )?;
    expect(
        "a -> apiserver isolated",
        reach_from(&ctx, "a", apiserver).await?,
        Reach::Hung,
    )?;
    expect(
        "a -> itself isolated",
        reach_from(&ctx, "a", SocketAddr::from((ip_a, 2379))).await?,
        Reach::Connected,
    )?;
    expect(
        "b -> apiserver",
        reach_from(&ctx, "b", apiserver).await?,
        Reach::Connected,
    )?;
    drop(isolation);
    let rules = network.partition_rules()?;
    ensure!(
        rules.is_empty(),
        "rules left after the handle was dropped: {rules:?}"
    );
    expect(
        "a -> apiserver healed",
        reach_from(&ctx, "a", apiserver).await?,
        Reach::Connected,
    )?;

    let pids = kubelets[0].pause_pod(ctx.ns(), "a")?;
    ensure!(!pids.is_empty(), "pod a has no process");
    // SIGSTOP takes effect when each thread next runs: on a busy machine a moment later.
    poll_until(
        "every process of pod a stopped (state T)",
        Duration::from_secs(10),
        || {
            let states: Vec<Option<char>> = pids.iter().map(|p| process_state(*p)).collect();
            async move {
                if states.iter().all(|s| *s == Some('T')) {
                    anyhow::Ok(Some(()))
                } else {
                    Err(anyhow::anyhow!("paused, yet states {states:?}"))
                }
            }
        },
    )
    .await?;
    if etcd_answers(ip_a).await.is_ok() {
        bail!("a paused member answered");
    }
    kubelets[0].continue_pod(ctx.ns(), "a")?;
    poll_until("the continued member to answer", WAIT, || async {
        etcd_answers(ip_a).await.map(Some)
    })
    .await?;
    Ok(())
}
