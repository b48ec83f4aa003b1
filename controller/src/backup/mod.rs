//! The EtcdBackup and EtcdRestore controllers (CoreOS' kinds, served by this controller beside
//! `EtcdCluster`). Taking, locating and checking snapshots is [`crate::snapshot`]'s (the
//! EtcdCluster side's own snapshots, its safety backups and a recovery's source, are
//! [`crate::reconcile`]'s); what the operator's image runs inside other pods is
//! [`crate::in_pod`]'s.
//!
//! - [`schedule`]: pure decisions (due or not, keys, retention, statuses).
//! - [`reconciler`]: the EtcdBackup reconciler; [`config`]: its settings.
//! - [`continuous`]: continuous backup between snapshots (`spec.continuous`), one task per
//!   EtcdBackup.
//! - [`restore`]: the EtcdRestore reconciler.
//! - [`error`]: why a backup or a restore failed.
//! - [`verify`]: verified backups (`spec.verify`): reading a snapshot back and checking it;
//!   [`scratch`]: the scratch member it is restored into and compared with the source on.
//! - [`claim_backup`], [`claim_restore`]: the controller's side of the pods that write and check
//!   snapshots in a PersistentVolumeClaim (storage type PVC); [`one_shot_pod`]: the lifecycle
//!   of those pods, the same for both.

pub mod claim_backup;
pub mod claim_restore;
pub mod config;
pub mod continuous;
pub mod error;
pub mod one_shot_pod;
pub mod reconciler;
pub mod restore;
pub mod schedule;
pub mod scratch;
pub mod verify;
