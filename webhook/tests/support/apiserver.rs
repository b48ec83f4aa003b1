//! The webhook behind a real kube-apiserver, for the test binaries that need one
//! (`on_apiserver`, `coreos_clients`): the webhook runs in the test process, the CRD and both
//! webhook configurations point the API server at it, and kubectl runs off the runtime.
#![allow(dead_code)]

use std::process::Output;
use std::time::Duration;

use anyhow::Context as _;
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
use etcd_tests::suite::TestContext;
use etcd_tests::{CertificateAuthority, await_condition, poll_until};
use etcd_webhook::args::Args;
use etcd_webhook::registration::{
    WebhookTarget, mutating_webhook_configuration, validating_webhook_configuration,
};
use etcd_webhook::shutdown::Shutdown;

/// How long the API server gets to establish the CRD and pick the webhooks up.
pub const WAIT: Duration = Duration::from_secs(60);

struct Installed {
    _dir: tempfile::TempDir,
    _server: etcd_webhook::server::RunningServer,
}

static WEBHOOK: OnceCell<Installed> = OnceCell::const_new();

/// Runs kubectl on a blocking thread, so the runtime (which also serves the webhook the
/// API server calls meanwhile) keeps running.
pub async fn kubectl(
    ctx: &TestContext,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<Output> {
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

/// What a command printed, stdout then stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Starts the webhook on 127.0.0.1 with a certificate for that IP, installs the CRD and both
/// webhook configurations, and waits until the API server calls the webhook. Once per test
/// binary; later calls return at once.
pub async fn install(ctx: &TestContext) -> anyhow::Result<()> {
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
