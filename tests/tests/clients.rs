//! What clients see while the operator acts (issue 33, item 5): etcd's own Go client
//! (clientv3, default retries; `hack/clientv3-load`) writing and reading during an upgrade, a
//! scale 3 -> 5 -> 3, a replaced member, a controller restart and the users' 3.2.13 line's
//! upgrade. Two clients each time: one through the client Service (its endpoint list follows the
//! Service's ready endpoints, as a connection through the Service does; there is no kube-proxy
//! on the process kubelet), one given the member list once at the start, the way kube-apiserver
//! is (`--etcd-servers`). The client through the Service sees no failed request except at a
//! leader handover (each member leaves the Service before it is taken down: the serving
//! gate; but while the leader hands over, etcd refuses proposals: `raft proposal dropped`,
//! never applied; 3.2 has no MoveLeader and elects): at most one per client (2) per handover;
//! the one given the member list sees at most the requests in flight on a member when it
//! restarts (measured: 1 per upgrade of three members at 50 ops/s; none in a scale, a
//! replacement or a controller restart). Every history must check (linearizable, revisions).
//!
//! Run: `cargo test -p etcd-tests --test clients` (needs `hack/build-tools.sh`, including
//! `ONLY=clientv3`, first).

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use tokio::sync::oneshot;

use etcd_shared::EtcdCluster;
use etcd_tests::clientv3::{Clientv3Load, Clientv3Options, Clientv3Report};
use etcd_tests::recorder;
use etcd_tests::suite::TestContext;

use support::operator::{Controller, create_cluster, install};
use support::{
    client_service_urls, duration, manifest, member_urls, pinned_etcd, settled, wait_until,
};

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(420);
    let tests = [
        etcd_tests::Test::new("an_upgrade", an_upgrade).with_timeout(long),
        etcd_tests::Test::new("a_scale_3_5_3", a_scale_3_5_3).with_timeout(long),
        etcd_tests::Test::new("a_replaced_member", a_replaced_member).with_timeout(long),
        etcd_tests::Test::new("a_controller_restart", a_controller_restart).with_timeout(long),
        etcd_tests::Test::new("the_users_3_2_line_upgraded", the_users_3_2_line_upgraded)
            .with_timeout(long),
    ];
    etcd_tests::run_suite_with_kubelet(tests.into_iter().collect())
}

/// A clientv3 load whose endpoints follow the client Service's ready endpoints.
struct ThroughService {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<Clientv3Report>>,
}

impl ThroughService {
    async fn start(ctx: &TestContext, cluster: &str) -> anyhow::Result<Self> {
        let slices: Api<EndpointSlice> = ctx.api();
        let first = client_service_urls(&slices, cluster).await?;
        ensure!(!first.is_empty(), "no ready endpoint behind the Service");
        let mut load = Clientv3Load::start(Clientv3Options::new(
            format!("clientv3-service-{}", ctx.ns()),
            recorder::artifacts_dir(),
            first.clone(),
        ))?;
        let (stop, mut stopped) = oneshot::channel();
        let cluster = cluster.to_string();
        let task = tokio::spawn(async move {
            let mut current = first;
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
                let Ok(mut now) = client_service_urls(&slices, &cluster).await else {
                    continue;
                };
                now.sort();
                if !now.is_empty() && now != current {
                    load.set_endpoints(&now).await?;
                    current = now;
                }
            }
            Ok(load.stop().await?)
        });
        Ok(Self { stop, task })
    }

    async fn finish(self) -> anyhow::Result<Clientv3Report> {
        let _ = self.stop.send(());
        self.task.await?
    }
}

/// The two clients of one action.
struct Clients {
    service: ThroughService,
    members: Clientv3Load,
}

impl Clients {
    async fn start(ctx: &TestContext, cluster: &str) -> anyhow::Result<Self> {
        let pods: Api<Pod> = ctx.api();
        let list: Vec<String> = member_urls(&pods, cluster).await?.into_values().collect();
        let members = Clientv3Load::start(Clientv3Options::new(
            format!("clientv3-members-{}", ctx.ns()),
            recorder::artifacts_dir(),
            list,
        ))?;
        Ok(Self {
            service: ThroughService::start(ctx, cluster).await?,
            members,
        })
    }

    /// Stops both; each history must check, the client through the Service may have seen
    /// failed requests only at the `handovers` leader handovers (one in flight per client at
    /// each, refused by the leader handing over or timed out in 3.2's election), the one given
    /// the member list at most `restarted` more (the requests in flight on a member when it
    /// stops: no Service to move it off first, and clientv3 does not send a write again once
    /// it was sent).
    async fn finish(self, action: &str, restarted: u64, handovers: u64) -> anyhow::Result<()> {
        let service = self.service.finish().await?;
        let members = self.members.stop().await?;
        let mut failures = Vec::new();
        for (who, report) in [
            ("through the Service", &service),
            ("given the member list", &members),
        ] {
            let check = report.check(Duration::from_secs(60))?;
            println!(
                "clients: {action}: clientv3 {who}: {} ops, {} failed ({} not applied, {} unknown), longest without an ok write {:.0} ms, history {}",
                report.ops,
                report.failed,
                report.not_applied,
                report.unknown,
                report.longest_without_write_ms,
                if check.passed() {
                    "checks"
                } else {
                    "FAILS its checks"
                }
            );
            let row = format!(
                "| {action} | clientv3 {who} | {} | {} | {:.0} | {} |\n",
                report.ops,
                report.failed,
                report.longest_without_write_ms,
                if check.passed() { "ok" } else { "VIOLATION" }
            );
            append(&recorder::artifacts_dir().join("clients.md"), &row)?;
            let at_handovers = CLIENTS * handovers;
            let allowed = if who == "through the Service" {
                at_handovers
            } else {
                restarted + at_handovers
            };
            if report.failed > allowed {
                failures.push(format!(
                    "{who}: {} failed (at most {allowed}): {:?}",
                    report.failed, report.errors
                ));
            }
            if report.not_applied > at_handovers {
                failures.push(format!(
                    "{who}: {} refused: {:?}",
                    report.not_applied, report.errors
                ));
            }
            if !check.passed() {
                failures.push(format!("{who}: the history fails its checks: {check:?}"));
            }
        }
        ensure!(failures.is_empty(), "{action}: {}", failures.join("; "));
        Ok(())
    }
}

/// The clients of each kind: clientv3-load's default, each sending one request at a time.
const CLIENTS: u64 = 2;

fn append(path: &std::path::Path, row: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("open {}", path.display()))?;
    file.write_all(row.as_bytes())?;
    Ok(())
}

async fn running(ctx: &TestContext, name: &str, size: usize, version: &str) -> anyhow::Result<()> {
    let started = Instant::now();
    create_cluster(
        ctx,
        &manifest(name, &format!("size: {size}\nversion: {version}")),
    )
    .await?;
    wait_until(&ctx.api(), name, "settled", |c| settled(c, size, version)).await?;
    duration(&format!("{name}: {size} members Running"), started);
    Ok(())
}

async fn patch_spec(ctx: &TestContext, name: &str, spec: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await?;
    Ok(())
}

/// An upgrade 3.6 -> 3.7 of three members: each leaves the client Service before its restart.
async fn an_upgrade(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let (from, to) = (pinned_etcd("3.6")?, pinned_etcd("3.7")?);
    running(&ctx, "up", 3, &from).await?;
    let clients = Clients::start(&ctx, "up").await?;
    let at = Instant::now();
    patch_spec(&ctx, "up", serde_json::json!({"version": to})).await?;
    wait_until(&ctx.api(), "up", "upgraded", |c| settled(c, 3, &to)).await?;
    duration("up: upgrade 3.6 -> 3.7 under clientv3 load", at);
    clients
        .finish(&format!("upgrade {from} -> {to}"), 3, 1)
        .await
}

/// The users' line: 3.2.13 -> 3.3 (pods probed over TCP; the gate still moves clients first).
async fn the_users_3_2_line_upgraded(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let (from, to) = ("3.2.13".to_string(), pinned_etcd("3.3")?);
    running(&ctx, "users", 3, &from).await?;
    let clients = Clients::start(&ctx, "users").await?;
    let at = Instant::now();
    patch_spec(&ctx, "users", serde_json::json!({"version": to})).await?;
    wait_until(&ctx.api(), "users", "upgraded", |c| settled(c, 3, &to)).await?;
    duration("users: upgrade 3.2.13 -> 3.3 under clientv3 load", at);
    clients
        .finish(&format!("upgrade {from} -> {to}"), 3, 1)
        .await
}

/// A scale 3 -> 5 -> 3: the members removed leave the Service before their removal.
async fn a_scale_3_5_3(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    running(&ctx, "scale", 3, version).await?;
    let clients = Clients::start(&ctx, "scale").await?;
    let at = Instant::now();
    patch_spec(&ctx, "scale", serde_json::json!({"size": 5})).await?;
    wait_until(&ctx.api(), "scale", "5 members", |c| settled(c, 5, version)).await?;
    patch_spec(&ctx, "scale", serde_json::json!({"size": 3})).await?;
    wait_until(&ctx.api(), "scale", "3 members", |c| settled(c, 3, version)).await?;
    duration("scale: 3 -> 5 -> 3 under clientv3 load", at);
    clients.finish("scale 3 -> 5 -> 3", 0, 1).await
}

/// A member whose pod was deleted (its emptyDir data with it) is replaced.
async fn a_replaced_member(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    running(&ctx, "replace", 3, version).await?;
    let clients = Clients::start(&ctx, "replace").await?;
    let at = Instant::now();
    let pods: Api<Pod> = ctx.api();
    pods.delete("replace-1", &DeleteParams::default()).await?;
    wait_until(
        &ctx.api(),
        "replace",
        "3 members, replace-1 replaced",
        |c| {
            settled(c, 3, version)
                && c.status.as_ref().is_some_and(|s| {
                    s.members
                        .as_ref()
                        .is_some_and(|m| !m.ready.iter().any(|n| n == "replace-1"))
                })
        },
    )
    .await?;
    duration("replace: a member replaced under clientv3 load", at);
    clients.finish("a replaced member", 0, 0).await
}

/// The controller restarted in the middle of a scale-up.
async fn a_controller_restart(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let first = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    running(&ctx, "restart", 3, version).await?;
    let clients = Clients::start(&ctx, "restart").await?;
    let at = Instant::now();
    patch_spec(&ctx, "restart", serde_json::json!({"size": 5})).await?;
    wait_until(&ctx.api(), "restart", "a fourth member added", |c| {
        c.status
            .as_ref()
            .and_then(|s| s.size)
            .is_some_and(|s| s >= 4)
    })
    .await?;
    drop(first);
    let _second = Controller::start(&ctx)?;
    wait_until(&ctx.api(), "restart", "5 members", |c| {
        settled(c, 5, version)
    })
    .await?;
    duration(
        "restart: a scale-up across a controller restart under clientv3 load",
        at,
    );
    clients.finish("a controller restart", 0, 0).await
}
