//! Backups and restores of etcd clusters: CoreOS' `EtcdBackup` and `EtcdRestore` kinds, served
//! by this controller beside `EtcdCluster`.
//!
//! - [`integrity`]: etcd's snapshot hash, checked on every stream that passes.
//! - [`store`]: the S3 bucket a backup writes to or a restore reads from.
//! - [`transfer`]: snapshots to and from the bucket as streams, in constant memory.
//! - [`schedule`]: pure decisions (due or not, keys, retention, statuses).
//! - [`reconciler`]: the EtcdBackup reconciler.
//! - [`restore`]: the EtcdRestore reconciler.
//! - [`seed`]: the restore steps the seed member's init containers run.
//! - [`claim_files`], [`claim_command`], [`pod_report`]: snapshots as files in a
//!   PersistentVolumeClaim (storage type PVC), written and checked by pods that mount it
//!   (`etcd-controller backup save|verify`), which report in their termination message.
//! - [`claim_backup`], [`claim_restore`]: the controller's side of those pods.
//! - [`safety`]: the snapshot before a minor upgrade or a scale-down (`spec.safetyBackup`).
//! - [`recovery_source`]: the snapshot a recovery from permanent quorum loss starts from.
//! - [`metrics`]: the backup and restore series.
//! - [`outcomes`]: what both controllers do with their reconcile streams.

pub mod claim_backup;
pub mod claim_command;
pub mod claim_files;
pub mod claim_restore;
pub mod integrity;
pub mod metrics;
pub mod outcomes;
pub mod pod_report;
pub mod reconciler;
pub mod recovery_source;
pub mod restore;
pub mod safety;
pub mod schedule;
pub mod seed;
pub mod store;
pub mod transfer;
