//! The admin kubeconfig (client certificate, embedded CA) and a `kube::Client` built from it.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use kube::config::{
    AuthInfo, Cluster, Context, KubeConfigOptions, Kubeconfig, NamedAuthInfo, NamedCluster,
    NamedContext,
};
use secrecy::SecretString;

use crate::pki::IssuedCert;

/// Name of the cluster, user and context in the generated kubeconfig.
pub const CONTEXT_NAME: &str = "etcd-operator-test";

/// Errors while writing or loading a kubeconfig.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// Serializing to YAML failed.
    #[error("serializing kubeconfig: {0}")]
    Serialize(#[from] serde_yaml::Error),
    /// Writing the file failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The kubeconfig path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// kube rejected the kubeconfig.
    #[error("loading kubeconfig: {0}")]
    Load(#[from] kube::config::KubeconfigError),
    /// Building the client failed.
    #[error("building kube client: {0}")]
    Client(#[from] kube::Error),
}

/// A kubeconfig for `server` trusting `ca_pem` and authenticating with `client` (all embedded, so
/// the file works from any directory).
pub fn build(server: &str, ca_pem: &str, client: &IssuedCert) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: CONTEXT_NAME.into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority_data: Some(STANDARD.encode(ca_pem)),
                ..Cluster::default()
            }),
            ..NamedCluster::default()
        }],
        auth_infos: vec![NamedAuthInfo {
            name: CONTEXT_NAME.into(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(STANDARD.encode(&client.cert_pem)),
                client_key_data: Some(SecretString::from(STANDARD.encode(&client.key_pem))),
                ..AuthInfo::default()
            }),
            ..NamedAuthInfo::default()
        }],
        contexts: vec![NamedContext {
            name: CONTEXT_NAME.into(),
            context: Some(Context {
                cluster: CONTEXT_NAME.into(),
                user: Some(CONTEXT_NAME.into()),
                ..Context::default()
            }),
            ..NamedContext::default()
        }],
        current_context: Some(CONTEXT_NAME.into()),
        kind: Some("Config".into()),
        api_version: Some("v1".into()),
        ..Kubeconfig::default()
    }
}

/// Writes `kubeconfig` as YAML to `path`.
pub fn write(kubeconfig: &Kubeconfig, path: &Path) -> Result<(), KubeconfigError> {
    let yaml = serde_yaml::to_string(kubeconfig)?;
    std::fs::write(path, yaml).map_err(|source| KubeconfigError::Write {
        path: path.to_owned(),
        source,
    })
}

/// A `kube::Client` for `kubeconfig`'s current context. Must be called inside a tokio runtime.
pub async fn client(kubeconfig: Kubeconfig) -> Result<kube::Client, KubeconfigError> {
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(config)?)
}
