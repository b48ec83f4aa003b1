//! Real cert-manager on a harness control plane: its controller and webhook as processes
//! (built by `ONLY=cert-manager hack/build-tools.sh` at `CERT_MANAGER_VERSION` of
//! `hack/versions.env`), its CRDs applied and Established, its webhook registered with the API
//! server the way its Helm chart registers it (by URL here: there is no Service to route to).
//!
//! ```no_run
//! # async fn demo(cp: &etcd_tests::ControlPlane) -> Result<(), etcd_tests::cert_manager::CertManagerError> {
//! use etcd_tests::cert_manager::{CertManager, CmKind};
//! let cert_manager = CertManager::start(cp).await?; // ready: a SelfSigned Issuer went Ready
//! let certificates = CmKind::Certificate.api(cp.client(), Some("my-namespace"));
//! # let _ = (cert_manager, certificates);
//! # Ok(())
//! # }
//! ```
//!
//! A suite that needs it in several tests starts it once with [`shared`]. Dropping a
//! [`CertManager`] stops both processes (SIGTERM, a grace period, SIGKILL); like every harness
//! child they also die with the test binary. The CRDs and the webhook configurations stay, as
//! they would after an uninstall that keeps CRDs; while no webhook runs, the API server refuses
//! writes of cert-manager resources (the configurations fail closed, as the chart's do), and the
//! next [`CertManager::start`] points them at its own webhook.
//!
//! The controller is `hack/cert-manager/controller` (cert-manager's controllers from its Go
//! module, without the Venafi issuer, whose client the Go module proxy does not serve) and the
//! webhook `hack/cert-manager/webhook` (cert-manager's webhook server): see
//! `hack/build-tools.sh`. The webhook serves on every interface (cert-manager's server takes
//! ports only); its metrics and the controller's metrics and healthz listen on loopback.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Namespace as CoreNamespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::conditions;
use kube::{Api, ResourceExt as _};
use serde::Deserialize as _;
use tokio::sync::OnceCell;

use crate::control_plane::{ControlPlane, LOG_TAIL_LINES};
use crate::pki::{CertificateAuthority, PkiError};
use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::tools::{Tools, ToolsError, VERSIONS_ENV, parse_env_file};
use crate::wait::{POLL_INTERVAL, WaitError, await_condition};

/// The key of `hack/versions.env` that pins cert-manager.
pub const VERSION_KEY: &str = "CERT_MANAGER_VERSION";
/// Name of the controller process (also its log file stem in the control plane's directory).
pub const CONTROLLER: &str = "cert-manager-controller";
/// Name of the webhook process (also its log file stem).
pub const WEBHOOK: &str = "cert-manager-webhook";
/// The default cluster resource namespace (`--cluster-resource-namespace`: where the Secrets
/// of ClusterIssuers live), created by [`CertManager::start`].
pub const DEFAULT_NAMESPACE: &str = "cert-manager";
/// Name of both webhook configurations (as the chart names them for a release `cert-manager`).
pub const WEBHOOK_CONFIGURATION: &str = "cert-manager-webhook";
/// The field manager of what the harness applies.
const FIELD_MANAGER: &str = "etcd-tests-cert-manager";
/// The Issuer whose Ready condition tells that the controller works.
const PROBE_ISSUER: &str = "etcd-tests-readiness-probe";

/// Errors starting or running cert-manager.
#[derive(Debug, thiserror::Error)]
pub enum CertManagerError {
    /// The tool cache or `hack/versions.env` could not be read.
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// `hack/versions.env` does not pin cert-manager.
    #[error("hack/versions.env does not set {VERSION_KEY}")]
    NoVersion,
    /// A binary or the CRDs are not where `hack/build-tools.sh` puts them.
    #[error(
        "cert-manager's {what} not found at {path}: run `ONLY=cert-manager hack/build-tools.sh`"
    )]
    Missing {
        /// `controller`, `webhook` or `crds.yaml`.
        what: &'static str,
        /// Where it was expected.
        path: PathBuf,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The CRD file does not parse.
    #[error("{path}: {source}")]
    Crds {
        /// The file.
        path: PathBuf,
        /// The YAML error.
        source: serde_yaml::Error,
    },
    /// The webhook's serving certificate could not be made.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// A JSON document of the harness does not deserialize (a bug).
    #[error("building {what}: {source}")]
    Json {
        /// What was built.
        what: &'static str,
        /// The error.
        source: serde_json::Error,
    },
    /// The API server refused a request.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// A wait of the harness failed.
    #[error(transparent)]
    Wait(#[from] WaitError),
    /// A process exited.
    #[error("{component} exited ({status}); logs:\n{logs}")]
    Exited {
        /// The process.
        component: String,
        /// Its exit status.
        status: String,
        /// The tail of both logs.
        logs: String,
    },
    /// cert-manager did not become ready in time.
    #[error("{what}: not after {waited:?} (last: {last}); logs:\n{logs}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        waited: Duration,
        /// The last check's result.
        last: String,
        /// The tail of both logs.
        logs: String,
    },
}

/// The pinned cert-manager version (`CERT_MANAGER_VERSION`, without a leading `v`).
pub fn version() -> Result<String, CertManagerError> {
    parse_env_file(VERSIONS_ENV)?
        .get(VERSION_KEY)
        .map(|v| v.trim_start_matches('v').to_owned())
        .filter(|v| !v.is_empty())
        .ok_or(CertManagerError::NoVersion)
}

/// Where `hack/build-tools.sh` puts cert-manager for `tools`.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The controller binary.
    pub controller: PathBuf,
    /// The webhook binary.
    pub webhook: PathBuf,
    /// The six CRDs, one YAML stream.
    pub crds: PathBuf,
}

impl Paths {
    /// The paths for the pinned version in `tools`' cache, each checked to exist.
    pub fn resolve(tools: &Tools) -> Result<Self, CertManagerError> {
        let dir = tools
            .root()
            .join("cert-manager")
            .join(format!("v{}", version()?));
        let check = |what: &'static str, path: PathBuf| {
            if path.is_file() {
                Ok(path)
            } else {
                Err(CertManagerError::Missing { what, path })
            }
        };
        Ok(Self {
            controller: check("controller", dir.join("bin/controller"))?,
            webhook: check("webhook", dir.join("bin/webhook"))?,
            crds: check("crds.yaml", dir.join("crds.yaml"))?,
        })
    }
}

/// The cert-manager kinds, for [`DynamicObject`] APIs (the harness has no typed structs for
/// them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmKind {
    /// `cert-manager.io/v1` Certificate (namespaced).
    Certificate,
    /// `cert-manager.io/v1` CertificateRequest (namespaced).
    CertificateRequest,
    /// `cert-manager.io/v1` Issuer (namespaced).
    Issuer,
    /// `cert-manager.io/v1` ClusterIssuer (cluster-scoped).
    ClusterIssuer,
    /// `acme.cert-manager.io/v1` Order (namespaced).
    Order,
    /// `acme.cert-manager.io/v1` Challenge (namespaced).
    Challenge,
}

impl CmKind {
    /// The kind's API resource.
    pub fn api_resource(self) -> ApiResource {
        let (group, kind, plural) = match self {
            Self::Certificate => ("cert-manager.io", "Certificate", "certificates"),
            Self::CertificateRequest => (
                "cert-manager.io",
                "CertificateRequest",
                "certificaterequests",
            ),
            Self::Issuer => ("cert-manager.io", "Issuer", "issuers"),
            Self::ClusterIssuer => ("cert-manager.io", "ClusterIssuer", "clusterissuers"),
            Self::Order => ("acme.cert-manager.io", "Order", "orders"),
            Self::Challenge => ("acme.cert-manager.io", "Challenge", "challenges"),
        };
        ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(group, "v1", kind),
            plural,
        )
    }

    /// An API for this kind: in `namespace`, or cluster-wide with `None` (the only choice for
    /// [`CmKind::ClusterIssuer`]).
    pub fn api(self, client: kube::Client, namespace: Option<&str>) -> Api<DynamicObject> {
        let resource = self.api_resource();
        match namespace {
            Some(ns) if self != Self::ClusterIssuer => Api::namespaced_with(client, ns, &resource),
            _ => Api::all_with(client, &resource),
        }
    }
}

/// The status of condition `type_` of a cert-manager object (`"True"`, `"False"`,
/// `"Unknown"`), if it has one.
pub fn condition_status<'a>(object: &'a DynamicObject, type_: &str) -> Option<&'a str> {
    object.data["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?["status"]
        .as_str()
}

/// Whether a cert-manager object (Certificate, Issuer, ClusterIssuer, CertificateRequest) is
/// `Ready=True` for its current generation (the condition's `observedGeneration`, where the
/// kind sets one, is not older than `metadata.generation`).
pub fn is_ready(object: &DynamicObject) -> bool {
    let Some(conditions) = object.data["status"]["conditions"].as_array() else {
        return false;
    };
    let generation = object.metadata.generation.unwrap_or(0);
    conditions.iter().any(|c| {
        c["type"] == "Ready"
            && c["status"] == "True"
            && c["observedGeneration"]
                .as_i64()
                .is_none_or(|observed| observed >= generation)
    })
}

/// Whether a Certificate's issuance has settled: [`is_ready`], no `Issuing=True` condition, and
/// `status.revision` at least 1. `Ready` alone is not enough: cert-manager's readiness
/// controller can set it from the new Secret a moment before the issuing controller records the
/// revision and clears `Issuing` (seen here: `Ready=True` at revision 0 for some milliseconds).
pub fn is_issued(certificate: &DynamicObject) -> bool {
    is_ready(certificate)
        && condition_status(certificate, "Issuing") != Some("True")
        && certificate.data["status"]["revision"]
            .as_i64()
            .is_some_and(|r| r >= 1)
}

/// How to start cert-manager.
#[derive(Debug, Clone)]
pub struct CertManagerOptions {
    /// `--cluster-resource-namespace`, created if missing. Default: [`DEFAULT_NAMESPACE`].
    pub namespace: String,
    /// Deadline for each readiness wait (CRDs, webhook, controller). Default: 120 s.
    pub startup_timeout: Duration,
    /// Grace period between SIGTERM and SIGKILL on shutdown. Default: 5 s.
    pub shutdown_grace: Duration,
    /// Log verbosity of both (`--v`). Default: 2 (cert-manager's info level).
    pub verbosity: u8,
    /// Extra controller flags, appended last (e.g. `--feature-gates=...`).
    pub extra_controller_args: Vec<String>,
    /// Extra webhook flags, appended last.
    pub extra_webhook_args: Vec<String>,
}

impl Default for CertManagerOptions {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            startup_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(5),
            verbosity: 2,
            extra_controller_args: Vec::new(),
            extra_webhook_args: Vec::new(),
        }
    }
}

/// A running cert-manager: controller and webhook processes against one control plane.
pub struct CertManager {
    processes: Mutex<Vec<ManagedProcess>>,
    version: String,
    namespace: String,
    webhook_addr: SocketAddr,
    controller_metrics_addr: SocketAddr,
    webhook_metrics_addr: SocketAddr,
    startup: Duration,
    shutdown_grace: Duration,
}

impl std::fmt::Debug for CertManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertManager")
            .field("version", &self.version)
            .field("namespace", &self.namespace)
            .field("webhook_addr", &self.webhook_addr)
            .field("startup", &self.startup)
            .finish_non_exhaustive()
    }
}

/// The suite-wide cert-manager of [`shared`].
static SHARED: OnceCell<CertManager> = OnceCell::const_new();

/// The suite's one cert-manager, started with default options on the first call (later calls
/// wait for that start, or try again after it failed). For test binaries, whose control plane
/// is one per binary; it runs until the binary exits.
pub async fn shared(cp: &ControlPlane) -> Result<&'static CertManager, CertManagerError> {
    SHARED.get_or_try_init(|| CertManager::start(cp)).await
}

impl CertManager {
    /// Starts cert-manager with default options and waits until it is ready (see
    /// [`Self::start_with`]).
    pub async fn start(cp: &ControlPlane) -> Result<Self, CertManagerError> {
        Self::start_with(cp, CertManagerOptions::default()).await
    }

    /// Applies the CRDs (waiting until each is Established), creates the cluster resource
    /// namespace, starts the webhook on a certificate of a CA of its own and registers it (a
    /// ValidatingWebhookConfiguration and a MutatingWebhookConfiguration as the chart's, by
    /// URL) until the API server calls it, then starts the controller and waits until a
    /// SelfSigned Issuer in the namespace is Ready (the probe is deleted again). Logs go to
    /// `cert-manager-{controller,webhook}.log` in the control plane's directory.
    pub async fn start_with(
        cp: &ControlPlane,
        options: CertManagerOptions,
    ) -> Result<Self, CertManagerError> {
        let began = Instant::now();
        let paths = Paths::resolve(cp.tools())?;
        let client = cp.client();
        let timeout = options.startup_timeout;
        let [
            secure,
            healthz,
            webhook_metrics,
            controller_metrics,
            controller_healthz,
        ] = free_ports::<5>().map_err(|source| CertManagerError::Io {
            what: "finding free ports".into(),
            source,
        })?;
        let loopback = |port| SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut this = Self {
            processes: Mutex::new(Vec::new()),
            version: version()?,
            namespace: options.namespace.clone(),
            webhook_addr: loopback(secure),
            controller_metrics_addr: loopback(controller_metrics),
            webhook_metrics_addr: loopback(webhook_metrics),
            startup: Duration::ZERO,
            shutdown_grace: options.shutdown_grace,
        };

        apply_crds(&client, &paths.crds, timeout).await?;
        apply_namespace(&client, &options.namespace).await?;

        // The webhook, on a serving certificate for 127.0.0.1 from a CA of its own.
        let dir = cp.dir().join("cert-manager");
        std::fs::create_dir_all(&dir).map_err(|source| CertManagerError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let ca = CertificateAuthority::new("cert-manager webhook CA (etcd-tests)")?;
        let (cert, key) = ca
            .issue_serving_cert(&["127.0.0.1"])?
            .write_to(&dir, "webhook")?;
        let kubeconfig = cp.kubeconfig_path().display().to_string();
        let v = format!("--v={}", options.verbosity);
        let mut webhook_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            format!("--secure-port={secure}"),
            format!("--healthz-port={healthz}"),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            format!("--metrics-listen-address={}", this.webhook_metrics_addr),
            v.clone(),
        ];
        webhook_args.extend(options.extra_webhook_args.iter().cloned());
        this.spawn(WEBHOOK, &paths.webhook, &webhook_args, cp.dir())?;
        register_webhook(&client, this.webhook_addr, ca.cert_pem()).await?;
        // The API server picks the configurations up a moment later: a dry-run create of an
        // Issuer only the webhook refuses (no issuer type) tells when it calls the webhook.
        let issuers = CmKind::Issuer.api(client.clone(), Some(&options.namespace));
        let invalid: DynamicObject = from_json(
            "the webhook probe",
            serde_json::json!({
                "apiVersion": "cert-manager.io/v1",
                "kind": "Issuer",
                "metadata": {"name": "etcd-tests-webhook-probe"},
                "spec": {},
            }),
        )?;
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        this.wait_until(
            "the API server to call cert-manager's webhook",
            timeout,
            || {
                let issuers = issuers.clone();
                let invalid = invalid.clone();
                let dry_run = dry_run.clone();
                async move {
                    match issuers.create(&dry_run, &invalid).await {
                        Err(kube::Error::Api(e))
                            if e.message.contains("at least one issuer must be configured") =>
                        {
                            Ok(Some(()))
                        }
                        Err(e) => Err(e.to_string()),
                        Ok(_) => Ok(None),
                    }
                }
            },
        )
        .await?;

        // The controller, then an Issuer it must make Ready.
        let mut controller_args = vec![
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".into(),
            format!("--cluster-resource-namespace={}", options.namespace),
            format!("--metrics-listen-address={}", this.controller_metrics_addr),
            format!("--healthz-listen-address={}", loopback(controller_healthz)),
            v,
        ];
        controller_args.extend(options.extra_controller_args.iter().cloned());
        this.spawn(CONTROLLER, &paths.controller, &controller_args, cp.dir())?;
        let probe: DynamicObject = from_json(
            "the controller probe",
            serde_json::json!({
                "apiVersion": "cert-manager.io/v1",
                "kind": "Issuer",
                "metadata": {"name": PROBE_ISSUER},
                "spec": {"selfSigned": {}},
            }),
        )?;
        issuers
            .patch(
                PROBE_ISSUER,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&probe),
            )
            .await
            .map_err(|source| CertManagerError::Api {
                what: format!("creating Issuer {}/{PROBE_ISSUER}", options.namespace),
                source,
            })?;
        this.wait_until("the probe Issuer to be Ready", timeout, || {
            let issuers = issuers.clone();
            async move {
                match issuers.get_opt(PROBE_ISSUER).await {
                    Ok(Some(issuer)) => Ok(is_ready(&issuer).then_some(())),
                    Ok(None) => Err(String::from("the probe Issuer is gone")),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await?;
        issuers
            .delete(PROBE_ISSUER, &DeleteParams::default())
            .await
            .map_err(|source| CertManagerError::Api {
                what: format!("deleting Issuer {}/{PROBE_ISSUER}", options.namespace),
                source,
            })?;
        this.startup = began.elapsed();
        Ok(this)
    }

    fn spawn(
        &self,
        name: &str,
        program: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> Result<(), CertManagerError> {
        let process =
            ManagedProcess::start(name, program, args, log_dir.join(format!("{name}.log")))?;
        self.lock_processes().push(process);
        Ok(())
    }

    /// Calls `check` every [`POLL_INTERVAL`] until it returns `Ok(Some(_))`; fails at once when
    /// a process exits and at `timeout` with the last check's result and the logs.
    async fn wait_until<T, F, Fut>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: F,
    ) -> Result<T, CertManagerError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Option<T>, String>>,
    {
        let began = Instant::now();
        loop {
            self.check_running()?;
            let last = match tokio::time::timeout(timeout.saturating_sub(began.elapsed()), check())
                .await
            {
                Ok(Ok(Some(value))) => return Ok(value),
                Ok(Ok(None)) => String::from("not yet"),
                Ok(Err(e)) => e,
                Err(_) => String::from("check still running at the deadline"),
            };
            if began.elapsed() >= timeout {
                return Err(CertManagerError::Timeout {
                    what: what.to_owned(),
                    waited: began.elapsed(),
                    last,
                    logs: self.log_tails(LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// The running version (`CERT_MANAGER_VERSION`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The cluster resource namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The webhook's address (`127.0.0.1:PORT`, HTTPS).
    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr
    }

    /// The controller's Prometheus metrics (`http://ADDR/metrics`).
    pub fn controller_metrics_addr(&self) -> SocketAddr {
        self.controller_metrics_addr
    }

    /// The webhook's Prometheus metrics (`http://ADDR/metrics`).
    pub fn webhook_metrics_addr(&self) -> SocketAddr {
        self.webhook_metrics_addr
    }

    /// How long [`Self::start_with`] took, from its call to the probe Issuer's Ready.
    pub fn startup(&self) -> Duration {
        self.startup
    }

    /// The last `lines` lines of both logs, each under a header.
    pub fn log_tails(&self, lines: usize) -> String {
        self.lock_processes()
            .iter()
            .map(|p| {
                format!(
                    "===== {} ({}) =====\n{}\n",
                    p.name(),
                    p.log_path().display(),
                    p.log_tail(lines)
                )
            })
            .collect()
    }

    /// Fails with [`CertManagerError::Exited`] if the controller or the webhook has exited.
    pub fn check_running(&self) -> Result<(), CertManagerError> {
        let exited = self.lock_processes().iter_mut().find_map(|p| {
            p.exit_status()
                .map(|s| (p.name().to_owned(), s.to_string()))
        });
        match exited {
            Some((component, status)) => Err(CertManagerError::Exited {
                component,
                status,
                logs: self.log_tails(LOG_TAIL_LINES),
            }),
            None => Ok(()),
        }
    }

    /// Stops the controller, then the webhook (SIGTERM, the grace period, SIGKILL). Idempotent;
    /// `Drop` calls it.
    pub fn shutdown(&self) {
        let mut processes = std::mem::take(&mut *self.lock_processes());
        for p in processes.iter_mut().rev() {
            p.stop(self.shutdown_grace);
        }
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<ManagedProcess>> {
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A CA Issuer `NAME` in `namespace`, as a user makes one: a SelfSigned Issuer `selfsigned`,
/// the CA Certificate `NAME` it signs (ECDSA P-256, 90 days, Secret `NAME`), and the CA
/// Issuer on that Secret; waits until each is Ready (issued) within `timeout`.
pub async fn ca_issuer(
    client: kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let apply = |kind: CmKind, object: serde_json::Value| {
        let client = client.clone();
        async move {
            let object: DynamicObject = serde_json::from_value(object)?;
            let name = object.metadata.name.clone().context("no name")?;
            kind.api(client, Some(namespace))
                .patch(
                    &name,
                    &PatchParams::apply("etcd-tests").force(),
                    &Patch::Apply(&object),
                )
                .await
                .with_context(|| format!("applying {kind:?} {name}"))?;
            anyhow::Ok(())
        }
    };
    let ready = |kind: CmKind, name: String| {
        let api = kind.api(client.clone(), Some(namespace));
        async move {
            crate::poll_until(&format!("{kind:?} {name} Ready"), timeout, || async {
                let object = api.get(&name).await?;
                let done = match kind {
                    CmKind::Certificate => is_issued(&object),
                    _ => is_ready(&object),
                };
                anyhow::Ok(done.then_some(()))
            })
            .await?;
            anyhow::Ok(())
        }
    };
    apply(
        CmKind::Issuer,
        serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": "selfsigned"}, "spec": {"selfSigned": {}},
        }),
    )
    .await?;
    apply(
        CmKind::Certificate,
        serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
            "metadata": {"name": name},
            "spec": {
                "isCA": true, "commonName": "etcd CA", "secretName": name,
                "duration": "2160h", "privateKey": {"algorithm": "ECDSA", "size": 256},
                "issuerRef": {"name": "selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
            },
        }),
    )
    .await?;
    ready(CmKind::Certificate, name.to_string()).await?;
    apply(
        CmKind::Issuer,
        serde_json::json!({
            "apiVersion": "cert-manager.io/v1", "kind": "Issuer",
            "metadata": {"name": name}, "spec": {"ca": {"secretName": name}},
        }),
    )
    .await?;
    ready(CmKind::Issuer, name.to_string()).await
}

impl Drop for CertManager {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn from_json<T: serde::de::DeserializeOwned>(
    what: &'static str,
    value: serde_json::Value,
) -> Result<T, CertManagerError> {
    serde_json::from_value(value).map_err(|source| CertManagerError::Json { what, source })
}

/// Applies every CRD of `path` (server-side) and waits until each is Established.
async fn apply_crds(
    client: &kube::Client,
    path: &Path,
    timeout: Duration,
) -> Result<(), CertManagerError> {
    let text = std::fs::read_to_string(path).map_err(|source| CertManagerError::Io {
        what: format!("reading {}", path.display()),
        source,
    })?;
    let crds_err = |source| CertManagerError::Crds {
        path: path.to_owned(),
        source,
    };
    let mut crds = Vec::new();
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(document).map_err(crds_err)?;
        if value.is_null() {
            continue;
        }
        crds.push(serde_yaml::from_value::<CustomResourceDefinition>(value).map_err(crds_err)?);
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in &crds {
        let name = crd.name_any();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|source| CertManagerError::Api {
                what: format!("applying CRD {name}"),
                source,
            })?;
    }
    for crd in &crds {
        await_condition(
            api.clone(),
            &crd.name_any(),
            conditions::is_crd_established(),
            timeout,
        )
        .await?;
    }
    Ok(())
}

async fn apply_namespace(client: &kube::Client, name: &str) -> Result<(), CertManagerError> {
    let namespace: CoreNamespace = from_json(
        "the namespace",
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
    )?;
    Api::<CoreNamespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER),
            &Patch::Apply(&namespace),
        )
        .await
        .map_err(|source| CertManagerError::Api {
            what: format!("creating namespace {name}"),
            source,
        })?;
    Ok(())
}

/// The chart's two webhook configurations (`webhook-validating-webhook.yaml`,
/// `webhook-mutating-webhook.yaml` of cert-manager's chart, with its default values), calling
/// the webhook at `addr` by URL.
async fn register_webhook(
    client: &kube::Client,
    addr: SocketAddr,
    ca_pem: &str,
) -> Result<(), CertManagerError> {
    let ca_bundle = STANDARD.encode(ca_pem);
    let webhook = |path: &str, rules: serde_json::Value, selector: serde_json::Value| {
        serde_json::json!([{
            "name": "webhook.cert-manager.io",
            "namespaceSelector": selector,
            "rules": rules,
            "admissionReviewVersions": ["v1"],
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 30,
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "clientConfig": {"url": format!("https://{addr}{path}"), "caBundle": ca_bundle},
        }])
    };
    let validating: ValidatingWebhookConfiguration = from_json(
        "the ValidatingWebhookConfiguration",
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": webhook(
                "/validate",
                serde_json::json!([{
                    "apiGroups": ["cert-manager.io", "acme.cert-manager.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"],
                    "resources": ["*/*"],
                }]),
                serde_json::json!({"matchExpressions": [{
                    "key": "cert-manager.io/disable-validation",
                    "operator": "NotIn",
                    "values": ["true"],
                }]}),
            ),
        }),
    )?;
    let mutating: MutatingWebhookConfiguration = from_json(
        "the MutatingWebhookConfiguration",
        serde_json::json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_CONFIGURATION},
            "webhooks": webhook(
                "/mutate",
                serde_json::json!([{
                    "apiGroups": ["cert-manager.io"],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["certificaterequests"],
                }]),
                serde_json::json!({}),
            ),
        }),
    )?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let api_err = |what: &str| {
        let what = format!("applying {what} {WEBHOOK_CONFIGURATION}");
        move |source| CertManagerError::Api { what, source }
    };
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .patch(WEBHOOK_CONFIGURATION, &params, &Patch::Apply(&validating))
        .await
        .map_err(api_err("ValidatingWebhookConfiguration"))?;
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .patch(WEBHOOK_CONFIGURATION, &params, &Patch::Apply(&mutating))
        .await
        .map_err(api_err("MutatingWebhookConfiguration"))?;
    Ok(())
}
