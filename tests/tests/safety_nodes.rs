//! Node faults the way a real cluster produces them, met by the operator (issue 32, items 1, 2
//! and 10): three process kubelets in three zones scheduled by the real kube-scheduler, two of
//! them silenced (a paused kubelet: the node controller marks them Unknown, the taint manager
//! evicts their pods, which stay Terminating while their etcd keeps running and holds the
//! quorum). Recorded client traffic is checked with the linearizability checker.
//!
//! Run: `cargo test -p etcd-tests --test safety_nodes` (needs `hack/build-tools.sh` first and
//! root for the pod cgroups). The tests run one at a time: node faults are suite-wide.

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use etcd_shared::EtcdCluster;
use etcd_shared::version::DEFAULT_VERSION;
use etcd_tests::kubelet::nodes::NodesOptions;
use etcd_tests::poll_until;
use etcd_tests::recorder::{self, Recorder, RecorderOptions};
use etcd_tests::suite::{Suite, TestContext};

use support::operator::{Controller, create_cluster, install};
use support::{
    WAIT, duration, event_count, manifest, member_pods, member_urls, settled, wait_until,
};

fn main() -> std::process::ExitCode {
    Suite::new().with_nodes(NodesOptions::default()).run(vec![
        etcd_tests::Test::new(
            "members_evicted_from_silent_nodes_are_not_recovered_from",
            members_evicted_from_silent_nodes_are_not_recovered_from,
        )
        .with_timeout(Duration::from_secs(480)),
        etcd_tests::Test::new(
            "a_broken_operator_that_takes_stuck_for_lost_is_caught",
            a_broken_operator_that_takes_stuck_for_lost_is_caught,
        )
        .with_timeout(Duration::from_secs(480)),
    ])
}

/// The node each member pod is bound to.
async fn nodes_of(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(member_pods(pods, cluster)
        .await?
        .into_iter()
        .filter_map(|(name, p)| Some((name, p.spec?.node_name?)))
        .collect())
}

/// Items 1, 2 and 10. A 3-member cluster under `recovery.policy: Automatic` spreads over the
/// three nodes by default. Two nodes go silent (their kubelets paused, their containers
/// running): their member pods are evicted and stay Terminating past the stuck timeout, while
/// their etcd keeps serving, with the quorum. The operator asks them (by pod IP), finds them
/// alive, and replaces them one at a time on the live node: no recovery, no second cluster,
/// every acknowledged write kept, the recorded history linearizable. Before: the operator
/// never asked terminating pods, counted them lost once stuck, and recovered a new one-member
/// cluster from the third member beside the old majority (split brain).
async fn members_evicted_from_silent_nodes_are_not_recovered_from(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start_with(&ctx, |c| {
        c.planner.stuck_terminating = Duration::from_secs(5);
    })?;
    let started = Instant::now();
    create_cluster(
        &ctx,
        &manifest(
            "silent",
            &format!("size: 3\nversion: {DEFAULT_VERSION}\nrecovery:\n  policy: Automatic"),
        ),
    )
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    let running = wait_until(&api, "silent", "3 members", |c| {
        settled(c, 3, DEFAULT_VERSION)
    })
    .await?;
    duration("silent: 3 members Running on 3 nodes", started);
    let pods: Api<Pod> = ctx.api();
    let placed = nodes_of(&pods, "silent").await?;
    let distinct: BTreeSet<&String> = placed.values().collect();
    ensure!(
        distinct.len() == 3,
        "members not spread over the three nodes by default: {placed:?}"
    );
    let spread = running
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "MembersSpread"))
        .map(|c| c.status.clone());
    ensure!(
        spread.as_deref() == Some("True"),
        "MembersSpread {spread:?}"
    );

    // Client traffic on every member, by pod IP, for the whole test.
    let feed_pods = pods.clone();
    let (endpoints, _feed) = recorder::feed(Duration::from_millis(500), move || {
        let pods = feed_pods.clone();
        async move {
            anyhow::Ok(
                member_urls(&pods, "silent")
                    .await?
                    .into_values()
                    .collect::<Vec<_>>(),
            )
        }
    })
    .await;
    let recording = Recorder::start(RecorderOptions::new(
        format!("silent-nodes-{}", ctx.ns()),
        recorder::artifacts_dir(),
        endpoints,
    ))
    .await?;

    // The nodes of two members go silent.
    let silenced: Vec<(String, String)> = ["silent-1", "silent-2"]
        .iter()
        .map(|m| {
            placed
                .get(*m)
                .map(|n| (m.to_string(), n.clone()))
                .with_context(|| format!("{m} has no node"))
        })
        .collect::<anyhow::Result<_>>()?;
    for (_, node) in &silenced {
        ctx.node(node)?.silence();
    }
    let silent_at = Instant::now();
    poll_until("both members' pods evicted (Terminating)", WAIT, || async {
        let now = member_pods(&pods, "silent").await?;
        let evicted = silenced.iter().all(|(m, _)| {
            now.get(m)
                .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
        });
        anyhow::Ok(evicted.then_some(()))
    })
    .await?;
    duration(
        "silent: two nodes silent -> their members' pods evicted",
        silent_at,
    );
    // The operator replaces them one at a time on the node that answers; their etcd ran all
    // along. Three members again, none of them the evicted ones.
    let replaced = wait_until(
        &api,
        "silent",
        "3 members, the evicted ones replaced",
        |c| {
            settled(c, 3, DEFAULT_VERSION)
                && c.status.as_ref().is_some_and(|s| {
                    s.members.as_ref().is_some_and(|m| {
                        m.ready.len() == 3
                            && !m.ready.iter().any(|n| n == "silent-1" || n == "silent-2")
                    })
                })
        },
    )
    .await?;
    duration(
        "silent: evicted members replaced, 3 members Running",
        silent_at,
    );
    let said = replaced
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "MembersSpread"))
        .map(|c| (c.status.clone(), c.message.clone()));
    println!("silent: MembersSpread after the replacements: {said:?}");
    ensure!(
        said.as_ref().is_some_and(|(s, _)| s == "False"),
        "the replacements share the one live node: {said:?}"
    );
    let recoveries = event_count(&ctx, "RecoveryStarted").await?;
    ensure!(
        recoveries == 0,
        "{recoveries} recoveries started while the evicted members' etcd held the quorum"
    );

    // The nodes come back: their kubelets stop the evicted pods.
    for (_, node) in &silenced {
        ctx.node(node)?.resume();
    }
    poll_until("the evicted pods gone", WAIT, || async {
        let now = member_pods(&pods, "silent").await?;
        anyhow::Ok(
            silenced
                .iter()
                .all(|(m, _)| !now.contains_key(m))
                .then_some(()),
        )
    })
    .await?;
    let members: Vec<String> = member_urls(&pods, "silent").await?.into_values().collect();
    let report = recording.finish(&members).await?;
    println!("{report}");
    report.append_markdown_row(&recorder::artifacts_dir().join("safety.md"))?;
    ensure!(
        report.passed(),
        "the recorded history fails its checks:\n{report}"
    );
    ensure!(
        event_count(&ctx, "RecoveryStarted").await? == 0,
        "a recovery started after the nodes came back"
    );
    Ok(())
}

/// The control experiment (issue 33): the same two silent nodes, with the operator broken on
/// purpose the way it was before issue 32 (`Broken::StuckIsLost`: members of terminating pods
/// not asked, a stuck pod taken as lost). It recovers a new cluster from the third member while
/// the old majority still serves: the recorded history must fail its checks (two clusters
/// answering for the same keys), or the checks prove nothing.
async fn a_broken_operator_that_takes_stuck_for_lost_is_caught(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    for node in ctx.nodes()? {
        etcd_tests::operator::OperatorBinaries::locate()?.register(node);
    }
    let _controller = Controller::start_with(&ctx, |c| {
        c.planner.stuck_terminating = Duration::from_secs(5);
        c.broken = Some(etcd_controller::failpoints::Broken::StuckIsLost);
    })?;
    create_cluster(
        &ctx,
        &manifest(
            "broken",
            &format!("size: 3\nversion: {DEFAULT_VERSION}\nrecovery:\n  policy: Automatic"),
        ),
    )
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    wait_until(&api, "broken", "3 members", |c| {
        settled(c, 3, DEFAULT_VERSION)
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    let placed = nodes_of(&pods, "broken").await?;
    let feed_pods = pods.clone();
    let (endpoints, _feed) = recorder::feed(Duration::from_millis(500), move || {
        let pods = feed_pods.clone();
        async move {
            anyhow::Ok(
                member_urls(&pods, "broken")
                    .await?
                    .into_values()
                    .collect::<Vec<_>>(),
            )
        }
    })
    .await;
    let recording = Recorder::start(RecorderOptions::new(
        format!("broken-operator-{}", ctx.ns()),
        recorder::artifacts_dir(),
        endpoints,
    ))
    .await?;
    let silenced: Vec<String> = ["broken-1", "broken-2"]
        .iter()
        .filter_map(|m| placed.get(*m).cloned())
        .collect();
    for node in &silenced {
        ctx.node(node)?.silence();
    }
    let silent_at = Instant::now();
    wait_until(
        &api,
        "broken",
        "the broken operator starting a recovery",
        |c| c.status.as_ref().is_some_and(|s| s.recovery.is_some()),
    )
    .await?;
    duration(
        "broken: a recovery started beside the serving majority",
        silent_at,
    );
    recording.epoch("recovery").await;
    // The new cluster's first member serving beside the old majority.
    poll_until(
        "the recovered cluster's first member Ready",
        WAIT,
        || async {
            let now = member_pods(&pods, "broken").await?;
            let seeded = now.iter().any(|(name, p)| {
                !placed.contains_key(name)
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            });
            anyhow::Ok(seeded.then_some(()))
        },
    )
    .await?;
    // Both sides answer for a while.
    let mut progress = recording.progress();
    let at = progress.borrow().ok;
    poll_until("500 more acknowledged operations", WAIT, || {
        let done = progress.borrow_and_update().ok >= at + 500;
        async move { anyhow::Ok(done.then_some(())) }
    })
    .await?;
    let members: Vec<String> = member_urls(&pods, "broken").await?.into_values().collect();
    let report = recording.finish(&members).await?;
    println!("{report}");
    report.append_markdown_row(&recorder::artifacts_dir().join("safety.md"))?;
    for node in &silenced {
        ctx.node(node)?.resume();
    }
    ensure!(
        !report.passed(),
        "the checks passed a history recorded across a split brain: they prove nothing"
    );
    Ok(())
}
