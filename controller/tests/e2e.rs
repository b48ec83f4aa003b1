//! End to end on real etcd members: the controller (in-process) reconciles an EtcdCluster,
//! the harness's process kubelet runs the member pods as real etcd processes on a private pod
//! network, and the test talks to the members through etcd's client API.
//!
//! Run: `cargo test -p etcd-controller --test e2e` (needs `hack/build-tools.sh` first).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
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
use etcd_tests::suite::TestContext;
use etcd_tests::wait::wait_for_some;
use etcd_tests::{await_condition, run_suite_with_kubelet};

const WAIT: Duration = Duration::from_secs(120);

fn main() -> std::process::ExitCode {
    run_suite_with_kubelet(etcd_tests::tests![
        three_members_become_available_and_share_data
    ])
}

static CRD: OnceCell<()> = OnceCell::const_new();

async fn install_crd(ctx: &TestContext) -> anyhow::Result<()> {
    CRD.get_or_try_init(|| async {
        let api: Api<CustomResourceDefinition> = Api::all(ctx.client());
        let crd = EtcdCluster::crd();
        api.patch(
            &crd.name_any(),
            &PatchParams::apply("etcd-tests").force(),
            &Patch::Apply(&crd),
        )
        .await?;
        await_condition(api, &crd.name_any(), conditions::is_crd_established(), WAIT).await?;
        anyhow::Ok(())
    })
    .await?;
    Ok(())
}

fn start_controller(ctx: &TestContext) -> anyhow::Result<CancellationToken> {
    let context = Arc::new(Context {
        client: ctx.client(),
        metrics: Arc::new(Metrics::new()?),
        reporter: Reporter {
            controller: "etcd-operator".into(),
            instance: Some("e2e".into()),
        },
        config: ControllerConfig {
            wait_requeue: Duration::from_secs(2),
            ..ControllerConfig::default()
        },
    });
    let stop = CancellationToken::new();
    let token = stop.clone();
    tokio::spawn(run_controller(
        context,
        Some(ctx.ns().to_string()),
        2,
        async move { token.cancelled().await },
        Readiness::new(),
    ));
    Ok(stop)
}

/// Polls `check` until it yields a value, for at most [`WAIT`].
async fn wait_for<T, F, Fut>(what: &str, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    Ok(wait_for_some(what, WAIT, check).await?)
}

/// Issue 6, case 1: a 3-member cluster comes up Available; a key written through one member
/// is read from every member.
async fn three_members_become_available_and_share_data(ctx: TestContext) -> anyhow::Result<()> {
    install_crd(&ctx).await?;
    let stop = start_controller(&ctx)?;
    let api: Api<EtcdCluster> = ctx.api();
    let c: EtcdCluster = serde_yaml::from_str(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: demo\nspec:\n  size: 3\n  version: 3.6.16\n",
    )?;
    let started = Instant::now();
    api.create(&PostParams::default(), &c).await?;
    let ready = wait_for("3 ready voting members, Available and Running", || {
        let api = api.clone();
        async move {
            let c = api.get("demo").await.ok()?;
            let s = c.status.as_ref()?;
            let available = s
                .conditions
                .iter()
                .any(|c| c.type_ == "Available" && c.status == "True");
            let learners = s.members.as_ref().map_or(0, |m| m.learners.len());
            let running = s.phase == Some(etcd_shared::types::ClusterPhase::Running);
            (available && running && learners == 0 && s.ready_members == Some(3)).then_some(c)
        }
    })
    .await?;
    println!(
        "3-member cluster Running (all voters healthy) after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let status = ready.status.context("status")?;
    ensure!(
        status.current_version.as_deref() == Some("3.6.16"),
        "{status:?}"
    );

    let pods: Api<Pod> = ctx.api();
    let ips: Vec<String> = pods
        .list(&ListParams::default().labels("app.kubernetes.io/instance=demo"))
        .await?
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    ensure!(ips.len() == 3, "member pod IPs: {ips:?}");
    let mut writer =
        etcd_client::Client::connect([format!("http://{}:2379", ips[0])], None).await?;
    writer.put("greeting", "hello", None).await?;
    for ip in &ips {
        let mut reader = etcd_client::Client::connect([format!("http://{ip}:2379")], None).await?;
        let got = reader.get("greeting", None).await?;
        let value = got
            .kvs()
            .first()
            .map(|kv| kv.value_str().unwrap_or_default().to_string());
        ensure!(
            value.as_deref() == Some("hello"),
            "member {ip} returned {value:?}"
        );
        let members = reader.member_list().await?;
        ensure!(
            members.members().len() == 3,
            "member {ip} sees {} members",
            members.members().len()
        );
    }
    stop.cancel();
    Ok(())
}
