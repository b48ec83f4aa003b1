//! The lifecycle of an EtcdCluster on real etcd members: the webhook and the controller run
//! in this process against the harness's kube-apiserver; the harness's process kubelet runs
//! each member pod as a real etcd process on a private pod network. Every test keeps a client
//! writing where it matters and checks that each acknowledged write is on every member.
//!
//! Run: `cargo test -p etcd-tests --test lifecycle` (needs `hack/build-tools.sh` first).
//! Each test prints its durations on lines starting with `duration:`.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use anyhow::{Context as _, bail, ensure};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};

use etcd_shared::types::ClusterPhase;
use etcd_shared::version::DEFAULT_VERSION;
use etcd_shared::{EtcdCluster, names};
use etcd_tests::poll_until;
use etcd_tests::suite::TestContext;

use support::operator::{Controller, create_cluster, install};
use support::phases::PhaseWatch;
use support::tls::{coreos_tls_secrets, tls_section};
use support::writer::Writer;
use support::{
    ETCD_TIMEOUT, WAIT, check_every_member, client_service_urls, connect, member_list, member_pods,
    member_urls, pinned_etcd, reported_versions, settled, wait_until,
};
use support::{cluster_yaml, create_settled, duration, manifest};

fn main() -> std::process::ExitCode {
    // Walks through many steps on real members, beside the other tests on two cores.
    let long = std::time::Duration::from_secs(900);
    let mut tests = etcd_tests::tests![
        three_members_become_available_and_share_data,
        scaling_three_five_three_keeps_every_acknowledged_write,
        a_killed_member_process_comes_back,
        a_member_that_lost_its_data_is_replaced,
        a_rolling_upgrade_moves_one_member_at_a_time,
        a_version_skip_is_refused_and_paused_freezes_the_cluster,
        deleting_the_cluster_removes_every_object_and_process,
        a_tls_cluster_talks_mutual_tls_to_peers_and_clients,
        a_member_of_every_line_starts_plain_and_with_tls,
        learners_joining_never_look_like_lost_quorum,
        pods_are_admitted_in_a_namespace_enforcing_pod_security_restricted,
    ];
    tests.extend([
        etcd_tests::Test::new(
            "the_users_example_lives_on_etcd_3_2",
            the_users_example_lives_on_etcd_3_2,
        )
        .with_timeout(long),
        etcd_tests::Test::new("a_cluster_lives_on_etcd_3_3", a_cluster_lives_on_etcd_3_3)
            .with_timeout(long),
        etcd_tests::Test::new(
            "the_upgrade_chain_walks_every_line_from_3_2",
            the_upgrade_chain_walks_every_line_from_3_2,
        )
        .with_timeout(long),
    ]);
    etcd_tests::run_suite_with_kubelet(tests)
}

async fn patch_spec(
    api: &Api<EtcdCluster>,
    name: &str,
    spec: serde_json::Value,
) -> Result<EtcdCluster, kube::Error> {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": spec })),
    )
    .await
}

fn names_in(c: &EtcdCluster) -> BTreeSet<String> {
    c.status
        .as_ref()
        .and_then(|s| s.members.as_ref())
        .map(|m| m.ready.iter().chain(&m.unready).cloned().collect())
        .unwrap_or_default()
}

/// Issue 6, case 1: a 3-member cluster comes up Available; keys written through the client
/// Service's endpoints are read from every member.
async fn three_members_become_available_and_share_data(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = create_settled(&ctx, "demo", 3, None).await?;
    ensure!(
        version == DEFAULT_VERSION,
        "defaulted version {version}, expected {DEFAULT_VERSION}"
    );

    // The EndpointSlice controller follows pod readiness a moment later.
    let slices: Api<EndpointSlice> = ctx.api();
    let urls = poll_until("3 ready client Service endpoints", WAIT, || {
        let slices = slices.clone();
        async move {
            let urls = client_service_urls(&slices, "demo").await?;
            anyhow::Ok((urls.len() == 3).then_some(urls))
        }
    })
    .await?;
    let mut client = connect(&urls).await?;
    let mut written = BTreeMap::new();
    for i in 0..10 {
        let (k, v) = (format!("greeting/{i}"), format!("hello {i}"));
        client.put(k.clone(), v.clone(), None).await?;
        written.insert(k, v);
    }
    check_every_member(&ctx.api(), "demo", "greeting/", &written, 3).await?;
    let versions = reported_versions(&ctx.api(), "demo").await?;
    ensure!(
        versions.values().all(|v| v == DEFAULT_VERSION),
        "{versions:?}"
    );
    Ok(())
}

/// Issue 6, case 2: 3 -> 5 -> 3 while a client keeps writing; every acknowledged write is on
/// every remaining member.
async fn scaling_three_five_three_keeps_every_acknowledged_write(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = create_settled(&ctx, "scale", 3, None).await?;
    scale_three_five_three(&ctx, "scale", &version).await
}

/// Scales a settled 3-member cluster to 5 and back to 3 under writes. Members join one at a
/// time: at no point are two members in the member list unstarted or not yet promoted.
async fn scale_three_five_three(
    ctx: &TestContext,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    let before = names_in(&api.get(name).await?);

    let writer = Writer::start(ctx.api(), name, "w/");
    writer.wait_for_writes(20).await?;
    let joins = JoinWatch::start(ctx.api(), name);
    let phases = PhaseWatch::start(api.clone(), name);

    let up = Instant::now();
    patch_spec(&api, name, serde_json::json!({ "size": 5 })).await?;
    let five = wait_until(&api, name, "5 healthy voters", |c| settled(c, 5, version)).await?;
    duration(&format!("{name}: 3 -> 5"), up);
    let phases = phases.stop().await?;
    println!(
        "{name}: phases during 3 -> 5 {:?}",
        phases.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    // A member that answers etcd before its readiness probe passes is starting; nothing
    // upgrades in a scale-up, and quorum is never at stake.
    let wrong: Vec<&(ClusterPhase, String)> = phases
        .iter()
        .filter(|(p, _)| matches!(p, ClusterPhase::Upgrading | ClusterPhase::QuorumLost))
        .collect();
    ensure!(
        wrong.is_empty(),
        "phases a scale-up must not show: {wrong:?}"
    );
    writer.wait_for_writes(20).await?;

    let down = Instant::now();
    patch_spec(&api, name, serde_json::json!({ "size": 3 })).await?;
    let three = wait_until(&api, name, "3 healthy voters", |c| settled(c, 3, version)).await?;
    duration(&format!("{name}: 5 -> 3"), down);
    writer.wait_for_writes(20).await?;

    let joins = joins.stop().await?;
    println!(
        "{name}: member-list samples {}, most joining at once {}, learners seen {}",
        joins.samples, joins.most_joining, joins.learners_seen
    );
    ensure!(
        joins.samples > 0,
        "the member list was never read during the scale-up"
    );
    ensure!(
        joins.most_joining <= 1,
        "{} members were joining at once",
        joins.most_joining
    );
    let learners = version
        .parse::<etcd_shared::version::EtcdVersion>()?
        .capabilities()
        .is_some_and(|c| c.learners);
    ensure!(
        learners || !joins.learners_seen,
        "etcd {version} has no learners, yet one was listed"
    );

    let report = writer.stop().await?;
    println!(
        "{name}: {} writes acknowledged, {} failed or unknown",
        report.acked.len(),
        report.failed
    );
    check_every_member(&ctx.api(), name, "w/", &report.acked, 3).await?;
    // The members added for the scale-up are the ones removed again (newest first).
    ensure!(
        names_in(&three) == before,
        "after 3 -> 5 -> 3 the members are {:?}, expected the first three {before:?} (5 were {:?})",
        names_in(&three),
        names_in(&five)
    );
    let pods = member_pods(&ctx.api(), name).await?;
    ensure!(
        pods.keys().cloned().collect::<BTreeSet<_>>() == before,
        "pods left: {:?}",
        pods.keys()
    );
    Ok(())
}

/// What a [`JoinWatch`] saw of the member list.
#[derive(Debug, Default)]
struct Joins {
    /// Member lists read.
    samples: usize,
    /// The most members that were unstarted or learners in one list.
    most_joining: usize,
    /// Whether any list had a learner.
    learners_seen: bool,
}

/// Reads the member list of a cluster from any member every 100 ms until stopped.
struct JoinWatch {
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Joins>,
}

impl JoinWatch {
    fn start(pods: Api<Pod>, cluster: &str) -> Self {
        let stop = tokio_util::sync::CancellationToken::new();
        let token = stop.clone();
        let cluster = cluster.to_string();
        let task = tokio::spawn(async move {
            let mut joins = Joins::default();
            let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
            while !token.is_cancelled() {
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tick.tick() => {}
                }
                let Ok(urls) = member_urls(&pods, &cluster).await else {
                    continue;
                };
                for url in urls.values() {
                    if let Ok(list) = member_list(url).await {
                        let joining = list
                            .values()
                            .filter(|(name, learner)| name.is_empty() || *learner)
                            .count();
                        joins.samples += 1;
                        joins.most_joining = joins.most_joining.max(joining);
                        joins.learners_seen |= list.values().any(|(_, l)| *l);
                        break;
                    }
                }
            }
            joins
        });
        Self { stop, task }
    }

    async fn stop(self) -> anyhow::Result<Joins> {
        self.stop.cancel();
        Ok(self.task.await?)
    }
}

fn restart_count(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .map_or(0, |c| c.restart_count)
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Issue 6, case 3: SIGKILL one member's etcd process; the kubelet restarts it on its data,
/// the member rejoins, the cluster is healthy again and no membership change was needed.
async fn a_killed_member_process_comes_back(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let version = create_settled(&ctx, "crash", 3, None).await?;
    kill_a_member(&ctx, &controller, "crash", &version).await
}

/// SIGKILLs member 1 of a settled 3-member cluster under writes and waits for it to be back.
async fn kill_a_member(
    ctx: &TestContext,
    controller: &Controller,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let changes_before = controller.member_changes();
    let writer = Writer::start(ctx.api(), name, "crash/");
    writer.wait_for_writes(20).await?;

    let victim = names::member_name(name, 1);
    let restarts = restart_count(&pods.get(&victim).await?);
    let killed = Instant::now();
    let pid = ctx.kubelet()?.kill_container(ctx.ns(), &victim)?;
    println!("{name}: killed {victim} (pid {pid})");
    poll_until(
        "the killed member to restart and be ready",
        WAIT,
        || async {
            let p = pods.get(&victim).await?;
            anyhow::Ok((restart_count(&p) > restarts && is_ready(&p)).then_some(()))
        },
    )
    .await?;
    wait_until(&api, name, "3 healthy voters again", |c| {
        settled(c, 3, version)
    })
    .await?;
    let secs = duration(&format!("{name}: killed member healthy again"), killed);
    if secs > 30.0 {
        println!("note: longer than the 30 s aim");
    }
    writer.wait_for_writes(20).await?;
    let report = writer.stop().await?;
    check_every_member(&ctx.api(), name, "crash/", &report.acked, 3).await?;
    ensure!(
        controller.member_changes() == changes_before,
        "the controller changed membership for a member that only crashed"
    );
    ensure!(
        names_in(&api.get(name).await?).contains(&victim),
        "{victim} is no longer a member"
    );
    Ok(())
}

/// Issue 6, case 4: a member's data is wiped and its pod deleted; the controller removes the
/// member, adds a new one, and the new member holds every acknowledged write.
async fn a_member_that_lost_its_data_is_replaced(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = create_settled(&ctx, "lost", 3, None).await?;
    replace_a_member_that_lost_its_data(&ctx, "lost", &version).await
}

/// Wipes the data of member 2 of a settled 3-member cluster under writes, deletes its pod,
/// and waits until a new member (a new ID) holds every acknowledged write.
async fn replace_a_member_that_lost_its_data(
    ctx: &TestContext,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let writer = Writer::start(ctx.api(), name, "lost/");
    writer.wait_for_writes(20).await?;

    let victim = names::member_name(name, 2);
    let survivor_url = member_urls(&pods, name)
        .await?
        .remove(&names::member_name(name, 0))
        .context("member 0 has no IP")?;
    let before = member_list(&survivor_url).await?;
    let (victim_id, _) = before
        .iter()
        .find(|(_, (member, _))| *member == victim)
        .context("victim not in the member list")?;
    let victim_id = *victim_id;
    let wiped = ctx.kubelet()?.wipe_data(ctx.ns(), &victim, "data")?;
    println!("{name}: wiped {}", wiped.display());
    let lost = Instant::now();
    pods.delete(&victim, &DeleteParams::default()).await?;
    // Replaced means a new member ID: a member that forgot its log must never vote under
    // its old identity. (The name may come back: it is the next free index.)
    let members = poll_until("the lost member replaced by a new voter", WAIT, || {
        let url = survivor_url.clone();
        async move {
            let list = member_list(&url).await?;
            let done = list.len() == 3
                && !list.contains_key(&victim_id)
                && list
                    .values()
                    .all(|(member, learner)| !member.is_empty() && !learner);
            anyhow::Ok(done.then_some(list))
        }
    })
    .await?;
    wait_until(&api, name, "the cluster settled again", |c| {
        settled(c, 3, version)
    })
    .await?;
    let secs = duration(&format!("{name}: member replaced"), lost);
    if secs > 30.0 {
        println!("note: longer than the 30 s aim");
    }
    let (new_id, (new_name, _)) = members
        .iter()
        .find(|(id, _)| !before.contains_key(id))
        .context("no new member ID")?;
    println!("{name}: member {victim_id:x} ({victim}) replaced by {new_id:x} ({new_name})");
    writer.wait_for_writes(20).await?;
    let report = writer.stop().await?;
    check_every_member(&ctx.api(), name, "lost/", &report.acked, 3).await?;
    Ok(())
}

/// What a watch of the member pods saw during an upgrade.
#[derive(Debug, Default)]
struct UpgradeTrace {
    /// Members in the order their pods moved to the new version.
    order: Vec<String>,
    /// The most member pods seen not ready at once.
    most_unready: usize,
}

/// Watches the member pods of `cluster` until `stop`, recording the upgrade order.
fn trace_upgrade(
    pods: Api<Pod>,
    cluster: &str,
    to: &str,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<UpgradeTrace> {
    let selector = format!("{}={cluster}", names::LABEL_INSTANCE);
    let to = to.to_string();
    tokio::spawn(async move {
        let mut trace = UpgradeTrace::default();
        let mut ready: BTreeMap<String, bool> = BTreeMap::new();
        let stream = watcher(pods, watcher::Config::default().labels(&selector));
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return trace,
                e = stream.next() => e,
            };
            let Some(Ok(event)) = event else { continue };
            let pod = match event {
                watcher::Event::Apply(p) | watcher::Event::InitApply(p) => p,
                watcher::Event::Delete(p) => {
                    ready.remove(&p.name_any());
                    continue;
                }
                watcher::Event::Init | watcher::Event::InitDone => continue,
            };
            let name = pod.name_any();
            let on_target = pod.labels().get(names::LABEL_VERSION) == Some(&to);
            if on_target && !trace.order.contains(&name) {
                trace.order.push(name.clone());
            }
            ready.insert(name, is_ready(&pod));
            let unready = ready.values().filter(|r| !**r).count();
            trace.most_unready = trace.most_unready.max(unready);
        }
    })
}

/// Issue 6, case 5: 3.6 -> 3.7 under writes; one member at a time, the status reports the
/// new version, every acknowledged write survives.
async fn a_rolling_upgrade_moves_one_member_at_a_time(ctx: TestContext) -> anyhow::Result<()> {
    const FROM: &str = "3.6.16";
    const TO: &str = "3.7.3";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let api: Api<EtcdCluster> = ctx.api();
    create_settled(&ctx, "upgrade", 3, Some(FROM)).await?;
    let writer = Writer::start(ctx.api(), "upgrade", "w/");
    writer.wait_for_writes(20).await?;

    let stop = tokio_util::sync::CancellationToken::new();
    let trace = trace_upgrade(ctx.api(), "upgrade", TO, stop.clone());
    let started = Instant::now();
    patch_spec(&api, "upgrade", serde_json::json!({ "version": TO })).await?;
    let done = wait_until(&api, "upgrade", "every member on the new version", |c| {
        settled(c, 3, TO)
    })
    .await?;
    duration("upgrade: 3 members 3.6.16 -> 3.7.3", started);
    stop.cancel();
    let trace = trace.await?;
    println!("upgrade: order {:?}", trace.order);
    ensure!(
        trace.order.len() == 3,
        "not every member moved: {:?}",
        trace.order
    );
    ensure!(
        trace.most_unready <= 1,
        "{} members were down at once",
        trace.most_unready
    );
    // The leader moved last, after handing leadership to an upgraded member.
    let handovers: Vec<String> = ctx
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LeadershipTransferred"))
        .filter_map(|e| e.note)
        .collect();
    println!("upgrade: handovers {handovers:?}");
    ensure!(
        handovers.len() == 1
            && handovers[0].starts_with(&format!("hand leadership from {}", trace.order[2])),
        "expected one handover from the last member upgraded ({}): {handovers:?}",
        trace.order[2]
    );
    let status = done.status.context("status")?;
    // CoreOS' semantics: targetVersion only while an upgrade runs.
    ensure!(
        status.current_version.as_deref() == Some(TO) && status.target_version.is_none(),
        "{status:?}"
    );
    let versions = reported_versions(&ctx.api(), "upgrade").await?;
    ensure!(
        versions.values().all(|v| v == TO),
        "members report {versions:?}"
    );

    writer.wait_for_writes(20).await?;
    let report = writer.stop().await?;
    println!(
        "upgrade: {} writes acknowledged, {} failed or unknown",
        report.acked.len(),
        report.failed
    );
    check_every_member(&ctx.api(), "upgrade", "w/", &report.acked, 3).await?;
    Ok(())
}

/// Issue 6, case 6: the webhook refuses 3.5 -> 3.7; with `paused: true` a member whose pod
/// is deleted stays down however often the controller looks, and comes back once unpaused.
async fn a_version_skip_is_refused_and_paused_freezes_the_cluster(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const VERSION: &str = "3.5.35";
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let api: Api<EtcdCluster> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    create_settled(&ctx, "frozen", 3, Some(VERSION)).await?;

    match patch_spec(&api, "frozen", serde_json::json!({ "version": "3.7.3" })).await {
        Err(kube::Error::Api(e)) => {
            println!("frozen: 3.5.35 -> 3.7.3 refused: {}", e.message);
            ensure!(
                e.code == 403 || e.code == 400 || e.code == 422,
                "refused with HTTP {}",
                e.code
            );
            ensure!(
                e.message
                    .contains("one minor line at a time; move to 3.6.x first"),
                "unclear refusal: {}",
                e.message
            );
        }
        Err(e) => bail!("unexpected error: {e}"),
        Ok(c) => bail!("3.5 -> 3.7 was accepted: {:?}", c.spec.version),
    }
    ensure!(api.get("frozen").await?.spec.version.as_deref() == Some(VERSION));

    let paused = patch_spec(&api, "frozen", serde_json::json!({ "paused": true })).await?;
    let generation = paused.metadata.generation;
    wait_until(&api, "frozen", "phase Paused", |c| {
        let s = c.status.as_ref();
        s.and_then(|s| s.observed_generation) == generation
            && s.and_then(|s| s.phase) == Some(ClusterPhase::Paused)
    })
    .await?;
    let changes = controller.member_changes();
    let victim = names::member_name("frozen", 0);
    pods.delete(&victim, &DeleteParams::default()).await?;
    poll_until("the deleted pod to be gone", WAIT, || async {
        anyhow::Ok(pods.get_opt(&victim).await?.is_none().then_some(()))
    })
    .await?;
    // Make the controller look again, several times: each annotation change is a watch event
    // it reconciles.
    for round in 0..3 {
        let seen = controller.reconciles();
        api.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": { "annotations": { "etcd-tests/poke": round.to_string() } }
            })),
        )
        .await?;
        poll_until("the controller to reconcile again", WAIT, || async {
            anyhow::Ok((controller.reconciles() > seen).then_some(()))
        })
        .await?;
    }
    let left = member_pods(&pods, "frozen").await?;
    ensure!(
        left.len() == 2 && !left.contains_key(&victim),
        "paused, yet pods are {:?}",
        left.keys()
    );
    ensure!(
        controller.member_changes() == changes,
        "paused, yet membership changed"
    );

    let resumed = Instant::now();
    patch_spec(&api, "frozen", serde_json::json!({ "paused": false })).await?;
    wait_until(&api, "frozen", "3 healthy voters after unpausing", |c| {
        settled(c, 3, VERSION)
    })
    .await?;
    duration("frozen: member replaced after unpausing", resumed);
    Ok(())
}

/// Issue 6, case 7: deleting the EtcdCluster removes its pods (and their etcd processes),
/// Services, budget and events' owner.
async fn deleting_the_cluster_removes_every_object_and_process(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_settled(&ctx, "doomed", 3, None).await?;
    delete_and_check_gone(&ctx, "doomed").await
}

/// Deletes a 3-member cluster (foreground) and checks that everything it owned and every etcd
/// process is gone.
async fn delete_and_check_gone(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    let api: Api<EtcdCluster> = ctx.api();
    let pods: Api<Pod> = ctx.api();
    let kubelet = ctx.kubelet()?;
    let pids: Vec<u32> = member_pods(&pods, name)
        .await?
        .keys()
        .filter_map(|p| kubelet.container_pid(ctx.ns(), p))
        .collect();
    ensure!(pids.len() == 3, "etcd pids: {pids:?}");

    let started = Instant::now();
    api.delete(name, &DeleteParams::foreground()).await?;
    let selector = format!("{}={name}", names::LABEL_INSTANCE);
    let services: Api<Service> = ctx.api();
    let budgets: Api<PodDisruptionBudget> = ctx.api();
    poll_until(
        "the cluster and everything it owned to be gone",
        WAIT,
        || async {
            let lp = ListParams::default().labels(&selector);
            let gone = api.get_opt(name).await?.is_none()
                && pods.list(&lp).await?.items.is_empty()
                && services.list(&lp).await?.items.is_empty()
                && budgets.list(&lp).await?.items.is_empty();
            anyhow::Ok(gone.then_some(()))
        },
    )
    .await?;
    duration(
        &format!("{name}: cluster deleted with everything it owned"),
        started,
    );
    for pid in pids {
        let alive = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok();
        ensure!(!alive, "etcd process {pid} still runs");
    }
    Ok(())
}

/// Peer and client traffic over mutual TLS from the Secrets of `spec.TLS.static`: the members
/// form a cluster over https peer URLs, the operator manages them with its client
/// certificate, a client with a certificate of the same CA reads and writes, and a client
/// without one is refused.
async fn a_tls_cluster_talks_mutual_tls_to_peers_and_clients(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

    const NAME: &str = "secure";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let ns = ctx.ns().to_owned();
    let (ca, operator) = coreos_tls_secrets(&ctx, NAME).await?;

    let started = Instant::now();
    let yaml = format!("{}{}", cluster_yaml(NAME, 3, None), tls_section(NAME));
    let created = create_cluster(&ctx, &yaml).await?;
    let version = created
        .spec
        .version
        .clone()
        .context("version not defaulted")?;
    wait_until(&ctx.api(), NAME, "3 healthy voters over TLS", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration("secure: 3-member TLS cluster Available", started);

    // Every member is dialled by IP and checked against the member wildcard name.
    let pods: Api<Pod> = ctx.api();
    let ips: Vec<String> = member_urls(&pods, NAME)
        .await?
        .values()
        .map(|u| u.replace("http://", "https://"))
        .collect();
    ensure!(ips.len() == 3, "member URLs {ips:?}");
    // The operator's certificate, or none; members are named by the member wildcard.
    let options = |identity: bool| {
        let mut tls = TlsOptions::new()
            .ca_certificate(Certificate::from_pem(ca.cert_pem()))
            .domain_name(format!("member.{NAME}.{ns}.svc"));
        if identity {
            tls = tls.identity(Identity::from_pem(&operator.cert_pem, &operator.key_pem));
        }
        ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT)
            .with_tls(tls)
    };
    let mut client = etcd_client::Client::connect(ips.clone(), Some(options(true))).await?;
    client.put("tls/hello", "world", None).await?;
    let members = client.member_list().await?;
    let peer_urls: Vec<String> = members
        .members()
        .iter()
        .flat_map(|m| m.peer_urls().to_vec())
        .collect();
    ensure!(
        peer_urls.len() == 3 && peer_urls.iter().all(|u| u.starts_with("https://")),
        "peer URLs {peer_urls:?}"
    );
    for url in &ips {
        let mut one = etcd_client::Client::connect([url.clone()], Some(options(true))).await?;
        let got = one.get("tls/hello", None).await?;
        ensure!(
            got.kvs().first().map(|kv| kv.value()) == Some(b"world".as_slice()),
            "{url} does not have tls/hello"
        );
    }

    // Without a client certificate the members refuse the client.
    let refused = match etcd_client::Client::connect(ips, Some(options(false))).await {
        Err(e) => Some(e.to_string()),
        Ok(mut c) => c
            .put("tls/anonymous", "x", None)
            .await
            .err()
            .map(|e| e.to_string()),
    };
    // The handshake fails (TLS 1.3 reports it as a "certificate required" alert or, when the
    // alert races the client's first write, a broken pipe); what matters is that nothing
    // was written.
    ensure!(
        refused.is_some(),
        "a client without a certificate could write"
    );
    let leaked = client.get("tls/anonymous", None).await?;
    ensure!(
        leaked.kvs().is_empty(),
        "a client without a certificate wrote tls/anonymous"
    );
    println!(
        "secure: a client without a certificate is refused: {}",
        refused.unwrap_or_default()
    );
    Ok(())
}

/// Issue 13, items 2 and 3: the users' example as it is (etcd 3.2.13, 3 members) through the
/// webhook, then its whole life on real 3.2 members: scale 3 -> 5 -> 3 under writes (voters
/// join one at a time, no learners on 3.2), a killed member back, a member that lost its data
/// replaced, delete.
async fn the_users_example_lives_on_etcd_3_2(ctx: TestContext) -> anyhow::Result<()> {
    const EXAMPLE: &str = include_str!("../../examples/example-etcd-cluster.yaml");
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let started = Instant::now();
    let created = create_cluster(&ctx, EXAMPLE).await?;
    let name = created.name_any();
    let version = created.spec.version.clone().context("no version")?;
    ensure!(
        version == "3.2.13",
        "the example's version became {version}"
    );
    wait_until(&ctx.api(), &name, "3 healthy voters on 3.2.13", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration(&format!("{name}: the example Running on 3.2.13"), started);
    let versions = reported_versions(&ctx.api(), &name).await?;
    ensure!(versions.values().all(|v| v == "3.2.13"), "{versions:?}");
    old_line_life(&ctx, &controller, &name, &version).await
}

/// Issue 13, item 3 on the 3.3 line (it has a metrics listener and MoveLeader, 3.2 has not).
async fn a_cluster_lives_on_etcd_3_3(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let version = pinned_etcd("3.3")?;
    create_settled(&ctx, "line33", 3, Some(&version)).await?;
    old_line_life(&ctx, &controller, "line33", &version).await
}

async fn old_line_life(
    ctx: &TestContext,
    controller: &Controller,
    name: &str,
    version: &str,
) -> anyhow::Result<()> {
    scale_three_five_three(ctx, name, version).await?;
    kill_a_member(ctx, controller, name, version).await?;
    replace_a_member_that_lost_its_data(ctx, name, version).await?;
    delete_and_check_gone(ctx, name).await
}

/// The leadership handovers the controller announced: how many in all, and the member that
/// took over in the latest. One Recorder keeps repeated events (same reason and related pod) as
/// one Event with a series count, so occurrences are counted, not Event objects.
async fn handovers(ctx: &TestContext) -> anyhow::Result<(i64, Option<String>)> {
    let events: Vec<k8s_openapi::api::events::v1::Event> = ctx
        .api::<k8s_openapi::api::events::v1::Event>()
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("LeadershipTransferred"))
        .collect();
    let total = events
        .iter()
        .map(|e| e.series.as_ref().map_or(1, |s| i64::from(s.count)))
        .sum();
    let last_seen = |e: &k8s_openapi::api::events::v1::Event| {
        e.series
            .as_ref()
            .map(|s| s.last_observed_time.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
    };
    let latest = events
        .iter()
        .max_by_key(|e| last_seen(e))
        .and_then(|e| e.related.as_ref()?.name.clone());
    Ok((total, latest))
}

/// Issue 13, item 4: one 3-member cluster under continuous writes walks every line the
/// operator supports, 3.2.13 -> 3.3 -> 3.4 -> 3.5 -> 3.6 -> 3.7, one minor line per spec
/// change, each applied through the webhook once the previous line has settled. One member
/// restarts at a time; the leader hands over first wherever its line has MoveLeader (3.3+);
/// no acknowledged write is lost.
async fn the_upgrade_chain_walks_every_line_from_3_2(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "chain";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let api: Api<EtcdCluster> = ctx.api();
    let lines = etcd_tests::Versions::pinned()?.every_etcd();
    let (first, hops) = lines.split_first().context("no etcd versions pinned")?;
    create_settled(&ctx, NAME, 3, Some(first)).await?;
    let writer = Writer::start(ctx.api(), NAME, "chain/");
    writer.wait_for_writes(20).await?;

    // More than the 10,000 entries after which etcd 3.6 takes a raft snapshot.
    const BULK_WRITES: usize = 10_500;
    let mut bulk_acked = BTreeMap::new();
    let mut from = first.clone();
    let mut figures = Vec::new();
    for to in hops {
        let (acked, failed) = (writer.acked(), writer.failed());
        let (handovers_before, _) = handovers(&ctx).await?;
        let stop = tokio_util::sync::CancellationToken::new();
        let trace = trace_upgrade(ctx.api(), NAME, to, stop.clone());
        let started = Instant::now();
        patch_spec(&api, NAME, serde_json::json!({ "version": to }))
            .await
            .with_context(|| format!("the webhook refused {from} -> {to}"))?;
        let caps = |v: &str| -> anyhow::Result<&'static etcd_shared::version::LineCapabilities> {
            v.parse::<etcd_shared::version::EtcdVersion>()?
                .capabilities()
                .context("unsupported line")
        };
        if caps(&from)?.replays_v2_entries && !caps(to)?.replays_v2_entries {
            // 3.7 cannot replay the v2-format entries 3.2-3.4 wrote: the operator waits until
            // every member snapshotted past them (3.6 snapshots every 10,000 entries). A
            // burst of writes gets it there, as a busy cluster's own traffic would.
            let waiting = wait_until(&api, NAME, "the wait for a raft snapshot", |c| {
                c.status
                    .as_ref()
                    .and_then(|s| s.next_step.as_deref())
                    .is_some_and(|n| n.contains("raft snapshot past the v2-format entries"))
            })
            .await?;
            println!(
                "chain: {from} -> {to}: {}",
                waiting.status.and_then(|s| s.next_step).unwrap_or_default()
            );
            let burst = Instant::now();
            let bulk = support::bulk_put(&ctx.api(), NAME, "bulk/", BULK_WRITES, 64).await?;
            // The first member may restart while the burst still runs (the barrier is passed
            // before its end): the writes it was sent then time out. Acknowledged ones count.
            println!(
                "chain: {} of {BULK_WRITES} bulk writes acknowledged in {:.1} s",
                bulk.len(),
                burst.elapsed().as_secs_f64()
            );
            bulk_acked.extend(bulk);
        }
        wait_until(&api, NAME, &format!("every member on {to}"), |c| {
            settled(c, 3, to)
        })
        .await?;
        let secs = started.elapsed().as_secs_f64();
        stop.cancel();
        let trace = trace.await?;
        writer.wait_for_writes(10).await?;
        let (hop_acked, hop_failed) = (writer.acked() - acked, writer.failed() - failed);
        let line = format!(
            "chain: {from} -> {to}: {secs:.1} s, {hop_failed} of {} writes failed or timed out",
            hop_acked + hop_failed
        );
        println!("{line}");
        figures.push(line);
        ensure!(
            trace.order.len() == 3,
            "{from} -> {to}: moved {:?}",
            trace.order
        );
        ensure!(
            trace.most_unready <= 1,
            "{from} -> {to}: {} members were down at once",
            trace.most_unready
        );
        let (handovers_after, took_over) = handovers(&ctx).await?;
        let new_handovers = handovers_after - handovers_before;
        let leader_can_hand_over = from
            .parse::<etcd_shared::version::EtcdVersion>()?
            .capabilities()
            .is_some_and(|c| c.move_leader);
        if leader_can_hand_over {
            // The leader moves last, after handing over to a member already moved.
            ensure!(
                new_handovers == 1
                    && took_over.as_deref().is_some_and(
                        |m| m != trace.order[2] && trace.order.contains(&m.to_string())
                    ),
                "{from} -> {to}: expected one handover from the last member moved ({}) to another: {new_handovers} handovers, the latest to {took_over:?}",
                trace.order[2]
            );
        } else {
            ensure!(
                new_handovers == 0,
                "{from} has no MoveLeader, yet {new_handovers} handovers"
            );
        }
        let versions = reported_versions(&ctx.api(), NAME).await?;
        ensure!(versions.values().all(|v| v == to), "{versions:?}");
        from = to.clone();
    }
    let report = writer.stop().await?;
    println!(
        "chain: {} writes acknowledged over {} hops, {} failed or unknown",
        report.acked.len(),
        figures.len(),
        report.failed
    );
    check_every_member(&ctx.api(), NAME, "chain/", &report.acked, 3).await?;
    check_every_member(&ctx.api(), NAME, "bulk/", &bulk_acked, 3).await?;
    Ok(())
}

/// `GET /health` over plain HTTP; the body etcd answers.
async fn http_health(ip: &str, port: i32) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::time::timeout(
        ETCD_TIMEOUT,
        tokio::net::TcpStream::connect(format!("{ip}:{port}")),
    )
    .await??;
    stream
        .write_all(format!("GET /health HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    tokio::time::timeout(ETCD_TIMEOUT, stream.read_to_string(&mut response)).await??;
    ensure!(
        response.starts_with("HTTP/1.") && response.contains(" 200 "),
        "GET /health on {ip}:{port}: {response}"
    );
    Ok(response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string())
}

/// One member of `version`, plain or with `spec.TLS.static`, from the pod builder's spec:
/// it starts without a restart (a flag its line does not know would crash it), becomes Ready
/// by the probe the builder chose, and serves `/health` where that probe looks.
async fn one_member_starts(ctx: &TestContext, version: &str, tls: bool) -> anyhow::Result<()> {
    let line = version
        .rsplit_once('.')
        .map_or(version, |(l, _)| l)
        .replace('.', "");
    let name = format!("flags{line}{}", if tls { "t" } else { "p" });
    let mut yaml = cluster_yaml(&name, 1, Some(version));
    let tls_material = if tls {
        yaml.push_str(&tls_section(&name));
        Some(coreos_tls_secrets(ctx, &name).await?)
    } else {
        None
    };
    create_cluster(ctx, &yaml).await?;
    wait_until(&ctx.api(), &name, "its member Running", |c| {
        settled(c, 1, version)
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    let member = names::member_name(&name, 0);
    let pod = pods.get(&member).await?;
    ensure!(is_ready(&pod), "{member} is not Ready");
    ensure!(
        restart_count(&pod) == 0,
        "{member} restarted {} times: a flag its line does not know?",
        restart_count(&pod)
    );
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .context("no pod IP")?;
    let probe = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.readiness_probe.clone())
        .context("no readiness probe")?;
    let chosen = match (&probe.http_get, &probe.tcp_socket) {
        (Some(get), _) => {
            let port = match &get.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => *p,
                other => bail!("named probe port {other:?}"),
            };
            let body = http_health(&ip, port).await?;
            ensure!(body.contains("true"), "{member} /health: {body}");
            format!("GET /health on {port}: {}", body.trim())
        }
        (None, Some(tcp)) => format!("TCP {:?}", tcp.port),
        (None, None) => bail!("{member}: probe neither HTTP nor TCP: {probe:?}"),
    };
    if let Some((ca, operator)) = tls_material {
        use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
        let options = ConnectOptions::new()
            .with_connect_timeout(ETCD_TIMEOUT)
            .with_timeout(ETCD_TIMEOUT)
            .with_tls(
                TlsOptions::new()
                    .ca_certificate(Certificate::from_pem(ca.cert_pem()))
                    .identity(Identity::from_pem(&operator.cert_pem, &operator.key_pem))
                    .domain_name(format!("member.{name}.{}.svc", ctx.ns())),
            );
        let url = format!("https://{ip}:{}", names::CLIENT_PORT);
        let mut client = etcd_client::Client::connect([url], Some(options)).await?;
        let status = client.status().await?;
        ensure!(
            status.version() == version,
            "{member} reports {}",
            status.version()
        );
    }
    println!(
        "flags: etcd {version} {}: Ready by {chosen}",
        if tls { "TLS" } else { "plain" }
    );
    Ok(())
}

/// Issue 13, item 5: a member of every line 3.2-3.7, plain and with `spec.TLS.static`, starts
/// from the pod builder's own spec.
async fn a_member_of_every_line_starts_plain_and_with_tls(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let versions = etcd_tests::Versions::pinned()?.every_etcd();
    let runs = versions
        .iter()
        .flat_map(|v| [(v.clone(), false), (v.clone(), true)])
        .map(|(v, tls)| {
            let ctx = &ctx;
            async move {
                let result = one_member_starts(ctx, &v, tls).await;
                (format!("{v} {}", if tls { "TLS" } else { "plain" }), result)
            }
        });
    let failed: Vec<String> = futures::future::join_all(runs)
        .await
        .into_iter()
        .filter_map(|(what, r)| r.err().map(|e| format!("{what}: {e:#}")))
        .collect();
    ensure!(failed.is_empty(), "{}", failed.join("\n"));
    Ok(())
}

/// Issue 13, item 8: while learners join a 5-member cluster, the controller's member-API calls
/// go to voters (the leader first), never to a learner, which answers "rpc not supported for
/// learner". Before, such a call was reported as lost quorum with a healthy leader and cost
/// ~10 s per retry; every phase the status goes through is recorded and QuorumLost is a failure.
async fn learners_joining_never_look_like_lost_quorum(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "five";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let api: Api<EtcdCluster> = ctx.api();
    let phases = PhaseWatch::start(api.clone(), NAME);
    let started = Instant::now();
    let created = create_cluster(&ctx, &cluster_yaml(NAME, 5, None)).await?;
    let version = created.spec.version.context("no version")?;
    wait_until(&api, NAME, "5 healthy voters", |c| settled(c, 5, &version)).await?;
    duration("five: 5-member cluster Available", started);
    let phases = phases.stop().await?;
    println!(
        "five: phases {:?}",
        phases.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let lost: Vec<&(ClusterPhase, String)> = phases
        .iter()
        .filter(|(p, _)| *p == ClusterPhase::QuorumLost)
        .collect();
    ensure!(
        lost.is_empty(),
        "quorum reported lost while learners joined: {lost:?}"
    );
    Ok(())
}

/// Issue 14, item 12: in a namespace labelled `pod-security.kubernetes.io/enforce=restricted`
/// the API server's PodSecurity admission accepts the operator's member pods (the defaults
/// are `restricted`), and the cluster comes up; the same pod without the operator's security
/// contexts is refused there, so the admission really judged them.
async fn pods_are_admitted_in_a_namespace_enforcing_pod_security_restricted(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;

    install(&ctx).await?;
    let namespaces: Api<Namespace> = Api::all(ctx.client());
    let labels = serde_json::json!({ "metadata": { "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }}});
    namespaces
        .patch(ctx.ns(), &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .context("labelling the test namespace for Pod Security")?;
    let _controller = Controller::start(&ctx)?;
    // With pull secrets for a private registry (issue 25, item 4): through the CRD's schema
    // and the webhook, onto every member pod.
    let created = create_cluster(
        &ctx,
        &manifest(
            "restricted",
            "size: 3\npod:\n  imagePullSecrets:\n  - name: registry-credentials",
        ),
    )
    .await?;
    let version = created
        .spec
        .version
        .clone()
        .context("version not defaulted")?;
    wait_until(&ctx.api(), "restricted", "3 healthy voters", |c| {
        settled(c, 3, &version)
    })
    .await?;

    let pods: Api<Pod> = ctx.api();
    let members = member_pods(&pods, "restricted").await?;
    ensure!(members.len() == 3, "{:?}", members.keys());
    for (name, pod) in &members {
        let pull: Vec<&str> = pod
            .spec
            .iter()
            .flat_map(|s| s.image_pull_secrets.iter().flatten())
            .map(|s| s.name.as_str())
            .collect();
        ensure!(
            pull == ["registry-credentials"],
            "{name}: imagePullSecrets {pull:?}"
        );
    }
    let (name, pod) = members.into_iter().next().context("no member pod")?;
    let spec = pod.spec.clone().context("pod without spec")?;
    let context = spec.security_context.clone().unwrap_or_default();
    ensure!(
        context.run_as_non_root == Some(true)
            && context.seccomp_profile.as_ref().map(|p| p.type_.as_str()) == Some("RuntimeDefault"),
        "{name}: pod security context {context:?}"
    );

    // The control: the same pod without the operator's security contexts is refused.
    let mut bare = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{name}-bare")),
            labels: Some(BTreeMap::from([("test".to_string(), "bare".to_string())])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    };
    if let Some(spec) = bare.spec.as_mut() {
        spec.security_context = None;
        spec.node_name = None;
        for c in &mut spec.containers {
            c.security_context = None;
        }
    }
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    match pods.create(&dry_run, &bare).await {
        Err(kube::Error::Api(e)) if e.message.contains("violates PodSecurity") => {
            println!("control refused as expected: {}", e.message);
        }
        other => bail!("a pod without security contexts was not refused by PodSecurity: {other:?}"),
    }
    Ok(())
}
