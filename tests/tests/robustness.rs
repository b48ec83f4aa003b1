//! Every operator action checked against what etcd promises its clients (issue 33, items 4
//! and 6). Each test runs one action of the operator, under its fault, while the recorder
//! (`etcd_tests::recorder`) sends client traffic through the cluster's client Service and to
//! the members' pod IPs and keeps two long watches; the history is then checked by
//! `etcd_lincheck`: linearizable per key, watches ordered and gap-free, revisions never back
//! (within an epoch: a recovery or a restore marks one when the operator starts it), the
//! members' stores equal at the end, every acknowledged write read back. Three process
//! kubelets scheduled by kube-scheduler (`NodesOptions::default()`), so node faults are real;
//! the webhook and the controller run in this process.
//!
//! Run: `cargo test -p etcd-tests --test robustness` (needs `hack/build-tools.sh`, `cargo
//! build -p etcd-controller -p etcd-webhook` and root for the pod cgroups). The bounded set
//! takes about 10 minutes on two cores; `ETCD_TESTS_ROBUSTNESS=full` adds the whole upgrade
//! matrix (3.2.13 -> 3.3 -> 3.4 -> 3.5 -> 3.6 -> 3.7, a history per hop, about 2 minutes),
//! drains a node holding two of five members instead of one of three, and runs the recorder
//! at its full rate (100 operations/s instead of 60). Each run adds a row to `robustness.md`
//! beside the histories (`$ETCD_TESTS_ARTIFACTS_DIR`, else `target/recorder/`); the waits
//! print `duration:` lines.

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

#[path = "support/recording.rs"]
mod recording;

#[path = "support/nospace.rs"]
mod nospace;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt as _};
use serde_json::json;

use etcd_shared::EtcdCluster;
use etcd_shared::types::{ClusterPhase, EtcdBackup, EtcdRestore};
use etcd_shared::version::{DEFAULT_VERSION, EtcdVersion};
use etcd_tests::kubelet::nodes::NodesOptions;
use etcd_tests::operator::OperatorBinaries;
use etcd_tests::poll_until;
use etcd_tests::recorder::Report;
use etcd_tests::suite::{Suite, TestContext};

use recording::{Recording, cluster_pods, cordon, evict, nodes_healthy, placement};
use support::backups::{backup_status, create, restore_status};
use support::operator::{Controller, create_cluster, install};
use support::{
    Access, ETCD_TIMEOUT, WAIT, bulk_put, check_every_member, client_service_urls, connect,
    duration, manifest, member_list, member_urls, pinned_etcd, settled, wait_until,
};

fn main() -> std::process::ExitCode {
    let full = recording::full();
    let minutes = |m: u64| Duration::from_secs(m * 60);
    Suite::new().with_nodes(NodesOptions::default()).run(vec![
        etcd_tests::Test::new(
            "scaling_1_3_5_3_keeps_every_promise",
            scaling_1_3_5_3_keeps_every_promise,
        )
        .with_timeout(minutes(6)),
        etcd_tests::Test::new(
            "a_rolling_upgrade_3_6_to_3_7_keeps_every_promise",
            a_rolling_upgrade_3_6_to_3_7_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "the_users_3_2_13_upgraded_to_3_3_keeps_every_promise",
            the_users_3_2_13_upgraded_to_3_3_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "the_upgrade_matrix_from_3_2_13_to_3_7_keeps_every_promise",
            the_upgrade_matrix_from_3_2_13_to_3_7_keeps_every_promise,
        )
        .with_timeout(minutes(25))
        .ignored(!full),
        etcd_tests::Test::new(
            "a_member_whose_data_is_gone_is_replaced_keeping_every_promise",
            a_member_whose_data_is_gone_is_replaced_keeping_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_pod_stuck_terminating_is_replaced_keeping_every_promise",
            a_pod_stuck_terminating_is_replaced_keeping_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_drained_node_keeps_every_promise",
            a_drained_node_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_silenced_node_keeps_every_promise",
            a_silenced_node_keeps_every_promise,
        )
        .with_timeout(minutes(6)),
        etcd_tests::Test::new(
            "a_partitioned_leader_keeps_every_promise",
            a_partitioned_leader_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_controller_restarted_mid_scale_up_keeps_every_promise",
            a_controller_restarted_mid_scale_up_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_nospace_heal_keeps_every_promise",
            a_nospace_heal_keeps_every_promise,
        )
        .with_timeout(minutes(6)),
        etcd_tests::Test::new(
            "a_periodic_defragmentation_keeps_every_promise",
            a_periodic_defragmentation_keeps_every_promise,
        )
        .with_timeout(minutes(5)),
        etcd_tests::Test::new(
            "a_backup_and_a_restore_keep_every_promise_of_each_epoch",
            a_backup_and_a_restore_keep_every_promise_of_each_epoch,
        )
        .with_timeout(minutes(7)),
        etcd_tests::Test::new(
            "a_recovery_from_quorum_loss_keeps_every_promise_of_each_epoch",
            a_recovery_from_quorum_loss_keeps_every_promise_of_each_epoch,
        )
        .with_timeout(minutes(7)),
        etcd_tests::Test::new(
            "a_coreos_cluster_adopted_keeps_every_promise",
            a_coreos_cluster_adopted_keeps_every_promise,
        )
        .with_timeout(minutes(7)),
    ])
}

/// Acknowledged writes the recorder waits for once an action is over, before its history
/// ends: the cluster as the operator left it serves too (about 2 s).
const AFTER: u64 = 60;

/// The start of every test: the CRD and the webhook installed, every node healthy (a node an
/// earlier test silenced or cordoned is back).
async fn begin(ctx: &TestContext) -> anyhow::Result<()> {
    install(ctx).await?;
    nodes_healthy(ctx).await
}

/// Creates cluster `name` through the webhook and waits until `size` voters run `version`.
async fn create_running(
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
    settle(ctx, name, size, version).await?;
    duration(&format!("{name}: {size} members Running"), started);
    Ok(())
}

/// Waits until cluster `name` has acted on its spec and runs `size` healthy voters of
/// `version`.
async fn settle(ctx: &TestContext, name: &str, size: usize, version: &str) -> anyhow::Result<()> {
    wait_until(
        &ctx.api(),
        name,
        &format!("{size} members on {version}"),
        |c| settled(c, size, version),
    )
    .await?;
    Ok(())
}

/// Merge-patches the spec of cluster `name`.
async fn patch_spec(ctx: &TestContext, name: &str, spec: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": spec })),
    )
    .await
    .with_context(|| format!("patching {name}'s spec"))?;
    Ok(())
}

/// `waited`, or its error with the last status of cluster `name` and the test's Events.
async fn explain<T>(
    ctx: &TestContext,
    name: &str,
    waited: Result<T, etcd_tests::WaitError>,
) -> anyhow::Result<T> {
    let error = match waited {
        Ok(value) => return Ok(value),
        Err(e) => e,
    };
    let api: Api<EtcdCluster> = ctx.api();
    let status = api.get_opt(name).await.ok().flatten().map(|c| c.status);
    let events: Vec<String> =
        Api::<k8s_openapi::api::core::v1::Event>::namespaced(ctx.client(), ctx.ns())
            .list(&Default::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .map(|e| {
                        format!(
                            "{} x{}: {}",
                            e.reason.unwrap_or_default(),
                            e.count.unwrap_or(1),
                            e.message.unwrap_or_default()
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
    bail!(
        "{error}\nlast status of {name}: {status:#?}\nevents:\n{}",
        events.join("\n")
    )
}

/// The names of the ready members in the status of cluster `c`.
fn ready_members(c: &EtcdCluster) -> Vec<String> {
    c.status
        .as_ref()
        .and_then(|s| s.members.as_ref())
        .map(|m| m.ready.clone())
        .unwrap_or_default()
}

/// Item 1: scale 1 -> 3 -> 5 -> 3, one history: members join (learners from 3.4) and leave
/// while clients keep going through the Service and to the members.
async fn scaling_1_3_5_3_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "scale";
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_running(&ctx, NAME, 1, DEFAULT_VERSION, "").await?;
    let recording = Recording::start(&ctx, NAME, "scale-1-3-5-3").await?;
    let mut from = 1;
    for size in [3, 5, 3] {
        let at = Instant::now();
        patch_spec(&ctx, NAME, json!({ "size": size })).await?;
        settle(&ctx, NAME, size, DEFAULT_VERSION).await?;
        duration(&format!("{NAME}: {from} -> {size} members"), at);
        recording.ok_writes(AFTER).await?;
        from = size;
    }
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// Whether the hop `from` -> `to` of a cluster born on `birth` waits for every member's raft
/// snapshot past the v2-format entries (born on 3.4 or older, moving to 3.7).
fn needs_snapshot_barrier(birth: &str, from: &str, to: &str) -> anyhow::Result<bool> {
    let caps = |v: &str| -> anyhow::Result<&'static etcd_shared::version::LineCapabilities> {
        v.parse::<EtcdVersion>()?
            .capabilities()
            .with_context(|| format!("etcd {v}: a line the operator does not support"))
    };
    Ok(caps(birth)?.writes_v2_entries
        && caps(from)?.replays_v2_entries
        && !caps(to)?.replays_v2_entries)
}

/// Creates a 3-member cluster `name` on `versions[0]` and moves it through the others, one
/// spec change per hop, each hop under a history of its own.
async fn upgrade_through(ctx: &TestContext, name: &str, versions: &[String]) -> anyhow::Result<()> {
    let (birth, hops) = versions.split_first().context("no versions")?;
    create_running(ctx, name, 3, birth, "").await?;
    let api: Api<EtcdCluster> = ctx.api();
    let mut from = birth.clone();
    for to in hops {
        let recording = Recording::start(ctx, name, &format!("upgrade-{from}-to-{to}")).await?;
        let at = Instant::now();
        patch_spec(ctx, name, json!({ "version": to }))
            .await
            .with_context(|| format!("the webhook refused {from} -> {to}"))?;
        if needs_snapshot_barrier(birth, &from, to)? {
            // 3.7 cannot replay the v2-format entries 3.2-3.4 wrote: the operator waits until
            // every member snapshotted past them (3.6: every 10,000 entries); a burst of
            // writes gets them there, as a busy cluster's own traffic would.
            wait_until(&api, name, "the wait for a raft snapshot", |c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.next_step.as_deref())
                    .is_some_and(|n| n.contains("raft snapshot past"))
            })
            .await?;
            let slices: Api<EndpointSlice> = ctx.api();
            let bulk = bulk_put(&slices, name, "/bulk/", 10_500, 64).await?;
            println!("{name}: {} of 10500 bulk writes acknowledged", bulk.len());
        }
        settle(ctx, name, 3, to).await?;
        duration(&format!("{name}: rolling upgrade {from} -> {to}"), at);
        recording.ok_writes(AFTER).await?;
        recording.finish(ctx, name, 3).await?;
        from = to.clone();
    }
    Ok(())
}

/// Item 2: a rolling upgrade 3.6 -> 3.7 of three members, one member at a time.
async fn a_rolling_upgrade_3_6_to_3_7_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    upgrade_through(&ctx, "roll", &[pinned_etcd("3.6")?, pinned_etcd("3.7")?]).await
}

/// Item 2, the users' line: their example's etcd 3.2.13 (no learners, no MoveLeader, a TCP
/// probe, no HashKV: the stores are compared by a digest of a full read) moved to 3.3.
async fn the_users_3_2_13_upgraded_to_3_3_keeps_every_promise(
    ctx: TestContext,
) -> anyhow::Result<()> {
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    upgrade_through(&ctx, "users", &[pinned_etcd("3.2")?, pinned_etcd("3.3")?]).await
}

/// Item 2, the whole matrix (`ETCD_TESTS_ROBUSTNESS=full`): the users' 3.2.13 through every
/// line to 3.7, a history per hop, the snapshot barrier before 3.7 included.
async fn the_upgrade_matrix_from_3_2_13_to_3_7_keeps_every_promise(
    ctx: TestContext,
) -> anyhow::Result<()> {
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let lines: Vec<String> = ["3.2", "3.3", "3.4", "3.5", "3.6", "3.7"]
        .iter()
        .map(|l| pinned_etcd(l))
        .collect::<anyhow::Result<_>>()?;
    upgrade_through(&ctx, "matrix", &lines).await
}

/// Item 3: an emptyDir member's pod deleted (its data goes with it): the operator removes the
/// member and adds a new one (a new ID) while clients go on.
async fn a_member_whose_data_is_gone_is_replaced_keeping_every_promise(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "lost";
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let pods: Api<Pod> = ctx.api();
    let urls = member_urls(&pods, NAME).await?;
    let asked = urls.get("lost-0").context("lost-0 has no IP")?.clone();
    let before = member_list(&asked).await?;
    let victim = "lost-2";
    let victim_id = before
        .iter()
        .find(|(_, (member, _))| member == victim)
        .map(|(id, _)| *id)
        .context("lost-2 is not in the member list")?;
    let recording = Recording::start(&ctx, NAME, "member-data-gone-replaced").await?;
    let at = Instant::now();
    pods.delete(victim, &DeleteParams::default()).await?;
    poll_until("the lost member replaced by a new voter", WAIT, || async {
        let list = member_list(&asked).await?;
        let done = list.len() == 3
            && !list.contains_key(&victim_id)
            && list.values().all(|(m, learner)| !m.is_empty() && !learner);
        anyhow::Ok(done.then_some(()))
    })
    .await?;
    settle(&ctx, NAME, 3, DEFAULT_VERSION).await?;
    duration(&format!("{NAME}: {victim}'s pod deleted -> replaced"), at);
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// Item 4: a member pod stuck Terminating (a finalizer holds it; its kubelet stopped etcd):
/// once past its grace period and the stuck timeout (5 s here), its member is removed and
/// replaced under a new name.
async fn a_pod_stuck_terminating_is_replaced_keeping_every_promise(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "stuck";
    const FINALIZER: &str = "etcd-tests/stuck";
    begin(&ctx).await?;
    let _controller = Controller::start_with(&ctx, |c| {
        c.planner.stuck_terminating = Duration::from_secs(5);
    })?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let recording = Recording::start(&ctx, NAME, "pod-stuck-terminating").await?;
    let pods: Api<Pod> = ctx.api();
    let victim = "stuck-1";
    let finalizers =
        |list: serde_json::Value| Patch::Merge(json!({"metadata": {"finalizers": list}}));
    pods.patch(
        victim,
        &PatchParams::default(),
        &finalizers(json!([FINALIZER])),
    )
    .await?;
    let at = Instant::now();
    pods.delete(
        victim,
        &DeleteParams {
            grace_period_seconds: Some(1),
            ..DeleteParams::default()
        },
    )
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    let replaced = wait_until(&api, NAME, "the stuck member replaced", |c| {
        settled(c, 3, DEFAULT_VERSION) && !ready_members(c).iter().any(|m| m == victim)
    })
    .await;
    let stuck = pods.get_opt(victim).await?;
    // Let the pod go whatever happened.
    pods.patch(victim, &PatchParams::default(), &finalizers(json!(null)))
        .await?;
    replaced?;
    duration(
        &format!("{NAME}: {victim} stuck Terminating -> replaced"),
        at,
    );
    ensure!(
        stuck.is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "{victim} was not stuck Terminating until its member was replaced"
    );
    poll_until("the released pod gone", WAIT, || async {
        anyhow::Ok(pods.get_opt(victim).await?.is_none().then_some(()))
    })
    .await?;
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// Item 5: a node drained as `kubectl drain` does it: cordoned, then each member pod on it
/// evicted through the Eviction API (a 429 asked again). The evicted members' data goes with
/// their pods (emptyDir); the operator replaces them on the other nodes. Bounded: the node of
/// one of three members; full: the node holding the most of five.
async fn a_drained_node_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "drain";
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    // The full run drains the node holding two of five members (the budget lets a drain take
    // two of five at once), the bounded one a node holding one of three.
    let size = if recording::full() { 5 } else { 3 };
    create_running(&ctx, NAME, size, DEFAULT_VERSION, "").await?;
    let pods: Api<Pod> = ctx.api();
    let placed = placement(&pods, NAME).await?;
    let mut members_per_node: BTreeMap<&String, Vec<String>> = BTreeMap::new();
    for (pod, node) in &placed {
        members_per_node.entry(node).or_default().push(pod.clone());
    }
    let (node, on_node) = members_per_node
        .into_iter()
        .max_by_key(|(_, pods)| pods.len())
        .context("no member is bound to a node")?;
    let node = node.clone();
    let run = format!("node-drained-{}-of-{size}", on_node.len());
    let recording = Recording::start(&ctx, NAME, &run).await?;
    let at = Instant::now();
    cordon(&ctx, &node, true).await?;
    let drained = async {
        for pod in &on_node {
            let refused = evict(&ctx, pod).await?;
            println!("{NAME}: {pod} evicted from {node} after {refused} refusals (429)");
        }
        let api: Api<EtcdCluster> = ctx.api();
        poll_until(
            "the drained members replaced on other nodes",
            WAIT,
            || async {
                let cluster = api.get(NAME).await?;
                let now = placement(&pods, NAME).await?;
                let done = settled(&cluster, size, DEFAULT_VERSION)
                    && now.len() == size
                    && now.values().all(|n| *n != node);
                anyhow::Ok(done.then_some(now))
            },
        )
        .await
        .map_err(anyhow::Error::from)
    }
    .await;
    cordon(&ctx, &node, false).await?;
    let now = drained?;
    duration(&format!("{NAME}: {node} drained -> members replaced"), at);
    println!("{NAME}: members now on {now:?}");
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, size).await?;
    Ok(())
}

/// Item 5: the node of one member goes silent (its kubelet paused, its etcd running): the
/// node goes Unknown, the member's pod is evicted and stays Terminating while its etcd still
/// serves. The operator asks it, finds it alive, and replaces it once stuck (5 s here); the
/// node resumes at the end and stops the evicted pod.
async fn a_silenced_node_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "silent";
    begin(&ctx).await?;
    let _controller = Controller::start_with(&ctx, |c| {
        c.planner.stuck_terminating = Duration::from_secs(5);
    })?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let pods: Api<Pod> = ctx.api();
    let victim = "silent-1";
    let node = placement(&pods, NAME)
        .await?
        .get(victim)
        .context("silent-1 is bound to no node")?
        .clone();
    let uid = pods.get(victim).await?.uid();
    let recording = Recording::start(&ctx, NAME, "node-silenced").await?;
    let at = Instant::now();
    ctx.node(&node)?.silence();
    let replaced = async {
        poll_until("the silent node's member pod evicted", WAIT, || async {
            let pod = pods.get_opt(victim).await?;
            anyhow::Ok(
                pod.is_some_and(|p| p.metadata.deletion_timestamp.is_some())
                    .then_some(()),
            )
        })
        .await?;
        duration(&format!("{NAME}: {node} silent -> {victim} evicted"), at);
        let api: Api<EtcdCluster> = ctx.api();
        wait_until(&api, NAME, "the evicted member replaced", |c| {
            settled(c, 3, DEFAULT_VERSION) && !ready_members(c).iter().any(|m| m == victim)
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    ctx.node(&node)?.resume();
    replaced?;
    duration(&format!("{NAME}: {node} silent -> {victim} replaced"), at);
    let resumed = Instant::now();
    poll_until("the evicted pod stopped and removed", WAIT, || async {
        let now = pods.get_opt(victim).await?;
        anyhow::Ok(now.is_none_or(|p| p.uid() != uid).then_some(()))
    })
    .await?;
    duration(
        &format!("{NAME}: {node} resumed -> evicted pod gone"),
        resumed,
    );
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// The pod IP of `pod`.
fn pod_ip(pod: &Pod) -> anyhow::Result<Ipv4Addr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .with_context(|| format!("{} has no IP", pod.name_any()))?
        .parse()
        .with_context(|| format!("{}'s IP", pod.name_any()))
}

/// The leader's member ID as the member at `url` knows it (0: none).
async fn leader_seen_by(url: &str) -> anyhow::Result<u64> {
    let mut client = connect(&[url.to_string()]).await?;
    Ok(client.status().await?.leader())
}

/// Item 5: the leader cut off from its two peers (packets dropped both ways; clients and the
/// operator still reach it): the peers elect a leader and take writes, the old leader's
/// clients time out; healed once the majority has taken writes.
async fn a_partitioned_leader_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "split";
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let pods: Api<Pod> = ctx.api();
    let urls = member_urls(&pods, NAME).await?;
    let any = urls.values().next().context("no member URL")?.clone();
    let leader_id = leader_seen_by(&any).await?;
    let list = member_list(&any).await?;
    let (leader, _) = list
        .get(&leader_id)
        .context("no leader in the member list")?;
    let leader = leader.clone();
    let mut leader_ip = None;
    let mut peers = Vec::new();
    let mut peer_urls = Vec::new();
    for (name, pod) in support::member_pods(&pods, NAME).await? {
        let ip = pod_ip(&pod)?;
        if name == leader {
            leader_ip = Some(ip);
        } else {
            peers.push(ip);
            peer_urls.push(urls.get(&name).context("a peer's URL")?.clone());
        }
    }
    let leader_ip = leader_ip.context("the leader's pod")?;
    let slices: Api<EndpointSlice> = ctx.api();
    let recording = Recording::start(&ctx, NAME, "leader-partitioned").await?;
    let at = Instant::now();
    let partition = ctx.network()?.partition(&[leader_ip], &peers)?;
    println!("{NAME}: partitioned {}", partition.description());
    let majority = async {
        let new_leader = poll_until("a new leader among the peers", WAIT, || async {
            let mut agreed = None;
            for url in &peer_urls {
                let seen = leader_seen_by(url).await.unwrap_or(0);
                if seen == 0 || seen == leader_id || agreed.is_some_and(|a| a != seen) {
                    return anyhow::Ok(None);
                }
                agreed = Some(seen);
            }
            Ok(agreed)
        })
        .await?;
        duration(
            &format!("{NAME}: leader {leader} cut off -> new leader"),
            at,
        );
        recording.ok_writes(30).await?;
        // Held until the cut-off member's readiness (etcd's /health fails without a leader)
        // takes it out of the client Service.
        let cut_off = format!("http://{leader_ip}:{}", etcd_shared::names::CLIENT_PORT);
        poll_until(
            "the cut-off member out of the client Service",
            WAIT,
            || async {
                let urls = client_service_urls(&slices, NAME).await?;
                anyhow::Ok((!urls.contains(&cut_off) && !urls.is_empty()).then_some(()))
            },
        )
        .await?;
        duration(
            &format!("{NAME}: leader {leader} cut off -> out of the client Service"),
            at,
        );
        anyhow::Ok(new_leader)
    }
    .await;
    partition.heal()?;
    let new_leader = majority?;
    duration(&format!("{NAME}: partition healed after"), at);
    let healed = Instant::now();
    poll_until("every member following one leader", WAIT, || async {
        let mut seen = Vec::new();
        for url in urls.values() {
            seen.push(leader_seen_by(url).await.unwrap_or(0));
        }
        anyhow::Ok((seen.iter().all(|l| *l != 0 && *l == seen[0])).then_some(()))
    })
    .await?;
    settle(&ctx, NAME, 3, DEFAULT_VERSION).await?;
    duration(&format!("{NAME}: healed -> one leader, settled"), healed);
    println!("{NAME}: leader {leader_id:x} -> {new_leader:x}");
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// Item 6: the controller stopped (its in-process `Controller` dropped) as soon as the
/// scale-up 3 -> 5 made its first membership change, and a new one started: the new one
/// goes on from what it observes.
async fn a_controller_restarted_mid_scale_up_keeps_every_promise(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "restart";
    begin(&ctx).await?;
    let first = Controller::start(&ctx)?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let recording = Recording::start(&ctx, NAME, "controller-restarted-mid-scale-up").await?;
    let at = Instant::now();
    patch_spec(&ctx, NAME, json!({ "size": 5 })).await?;
    poll_until("the scale-up's first membership change", WAIT, || {
        let changed = first.member_changes() >= 1;
        async move { anyhow::Ok(changed.then_some(())) }
    })
    .await?;
    drop(first);
    duration(&format!("{NAME}: scale-up begun -> controller stopped"), at);
    let _second = Controller::start(&ctx)?;
    settle(&ctx, NAME, 5, DEFAULT_VERSION).await?;
    duration(&format!("{NAME}: 3 -> 5 through a controller restart"), at);
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 5).await?;
    Ok(())
}

/// A 16 MiB backend quota.
const QUOTA_16_MIB: &str =
    "pod:\n  etcdEnv:\n  - name: ETCD_QUOTA_BACKEND_BYTES\n    value: \"16777216\"";

/// A client of cluster `name` through its client Service's ready endpoints.
async fn service_client(ctx: &TestContext, name: &str) -> anyhow::Result<etcd_client::Client> {
    let slices: Api<EndpointSlice> = ctx.api();
    let urls = poll_until("ready client Service endpoints", WAIT, || async {
        let urls = client_service_urls(&slices, name).await?;
        anyhow::Ok((!urls.is_empty()).then_some(urls))
    })
    .await?;
    connect(&urls).await
}

/// Item 7: the database filled to its 16 MiB quota (overwrites of one 400 KiB value, beside
/// the recorded keys): NOSPACE refuses writes (recorded as failed), the operator compacts,
/// defragments the members one at a time and disarms the alarm.
async fn a_nospace_heal_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "full";
    begin(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, QUOTA_16_MIB).await?;
    let recording = Recording::start(&ctx, NAME, "nospace-healed").await?;
    let mut client = service_client(&ctx, NAME).await?;
    let value = vec![b'v'; 400 * 1024];
    let mut puts = None;
    for n in 0..400 {
        match tokio::time::timeout(
            ETCD_TIMEOUT * 3,
            client.put("/fill/big", value.clone(), None),
        )
        .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(etcd_client::Error::GRpcStatus(s)))
                if s.code() == tonic::Code::ResourceExhausted =>
            {
                puts = Some(n);
                break;
            }
            Ok(Err(e)) => bail!("put {n}: {e}"),
            Err(_) => bail!("put {n} timed out"),
        }
    }
    let puts = puts.context("no NOSPACE after 400 overwrites of 400 KiB")?;
    let full_at = Instant::now();
    println!("{NAME}: NOSPACE after {puts} overwrites of 400 KiB");
    let healed = write_accepted(&client, NO_SPACE_HEAL).await;
    if let Err(stalled) = healed {
        // Not healed: say what the operator judged on and what the members hold, then show
        // whether one member defragmented by hand lets the heal go on; the test fails either way.
        let said = explain(&ctx, NAME, Err::<(), _>(stalled))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        let before = space_figures(&ctx, NAME).await?;
        let pods: Api<Pod> = ctx.api();
        let urls = recording::current_member_urls(&pods, NAME, 3).await?;
        let first = urls.first().context("no member")?;
        connect(std::slice::from_ref(first))
            .await?
            .defragment()
            .await
            .with_context(|| format!("defragmenting {first} by hand"))?;
        let after_defrag = space_figures(&ctx, NAME).await?;
        let by_hand = Instant::now();
        let then = write_accepted(&client, NO_SPACE_HEAL).await;
        let then = match then {
            Ok(()) => format!(
                "healed by the operator {:.1} s after {first} was defragmented by hand",
                by_hand.elapsed().as_secs_f64()
            ),
            Err(e) => format!("still not healed after {first} was defragmented by hand: {e}"),
        };
        let report = recording.finish_after_no_space(&ctx, NAME, 3).await;
        bail!(
            "NOSPACE not healed within {NO_SPACE_HEAL:?} under client traffic (the operator heals it in about 30 s without traffic: day2, safety)\n{said}\nmembers when stalled:\n{before}\nafter one member was defragmented by hand:\n{after_defrag}\n{then}\nthe recorded history: {}",
            match report {
                Ok(r) => format!("passed its checks:\n{r}"),
                Err(e) => format!("{e:#}"),
            }
        );
    }
    duration(
        &format!("{NAME}: NOSPACE -> healed, writes accepted"),
        full_at,
    );
    let api: Api<EtcdCluster> = ctx.api();
    wait_until(&api, NAME, "Running, no alarm", |c| {
        settled(c, 3, DEFAULT_VERSION) && c.status.as_ref().is_some_and(|s| s.reason.is_none())
    })
    .await?;
    recording.ok_writes(AFTER).await?;
    recording.finish_after_no_space(&ctx, NAME, 3).await?;
    Ok(())
}

/// How long a NOSPACE heal may take: the operator heals in about 30 s without traffic
/// (`day2`'s `a_full_database_is_healed_without_a_human`, `safety`'s
/// `no_space_heals_under_continuous_deletes`).
const NO_SPACE_HEAL: Duration = Duration::from_secs(90);

/// Waits up to `timeout` until a put through `client` is accepted.
async fn write_accepted(
    client: &etcd_client::Client,
    timeout: Duration,
) -> Result<(), etcd_tests::WaitError> {
    poll_until("a write accepted again", timeout, || {
        let mut client = client.clone();
        async move {
            let put = client.put("/fill/after", "written", None);
            anyhow::Ok(
                tokio::time::timeout(ETCD_TIMEOUT, put)
                    .await
                    .is_ok_and(|r| r.is_ok())
                    .then_some(()),
            )
        }
    })
    .await
}

/// Each member's database figures as etcd reports them (file size, size in use) beside
/// the data it actually holds (every key and value, read serializably from it).
async fn space_figures(ctx: &TestContext, name: &str) -> anyhow::Result<String> {
    let pods: Api<Pod> = ctx.api();
    let mut lines = Vec::new();
    for (member, url) in member_urls(&pods, name).await? {
        let mut client = connect(std::slice::from_ref(&url)).await?;
        let status = client.status().await?;
        let all = client
            .get(
                "\0",
                Some(
                    etcd_client::GetOptions::new()
                        .with_from_key()
                        .with_serializable(),
                ),
            )
            .await?;
        let live: usize = all
            .kvs()
            .iter()
            .map(|kv| kv.key().len() + kv.value().len())
            .sum();
        let mib = |b: f64| b / (1024.0 * 1024.0);
        lines.push(format!(
            "  {member}: file {:.1} MiB, in use (etcd's figure) {:.1} MiB, live keys and values {:.2} MiB in {} keys, revision {}",
            mib(status.db_size() as f64),
            mib(status.raft_used_db_size() as f64),
            mib(live as f64),
            all.kvs().len(),
            all.header().map_or(0, |h| h.revision())
        ));
    }
    Ok(lines.join("\n"))
}

/// Item 7: members whose files hold much more than their data (written, deleted, compacted
/// beside the recorded keys) defragmented by the periodic policy (ratio 1.5, 2 MiB to
/// reclaim), one at a time, under traffic.
async fn a_periodic_defragmentation_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "frag";
    begin(&ctx).await?;
    let controller = Controller::start_with(&ctx, |config| {
        config.planner.defragmentation = etcd_controller::planner::DefragmentationPolicy {
            ratio: 1.5,
            min_reclaim_bytes: 2 * 1024 * 1024,
            interval: Some(Duration::from_secs(3600)),
        };
        config.idle_requeue = Duration::from_secs(2);
    })?;
    create_running(&ctx, NAME, 3, DEFAULT_VERSION, "").await?;
    let recording = Recording::start(&ctx, NAME, "periodic-defragmentation").await?;
    let mut client = service_client(&ctx, NAME).await?;
    let value = vec![b'f'; 100 * 1024];
    for i in 0..60 {
        client
            .put(format!("/junk/{i}"), value.clone(), None)
            .await?;
    }
    let deleted = client
        .delete(
            "/junk/",
            Some(etcd_client::DeleteOptions::new().with_prefix()),
        )
        .await?;
    let revision = deleted.header().map_or(0, |h| h.revision());
    client
        .compact(
            revision,
            Some(etcd_client::CompactionOptions::new().with_physical()),
        )
        .await?;
    let at = Instant::now();
    let defragmented = || {
        controller.counter(
            "etcd_controller_defragmentations_total",
            "reason",
            "fragmented",
        )
    };
    // The recorded traffic keeps every member's figure of the data in use current.
    poll_until("three members defragmented", WAIT, || {
        let n = defragmented();
        async move { anyhow::Ok((n >= 3).then_some(())) }
    })
    .await
    .with_context(|| format!("{} defragmentations", defragmented()))?;
    duration(&format!("{NAME}: fragmented -> 3 members defragmented"), at);
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}

/// The claim the backups go to.
const CLAIM: &str = "etcd-backups";

/// The backup claim, bound to a volume of the first node: the pods that mount it (the backup,
/// the restore's verify pod, the restored seed) are scheduled there (the process kubelet keeps
/// a claim's data on the node that runs its pod; an unbound claim would stay Pending under
/// kube-scheduler). Returns the volume's name (cluster-scoped: deleted by the test).
async fn backup_claim_on_first_node(ctx: &TestContext) -> anyhow::Result<String> {
    let node = ctx.kubelet()?.node_name().to_string();
    let volume = format!("{}-{CLAIM}", ctx.ns());
    let pv: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": volume},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "hostPath": {"path": format!("/tmp/{volume}"), "type": "DirectoryOrCreate"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "namespace": ctx.ns(), "name": CLAIM},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}},
        },
    }))?;
    Api::<PersistentVolume>::all(ctx.client())
        .create(&PostParams::default(), &pv)
        .await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    let claims: Api<PersistentVolumeClaim> = ctx.api();
    claims.create(&PostParams::default(), &claim).await?;
    poll_until("the backup claim Bound", WAIT, || async {
        let phase = claims.get(CLAIM).await?.status.and_then(|s| s.phase);
        anyhow::Ok((phase.as_deref() == Some("Bound")).then_some(()))
    })
    .await?;
    Ok(volume)
}

/// The PVC location of a snapshot in the backup claim.
fn pvc_location(path: &str) -> String {
    format!("  pvc:\n    claimName: {CLAIM}\n    path: {path}\n")
}

/// Whether the etcd at `url` answers a status request within half a second.
async fn answers(url: &str) -> bool {
    let asked = async {
        let mut client = connect(&[url.to_string()]).await?;
        anyhow::Ok(client.status().await?)
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), asked).await,
        Ok(Ok(_))
    )
}

/// Waits until the cluster the restore replaces (`old_uid`) is gone and none of its members
/// (`old_members`, client URLs by pod IP) answers: from then on nothing of it serves. The
/// restored cluster is created only once the old object is gone, and its members get new IPs.
async fn replaced_cluster_silent(
    ctx: &TestContext,
    name: &str,
    old_uid: &str,
    old_members: &[String],
) -> anyhow::Result<()> {
    let clusters: Api<EtcdCluster> = ctx.api();
    poll_until("the replaced cluster gone and silent", WAIT, || async {
        let cluster = clusters.get_opt(name).await?;
        if cluster.is_some_and(|c| c.uid().as_deref() == Some(old_uid)) {
            return anyhow::Ok(None);
        }
        for url in old_members {
            if answers(url).await {
                return Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    Ok(())
}

/// Item 8: a one-shot backup to a claim, more writes, then a restore from it: the cluster is
/// replaced (the writes after the snapshot are lost, by design). The epoch is marked once the
/// replaced cluster is gone, before the restored one serves; each epoch is checked on its
/// own, and the keys written before the backup are on every restored member.
async fn a_backup_and_a_restore_keep_every_promise_of_each_epoch(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "bk";
    begin(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    let volume = backup_claim_on_first_node(&ctx).await?;
    let result = backup_and_restore(&ctx, NAME).await;
    let volumes: Api<PersistentVolume> = Api::all(ctx.client());
    volumes.delete(&volume, &DeleteParams::default()).await?;
    result
}

/// The body of [`a_backup_and_a_restore_keep_every_promise_of_each_epoch`].
async fn backup_and_restore(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    create_running(ctx, name, 3, DEFAULT_VERSION, "").await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let seeded = bulk_put(&slices, name, "/seed/", 50, 8).await?;
    ensure!(seeded.len() == 50, "{} of 50 seed writes", seeded.len());
    let recording = Recording::start(ctx, name, "backup-and-restore").await?;
    let at = Instant::now();
    create::<EtcdBackup>(
        ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: once\nspec:\n  etcdEndpoints: [\"http://{name}-client:2379\"]\n  storageType: PVC\n{}",
            pvc_location("bk/snapshot.db")
        ),
    )
    .await?;
    let backup = backup_status(ctx, "once", "succeeded", |s| s.succeeded).await?;
    duration(&format!("{name}: one-shot PVC backup"), at);
    println!(
        "{name}: snapshot at revision {:?}, {:?} bytes",
        backup.etcd_revision, backup.last_backup_size
    );
    // Writes after the snapshot: the restore takes the cluster back before them.
    recording.ok_writes(30).await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let old_uid = clusters.get(name).await?.uid().context("uid")?;
    let pods: Api<Pod> = ctx.api();
    let old_members = recording::current_member_urls(&pods, name, 3).await?;
    let at = Instant::now();
    create::<EtcdRestore>(
        ctx,
        &format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdRestore\nmetadata:\n  name: back\nspec:\n  etcdCluster:\n    name: {name}\n  backupStorageType: PVC\n{}",
            pvc_location("bk/snapshot.db")
        ),
    )
    .await?;
    restore_status(ctx, "back", "replacing the cluster", |s| {
        s.replaced_cluster_uid.is_some()
    })
    .await?;
    duration(
        &format!("{name}: restore created -> the cluster being replaced"),
        at,
    );
    replaced_cluster_silent(ctx, name, &old_uid, &old_members).await?;
    duration(
        &format!("{name}: restore created -> the replaced cluster gone and silent"),
        at,
    );
    recording.epoch("restore").await;
    restore_status(ctx, "back", "succeeded", |s| s.succeeded).await?;
    settle(ctx, name, 3, DEFAULT_VERSION).await?;
    duration(
        &format!("{name}: restore created -> restored, 3 members"),
        at,
    );
    check_every_member(&pods, name, "/seed/", &seeded, 3).await?;
    recording.ok_writes(AFTER).await?;
    let report = recording.finish(ctx, name, 3).await?;
    say_revisions(name, &report, backup.etcd_revision)?;
    Ok(())
}

/// Prints the revisions clients met around the epoch of `report`: the highest before, the
/// lowest after (and the snapshot's, when known).
fn say_revisions(name: &str, report: &Report, snapshot: Option<i64>) -> anyhow::Result<()> {
    let (before, after) = recording::revisions_across_epoch(report)?;
    println!(
        "{name}: revisions: clients saw up to {before} before the epoch; the new cluster answered from {after:?} (snapshot at {snapshot:?}){}",
        if after.is_some_and(|a| a <= before) {
            "; a client resuming from a revision it saw is not told `compacted`"
        } else {
            ""
        }
    );
    Ok(())
}

/// Deletes the pods of `victims` with grace 0 (their emptyDir data goes with them).
async fn delete_now(pods: &Api<Pod>, victims: &[&str]) -> anyhow::Result<()> {
    for victim in victims {
        pods.delete(
            victim,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await?;
    }
    Ok(())
}

/// Item 9: permanent quorum loss (two of three emptyDir members' pods deleted with grace 0
/// on Ready nodes) under `recovery.policy: Automatic`: the operator recovers a new cluster
/// from the survivor. The epoch is marked as soon as the status shows the recovery started;
/// each epoch is checked on its own, and the keys written before the loss are back.
async fn a_recovery_from_quorum_loss_keeps_every_promise_of_each_epoch(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "quorum";
    begin(&ctx).await?;
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let _controller = Controller::start(&ctx)?;
    create_running(
        &ctx,
        NAME,
        3,
        DEFAULT_VERSION,
        "recovery:\n  policy: Automatic",
    )
    .await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let seeded = bulk_put(&slices, NAME, "/seed/", 50, 8).await?;
    ensure!(seeded.len() == 50, "{} of 50 seed writes", seeded.len());
    let recording = Recording::start(&ctx, NAME, "quorum-lost-recovered").await?;
    let pods: Api<Pod> = ctx.api();
    let at = Instant::now();
    delete_now(&pods, &["quorum-1", "quorum-2"]).await?;
    let api: Api<EtcdCluster> = ctx.api();
    wait_until(&api, NAME, "a recovery under way", |c| {
        c.status.as_ref().is_some_and(|s| s.recovery.is_some())
    })
    .await?;
    duration(&format!("{NAME}: two members lost -> recovery started"), at);
    recording.epoch("recovery").await;
    let done = wait_until(&api, NAME, "recovered, 3 members", |c| {
        settled(c, 3, DEFAULT_VERSION)
            && c.status
                .as_ref()
                .is_some_and(|s| s.last_recovery.is_some() && s.recovery.is_none())
    })
    .await?;
    duration(&format!("{NAME}: two members lost -> recovered"), at);
    let last = done.status.and_then(|s| s.last_recovery);
    println!("{NAME}: lastRecovery {last:?}");
    check_every_member(&pods, NAME, "/seed/", &seeded, 3).await?;
    recording.ok_writes(AFTER).await?;
    let report = recording.finish(&ctx, NAME, 3).await?;
    say_revisions(NAME, &report, last.and_then(|l| l.revision))?;
    Ok(())
}

/// Item 10: a 3.2.13 cluster as CoreOS' operator made and left it (bare pods, its Services
/// and status), adopted by this operator started under traffic: its members replaced by the
/// operator's one at a time, the client Service's selector moved to them.
async fn a_coreos_cluster_adopted_keeps_every_promise(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "legacy";
    begin(&ctx).await?;
    let version = pinned_etcd("3.2")?;
    create_cluster(
        &ctx,
        &manifest(NAME, &format!("size: 3\nversion: {version}")),
    )
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    let cluster = api.get(NAME).await?;
    let made = Instant::now();
    let coreos = support::coreos::make(&ctx, &cluster, 3, &version, Access::Plain).await?;
    support::coreos::write_status(&api, NAME, &coreos.members, &version, true).await?;
    duration(&format!("{NAME}: CoreOS-made cluster Ready"), made);
    let pods: Api<Pod> = ctx.api();
    println!(
        "{NAME}: CoreOS members on {:?}",
        placement(&pods, NAME).await?
    );
    let recording = Recording::start(&ctx, NAME, "coreos-cluster-adopted").await?;
    let at = Instant::now();
    let _controller = Controller::start(&ctx)?;
    let coreos_left = |all: &[Pod]| {
        all.iter()
            .filter(|p| coreos.members.contains(&p.name_any()))
            .count()
    };
    poll_until(
        "the cluster running on the operator's members",
        WAIT * 2,
        || async {
            let c = api.get(NAME).await?;
            let adopted = c.status.as_ref().is_some_and(|s| {
                s.phase == Some(ClusterPhase::Running)
                    && s.coreos_members.is_empty()
                    && s.ready_members == Some(3)
                    && s.observed_generation == c.metadata.generation
            });
            let all = cluster_pods(&pods, NAME).await?;
            anyhow::Ok((adopted && coreos_left(&all) == 0 && all.len() == 3).then_some(()))
        },
    )
    .await?;
    duration(&format!("{NAME}: operator started -> adopted"), at);
    let placed: BTreeMap<String, String> = placement(&pods, NAME).await?;
    println!("{NAME}: the operator's members on {placed:?}");
    recording.ok_writes(AFTER).await?;
    recording.finish(&ctx, NAME, 3).await?;
    Ok(())
}
