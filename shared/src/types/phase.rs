//! The lifecycle phase of a cluster, as its status names it: what the status, its lenient
//! reader ([`super::lenient`]) and its hand-written schema ([`super::schema`]) all know.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Lifecycle phase of a cluster.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ClusterPhase {
    /// The first members are being created.
    Creating,
    /// Every member is healthy and the cluster matches its spec.
    Running,
    /// Members are being added or removed.
    Scaling,
    /// Members are being moved to another version.
    Upgrading,
    /// A failed member is being replaced.
    Recovering,
    /// Quorum holds but some members are unhealthy and cannot be replaced now.
    Degraded,
    /// Fewer than a majority of members are healthy: the operator makes no change.
    QuorumLost,
    /// `spec.paused` is set: the operator makes no change.
    Paused,
    /// CoreOS' operator gave up on the cluster. Read from statuses CoreOS' operator wrote; this
    /// operator never writes it (it reports QuorumLost or Degraded, with a reason, instead).
    Failed,
}

impl ClusterPhase {
    /// Every phase this operator writes, for metrics that report clusters by phase
    /// ([`ClusterPhase::Failed`] is only read).
    pub const ALL: [ClusterPhase; 8] = [
        ClusterPhase::Creating,
        ClusterPhase::Running,
        ClusterPhase::Scaling,
        ClusterPhase::Upgrading,
        ClusterPhase::Recovering,
        ClusterPhase::Degraded,
        ClusterPhase::QuorumLost,
        ClusterPhase::Paused,
    ];

    /// Every phase the status may hold: [`ClusterPhase::ALL`] and CoreOS' `Failed`.
    pub const READABLE: [ClusterPhase; 9] = [
        ClusterPhase::Creating,
        ClusterPhase::Running,
        ClusterPhase::Scaling,
        ClusterPhase::Upgrading,
        ClusterPhase::Recovering,
        ClusterPhase::Degraded,
        ClusterPhase::QuorumLost,
        ClusterPhase::Paused,
        ClusterPhase::Failed,
    ];

    /// The phase as written in the status.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterPhase::Creating => "Creating",
            ClusterPhase::Running => "Running",
            ClusterPhase::Scaling => "Scaling",
            ClusterPhase::Upgrading => "Upgrading",
            ClusterPhase::Recovering => "Recovering",
            ClusterPhase::Degraded => "Degraded",
            ClusterPhase::QuorumLost => "QuorumLost",
            ClusterPhase::Paused => "Paused",
            ClusterPhase::Failed => "Failed",
        }
    }

    /// The phase a status string names; `None` for "" (CoreOS' "no phase yet") and for names
    /// this operator does not know.
    pub fn from_name(name: &str) -> Option<ClusterPhase> {
        ClusterPhase::READABLE
            .into_iter()
            .find(|p| p.as_str() == name)
    }

    /// Whether the phase says the cluster is failing: QuorumLost, Degraded or CoreOS' Failed.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            ClusterPhase::QuorumLost | ClusterPhase::Degraded | ClusterPhase::Failed
        )
    }
}
