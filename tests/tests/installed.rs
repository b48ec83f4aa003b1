//! The operator installed by its Helm chart, with its pods running: the process kubelet runs
//! the chart's controller and webhook Deployments from the binaries built in this workspace,
//! the API server calls the webhook through its Service, and the controller, under the
//! chart's ServiceAccount and RBAC, runs a real 3-member etcd cluster.
//!
//! Run: `cargo test -p etcd-tests --test installed` (needs `hack/build-tools.sh` and the
//! operator binaries: `cargo test --workspace` builds them, else
//! `cargo build -p etcd-controller -p etcd-webhook`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};

use etcd_shared::EtcdCluster;
use etcd_shared::version::DEFAULT_VERSION;
use etcd_tests::endpoints::ready_addresses;
use etcd_tests::operator::{
    OperatorBinaries, Release, control_plane_options, is_settled, kubectl_apply,
};
use etcd_tests::suite::{Suite, TestContext};
use etcd_tests::{KubeletOptions, await_condition, poll_until};

const WAIT: Duration = Duration::from_secs(150);
const RELEASE: &str = "op";
const CLUSTER: &str = "example";

fn main() -> ExitCode {
    Suite::new()
        .options(control_plane_options())
        .with_kubelet(KubeletOptions::default())
        .test_timeout(Duration::from_secs(420))
        .run(etcd_tests::tests![the_installed_operator_runs_a_cluster])
}

fn duration(what: &str, since: Instant) {
    println!("duration: {what}: {:.1} s", since.elapsed().as_secs_f64());
}

/// `kubectl apply -f -` of `yaml` in the test's namespace: its stdout, or its stderr as the
/// error.
async fn apply(ctx: &TestContext, yaml: &str) -> anyhow::Result<String> {
    let mut kubectl = ctx.kubectl();
    kubectl.args(["-n", ctx.ns()]);
    let out = kubectl_apply(kubectl, yaml)
        .await
        .context("running kubectl apply")?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        bail!("{}", String::from_utf8_lossy(&out.stderr))
    }
}

fn cluster_yaml(size: i32, version: Option<&str>) -> String {
    let version = version.map_or(String::new(), |v| format!("  version: \"{v}\"\n"));
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {CLUSTER}\nspec:\n  size: {size}\n{version}"
    )
}

/// The text a pod serves on `port` at `/metrics`, fetched through the API server's pod proxy
/// (which dials the pod IP, as a Prometheus scrape does).
async fn scrape(ctx: &TestContext, pod: &str, port: u16) -> anyhow::Result<String> {
    let path = format!(
        "/api/v1/namespaces/{}/pods/{pod}:{port}/proxy/metrics",
        ctx.ns()
    );
    let request = http::Request::get(&path).body(Vec::new())?;
    ctx.client()
        .request_text(request)
        .await
        .with_context(|| format!("scraping {pod}:{port}"))
}

/// The webhook's count of denied CREATE reviews in a scrape.
fn denied_creates(metrics: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with(r#"etcd_webhook_requests_total{endpoint="validate",operation="CREATE",result="denied"}"#)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

/// The pods of one chart component, by name.
async fn component_pods(ctx: &TestContext, component: &str) -> anyhow::Result<Vec<Pod>> {
    let selector = format!("app.kubernetes.io/component={component}");
    Ok(ctx
        .api::<Pod>()
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

async fn tls_secret(ctx: &TestContext) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let name = format!("{RELEASE}-etcd-operator-webhook-tls");
    let secret = ctx.api::<Secret>().get(&name).await?;
    Ok(secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect())
}

/// Issue 7: `helm install` gives running operator pods; `kubectl apply` is validated and
/// defaulted by the installed webhook and reconciled by the installed controller into a real
/// etcd cluster; both services are scrapeable; `helm upgrade` keeps the certificates;
/// `helm uninstall` leaves only the CRD.
async fn the_installed_operator_runs_a_cluster(ctx: TestContext) -> anyhow::Result<()> {
    let binaries = OperatorBinaries::locate()?;
    binaries.register(ctx.kubelet()?);
    let cp = ctx.control_plane();
    let release = Release::new(RELEASE, ctx.ns());

    let started = Instant::now();
    // The README's install for a real cluster: images from a registry of one's own (the
    // kubelet maps any repository ending in /etcd-controller or /etcd-webhook).
    release
        .install(
            cp,
            &[
                "controller.image.repository=registry.example.test/etcd-controller",
                "webhook.image.repository=registry.example.test/etcd-webhook",
            ],
        )
        .await?;
    duration("helm install --wait (3 operator pods Ready)", started);
    let controllers = component_pods(&ctx, "controller").await?;
    let webhooks = component_pods(&ctx, "webhook").await?;
    for pod in controllers.iter().chain(&webhooks) {
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone())
            .unwrap_or_default();
        ensure!(
            image.starts_with("registry.example.test/"),
            "{} runs {image}",
            pod.name_any()
        );
    }
    ensure!(
        controllers.len() == 1 && webhooks.len() == 2,
        "expected 1 controller and 2 webhook pods, found {} and {}",
        controllers.len(),
        webhooks.len()
    );

    // A size out of range is refused by the CRD's schema already; a version the operator
    // cannot run only by the installed webhook, called through its Service.
    let refused = match apply(&ctx, &cluster_yaml(9, None)).await {
        Ok(out) => bail!("size 9 was accepted: {out}"),
        Err(e) => e.to_string(),
    };
    ensure!(
        refused.contains("spec.size") && refused.contains("less than or equal to 7"),
        "unexpected refusal of size 9: {refused}"
    );
    let refused = match apply(&ctx, &cluster_yaml(3, Some("3.1.20"))).await {
        Ok(out) => bail!("version 3.1.20 was accepted: {out}"),
        Err(e) => e.to_string(),
    };
    ensure!(
        refused.contains("spec.version: 3.1.20 is older than the operator supports"),
        "unexpected refusal of 3.1.20: {refused}"
    );
    println!("refused by the webhook: {}", refused.trim());

    // A good one is defaulted by it and run by the installed controller.
    let applied = Instant::now();
    apply(&ctx, &cluster_yaml(3, None)).await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let created = clusters.get(CLUSTER).await?;
    ensure!(
        created.spec.version.as_deref() == Some(DEFAULT_VERSION),
        "version not defaulted: {:?}",
        created.spec.version
    );
    let done = await_condition(
        clusters.clone(),
        CLUSTER,
        |c: Option<&EtcdCluster>| c.is_some_and(is_settled),
        WAIT,
    )
    .await?
    .context("the cluster vanished")?;
    duration("kubectl apply -> 3 members Available and Running", applied);
    println!(
        "cluster: phase {:?}, members {:?}",
        done.status.as_ref().and_then(|s| s.phase),
        done.status.as_ref().and_then(|s| s.members.clone())
    );

    // Both services serve metrics on the pods behind their metrics Services, and the
    // webhook's count the refusal above (proof that it, not the CRD schema, refused).
    let mut webhook_denials = 0;
    for (service, component, family) in [
        (
            format!("{RELEASE}-etcd-operator-controller-metrics"),
            "controller",
            "etcd_controller_reconcile_total",
        ),
        (
            format!("{RELEASE}-etcd-operator-webhook-metrics"),
            "webhook",
            "etcd_webhook_certificate_expiry_timestamp_seconds",
        ),
    ] {
        let expected = component_pods(&ctx, component).await?.len();
        let endpoints = poll_until(
            &format!("{expected} ready endpoints of {service}"),
            WAIT,
            || {
                let (ctx, service) = (&ctx, &service);
                async move {
                    let e = ready_addresses(&ctx.api(), service).await?;
                    anyhow::Ok((e.len() == expected).then_some(e))
                }
            },
        )
        .await?;
        for pod in component_pods(&ctx, component).await? {
            let ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone());
            ensure!(
                ip.as_ref().is_some_and(|ip| endpoints.contains(ip)),
                "{} ({ip:?}) is not behind {service} ({endpoints:?})",
                pod.name_any()
            );
            let text = scrape(&ctx, &pod.name_any(), 8080).await?;
            ensure!(
                text.contains(family),
                "{} does not export {family}",
                pod.name_any()
            );
            webhook_denials += denied_creates(&text);
            println!("metrics: {service} -> {} exports {family}", pod.name_any());
        }
    }
    ensure!(
        webhook_denials >= 1,
        "the webhook pods counted no denied CREATE"
    );

    // helm upgrade keeps the serving certificate and the webhook keeps answering.
    let before = tls_secret(&ctx).await?;
    let upgraded = Instant::now();
    release
        .upgrade(cp, &["controller.logLevel=debug"], false)
        .await?;
    duration("helm upgrade --wait", upgraded);
    ensure!(
        tls_secret(&ctx).await? == before,
        "helm upgrade replaced the webhook certificate"
    );
    let skipped = match apply(&ctx, &cluster_yaml(3, Some("3.2.13"))).await {
        Ok(out) => bail!("a downgrade to 3.2.13 was accepted after the upgrade: {out}"),
        Err(e) => e.to_string(),
    };
    ensure!(
        skipped.contains("spec.version: cannot move from") && skipped.contains("back to 3.2.13"),
        "unexpected refusal after the upgrade: {skipped}"
    );
    println!("refused after the upgrade: {}", skipped.trim());

    // Deleting the cluster, then uninstalling, leaves the CRD alone.
    let deleted = Instant::now();
    clusters
        .delete(CLUSTER, &DeleteParams::foreground())
        .await?;
    await_condition(
        clusters.clone(),
        CLUSTER,
        |c: Option<&EtcdCluster>| c.is_none(),
        WAIT,
    )
    .await?;
    duration("EtcdCluster deleted", deleted);
    release.uninstall(cp).await?;
    let deployments = ctx.api::<Deployment>().list(&ListParams::default()).await?;
    ensure!(
        deployments.items.is_empty(),
        "Deployments left: {:?}",
        deployments.iter().map(|d| d.name_any()).collect::<Vec<_>>()
    );
    let client = ctx.client();
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    ensure!(
        validating
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
            && mutating
                .list(&ListParams::default())
                .await?
                .items
                .is_empty(),
        "webhook configurations left after uninstall"
    );
    poll_until("the operator pods gone", WAIT, || async {
        let left = component_pods(&ctx, "controller").await?.len()
            + component_pods(&ctx, "webhook").await?.len();
        anyhow::Ok((left == 0).then_some(()))
    })
    .await?;
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    crds.get("etcdclusters.etcd.database.coreos.com")
        .await
        .context("the CRD is kept after uninstall")?;
    Ok(())
}
