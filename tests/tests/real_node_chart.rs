//! The chart on a real node (issue 25, item 3): `helm install` of the chart with its defaults
//! and the images of `hack/build-images.sh` (imported into the node's containerd, never pulled),
//! CoreDNS as the cluster's DNS, the scheduler placing every pod. The API server calls the
//! webhook through its Service (kube-proxy), the controller runs on in-cluster configuration,
//! and the users' example (etcd 3.2.13), applied with `kubectl apply` in a namespace enforcing
//! Pod Security `restricted`, runs 3 members as 65532 that find each other by their DNS names.
//! Then: a bad spec refused by the webhook, `kubectl logs` of a member, the pods' real memory
//! (cgroup) against the chart's requests and limits, 3 -> 5, a member whose container is killed
//! restarted in place as the same member, an upgrade 3.6 -> 3.7 (each member's new binary read
//! with `kubectl exec`), and `helm uninstall` (after the cluster is deleted) leaving nothing running.
//! During the 3 -> 5 and the upgrade, etcd's clientv3 (`hack/clientv3-load`) writes and reads
//! through the client Service's ClusterIP (kube-proxy's rules): 0 failed requests, its history
//! linearizable (issue 33, item 5).
//!
//! Run: `hack/build-images.sh && cargo test -p etcd-tests --test real_node_chart` (needs
//! `hack/build-tools.sh` with the node's tools, Debian's runc, root).

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

use etcd_shared::EtcdCluster;
use etcd_tests::chart::enforce_restricted;
use etcd_tests::cluster_dns;
use etcd_tests::helm::{Helm, HelmMajor};
use etcd_tests::operator::chart_dir;
use etcd_tests::poll_until;
use etcd_tests::real_node::{
    self, RealNode, RealNodeOptions, memory_cgroup, proc_status, process_in,
};
use etcd_tests::suite::{Suite, TestContext};

use support::{member_pods, pinned_etcd, settled, wait_until};

/// etcd's clientv3 through the client Service's ClusterIP of `cluster`, as a pod would reach it
/// (kube-proxy's rules, on the node's network).
async fn clientv3_through_cluster_ip(
    ctx: &TestContext,
    cluster: &str,
    what: &str,
) -> anyhow::Result<etcd_tests::clientv3::Clientv3Load> {
    let services: Api<k8s_openapi::api::core::v1::Service> = ctx.api();
    let service = services.get(&format!("{cluster}-client")).await?;
    let ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the client Service has no ClusterIP")?;
    Ok(etcd_tests::clientv3::Clientv3Load::start(
        etcd_tests::clientv3::Clientv3Options::new(
            format!("clientv3-real-node-{what}"),
            etcd_tests::recorder::artifacts_dir(),
            vec![format!("http://{ip}:2379")],
        ),
    )?)
}

/// Stops `load`: it must have seen 0 failed requests and a history that checks.
async fn no_client_failed(
    load: etcd_tests::clientv3::Clientv3Load,
    what: &str,
) -> anyhow::Result<()> {
    let report = load.stop().await?;
    let check = report.check(Duration::from_secs(60))?;
    println!(
        "clientv3 through the ClusterIP during {what}: {} ops, {} failed, longest without an ok write {:.0} ms, history {}",
        report.ops,
        report.failed,
        report.longest_without_write_ms,
        if check.passed() {
            "checks"
        } else {
            "FAILS its checks"
        }
    );
    ensure!(
        report.failed == 0 && check.passed(),
        "clientv3 through the ClusterIP during {what}: {} failed ({:?}); {check:?}",
        report.failed,
        report.errors
    );
    Ok(())
}

/// Stops `load`: at most `bound` failed requests (those in flight on a member that stopped
/// under them) and a history that checks.
async fn few_clients_failed(
    load: etcd_tests::clientv3::Clientv3Load,
    what: &str,
    bound: u64,
) -> anyhow::Result<()> {
    let report = load.stop().await?;
    let check = report.check(Duration::from_secs(60))?;
    println!(
        "clientv3 through the ClusterIP during {what}: {} ops, {} failed ({:?}), longest without an ok write {:.0} ms, history {}",
        report.ops,
        report.failed,
        report.errors,
        report.longest_without_write_ms,
        if check.passed() {
            "checks"
        } else {
            "FAILS its checks"
        }
    );
    ensure!(
        report.failed <= bound && check.passed(),
        "clientv3 through the ClusterIP during {what}: {} failed (at most {bound}: {:?}); {check:?}",
        report.failed,
        report.errors
    );
    Ok(())
}

const NODE: &str = "real-node";
const RELEASE: &str = "etcd-operator";
const CLUSTER: &str = "example-etcd-cluster";
const WAIT: Duration = Duration::from_secs(180);

fn main() -> std::process::ExitCode {
    Suite::new()
        .with_pod_network()
        // The scheduler places the chart's and the operator's pods on the node.
        .options(real_node::control_plane_options())
        .test_timeout(Duration::from_secs(900))
        .run(etcd_tests::tests![
            the_chart_runs_the_users_example_on_a_real_node
        ])
}

/// `kubectl` run to its end: (success, stdout, stderr).
fn kubectl(ctx: &TestContext, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let out = ctx.kubectl().args(args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `kubectl` with `input` on its standard input: (success, stdout, stderr).
fn kubectl_stdin(
    ctx: &TestContext,
    args: &[&str],
    input: &str,
) -> anyhow::Result<(bool, String, String)> {
    use std::io::Write as _;
    let mut child = ctx
        .kubectl()
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .context("kubectl's stdin")?
        .write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A cgroup v1 memory file of `pid`, as bytes.
fn memory_bytes(pid: u32, file: &str) -> anyhow::Result<u64> {
    Ok(std::fs::read_to_string(memory_cgroup(pid)?.join(file))?
        .trim()
        .parse()?)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / 1_048_576.0
}

async fn the_chart_runs_the_users_example_on_a_real_node(ctx: TestContext) -> anyhow::Result<()> {
    let tools = ctx.control_plane().tools();
    let example = pinned_etcd("3.2")?;
    let started = Instant::now();
    let node = RealNode::start(
        ctx.control_plane(),
        RealNodeOptions::new(
            NODE,
            tools,
            &[
                "coredns",
                "controller",
                "webhook",
                &format!("etcd-{example}"),
                &format!("etcd-{}", pinned_etcd("3.6")?),
                &format!("etcd-{}", pinned_etcd("3.7")?),
            ],
        )?
        .with_cluster_dns(),
    )
    .await?;
    let result = on_the_node(&ctx, &node, &example, started).await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(40));
        for (what, args) in [
            ("pods", vec!["get", "pods", "-A", "-o", "wide"]),
            ("events", vec!["get", "events", "-A"]),
        ] {
            if let Ok((_, out, err)) = kubectl(&ctx, &args) {
                eprintln!("--- {what}\n{out}{err}");
            }
        }
    }
    result
}

async fn on_the_node(
    ctx: &TestContext,
    node: &RealNode,
    example: &str,
    started: Instant,
) -> anyhow::Result<()> {
    let node_ready = started.elapsed();
    let versions = ctx.control_plane().tools().versions().clone();
    cluster_dns::deploy(&ctx.client(), &cluster_dns::image(&versions.coredns), WAIT).await?;
    let dns_ready = started.elapsed();

    // The chart with its defaults (images by their default names, the webhook through its
    // Service), in a namespace enforcing Pod Security `restricted`.
    enforce_restricted(ctx).await?;
    let helm = Helm::new(ctx.control_plane(), HelmMajor::V3)?;
    let chart = chart_dir();
    let chart = chart.to_string_lossy();
    let installing = Instant::now();
    helm.run([
        "install",
        RELEASE,
        &chart,
        "--namespace",
        ctx.ns(),
        "--wait",
        "--timeout",
        "5m",
    ])
    .await?;
    let installed = installing.elapsed();

    // The users' example, unchanged, with kubectl apply.
    let example_file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/example-etcd-cluster.yaml");
    let applying = Instant::now();
    // `helm install --wait` returns once the webhook's pods are Ready; kube-proxy programs
    // its Service a moment later (seen under CI load: `connection refused` on the ClusterIP).
    // A refused connection to the webhook is waited out (the API server then refuses the
    // object: nothing was created); any other answer decides.
    let (ok, out, err) = loop {
        let (ok, out, err) = kubectl(
            ctx,
            &[
                "apply",
                "-n",
                ctx.ns(),
                "-f",
                &example_file.to_string_lossy(),
            ],
        )?;
        let webhook_unreachable =
            !ok && err.contains("failed calling webhook") && err.contains("connection refused");
        if !webhook_unreachable || applying.elapsed() > Duration::from_secs(30) {
            break (ok, out, err);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    ensure!(ok, "kubectl apply of the example: {out}{err}");
    println!(
        "the example applied {:.1} s after helm install returned",
        applying.elapsed().as_secs_f64()
    );
    let clusters: Api<EtcdCluster> = ctx.api();
    wait_until(&clusters, CLUSTER, "3 members Running", |c| {
        settled(c, 3, example)
    })
    .await?;
    let running = applying.elapsed();

    // Every member runs as 65532, as the kernel sees it, and logs to kubectl logs.
    let pods: Api<Pod> = ctx.api();
    let members = member_pods(&pods, CLUSTER).await?;
    ensure!(members.len() == 3, "members: {:?}", members.keys());
    let mut member_memory = Vec::new();
    for name in members.keys() {
        let pid = process_in(node.cgroup(), &format!("--name={name}\0"))
            .with_context(|| format!("no etcd process of {name} on the node"))?;
        let uid = proc_status(pid, "Uid")?;
        ensure!(uid == "65532\t65532\t65532\t65532", "{name} runs as {uid}");
        member_memory.push(memory_bytes(pid, "memory.usage_in_bytes")?);
    }
    let first = members.keys().next().context("no member")?;
    let (ok, logs, err) = kubectl(ctx, &["logs", "-n", ctx.ns(), first, "-c", "etcd"])?;
    ensure!(
        ok && logs.contains("ready to serve client requests"),
        "kubectl logs {first}: {logs}{err}"
    );

    // The webhook, called through its Service, refuses a bad spec at kubectl apply.
    let bad = ctx.control_plane().dir().join("bad-cluster.yaml");
    std::fs::write(
        &bad,
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: bad\nspec:\n  size: 3\n  version: \"2.3.8\"\n",
    )?;
    let (ok, out, err) = kubectl(
        ctx,
        &["apply", "-n", ctx.ns(), "-f", &bad.to_string_lossy()],
    )?;
    // (The words are the webhook's rule; the CRD's schema has no version rule.)
    ensure!(
        !ok && err.contains("spec.version: 2.3.8 is older than the operator supports"),
        "a bad spec was not refused by the webhook: {out}{err}"
    );

    // The operator's own pods: real memory against the chart's requests and limits.
    let controller = process_in(node.cgroup(), "/usr/local/bin/etcd-controller\0")
        .context("no controller process on the node")?;
    let webhook = process_in(node.cgroup(), "/usr/local/bin/etcd-webhook\0")
        .context("no webhook process on the node")?;
    for (what, pid, limit) in [("controller", controller, 256), ("webhook", webhook, 192)] {
        let uid = proc_status(pid, "Uid")?;
        ensure!(
            uid == "65532\t65532\t65532\t65532",
            "the {what} runs as {uid}"
        );
        let set = memory_bytes(pid, "memory.limit_in_bytes")?;
        ensure!(set == limit * 1_048_576, "{what}'s memory limit is {set}");
    }

    // 3 -> 5 with kubectl scale (the CRD's scale subresource, judged by the webhook).
    let load = clientv3_through_cluster_ip(ctx, CLUSTER, "scale").await?;
    let scaling = Instant::now();
    let (ok, out, err) = kubectl(
        ctx,
        &[
            "scale",
            "-n",
            ctx.ns(),
            &format!("etcdcluster/{CLUSTER}"),
            "--replicas=5",
        ],
    )?;
    ensure!(ok, "kubectl scale: {out}{err}");
    wait_until(&clusters, CLUSTER, "5 members Running", |c| {
        settled(c, 5, example)
    })
    .await?;
    let scaled = scaling.elapsed();
    no_client_failed(load, "3 -> 5").await?;

    // A member's container killed (as an OOM kill or a crash ends it): the kubelet restarts it
    // in place (`restartPolicy: Always`), on its emptyDir data, as the same member.
    let victim = member_pods(&pods, CLUSTER)
        .await?
        .keys()
        .last()
        .context("no member")?
        .clone();
    let pid = process_in(node.cgroup(), &format!("--name={victim}\0"))
        .with_context(|| format!("no etcd process of {victim}"))?;
    let killing = Instant::now();
    kill(pid)?;
    poll_until(
        "the killed member restarted and the cluster settled",
        WAIT,
        || async {
            let pod = pods.get(&victim).await?;
            let restarts = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.iter().find(|c| c.name == "etcd"))
                .map_or(0, |c| c.restart_count);
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let again = process_in(node.cgroup(), &format!("--name={victim}\0"));
            let c = clusters.get(CLUSTER).await?;
            Ok::<_, anyhow::Error>(
                (restarts >= 1
                    && ready
                    && again.is_some_and(|p| p != pid)
                    && settled(&c, 5, example))
                .then_some(()),
            )
        },
    )
    .await?;
    let restarted = killing.elapsed();
    let now = member_pods(&pods, CLUSTER).await?;
    ensure!(
        now.len() == 5 && now.contains_key(&victim),
        "the members after the kill: {:?}",
        now.keys()
    );

    // Under clientv3 through the ClusterIP: 5 -> 3, a member whose pod is deleted (its
    // emptyDir data with it) replaced, and the controller's pod deleted (its Deployment makes
    // another, which goes on).
    let load = clientv3_through_cluster_ip(ctx, CLUSTER, "scale-down-replace-restart").await?;
    let moving = Instant::now();
    let (ok, out, err) = kubectl(
        ctx,
        &[
            "scale",
            "-n",
            ctx.ns(),
            &format!("etcdcluster/{CLUSTER}"),
            "--replicas=3",
        ],
    )?;
    ensure!(ok, "kubectl scale: {out}{err}");
    wait_until(&clusters, CLUSTER, "3 members Running", |c| {
        settled(c, 3, example)
    })
    .await?;
    // Through a ClusterIP a connection stays on its backend (conntrack) after the serving gate
    // took the member out of the Service: the request in flight on a removed member fails
    // (CI measured 0 and 2 of ~900). At most one per member removed.
    few_clients_failed(load, "5 -> 3", 2).await?;
    // A member pod deleted by a person is a fault, not an operator action: etcd stops on the
    // kubelet's SIGTERM with the requests in flight on it (a connection through the ClusterIP
    // stays on its backend until that backend closes it). Counted, bounded, the history checked.
    let load = clientv3_through_cluster_ip(ctx, CLUSTER, "replace-restart").await?;
    let replaced = member_pods(&pods, CLUSTER)
        .await?
        .keys()
        .next()
        .context("no member")?
        .clone();
    pods.delete(&replaced, &DeleteParams::default()).await?;
    wait_until(&clusters, CLUSTER, "the deleted member replaced", |c| {
        settled(c, 3, example)
            && c.status.as_ref().is_some_and(|s| {
                s.members
                    .as_ref()
                    .is_some_and(|m| !m.ready.iter().any(|n| n == &replaced))
            })
    })
    .await?;
    let controller_pods = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await?;
    for pod in &controller_pods.items {
        if let Some(name) = &pod.metadata.name {
            pods.delete(name, &DeleteParams::default()).await?;
        }
    }
    poll_until("a new controller pod Ready", WAIT, || async {
        let now = pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
            .await?;
        let fresh = now.items.iter().any(|p| {
            !controller_pods
                .items
                .iter()
                .any(|old| old.metadata.uid == p.metadata.uid)
                && p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
        Ok::<_, anyhow::Error>(fresh.then_some(()))
    })
    .await?;
    let moved = moving.elapsed();
    few_clients_failed(load, "a deleted member pod and a controller restart", 2).await?;
    let controller = process_in(node.cgroup(), "/usr/local/bin/etcd-controller\0")
        .context("no controller process on the node after its restart")?;
    println!(
        "figures: 5 -> 3, a member replaced and the controller restarted in {:.1} s under clientv3 load",
        moved.as_secs_f64()
    );

    // An upgrade on the node: a 3-member cluster of 3.6, then `version: 3.7.x`; the kubelet
    // restarts each member's container on the new image, one at a time.
    let upgrading = Instant::now();
    let from = pinned_etcd("3.6")?;
    let to = pinned_etcd("3.7")?;
    let (ok, out, err) = kubectl_stdin(
        ctx,
        &["apply", "-n", ctx.ns(), "-f", "-"],
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: upgraded\nspec:\n  size: 3\n  version: \"{from}\"\n"
        ),
    )?;
    ensure!(ok, "kubectl apply of a 3.6 cluster: {out}{err}");
    wait_until(&clusters, "upgraded", "3 members of 3.6", |c| {
        settled(c, 3, &from)
    })
    .await?;
    let created = upgrading.elapsed();
    let load = clientv3_through_cluster_ip(ctx, "upgraded", "upgrade").await?;
    let upgrading = Instant::now();
    let (ok, out, err) = kubectl(
        ctx,
        &[
            "patch",
            "-n",
            ctx.ns(),
            "etcdcluster/upgraded",
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"version":"{to}"}}}}"#),
        ],
    )?;
    ensure!(ok, "kubectl patch to {to}: {out}{err}");
    wait_until(&clusters, "upgraded", "3 members of 3.7", |c| {
        settled(c, 3, &to)
    })
    .await?;
    let upgraded = upgrading.elapsed();
    // One leader handover (MoveLeader, then the old leader restarts): while it hands over,
    // etcd refuses proposals (`raft proposal dropped`, never applied): at most one request
    // per client (2) in flight then.
    few_clients_failed(load, &format!("the upgrade {from} -> {to}"), 2).await?;
    for name in member_pods(&pods, "upgraded").await?.keys() {
        let pid = process_in(node.cgroup(), &format!("--name={name}\0"))
            .with_context(|| format!("no etcd process of {name}"))?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"))?;
        let (ok, version, err) = kubectl(
            ctx,
            &[
                "exec",
                "-n",
                ctx.ns(),
                name,
                "-c",
                "etcd",
                "--",
                "/usr/local/bin/etcd",
                "--version",
            ],
        )?;
        ensure!(
            ok && version.contains(&format!("etcd Version: {to}")),
            "{name} ({}) runs: {version}{err}",
            exe.display()
        );
    }

    // Memory of the operator's pods, after all of that.
    let controller_now = memory_bytes(controller, "memory.usage_in_bytes")?;
    let webhook_now = memory_bytes(webhook, "memory.usage_in_bytes")?;
    let controller_rss = proc_status(controller, "VmRSS")?;
    let webhook_rss = proc_status(webhook, "VmRSS")?;

    // The cluster deleted (its members go with it), then helm uninstall: nothing of the
    // operator's left running on the node.
    clusters.delete(CLUSTER, &DeleteParams::default()).await?;
    clusters
        .delete("upgraded", &DeleteParams::default())
        .await?;
    poll_until("the members gone", WAIT, || async {
        let left = [
            member_pods(&pods, CLUSTER).await?,
            member_pods(&pods, "upgraded").await?,
        ];
        let left: Vec<&String> = left.iter().flat_map(|m| m.keys()).collect();
        Ok::<_, anyhow::Error>(
            (left.is_empty() && process_in(node.cgroup(), "/usr/local/bin/etcd\0").is_none())
                .then_some(()),
        )
    })
    .await?;
    helm.run(["uninstall", RELEASE, "--namespace", ctx.ns(), "--wait"])
        .await?;
    poll_until("the operator's processes gone", WAIT, || async {
        let pods_left = pods.list(&ListParams::default()).await?.items.len();
        let running = process_in(node.cgroup(), "/usr/local/bin/etcd-controller\0")
            .or_else(|| process_in(node.cgroup(), "/usr/local/bin/etcd-webhook\0"));
        Ok::<_, anyhow::Error>((pods_left == 0 && running.is_none()).then_some(()))
    })
    .await?;

    println!(
        "figures: node Ready {:.1} s, CoreDNS ready {:.1} s after start; helm install --wait \
         {:.1} s; the users' example ({example}) Running with 3 members {:.1} s after kubectl \
         apply; 3 -> 5 {:.1} s; a member whose container was killed back {:.1} s; {from} cluster of 3 \
         Running {:.1} s after apply, upgraded to {to} {:.1} s after the patch; memory (cgroup \
         usage, RSS): controller {:.1} MiB, {controller_rss} (chart: request 64 MiB, limit 256 \
         MiB), webhook {:.1} MiB, {webhook_rss} (request 32 MiB, limit 192 MiB), the example's \
         members {}",
        node_ready.as_secs_f64(),
        dns_ready.as_secs_f64(),
        installed.as_secs_f64(),
        running.as_secs_f64(),
        scaled.as_secs_f64(),
        restarted.as_secs_f64(),
        created.as_secs_f64(),
        upgraded.as_secs_f64(),
        mib(controller_now),
        mib(webhook_now),
        member_memory
            .iter()
            .map(|b| format!("{:.1} MiB", mib(*b)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}

/// SIGKILL to `pid` (the container's main process, as an OOM kill or a crash ends it).
fn kill(pid: u32) -> anyhow::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    ensure!(status.success(), "kill -KILL {pid}: {status}");
    Ok(())
}
