//! The operator as its Helm chart installs it, on the local control plane: the chart's
//! controller and webhook pods run from the binaries built in this repository (the process
//! kubelet maps their images to them), and the API server reaches the webhook through its
//! Service. Used by the local demo (`src/bin/demo.rs`) and the `installed` test suite.
//!
//! Two settings make the chart's real path work without a container runtime:
//! - the API server runs with `--enable-aggregator-routing=true`, so it sends webhook calls
//!   to the Service's endpoint (pod IP and target port) instead of its ClusterIP, for which
//!   there is no kube-proxy here; the serving certificate still has to match the Service's
//!   DNS name, as on a real cluster;
//! - the chart's `bindPodIP=true`, because every pod of the process kubelet shares one
//!   network namespace: two pods binding `:8080` would collide.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use etcd_shared::EtcdCluster;
use etcd_shared::types::ClusterPhase;

use crate::control_plane::{ControlPlane, ControlPlaneOptions};
use crate::helm::{Helm, HelmMajor};
use crate::kubelet::{ImageMapping, Kubelet};

/// Where the operator binaries are looked for instead of next to the running executable.
pub const BIN_DIR_ENV: &str = "ETCD_OPERATOR_BIN_DIR";

/// Image repository of the controller in the chart's values.
pub const CONTROLLER_REPOSITORY: &str = "etcd-operator/etcd-controller";
/// Image repository of the webhook in the chart's values.
pub const WEBHOOK_REPOSITORY: &str = "etcd-operator/etcd-webhook";
/// Entrypoint of the controller image (see `hack/build-images.sh`).
pub const CONTROLLER_ENTRYPOINT: &str = "/usr/local/bin/etcd-controller";
/// Entrypoint of the webhook image (see `hack/build-images.sh`).
pub const WEBHOOK_ENTRYPOINT: &str = "/usr/local/bin/etcd-webhook";

/// Why the operator could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// A binary of the operator has not been built.
    #[error(
        "{0} not found: build it first (`cargo build -p etcd-controller -p etcd-webhook`, \
         with --release for a release tree) or point ${BIN_DIR_ENV} at the directory holding it"
    )]
    MissingBinary(PathBuf),
    /// The running executable's path is unknown.
    #[error("cannot locate the running executable: {0}")]
    CurrentExe(#[source] std::io::Error),
    /// helm failed, or is not in the tool cache.
    #[error(transparent)]
    Helm(#[from] crate::helm::HelmError),
}

/// The two operator binaries the chart's images map to.
#[derive(Debug, Clone)]
pub struct OperatorBinaries {
    /// The `etcd-controller` binary.
    pub controller: PathBuf,
    /// The `etcd-webhook` binary.
    pub webhook: PathBuf,
}

impl OperatorBinaries {
    /// The binaries in `$ETCD_OPERATOR_BIN_DIR`, else in the cargo profile directory of the
    /// running executable (`target/<profile>/`, also from `target/<profile>/deps/`).
    pub fn locate() -> Result<Self, InstallError> {
        let dir = match std::env::var_os(BIN_DIR_ENV) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let exe = std::env::current_exe().map_err(InstallError::CurrentExe)?;
                let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
                if dir.file_name().is_some_and(|n| n == "deps") {
                    dir.pop();
                }
                dir
            }
        };
        Self::in_dir(&dir)
    }

    /// The binaries in `dir`.
    pub fn in_dir(dir: &Path) -> Result<Self, InstallError> {
        let find = |name: &str| {
            let path = dir.join(name);
            if path.is_file() {
                Ok(path)
            } else {
                Err(InstallError::MissingBinary(path))
            }
        };
        Ok(Self {
            controller: find("etcd-controller")?,
            webhook: find("etcd-webhook")?,
        })
    }

    /// Makes `kubelet` run the chart's controller and webhook images (any tag) from these
    /// binaries.
    pub fn register(&self, kubelet: &Kubelet) {
        kubelet.images().register_repository(
            format!("/{}", repository_name(CONTROLLER_REPOSITORY)),
            ImageMapping::new(CONTROLLER_ENTRYPOINT, &self.controller),
        );
        kubelet.images().register_repository(
            format!("/{}", repository_name(WEBHOOK_REPOSITORY)),
            ImageMapping::new(WEBHOOK_ENTRYPOINT, &self.webhook),
        );
    }
}

fn repository_name(repository: &str) -> &str {
    repository.rsplit('/').next().unwrap_or(repository)
}

/// Control plane options under which the API server reaches webhooks through their
/// Service's endpoints.
pub fn control_plane_options() -> ControlPlaneOptions {
    ControlPlaneOptions {
        extra_apiserver_args: vec!["--enable-aggregator-routing=true".into()],
        ..ControlPlaneOptions::default()
    }
}

/// The chart in this repository.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/etcd-operator")
}

/// The `--set` values every install on the local control plane needs.
pub const LOCAL_VALUES: &[&str] = &["bindPodIP=true"];

/// A Helm release of the chart on a control plane.
#[derive(Debug, Clone)]
pub struct Release {
    /// Release name.
    pub name: String,
    /// Namespace of the release.
    pub namespace: String,
    /// How long `helm --wait` may wait for the pods.
    pub timeout: Duration,
    /// The Helm major that installs, upgrades and uninstalls it.
    pub helm: HelmMajor,
    /// Whether the chart gets [`LOCAL_VALUES`] (pods of the process kubelet); false on a real
    /// node, where the chart's defaults work as on any cluster.
    pub local_values: bool,
}

impl Release {
    /// Release `name` in `namespace`, by Helm 3, waiting up to two minutes.
    pub fn new(name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            namespace: namespace.into(),
            timeout: Duration::from_secs(120),
            helm: HelmMajor::V3,
            local_values: true,
        }
    }

    /// The same release with the chart's defaults only (no [`LOCAL_VALUES`]): for a real node.
    pub fn on_real_node(mut self) -> Self {
        self.local_values = false;
        self
    }

    /// The same release, by Helm `major`.
    pub fn with_helm(mut self, major: HelmMajor) -> Self {
        self.helm = major;
        self
    }

    /// `helm install` (or `upgrade --install`) of the chart with [`LOCAL_VALUES`] (unless
    /// [`Self::on_real_node`]) and `sets`,
    /// waiting until every Deployment is available. Returns helm's stdout.
    pub async fn install(&self, cp: &ControlPlane, sets: &[&str]) -> Result<String, InstallError> {
        self.upgrade(cp, sets, true).await
    }

    /// `helm upgrade` of the release with [`LOCAL_VALUES`] and `sets` (`--install` with
    /// `install`), waiting until every Deployment is available. Returns helm's stdout.
    pub async fn upgrade(
        &self,
        cp: &ControlPlane,
        sets: &[&str],
        install: bool,
    ) -> Result<String, InstallError> {
        let mut args: Vec<String> = vec!["upgrade".into()];
        if install {
            args.extend(["--install".into(), "--create-namespace".into()]);
        }
        args.extend([
            self.name.clone(),
            chart_dir().display().to_string(),
            "--namespace".into(),
            self.namespace.clone(),
            "--wait".into(),
            "--timeout".into(),
            format!("{}s", self.timeout.as_secs()),
        ]);
        let local: &[&str] = if self.local_values { LOCAL_VALUES } else { &[] };
        for set in local.iter().chain(sets) {
            args.extend(["--set".into(), (*set).to_string()]);
        }
        helm(cp, self.helm, &args).await
    }

    /// `helm uninstall --wait` of the release. Returns helm's stdout.
    pub async fn uninstall(&self, cp: &ControlPlane) -> Result<String, InstallError> {
        let args: Vec<String> = vec![
            "uninstall".into(),
            self.name.clone(),
            "--namespace".into(),
            self.namespace.clone(),
            "--wait".into(),
            "--timeout".into(),
            format!("{}s", self.timeout.as_secs()),
        ];
        helm(cp, self.helm, &args).await
    }
}

/// Runs the pinned helm of `major` against `cp` with `args` (its home in the control plane's
/// directory); its stdout, or an error with its stderr.
pub async fn helm(
    cp: &ControlPlane,
    major: HelmMajor,
    args: &[String],
) -> Result<String, InstallError> {
    Ok(Helm::in_control_plane_dir(cp, major)?.run(args).await?)
}

/// `kubectl apply -f -` of `yaml`, with `kubectl` as [`ControlPlane::kubectl`] gives it (plus
/// any flags): kubectl's output, whether it succeeded or not.
pub async fn kubectl_apply(
    kubectl: std::process::Command,
    yaml: &str,
) -> std::io::Result<std::process::Output> {
    use tokio::io::AsyncWriteExt as _;
    let mut child = tokio::process::Command::from(kubectl)
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(yaml.as_bytes()).await?;
    }
    child.wait_with_output().await
}

/// The cluster has settled on its spec: the controller has seen this generation, every member
/// of `spec.size` is ready, the phase is `Running` and `Available` is true.
pub fn is_settled(c: &EtcdCluster) -> bool {
    c.status.as_ref().is_some_and(|s| {
        s.observed_generation == c.metadata.generation
            && s.phase == Some(ClusterPhase::Running)
            && s.ready_members.is_some()
            && s.ready_members == c.spec.size
            && s.conditions
                .iter()
                .any(|k| k.type_ == "Available" && k.status == "True")
    })
}
