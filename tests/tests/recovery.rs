//! Disaster recovery on real etcd members (issue 24): a cluster that lost quorum for good comes
//! back from its best survivor, under `spec.recovery.policy: Automatic` or once approved under
//! `Manual`; a temporary loss is waited for, never recovered from. The webhook and the
//! controller run in this process; the process kubelet runs the members and the new first
//! member's restore steps (the operator's binary as its init containers).
//!
//! Run: `cargo test -p etcd-tests --test recovery` (needs `hack/build-tools.sh` and `cargo build
//! -p etcd-controller -p etcd-webhook` first). Durations on lines starting with `duration:`.

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};

use etcd_shared::EtcdCluster;
use etcd_shared::types::ClusterPhase;
use etcd_tests::operator::OperatorBinaries;
use etcd_tests::poll_until;
use etcd_tests::suite::TestContext;

use support::operator::{Controller, create_cluster, install};
use support::phases::PhaseWatch;
use support::{
    WAIT, bulk_put, check_every_member, degraded_for, events, manifest, member_pods, pinned_etcd,
    settled, wait_until,
};

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(600);
    let tests = [
        etcd_tests::Test::new(
            "a_cluster_whose_majority_lost_its_data_recovers_from_the_survivor",
            a_cluster_whose_majority_lost_its_data_recovers_from_the_survivor,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "manual_waits_with_the_survivor_untouched_then_recovers_once_approved",
            manual_waits_with_the_survivor_untouched_then_recovers_once_approved,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "the_users_example_on_3_2_recovers_from_its_survivor",
            the_users_example_on_3_2_recovers_from_its_survivor,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_temporary_loss_is_waited_for_never_recovered",
            a_temporary_loss_is_waited_for_never_recovered,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_recovery_interrupted_by_a_controller_restart_goes_on_once",
            a_recovery_interrupted_by_a_controller_restart_goes_on_once,
        )
        .with_timeout(long),
    ];
    etcd_tests::run_suite_with_kubelet(tests.into_iter().collect())
}

/// Creates a 3-member cluster of `version` with `spec` lines, waits until it runs, writes 200
/// keys; returns them.
async fn running_with_keys(
    ctx: &TestContext,
    name: &str,
    version: &str,
    spec: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let started = Instant::now();
    create_cluster(
        ctx,
        &manifest(name, &format!("size: 3\nversion: {version}\n{spec}")),
    )
    .await?;
    wait_until(&ctx.api(), name, "3 members", |c| settled(c, 3, version)).await?;
    support::duration(&format!("{name}: 3 members Running"), started);
    let slices: Api<EndpointSlice> = ctx.api();
    let keys = bulk_put(&slices, name, "/k/", 200, 8).await?;
    ensure!(
        keys.len() == 200,
        "{} of 200 writes acknowledged",
        keys.len()
    );
    Ok(keys)
}

/// Deletes the pods of two of the three (emptyDir) members: their data goes with them, and
/// quorum with it. Returns the survivor's name and its pod's UID.
async fn lose_two(ctx: &TestContext, name: &str) -> anyhow::Result<(String, String)> {
    let pods: Api<Pod> = ctx.api();
    let members = member_pods(&pods, name).await?;
    let mut names: Vec<&String> = members.keys().collect();
    names.sort();
    let survivor = names[0].clone();
    let uid = members[&survivor].uid().context("uid")?;
    for lost in &names[1..] {
        pods.delete(
            lost,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    }
    Ok((survivor, uid))
}

/// Waits until the cluster is recovered: Running with 3 members again, `lastRecovery` set;
/// checks every key on every member and that the survivor's pod is gone.
async fn recovered(
    ctx: &TestContext,
    name: &str,
    version: &str,
    keys: &BTreeMap<String, String>,
    survivor: &str,
    since: Instant,
) -> anyhow::Result<EtcdCluster> {
    let api: Api<EtcdCluster> = ctx.api();
    let done = wait_until(&api, name, "recovered and Running with 3 members", |c| {
        settled(c, 3, version)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    support::duration(
        &format!("{name}: quorum lost for good -> Running, 3 members"),
        since,
    );
    let last = done
        .status
        .as_ref()
        .and_then(|s| s.last_recovery.clone())
        .context("lastRecovery")?;
    println!("{name}: lastRecovery {last:?}");
    // Two of three members lose their data; when the controller sees the first loss while the
    // second member still answers, it rightly replaces the first (removed from the membership
    // with quorum), and the quorum of the two voters left is then lost with one of them.
    ensure!(
        last.source == format!("member {survivor}") && (1..=2).contains(&last.members_lost),
        "{last:?}"
    );
    let pods: Api<Pod> = ctx.api();
    let now = member_pods(&pods, name).await?;
    ensure!(
        !now.contains_key(survivor),
        "the lost cluster's survivor still runs: {:?}",
        now.keys().collect::<Vec<_>>()
    );
    check_every_member(&pods, name, "/k/", keys, 3).await?;
    Ok(done)
}

/// Issue 24: 3 emptyDir members of 3.6, two pods deleted (their data with them): under
/// `Automatic` the survivor's snapshot is verified, a new cluster is seeded from it (revisions
/// bumped, marked compacted) and grown back to 3; every key the survivor held is there, and a
/// watcher resuming from a revision before the loss gets `compacted` instead of silence.
async fn a_cluster_whose_majority_lost_its_data_recovers_from_the_survivor(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let controller = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    let keys = running_with_keys(&ctx, "auto", version, "recovery:\n  policy: Automatic").await?;
    let pods: Api<Pod> = ctx.api();
    let urls = support::member_urls(&pods, "auto").await?;
    let mut client = support::connect(&urls.values().cloned().collect::<Vec<_>>()).await?;
    let before = client
        .get("/k/", Some(etcd_client::GetOptions::new().with_prefix()))
        .await?
        .header()
        .map_or(0, |h| h.revision());
    let phases = PhaseWatch::start(ctx.api(), "auto");
    let (survivor, _) = lose_two(&ctx, "auto").await?;
    let lost_at = Instant::now();
    recovered(&ctx, "auto", version, &keys, &survivor, lost_at).await?;
    let phases = phases.stop().await?;
    println!(
        "auto: phases {:?}",
        phases.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    ensure!(
        phases.iter().any(|(p, _)| *p == ClusterPhase::Recovering),
        "{phases:?}"
    );
    ensure!(
        controller.counter("etcd_controller_recoveries_total", "source", "member") == 1,
        "recoveries_total"
    );
    // A watcher that resumes from a revision before the loss: compacted (3.5+ restore with
    // --bump-revision --mark-compacted), not a silent gap.
    let urls = support::member_urls(&pods, "auto").await?;
    let mut client = support::connect(&urls.values().cloned().collect::<Vec<_>>()).await?;
    let mut stream = client
        .watch(
            "/k/",
            Some(
                etcd_client::WatchOptions::new()
                    .with_prefix()
                    .with_start_revision(before + 1),
            ),
        )
        .await?;
    // The first answer says the watch was created; the next one says what became of it.
    let answer = tokio::time::timeout(WAIT, async {
        loop {
            let message = stream.message().await?.context("the watch ended")?;
            if message.compact_revision() > 0 || !message.events().is_empty() || message.canceled()
            {
                return anyhow::Ok(message);
            }
        }
    })
    .await
    .context("the resumed watch never answered")??;
    ensure!(
        answer.compact_revision() > before,
        "resumed from {}: compact revision {}, canceled {}, {} events",
        before + 1,
        answer.compact_revision(),
        answer.canceled(),
        answer.events().len()
    );
    let revision = client
        .get("/k/", None)
        .await?
        .header()
        .map_or(0, |h| h.revision());
    ensure!(
        revision > 1_000_000_000,
        "revisions were not bumped: {revision}"
    );
    for reason in ["RecoveryStarted", "Recovered"] {
        ensure!(!events(&ctx, reason).await?.is_empty(), "no {reason} event");
    }
    Ok(())
}

/// Issue 24: under `Manual` (the default) the status says the loss is permanent and gives the
/// exact command; the survivor is untouched meanwhile (same pod, nothing started). Once
/// annotated, the cluster recovers and the annotation is removed, with an Event.
async fn manual_waits_with_the_survivor_untouched_then_recovers_once_approved(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    let keys = running_with_keys(&ctx, "manual", version, "").await?;
    let (survivor, uid) = lose_two(&ctx, "manual").await?;
    let lost_at = Instant::now();
    let api: Api<EtcdCluster> = ctx.api();
    let message = degraded_for(&api, "manual", "QuorumLostForGood").await?;
    println!("manual: {message}");
    let command = format!(
        "kubectl annotate etcdcluster manual -n {} etcd.database.coreos.com/recover=now",
        ctx.ns()
    );
    ensure!(
        message.contains(&command) && message.contains(&format!("member {survivor}")),
        "{message}"
    );
    // Several reconciles later: the survivor is the same pod, nothing started.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let pods: Api<Pod> = ctx.api();
    ensure!(
        pods.get(&survivor).await?.uid().as_deref() == Some(uid.as_str()),
        "the survivor was touched before the approval"
    );
    ensure!(events(&ctx, "RecoveryStarted").await?.is_empty());
    api.patch(
        "manual",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            "etcd.database.coreos.com/recover": "now"}}})),
    )
    .await?;
    let done = recovered(&ctx, "manual", version, &keys, &survivor, lost_at).await?;
    ensure!(
        done.annotations()
            .get("etcd.database.coreos.com/recover")
            .is_none(),
        "the approval annotation was left"
    );
    ensure!(!events(&ctx, "RecoveryApproved").await?.is_empty());
    Ok(())
}

/// Issue 24: the users' example line, 3.2.13 (no learners, no --bump-revision): the same
/// recovery from the survivor, every key back.
async fn the_users_example_on_3_2_recovers_from_its_survivor(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let version = pinned_etcd("3.2")?;
    let keys =
        running_with_keys(&ctx, "example", &version, "recovery:\n  policy: Automatic").await?;
    let (survivor, _) = lose_two(&ctx, "example").await?;
    recovered(&ctx, "example", &version, &keys, &survivor, Instant::now()).await?;
    Ok(())
}

/// Issue 24: a temporary loss (two of three durable members frozen: their data is on their
/// claims and their pods still run) is reported and waited for, never recovered from, under
/// `Automatic` too; the same members come back.
async fn a_temporary_loss_is_waited_for_never_recovered(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    let keys = running_with_keys(
        &ctx,
        "paused",
        version,
        "recovery:\n  policy: Automatic\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi",
    )
    .await?;
    let pods: Api<Pod> = ctx.api();
    let members = member_pods(&pods, "paused").await?;
    let mut names: Vec<String> = members.keys().cloned().collect();
    names.sort();
    let uids: Vec<Option<String>> = names.iter().map(|n| members[n].uid()).collect();
    let kubelet = ctx.kubelet()?;
    let mut frozen = Vec::new();
    for name in &names[1..] {
        let pid = kubelet
            .container_pid(ctx.ns(), name)
            .with_context(|| format!("{name} runs no process"))?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)?;
        frozen.push(pid);
    }
    let thaw = || {
        for pid in &frozen {
            let _ = nix::sys::signal::kill(*pid, nix::sys::signal::Signal::SIGCONT);
        }
    };
    let api: Api<EtcdCluster> = ctx.api();
    let waited = async {
        let message = degraded_for(&api, "paused", "QuorumLost").await?;
        println!("paused: {message}");
        ensure!(
            message.contains("can come back") && message.contains("Automatic"),
            "{message}"
        );
        // Many reconciles later (2 s apart while quorum is lost): still no recovery.
        tokio::time::sleep(Duration::from_secs(15)).await;
        let now = api.get("paused").await?;
        let status = now.status.context("status")?;
        if status.recovery.is_some() || !events(&ctx, "RecoveryStarted").await?.is_empty() {
            bail!("a temporary loss was recovered from: {status:?}");
        }
        anyhow::Ok(())
    }
    .await;
    thaw();
    waited?;
    wait_until(&api, "paused", "the same members back", |c| {
        settled(c, 3, version)
    })
    .await?;
    let back = member_pods(&pods, "paused").await?;
    let back_uids: Vec<Option<String>> = names
        .iter()
        .map(|n| back.get(n).and_then(|p| p.uid()))
        .collect();
    ensure!(back_uids == uids, "the members were replaced");
    check_every_member(&pods, "paused", "/k/", &keys, 3).await?;
    poll_until("no recovery recorded", Duration::from_secs(1), || async {
        let c = api.get("paused").await?;
        anyhow::Ok(
            c.status
                .is_some_and(|s| s.last_recovery.is_none())
                .then_some(()),
        )
    })
    .await?;
    Ok(())
}

/// Issue 24: a recovery interrupted by a controller restart (the controller stopped the moment
/// `status.recovery` is written) goes on from its record under the next controller: one
/// recovery, one snapshot verified, every key back.
async fn a_recovery_interrupted_by_a_controller_restart_goes_on_once(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let first = Controller::start(&ctx)?;
    let version = etcd_shared::version::DEFAULT_VERSION;
    let keys = running_with_keys(&ctx, "again", version, "recovery:\n  policy: Automatic").await?;
    let (survivor, _) = lose_two(&ctx, "again").await?;
    let lost_at = Instant::now();
    let api: Api<EtcdCluster> = ctx.api();
    wait_until(&api, "again", "a recovery under way", |c| {
        c.status.as_ref().is_some_and(|s| s.recovery.is_some())
    })
    .await?;
    drop(first);
    let _second = Controller::start(&ctx)?;
    recovered(&ctx, "again", version, &keys, &survivor, lost_at).await?;
    let started: i32 = events(&ctx, "RecoveryStarted")
        .await?
        .iter()
        .map(|e| e.count.unwrap_or(1))
        .sum();
    ensure!(started == 1, "{started} recoveries started");
    Ok(())
}
