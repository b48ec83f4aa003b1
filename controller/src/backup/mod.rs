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
//! - [`safety`]: the snapshot before a minor upgrade or a scale-down (`spec.safetyBackup`).
//! - [`metrics`]: the backup and restore series.
//! - [`outcomes`]: what both controllers do with their reconcile streams.

pub mod integrity;
pub mod metrics;
pub mod outcomes;
pub mod reconciler;
pub mod restore;
pub mod safety;
pub mod schedule;
pub mod seed;
pub mod store;
pub mod transfer;
