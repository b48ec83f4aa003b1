//! Integration tests of the controller on the local control plane (real kube-apiserver,
//! etcd and kube-controller-manager; no kubelet, so member pods stay Pending: these tests
//! prove the Kubernetes side — objects, owner references, status, events, pause, deletion,
//! restarts. The end-to-end tests with running etcd members live with the process kubelet.)
//!
//! Run: `cargo test -p etcd-controller --test reconcile` (needs `hack/build-tools.sh` first).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::runtime::wait::conditions;
use kube::{Api, CustomResourceExt, ResourceExt};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use etcd_controller::admin::Readiness;
use etcd_controller::context::{Context, ControllerConfig};
use etcd_controller::metrics::Metrics;
use etcd_controller::reconcile::run_controller;
use etcd_shared::EtcdCluster;
use etcd_shared::types::ClusterPhase;
use etcd_tests::await_condition;
use etcd_tests::suite::{TestContext, run_suite};
use etcd_tests::wait::wait_for_some;

const WAIT: Duration = Duration::from_secs(60);

fn main() -> std::process::ExitCode {
    run_suite(etcd_tests::tests![
        creates_owned_objects_and_writes_status,
        unchanged_cluster_writes_nothing,
        hand_edits_of_owned_fields_are_reverted,
        claims_are_created_per_member_and_owned,
        paused_cluster_is_left_alone_until_unpaused,
        invalid_spec_is_reported_not_acted_on,
        deleting_the_cluster_removes_what_it_owns,
        a_background_delete_forgets_the_cluster,
        restarted_controller_converges_without_duplicates,
        an_undecodable_cluster_is_reported_and_skipped,
        each_kind_is_listed_and_watched_once,
        readiness_follows_the_cluster_watch,
        a_repeated_event_becomes_a_series,
        a_selector_with_a_key_added_by_hand_is_reverted,
        a_broken_operator_tls_secret_is_reported_not_frozen,
        nothing_is_decided_before_every_cache_has_synced,
    ])
}

static CRD: OnceCell<()> = OnceCell::const_new();

/// Installs the CRD once per test binary and waits until it is Established.
async fn install_crd(ctx: &TestContext) -> anyhow::Result<()> {
    CRD.get_or_try_init(|| async {
        let api: Api<CustomResourceDefinition> = Api::all(ctx.client());
        let crd = EtcdCluster::crd();
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("etcd-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .context("applying the CRD")?;
        await_condition(api, &name, conditions::is_crd_established(), WAIT).await?;
        anyhow::Ok(())
    })
    .await?;
    Ok(())
}

/// A controller watching the test's namespace, stopped when dropped.
struct RunningController {
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    metrics: Arc<Metrics>,
}

impl RunningController {
    async fn start(ctx: &TestContext) -> anyhow::Result<Self> {
        Self::start_with(ctx, ctx.client(), Readiness::new()).await
    }

    /// A controller that talks to the API server through `client` and reports its readiness
    /// on `readiness`.
    async fn start_with(
        ctx: &TestContext,
        client: kube::Client,
        readiness: Readiness,
    ) -> anyhow::Result<Self> {
        install_crd(ctx).await?;
        let metrics = Arc::new(Metrics::new()?);
        let config = ControllerConfig {
            etcd_timeout: Duration::from_millis(500),
            // Short requeues so "nothing changes over several reconciles" takes seconds.
            wait_requeue: Duration::from_secs(1),
            idle_requeue: Duration::from_secs(2),
            ..ControllerConfig::default()
        };
        let context = Arc::new(Context {
            client,
            metrics: metrics.clone(),
            reporter: Reporter {
                controller: "etcd-operator".into(),
                instance: Some(format!("test-{}", ctx.name())),
            },
            config,
        });
        let stop = CancellationToken::new();
        let token = stop.clone();
        let task = tokio::spawn(run_controller(
            context,
            Some(ctx.ns().to_string()),
            2,
            async move { token.cancelled().await },
            readiness,
        ));
        Ok(RunningController {
            stop,
            task: Some(task),
            metrics,
        })
    }

    /// Stops the controller and waits for it to finish.
    async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            tokio::time::timeout(WAIT, task)
                .await
                .context("controller did not stop")??;
        }
        Ok(())
    }

    /// Server-side applies sent so far.
    fn applies(&self) -> u64 {
        let text = self.metrics.encode();
        text.lines()
            .filter(|l| l.starts_with("etcd_controller_applies_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .map(|v| v as u64)
            .sum()
    }

    /// Successful reconciles so far.
    fn reconciles(&self) -> u64 {
        metric_value(
            &self.metrics.encode(),
            "etcd_controller_reconcile_total{result=\"ok\"}",
        )
    }
}

impl Drop for RunningController {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn metric_value(text: &str, series: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

fn cluster(name: &str, spec: &str) -> anyhow::Result<EtcdCluster> {
    let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    let yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n{indented}"
    );
    Ok(serde_yaml::from_str(&yaml)?)
}

async fn create(ctx: &TestContext, c: &EtcdCluster) -> anyhow::Result<EtcdCluster> {
    let api: Api<EtcdCluster> = ctx.api();
    Ok(api.create(&PostParams::default(), c).await?)
}

/// Waits until the cluster's status satisfies `pred`, returning the cluster.
async fn await_status(
    ctx: &TestContext,
    name: &str,
    what: &str,
    pred: impl Fn(&EtcdCluster) -> bool,
) -> anyhow::Result<EtcdCluster> {
    let api: Api<EtcdCluster> = ctx.api();
    wait_for(what, || {
        let api = api.clone();
        let pred = &pred;
        async move {
            let c = api.get(name).await.ok()?;
            pred(&c).then_some(c)
        }
    })
    .await
}

/// Polls `check` until it yields a value, for at most [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    Ok(wait_for_some(what, WAIT, check).await?)
}

fn condition<'a>(
    c: &'a EtcdCluster,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == type_)
}

fn owned_by(meta: &kube::api::ObjectMeta, owner: &EtcdCluster) -> bool {
    meta.owner_references.as_ref().is_some_and(|refs| {
        refs.iter().any(|r| {
            r.kind == "EtcdCluster"
                && Some(&r.uid) == owner.metadata.uid.as_ref()
                && r.controller == Some(true)
        })
    })
}

/// The users' example, unchanged, gets its Services, budget, seed pod, status and events.
async fn creates_owned_objects_and_writes_status(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    let example: EtcdCluster =
        serde_yaml::from_str(include_str!("../../examples/example-etcd-cluster.yaml"))?;
    let created = create(&ctx, &example).await?;
    let name = "example-etcd-cluster";

    let pods: Api<Pod> = ctx.api();
    let seed = wait_for("seed pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("example-etcd-cluster-0").await.ok().flatten() }
    })
    .await?;
    ensure!(
        owned_by(&seed.metadata, &created),
        "seed pod not owned: {:?}",
        seed.metadata.owner_references
    );
    let spec = seed.spec.context("pod spec")?;
    let c = &spec.containers[0];
    ensure!(
        c.image.as_deref() == Some("quay.io/coreos/etcd:v3.2.13"),
        "image {:?}",
        c.image
    );
    let args = c.args.clone().unwrap_or_default();
    ensure!(
        args.contains(&"--initial-cluster-state=new".to_string()),
        "{args:?}"
    );
    ensure!(
        spec.subdomain.as_deref() == Some(name),
        "subdomain {:?}",
        spec.subdomain
    );

    let services: Api<Service> = ctx.api();
    let peer = services.get(name).await?;
    ensure!(owned_by(&peer.metadata, &created));
    let peer_spec = peer.spec.context("peer spec")?;
    ensure!(peer_spec.cluster_ip.as_deref() == Some("None"));
    ensure!(peer_spec.publish_not_ready_addresses == Some(true));
    let client = services.get(&format!("{name}-client")).await?;
    ensure!(owned_by(&client.metadata, &created));
    ensure!(client.spec.context("client spec")?.ports.context("ports")?[0].port == 2379);
    let pdbs: Api<PodDisruptionBudget> = ctx.api();
    let pdb = pdbs.get(name).await?;
    ensure!(owned_by(&pdb.metadata, &created));

    let c = await_status(&ctx, name, "status with conditions", |c| {
        condition(c, "Available").is_some() && condition(c, "Progressing").is_some()
    })
    .await?;
    let status = c.status.clone().context("status")?;
    ensure!(
        status.phase == Some(ClusterPhase::Creating),
        "phase {:?}",
        status.phase
    );
    ensure!(
        status.observed_generation == c.metadata.generation,
        "observedGeneration"
    );
    // No upgrade while the cluster is created: targetVersion is CoreOS' "upgrading to".
    ensure!(
        status.target_version.is_none(),
        "{:?}",
        status.target_version
    );
    ensure!(status.service_name.as_deref() == Some("example-etcd-cluster-client"));
    ensure!(status.client_port == Some(2379));
    let available = condition(&c, "Available").context("Available")?;
    ensure!(
        available.status == "False" && available.reason == "Bootstrapping",
        "{available:?}"
    );
    let progressing = condition(&c, "Progressing").context("Progressing")?;
    ensure!(progressing.status == "True", "{progressing:?}");
    ensure!(progressing.observed_generation == c.metadata.generation);

    let events: Api<CoreEvent> = ctx.api();
    let bootstrapped = wait_for("ClusterBootstrapped event", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("ClusterBootstrapped"))
        }
    })
    .await?;
    ensure!(bootstrapped.involved_object.name.as_deref() == Some(name));
    ensure!(
        bootstrapped
            .message
            .as_deref()
            .is_some_and(|m| m.contains("example-etcd-cluster-0"))
    );
    controller.stop().await
}

/// Re-reconciling a cluster that has not changed writes nothing: the resourceVersions of
/// the cluster and of every object it owns stay the same.
async fn unchanged_cluster_writes_nothing(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("quiet", "size: 3\nversion: 3.6.16")?).await?;
    await_status(&ctx, "quiet", "first status", |c| {
        c.status.as_ref().is_some_and(|s| s.next_step.is_some())
    })
    .await?;
    // Let a few reconciles settle, then take the versions.
    let settled = controller.reconciles() + 2;
    wait_for("reconciles to settle", || async {
        (controller.reconciles() >= settled).then_some(())
    })
    .await?;
    let versions = |ctx: TestContext| async move {
        let c: Api<EtcdCluster> = ctx.api();
        let s: Api<Service> = ctx.api();
        let p: Api<Pod> = ctx.api();
        let b: Api<PodDisruptionBudget> = ctx.api();
        anyhow::Ok(vec![
            c.get("quiet").await?.resource_version(),
            s.get("quiet").await?.resource_version(),
            s.get("quiet-client").await?.resource_version(),
            p.get("quiet-0").await?.resource_version(),
            b.get("quiet").await?.resource_version(),
        ])
    };
    let before = versions(ctx.clone()).await?;
    let applies = controller.applies();
    let target = controller.reconciles() + 3;
    wait_for("three more reconciles", || async {
        (controller.reconciles() >= target).then_some(())
    })
    .await?;
    let after = versions(ctx.clone()).await?;
    ensure!(
        before == after,
        "objects were written by unchanged reconciles: {before:?} -> {after:?}"
    );
    // Not even sent: an unchanged object is not re-applied (0 applies per reconcile).
    ensure!(
        controller.applies() == applies,
        "unchanged reconciles sent {} applies",
        controller.applies() - applies
    );
    controller.stop().await
}

/// Issue 15, item 1: a hand edit of a field the operator owns (the client Service's selector,
/// the budget's minAvailable) is reverted, without re-applying unchanged objects otherwise.
async fn hand_edits_of_owned_fields_are_reverted(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("drift", "size: 3\nversion: 3.6.16")?).await?;
    let services: Api<Service> = ctx.api();
    let budgets: Api<PodDisruptionBudget> = ctx.api();
    let owned_selector = wait_for("the client Service", || {
        let services = services.clone();
        async move {
            services
                .get_opt("drift-client")
                .await
                .ok()
                .flatten()
                .and_then(|s| s.spec?.selector)
        }
    })
    .await?;
    // The budget counts the member pods that exist: once the seed pod is there (Pending, no
    // kubelet runs here) and the member list cannot be read, every pod, 1.
    let pods: Api<Pod> = ctx.api();
    let owned_min = wait_for("the seed pod and its budget", || {
        let (budgets, pods) = (budgets.clone(), pods.clone());
        async move {
            pods.get_opt("drift-0").await.ok().flatten()?;
            budgets
                .get_opt("drift")
                .await
                .ok()
                .flatten()
                .and_then(|b| b.spec?.min_available)
                .filter(|m| *m == k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
        }
    })
    .await?;
    let editor = PatchParams::default();
    services
        .patch(
            "drift-client",
            &editor,
            &Patch::Merge(serde_json::json!({"spec": {"selector": {"app.kubernetes.io/instance": "someone-else"}}})),
        )
        .await?;
    budgets
        .patch(
            "drift",
            &editor,
            &Patch::Merge(serde_json::json!({"spec": {"minAvailable": 0}})),
        )
        .await?;
    wait_for("the selector and minAvailable restored", || {
        let (services, budgets) = (services.clone(), budgets.clone());
        let (selector, min) = (owned_selector.clone(), owned_min.clone());
        async move {
            let s = services.get("drift-client").await.ok()?.spec?.selector;
            let m = budgets.get("drift").await.ok()?.spec?.min_available;
            (s == Some(selector) && m == Some(min)).then_some(())
        }
    })
    .await?;
    controller.stop().await
}

/// A durable cluster gets one claim per member, owned by the cluster, mounted by the pod.
async fn claims_are_created_per_member_and_owned(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    let created = create(
        &ctx,
        &cluster("durable", "size: 1\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi")?,
    )
    .await?;
    let claims: Api<PersistentVolumeClaim> = ctx.api();
    let claim = wait_for("data claim", || {
        let claims = claims.clone();
        async move { claims.get_opt("durable-0-data").await.ok().flatten() }
    })
    .await?;
    ensure!(owned_by(&claim.metadata, &created));
    // The claim is created first, then the pod, in one step: wait for the pod too.
    let pods: Api<Pod> = ctx.api();
    let pod = wait_for("member pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("durable-0").await.ok().flatten() }
    })
    .await?;
    let vols = pod.spec.context("spec")?.volumes.unwrap_or_default();
    ensure!(
        vols.iter().any(|v| v
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == "durable-0-data")),
        "pod does not mount its claim: {vols:?}"
    );
    controller.stop().await
}

/// `paused: true` makes the controller create no member; the status says so; unpausing resumes.
async fn paused_cluster_is_left_alone_until_unpaused(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("frozen", "size: 3\npaused: true")?).await?;
    let c = await_status(&ctx, "frozen", "Paused phase", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.phase == Some(ClusterPhase::Paused))
    })
    .await?;
    let paused = condition(&c, "Paused").context("Paused condition")?;
    ensure!(
        paused.status == "True" && paused.reason == "PausedBySpec",
        "{paused:?}"
    );
    // Several reconciles later there is still no member pod.
    let target = controller.reconciles() + 2;
    wait_for("reconciles while paused", || async {
        (controller.reconciles() >= target).then_some(())
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    ensure!(
        pods.list(&ListParams::default()).await?.items.is_empty(),
        "a paused cluster got pods"
    );

    let api: Api<EtcdCluster> = ctx.api();
    api.patch(
        "frozen",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"paused": false}})),
    )
    .await?;
    wait_for("seed pod after unpause", || {
        let pods = pods.clone();
        async move { pods.get_opt("frozen-0").await.ok().flatten() }
    })
    .await?;
    await_status(&ctx, "frozen", "Paused condition False", |c| {
        condition(c, "Paused").is_some_and(|p| p.status == "False")
    })
    .await?;
    controller.stop().await
}

/// A spec that slipped past admission (no webhook here) is reported as Degraded/InvalidSpec
/// and nothing is created from it.
async fn invalid_spec_is_reported_not_acted_on(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("bad", "size: 3\nversion: 3.1.0")?).await?;
    let c = await_status(&ctx, "bad", "InvalidSpec", |c| {
        condition(c, "Degraded").is_some_and(|d| d.reason == "InvalidSpec")
    })
    .await?;
    let degraded = condition(&c, "Degraded").context("Degraded")?;
    ensure!(
        degraded
            .message
            .contains("spec.version: 3.1.0 is older than the operator supports"),
        "{degraded:?}"
    );
    let pods: Api<Pod> = ctx.api();
    let services: Api<Service> = ctx.api();
    ensure!(pods.list(&ListParams::default()).await?.items.is_empty());
    ensure!(
        services
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );
    controller.stop().await
}

/// Deleting the EtcdCluster garbage-collects its pods, claims, Services and budget.
async fn deleting_the_cluster_removes_what_it_owns(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(
        &ctx,
        &cluster("doomed", "size: 1\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi")?,
    )
    .await?;
    let pods: Api<Pod> = ctx.api();
    wait_for("seed pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("doomed-0").await.ok().flatten() }
    })
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    api.delete("doomed", &DeleteParams::foreground()).await?;
    let services: Api<Service> = ctx.api();
    let claims: Api<PersistentVolumeClaim> = ctx.api();
    let pdbs: Api<PodDisruptionBudget> = ctx.api();
    wait_for("everything owned to be gone", || {
        let (api, pods, services, claims, pdbs) = (
            api.clone(),
            pods.clone(),
            services.clone(),
            claims.clone(),
            pdbs.clone(),
        );
        async move {
            let lp = ListParams::default();
            // Pods without a kubelet are deleted at once only once their grace period is
            // skipped by the garbage collector's foreground delete; claims carry the
            // pvc-protection finalizer until no pod uses them.
            let left = pods.list(&lp).await.ok()?.items.len()
                + services.list(&lp).await.ok()?.items.len()
                + claims.list(&lp).await.ok()?.items.len()
                + pdbs.list(&lp).await.ok()?.items.len()
                + usize::from(api.get_opt("doomed").await.ok()?.is_some());
            (left == 0).then_some(())
        }
    })
    .await?;
    controller.stop().await
}

/// Issue 15, item 2: a normal (background) delete, which never shows the controller a deletion
/// timestamp without a finalizer, still drops the cluster's per-cluster series.
async fn a_background_delete_forgets_the_cluster(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("fleeting", "size: 1")?).await?;
    let series = format!(
        "etcd_controller_ready_members{{cluster=\"fleeting\",namespace=\"{}\"}}",
        ctx.ns()
    );
    let metrics = controller.metrics.clone();
    wait_for("the cluster's ready_members series", || {
        let metrics = metrics.clone();
        let series = series.clone();
        async move { metrics.encode().contains(&series).then_some(()) }
    })
    .await?;
    let api: Api<EtcdCluster> = ctx.api();
    api.delete("fleeting", &DeleteParams::background()).await?;
    wait_for("the series to be dropped", || {
        let metrics = metrics.clone();
        let series = series.clone();
        async move { (!metrics.encode().contains(&series)).then_some(()) }
    })
    .await?;
    controller.stop().await
}

/// A controller stopped mid-bootstrap and started again carries on from what exists: still
/// one seed pod, no second member created for the same step.
async fn restarted_controller_converges_without_duplicates(ctx: TestContext) -> anyhow::Result<()> {
    let first = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("phoenix", "size: 3")?).await?;
    let pods: Api<Pod> = ctx.api();
    wait_for("seed pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("phoenix-0").await.ok().flatten() }
    })
    .await?;
    first.stop().await?;
    let second = RunningController::start(&ctx).await?;
    let target = second.reconciles() + 3;
    wait_for("reconciles by the new controller", || async {
        (second.reconciles() >= target).then_some(())
    })
    .await?;
    let names: Vec<String> = pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    ensure!(
        names == ["phoenix-0"],
        "expected only the seed pod, got {names:?}"
    );
    second.stop().await
}

/// What the controller logs, at debug and above, for the whole test binary (issue 15, item 3).
#[derive(Clone, Default)]
struct CapturedLog(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for CapturedLog {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl CapturedLog {
    fn text(&self) -> String {
        let bytes = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// Issue 15, item 3: a stored EtcdCluster that the CRD schema admits but this operator's types
/// reject (an affinity weight beyond int32: the schema's `format: int32` is not enforced) sits
/// beside a good cluster. The good one is reconciled; the bad one gets a Warning Event
/// `Undecodable` naming the field, a log line naming it, `undecodable_clusters` counts it
/// until it is deleted, readiness turns true, and no value of the bad object (a marker in its
/// etcdEnv) reaches the log, where kube's client used to log every listed object on each
/// failed decode.
async fn an_undecodable_cluster_is_reported_and_skipped(ctx: TestContext) -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject};
    install_crd(&ctx).await?;
    let log = CapturedLog::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    tracing::subscriber::set_global_default(subscriber)
        .context("the log capture must be the process' first subscriber")?;

    // Objects as a schema-less CRD (CoreOS') let them be stored: written into the API
    // server's etcd, past validation. "bad" holds a size beyond int32 (and a marker in its
    // etcdEnv); "coreos" is a good spec with the status CoreOS' operator wrote.
    let marker = format!("not-for-logs-{}", ctx.ns());
    create(
        &ctx,
        &cluster(
            "bad",
            &format!("size: 1\npod:\n  etcdEnv:\n  - name: ETCD_MARKER\n    value: {marker}"),
        )?,
    )
    .await?;
    create(&ctx, &cluster("coreos", "size: 1")?).await?;
    let mut etcd = etcd_client::Client::connect([ctx.control_plane().etcd_url()], None).await?;
    for (name, edit) in [
        (
            "bad",
            serde_json::json!({"spec": {"size": 3_000_000_000_i64}}),
        ),
        (
            "coreos",
            serde_json::json!({"status": {"phase": "Failed", "reason": "", "size": 0,
                "members": {"ready": null, "unready": null}, "currentVersion": "",
                "targetVersion": "", "controlPaused": false}}),
        ),
    ] {
        let key = format!(
            "/registry/etcd.database.coreos.com/etcdclusters/{}/{name}",
            ctx.ns()
        );
        let got = etcd.get(key.as_str(), None).await?;
        let kv = got.kvs().first().context("the object in etcd")?;
        let mut object: serde_json::Value = serde_json::from_slice(kv.value())?;
        for (part, fields) in edit.as_object().context("edit")? {
            for (k, v) in fields.as_object().context("fields")? {
                object[part][k] = v.clone();
            }
        }
        etcd.put(key.as_str(), serde_json::to_vec(&object)?, None)
            .await?;
    }
    let resource = ApiResource::erase::<EtcdCluster>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(ctx.client(), ctx.ns(), &resource);
    let stored = wait_for("the API server serving the edited object", || {
        let raw = raw.clone();
        async move {
            let o = raw.get("bad").await.ok()?;
            (o.data["spec"]["size"] == 3_000_000_000_i64).then_some(o)
        }
    })
    .await?;
    ensure!(
        serde_json::from_value::<EtcdCluster>(serde_json::to_value(&stored)?).is_err(),
        "the stored object decodes: the test needs one our types reject"
    );
    create(&ctx, &cluster("good", "size: 1")?).await?;

    let readiness = Readiness::new();
    let metrics = Arc::new(Metrics::new()?);
    let context = Arc::new(Context {
        client: ctx.client(),
        metrics: metrics.clone(),
        reporter: Reporter {
            controller: "etcd-operator".into(),
            instance: Some(format!("test-{}", ctx.name())),
        },
        config: ControllerConfig {
            etcd_timeout: Duration::from_millis(500),
            idle_requeue: Duration::from_secs(2),
            wait_requeue: Duration::from_secs(1),
            ..ControllerConfig::default()
        },
    });
    let stop = CancellationToken::new();
    let token = stop.clone();
    let task = tokio::spawn(run_controller(
        context,
        Some(ctx.ns().to_string()),
        2,
        async move { token.cancelled().await },
        readiness.clone(),
    ));
    let _stop_on_drop = stop.clone().drop_guard();

    await_status(&ctx, "good", "the good cluster's status", |c| {
        c.status.as_ref().is_some_and(|s| s.phase.is_some())
    })
    .await?;
    await_status(&ctx, "coreos", "CoreOS' status rewritten", |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.phase.is_some_and(|p| p != ClusterPhase::Failed))
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    wait_for("the good cluster's seed pod", || {
        let pods = pods.clone();
        async move { pods.get_opt("good-0").await.ok().flatten() }
    })
    .await?;
    let events: Api<CoreEvent> = ctx.api();
    let event = wait_for("the Undecodable event", || {
        let events = events.clone();
        async move {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("Undecodable")
                    && e.involved_object.name.as_deref() == Some("bad")
            })
        }
    })
    .await?;
    let note = event.message.unwrap_or_default();
    ensure!(
        event.type_.as_deref() == Some("Warning") && note.contains("spec.size"),
        "{note}"
    );
    let series = format!(
        "etcd_controller_undecodable_clusters{{cluster=\"bad\",namespace=\"{}\"}}",
        ctx.ns()
    );
    ensure!(
        metric_value(&metrics.encode(), &series) == 1,
        "{}",
        metrics.encode()
    );
    wait_for("readiness", || {
        let ready = readiness.get();
        async move { ready.then_some(()) }
    })
    .await
    .with_context(|| {
        let text = log.text();
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("etcd_controller") && !l.contains("DEBUG"))
            .collect();
        lines.join("\n")
    })?;
    let text = log.text();
    ensure!(
        text.lines().any(|l| l.contains("does not decode")
            && l.contains(&format!("{}/bad", ctx.ns()))
            && l.contains("spec.size")),
        "no log line names the undecodable cluster"
    );
    ensure!(
        !text.contains(&marker),
        "a value of the undecodable object reached the log"
    );

    // Deleted (a background delete), it is forgotten.
    raw.delete("bad", &DeleteParams::background()).await?;
    wait_for("the undecodable series gone", || {
        let gone = !metrics.encode().contains(&series);
        async move { gone.then_some(()) }
    })
    .await?;
    ensure!(!log.text().contains(&marker), "a value reached the log");
    stop.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .context("controller did not stop")??;
    Ok(())
}

/// The admin kubeconfig's client configuration, to build clients of its own from.
async fn admin_config(ctx: &TestContext) -> anyhow::Result<kube::Config> {
    Ok(kube::Config::from_custom_kubeconfig(
        ctx.control_plane().kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await?)
}

/// Issue 15, item 5: the watches that fill the caches are the ones that wake the reconciles
/// (the Controller's `.owns()` triggers are the caches' reflector streams), so each kind is
/// listed once and watched once. Before, every derived kind had two list+watch pairs: the
/// cache's and the `.owns()` trigger's.
async fn each_kind_is_listed_and_watched_once(ctx: TestContext) -> anyhow::Result<()> {
    use std::sync::Mutex;
    let requests: Arc<Mutex<Vec<String>>> = Arc::default();
    let seen = requests.clone();
    let layer = tower::ServiceBuilder::new().map_request(
        move |request: http::Request<kube::client::Body>| {
            seen.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(format!("{} {}", request.method(), request.uri()));
            request
        },
    );
    let client = kube::client::ClientBuilder::try_from(admin_config(&ctx).await?)?
        .with_layer(&layer)
        .build();
    let readiness = Readiness::new();
    let controller = RunningController::start_with(&ctx, client, readiness.clone()).await?;
    create(&ctx, &cluster("watched", "size: 3")?).await?;
    let pods: Api<Pod> = ctx.api();
    wait_for(
        "the seed pod and readiness (every watch has listed)",
        || {
            let (pods, ready) = (pods.clone(), readiness.get());
            async move {
                pods.get_opt("watched-0")
                    .await
                    .ok()
                    .flatten()
                    .filter(|_| ready)
            }
        },
    )
    .await?;
    // Each watch request follows its list at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let prefix = format!("/namespaces/{}/", ctx.ns());
    let requests = requests
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for plural in [
        "etcdclusters",
        "pods",
        "services",
        "persistentvolumeclaims",
        "poddisruptionbudgets",
    ] {
        let collection = format!("{prefix}{plural}?");
        let of_kind: Vec<&String> = requests
            .iter()
            .filter(|r| r.starts_with("GET ") && r.contains(&collection))
            .collect();
        let watches = of_kind.iter().filter(|r| r.contains("watch=true")).count();
        let lists = of_kind.len() - watches;
        // Pods twice: this operator's (managed-by), and those CoreOS' operator left running
        // (`app=etcd` without managed-by), which are adopted.
        let want = if plural == "pods" { (2, 2) } else { (1, 1) };
        ensure!(
            (lists, watches) == want,
            "{plural}: {lists} lists and {watches} watches: {of_kind:#?}"
        );
        if plural == "pods" {
            ensure!(
                of_kind
                    .iter()
                    .filter(|r| r
                        .contains("labelSelector=app%3Detcd%2C%21app.kubernetes.io%2Fmanaged-by"))
                    .count()
                    == 2,
                "no watch of CoreOS' pods: {of_kind:#?}"
            );
        }
    }
    controller.stop().await
}

/// Issue 15, item 3: `/readyz` reflects the EtcdCluster watch, not only the caches'. A
/// controller whose user may read pods, claims, Services and budgets but not EtcdClusters is
/// not ready; once it may, it turns ready. (Before, readiness waited for the caches alone.)
async fn readiness_follows_the_cluster_watch(ctx: TestContext) -> anyhow::Result<()> {
    let user = format!("reader-{}", ctx.ns());
    let read = ["get", "list", "watch"];
    grant(
        &ctx,
        &user,
        "derived",
        vec![
            rule("", &["pods", "services", "persistentvolumeclaims"], &read),
            rule("policy", &["poddisruptionbudgets"], &read),
        ],
    )
    .await?;
    let mut config = admin_config(&ctx).await?;
    config.auth_info.impersonate = Some(user.clone());
    let readiness = Readiness::new();
    let controller =
        RunningController::start_with(&ctx, kube::Client::try_from(config)?, readiness.clone())
            .await?;
    // Long enough for the caches to list (a second on this control plane) and a few
    // readiness ticks: the cluster watch is refused, so not ready.
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        ensure!(
            !readiness.get(),
            "ready while the EtcdCluster watch is refused"
        );
    }
    grant(
        &ctx,
        &user,
        "clusters",
        vec![rule("etcd.database.coreos.com", &["etcdclusters"], &read)],
    )
    .await?;
    // The watch retries with backoff and readiness holds off for a while after its last
    // error (WATCH_ERROR_HOLD), so this takes up to about a minute.
    wait_for_some(
        "ready once EtcdClusters may be watched",
        etcd_controller::reconcile::WATCH_ERROR_HOLD + WAIT,
        || {
            let ready = readiness.get();
            async move { ready.then_some(()) }
        },
    )
    .await?;
    controller.stop().await
}

/// An RBAC rule of `verbs` on `resources` of `group`.
fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> k8s_openapi::api::rbac::v1::PolicyRule {
    k8s_openapi::api::rbac::v1::PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

/// Grants `rules` to `user` in the test's namespace (a Role `name` and its binding).
async fn grant(
    ctx: &TestContext,
    user: &str,
    name: &str,
    rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding, RoleRef, Subject};
    let (roles, bindings): (Api<Role>, Api<RoleBinding>) = (ctx.api(), ctx.api());
    let mut role = Role {
        rules: Some(rules),
        ..Role::default()
    };
    role.metadata.name = Some(name.to_string());
    roles.create(&PostParams::default(), &role).await?;
    let mut binding = RoleBinding {
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.to_string(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: user.to_string(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        }]),
        ..RoleBinding::default()
    };
    binding.metadata.name = Some(name.to_string());
    bindings.create(&PostParams::default(), &binding).await?;
    Ok(())
}

/// Writes `status` on a cluster as another writer would (the status subresource).
async fn set_status(
    ctx: &TestContext,
    name: &str,
    status: serde_json::Value,
) -> anyhow::Result<EtcdCluster> {
    let api: Api<EtcdCluster> = ctx.api();
    Ok(api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await?)
}

/// Issue 23, item 10: a Service's and a budget's selectors are atomic for the API server; a
/// key added by hand (the client Service then selects no member) is drift, reverted like any
/// other edit. Before, the live selector "contained" the operator's and was left alone.
async fn a_selector_with_a_key_added_by_hand_is_reverted(ctx: TestContext) -> anyhow::Result<()> {
    let controller = RunningController::start(&ctx).await?;
    create(&ctx, &cluster("atomic", "size: 3\nversion: 3.6.16")?).await?;
    let services: Api<Service> = ctx.api();
    let budgets: Api<PodDisruptionBudget> = ctx.api();
    let service_selector = wait_for("the client Service", || {
        let services = services.clone();
        async move {
            services
                .get_opt("atomic-client")
                .await
                .ok()
                .flatten()
                .and_then(|s| s.spec?.selector)
        }
    })
    .await?;
    let budget_selector = wait_for("the budget", || {
        let budgets = budgets.clone();
        async move {
            budgets
                .get_opt("atomic")
                .await
                .ok()
                .flatten()
                .and_then(|b| b.spec?.selector)
        }
    })
    .await?;
    let editor = PatchParams::default();
    let edited = services
        .patch(
            "atomic-client",
            &editor,
            &Patch::Merge(serde_json::json!({"spec": {"selector": {"hand-edit": "x"}}})),
        )
        .await?;
    budgets
        .patch(
            "atomic",
            &editor,
            &Patch::Merge(
                serde_json::json!({"spec": {"selector": {"matchLabels": {"hand-edit": "x"}}}}),
            ),
        )
        .await?;
    ensure!(
        edited
            .spec
            .and_then(|s| s.selector)
            .is_some_and(|s| s.contains_key("hand-edit")),
        "the hand edit did not land"
    );
    wait_for("both selectors restored whole", || {
        let (services, budgets) = (services.clone(), budgets.clone());
        let (service_want, budget_want) = (service_selector.clone(), budget_selector.clone());
        async move {
            let s = services.get("atomic-client").await.ok()?.spec?.selector;
            let b = budgets.get("atomic").await.ok()?.spec?.selector;
            (s == Some(service_want) && b == Some(budget_want)).then_some(())
        }
    })
    .await?;
    controller.stop().await
}

/// Issue 23, item 9: when the operator cannot observe a cluster (here its client TLS Secret
/// is missing, then incomplete), the status says so (phase Degraded, the reason, Available
/// Unknown) instead of keeping what it said before (`Running`).
async fn a_broken_operator_tls_secret_is_reported_not_frozen(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install_crd(&ctx).await?;
    let spec = "size: 3\nversion: 3.6.16\nTLS:\n  static:\n    member:\n      peerSecret: peer\n      serverSecret: server\n    operatorSecret: operator";
    create(&ctx, &cluster("blind", spec)?).await?;
    // What an earlier, working reconcile had written.
    set_status(
        &ctx,
        "blind",
        serde_json::json!({"phase": "Running", "size": 3, "readyMembers": 3,
            "conditions": [{"type": "Available", "status": "True", "reason": "QuorumHealthy",
                "message": "3 of 3 voting members are healthy", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}),
    )
    .await?;
    let controller = RunningController::start(&ctx).await?;
    let blind = await_status(&ctx, "blind", "Degraded: operator TLS secret", |c| {
        c.status.as_ref().is_some_and(|s| {
            s.phase == Some(ClusterPhase::Degraded)
                && s.reason.as_deref() == Some("OperatorTLSSecretInvalid")
        })
    })
    .await?;
    let degraded = condition(&blind, "Degraded").context("Degraded")?;
    ensure!(
        degraded.status == "True" && degraded.message.contains("operator"),
        "{degraded:?}"
    );
    let available = condition(&blind, "Available").context("Available")?;
    ensure!(available.status == "Unknown", "{available:?}");
    // A Secret without the keys: still reported, now with what is wrong.
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = ctx.api();
    let mut secret = k8s_openapi::api::core::v1::Secret::default();
    secret.metadata.name = Some("operator".into());
    secrets.create(&PostParams::default(), &secret).await?;
    await_status(&ctx, "blind", "the missing key named", |c| {
        condition(c, "Degraded").is_some_and(|d| d.message.contains("has no key etcd-client.crt"))
    })
    .await?;
    controller.stop().await
}

/// Issue 23, item 7: until every cache the planner reads has listed its objects, nothing is
/// decided: a controller that may not list pods (yet) sees no member pod, and before the fix
/// reported a bootstrapped cluster as having lost every member. It now writes nothing until the
/// pod cache syncs, and then acts on what is there.
async fn nothing_is_decided_before_every_cache_has_synced(ctx: TestContext) -> anyhow::Result<()> {
    install_crd(&ctx).await?;
    let user = format!("unsynced-{}", ctx.ns());
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    grant(
        &ctx,
        &user,
        "all-but-pods",
        vec![
            rule(
                "etcd.database.coreos.com",
                &["etcdclusters", "etcdclusters/status"],
                &all,
            ),
            rule(
                "",
                &["services", "persistentvolumeclaims", "secrets", "events"],
                &all,
            ),
            rule("events.k8s.io", &["events"], &all),
            rule("policy", &["poddisruptionbudgets"], &all),
            rule("networking.k8s.io", &["networkpolicies"], &all),
        ],
    )
    .await?;
    create(&ctx, &cluster("unsynced", "size: 3\nversion: 3.6.16")?).await?;
    let running = set_status(
        &ctx,
        "unsynced",
        serde_json::json!({"phase": "Running", "size": 3, "readyMembers": 3}),
    )
    .await?;
    // The three member pods exist (no kubelet runs them here: they stay Pending).
    let pods: Api<Pod> = ctx.api();
    let owner = {
        use kube::Resource as _;
        running.controller_owner_ref(&()).context("owner")?
    };
    for i in 0..3 {
        let name = format!("unsynced-{i}");
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/name": "etcd",
                "app.kubernetes.io/instance": "unsynced",
                "app.kubernetes.io/managed-by": "etcd-operator",
                "app.kubernetes.io/component": "member",
                "etcd.database.coreos.com/member": name,
            }},
            "spec": {"containers": [{"name": "etcd", "image": "quay.io/coreos/etcd:v3.6.16"}]},
        }))?;
        pod.metadata.owner_references = Some(vec![owner.clone()]);
        pods.create(&PostParams::default(), &pod).await?;
    }
    let mut config = admin_config(&ctx).await?;
    config.auth_info.impersonate = Some(user.clone());
    let controller =
        RunningController::start_with(&ctx, kube::Client::try_from(config)?, Readiness::new())
            .await?;
    let api: Api<EtcdCluster> = ctx.api();
    // Several of the controller's requeues (2 s idle, 0.5 s while unsynced): nothing written.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let c = api.get("unsynced").await?;
        let status = c.status.as_ref().context("status")?;
        ensure!(
            status.phase == Some(ClusterPhase::Running) && status.reason.is_none(),
            "a decision before the pod cache synced: {status:?}"
        );
    }
    grant(
        &ctx,
        &user,
        "pods",
        vec![rule("", &["pods"], &["get", "list", "watch"])],
    )
    .await?;
    // The pod watch retries with backoff; once it lists, the pods are seen (Pending: waited
    // for, never "every member lost").
    let seen = await_status(
        &ctx,
        "unsynced",
        "a status written from the synced caches",
        |c| {
            c.status.as_ref().is_some_and(|s| {
                s.next_step
                    .as_deref()
                    .is_some_and(|n| n.contains("Pending"))
                    && s.members.as_ref().is_some_and(|m| m.unready.len() == 3)
            })
        },
    )
    .await;
    let last = api.get("unsynced").await?.status;
    let seen = seen.with_context(|| format!("last status: {last:?}"))?;
    let status = seen.status.context("status")?;
    ensure!(
        status.reason.as_deref() != Some("AllMembersLost"),
        "{status:?}"
    );
    controller.stop().await
}

/// Issue 15, item 5: one event Recorder for the controller, so an event repeated on the same
/// object patches the series of the first instead of creating an Event object each time. An
/// invalid spec is reported on every reconcile; an owned object touched twice wakes two more.
async fn a_repeated_event_becomes_a_series(ctx: TestContext) -> anyhow::Result<()> {
    use k8s_openapi::api::events::v1::Event as SeriesEvent;
    use kube::Resource as _;
    let controller = RunningController::start(&ctx).await?;
    let created = create(&ctx, &cluster("again", "size: 3\nversion: 3.1.0")?).await?;
    await_status(&ctx, "again", "InvalidSpec", |c| {
        condition(c, "Degraded").is_some_and(|d| d.reason == "InvalidSpec")
    })
    .await?;
    // A Service the cluster owns (labelled as the operator's): each change of it is a
    // reconcile of the cluster, which reports the invalid spec again.
    let services: Api<Service> = ctx.api();
    let mut owned: Service = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "again-touch",
            "labels": {"app.kubernetes.io/managed-by": "etcd-operator"},
        },
        "spec": {"ports": [{"port": 1}]},
    }))?;
    owned.metadata.owner_references = Some(vec![
        created
            .controller_owner_ref(&())
            .context("the cluster's owner reference")?,
    ]);
    services.create(&PostParams::default(), &owned).await?;
    let events: Api<SeriesEvent> = ctx.api();
    let mut touches = 0;
    let event = wait_for("an InvalidSpec event with a series", || {
        touches += 1;
        let (events, services) = (events.clone(), services.clone());
        async move {
            let touch =
                serde_json::json!({"metadata": {"annotations": {"touched": touches.to_string()}}});
            services
                .patch(
                    "again-touch",
                    &PatchParams::default(),
                    &Patch::Merge(&touch),
                )
                .await
                .ok()?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find(|e| {
                e.reason.as_deref() == Some("InvalidSpec")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("again")
                    && e.series.as_ref().is_some_and(|s| s.count >= 2)
            })
        }
    })
    .await?;
    let all = events.list(&ListParams::default()).await?.items;
    let separate = all
        .iter()
        .filter(|e| e.reason.as_deref() == Some("InvalidSpec"))
        .count();
    ensure!(
        separate == 1,
        "{separate} InvalidSpec Event objects for one cluster (series {:?})",
        event.series
    );
    controller.stop().await
}
