//! What the chart suites (`chart_render`, `chart_install`, `chart_rbac`) share: the chart's
//! names, `helm template` parsed into [`Manifests`], checks of rendered objects (labels, Pod
//! Security `restricted`, webhook settings, the serving certificate), the CRD and the test
//! namespace's Pod Security labels, and [`per_major`] to run a test with each Helm major.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use anyhow::{Context as _, anyhow, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::core::v1::Namespace as NamespaceObject;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::helm::{Helm, HelmMajor, run_ok};
pub use crate::operator::chart_dir;
use crate::suite::{Test, TestContext};
use crate::tools::Versions;
use etcd_webhook::registration::{
    WebhookTarget, mutating_webhook_configuration, validating_webhook_configuration,
};

/// Deadline of each wait on the control plane.
pub const WAIT: Duration = Duration::from_secs(60);
/// The CRD the chart ships in `crds/`.
pub const CRD_NAME: &str = "etcdclusters.etcd.database.coreos.com";
/// The chart's name (`Chart.yaml`).
pub const CHART_NAME: &str = "etcd-operator";
/// The name of the chart's defaulting webhook.
pub const MUTATING_WEBHOOK: &str = "default.etcdclusters.etcd.database.coreos.com";
/// The name of the chart's validating webhook.
pub const VALIDATING_WEBHOOK: &str = "validate.etcdclusters.etcd.database.coreos.com";

/// The Kubernetes version `helm template` and `helm lint` assume (a helm built from source
/// defaults to v1.20, below the chart's kubeVersion).
pub fn kube_version() -> anyhow::Result<String> {
    Ok(Versions::pinned()?.kubernetes.clone())
}

/// What the chart calls `<release>-etcd-operator` (for a release name without the chart name).
pub fn fullname(release: &str) -> String {
    format!("{release}-{CHART_NAME}")
}

/// The name of the release's cluster-scoped objects.
pub fn cluster_name(release: &str, namespace: &str) -> String {
    format!("{}-{namespace}", fullname(release))
}

/// The documents of a rendered chart.
pub struct Manifests(pub Vec<Value>);

impl Manifests {
    /// Parses multi-document YAML, leaving out empty documents.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut docs = Vec::new();
        for document in serde_yaml::Deserializer::from_str(text) {
            let value = Value::deserialize(document).context("parsing the rendered YAML")?;
            if !value.is_null() {
                docs.push(value);
            }
        }
        Ok(Self(docs))
    }

    /// How many objects of each kind.
    pub fn kinds(&self) -> BTreeMap<String, usize> {
        let mut kinds = BTreeMap::new();
        for doc in &self.0 {
            *kinds.entry(str_at(doc, "/kind").to_owned()).or_default() += 1;
        }
        kinds
    }

    /// The objects of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.0.iter().filter(move |d| d["kind"] == kind)
    }

    /// The object of `kind` named `name`, or an error listing what there is.
    pub fn get<'a>(&'a self, kind: &str, name: &str) -> anyhow::Result<&'a Value> {
        self.0
            .iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .with_context(|| {
                format!(
                    "no {kind} {name} among {:?}",
                    self.0.iter().map(object_id).collect::<Vec<_>>()
                )
            })
    }
}

/// The string at JSON `pointer`, or `""`.
pub fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// `Kind/name` of an object.
pub fn object_id(doc: &Value) -> String {
    format!("{}/{}", str_at(doc, "/kind"), str_at(doc, "/metadata/name"))
}

/// The strings of a JSON array (others left out; `[]` for a non-array).
pub fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// `kubectl --kubeconfig <admin>` as a tokio command.
pub fn kubectl(ctx: &TestContext) -> tokio::process::Command {
    tokio::process::Command::from(ctx.control_plane().kubectl())
}

/// Applies the CRDs as the README says (`kubectl apply --server-side --force-conflicts -f
/// crds-replace/`, idempotent) and waits until they are Established. A `helm install` after it
/// (Helm 4 applies `crds/` server-side too) must not conflict.
pub async fn ensure_crd(ctx: &TestContext) -> anyhow::Result<()> {
    let crds = chart_dir().join("crds-replace");
    let mut apply = kubectl(ctx);
    apply
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&crds);
    run_ok(apply, None).await?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client());
    crate::await_condition(
        api,
        CRD_NAME,
        kube::runtime::wait::conditions::is_crd_established(),
        WAIT,
    )
    .await?;
    Ok(())
}

/// Labels the test namespace so Pod Security admission enforces (and warns about) the
/// `restricted` profile.
pub async fn enforce_restricted(ctx: &TestContext) -> anyhow::Result<()> {
    let api: Api<NamespaceObject> = Api::all(ctx.client());
    let patch = json!({ "metadata": { "labels": {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
    }}});
    api.patch(ctx.ns(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .context("labelling the test namespace for Pod Security")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// checks of rendered objects
// ---------------------------------------------------------------------------------------------

/// Every object carries the chart's labels.
pub fn check_labels(manifests: &Manifests, release: &str) -> anyhow::Result<()> {
    for doc in &manifests.0 {
        let labels = &doc["metadata"]["labels"];
        let id = object_id(doc);
        ensure!(
            labels["helm.sh/chart"] == "etcd-operator-0.1.0",
            "{id}: helm.sh/chart is {}",
            labels["helm.sh/chart"]
        );
        ensure!(labels["app.kubernetes.io/name"] == CHART_NAME, "{id}: name");
        ensure!(
            labels["app.kubernetes.io/instance"] == release,
            "{id}: instance"
        );
        ensure!(labels["app.kubernetes.io/managed-by"] == "Helm", "{id}");
        ensure!(labels["app.kubernetes.io/version"] == "0.1.0", "{id}");
        ensure!(labels["app.kubernetes.io/component"].is_string(), "{id}");
    }
    Ok(())
}

/// The pod template of a Deployment meets Pod Security `restricted` (and a bit more).
pub fn check_restricted(deployment: &Value) -> anyhow::Result<()> {
    let id = object_id(deployment);
    let spec = &deployment["spec"]["template"]["spec"];
    let pod = &spec["securityContext"];
    ensure!(pod["runAsNonRoot"] == true, "{id}: pod runAsNonRoot");
    ensure!(pod["runAsUser"] == 65532, "{id}: pod runAsUser");
    ensure!(
        pod["seccompProfile"]["type"] == "RuntimeDefault",
        "{id}: pod seccompProfile"
    );
    let containers = spec["containers"]
        .as_array()
        .with_context(|| format!("{id}: no containers"))?;
    for c in containers {
        let sc = &c["securityContext"];
        ensure!(sc["allowPrivilegeEscalation"] == false, "{id}: escalation");
        ensure!(sc["readOnlyRootFilesystem"] == true, "{id}: read-only root");
        ensure!(sc["runAsNonRoot"] == true, "{id}: runAsNonRoot");
        ensure!(sc["runAsUser"] == 65532, "{id}: runAsUser");
        ensure!(
            sc["capabilities"]["drop"] == json!(["ALL"]),
            "{id}: capabilities"
        );
        ensure!(
            sc["seccompProfile"]["type"] == "RuntimeDefault",
            "{id}: seccompProfile"
        );
        ensure!(
            c["resources"]["requests"].is_object(),
            "{id}: no resource requests"
        );
    }
    Ok(())
}

/// The container `name` of a Deployment's pod template.
pub fn container<'a>(deployment: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .with_context(|| format!("{}: no container {name}", object_id(deployment)))
}

/// The admission settings shared by both webhooks.
pub fn check_webhook(
    configuration: &Value,
    webhook_name: &str,
    path: &str,
    release: &str,
    namespace: &str,
) -> anyhow::Result<()> {
    let id = object_id(configuration);
    let hooks = configuration["webhooks"]
        .as_array()
        .with_context(|| format!("{id}: no webhooks"))?;
    ensure!(hooks.len() == 1, "{id}: {} webhooks", hooks.len());
    let hook = &hooks[0];
    ensure!(hook["name"] == webhook_name, "{id}: name {}", hook["name"]);
    // The chart's copy of the registration agrees with the one in the webhook crate
    // (`etcd_webhook::registration`, what the test suites register), field by field.
    let target = WebhookTarget::Service {
        namespace: namespace.to_string(),
        name: format!("{}-webhook", fullname(release)),
        port: Some(443),
    };
    let expected = if path == "/validate" {
        serde_json::to_value(validating_webhook_configuration("x", &target, b""))?
    } else {
        serde_json::to_value(mutating_webhook_configuration("x", &target, b""))?
    };
    let mut expected = expected["webhooks"][0].clone();
    let mut got = hook.clone();
    for h in [&mut expected, &mut got] {
        if let Some(client) = h["clientConfig"].as_object_mut() {
            client.remove("caBundle");
        }
    }
    ensure!(
        got == expected,
        "{id}: the chart's webhook differs from etcd_webhook::registration's\n chart: {got}\n crate: {expected}"
    );
    Ok(())
}

/// The DNS names and IP addresses of a PEM certificate, its issuer and subject.
pub struct CertInfo {
    /// The subject, as x509-parser prints it.
    pub subject: String,
    /// The issuer, as x509-parser prints it.
    pub issuer: String,
    /// Whether basic constraints say CA.
    pub is_ca: bool,
    /// The subjectAltName DNS names.
    pub dns_names: BTreeSet<String>,
    /// The subjectAltName IP addresses.
    pub ip_addresses: BTreeSet<String>,
}

/// Parses a PEM certificate.
pub fn cert_info(pem: &[u8]) -> anyhow::Result<CertInfo> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).map_err(|e| anyhow!("PEM: {e}"))?;
    let cert = pem.parse_x509().map_err(|e| anyhow!("X.509: {e}"))?;
    let mut dns_names = BTreeSet::new();
    let mut ip_addresses = BTreeSet::new();
    if let Some(san) = cert
        .subject_alternative_name()
        .map_err(|e| anyhow!("subjectAltName: {e}"))?
    {
        for name in &san.value.general_names {
            match name {
                x509_parser::extensions::GeneralName::DNSName(n) => {
                    dns_names.insert((*n).to_owned());
                }
                x509_parser::extensions::GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes)
                            .map(|b| std::net::IpAddr::from(b).to_string())
                            .ok(),
                        16 => <[u8; 16]>::try_from(*bytes)
                            .map(|b| std::net::IpAddr::from(b).to_string())
                            .ok(),
                        _ => None,
                    };
                    ip_addresses.insert(ip.unwrap_or_else(|| format!("{bytes:?}")));
                }
                _ => {}
            }
        }
    }
    let is_ca = cert
        .basic_constraints()
        .map_err(|e| anyhow!("basicConstraints: {e}"))?
        .is_some_and(|b| b.value.ca);
    Ok(CertInfo {
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        is_ca,
        dns_names,
        ip_addresses,
    })
}

/// The Service DNS names the serving certificate must have.
pub fn service_dns_names(release: &str, namespace: &str) -> BTreeSet<String> {
    let svc = format!("{}-webhook", fullname(release));
    [
        svc.clone(),
        format!("{svc}.{namespace}"),
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
    ]
    .into_iter()
    .collect()
}

/// The serving certificate is issued by the CA for the webhook Service's names.
pub fn check_serving_pair(
    ca_pem: &[u8],
    cert_pem: &[u8],
    expected_dns: &BTreeSet<String>,
) -> anyhow::Result<CertInfo> {
    let ca = cert_info(ca_pem).context("ca.crt")?;
    let cert = cert_info(cert_pem).context("tls.crt")?;
    ensure!(ca.is_ca, "ca.crt is not a CA certificate ({})", ca.subject);
    ensure!(
        cert.issuer == ca.subject,
        "tls.crt is issued by {}, not by the CA {}",
        cert.issuer,
        ca.subject
    );
    ensure!(
        expected_dns.is_subset(&cert.dns_names),
        "tls.crt names {:?}, missing some of {expected_dns:?}",
        cert.dns_names
    );
    Ok(cert)
}

/// Decodes the base64 string `value` (`what` names it in errors).
pub fn b64(value: &Value, what: &str) -> anyhow::Result<Vec<u8>> {
    let text = value
        .as_str()
        .with_context(|| format!("{what} is not a string: {value}"))?;
    STANDARD
        .decode(text)
        .with_context(|| format!("{what} is not base64"))
}

/// `helm template RELEASE CHART --namespace NS --kube-version K EXTRA...`, parsed.
pub async fn template(
    helm: &Helm,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> anyhow::Result<Manifests> {
    let text = template_text(helm, release, namespace, extra).await?;
    Manifests::parse(&text)
}

/// `helm template RELEASE CHART --namespace NS --kube-version K EXTRA...`: the YAML text.
pub async fn template_text(
    helm: &Helm,
    release: &str,
    namespace: &str,
    extra: &[&str],
) -> anyhow::Result<String> {
    let kube_version = kube_version()?;
    let chart = chart_dir();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "template".as_ref(),
        release.as_ref(),
        chart.as_os_str(),
        "--namespace".as_ref(),
        namespace.as_ref(),
        "--kube-version".as_ref(),
        kube_version.as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    Ok(helm.run(args).await?)
}

/// `helm template` that must fail; returns its stderr.
pub async fn template_failing(helm: &Helm, extra: &[&str]) -> anyhow::Result<String> {
    let kube_version = kube_version()?;
    let chart = chart_dir();
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "template".as_ref(),
        "refused".as_ref(),
        chart.as_os_str(),
        "--kube-version".as_ref(),
        kube_version.as_ref(),
    ];
    args.extend(extra.iter().map(std::ffi::OsStr::new));
    Ok(helm.run_failing(args).await?)
}

/// The test `name` once per Helm major (`NAME_with_helm_3`, `NAME_with_helm_4`), each running
/// `f` with its major.
pub fn per_major<F, Fut>(name: &str, f: F) -> Vec<Test>
where
    F: Fn(TestContext, HelmMajor) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    HelmMajor::ALL
        .into_iter()
        .map(|major| {
            let f = f.clone();
            Test::new(format!("{name}_{}", major.test_suffix()), move |ctx| {
                f(ctx, major)
            })
        })
        .collect()
}
