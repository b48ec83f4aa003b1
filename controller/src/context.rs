//! What every reconcile shares: the client, the rules, the metrics, the event reporter.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::Reporter;

use etcd_shared::admission::{AdmissionPolicy, Defaults};

use crate::builders::OperatorImage;
use crate::metrics::Metrics;
use crate::planner::PlannerSettings;

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Version for clusters whose spec names none.
    pub default_version: String,
    /// Repository for clusters whose spec names none.
    pub default_repository: String,
    /// How long the planner waits for members, and when it defragments them.
    pub planner: PlannerSettings,
    /// Timeout of each etcd call.
    pub etcd_timeout: Duration,
    /// Requeue right after a change (its effect is not always visible through a watch,
    /// e.g. a member added through etcd's API).
    pub busy_requeue: Duration,
    /// Requeue while waiting for members (pod changes also trigger a reconcile).
    pub wait_requeue: Duration,
    /// Requeue of a settled cluster (periodic health check).
    pub idle_requeue: Duration,
    /// Image of the restore steps of a restored cluster's first member: the operator's own
    /// (`etcd-controller restore ...`). Without it, restores are refused.
    pub restore_image: Option<OperatorImage>,
    /// Where a test kills the controller mid-step (none unless a test arms them).
    pub failpoints: crate::failpoints::Failpoints,
    /// A deliberately broken operator, for the proof suite to show its checks catch one: the
    /// rule the switch names is broken. Off unless a test sets it.
    pub broken: Option<crate::failpoints::Broken>,
    /// Where the operator and the monitoring run (the members' NetworkPolicies).
    pub network: crate::builders::NetworkAccess,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            default_version: etcd_shared::version::DEFAULT_VERSION.into(),
            default_repository: etcd_shared::version::DEFAULT_REPOSITORY.into(),
            planner: PlannerSettings::default(),
            etcd_timeout: Duration::from_secs(3),
            busy_requeue: Duration::from_secs(1),
            wait_requeue: Duration::from_secs(10),
            idle_requeue: Duration::from_secs(30),
            restore_image: None,
            failpoints: crate::failpoints::Failpoints::default(),
            broken: None,
            network: crate::builders::NetworkAccess::default(),
        }
    }
}

impl ControllerConfig {
    /// The admission rules with this controller's defaults.
    pub fn policy(&self) -> AdmissionPolicy {
        AdmissionPolicy::new(Defaults {
            version: self.default_version.clone(),
            repository: self.default_repository.clone(),
            ..Defaults::default()
        })
    }
}

/// Shared state of all reconciles.
pub struct Context {
    /// Kubernetes client.
    pub client: kube::Client,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Who publishes events.
    pub reporter: Reporter,
    /// Settings.
    pub config: ControllerConfig,
}
