//! Reconciling `EtcdCluster`s, in three parts that each read on their own:
//! - [`runner`], the wiring: the kube-runtime Controller and its watches, readiness, retries,
//!   and what is kept per cluster until it is gone;
//! - [`pipeline`], one reconcile of one cluster: validate -> apply Services and budget ->
//!   observe -> plan one step -> carry it out -> status and events;
//! - [`steps`], carrying out the planner's step and recording it;
//! - [`recovery`], starting a recovery from permanent quorum loss (the snapshot it starts
//!   from, verified), and [`recovery_source`], where that snapshot comes from;
//! - [`safety`], the safety backups (`spec.safetyBackup`): the snapshot before a minor upgrade
//!   or a scale-down.
//!
//! Snapshots are taken, found and checked by [`crate::snapshot`]'s service
//! ([`crate::snapshot::cluster`]); nothing here uses the EtcdBackup and EtcdRestore controllers
//! ([`crate::backup`]).

mod network;
pub mod pipeline;
pub mod recovery;
pub mod recovery_source;
pub mod runner;
pub mod safety;
pub mod steps;

pub use pipeline::reconcile;
pub use runner::{WATCH_ERROR_HOLD, run_controller};
