//! What the operator's image runs inside pods other than the controller's, dispatched by
//! `etcd-controller`'s subcommands ([`Subcommand`]):
//!
//! - [`seed`]: `etcd-controller restore fetch|place`, the init containers of a restored
//!   cluster's first member.
//! - [`claim_command`]: `etcd-controller backup save|verify`, the pods that mount a claim for a
//!   backup or a restore of storage type PVC; [`claim_files`] is their file layout, and
//!   [`pod_report`] the report they leave in their termination message for the controller.

pub mod claim_command;
pub mod claim_files;
pub mod pod_report;
pub mod seed;

/// `etcd-controller`'s subcommands: the steps its image runs in other pods.
#[derive(Debug, clap::Subcommand)]
pub enum Subcommand {
    /// The steps of seeding a restored etcd member (run by the operator as init containers).
    Restore(seed::RestoreCommand),
    /// Snapshots in a PersistentVolumeClaim (run by the operator in pods that mount it).
    Backup(claim_command::BackupCommand),
}
