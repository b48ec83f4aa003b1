//! What the planner sees: the observed pods, claims and etcd members of one cluster.

use std::time::Duration;

use etcd_shared::version::EtcdVersion;

/// A member pod as observed in the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodState {
    /// Pod (and member) name.
    pub name: String,
    /// Version the pod's image runs (from its version label).
    pub version: Option<EtcdVersion>,
    /// The pod's etcd image.
    pub image: String,
    /// The etcd container's restart count (`containerStatuses`; 0 before the kubelet
    /// reports it).
    pub restarts: i32,
    /// The restart count recorded when the operator last changed the image, if it did.
    pub restarts_at_upgrade: Option<i32>,
    /// `status.phase`.
    pub phase: PodPhase,
    /// The Ready condition.
    pub ready: bool,
    /// `status.podIP`.
    pub ip: Option<String>,
    /// The pod has a deletion timestamp.
    pub terminating: bool,
    /// Time since the pod was created.
    pub age: Duration,
    /// The version the pod was created with (`None`: made by an earlier operator).
    pub created_on: Option<EtcdVersion>,
    /// The raft index recorded as the cluster's snapshot barrier, if one was.
    pub snapshot_barrier: Option<u64>,
}

impl PodState {
    /// The operator changed the image and the kubelet has not yet reported the container
    /// restarted on it: the pod's Ready condition still describes the old container.
    pub fn restart_pending(&self) -> bool {
        self.restarts_at_upgrade
            .is_some_and(|before| self.restarts <= before)
    }
}

/// `status.phase` of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// Not running yet.
    Pending,
    /// Running (containers may still restart).
    Running,
    /// Ended: the pod will not run again (an evicted pod, say).
    Ended,
    /// Unknown (node lost).
    Unknown,
}

impl PodPhase {
    /// Parses a pod's phase.
    pub fn parse(phase: Option<&str>) -> Self {
        match phase {
            Some("Running") => PodPhase::Running,
            Some("Succeeded" | "Failed") => PodPhase::Ended,
            Some("Unknown") => PodPhase::Unknown,
            _ => PodPhase::Pending,
        }
    }
}

/// Health of one member, as its own endpoint reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// The member answers and has a leader.
    Healthy {
        /// Version the member reports.
        version: Option<EtcdVersion>,
        /// The member is the raft leader.
        leader: bool,
    },
    /// The member did not answer or has no leader.
    Unhealthy(String),
}

impl Health {
    /// Whether the member is healthy.
    pub fn is_healthy(&self) -> bool {
        matches!(self, Health::Healthy { .. })
    }
}

/// A member of the etcd member list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    /// etcd's member ID.
    pub id: u64,
    /// Member name, derived from its peer URL (unstarted members have no name in etcd).
    pub name: String,
    /// The member is a learner (non-voting).
    pub learner: bool,
    /// The member has started at least once (etcd knows its name).
    pub started: bool,
    /// Its health.
    pub health: Health,
    /// The raft index it has applied (0 when unknown: etcd 3.2/3.3 do not report it).
    pub applied_index: u64,
}

/// Everything observed of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// Member pods.
    pub pods: Vec<PodState>,
    /// Members that have a data claim.
    pub claims: Vec<String>,
    /// The member list, or why it could not be read.
    pub members: Result<Vec<MemberState>, String>,
    /// The status records a member list read before: the cluster exists (or existed).
    pub bootstrapped: bool,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            pods: Vec::new(),
            claims: Vec::new(),
            members: Err("member list not read".into()),
            bootstrapped: false,
        }
    }
}

impl Observed {
    /// The pod of a member.
    pub fn pod(&self, name: &str) -> Option<&PodState> {
        self.pods.iter().find(|p| p.name == name)
    }

    /// Whether a member has a data claim.
    pub fn has_claim(&self, name: &str) -> bool {
        self.claims.iter().any(|c| c == name)
    }
}
