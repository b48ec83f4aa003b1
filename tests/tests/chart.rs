//! The Helm chart (`charts/etcd-operator`) against the pinned helm and the local control plane:
//! lint, rendering in every mode, values.schema.json refusals, server-side dry runs of the
//! rendered manifests, install / upgrade / uninstall, and the controller's RBAC checked by
//! impersonating its ServiceAccount.
//!
//! There is no kubelet, so the chart's pods stay Pending: nothing here waits for them to run.
//!
//! Run: `cargo test -p etcd-tests --test chart` (needs `hack/build-tools.sh` first).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Output, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail, ensure};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::StreamExt as _;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace as NamespaceObject, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::KubeConfigOptions;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Resource, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;

use etcd_shared::EtcdCluster;
use etcd_tests::suite::{TestContext, run_suite};
use etcd_tests::{Namespace, Versions, poll_until};

/// Deadline of each wait on the control plane.
const WAIT: Duration = Duration::from_secs(60);
const CRD_NAME: &str = "etcdclusters.etcd.database.coreos.com";
const CHART_NAME: &str = "etcd-operator";
const MUTATING_WEBHOOK: &str = "default.etcdclusters.etcd.database.coreos.com";
const VALIDATING_WEBHOOK: &str = "validate.etcdclusters.etcd.database.coreos.com";

fn main() -> ExitCode {
    run_suite(etcd_tests::tests![
        chart_lints_strictly,
        chart_renders_with_defaults,
        chart_renders_cert_manager_mode,
        chart_renders_namespace_mode,
        chart_renders_optional_features,
        bad_values_are_refused_by_the_schema,
        rendered_manifests_pass_server_side_dry_run,
        install_upgrade_uninstall,
        controller_rbac_is_least_privilege,
        controller_rbac_in_namespace_mode,
    ])
}

// ---------------------------------------------------------------------------------------------
// helm, kubectl and manifests
// ---------------------------------------------------------------------------------------------

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/etcd-operator")
}

/// The Kubernetes version `helm template` and `helm lint` assume (a helm built from source
/// defaults to v1.20, below the chart's kubeVersion).
fn kube_version() -> anyhow::Result<String> {
    Ok(Versions::pinned()?.kubernetes.clone())
}

/// What the chart calls `<release>-etcd-operator` (for a release name without the chart name).
fn fullname(release: &str) -> String {
    format!("{release}-{CHART_NAME}")
}

/// The name of the release's cluster-scoped objects.
fn cluster_name(release: &str, namespace: &str) -> String {
    format!("{}-{namespace}", fullname(release))
}

fn describe(command: &tokio::process::Command) -> String {
    let std = command.as_std();
    let args: Vec<String> = std
        .get_args()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    format!(
        "{} {}",
        Path::new(std.get_program())
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        args.join(" ")
    )
}

/// Runs `command` (feeding `stdin` if given) and returns its output, whatever the exit status.
async fn output(
    mut command: tokio::process::Command,
    stdin: Option<&[u8]>,
) -> anyhow::Result<Output> {
    let what = describe(&command);
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .with_context(|| format!("starting {what}"))?;
    if let Some(input) = stdin {
        let mut pipe = child
            .stdin
            .take()
            .with_context(|| format!("no stdin pipe for {what}"))?;
        pipe.write_all(input)
            .await
            .with_context(|| format!("writing the input of {what}"))?;
        drop(pipe);
    }
    child
        .wait_with_output()
        .await
        .with_context(|| format!("waiting for {what}"))
}

/// Runs `command` and returns its stdout; fails with its stderr unless it exits 0.
async fn run_ok(command: tokio::process::Command, stdin: Option<&[u8]>) -> anyhow::Result<String> {
    let what = describe(&command);
    let out = output(command, stdin).await?;
    ensure!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `command`, expects it to fail, and returns its stderr.
async fn run_failing(command: tokio::process::Command) -> anyhow::Result<String> {
    let what = describe(&command);
    let out = output(command, None).await?;
    ensure!(
        !out.status.success(),
        "{what} succeeded but should have failed:\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    Ok(String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The pinned helm, with its own config, cache and data directories (nothing in `$HOME`),
/// talking to the control plane.
struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    fn new(ctx: &TestContext) -> anyhow::Result<Self> {
        let bin = ctx.control_plane().tools().helm()?;
        let home = tempfile::Builder::new()
            .prefix("etcd-chart-helm-")
            .tempdir()
            .context("creating helm's home directory")?;
        Ok(Self {
            bin,
            kubeconfig: ctx.control_plane().kubeconfig_path().to_owned(),
            home,
        })
    }

    fn command<I, S>(&self, args: I) -> tokio::process::Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut command = tokio::process::Command::new(&self.bin);
        let home = self.home.path();
        command
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .env_remove("HELM_NAMESPACE")
            .env_remove("HELM_KUBECONTEXT")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args);
        command
    }

    /// Writes `yaml` to a values file in helm's home and returns its path.
    fn values_file(&self, name: &str, yaml: &str) -> anyhow::Result<PathBuf> {
        let path = self.home.path().join(name);
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// `helm template RELEASE CHART --namespace NS --kube-version K EXTRA...`, parsed.
    async fn template(
        &self,
        release: &str,
        namespace: &str,
        extra: &[&str],
    ) -> anyhow::Result<Manifests> {
        let text = self.template_text(release, namespace, extra).await?;
        Manifests::parse(&text)
    }

    async fn template_text(
        &self,
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
        run_ok(self.command(args), None).await
    }

    /// `helm template` that must fail; returns its stderr.
    async fn template_failing(&self, extra: &[&str]) -> anyhow::Result<String> {
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
        run_failing(self.command(args)).await
    }
}

/// The documents of a rendered chart.
struct Manifests(Vec<Value>);

impl Manifests {
    fn parse(text: &str) -> anyhow::Result<Self> {
        let mut docs = Vec::new();
        for document in serde_yaml::Deserializer::from_str(text) {
            let value = Value::deserialize(document).context("parsing the rendered YAML")?;
            if !value.is_null() {
                docs.push(value);
            }
        }
        Ok(Self(docs))
    }

    fn kinds(&self) -> BTreeMap<String, usize> {
        let mut kinds = BTreeMap::new();
        for doc in &self.0 {
            *kinds.entry(str_at(doc, "/kind").to_owned()).or_default() += 1;
        }
        kinds
    }

    fn of_kind<'a>(&'a self, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
        self.0.iter().filter(move |d| d["kind"] == kind)
    }

    fn get<'a>(&'a self, kind: &str, name: &str) -> anyhow::Result<&'a Value> {
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

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn object_id(doc: &Value) -> String {
    format!("{}/{}", str_at(doc, "/kind"), str_at(doc, "/metadata/name"))
}

fn strings(value: &Value) -> Vec<String> {
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
fn kubectl(ctx: &TestContext) -> tokio::process::Command {
    tokio::process::Command::from(ctx.control_plane().kubectl())
}

/// Applies the chart's CRDs (server-side, idempotent) and waits until they are Established.
async fn ensure_crd(ctx: &TestContext) -> anyhow::Result<()> {
    let crds = chart_dir().join("crds");
    let mut apply = kubectl(ctx);
    apply
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(&crds);
    run_ok(apply, None).await?;
    let api: Api<CustomResourceDefinition> = Api::all(ctx.client());
    etcd_tests::await_condition(
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
async fn enforce_restricted(ctx: &TestContext) -> anyhow::Result<()> {
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
fn check_labels(manifests: &Manifests, release: &str) -> anyhow::Result<()> {
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
fn check_restricted(deployment: &Value) -> anyhow::Result<()> {
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

fn container<'a>(deployment: &'a Value, name: &str) -> anyhow::Result<&'a Value> {
    deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == name))
        .with_context(|| format!("{}: no container {name}", object_id(deployment)))
}

/// The admission settings shared by both webhooks.
fn check_webhook(
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
    ensure!(hook["sideEffects"] == "None", "{id}: sideEffects");
    ensure!(hook["failurePolicy"] == "Fail", "{id}: failurePolicy");
    ensure!(hook["timeoutSeconds"] == 5, "{id}: timeoutSeconds");
    ensure!(hook["matchPolicy"] == "Equivalent", "{id}: matchPolicy");
    ensure!(
        hook["admissionReviewVersions"] == json!(["v1"]),
        "{id}: admissionReviewVersions"
    );
    ensure!(
        hook["rules"]
            == json!([{
                "apiGroups": ["etcd.database.coreos.com"],
                "apiVersions": ["v1beta2"],
                "resources": ["etcdclusters"],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }]),
        "{id}: rules {}",
        hook["rules"]
    );
    ensure!(
        hook["clientConfig"]["service"]
            == json!({
                "name": format!("{}-webhook", fullname(release)),
                "namespace": namespace,
                "path": path,
                "port": 443,
            }),
        "{id}: clientConfig {}",
        hook["clientConfig"]
    );
    Ok(())
}

/// The DNS names and IP addresses of a PEM certificate, its issuer and subject.
struct CertInfo {
    subject: String,
    issuer: String,
    is_ca: bool,
    dns_names: BTreeSet<String>,
    ip_addresses: BTreeSet<String>,
}

fn cert_info(pem: &[u8]) -> anyhow::Result<CertInfo> {
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
fn service_dns_names(release: &str, namespace: &str) -> BTreeSet<String> {
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
fn check_serving_pair(
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

fn b64(value: &Value, what: &str) -> anyhow::Result<Vec<u8>> {
    let text = value
        .as_str()
        .with_context(|| format!("{what} is not a string: {value}"))?;
    STANDARD
        .decode(text)
        .with_context(|| format!("{what} is not base64"))
}

// ---------------------------------------------------------------------------------------------
// 1. lint and template
// ---------------------------------------------------------------------------------------------

/// `helm lint` and `helm lint --strict` pass for the default values and the other modes that
/// need nothing from the cluster.
async fn chart_lints_strictly(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let kube_version = kube_version()?;
    let chart = chart_dir();
    let variants: [&[&str]; 3] = [
        &[],
        &["--set", "controller.watchNamespace=apps"],
        &[
            "--set",
            "webhook.clientConfig.url=https://127.0.0.1:9443",
            "--set",
            "webhook.replicas=1",
            "--set",
            "controller.replicas=2",
        ],
    ];
    for strict in [false, true] {
        for extra in variants {
            let mut args: Vec<&std::ffi::OsStr> = vec![
                "lint".as_ref(),
                chart.as_os_str(),
                "--kube-version".as_ref(),
                kube_version.as_ref(),
            ];
            if strict {
                args.push("--strict".as_ref());
            }
            args.extend(extra.iter().map(std::ffi::OsStr::new));
            let out = run_ok(helm.command(args), None).await?;
            ensure!(
                out.contains("1 chart(s) linted, 0 chart(s) failed"),
                "helm lint (strict: {strict}, {extra:?}):\n{out}"
            );
            ensure!(
                !out.contains("[WARNING]") && !out.contains("[ERROR]"),
                "helm lint reported problems (strict: {strict}, {extra:?}):\n{out}"
            );
        }
    }
    Ok(())
}

/// The default rendering: every object, the flags of both binaries, probes, Pod Security
/// `restricted`, the webhook configurations and the self-signed certificate they trust.
async fn chart_renders_with_defaults(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let (release, ns) = ("defaults", "operators");
    let m = helm.template(release, ns, &[]).await?;
    let full = fullname(release);

    let expected: BTreeMap<String, usize> = [
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        ("Deployment", 2),
        ("MutatingWebhookConfiguration", 1),
        ("PodDisruptionBudget", 1),
        ("Role", 1),
        ("RoleBinding", 1),
        ("Secret", 1),
        ("Service", 3),
        ("ServiceAccount", 2),
        ("ValidatingWebhookConfiguration", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_owned(), n))
    .collect();
    ensure!(m.kinds() == expected, "rendered kinds: {:?}", m.kinds());
    check_labels(&m, release)?;
    for doc in &m.0 {
        let cluster_scoped = matches!(
            str_at(doc, "/kind"),
            "ClusterRole"
                | "ClusterRoleBinding"
                | "MutatingWebhookConfiguration"
                | "ValidatingWebhookConfiguration"
        );
        if cluster_scoped {
            ensure!(
                str_at(doc, "/metadata/name") == cluster_name(release, ns),
                "{}: cluster-scoped objects are named per release and namespace",
                object_id(doc)
            );
        } else {
            ensure!(
                str_at(doc, "/metadata/namespace") == ns,
                "{}: namespace {:?}",
                object_id(doc),
                doc["metadata"]["namespace"]
            );
        }
    }

    // The controller.
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    ensure!(controller["spec"]["replicas"] == 1, "controller replicas");
    check_restricted(controller)?;
    let c = container(controller, "controller")?;
    let args = strings(&c["args"]);
    for flag in [
        "--leader-elect=true".to_owned(),
        format!("--leader-election-id={full}-controller"),
        "--metrics-bind-address=:8080".to_owned(),
        "--health-probe-bind-address=:8081".to_owned(),
        "--log-format=json".to_owned(),
        "--log-level=info".to_owned(),
    ] {
        ensure!(args.contains(&flag), "controller args {args:?} lack {flag}");
    }
    ensure!(
        !args.iter().any(|a| a.starts_with("--namespace")),
        "controller watches every namespace by default: {args:?}"
    );
    ensure!(
        c["image"] == "etcd-operator/etcd-controller:0.1.0",
        "controller image {}",
        c["image"]
    );
    for (var, field) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        let env = c["env"]
            .as_array()
            .and_then(|e| e.iter().find(|v| v["name"] == var))
            .with_context(|| format!("controller has no {var}"))?;
        ensure!(
            env["valueFrom"]["fieldRef"]["fieldPath"] == field,
            "{var}: {env}"
        );
    }
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        ensure!(
            c[probe]["httpGet"]["path"] == path && c[probe]["httpGet"]["port"] == "probes",
            "controller {probe}: {}",
            c[probe]
        );
    }
    let ports: Vec<(i64, String)> = c["ports"]
        .as_array()
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    (
                        p["containerPort"].as_i64().unwrap_or(0),
                        str_at(p, "/name").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        ports == [(8080, "metrics".to_owned()), (8081, "probes".to_owned())],
        "controller ports {ports:?}"
    );
    ensure!(
        controller["spec"]["template"]["spec"]["serviceAccountName"]
            == format!("{full}-controller"),
        "controller ServiceAccount"
    );

    // The webhook.
    let webhook = m.get("Deployment", &format!("{full}-webhook"))?;
    ensure!(webhook["spec"]["replicas"] == 2, "webhook replicas");
    check_restricted(webhook)?;
    let pod = &webhook["spec"]["template"]["spec"];
    ensure!(
        pod["automountServiceAccountToken"] == false,
        "the webhook calls no API: no token"
    );
    ensure!(
        pod["topologySpreadConstraints"][0]["topologyKey"] == "kubernetes.io/hostname",
        "webhook spread: {}",
        pod["topologySpreadConstraints"]
    );
    ensure!(
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
            ["topologyKey"]
            == "kubernetes.io/hostname",
        "webhook anti-affinity: {}",
        pod["affinity"]
    );
    let w = container(webhook, "webhook")?;
    let args = strings(&w["args"]);
    for flag in [
        "--tls-cert-file=/tls/tls.crt",
        "--tls-private-key-file=/tls/tls.key",
        "--bind-address=0.0.0.0:9443",
        "--metrics-bind-address=:8080",
        "--health-probe-bind-address=:8081",
    ] {
        ensure!(
            args.iter().any(|a| a == flag),
            "webhook args {args:?} lack {flag}"
        );
    }
    let mount = &w["volumeMounts"][0];
    ensure!(
        mount["mountPath"] == "/tls" && mount.get("subPath").is_none(),
        "the certificate Secret is mounted as a directory: {mount}"
    );
    ensure!(
        pod["volumes"][0]["secret"]["secretName"] == format!("{full}-webhook-tls"),
        "webhook volume {}",
        pod["volumes"]
    );
    let webhook_sa = m.get("ServiceAccount", &format!("{full}-webhook"))?;
    ensure!(webhook_sa["automountServiceAccountToken"] == false);
    let pdb = m.get("PodDisruptionBudget", &format!("{full}-webhook"))?;
    ensure!(pdb["spec"]["minAvailable"] == 1, "webhook PDB {pdb}");

    // Services.
    let svc = m.get("Service", &format!("{full}-webhook"))?;
    ensure!(
        svc["spec"]["ports"]
            == json!([{"name": "https", "port": 443, "targetPort": "webhook", "protocol": "TCP"}]),
        "webhook Service ports {}",
        svc["spec"]["ports"]
    );
    for component in ["controller", "webhook"] {
        let metrics = m.get("Service", &format!("{full}-{component}-metrics"))?;
        ensure!(
            metrics["spec"]["ports"]
                == json!([{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]),
            "{component} metrics Service {}",
            metrics["spec"]["ports"]
        );
        ensure!(
            metrics["spec"]["selector"]["app.kubernetes.io/component"] == component,
            "{component} metrics selector"
        );
    }

    // Webhook configurations and the certificate they trust.
    let secret = m.get("Secret", &format!("{full}-webhook-tls"))?;
    let ca = b64(&secret["data"]["ca.crt"], "ca.crt")?;
    let crt = b64(&secret["data"]["tls.crt"], "tls.crt")?;
    b64(&secret["data"]["tls.key"], "tls.key")?;
    check_serving_pair(&ca, &crt, &service_dns_names(release, ns))?;
    let name = cluster_name(release, ns);
    for (kind, hook, path) in [
        ("MutatingWebhookConfiguration", MUTATING_WEBHOOK, "/mutate"),
        (
            "ValidatingWebhookConfiguration",
            VALIDATING_WEBHOOK,
            "/validate",
        ),
    ] {
        let configuration = m.get(kind, &name)?;
        let mut without_bundle = configuration.clone();
        let bundle = without_bundle["webhooks"][0]["clientConfig"]
            .as_object_mut()
            .and_then(|c| c.remove("caBundle"))
            .with_context(|| format!("{kind} has no caBundle"))?;
        ensure!(
            b64(&bundle, "caBundle")? == ca,
            "{kind}: caBundle is not the Secret's ca.crt"
        );
        check_webhook(&without_bundle, hook, path, release, ns)?;
        ensure!(
            configuration["webhooks"][0]
                .get("namespaceSelector")
                .is_none(),
            "{kind}: all namespaces by default"
        );
    }
    Ok(())
}

/// cert-manager mode: refused without cert-manager's API; with it, an Issuer chain and a
/// Certificate, CA injection annotations and no chart-made Secret; a given issuerRef replaces
/// the chain.
async fn chart_renders_cert_manager_mode(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let (release, ns) = ("certmanager", "operators");
    let full = fullname(release);
    let mode = ["--set", "webhook.certificates.mode=cert-manager"];

    let refused = helm.template_failing(&mode).await?;
    ensure!(
        refused.contains("webhook.certificates.mode=cert-manager needs cert-manager"),
        "unexpected refusal: {refused}"
    );

    let with_api = [mode[0], mode[1], "--api-versions", "cert-manager.io/v1"];
    let m = helm.template(release, ns, &with_api).await?;
    check_labels(&m, release)?;
    ensure!(
        m.of_kind("Secret").next().is_none(),
        "cert-manager makes the Secret, not the chart"
    );
    let issuers: BTreeSet<&str> = m
        .of_kind("Issuer")
        .map(|d| str_at(d, "/metadata/name"))
        .collect();
    ensure!(
        issuers
            == [
                format!("{full}-webhook-ca").as_str(),
                format!("{full}-webhook-selfsigned").as_str()
            ]
            .into_iter()
            .collect::<BTreeSet<_>>(),
        "issuers {issuers:?}"
    );
    let ca_cert = m.get("Certificate", &format!("{full}-webhook-ca"))?;
    ensure!(ca_cert["spec"]["isCA"] == true, "CA Certificate {ca_cert}");
    let serving = m.get("Certificate", &format!("{full}-webhook"))?;
    ensure!(
        serving["spec"]["secretName"] == format!("{full}-webhook-tls"),
        "serving Certificate secretName"
    );
    let dns: BTreeSet<String> = strings(&serving["spec"]["dnsNames"]).into_iter().collect();
    ensure!(
        dns == service_dns_names(release, ns),
        "serving Certificate dnsNames {dns:?}"
    );
    ensure!(
        serving["spec"]["issuerRef"]["name"] == format!("{full}-webhook-ca"),
        "serving Certificate issuerRef {}",
        serving["spec"]["issuerRef"]
    );
    for (kind, hook, path) in [
        ("MutatingWebhookConfiguration", MUTATING_WEBHOOK, "/mutate"),
        (
            "ValidatingWebhookConfiguration",
            VALIDATING_WEBHOOK,
            "/validate",
        ),
    ] {
        let configuration = m.get(kind, &cluster_name(release, ns))?;
        ensure!(
            configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
                == format!("{ns}/{full}-webhook"),
            "{kind}: annotations {}",
            configuration["metadata"]["annotations"]
        );
        ensure!(
            configuration["webhooks"][0]["clientConfig"]
                .get("caBundle")
                .is_none(),
            "{kind}: the cainjector fills the caBundle"
        );
        check_webhook(configuration, hook, path, release, ns)?;
    }

    // A user-given ClusterIssuer: only the serving Certificate.
    let mut args = with_api.to_vec();
    args.extend([
        "--set",
        "webhook.certificates.certManager.issuerRef.name=corp-ca",
        "--set",
        "webhook.certificates.certManager.issuerRef.kind=ClusterIssuer",
    ]);
    let m = helm.template(release, ns, &args).await?;
    ensure!(
        m.of_kind("Issuer").next().is_none(),
        "no Issuer of the chart"
    );
    let certificates: Vec<&Value> = m.of_kind("Certificate").collect();
    ensure!(certificates.len() == 1, "one Certificate");
    ensure!(
        certificates[0]["spec"]["issuerRef"]
            == json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
        "issuerRef {}",
        certificates[0]["spec"]["issuerRef"]
    );
    Ok(())
}

/// Namespace-restricted RBAC: a Role and RoleBinding in the watched namespace, `--namespace`,
/// webhooks limited to that namespace, and no ClusterRole.
async fn chart_renders_namespace_mode(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let (release, ns, watched) = ("scoped", "operators", "apps");
    let full = fullname(release);
    let m = helm
        .template(
            release,
            ns,
            &["--set", &format!("controller.watchNamespace={watched}")],
        )
        .await?;
    check_labels(&m, release)?;
    ensure!(
        m.of_kind("ClusterRole").next().is_none()
            && m.of_kind("ClusterRoleBinding").next().is_none(),
        "no cluster-wide RBAC in namespace mode: {:?}",
        m.kinds()
    );
    let role = m.get("Role", &format!("{full}-controller"))?;
    ensure!(role["metadata"]["namespace"] == watched, "Role namespace");
    let binding = m.get("RoleBinding", &format!("{full}-controller"))?;
    ensure!(
        binding["metadata"]["namespace"] == watched
            && binding["roleRef"]["kind"] == "Role"
            && binding["subjects"][0]["namespace"] == ns,
        "RoleBinding {binding}"
    );
    let lease_role = m.get("Role", &format!("{full}-controller-leader-election"))?;
    ensure!(
        lease_role["metadata"]["namespace"] == ns,
        "lease Role namespace"
    );
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    let args = strings(&container(controller, "controller")?["args"]);
    ensure!(
        args.contains(&format!("--namespace={watched}")),
        "controller args {args:?}"
    );
    for kind in [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ] {
        let configuration = m.get(kind, &cluster_name(release, ns))?;
        ensure!(
            configuration["webhooks"][0]["namespaceSelector"]
                == json!({"matchLabels": {"kubernetes.io/metadata.name": watched}}),
            "{kind}: namespaceSelector {}",
            configuration["webhooks"][0]["namespaceSelector"]
        );
    }
    Ok(())
}

/// `webhook.clientConfig.url`, the ServiceMonitor guard, and values that change the pods.
async fn chart_renders_optional_features(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let (release, ns) = ("options", "operators");
    let full = fullname(release);

    // A URL instead of the Service; its host goes into the certificate.
    let m = helm
        .template(
            release,
            ns,
            &[
                "--set",
                "webhook.clientConfig.url=https://192.0.2.10:9443/",
                "--set",
                "webhook.certificates.extraDNSNames={webhook.example.test}",
            ],
        )
        .await?;
    for (kind, path) in [
        ("MutatingWebhookConfiguration", "/mutate"),
        ("ValidatingWebhookConfiguration", "/validate"),
    ] {
        let client = &m.get(kind, &cluster_name(release, ns))?["webhooks"][0]["clientConfig"];
        ensure!(
            client["url"] == format!("https://192.0.2.10:9443{path}")
                && client.get("service").is_none(),
            "{kind}: clientConfig {client}"
        );
    }
    let secret = m.get("Secret", &format!("{full}-webhook-tls"))?;
    let mut dns = service_dns_names(release, ns);
    dns.insert("webhook.example.test".into());
    let cert = check_serving_pair(
        &b64(&secret["data"]["ca.crt"], "ca.crt")?,
        &b64(&secret["data"]["tls.crt"], "tls.crt")?,
        &dns,
    )?;
    ensure!(
        cert.ip_addresses.contains("192.0.2.10"),
        "the URL's IP is in the certificate: {:?}",
        cert.ip_addresses
    );

    // The ServiceMonitor needs the Prometheus Operator's API.
    let refused = helm
        .template_failing(&["--set", "metrics.serviceMonitor.enabled=true"])
        .await?;
    ensure!(
        refused.contains("metrics.serviceMonitor.enabled=true needs the Prometheus Operator"),
        "unexpected refusal: {refused}"
    );
    let m = helm
        .template(
            release,
            ns,
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.serviceMonitor.labels.release=prometheus",
                "--api-versions",
                "monitoring.coreos.com/v1/ServiceMonitor",
            ],
        )
        .await?;
    for component in ["controller", "webhook"] {
        let sm = m.get("ServiceMonitor", &format!("{full}-{component}"))?;
        ensure!(
            sm["spec"]["endpoints"][0]["port"] == "metrics"
                && sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"]
                    == component
                && sm["metadata"]["labels"]["release"] == "prometheus",
            "ServiceMonitor {sm}"
        );
    }

    // Scheduling and image values reach the pods; a single webhook replica has no PDB.
    let values = helm.values_file(
        "scheduling.yaml",
        r#"
controller:
  replicas: 2
  image: {repository: registry.example/etcd-controller, tag: "1.2.3", pullPolicy: Always}
  logFormat: text
  logLevel: debug
  nodeSelector: {kubernetes.io/os: linux}
  tolerations: [{key: dedicated, operator: Equal, value: operators, effect: NoSchedule}]
  podAnnotations: {example.test/scrape: "yes"}
  priorityClassName: system-cluster-critical
  extraArgs: ["--concurrent-reconciles=8"]
webhook:
  replicas: 1
  priorityClassName: system-cluster-critical
"#,
    )?;
    let values = values.to_string_lossy().into_owned();
    let m = helm.template(release, ns, &["-f", &values]).await?;
    let controller = m.get("Deployment", &format!("{full}-controller"))?;
    let pod = &controller["spec"]["template"];
    ensure!(controller["spec"]["replicas"] == 2, "controller replicas");
    ensure!(
        pod["spec"]["nodeSelector"] == json!({"kubernetes.io/os": "linux"})
            && pod["spec"]["tolerations"][0]["key"] == "dedicated"
            && pod["spec"]["priorityClassName"] == "system-cluster-critical"
            && pod["metadata"]["annotations"]["example.test/scrape"] == "yes",
        "controller pod {pod}"
    );
    let c = container(controller, "controller")?;
    ensure!(
        c["image"] == "registry.example/etcd-controller:1.2.3" && c["imagePullPolicy"] == "Always",
        "controller image {}",
        c["image"]
    );
    let args = strings(&c["args"]);
    for flag in [
        "--log-format=text",
        "--log-level=debug",
        "--concurrent-reconciles=8",
    ] {
        ensure!(args.iter().any(|a| a == flag), "controller args {args:?}");
    }
    ensure!(
        m.of_kind("PodDisruptionBudget").next().is_none(),
        "no PDB for a single webhook replica"
    );

    // bindPodIP: every server binds the pod IP from the downward API (off by default).
    let m = helm
        .template(release, ns, &["--set", "bindPodIP=true"])
        .await?;
    for (component, binds) in [
        (
            "controller",
            &[
                "--metrics-bind-address=$(POD_IP):8080",
                "--health-probe-bind-address=$(POD_IP):8081",
            ][..],
        ),
        (
            "webhook",
            &[
                "--bind-address=$(POD_IP):9443",
                "--metrics-bind-address=$(POD_IP):8080",
                "--health-probe-bind-address=$(POD_IP):8081",
            ][..],
        ),
    ] {
        let c = container(
            m.get("Deployment", &format!("{full}-{component}"))?,
            component,
        )?;
        let args = strings(&c["args"]);
        for flag in binds {
            ensure!(args.iter().any(|a| a == flag), "{component} args {args:?}");
        }
        let env = c["env"].as_array().cloned().unwrap_or_default();
        ensure!(
            env.iter().any(|e| e["name"] == "POD_IP"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"),
            "{component} env {env:?}"
        );
    }
    Ok(())
}

/// values.schema.json refuses wrong types, unknown enum values, out-of-range numbers and
/// unknown keys, naming the value.
async fn bad_values_are_refused_by_the_schema(ctx: TestContext) -> anyhow::Result<()> {
    let helm = Helm::new(&ctx)?;
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "replicas-string.yaml",
            "webhook:\n  replicas: \"two\"\n",
            &["/webhook/replicas", "got string, want integer"],
        ),
        (
            "mode-bogus.yaml",
            "webhook:\n  certificates:\n    mode: bogus\n",
            &[
                "/webhook/certificates/mode",
                "'self-signed', 'cert-manager'",
            ],
        ),
        (
            "replicas-zero.yaml",
            "controller:\n  replicas: 0\n",
            &["/controller/replicas", "minimum"],
        ),
        (
            "log-format.yaml",
            "controller:\n  logFormat: xml\n",
            &["/controller/logFormat", "'text', 'json'"],
        ),
        (
            "typo.yaml",
            "webhook:\n  replica: 3\n",
            &["/webhook", "additional properties 'replica' not allowed"],
        ),
        (
            "url-http.yaml",
            "webhook:\n  clientConfig:\n    url: http://127.0.0.1:9443\n",
            &["/webhook/clientConfig/url", "does not match pattern"],
        ),
        (
            "timeout.yaml",
            "webhook:\n  timeoutSeconds: 60\n",
            &["/webhook/timeoutSeconds", "maximum"],
        ),
        (
            "watch-namespace.yaml",
            "controller:\n  watchNamespace: Not_A_Namespace\n",
            &["/controller/watchNamespace", "does not match pattern"],
        ),
    ];
    for (file, yaml, wanted) in cases {
        let path = helm.values_file(file, yaml)?;
        let path = path.to_string_lossy().into_owned();
        let stderr = helm.template_failing(&["-f", &path]).await?;
        ensure!(
            stderr.contains("values don't meet the specifications of the schema"),
            "{file}: not a schema refusal:\n{stderr}"
        );
        for w in *wanted {
            ensure!(stderr.contains(w), "{file}: {w:?} not in:\n{stderr}");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 2. server-side dry run
// ---------------------------------------------------------------------------------------------

/// The rendered manifests (defaults, and namespace mode) are accepted by the API server's
/// validation and admission (`kubectl apply --dry-run=server`), Pod Security `restricted`
/// included (it warns on workloads whose pods it would refuse).
async fn rendered_manifests_pass_server_side_dry_run(ctx: TestContext) -> anyhow::Result<()> {
    ensure_crd(&ctx).await?;
    enforce_restricted(&ctx).await?;
    let helm = Helm::new(&ctx)?;
    let watch = format!("controller.watchNamespace={}", ctx.ns());
    let variants: [(&str, Vec<&str>); 3] = [
        ("dry-defaults", vec![]),
        ("dry-scoped", vec!["--set", &watch]),
        (
            "dry-url",
            vec![
                "--set",
                "webhook.clientConfig.url=https://127.0.0.1:9443",
                "--set",
                "controller.replicas=2",
            ],
        ),
    ];
    for (release, extra) in variants {
        let text = helm.template_text(release, ctx.ns(), &extra).await?;
        let mut apply = kubectl(&ctx);
        apply.args(["apply", "--dry-run=server", "-f", "-"]);
        let out = output(apply, Some(text.as_bytes())).await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            out.status.success(),
            "{release}: kubectl apply --dry-run=server failed:\n{stderr}\n{stdout}"
        );
        ensure!(
            !stderr.contains("PodSecurity") && !stderr.to_lowercase().contains("warning"),
            "{release}: warnings from the API server:\n{stderr}"
        );
        let applied = stdout
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        let documents = Manifests::parse(&text)?.0.len();
        ensure!(
            applied == documents,
            "{release}: {applied} of {documents} objects dry-run applied:\n{stdout}"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 3. install, upgrade, uninstall
// ---------------------------------------------------------------------------------------------

async fn tls_secret(ctx: &TestContext, name: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let secrets: Api<Secret> = ctx.api();
    let secret = secrets
        .get(name)
        .await
        .with_context(|| format!("get Secret {name}"))?;
    ensure!(
        secret.type_.as_deref() == Some("kubernetes.io/tls"),
        "Secret {name} type {:?}",
        secret.type_
    );
    let data: BTreeMap<String, Vec<u8>> = secret
        .data
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k, v.0))
        .collect();
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        ensure!(
            data.get(key).is_some_and(|v| !v.is_empty()),
            "Secret {name} has no {key}"
        );
    }
    Ok(data)
}

/// The caBundle of both webhook configurations of `name`.
async fn ca_bundles(client: &kube::Client, name: &str) -> anyhow::Result<[Vec<u8>; 2]> {
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let m = mutating
        .get(name)
        .await
        .with_context(|| format!("get MutatingWebhookConfiguration {name}"))?;
    let v = validating
        .get(name)
        .await
        .with_context(|| format!("get ValidatingWebhookConfiguration {name}"))?;
    let m = m
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|w| w.client_config.ca_bundle)
        .context("mutating webhook without caBundle")?;
    let v = v
        .webhooks
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|w| w.client_config.ca_bundle)
        .context("validating webhook without caBundle")?;
    Ok([m.0, v.0])
}

/// Waits until the Deployments' ReplicaSets created their pods: proof that Pod Security
/// `restricted` admits them. On timeout the ReplicaSets' failure conditions are shown.
async fn wait_for_pods(
    ctx: &TestContext,
    release: &str,
    counts: &[(&str, usize)],
) -> anyhow::Result<()> {
    let pods: Api<Pod> = ctx.api();
    let replica_sets: Api<ReplicaSet> = ctx.api();
    for (component, count) in counts {
        let selector =
            format!("app.kubernetes.io/instance={release},app.kubernetes.io/component={component}");
        poll_until(
            &format!("{count} {component} pod(s) of release {release}"),
            WAIT,
            || async {
                let found = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .count();
                if found >= *count {
                    return Ok(Some(()));
                }
                let failures: Vec<String> = replica_sets
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| e.to_string())?
                    .items
                    .into_iter()
                    .flat_map(|rs| rs.status.and_then(|s| s.conditions).unwrap_or_default())
                    .filter(|c| c.type_ == "ReplicaFailure")
                    .map(|c| c.message.unwrap_or_default())
                    .collect();
                if failures.is_empty() {
                    Ok(None)
                } else {
                    Err(format!("{found} pods; ReplicaSet failures: {failures:?}"))
                }
            },
        )
        .await?;
    }
    Ok(())
}

/// Kubectl resource names (`kind.group`) and object names of a release's manifest.
fn manifest_objects(manifest: &Manifests) -> Vec<(String, String, Option<String>)> {
    manifest
        .0
        .iter()
        .map(|doc| {
            let api_version = str_at(doc, "/apiVersion");
            let kind = str_at(doc, "/kind").to_lowercase();
            let resource = match api_version.split_once('/') {
                Some((group, _)) => format!("{kind}.{group}"),
                None => kind,
            };
            let namespace = doc["metadata"]["namespace"].as_str().map(str::to_owned);
            (
                resource,
                str_at(doc, "/metadata/name").to_owned(),
                namespace,
            )
        })
        .collect()
}

/// Which of `objects` (kubectl resource, name, namespace) exist, as `kind/name`. All are in
/// the release namespace or cluster-scoped.
async fn named_objects(
    ctx: &TestContext,
    ns: &str,
    objects: &[(String, String, Option<String>)],
) -> anyhow::Result<Vec<String>> {
    ensure!(
        objects
            .iter()
            .all(|(_, _, namespace)| namespace.as_deref().is_none_or(|n| n == ns)),
        "objects outside the release namespace: {objects:?}"
    );
    let mut get = kubectl(ctx);
    get.args(["get", "--namespace", ns, "--ignore-not-found", "-o", "name"]);
    get.args(
        objects
            .iter()
            .map(|(resource, name, _)| format!("{resource}/{name}")),
    );
    Ok(run_ok(get, None)
        .await?
        .lines()
        .map(str::to_owned)
        .collect())
}

/// `helm install` (no `--wait`: there is no kubelet), then: the self-signed Secret and the
/// caBundles agree, pods pass Pod Security, `helm upgrade` keeps the certificate (and a change
/// of its names replaces it), `helm uninstall` removes every object of the release but the CRD.
async fn install_upgrade_uninstall(ctx: TestContext) -> anyhow::Result<()> {
    enforce_restricted(&ctx).await?;
    let helm = Helm::new(&ctx)?;
    let release = "lifecycle";
    let ns = ctx.ns().to_owned();
    let full = fullname(release);
    let chart = chart_dir();
    let chart = chart.to_string_lossy().into_owned();
    let secret_name = format!("{full}-webhook-tls");
    let configurations = cluster_name(release, &ns);

    let notes = run_ok(
        helm.command(["install", release, &chart, "--namespace", &ns]),
        None,
    )
    .await?;
    for hint in [
        "kubectl get etcdclusters",
        "example-etcd-cluster-client",
        "etcdctl",
    ] {
        ensure!(notes.contains(hint), "NOTES lack {hint:?}:\n{notes}");
    }
    // Helm installed the CRD from crds/ (or found it installed by another test).
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client());
    ensure!(
        crds.get_opt(CRD_NAME).await?.is_some(),
        "no CRD after install"
    );

    let first = tls_secret(&ctx, &secret_name).await?;
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(
            bundle == first["ca.crt"],
            "caBundle is not the Secret's ca.crt"
        );
    }
    check_serving_pair(
        &first["ca.crt"],
        &first["tls.crt"],
        &service_dns_names(release, &ns),
    )?;
    wait_for_pods(&ctx, release, &[("controller", 1), ("webhook", 2)]).await?;

    // An upgrade that changes the pods keeps the certificate bytes.
    run_ok(
        helm.command([
            "upgrade",
            release,
            &chart,
            "--namespace",
            &ns,
            "--set",
            "controller.logLevel=debug",
            "--set",
            "webhook.replicas=3",
        ]),
        None,
    )
    .await?;
    let deployments: Api<Deployment> = ctx.api();
    let controller = deployments.get(&format!("{full}-controller")).await?;
    let args = controller
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.containers.into_iter().next())
        .and_then(|c| c.args)
        .unwrap_or_default();
    ensure!(
        args.iter().any(|a| a == "--log-level=debug"),
        "the upgrade did not reach the controller: {args:?}"
    );
    let second = tls_secret(&ctx, &secret_name).await?;
    ensure!(
        second == first,
        "helm upgrade changed the webhook certificate"
    );
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(
            bundle == first["ca.crt"],
            "helm upgrade changed the caBundle"
        );
    }
    wait_for_pods(&ctx, release, &[("webhook", 3)]).await?;

    // New certificate names: a new pair, trusted by the caBundles.
    run_ok(
        helm.command([
            "upgrade",
            release,
            &chart,
            "--namespace",
            &ns,
            "--reuse-values",
            "--set",
            "webhook.certificates.extraDNSNames={webhook.example.test}",
        ]),
        None,
    )
    .await?;
    let third = tls_secret(&ctx, &secret_name).await?;
    ensure!(
        third["tls.crt"] != first["tls.crt"],
        "new names, same certificate"
    );
    let mut dns = service_dns_names(release, &ns);
    dns.insert("webhook.example.test".into());
    check_serving_pair(&third["ca.crt"], &third["tls.crt"], &dns)?;
    for bundle in ca_bundles(&ctx.client(), &configurations).await? {
        ensure!(bundle == third["ca.crt"], "caBundle is not the new ca.crt");
    }

    // What the release made, before it goes.
    let manifest = Manifests::parse(
        &run_ok(
            helm.command(["get", "manifest", release, "--namespace", &ns]),
            None,
        )
        .await?,
    )?;
    let objects = manifest_objects(&manifest);
    ensure!(objects.len() >= 15, "release manifest: {objects:?}");
    ensure!(
        objects.iter().any(|(r, ..)| r.starts_with("clusterrole."))
            && objects
                .iter()
                .any(|(r, ..)| r.starts_with("mutatingwebhookconfiguration.")),
        "cluster-scoped objects missing from {objects:?}"
    );

    let present = named_objects(&ctx, &ns, &objects).await?;
    ensure!(
        present.len() == objects.len(),
        "before uninstall, found {present:?} of {objects:?}"
    );

    run_ok(
        helm.command(["uninstall", release, "--namespace", &ns]),
        None,
    )
    .await?;

    // Nothing of the release remains: each object it listed, anything with its instance
    // label (ReplicaSets and pods too, once garbage-collected), and Helm's release Secrets.
    let mut types: BTreeSet<String> = objects.iter().map(|(r, ..)| r.clone()).collect();
    types.extend(["replicaset.apps".to_owned(), "pod".to_owned()]);
    let types = types.into_iter().collect::<Vec<_>>().join(",");
    let selector = format!("app.kubernetes.io/instance={release}");
    poll_until("the release's objects to be deleted", WAIT, || async {
        let mut list = kubectl(&ctx);
        list.args([
            "get",
            &types,
            "--all-namespaces",
            "-l",
            &selector,
            "-o",
            "name",
        ]);
        let left = run_ok(list, None).await.map_err(|e| format!("{e:#}"))?;
        let mut left: Vec<String> = left.lines().map(str::to_owned).collect();
        let mut release_secrets = kubectl(&ctx);
        release_secrets.args([
            "get",
            "secrets",
            "--namespace",
            &ns,
            "-l",
            &format!("owner=helm,name={release}"),
            "-o",
            "name",
        ]);
        let found = run_ok(release_secrets, None)
            .await
            .map_err(|e| format!("{e:#}"))?;
        left.extend(found.lines().map(str::to_owned));
        left.sort();
        left.dedup();
        if left.is_empty() {
            Ok(Some(()))
        } else {
            Err(format!("still there: {left:?}"))
        }
    })
    .await?;
    // And each object of the manifest by name, labelled or not.
    let left = named_objects(&ctx, &ns, &objects).await?;
    ensure!(
        left.is_empty(),
        "objects of the release left after uninstall: {left:?}"
    );
    ensure!(
        crds.get_opt(CRD_NAME).await?.is_some(),
        "helm uninstall must keep the CRD (crds/ semantics)"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// 4. RBAC
// ---------------------------------------------------------------------------------------------

/// Where a `kubectl auth can-i` question is asked.
#[derive(Clone, Debug)]
enum Scope {
    /// `--all-namespaces`.
    Cluster,
    /// `--namespace NS`.
    In(String),
}

#[derive(Clone, Debug)]
struct Question {
    verb: &'static str,
    resource: String,
    subresource: Option<&'static str>,
    scope: Scope,
    allowed: bool,
}

fn ask(verb: &'static str, resource: impl Into<String>, scope: &Scope, allowed: bool) -> Question {
    Question {
        verb,
        resource: resource.into(),
        subresource: None,
        scope: scope.clone(),
        allowed,
    }
}

/// Asks every question as `user` (`kubectl auth can-i --as`), a few at a time, and fails with
/// every wrong answer.
async fn check_can_i(
    ctx: &TestContext,
    user: &str,
    questions: Vec<Question>,
) -> anyhow::Result<()> {
    let answers: Vec<anyhow::Result<(Question, bool)>> = futures::stream::iter(questions)
        .map(|q| async move {
            let mut command = kubectl(ctx);
            command.args(["auth", "can-i", q.verb, &q.resource, "--as", user]);
            if let Some(sub) = q.subresource {
                command.args(["--subresource", sub]);
            }
            match &q.scope {
                Scope::Cluster => command.arg("--all-namespaces"),
                Scope::In(ns) => command.args(["--namespace", ns]),
            };
            let out = output(command, None).await?;
            let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
            let stderr = String::from_utf8_lossy(&out.stderr);
            ensure!(
                !stderr.contains("doesn't have a resource type"),
                "{q:?}: unknown resource: {stderr}"
            );
            let answer = match stdout.as_str() {
                "yes" => true,
                "no" => false,
                other => bail!("{q:?}: kubectl auth can-i answered {other:?} ({stderr})"),
            };
            Ok((q, answer))
        })
        .buffer_unordered(6)
        .collect()
        .await;
    let mut wrong = Vec::new();
    for answer in answers {
        let (q, answer) = answer?;
        if answer != q.allowed {
            wrong.push(format!(
                "{} {}{} ({:?}): {} but expected {}",
                q.verb,
                q.resource,
                q.subresource.map(|s| format!("/{s}")).unwrap_or_default(),
                q.scope,
                if answer { "allowed" } else { "denied" },
                if q.allowed { "allowed" } else { "denied" },
            ));
        }
    }
    ensure!(
        wrong.is_empty(),
        "wrong RBAC answers for {user}:\n{}",
        wrong.join("\n")
    );
    Ok(())
}

/// What the controller needs, asked in `scope` (everything but the Lease).
fn needed(scope: &Scope) -> Vec<Question> {
    let mut q = Vec::new();
    for verb in ["get", "list", "watch"] {
        q.push(ask(
            verb,
            "etcdclusters.etcd.database.coreos.com",
            scope,
            true,
        ));
    }
    q.push(Question {
        subresource: Some("status"),
        ..ask(
            "patch",
            "etcdclusters.etcd.database.coreos.com",
            scope,
            true,
        )
    });
    q.push(Question {
        subresource: Some("finalizers"),
        ..ask(
            "update",
            "etcdclusters.etcd.database.coreos.com",
            scope,
            true,
        )
    });
    for verb in ["get", "list", "watch", "create", "delete", "patch"] {
        q.push(ask(verb, "pods", scope, true));
    }
    for verb in ["get", "list", "watch", "create", "patch"] {
        q.push(ask(verb, "services", scope, true));
        q.push(ask(verb, "poddisruptionbudgets.policy", scope, true));
    }
    for verb in ["get", "list", "watch", "create", "delete"] {
        q.push(ask(verb, "persistentvolumeclaims", scope, true));
    }
    q.push(ask("get", "secrets", scope, true));
    for verb in ["create", "patch"] {
        q.push(ask(verb, "events.events.k8s.io", scope, true));
    }
    q
}

/// What the controller must not be able to do, asked in `scope`.
fn not_needed(scope: &Scope) -> Vec<Question> {
    let mut q = Vec::new();
    for verb in ["create", "update", "patch", "delete", "deletecollection"] {
        q.push(ask(
            verb,
            "etcdclusters.etcd.database.coreos.com",
            scope,
            false,
        ));
    }
    q.push(Question {
        subresource: Some("status"),
        ..ask(
            "update",
            "etcdclusters.etcd.database.coreos.com",
            scope,
            false,
        )
    });
    for verb in ["list", "watch", "create", "update", "patch", "delete"] {
        q.push(ask(verb, "secrets", scope, false));
    }
    for verb in ["update", "delete", "deletecollection"] {
        q.push(ask(verb, "services", scope, false));
    }
    q.push(ask("update", "pods", scope, false));
    q.push(ask("deletecollection", "pods", scope, false));
    q.push(Question {
        subresource: Some("exec"),
        ..ask("create", "pods", scope, false)
    });
    q.push(ask("update", "persistentvolumeclaims", scope, false));
    q.push(ask("patch", "persistentvolumeclaims", scope, false));
    q.push(ask("delete", "poddisruptionbudgets.policy", scope, false));
    q.push(ask("create", "events", scope, false));
    q.push(ask("delete", "events.events.k8s.io", scope, false));
    q.push(ask("get", "configmaps", scope, false));
    q.push(ask("create", "deployments.apps", scope, false));
    q.push(ask(
        "create",
        "rolebindings.rbac.authorization.k8s.io",
        scope,
        false,
    ));
    q
}

/// Cluster-scoped things the controller must never touch.
fn cluster_denied() -> Vec<Question> {
    let c = Scope::Cluster;
    vec![
        ask("get", "nodes", &c, false),
        ask("list", "nodes", &c, false),
        ask("create", "namespaces", &c, false),
        ask("delete", "namespaces", &c, false),
        ask(
            "get",
            "customresourcedefinitions.apiextensions.k8s.io",
            &c,
            false,
        ),
        ask(
            "create",
            "clusterroles.rbac.authorization.k8s.io",
            &c,
            false,
        ),
        ask(
            "create",
            "clusterrolebindings.rbac.authorization.k8s.io",
            &c,
            false,
        ),
        ask(
            "update",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
            &c,
            false,
        ),
        ask("create", "persistentvolumes", &c, false),
        ask("impersonate", "serviceaccounts", &c, false),
        ask("list", "leases.coordination.k8s.io", &c, false),
    ]
}

/// The leader-election Lease: create in the release namespace, get and update of its own
/// Lease only.
fn lease_questions(release_ns: &str, lease: &str) -> Vec<Question> {
    let here = Scope::In(release_ns.to_owned());
    let elsewhere = Scope::In("default".to_owned());
    vec![
        ask("create", "leases.coordination.k8s.io", &here, true),
        ask(
            "get",
            format!("leases.coordination.k8s.io/{lease}"),
            &here,
            true,
        ),
        ask(
            "update",
            format!("leases.coordination.k8s.io/{lease}"),
            &here,
            true,
        ),
        ask(
            "get",
            "leases.coordination.k8s.io/someone-else",
            &here,
            false,
        ),
        ask(
            "update",
            "leases.coordination.k8s.io/someone-else",
            &here,
            false,
        ),
        ask(
            "delete",
            format!("leases.coordination.k8s.io/{lease}"),
            &here,
            false,
        ),
        ask("list", "leases.coordination.k8s.io", &here, false),
        ask("create", "leases.coordination.k8s.io", &elsewhere, false),
    ]
}

/// A client that impersonates `user` (as `kubectl --as` does).
async fn impersonating_client(ctx: &TestContext, user: &str) -> anyhow::Result<kube::Client> {
    let mut config = kube::Config::from_custom_kubeconfig(
        ctx.control_plane().kubeconfig().clone(),
        &KubeConfigOptions::default(),
    )
    .await
    .context("loading the admin kubeconfig")?;
    config.auth_info.impersonate = Some(user.to_owned());
    kube::Client::try_from(config).context("building the impersonating client")
}

fn status_code<T>(result: &Result<T, kube::Error>) -> Option<u16> {
    match result {
        Ok(_) => None,
        Err(kube::Error::Api(status)) => Some(status.code),
        Err(_) => Some(0),
    }
}

fn expect_code<T>(what: &str, result: Result<T, kube::Error>, code: u16) -> anyhow::Result<()> {
    let got = status_code(&result);
    ensure!(
        got == Some(code),
        "{what}: expected HTTP {code}, got {}",
        match result {
            Ok(_) => "success".to_owned(),
            Err(e) => e.to_string(),
        }
    );
    Ok(())
}

/// The API calls the controller makes, made as its ServiceAccount in `ns` (which it may
/// reconcile), and a few it must not make.
async fn act_as_controller(
    client: &kube::Client,
    ns: &str,
    release_ns: &str,
    lease_name: &str,
    all_namespaces: bool,
) -> anyhow::Result<()> {
    // The startup check and the watch list EtcdClusters.
    let clusters: Api<EtcdCluster> = if all_namespaces {
        Api::all(client.clone())
    } else {
        Api::namespaced(client.clone(), ns)
    };
    clusters
        .list_metadata(&ListParams::default().limit(1))
        .await
        .context("list EtcdClusters as the controller")?;
    let in_ns: Api<EtcdCluster> = Api::namespaced(client.clone(), ns);
    // Status by server-side apply: allowed, so the absent cluster answers 404, not 403.
    let status = json!({
        "apiVersion": EtcdCluster::api_version(&()),
        "kind": EtcdCluster::kind(&()),
        "status": {},
    });
    expect_code(
        "apply the status of an absent EtcdCluster",
        in_ns
            .patch_status(
                "absent",
                &PatchParams::apply("etcd-operator").force(),
                &Patch::Apply(&status),
            )
            .await,
        404,
    )?;
    // Authorization comes before admission: refused with 403 whatever the webhook would say.
    let cluster: EtcdCluster = serde_json::from_value(json!({
        "apiVersion": EtcdCluster::api_version(&()),
        "kind": EtcdCluster::kind(&()),
        "metadata": { "name": "not-allowed" },
        "spec": { "size": 1 },
    }))
    .context("building an EtcdCluster")?;
    expect_code(
        "create an EtcdCluster",
        in_ns.create(&PostParams::default(), &cluster).await,
        403,
    )?;

    // Services and the PDB are created by server-side apply.
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": "rbac-probe-client" },
        "spec": { "ports": [{ "name": "client", "port": 2379 }], "selector": { "app": "none" } },
    });
    let applied = services
        .patch(
            "rbac-probe-client",
            &PatchParams::apply("etcd-operator").force(),
            &Patch::Apply(&service),
        )
        .await
        .context("apply a Service as the controller")?;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let pdb = json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": { "name": "rbac-probe" },
        "spec": { "maxUnavailable": 1, "selector": { "matchLabels": { "app": "none" } } },
    });
    pdbs.patch(
        "rbac-probe",
        &PatchParams::apply("etcd-operator").force(),
        &Patch::Apply(&pdb),
    )
    .await
    .context("apply a PodDisruptionBudget as the controller")?;
    expect_code(
        "delete a Service",
        services
            .delete("rbac-probe-client", &DeleteParams::default())
            .await,
        403,
    )?;

    // Events through kube-runtime's Recorder, as the controller publishes them: the second
    // publish of the same event patches its series.
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "etcd-operator".into(),
            instance: Some("rbac-test".into()),
        },
    );
    let reference = applied.object_ref(&());
    let event = Event {
        type_: EventType::Normal,
        reason: "RbacProbe".into(),
        note: Some("checking the controller's RBAC".into()),
        action: "RbacProbe".into(),
        secondary: None,
    };
    for attempt in ["create", "patch"] {
        recorder
            .publish(&event, &reference)
            .await
            .with_context(|| format!("publish an event ({attempt}) as the controller"))?;
    }

    // The operator's TLS Secret may be read (absent: 404), not listed or deleted.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let got = secrets.get_opt("absent-operator-tls").await;
    ensure!(
        matches!(got, Ok(None)),
        "get a Secret: {:?}",
        got.map(|s| s.map(|s| s.name_any()))
    );
    expect_code(
        "list Secrets",
        secrets.list(&ListParams::default()).await,
        403,
    )?;
    expect_code(
        "delete a Secret",
        secrets
            .delete("absent-operator-tls", &DeleteParams::default())
            .await,
        403,
    )?;

    // Leader election in the release namespace.
    let leases: Api<Lease> = Api::namespaced(client.clone(), release_ns);
    let lease = Lease {
        metadata: ObjectMeta {
            name: Some(lease_name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some("rbac-test".into()),
            lease_duration_seconds: Some(15),
            ..LeaseSpec::default()
        }),
    };
    leases
        .create(&PostParams::default(), &lease)
        .await
        .context("create the Lease as the controller")?;
    let mut current = leases
        .get(lease_name)
        .await
        .context("get the Lease as the controller")?;
    current.spec = Some(LeaseSpec {
        holder_identity: Some("rbac-test-2".into()),
        lease_duration_seconds: Some(15),
        ..LeaseSpec::default()
    });
    leases
        .replace(lease_name, &PostParams::default(), &current)
        .await
        .context("update the Lease as the controller")?;
    expect_code(
        "delete the Lease",
        leases.delete(lease_name, &DeleteParams::default()).await,
        403,
    )?;
    expect_code("get another Lease", leases.get("someone-else").await, 403)?;
    let elsewhere: Api<Lease> = Api::namespaced(client.clone(), "default");
    expect_code(
        "create a Lease in another namespace",
        elsewhere.create(&PostParams::default(), &lease).await,
        403,
    )?;
    Ok(())
}

/// Cluster-wide mode: as the chart's controller ServiceAccount, everything the controller does
/// is allowed in every namespace and nothing else is.
async fn controller_rbac_is_least_privilege(ctx: TestContext) -> anyhow::Result<()> {
    ensure_crd(&ctx).await?;
    let helm = Helm::new(&ctx)?;
    let release = "rbac";
    let ns = ctx.ns().to_owned();
    let chart = chart_dir().to_string_lossy().into_owned();
    run_ok(
        helm.command(["install", release, &chart, "--namespace", &ns]),
        None,
    )
    .await?;
    let full = fullname(release);
    let user = format!("system:serviceaccount:{ns}:{full}-controller");
    let lease = format!("{full}-controller");

    let mut questions = needed(&Scope::Cluster);
    questions.extend(needed(&Scope::In(ns.clone())));
    questions.extend(not_needed(&Scope::Cluster));
    questions.extend(not_needed(&Scope::In(ns.clone())));
    questions.extend(cluster_denied());
    questions.extend(lease_questions(&ns, &lease));
    check_can_i(&ctx, &user, questions).await?;

    // The webhook's ServiceAccount may do nothing at all.
    let webhook_user = format!("system:serviceaccount:{ns}:{full}-webhook");
    check_can_i(
        &ctx,
        &webhook_user,
        vec![
            ask(
                "list",
                "etcdclusters.etcd.database.coreos.com",
                &Scope::Cluster,
                false,
            ),
            ask("get", "secrets", &Scope::In(ns.clone()), false),
            ask(
                "create",
                "leases.coordination.k8s.io",
                &Scope::In(ns.clone()),
                false,
            ),
        ],
    )
    .await?;

    let client = impersonating_client(&ctx, &user).await?;
    act_as_controller(&client, &ns, &ns, &lease, true).await?;

    run_ok(
        helm.command(["uninstall", release, "--namespace", &ns]),
        None,
    )
    .await?;
    Ok(())
}

/// Namespace mode (`controller.watchNamespace`): the controller's rights hold in the watched
/// namespace only; the Lease stays in the release namespace; no cluster-wide grant exists.
async fn controller_rbac_in_namespace_mode(ctx: TestContext) -> anyhow::Result<()> {
    ensure_crd(&ctx).await?;
    let watched = Namespace::create(ctx.client(), "chart-watched").await?;
    let result = namespace_mode_checks(&ctx, watched.name()).await;
    if let Err(e) = watched.delete().await {
        eprintln!("chart test: deleting namespace {}: {e}", watched.name());
    }
    result
}

async fn namespace_mode_checks(ctx: &TestContext, watched: &str) -> anyhow::Result<()> {
    let helm = Helm::new(ctx)?;
    let release = "rbac-scoped";
    let ns = ctx.ns().to_owned();
    let chart = chart_dir().to_string_lossy().into_owned();
    run_ok(
        helm.command([
            "install",
            release,
            &chart,
            "--namespace",
            &ns,
            "--set",
            &format!("controller.watchNamespace={watched}"),
        ]),
        None,
    )
    .await?;
    let full = fullname(release);
    let user = format!("system:serviceaccount:{ns}:{full}-controller");
    let lease = format!("{full}-controller");

    let watched_scope = Scope::In(watched.to_owned());
    let mut questions = needed(&watched_scope);
    questions.extend(not_needed(&watched_scope));
    // Nothing of it cluster-wide, nor in the release namespace (which it does not watch).
    for scope in [Scope::Cluster, Scope::In(ns.clone())] {
        questions.extend(needed(&scope).into_iter().map(|q| Question {
            allowed: false,
            ..q
        }));
    }
    questions.extend(cluster_denied());
    questions.extend(lease_questions(&ns, &lease));
    check_can_i(ctx, &user, questions).await?;

    let client = impersonating_client(ctx, &user).await?;
    act_as_controller(&client, watched, &ns, &lease, false).await?;
    let all: Api<EtcdCluster> = Api::all(client.clone());
    expect_code(
        "list EtcdClusters in all namespaces",
        all.list_metadata(&ListParams::default().limit(1)).await,
        403,
    )?;

    run_ok(
        helm.command(["uninstall", release, "--namespace", &ns]),
        None,
    )
    .await?;
    Ok(())
}
