//! The settings of the EtcdBackup controller.

use std::time::Duration;

use etcd_shared::admission::{AdmissionPolicy, Defaults};

use crate::builders::OperatorImage;
use crate::snapshot::store::StoreTimeouts;

/// Settings of the backup reconciler.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    /// Timeout of each etcd call but the snapshot.
    pub etcd_timeout: Duration,
    /// Store timeouts and retries.
    pub store: StoreTimeouts,
    /// First retry delay after a failure (doubling up to `max_backoff`).
    pub base_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// The rules the cluster's spec is read with.
    pub policy: AdmissionPolicy,
    /// The operator's image, for the pods of PVC backups (the controller's `--restore-image`).
    pub image: Option<OperatorImage>,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            etcd_timeout: Duration::from_secs(3),
            store: StoreTimeouts::default(),
            base_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            policy: AdmissionPolicy::new(Defaults::default()),
            image: None,
        }
    }
}
