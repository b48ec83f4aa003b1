//! Why an EtcdBackup or an EtcdRestore failed: what only the backup controllers do (a storage
//! source, the operator's image, the pod that mounts a claim), or the snapshot itself
//! ([`SnapshotError`]).

use kube::runtime::controller::Action;

use etcd_shared::endpoints::EndpointError;

use crate::error::Error;
use crate::snapshot::error::SnapshotError;
use crate::snapshot::segments::SegmentError;
use crate::snapshot::store::StoreError;
use crate::snapshot::transfer::TransferError;

/// Why a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The source matching the storage type is missing.
    #[error("the storage source matching the storage type is missing")]
    NoSource,
    /// A PVC backup or restore needs a pod of the operator's image, and none is configured.
    #[error(
        "the controller runs without --restore-image (the chart sets it), so it cannot start the pod that mounts the claim"
    )]
    NoImage,
    /// `spec.encryption` with storage type PVC (the webhook refuses it; a spec that got past it
    /// is refused here, before anything is written).
    #[error(
        "spec.encryption is supported for object stores only (S3, ABS, GCS), not PVC: nothing was written"
    )]
    EncryptedPvc,
    /// The pod that mounts the claim failed: its reason and message.
    #[error("the pod mounting the claim failed: {1}")]
    Pod(&'static str, String),
    /// The snapshot could not be taken, found or checked (the cluster, its members, a Secret,
    /// the store, the transfer, a timeout).
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    /// A restore to a revision (`spec.toRevision`): no snapshot and segments reach it.
    #[error(transparent)]
    PointInTime(#[from] SegmentError),
    /// A restore to a revision: writing the segments' changes again into the restored cluster
    /// failed (retried from the start: a put or a delete written twice ends the same).
    #[error("replaying the continuous backup into the restored cluster: {0}")]
    Replay(String),
}

impl From<EndpointError> for BackupError {
    fn from(e: EndpointError) -> Self {
        BackupError::Snapshot(e.into())
    }
}

impl From<StoreError> for BackupError {
    fn from(e: StoreError) -> Self {
        BackupError::Snapshot(e.into())
    }
}

impl From<TransferError> for BackupError {
    fn from(e: TransferError) -> Self {
        BackupError::Snapshot(e.into())
    }
}

impl From<Error> for BackupError {
    fn from(e: Error) -> Self {
        BackupError::Snapshot(e.into())
    }
}

impl BackupError {
    /// A static label: the status reason, the Event reason and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            BackupError::NoSource => "UnsupportedStorage",
            BackupError::NoImage => "NoRestoreImage",
            BackupError::EncryptedPvc => "UnsupportedStorage",
            BackupError::Pod(reason, _) => reason,
            BackupError::Snapshot(e) => e.reason(),
            BackupError::PointInTime(e) => match e {
                SegmentError::Format(_) => "SegmentDamaged",
                SegmentError::NoBase { .. } => "NoBaseSnapshot",
                SegmentError::Gap { .. } => "ContinuousGap",
                SegmentError::Short { .. } | SegmentError::TimeNotStreamed(_) => {
                    "RevisionNotStreamed"
                }
                SegmentError::BadTime(_) => "InvalidTime",
            },
            BackupError::Replay(_) => "ReplayFailed",
        }
    }

    /// The cluster `name` cannot be read (its spec, or the etcd line it runs), for `reason`.
    pub fn invalid<E: std::fmt::Display>(name: impl Into<String>) -> impl FnOnce(E) -> BackupError {
        let invalid = SnapshotError::invalid(name);
        move |reason| BackupError::Snapshot(invalid(reason))
    }

    /// What a reconcile that failed with it returns: a wait for a change of the spec when only
    /// that can fix it ([`BackupError::needs_spec_change`]), else the error (retried).
    pub fn into_action(self) -> Result<Action, BackupError> {
        if self.needs_spec_change() {
            Ok(Action::await_change())
        } else {
            Err(self)
        }
    }

    /// Whether only a change of the spec (or of the objects it names) can fix it: reported
    /// and not retried on a timer.
    pub fn needs_spec_change(&self) -> bool {
        match self {
            BackupError::NoSource | BackupError::NoImage | BackupError::EncryptedPvc => true,
            BackupError::Pod(..) | BackupError::Replay(_) => false,
            BackupError::Snapshot(e) => e.needs_spec_change(),
            // A revision not yet streamed may be soon; the rest is what the store holds.
            BackupError::PointInTime(e) => !matches!(
                e,
                SegmentError::Short { .. } | SegmentError::TimeNotStreamed(_)
            ),
        }
    }
}
