//! The status of a cluster, computed from what was observed and the step chosen: phase,
//! conditions (Available, Progressing, Degraded, Paused), members and versions.
//!
//! The fields CoreOS' clients read keep CoreOS' meaning: `targetVersion` is set only while an
//! upgrade is in progress, `controlPaused` is true while `spec.paused` is set, and `reason`
//! says in a word why the phase is a failure (and why a spec is not acted on), absent otherwise.
//! Nothing CoreOS' operator left in the status (phase Failed, its reason, its conditions) is
//! carried over: every field is computed anew.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use etcd_shared::names::{self, CLIENT_PORT};
use etcd_shared::types::{ClusterPhase, EtcdClusterStatus, MembersStatus, RestoredFrom};
use etcd_shared::version::EtcdVersion;

use crate::conditions;

use crate::planner::{Blocked, Health, MemberState, Observed, RemovalReason, Step, Waiting};
use crate::view::{ClusterView, InvalidCluster};

/// Condition types.
pub const AVAILABLE: &str = "Available";
/// The cluster is moving towards its spec.
pub const PROGRESSING: &str = "Progressing";
/// Something is wrong that the operator cannot fix now.
pub const DEGRADED: &str = "Degraded";
/// `spec.paused` is set.
pub const PAUSED: &str = "Paused";
/// Degraded reason (and status `reason`): member pods are Ready but etcd cannot be reached.
const MEMBERS_UNREACHABLE: &str = "MembersUnreachable";

/// A short description of a step, for the status and events.
pub fn describe(step: &Step) -> String {
    match step {
        Step::Bootstrap(p) => format!("create the first member {}", p.name),
        Step::AddMember { name, learner, .. } => {
            format!(
                "add member {name}{}",
                if *learner { " as a learner" } else { "" }
            )
        }
        Step::CreatePod(p) => format!("create the pod of member {}", p.name),
        Step::PromoteLearner { name, .. } => format!("promote learner {name} to voter"),
        Step::RemoveMember {
            name,
            reason: RemovalReason::ScaleDown,
            ..
        } => format!("remove member {name} (scale down)"),
        Step::RemoveMember {
            name,
            reason: RemovalReason::Replace,
            ..
        } => format!("remove member {name} to replace it"),
        Step::DeletePod(n) => format!("delete pod {n}"),
        Step::DeleteClaim(n) => format!("delete the data claim of {n}"),
        Step::UpgradeMember { name, version, .. } => format!("upgrade member {name} to {version}"),
        Step::TransferLeadership { from, to, .. } => {
            format!("hand leadership from {from} to {to} before upgrading {from}")
        }
        Step::Wait(Waiting::MemberStarting(n)) => format!("wait for member {n} to start"),
        Step::Wait(Waiting::Unhealthy(ns)) => {
            format!("wait for unhealthy members {} to recover", ns.join(", "))
        }
        Step::Wait(Waiting::LearnerCatchingUp(n)) => format!("wait for learner {n} to catch up"),
        Step::Wait(Waiting::MemberUpgrading(n)) => {
            format!("wait for member {n} to restart on the new version")
        }
        Step::RecordSnapshotBarrier { index } => format!(
            "record raft index {index} as the point the members must snapshot past before the upgrade (members created on etcd 3.4 or older wrote v2-format entries, which 3.7 cannot replay)"
        ),
        Step::Wait(Waiting::SnapshotBeforeUpgrade {
            members,
            entries_left,
        }) => format!(
            "wait for members {} to take a raft snapshot past the v2-format entries of etcd 3.4 and older before moving to a line that cannot replay them (about {entries_left} more applied entries; etcd snapshots every --snapshot-count entries)",
            members.join(", ")
        ),
        Step::Blocked(b) => blocked_message(b),
        Step::Done => String::new(),
    }
}

fn blocked_message(b: &Blocked) -> String {
    match b {
        Blocked::Paused => "spec.paused is set: no change is made".into(),
        Blocked::QuorumLost { missing, voters } => format!(
            "quorum lost: {} of {voters} voting members are unhealthy ({}); the operator makes no membership change until a majority is back",
            missing.len(),
            missing.join(", ")
        ),
        Blocked::AllMembersLost => "every member and its data is gone (members kept their data in emptyDirs); delete and recreate the EtcdCluster to start an empty cluster, or restore from a backup".into(),
        Blocked::UpgradeNotSupported(why) => format!("upgrade blocked: {why}"),
        Blocked::SafetyBackupFailed { change, reason } => format!(
            "{change} waits for its safety backup (spec.safetyBackup), which failed: {reason}"
        ),
    }
}

fn members_status(members: &[MemberState], expected: &[String]) -> MembersStatus {
    let mut s = MembersStatus::default();
    for m in members {
        if m.health.is_healthy() {
            s.ready.push(m.name.clone());
        } else {
            s.unready.push(m.name.clone());
        }
        if m.learner {
            s.learners.push(m.name.clone());
        }
    }
    for e in expected {
        if !members.iter().any(|m| &m.name == e) && !s.unready.contains(e) {
            s.unready.push(e.clone());
        }
    }
    s
}

fn min_version(members: &[MemberState]) -> Option<EtcdVersion> {
    members
        .iter()
        .filter_map(|m| match &m.health {
            Health::Healthy { version, .. } => *version,
            Health::Unhealthy(_) => None,
        })
        .min()
}

fn phase(obs: &Observed, step: &Step, previous: Option<ClusterPhase>) -> ClusterPhase {
    // A cluster is Creating until it first matches its spec.
    let creating = !obs.bootstrapped || matches!(previous, None | Some(ClusterPhase::Creating));
    match step {
        Step::Blocked(Blocked::Paused) => ClusterPhase::Paused,
        Step::Blocked(Blocked::QuorumLost { .. } | Blocked::AllMembersLost) if obs.bootstrapped => {
            ClusterPhase::QuorumLost
        }
        Step::Blocked(Blocked::UpgradeNotSupported(_) | Blocked::SafetyBackupFailed { .. }) => {
            ClusterPhase::Degraded
        }
        Step::Done => ClusterPhase::Running,
        _ if creating => ClusterPhase::Creating,
        // The snapshot barrier and the wait for the snapshots past it come before an
        // upgrade's first member moves: part of the upgrade, as Progressing says.
        Step::UpgradeMember { .. }
        | Step::TransferLeadership { .. }
        | Step::RecordSnapshotBarrier { .. }
        | Step::Wait(Waiting::MemberUpgrading(_) | Waiting::SnapshotBeforeUpgrade { .. }) => {
            ClusterPhase::Upgrading
        }
        Step::RemoveMember {
            reason: RemovalReason::Replace,
            ..
        } => ClusterPhase::Recovering,
        Step::Wait(Waiting::Unhealthy(_)) => ClusterPhase::Degraded,
        _ => ClusterPhase::Scaling,
    }
}

/// Why a failure phase (QuorumLost, Degraded) is one: the step that the failure blocks or waits
/// on, in a word.
fn failure_reason(phase: ClusterPhase, step: &Step) -> Option<String> {
    if !phase.is_failure() {
        return None;
    }
    let reason = match step {
        Step::Blocked(Blocked::QuorumLost { .. }) => "QuorumLost",
        Step::Blocked(Blocked::AllMembersLost) => "AllMembersLost",
        Step::Blocked(Blocked::UpgradeNotSupported(_)) => "UpgradeNotSupported",
        Step::Blocked(Blocked::SafetyBackupFailed { .. }) => "SafetyBackupFailed",
        Step::Wait(Waiting::Unhealthy(_)) => "MembersUnhealthy",
        _ => phase.as_str(),
    };
    Some(reason.to_string())
}

/// Whether an upgrade is in progress: a member is being moved, or the members do not all run
/// the spec's version yet (`current` is the oldest version a member runs).
fn upgrading(view: &ClusterView, step: &Step, current: Option<&str>) -> bool {
    let moving = matches!(
        step,
        Step::UpgradeMember { .. }
            | Step::TransferLeadership { .. }
            | Step::Wait(Waiting::MemberUpgrading(_))
    );
    moving
        || current
            .and_then(|v| v.parse::<EtcdVersion>().ok())
            .is_some_and(|v| v != view.version)
}

/// The status of a reconciled cluster.
pub fn compute(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let now = Time(now);
    let generation = view.generation;
    let members = obs.members.as_ref().ok();
    let voters: Vec<&MemberState> = members
        .map(|m| m.iter().filter(|m| !m.learner).collect())
        .unwrap_or_default();
    let healthy_voters = voters.iter().filter(|m| m.health.is_healthy()).count();
    let available = members.is_some()
        && !voters.is_empty()
        && healthy_voters >= ClusterView::quorum(voters.len());
    let ready = members.map_or(0, |m| m.iter().filter(|m| m.health.is_healthy()).count());
    let previous_phase = previous.and_then(|s| s.phase);

    let available_reason = match (&obs.members, available) {
        (_, true) => (
            "QuorumHealthy",
            format!(
                "{healthy_voters} of {} voting members are healthy",
                voters.len()
            ),
        ),
        (Err(e), false) if !obs.bootstrapped => (
            "Bootstrapping",
            format!("the first member is starting ({e})"),
        ),
        (Err(e), false) => (
            "MembersUnreachable",
            format!("the member list cannot be read: {e}"),
        ),
        (Ok(_), false) => (
            "QuorumLost",
            format!(
                "only {healthy_voters} of {} voting members are healthy",
                voters.len()
            ),
        ),
    };
    let unhealthy: Vec<String> = members
        .map(|m| {
            m.iter()
                .filter(|m| !m.health.is_healthy() && m.started)
                .map(|m| m.name.clone())
                .collect()
        })
        .unwrap_or_default();
    // Pods the kubelet reports Ready while the operator cannot read the member list: its
    // client certificate or the members' server certificates do not work together, or the
    // operator cannot reach the pod network. Said as such instead of "all healthy".
    let unreachable = match &obs.members {
        Err(e) if obs.pods.iter().any(|p| p.ready) => Some(format!(
            "member pods are Ready but the operator cannot read the member list: {e}"
        )),
        _ => None,
    };
    let (degraded, degraded_reason, degraded_message) = match step {
        Step::Blocked(Blocked::QuorumLost { .. }) if obs.bootstrapped => {
            (true, "QuorumLost", describe(step))
        }
        Step::Blocked(Blocked::AllMembersLost) => (true, "AllMembersLost", describe(step)),
        Step::Blocked(Blocked::UpgradeNotSupported(_)) => {
            (true, "UpgradeNotSupported", describe(step))
        }
        Step::Blocked(Blocked::SafetyBackupFailed { .. }) => {
            (true, "SafetyBackupFailed", describe(step))
        }
        _ if unreachable.is_some() => (
            true,
            MEMBERS_UNREACHABLE,
            unreachable.clone().unwrap_or_default(),
        ),
        _ if !unhealthy.is_empty() => (
            true,
            "MembersUnhealthy",
            format!("unhealthy members: {}", unhealthy.join(", ")),
        ),
        _ => (false, "AsExpected", "all members are healthy".to_string()),
    };
    let progressing = step.is_change() || matches!(step, Step::Wait(_));
    let progressing_reason = match step {
        Step::Bootstrap(_) => "Bootstrapping",
        Step::AddMember { .. } | Step::PromoteLearner { .. } | Step::CreatePod(_) => "ScalingUp",
        Step::RemoveMember {
            reason: RemovalReason::ScaleDown,
            ..
        }
        | Step::DeletePod(_)
        | Step::DeleteClaim(_) => "ScalingDown",
        Step::RemoveMember {
            reason: RemovalReason::Replace,
            ..
        } => "ReplacingMember",
        Step::UpgradeMember { .. }
        | Step::TransferLeadership { .. }
        | Step::RecordSnapshotBarrier { .. }
        | Step::Wait(Waiting::MemberUpgrading(_))
        | Step::Wait(Waiting::SnapshotBeforeUpgrade { .. }) => "Upgrading",
        Step::Wait(_) => "WaitingForMembers",
        Step::Blocked(Blocked::Paused) => "Paused",
        Step::Blocked(_) => "Blocked",
        Step::Done => "Reconciled",
    };
    let progressing_message = match step {
        Step::Done => "the cluster matches its spec".to_string(),
        _ => format!("next: {}", describe(step)),
    };
    let mut conditions = vec![
        conditions::new(
            AVAILABLE,
            available,
            available_reason.0,
            available_reason.1,
            generation,
            &now,
        ),
        conditions::new(
            PROGRESSING,
            progressing,
            progressing_reason,
            progressing_message,
            generation,
            &now,
        ),
        conditions::new(
            DEGRADED,
            degraded,
            degraded_reason,
            degraded_message,
            generation,
            &now,
        ),
        conditions::new(
            PAUSED,
            view.paused,
            if view.paused {
                "PausedBySpec"
            } else {
                "NotPaused"
            },
            if view.paused {
                "spec.paused is set: the operator makes no change".into()
            } else {
                "the operator manages the cluster".into()
            },
            generation,
            &now,
        ),
    ];
    if let Some(prev) = previous {
        conditions::carry_transition_times(&mut conditions, &prev.conditions);
    }
    let expected: Vec<String> = obs.pods.iter().map(|p| p.name.clone()).collect();
    let phase = phase(obs, step, previous_phase);
    let current_version = members
        .and_then(|m| min_version(m))
        .map(|v| v.to_string())
        .or_else(|| previous.and_then(|s| s.current_version.clone()));
    let target_version =
        upgrading(view, step, current_version.as_deref()).then(|| view.version.to_string());
    EtcdClusterStatus {
        phase: Some(phase),
        reason: failure_reason(phase, step)
            .or_else(|| (degraded_reason == MEMBERS_UNREACHABLE).then(|| degraded_reason.into())),
        control_paused: view.paused,
        conditions,
        observed_generation: generation,
        size: members
            .map(|m| i32::try_from(m.len()).unwrap_or(i32::MAX))
            .or(previous.and_then(|s| s.size)),
        ready_members: Some(i32::try_from(ready).unwrap_or(i32::MAX)),
        current_version,
        target_version,
        members: Some(members.map_or_else(
            || MembersStatus {
                unready: expected.clone(),
                ..MembersStatus::default()
            },
            |m| members_status(m, &expected),
        )),
        service_name: Some(names::client_service_name(&view.name)),
        client_port: Some(CLIENT_PORT),
        next_step: Some(describe(step)).filter(|s| !s.is_empty()),
        restored_from: view.seed.as_ref().map(|seed| RestoredFrom {
            restore: seed.restore.clone(),
            path: seed.source.path().unwrap_or_default().to_string(),
            revision: seed.revision,
            sha256: seed.sha256.clone(),
            etcd_version: seed.etcd_version.clone(),
        }),
        // Written by the pipeline when it takes one; kept until the next.
        last_safety_backup: previous.and_then(|p| p.last_safety_backup.clone()),
    }
}

/// The status of a cluster whose spec is invalid: Degraded with the violations and the reason
/// InvalidSpec, nothing else changed.
pub fn invalid(
    error: &InvalidCluster,
    generation: Option<i64>,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let now = Time(now);
    let mut status = previous.cloned().unwrap_or_default();
    let mut conditions = vec![
        conditions::new(
            DEGRADED,
            true,
            "InvalidSpec",
            error.to_string(),
            generation,
            &now,
        ),
        conditions::new(
            PROGRESSING,
            false,
            "InvalidSpec",
            "the spec must be fixed before the operator acts".into(),
            generation,
            &now,
        ),
    ];
    conditions::carry_transition_times(&mut conditions, &status.conditions);
    status
        .conditions
        .retain(|c| c.type_ != DEGRADED && c.type_ != PROGRESSING);
    status.conditions.extend(conditions);
    status.observed_generation = generation;
    status.reason = Some("InvalidSpec".into());
    status
}

/// A JSON merge patch of the status subresource that removes what the stored status holds and
/// `new` does not set, or `None` when there is nothing. Server-side apply removes only fields
/// its own field manager applied before, so what CoreOS' operator (or anyone else) wrote with
/// an update stays next to this controller's status: a `controlPaused: true`, a `reason`, a
/// `targetVersion` or old member names. Sending this patch after the apply clears them.
pub fn stale_fields(new: &EtcdClusterStatus, stored: &EtcdClusterStatus) -> Option<Value> {
    let (Ok(new), Ok(stored)) = (serde_json::to_value(new), serde_json::to_value(stored)) else {
        return None;
    };
    let removed = removed_fields(&new, &stored);
    (!removed.is_empty()).then(|| json!({ "status": removed }))
}

/// The fields of `stored` that `new` lacks, as merge-patch nulls, nested objects included.
fn removed_fields(new: &Value, stored: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let (Some(new), Some(stored)) = (new.as_object(), stored.as_object()) else {
        return out;
    };
    for (key, old) in stored {
        match new.get(key) {
            None => {
                out.insert(key.clone(), Value::Null);
            }
            Some(now) => {
                let inner = removed_fields(now, old);
                if !inner.is_empty() {
                    out.insert(key.clone(), Value::Object(inner));
                }
            }
        }
    }
    out
}

/// Whether a newly computed status says anything the old one does not.
pub fn changed(new: &EtcdClusterStatus, old: Option<&EtcdClusterStatus>) -> bool {
    old != Some(new)
}

#[cfg(test)]
mod tests;
