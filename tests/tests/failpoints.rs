//! The controller killed between two calls of one step (issue 33, item 4): a failpoint stops
//! it right after a MemberAdd (before the new member's pod exists), right after a MemberRemove
//! (before the removed member's pod is deleted), right after an upgrade's first image patch,
//! and right after a recovery's new first member was created (before the status records it).
//! A new controller then takes over from whatever the cluster was left in. Client traffic is
//! recorded throughout and checked (linearizability, watches, revisions, hashes).
//!
//! Run: `cargo test -p etcd-tests --test failpoints` (needs `hack/build-tools.sh` first).

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::time::{Duration, Instant};

use anyhow::ensure;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};

use etcd_shared::EtcdCluster;
use etcd_shared::version::DEFAULT_VERSION;
use etcd_tests::poll_until;
use etcd_tests::recorder::{self, Recorder, RecorderOptions};
use etcd_tests::suite::TestContext;

use support::operator::{Controller, create_cluster, install};
use support::{
    WAIT, client_service_urls, duration, manifest, member_list, member_pods, member_urls,
    pinned_etcd, settled, wait_until,
};

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(420);
    let tests = [
        etcd_tests::Test::new(
            "killed_after_a_member_add_the_next_controller_finishes_the_scale_up",
            killed_after_a_member_add_the_next_controller_finishes_the_scale_up,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "killed_after_a_member_remove_the_next_controller_finishes_the_scale_down",
            killed_after_a_member_remove_the_next_controller_finishes_the_scale_down,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "killed_mid_upgrade_the_next_controller_finishes_it",
            killed_mid_upgrade_the_next_controller_finishes_it,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "killed_mid_recovery_the_next_controller_finishes_it",
            killed_mid_recovery_the_next_controller_finishes_it,
        )
        .with_timeout(long),
    ];
    etcd_tests::run_suite_with_kubelet(tests.into_iter().collect())
}

/// Creates a cluster of `size` at `version` with `spec` and waits until it runs.
async fn running(
    ctx: &TestContext,
    name: &str,
    size: usize,
    version: &str,
    spec: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    create_cluster(
        ctx,
        &manifest(name, &format!("size: {size}\nversion: {version}\n{spec}")),
    )
    .await?;
    wait_until(&ctx.api(), name, "settled", |c| settled(c, size, version)).await?;
    duration(&format!("{name}: {size} members Running"), started);
    Ok(())
}

/// Records client traffic on the cluster's client Service endpoints and member pod IPs.
async fn record(ctx: &TestContext, name: &str) -> anyhow::Result<Recorder> {
    let (slices, pods): (Api<EndpointSlice>, Api<Pod>) = (ctx.api(), ctx.api());
    let cluster = name.to_string();
    let (endpoints, _feed) = recorder::feed(Duration::from_millis(500), move || {
        let (slices, pods, cluster) = (slices.clone(), pods.clone(), cluster.clone());
        async move {
            let mut urls = client_service_urls(&slices, &cluster).await?;
            for url in member_urls(&pods, &cluster).await?.into_values() {
                if !urls.contains(&url) {
                    urls.push(url);
                }
            }
            anyhow::Ok(urls)
        }
    })
    .await;
    Ok(Recorder::start(RecorderOptions::new(
        format!("failpoint-{}", ctx.ns()),
        recorder::artifacts_dir(),
        endpoints,
    ))
    .await?)
}

/// Stops the recording and checks its history.
async fn checked(ctx: &TestContext, name: &str, recording: Recorder) -> anyhow::Result<()> {
    let pods: Api<Pod> = ctx.api();
    let members: Vec<String> = member_urls(&pods, name).await?.into_values().collect();
    let report = recording.finish(&members).await?;
    println!("{report}");
    report.append_markdown_row(&recorder::artifacts_dir().join("failpoints.md"))?;
    ensure!(
        report.passed(),
        "the recorded history fails its checks:\n{report}"
    );
    Ok(())
}

/// Waits until `controller` was killed at its failpoint.
async fn until_killed(controller: &Controller, what: &str) -> anyhow::Result<()> {
    poll_until(what, WAIT, || {
        let killed = controller.killed();
        async move { anyhow::Ok(killed.then_some(())) }
    })
    .await?;
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

/// The member list as the first member pod reports it: (name, learner) by member ID.
async fn members_of(ctx: &TestContext, name: &str) -> anyhow::Result<Vec<(String, bool)>> {
    let pods: Api<Pod> = ctx.api();
    let urls = member_urls(&pods, name).await?;
    for url in urls.values() {
        if let Ok(list) = member_list(url).await {
            return Ok(list.into_values().collect());
        }
    }
    anyhow::bail!("no member answered its member list")
}

/// Killed right after a MemberAdd of a scale 3 -> 4: the member is in etcd's list, its pod
/// does not exist, the status says nothing. The next controller creates its pod (it never adds
/// a second member, which would leave an unstarted voter and a lower fault tolerance).
async fn killed_after_a_member_add_the_next_controller_finishes_the_scale_up(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let first = Controller::start(&ctx)?;
    running(&ctx, "add", 3, DEFAULT_VERSION, "").await?;
    drop(first);
    let recording = record(&ctx, "add").await?;
    let doomed = Controller::start_killed_at(&ctx, "after-member-add")?;
    patch_spec(&ctx, "add", serde_json::json!({"size": 4})).await?;
    until_killed(&doomed, "killed after the MemberAdd").await?;
    let listed = members_of(&ctx, "add").await?;
    println!("add: killed after the MemberAdd; etcd lists {listed:?}");
    ensure!(listed.len() == 4, "the add was not made: {listed:?}");
    let at = Instant::now();
    let _next = Controller::start(&ctx)?;
    wait_until(&ctx.api(), "add", "4 members", |c| {
        settled(c, 4, DEFAULT_VERSION)
    })
    .await?;
    duration("add: the next controller finished the scale-up", at);
    let listed = members_of(&ctx, "add").await?;
    ensure!(
        listed.len() == 4 && listed.iter().all(|(n, learner)| !n.is_empty() && !learner),
        "members after: {listed:?}"
    );
    checked(&ctx, "add", recording).await
}

/// Killed right after a MemberRemove of a scale 3 -> 2: the member is out of etcd's list, its
/// pod still runs. The next controller deletes the pod (it is not a member any more).
async fn killed_after_a_member_remove_the_next_controller_finishes_the_scale_down(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let first = Controller::start(&ctx)?;
    running(&ctx, "remove", 3, DEFAULT_VERSION, "").await?;
    drop(first);
    let recording = record(&ctx, "remove").await?;
    let doomed = Controller::start_killed_at(&ctx, "after-member-remove")?;
    patch_spec(&ctx, "remove", serde_json::json!({"size": 2})).await?;
    until_killed(&doomed, "killed after the MemberRemove").await?;
    let pods: Api<Pod> = ctx.api();
    let left = member_pods(&pods, "remove").await?;
    println!(
        "remove: killed after the MemberRemove; pods {:?}",
        left.keys().collect::<Vec<_>>()
    );
    let at = Instant::now();
    let _next = Controller::start(&ctx)?;
    wait_until(&ctx.api(), "remove", "2 members", |c| {
        settled(c, 2, DEFAULT_VERSION)
    })
    .await?;
    poll_until("the removed member's pod gone", WAIT, || async {
        anyhow::Ok((member_pods(&pods, "remove").await?.len() == 2).then_some(()))
    })
    .await?;
    duration("remove: the next controller finished the scale-down", at);
    checked(&ctx, "remove", recording).await
}

/// Killed right after the first image patch of an upgrade 3.6 -> 3.7: the status still says
/// nothing of it. The next controller waits for that member, then moves the others one at a
/// time.
async fn killed_mid_upgrade_the_next_controller_finishes_it(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let from = pinned_etcd("3.6")?;
    let to = pinned_etcd("3.7")?;
    let first = Controller::start(&ctx)?;
    running(&ctx, "upgrade", 3, &from, "").await?;
    drop(first);
    let recording = record(&ctx, "upgrade").await?;
    let doomed = Controller::start_killed_at(&ctx, "mid-upgrade")?;
    patch_spec(&ctx, "upgrade", serde_json::json!({"version": to})).await?;
    until_killed(&doomed, "killed after the first image patch").await?;
    let at = Instant::now();
    let _next = Controller::start(&ctx)?;
    wait_until(
        &ctx.api(),
        "upgrade",
        "every member on the new version",
        |c| settled(c, 3, &to),
    )
    .await?;
    duration("upgrade: the next controller finished the upgrade", at);
    checked(&ctx, "upgrade", recording).await
}

/// Killed right after a recovery's new first member was created, before the status records
/// it: the next controller finds the seed it made (never a second one) and finishes the
/// recovery. The recovery is announced (an epoch): writes the lost members alone had may be
/// gone, revisions restart bumped.
async fn killed_mid_recovery_the_next_controller_finishes_it(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    etcd_tests::operator::OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let first = Controller::start(&ctx)?;
    running(
        &ctx,
        "lost",
        3,
        DEFAULT_VERSION,
        "recovery:\n  policy: Automatic",
    )
    .await?;
    drop(first);
    let recording = record(&ctx, "lost").await?;
    let doomed = Controller::start_killed_at(&ctx, "mid-recovery")?;
    let pods: Api<Pod> = ctx.api();
    let api: Api<EtcdCluster> = ctx.api();
    for lost in ["lost-1", "lost-2"] {
        pods.delete(
            lost,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    }
    wait_until(&api, "lost", "a recovery started", |c| {
        c.status.as_ref().is_some_and(|s| s.recovery.is_some())
    })
    .await?;
    recording.epoch("recovery").await;
    until_killed(&doomed, "killed after the seed was created").await?;
    let seeds_before: Vec<String> = member_pods(&pods, "lost")
        .await?
        .into_keys()
        .filter(|n| n != "lost-0")
        .collect();
    println!("lost: killed with the seed created: {seeds_before:?}");
    let at = Instant::now();
    let _next = Controller::start(&ctx)?;
    let done = wait_until(&api, "lost", "recovered, 3 members", |c| {
        settled(c, 3, DEFAULT_VERSION)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    duration("lost: the next controller finished the recovery", at);
    let members: Vec<String> = done
        .status
        .and_then(|s| s.members)
        .map(|m| m.ready)
        .unwrap_or_default();
    ensure!(
        seeds_before.iter().all(|s| members.contains(s)),
        "the seed made before the kill ({seeds_before:?}) is not among the members {members:?}: a second one was made"
    );
    checked(&ctx, "lost", recording).await
}
