//! Locating the Go-built tools (kube-apiserver, etcd, kubectl, helm, ...) that
//! `hack/build-tools.sh` puts in a cache outside the repository.
//!
//! The versions are those pinned in `hack/versions.env`, compiled into this crate with
//! `include_str!`, so the harness and the build script cannot disagree.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The text of `hack/versions.env`, as it was when this crate was compiled.
pub const VERSIONS_ENV: &str =
    include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/versions.env"));

/// Environment variable that overrides the tool cache directory (same as `hack/build-tools.sh`).
pub const TOOLS_DIR_ENV: &str = "ETCD_OPERATOR_TOOLS";

/// Errors while reading the pinned versions or locating a tool.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolsError {
    /// A line of `hack/versions.env` is not `KEY=VALUE`.
    #[error("hack/versions.env line {line}: expected KEY=VALUE, got {text:?}")]
    MalformedLine {
        /// 1-based line number.
        line: usize,
        /// The offending line.
        text: String,
    },
    /// A key the harness needs is missing from `hack/versions.env`.
    #[error("hack/versions.env does not set {0}")]
    MissingKey(&'static str),
    /// A tool binary is not where `hack/build-tools.sh` puts it.
    #[error(
        "{tool} not found at {path}: run hack/build-tools.sh (it builds the pinned tools into {root})"
    )]
    Missing {
        /// Name of the binary, e.g. `kube-apiserver`.
        tool: String,
        /// Where it was expected.
        path: PathBuf,
        /// The tool cache root.
        root: PathBuf,
    },
    /// Neither `$ETCD_OPERATOR_TOOLS` nor a home directory is available.
    #[error("cannot locate the tool cache: set {TOOLS_DIR_ENV} (no home directory found)")]
    NoCacheDir,
}

/// The versions pinned in `hack/versions.env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    /// `KUBERNETES_VERSION`, without a leading `v` (e.g. `1.36.3`).
    pub kubernetes: String,
    /// `ETCD_VERSIONS`: the etcd member versions the operator tests against, in file order.
    pub etcd: Vec<String>,
    /// `ETCD_SOURCE_VERSIONS`: the etcd lines built from source archives (3.2-3.4), oldest first.
    pub etcd_source: Vec<String>,
    /// `APISERVER_ETCD_VERSION`: the etcd that backs the test kube-apiserver.
    pub apiserver_etcd: String,
    /// `HELM_VERSION`: the pinned Helm 3.
    pub helm: String,
    /// `HELM4_VERSION`: the pinned Helm 4.
    pub helm4: String,
    /// `VERSITYGW_VERSION`: the S3 server of the backup tests.
    pub versitygw: String,
    /// `AZURITE_VERSION`: the Azure Blob Storage server of the backup tests.
    pub azurite: String,
    /// `FAKE_GCS_SERVER_VERSION`: the GCS server of the backup tests.
    pub fake_gcs_server: String,
    /// `PROMETHEUS_VERSION`: the module version of Prometheus and promtool (`0.3XX.Y` is
    /// Prometheus 3.XX.Y).
    pub prometheus: String,
    /// `CONTAINERD_VERSION`: the real node's container runtime.
    pub containerd: String,
    /// `CNI_PLUGINS_VERSION`: the real node's network plugins.
    pub cni_plugins: String,
    /// `COREDNS_VERSION`: the real node's cluster DNS.
    pub coredns: String,
}

/// Parses `KEY=VALUE` lines (values optionally in single or double quotes; `#` comments and
/// blank lines ignored), as the shell `source`s them in `hack/build-tools.sh`.
pub fn parse_env_file(text: &str) -> Result<BTreeMap<String, String>, ToolsError> {
    let mut vars = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").unwrap_or(line);
        let malformed = || ToolsError::MalformedLine {
            line: index + 1,
            text: raw.to_owned(),
        };
        let (key, value) = line.split_once('=').ok_or_else(malformed)?;
        let key = key.trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(malformed());
        }
        let value = value.trim();
        let value = ['"', '\'']
            .iter()
            .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
            .unwrap_or(value);
        vars.insert(key.to_owned(), value.to_owned());
    }
    Ok(vars)
}

impl Versions {
    /// Parses versions from the text of a `versions.env` file.
    pub fn parse(text: &str) -> Result<Self, ToolsError> {
        let vars = parse_env_file(text)?;
        let get = |key: &'static str| {
            vars.get(key)
                .filter(|v| !v.is_empty())
                .map(|v| v.trim_start_matches('v').to_owned())
                .ok_or(ToolsError::MissingKey(key))
        };
        Ok(Self {
            kubernetes: get("KUBERNETES_VERSION")?,
            etcd: get("ETCD_VERSIONS")?
                .split_whitespace()
                .map(|v| v.trim_start_matches('v').to_owned())
                .collect(),
            etcd_source: get("ETCD_SOURCE_VERSIONS")?
                .split_whitespace()
                .map(|v| v.trim_start_matches('v').to_owned())
                .collect(),
            apiserver_etcd: get("APISERVER_ETCD_VERSION")?,
            helm: get("HELM_VERSION")?,
            helm4: get("HELM4_VERSION")?,
            versitygw: get("VERSITYGW_VERSION")?,
            azurite: get("AZURITE_VERSION")?,
            fake_gcs_server: get("FAKE_GCS_SERVER_VERSION")?,
            prometheus: get("PROMETHEUS_VERSION")?,
            containerd: get("CONTAINERD_VERSION")?,
            cni_plugins: get("CNI_PLUGINS_VERSION")?,
            coredns: get("COREDNS_VERSION")?,
        })
    }

    /// Every etcd member version built here, one per release line, oldest first: the
    /// source-built lines and the module-built ones.
    pub fn every_etcd(&self) -> Vec<String> {
        let mut all: Vec<String> = self.etcd_source.iter().chain(&self.etcd).cloned().collect();
        all.sort_by_key(|v| {
            v.split('.')
                .map(|p| p.parse::<u64>().unwrap_or(0))
                .collect::<Vec<_>>()
        });
        all.dedup();
        all
    }

    /// The versions compiled in from `hack/versions.env` (parsed once).
    pub fn pinned() -> Result<&'static Self, ToolsError> {
        static PINNED: OnceLock<Result<Versions, ToolsError>> = OnceLock::new();
        PINNED
            .get_or_init(|| Self::parse(VERSIONS_ENV))
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// The tool cache and the pinned versions: resolves paths to each binary.
#[derive(Debug, Clone)]
pub struct Tools {
    root: PathBuf,
    versions: Versions,
}

impl Tools {
    /// The default cache (`$ETCD_OPERATOR_TOOLS`, else `~/.cache/etcd-operator/tools`) with the
    /// pinned versions.
    pub fn from_env() -> Result<Self, ToolsError> {
        let root = match std::env::var_os(TOOLS_DIR_ENV) {
            Some(dir) if !dir.is_empty() => PathBuf::from(dir),
            _ => std::env::home_dir()
                .ok_or(ToolsError::NoCacheDir)?
                .join(".cache/etcd-operator/tools"),
        };
        Ok(Self::new(root, Versions::pinned()?.clone()))
    }

    /// A cache at `root` with the given versions.
    pub fn new(root: impl Into<PathBuf>, versions: Versions) -> Self {
        Self {
            root: root.into(),
            versions,
        }
    }

    /// The cache root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The versions these tools are resolved for.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }

    fn binary(&self, dir: PathBuf, tool: &str) -> Result<PathBuf, ToolsError> {
        let path = dir.join("bin").join(tool);
        // A `.complete` marker is written after the whole directory was built.
        if dir.join(".complete").is_file() && path.is_file() {
            Ok(path)
        } else {
            Err(ToolsError::Missing {
                tool: tool.to_owned(),
                path,
                root: self.root.clone(),
            })
        }
    }

    fn kubernetes(&self, tool: &str) -> Result<PathBuf, ToolsError> {
        let dir = self
            .root
            .join("kubernetes")
            .join(format!("v{}", self.versions.kubernetes));
        self.binary(dir, tool)
    }

    /// `kube-apiserver` at the pinned Kubernetes version.
    pub fn kube_apiserver(&self) -> Result<PathBuf, ToolsError> {
        self.kubernetes("kube-apiserver")
    }

    /// `kube-controller-manager` at the pinned Kubernetes version.
    pub fn kube_controller_manager(&self) -> Result<PathBuf, ToolsError> {
        self.kubernetes("kube-controller-manager")
    }

    /// `kube-scheduler` at the pinned Kubernetes version.
    pub fn kube_scheduler(&self) -> Result<PathBuf, ToolsError> {
        self.kubernetes("kube-scheduler")
    }

    /// `kubectl` at the pinned Kubernetes version.
    pub fn kubectl(&self) -> Result<PathBuf, ToolsError> {
        self.kubernetes("kubectl")
    }

    /// `etcd` at `version` (e.g. `3.6.16`; a leading `v` is accepted).
    pub fn etcd(&self, version: &str) -> Result<PathBuf, ToolsError> {
        self.binary(self.etcd_dir(version), "etcd")
    }

    /// `etcdctl` at `version`.
    pub fn etcdctl(&self, version: &str) -> Result<PathBuf, ToolsError> {
        self.binary(self.etcd_dir(version), "etcdctl")
    }

    /// `etcdutl` at `version` (3.5 and later; the lines before have `etcdctl snapshot restore`).
    pub fn etcdutl(&self, version: &str) -> Result<PathBuf, ToolsError> {
        self.binary(self.etcd_dir(version), "etcdutl")
    }

    /// `versitygw`, the S3 server of the backup tests, at `VERSITYGW_VERSION`.
    pub fn versitygw(&self) -> Result<PathBuf, ToolsError> {
        let dir = self
            .root
            .join("versitygw")
            .join(format!("v{}", self.versions.versitygw));
        self.binary(dir, "versitygw")
    }

    /// `azurite-blob` (Azurite's Blob service), the ABS server of the backup tests, at
    /// `AZURITE_VERSION`.
    pub fn azurite_blob(&self) -> Result<PathBuf, ToolsError> {
        let dir = self
            .root
            .join("azurite")
            .join(format!("v{}", self.versions.azurite));
        self.binary(dir, "azurite-blob")
    }

    /// `fake-gcs-server`, the GCS server of the backup tests, at `FAKE_GCS_SERVER_VERSION`.
    pub fn fake_gcs_server(&self) -> Result<PathBuf, ToolsError> {
        let dir = self
            .root
            .join("fake-gcs-server")
            .join(format!("v{}", self.versions.fake_gcs_server));
        self.binary(dir, "fake-gcs-server")
    }

    fn prometheus_dir(&self) -> PathBuf {
        self.root
            .join("prometheus")
            .join(format!("v{}", self.versions.prometheus))
    }

    /// The real node's directory (`bin/` holds kubelet, kube-proxy, containerd,
    /// containerd-shim-runc-v2, ctr; `bin/cni/` the CNI plugins), built by
    /// `ONLY=node hack/build-tools.sh`; `kubelet` stands for the whole set.
    pub fn node_bin(&self) -> Result<PathBuf, ToolsError> {
        let dir = self.root.join("node").join(format!(
            "v{}-containerd{}-cni{}",
            self.versions.kubernetes, self.versions.containerd, self.versions.cni_plugins
        ));
        let kubelet = self.binary(dir, "kubelet")?;
        Ok(kubelet.parent().map(Path::to_path_buf).unwrap_or_default())
    }

    /// `prometheus`, the server of the Prometheus tests, at `PROMETHEUS_VERSION`.
    pub fn prometheus(&self) -> Result<PathBuf, ToolsError> {
        self.binary(self.prometheus_dir(), "prometheus")
    }

    /// `promtool` (rule unit tests, metric lint, PromQL parsing) at `PROMETHEUS_VERSION`.
    pub fn promtool(&self) -> Result<PathBuf, ToolsError> {
        self.binary(self.prometheus_dir(), "promtool")
    }

    fn etcd_dir(&self, version: &str) -> PathBuf {
        self.root
            .join("etcd")
            .join(format!("v{}", version.trim_start_matches('v')))
    }

    /// The etcd that backs the test kube-apiserver (`APISERVER_ETCD_VERSION`).
    pub fn apiserver_etcd(&self) -> Result<PathBuf, ToolsError> {
        self.etcd(&self.versions.apiserver_etcd)
    }

    /// `helm` at the pinned Helm 3 version (`HELM_VERSION`).
    pub fn helm(&self) -> Result<PathBuf, ToolsError> {
        self.helm_major(crate::helm::HelmMajor::V3)
    }

    /// `helm` at the pinned Helm 4 version (`HELM4_VERSION`).
    pub fn helm4(&self) -> Result<PathBuf, ToolsError> {
        self.helm_major(crate::helm::HelmMajor::V4)
    }

    /// `helm` of `major` at its pinned version.
    pub fn helm_major(&self, major: crate::helm::HelmMajor) -> Result<PathBuf, ToolsError> {
        let version = self.helm_version(major);
        let dir = self.root.join("helm").join(format!("v{version}"));
        self.binary(dir, "helm")
    }

    /// The pinned version of Helm `major`.
    pub fn helm_version(&self, major: crate::helm::HelmMajor) -> &str {
        match major {
            crate::helm::HelmMajor::V3 => &self.versions.helm,
            crate::helm::HelmMajor::V4 => &self.versions.helm4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_quoted_and_unquoted_values() {
        let vars = parse_env_file("# c\nA=1\nB=\"x y\"\n\nexport C='z'\nD=\n").expect("parse");
        assert_eq!(vars["A"], "1");
        assert_eq!(vars["B"], "x y");
        assert_eq!(vars["C"], "z");
        assert_eq!(vars["D"], "");
    }

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            parse_env_file("A=1\nnot a pair\n"),
            Err(ToolsError::MalformedLine { line: 2, .. })
        ));
    }

    #[test]
    fn pinned_versions_parse() {
        let v = Versions::pinned().expect("hack/versions.env parses");
        assert!(v.kubernetes.starts_with("1."), "{v:?}");
        assert!(!v.etcd.is_empty());
        assert!(v.etcd.iter().all(|e| e.starts_with("3.")));
        assert!(v.helm.starts_with("3."), "HELM_VERSION={}", v.helm);
        assert!(v.helm4.starts_with("4."), "HELM4_VERSION={}", v.helm4);
        assert!(
            v.prometheus.starts_with("0.3"),
            "PROMETHEUS_VERSION={} (the Go module version of Prometheus 3.x)",
            v.prometheus
        );
    }

    /// One built etcd per line the operator supports, 3.2 to the newest, oldest first: the
    /// lifecycle suite runs a member of each.
    #[test]
    fn every_supported_line_has_a_pinned_etcd() {
        let v = Versions::pinned().expect("parse");
        let lines: Vec<String> = v
            .every_etcd()
            .iter()
            .map(|e| e.rsplit_once('.').map_or(e.clone(), |(l, _)| l.to_string()))
            .collect();
        let supported: Vec<String> = etcd_shared::version::LINES
            .iter()
            .map(|l| format!("{}.{}", l.major, l.minor))
            .collect();
        assert_eq!(lines, supported);
    }

    #[test]
    // Each push is compiled in only when its k8s-openapi feature is on, so `vec![]` cannot work.
    #[allow(clippy::vec_init_then_push)]
    fn kubernetes_version_matches_the_k8s_openapi_feature() {
        let mut features = Vec::new();
        k8s_openapi::k8s_if_1_33! { features.push("1.33"); }
        k8s_openapi::k8s_if_1_34! { features.push("1.34"); }
        k8s_openapi::k8s_if_1_35! { features.push("1.35"); }
        k8s_openapi::k8s_if_1_36! { features.push("1.36"); }
        k8s_openapi::k8s_if_1_37! { features.push("1.37"); }
        let pinned = &Versions::pinned().expect("parse").kubernetes;
        let minor: String = pinned.split('.').take(2).collect::<Vec<_>>().join(".");
        assert_eq!(
            features,
            [minor.as_str()],
            "KUBERNETES_VERSION={pinned} in hack/versions.env but k8s-openapi is built for {features:?}"
        );
    }

    #[test]
    fn missing_tool_error_names_path_and_script() {
        let tools = Tools::new(
            "/nonexistent/tools",
            Versions::parse(VERSIONS_ENV).expect("parse"),
        );
        let err = tools.kube_apiserver().expect_err("missing");
        let msg = err.to_string();
        assert!(msg.contains("/nonexistent/tools/kubernetes/v"), "{msg}");
        assert!(msg.contains("run hack/build-tools.sh"), "{msg}");
    }
}
