//! The webhook behind a real kube-apiserver: Validating and Mutating WebhookConfigurations
//! with a `url` and `caBundle` pointing at the webhook running in this process, then
//! `kubectl apply` of good and bad EtcdClusters.
//!
//! Run: `cargo test -p etcd-webhook --test on_apiserver` (needs `hack/build-tools.sh` first).

use std::process::Output;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::conditions;
use kube::{Api, CustomResourceExt, ResourceExt};
use tokio::sync::OnceCell;

use etcd_shared::EtcdCluster;
use etcd_tests::suite::{TestContext, run_suite};
use etcd_tests::{CertificateAuthority, await_condition, poll_until};
use etcd_webhook::args::Args;
use etcd_webhook::registration::{
    WebhookTarget, mutating_webhook_configuration, validating_webhook_configuration,
};
use etcd_webhook::shutdown::Shutdown;

const WAIT: Duration = Duration::from_secs(60);

fn main() -> std::process::ExitCode {
    run_suite(etcd_tests::tests![
        the_users_example_applies_and_is_defaulted,
        a_bad_spec_is_refused_with_the_webhooks_message,
        an_update_that_skips_a_minor_line_is_refused,
        a_schema_bound_is_enforced_by_the_api_server_itself,
    ])
}

struct Installed {
    _dir: tempfile::TempDir,
    _server: etcd_webhook::server::RunningServer,
}

static WEBHOOK: OnceCell<Installed> = OnceCell::const_new();

/// Runs kubectl on a blocking thread, so the runtime (which also serves the webhook the
/// API server calls meanwhile) keeps running.
async fn kubectl(ctx: &TestContext, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    let mut cmd = ctx.kubectl();
    cmd.args(args);
    let input = stdin.map(str::to_string);
    tokio::task::spawn_blocking(move || -> anyhow::Result<Output> {
        use std::io::Write as _;
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().context("running kubectl")?;
        let mut pipe = child.stdin.take().context("kubectl stdin")?;
        if let Some(text) = input {
            pipe.write_all(text.as_bytes())?;
        }
        drop(pipe);
        Ok(child.wait_with_output()?)
    })
    .await?
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts the webhook on 127.0.0.1 with a certificate for that IP, installs the CRD and both
/// webhook configurations, and waits until the API server calls the webhook.
async fn install(ctx: &TestContext) -> anyhow::Result<()> {
    WEBHOOK
        .get_or_try_init(|| async {
            let dir = tempfile::tempdir()?;
            let ca = CertificateAuthority::new("etcd-webhook test CA")?;
            let serving = ca.issue_serving_cert(&["127.0.0.1"])?;
            let (cert, key) = serving.write_to(dir.path(), "webhook")?;
            let args = Args::try_parse_from([
                "etcd-webhook".to_string(),
                format!("--tls-cert-file={}", cert.display()),
                format!("--tls-private-key-file={}", key.display()),
                "--bind-address=127.0.0.1:0".into(),
                "--metrics-bind-address=127.0.0.1:0".into(),
                "--health-probe-bind-address=127.0.0.1:0".into(),
            ])?;
            let server = etcd_webhook::server::start(&args, Shutdown::new()).await?;
            let target = WebhookTarget::Url(format!("https://{}", server.tls_addr()));

            let client = ctx.client();
            let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
            let crd = EtcdCluster::crd();
            let params = PatchParams::apply("etcd-tests").force();
            crds.patch(&crd.name_any(), &params, &Patch::Apply(&crd)).await?;
            await_condition(crds, &crd.name_any(), conditions::is_crd_established(), WAIT).await?;

            let ca_pem = ca.cert_pem().as_bytes();
            let vwc: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
            let v = validating_webhook_configuration("etcd-operator-test", &target, ca_pem);
            vwc.patch("etcd-operator-test", &params, &Patch::Apply(&v)).await?;
            let mwc: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
            let m = mutating_webhook_configuration("etcd-operator-test", &target, ca_pem);
            mwc.patch("etcd-operator-test", &params, &Patch::Apply(&m)).await?;

            // The API server picks configurations up a moment later: probe with a known-bad
            // object until the webhook refuses it.
            let probe = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: probe\nspec:\n  version: \"1.0.0\"\n";
            poll_until("webhook to be called", WAIT, || async {
                let out = kubectl(ctx, &["apply", "--dry-run=server", "-f", "-"], Some(probe)).await?;
                anyhow::Ok((!out.status.success() && text(&out).contains("is older than the operator supports")).then_some(()))
            })
            .await?;
            anyhow::Ok(Installed {
                _dir: dir,
                _server: server,
            })
        })
        .await?;
    Ok(())
}

fn example_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/example-etcd-cluster.yaml")
}

async fn the_users_example_applies_and_is_defaulted(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let path = example_path();
    let out = kubectl(&ctx, &["apply", "-f", &path.display().to_string()], None).await?;
    let said = text(&out);
    println!("kubectl apply -f examples/example-etcd-cluster.yaml:\n{said}");
    ensure!(out.status.success(), "apply failed: {said}");
    ensure!(
        said.contains("etcdcluster.etcd.database.coreos.com/example-etcd-cluster created"),
        "{said}"
    );
    ensure!(
        said.contains("Warning: spec.version: etcd 3.2 is end of life"),
        "no EOL warning: {said}"
    );
    let api: Api<EtcdCluster> = ctx.api();
    let stored = api.get("example-etcd-cluster").await?;
    ensure!(stored.spec.size == Some(3) && stored.spec.version.as_deref() == Some("3.2.13"));
    ensure!(
        stored.spec.repository.as_deref() == Some("quay.io/coreos/etcd"),
        "the default repository was not filled in: {:?}",
        stored.spec
    );
    // A spec with nothing gets every default.
    let bare = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: bare\nspec: {}\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(bare)).await?;
    ensure!(out.status.success(), "{}", text(&out));
    let bare = api.get("bare").await?;
    ensure!(bare.spec.size == Some(3), "{:?}", bare.spec);
    ensure!(bare.spec.version.as_deref() == Some(etcd_shared::version::DEFAULT_VERSION));
    Ok(())
}

async fn a_bad_spec_is_refused_with_the_webhooks_message(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let bad = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: bad\nspec:\n  size: 3\n  version: \"3.1.20\"\n  pod:\n    etcdEnv:\n    - name: ETCD_NAME\n      value: x\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(bad)).await?;
    let said = text(&out);
    println!("kubectl apply of a bad spec:\n{said}");
    ensure!(!out.status.success(), "a bad spec was accepted: {said}");
    // kubectl renders the webhook's 422 Invalid status with one line per violation.
    ensure!(
        said.contains("The EtcdCluster \"bad\" is invalid"),
        "{said}"
    );
    ensure!(said.contains("spec.version: 3.1.20 is older than the operator supports; supported versions are 3.2.0 to 3.7.x"), "{said}");
    ensure!(
        said.contains("spec.pod.etcdEnv[0].name: ETCD_NAME is set by the operator"),
        "{said}"
    );
    let api: Api<EtcdCluster> = ctx.api();
    ensure!(
        api.get_opt("bad").await?.is_none(),
        "the refused object was stored"
    );
    Ok(())
}

async fn an_update_that_skips_a_minor_line_is_refused(ctx: TestContext) -> anyhow::Result<()> {
    install(&ctx).await?;
    let at = |v: &str| {
        format!(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: old\nspec:\n  size: 3\n  version: \"{v}\"\n"
        )
    };
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.5.35"))).await?;
    ensure!(out.status.success(), "{}", text(&out));
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.7.3"))).await?;
    let said = text(&out);
    println!("kubectl apply of a skip from 3.5.35 to 3.7.3:\n{said}");
    ensure!(!out.status.success(), "a skip was accepted: {said}");
    ensure!(said.contains("spec.version: cannot move from 3.5.35 to 3.7.3: etcd upgrades one minor line at a time; move to 3.6.x first"), "{said}");
    // The supported next step is accepted.
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(&at("3.6.16"))).await?;
    ensure!(out.status.success(), "{}", text(&out));
    Ok(())
}

async fn a_schema_bound_is_enforced_by_the_api_server_itself(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    let zero = "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: zero\nspec:\n  size: 0\n";
    let out = kubectl(&ctx, &["apply", "-f", "-"], Some(zero)).await?;
    let said = text(&out);
    ensure!(!out.status.success(), "size 0 was accepted: {said}");
    ensure!(
        said.contains("spec.size") && said.contains("greater than or equal to 1"),
        "{said}"
    );
    Ok(())
}
