//! Reconciling `EtcdCluster`s, in three parts that each read on their own:
//! - [`runner`], the wiring: the kube-runtime Controller and its watches, readiness, retries,
//!   and what is kept per cluster until it is gone;
//! - [`pipeline`], one reconcile of one cluster: validate -> apply Services and budget ->
//!   observe -> plan one step -> carry it out -> status and events;
//! - [`steps`], carrying out the planner's step and recording it;
//! - [`recovery`], starting a recovery from permanent quorum loss (the snapshot it starts
//!   from, verified).

mod network;
pub mod pipeline;
pub mod recovery;
pub mod runner;
pub mod steps;

pub use pipeline::reconcile;
pub use runner::{WATCH_ERROR_HOLD, run_controller};
