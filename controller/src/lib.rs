//! The etcd operator's controller: reconciles each `EtcdCluster` into the Kubernetes objects
//! and etcd membership changes that make it real, and reports status and events.
//!
//! Reconcile is a pipeline: fetch and validate ([`view::ClusterView`]), observe pods,
//! claims and etcd members ([`observe`]), decide the single next step with a pure planner
//! ([`planner`]), apply the desired objects with server-side apply and carry out the step
//! ([`reconcile`]), then write the status ([`status`]).
//!
//! Listen addresses, durations, logging, signals and the admin servers are the process shell
//! shared with the webhook ([`etcd_process`]).

#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod args;
pub mod backoff;
pub mod backup;
pub mod builders;
pub mod cache;
pub mod certificates;
pub mod conditions;
pub mod context;
pub mod controller_loop;
pub mod controllers;
pub mod error;
pub mod etcd;
pub mod etcd_tls;
pub mod events;
pub mod failpoints;
pub mod idempotent;
pub mod in_pod;
pub mod installed_crds;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod object_key;
pub mod observe;
pub mod planner;
pub mod reconcile;
pub mod snapshot;
pub mod status;
pub mod status_writer;
pub mod view;
