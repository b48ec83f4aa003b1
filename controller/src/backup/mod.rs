//! The EtcdBackup and EtcdRestore controllers (CoreOS' kinds, served by this controller beside
//! `EtcdCluster`), and the snapshots the EtcdCluster controller takes or reads for them. Taking
//! and checking snapshots is [`crate::snapshot`]'s; what the operator's image runs inside other
//! pods is [`crate::in_pod`]'s.
//!
//! - [`schedule`]: pure decisions (due or not, keys, retention, statuses).
//! - [`reconciler`]: the EtcdBackup reconciler.
//! - [`restore`]: the EtcdRestore reconciler.
//! - [`claim_backup`], [`claim_restore`]: the controller's side of the pods that write and check
//!   snapshots in a PersistentVolumeClaim (storage type PVC); [`one_shot_pod`]: the lifecycle
//!   of those pods, the same for both.
//! - [`safety`]: the snapshot before a minor upgrade or a scale-down (`spec.safetyBackup`).
//! - [`recovery_source`]: the snapshot a recovery from permanent quorum loss starts from.

pub mod claim_backup;
pub mod claim_restore;
pub mod one_shot_pod;
pub mod reconciler;
pub mod recovery_source;
pub mod restore;
pub mod safety;
pub mod schedule;
