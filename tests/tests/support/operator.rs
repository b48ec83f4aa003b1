//! The operator under test, in this process: the CRD, the webhook behind both webhook
//! configurations (once per suite, as an installed operator's are cluster-wide), and one
//! controller per test watching only that test's namespace.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use etcd_controller::admin::Readiness;
use etcd_controller::builders::OperatorImage;
use etcd_controller::context::{Context, ControllerConfig};
use etcd_controller::controllers::run_all;
use etcd_controller::metrics::Metrics;
use etcd_shared::EtcdCluster;
use etcd_tests::suite::TestContext;
use etcd_tests::{CertificateAuthority, poll_until};
use etcd_webhook::args::Args;
use etcd_webhook::registration::{
    WebhookTarget, mutating_webhook_configuration, validating_webhook_configuration,
};
use etcd_webhook::shutdown::Shutdown;

use super::WAIT;

/// What stays installed for the whole suite.
struct Installed {
    _dir: tempfile::TempDir,
    _webhook: etcd_webhook::server::RunningServer,
}

static INSTALLED: OnceCell<Installed> = OnceCell::const_new();

/// Installs the CRD and the webhook (once per suite) and waits until the API server both
/// serves EtcdClusters and calls the webhook.
pub async fn install(ctx: &TestContext) -> anyhow::Result<()> {
    INSTALLED.get_or_try_init(|| install_once(ctx)).await?;
    Ok(())
}

async fn install_once(ctx: &TestContext) -> anyhow::Result<Installed> {
    let client = ctx.client();
    let params = PatchParams::apply("etcd-tests").force();
    etcd_tests::crds::install_all(&client, WAIT).await?;

    let dir = tempfile::tempdir()?;
    let ca = CertificateAuthority::new("etcd-webhook lifecycle CA")?;
    let (cert, key) = ca
        .issue_serving_cert(&["127.0.0.1"])?
        .write_to(dir.path(), "webhook")?;
    let args = Args::try_parse_from([
        "etcd-webhook".to_string(),
        format!("--tls-cert-file={}", cert.display()),
        format!("--tls-private-key-file={}", key.display()),
        "--bind-address=127.0.0.1:0".into(),
        "--metrics-bind-address=127.0.0.1:0".into(),
        "--health-probe-bind-address=127.0.0.1:0".into(),
    ])?;
    let webhook = etcd_webhook::server::start(&args, Shutdown::new()).await?;
    let target = WebhookTarget::Url(format!("https://{}", webhook.tls_addr()));
    let ca_pem = ca.cert_pem().as_bytes();
    let name = "etcd-operator-lifecycle";
    let vwc: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwc.patch(
        name,
        &params,
        &Patch::Apply(&validating_webhook_configuration(name, &target, ca_pem)),
    )
    .await?;
    let mwc: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    mwc.patch(
        name,
        &params,
        &Patch::Apply(&mutating_webhook_configuration(name, &target, ca_pem)),
    )
    .await?;

    // The API server picks the configurations up a moment later: a dry-run create of a
    // spec only the webhook refuses tells when.
    let probe: EtcdCluster = serde_yaml::from_str(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: probe\nspec:\n  version: \"1.0.0\"\n",
    )?;
    let api: Api<EtcdCluster> = ctx.api();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    poll_until("the API server to call the webhook", WAIT, || async {
        let refused = match api.create(&dry_run, &probe).await {
            Err(kube::Error::Api(e)) => e.message.contains("older than the operator supports"),
            _ => false,
        };
        anyhow::Ok(refused.then_some(()))
    })
    .await?;
    Ok(Installed {
        _dir: dir,
        _webhook: webhook,
    })
}

/// The image the in-process controller gives a restored member's restore steps.
pub const RESTORE_IMAGE: &str = "etcd-operator/etcd-controller:test";

/// A controller reconciling the EtcdClusters of one namespace; stops when dropped.
pub struct Controller {
    stop: CancellationToken,
    metrics: Arc<Metrics>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Controller {
    /// Starts a controller for the test's namespace, with the production configuration but
    /// a shorter wait between checks of an unhealthy cluster.
    pub fn start(ctx: &TestContext) -> anyhow::Result<Self> {
        Self::start_with(ctx, |_| {})
    }

    /// [`Self::start`] with the configuration changed by `tune` (planner timeouts, say).
    pub fn start_with(
        ctx: &TestContext,
        tune: impl FnOnce(&mut ControllerConfig),
    ) -> anyhow::Result<Self> {
        Self::start_with_token(ctx, CancellationToken::new(), tune)
    }

    fn start_with_token(
        ctx: &TestContext,
        stop: CancellationToken,
        tune: impl FnOnce(&mut ControllerConfig),
    ) -> anyhow::Result<Self> {
        let metrics = Arc::new(Metrics::new()?);
        let mut config = ControllerConfig {
            wait_requeue: Duration::from_secs(2),
            // The chart's controller image; the suites that restore map it to the built
            // binary (`OperatorBinaries::register`).
            restore_image: Some(OperatorImage::new(RESTORE_IMAGE)),
            ..ControllerConfig::default()
        };
        tune(&mut config);
        let context = Arc::new(Context {
            client: ctx.client(),
            metrics: metrics.clone(),
            reporter: Reporter {
                controller: "etcd-operator".into(),
                instance: Some(format!("lifecycle-{}", ctx.name())),
            },
            config,
        });
        let token = stop.clone();
        let namespace = ctx.ns().to_string();
        let task = tokio::spawn(async move {
            run_all(
                context,
                Some(namespace),
                2,
                async move { token.cancelled().await },
                Readiness::new(),
            )
            .await;
        });
        Ok(Self {
            stop,
            metrics,
            task: Some(task),
        })
    }

    /// Stops the controller and waits until it has (no reconcile runs after this returns).
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.await.context("the controller task")?;
        }
        Ok(())
    }

    /// A controller for the test's namespace that is killed (stops at once, as the process
    /// would exit) when it reaches one of the failpoints `list` names (comma-separated, see
    /// `etcd_controller::failpoints`); [`Self::killed`] says whether it was.
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub fn start_killed_at(ctx: &TestContext, list: &str) -> anyhow::Result<Self> {
        let stop = CancellationToken::new();
        let on_hit = stop.clone();
        let failpoints = etcd_controller::failpoints::Failpoints::parse(
            list,
            Arc::new(move |_| on_hit.cancel()),
        )?;
        Self::start_with_token(ctx, stop, |c| c.failpoints = failpoints)
    }

    /// Whether the controller stopped (killed at a failpoint, or dropped).
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub fn killed(&self) -> bool {
        self.stop.is_cancelled()
    }

    /// Reconciles run so far (any result).
    pub fn reconciles(&self) -> u64 {
        self.counter_sum("etcd_controller_reconcile_total")
    }

    /// Membership changes made so far (adds, removals, promotions).
    pub fn member_changes(&self) -> u64 {
        self.counter_sum("etcd_controller_member_changes_total")
    }

    /// The sum of every series of a counter family whose labels include `label` = `value`.
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub fn counter(&self, family: &str, label: &str, value: &str) -> u64 {
        self.metrics
            .registry()
            .gather()
            .iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == label && l.value() == value)
            })
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }

    /// The sum of every series of a gauge family (0 when it has none).
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub fn metric_value(&self, family: &str) -> f64 {
        self.metrics
            .registry()
            .gather()
            .iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric().iter())
            .map(|m| m.get_gauge().get_value())
            .sum()
    }

    pub fn counter_sum(&self, family: &str) -> u64 {
        self.metrics
            .registry()
            .gather()
            .iter()
            .filter(|f| f.name() == family)
            .flat_map(|f| f.get_metric().iter())
            .map(|m| m.get_counter().get_value() as u64)
            .sum()
    }
}

/// Creates an EtcdCluster from YAML (through the webhook, as `kubectl apply` would).
pub async fn create_cluster(ctx: &TestContext, yaml: &str) -> anyhow::Result<EtcdCluster> {
    let cluster: EtcdCluster = serde_yaml::from_str(yaml).context("test cluster YAML")?;
    let api: Api<EtcdCluster> = ctx.api();
    let created = api.create(&PostParams::default(), &cluster).await?;
    ensure!(
        created.spec.size.is_some(),
        "the webhook did not default the size"
    );
    Ok(created)
}
