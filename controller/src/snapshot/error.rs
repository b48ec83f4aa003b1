//! Why taking, locating or checking a snapshot of a cluster failed: for an EtcdBackup, an
//! EtcdRestore's check, a safety backup or a recovery's search alike (the backup controllers
//! wrap it in their [`BackupError`](crate::backup::error::BackupError)).

use std::time::Duration;

use etcd_shared::endpoints::EndpointError;

use super::encryption::EncryptionError;
use super::store::StoreError;
use super::transfer::TransferError;
use crate::error::Error;

/// Why a snapshot could not be taken, found or checked.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The endpoints name no cluster of the namespace.
    #[error("etcdEndpoints: {0}")]
    Endpoints(#[from] EndpointError),
    /// The cluster does not exist.
    #[error("EtcdCluster {0:?} not found in this namespace")]
    ClusterNotFound(String),
    /// The cluster's spec cannot be read.
    #[error("EtcdCluster {name:?} cannot be read: {reason}")]
    ClusterInvalid {
        /// The cluster.
        name: String,
        /// Why.
        reason: String,
    },
    /// No member answered.
    #[error("no member of {cluster:?} answered: {last}")]
    NoMember {
        /// The cluster.
        cluster: String,
        /// The last error, or why none was asked.
        last: String,
    },
    /// A Secret could not be read or used.
    #[error("secret {name:?}: {reason}")]
    Secret {
        /// The Secret.
        name: String,
        /// Why.
        reason: String,
    },
    /// A Secret's recipients or identity cannot be used.
    #[error("secret {name:?}: {source}")]
    Key {
        /// The Secret.
        name: String,
        /// Why.
        #[source]
        source: EncryptionError,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The snapshot could not be taken or written.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// An etcd or Kubernetes call failed.
    #[error(transparent)]
    Controller(#[from] Error),
    /// The whole backup took longer than `timeoutInSecond`.
    #[error("the backup took longer than its timeout of {0:?}")]
    Timeout(Duration),
    /// No snapshot of the cluster to recover from checks.
    #[error("no snapshot of the cluster to recover from: {0}")]
    NoSnapshot(String),
}

impl SnapshotError {
    /// A static label: the status reason, the Event reason and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            SnapshotError::Endpoints(_) => "BadEndpoints",
            SnapshotError::ClusterNotFound(_) => "ClusterNotFound",
            SnapshotError::ClusterInvalid { .. } => "ClusterInvalid",
            SnapshotError::NoMember { .. } => "NoMemberReachable",
            SnapshotError::Secret { .. } => "BadSecret",
            SnapshotError::Key { source, .. } => source.reason(),
            SnapshotError::Store(e) => e.reason(),
            SnapshotError::Transfer(e) => e.reason(),
            SnapshotError::Controller(_) => "ApiFailed",
            SnapshotError::Timeout(_) => "Timeout",
            SnapshotError::NoSnapshot(_) => "NoSnapshot",
        }
    }

    /// The cluster `name` cannot be read (its spec, or the etcd line it runs), for `reason`.
    pub fn invalid<E: std::fmt::Display>(
        name: impl Into<String>,
    ) -> impl FnOnce(E) -> SnapshotError {
        let name = name.into();
        move |reason| SnapshotError::ClusterInvalid {
            name,
            reason: reason.to_string(),
        }
    }

    /// Whether only a change of the spec (or of the objects it names) can fix it: reported
    /// and not retried on a timer.
    pub fn needs_spec_change(&self) -> bool {
        matches!(
            self,
            SnapshotError::Endpoints(_) | SnapshotError::Transfer(TransferError::BadKey { .. })
        ) || matches!(self, SnapshotError::Store(e) if e.needs_spec_change())
    }
}
