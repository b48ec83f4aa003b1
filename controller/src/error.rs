//! The reconciler's errors. Each variant has a static label for metrics.

use etcd_shared::names;

/// Why a reconcile failed. All are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API {action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An etcd member API call failed.
    #[error("etcd {action}: {source}")]
    Etcd {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The operator's client certificate Secret is missing or incomplete.
    #[error("operator TLS secret {secret}: {reason}")]
    OperatorTls {
        /// Secret name.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// An object could not be serialized.
    #[error("serializing {what}: {source}")]
    Serialize {
        /// What.
        what: &'static str,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A static label for the `reconcile_errors_total{error}` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::Etcd { .. } => "etcd",
            Error::OperatorTls { .. } => "operator_tls",
            Error::Serialize { .. } => "serialize",
        }
    }

    /// Wraps a Kubernetes error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// Wraps an etcd error with what was being done.
    pub fn etcd(action: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
        let action = action.into();
        move |source| Error::Etcd { action, source }
    }
}

/// The field manager of the operator's server-side applies.
pub const FIELD_MANAGER: &str = names::FIELD_MANAGER;
