//! The status of a cluster, computed from what was observed and the step chosen: phase,
//! conditions (Available, Progressing, Degraded, Paused), members and versions.
//!
//! The fields CoreOS' clients read keep CoreOS' meaning: `targetVersion` is set only while an
//! upgrade is in progress, `controlPaused` is true while `spec.paused` is set, and `reason`
//! says in a word why the phase is a failure (and why a spec is not acted on), absent otherwise.
//! Nothing CoreOS' operator left in the status (phase Failed, its reason, its conditions) is
//! carried over: every field is computed anew.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use etcd_shared::names::{self, CLIENT_PORT};
use etcd_shared::types::{ClusterPhase, EtcdClusterStatus, MembersStatus, RestoredFrom};
use etcd_shared::version::EtcdVersion;

use crate::conditions::{self, Stamp};

use crate::planner::{
    Blocked, DefragReason, Handover, Health, MemberState, Observed, RecoverFrom, RemovalReason,
    Step, Waiting,
};
use crate::view::{ClusterView, InvalidCluster};

/// Condition types.
pub const AVAILABLE: &str = "Available";
/// The cluster is moving towards its spec.
pub const PROGRESSING: &str = "Progressing";
/// Something is wrong that the operator cannot fix now.
pub const DEGRADED: &str = "Degraded";
/// `spec.paused` is set.
pub const PAUSED: &str = "Paused";
/// Every member's pod runs on a node of its own (losing one node loses one member).
pub const SPREAD: &str = "MembersSpread";
/// Degraded reason (and status `reason`): member pods are Ready but etcd cannot be reached.
const MEMBERS_UNREACHABLE: &str = "MembersUnreachable";
/// A member pod this long past its deletion deadline is reported as stuck terminating.
const STUCK_REPORT_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

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
        Step::RemoveMember { name, reason, .. } => describe_removal(name, *reason),
        Step::RestartBootstrap(name) => format!(
            "start the cluster over: the first member {name} never became ready; its pod and data claim are deleted and a new first member is created"
        ),
        Step::Compact { revision } => {
            format!("compact the key-value history to revision {revision} to make room (NOSPACE)")
        }
        Step::Defragment { name, reason } => match reason {
            DefragReason::NoSpace => format!("defragment member {name} to make room (NOSPACE)"),
            DefragReason::Fragmented => format!(
                "defragment member {name}: its database file is much larger than the data it holds"
            ),
        },
        Step::TakeSafetyBackup { change, .. } => {
            format!("take the safety backup (spec.safetyBackup) before {change}")
        }
        Step::StartRecovery { from, lost } => format!(
            "recover from permanent quorum loss ({} lost their data): take the snapshot of {}, verify it, then replace the cluster with one seeded from it",
            lost.join(", "),
            match from {
                RecoverFrom::Member { name, raft_index } =>
                    format!("member {name} (raft index {raft_index})"),
                RecoverFrom::Backup => "the newest backup of the cluster that checks".into(),
            }
        ),
        Step::FinishRecovery => {
            "finish the recovery: the recovered cluster runs and the lost one is removed".into()
        }
        Step::AbortRecovery { why } => format!(
            "stop the recovery: the cluster it was replacing was not lost ({why}); the recovery record is dropped and the cluster is operated as before"
        ),
        Step::DisarmAlarm(alarms) => format!(
            "disarm the NOSPACE alarm ({}): the members have room again",
            alarms
                .iter()
                .map(|a| a.member.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Step::DeletePod(n) => format!("delete pod {n}"),
        Step::DeleteClaim(n) => format!("delete the data claim of {n}"),
        Step::UpgradeMember { name, version, .. } => format!("upgrade member {name} to {version}"),
        Step::TransferLeadership {
            from, to, before, ..
        } => describe_handover(from, to, *before),
        Step::SetServing { name, serving } => {
            if *serving {
                format!("put member {name} back into the client Service: it serves again")
            } else {
                format!(
                    "take member {name} out of the client Service before it is taken down (its serving gate set False)"
                )
            }
        }
        Step::RecordSnapshotBarrier { index } => format!(
            "record raft index {index} as the point the members must snapshot past before the upgrade (members created on etcd 3.4 or older wrote v2-format entries, which 3.7 cannot replay)"
        ),
        Step::Wait(w) => describe_wait(w),
        Step::Blocked(b) => blocked_message(b),
        Step::Done => String::new(),
    }
}

/// A removal of member `name` for `reason`, in words.
fn describe_removal(name: &str, reason: RemovalReason) -> String {
    match reason {
        RemovalReason::ScaleDown => format!("remove member {name} (scale down)"),
        RemovalReason::Replace => format!("remove member {name} to replace it"),
        RemovalReason::StuckTerminating => format!(
            "remove member {name}, whose pod is stuck terminating past its grace period, to replace it under a new name"
        ),
        RemovalReason::Adopted => format!(
            "remove member {name} of CoreOS' operator (this operator's members hold its data); its pod is deleted once it is out of the member list"
        ),
        RemovalReason::Rollout => format!(
            "remove member {name}, made with TLS files it must no longer use (a member made with the current ones took its place)"
        ),
    }
}

/// A leadership handover from `from` to `to` before what `before` says, in words.
fn describe_handover(from: &str, to: &str, before: Handover) -> String {
    match before {
        Handover::Upgrade => {
            format!("hand leadership from {from} to {to} before upgrading {from}")
        }
        Handover::Removal => format!(
            "hand leadership from {from} to {to} before removing {from}, the last member of CoreOS' operator"
        ),
        Handover::Rollout => format!(
            "hand leadership from {from} to {to} before removing {from}, made with TLS files it must no longer use"
        ),
    }
}

/// What the planner waits for, in words.
fn describe_wait(wait: &Waiting) -> String {
    match wait {
        Waiting::MemberStarting(n) => format!("wait for member {n} to start"),
        Waiting::MemberPending(n) => format!(
            "wait for the pod of member {n}, which is Pending (being scheduled, pulling its image or running its init containers)"
        ),
        Waiting::PodTerminating(n) => format!("wait for pod {n} to terminate"),
        Waiting::Unhealthy(ns) => {
            format!("wait for unhealthy members {} to recover", ns.join(", "))
        }
        Waiting::LearnerCatchingUp(n) => format!("wait for learner {n} to catch up"),
        Waiting::MemberUpgrading(n) => {
            format!("wait for member {n} to restart on the new version")
        }
        Waiting::LeavingService(n) => format!(
            "wait until the client Service no longer sends clients to member {n} before taking it down"
        ),
        Waiting::DisruptionBudget(n) => format!(
            "wait for the disruption budget to allow taking member {n} down (it allows none now: a drain is evicting a member, or a member is not Ready)"
        ),
        Waiting::SnapshotBeforeUpgrade {
            members,
            entries_left,
        } => format!(
            "wait for members {} to take a raft snapshot past the v2-format entries of etcd 3.4 and older before moving to a line that cannot replay them (about {entries_left} more applied entries; etcd snapshots every --snapshot-count entries)",
            members.join(", ")
        ),
    }
}

/// Quorum lost: who is missing, and what is not known of them (a silent node's members).
fn quorum_lost_message(
    missing: &[String],
    voters: usize,
    unconfirmed: &[crate::planner::Unconfirmed],
) -> String {
    let lost = format!(
        "quorum lost: {} of {voters} voting members are unhealthy ({}); the operator makes no membership change until a majority is back",
        missing.len(),
        missing.join(", ")
    );
    if unconfirmed.is_empty() {
        return lost;
    }
    let said: Vec<String> = unconfirmed
        .iter()
        .map(|u| format!("{}: {}", u.member, u.why))
        .collect();
    let mut nodes: Vec<&str> = unconfirmed
        .iter()
        .filter_map(|u| u.node.as_deref())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let declare = if nodes.is_empty() {
        "if you know their processes are gone, approve a recovery".to_string()
    } else {
        format!(
            "if the node is down for good, say so and the operator acts: {}",
            crate::planner::liveness::out_of_service_command(&nodes)
        )
    };
    format!(
        "{lost}; not known to be gone, so neither recovered nor replaced (their etcd may still run and hold the quorum): {}; {declare}",
        said.join("; ")
    )
}

/// Quorum lost for good: what was lost, and how to approve a recovery from where.
fn quorum_lost_for_good_message(loss: &crate::planner::PermanentLoss, approve: &str) -> String {
    let lost = if loss.voters == 0 {
        "every member and its data is gone (no pod that may run again, no claim)".to_string()
    } else {
        format!(
            "quorum lost for good: the data of {} of {} voting members is gone ({}), so quorum cannot come back by itself",
            loss.lost.len(),
            loss.voters,
            loss.lost.join(", ")
        )
    };
    match &loss.from {
        Some(RecoverFrom::Member { name, raft_index }) => format!(
            "{lost}; spec.recovery.policy is Manual: to recover from member {name} (raft index {raft_index}; writes only the lost members had are lost), run: {approve}"
        ),
        Some(RecoverFrom::Backup) => format!(
            "{lost}, and no member's data survives; spec.recovery.policy is Manual: to recover from the newest backup of the cluster that checks (its safety backups and EtcdBackups), run: {approve}"
        ),
        None => format!(
            "{lost}; waiting for the members that may still hold data to answer before choosing where to recover from"
        ),
    }
}

fn blocked_message(b: &Blocked) -> String {
    match b {
        Blocked::Paused => "spec.paused is set: no change is made".into(),
        Blocked::AnotherOperator { pods } => format!(
            "CoreOS' etcd-operator still runs and manages this cluster: it created member pods {} after this operator took the cluster over, and it deletes this operator's members as unexpected; two operators would undo each other forever, so this one changes nothing. Stop CoreOS' operator (kubectl scale deployment etcd-operator --replicas=0 in its namespace), then delete the pods it created (kubectl delete pod {} -n NAMESPACE): this operator replaces them and goes on",
            pods.join(", "),
            pods.join(" ")
        ),
        Blocked::QuorumLost {
            missing,
            voters,
            unconfirmed,
        } => quorum_lost_message(missing, *voters, unconfirmed),
        Blocked::AllMembersLost => "every member and its data is gone (members kept their data in emptyDirs); delete and recreate the EtcdCluster to start an empty cluster, or restore from a backup".into(),
        Blocked::UpgradeNotSupported(why) => format!("upgrade blocked: {why}"),
        Blocked::SafetyBackupFailed { change, reason } => format!(
            "{change} waits for its safety backup (spec.safetyBackup), which failed: {reason}"
        ),
        Blocked::QuorumLostForGood { loss, approve } => quorum_lost_for_good_message(loss, approve),
        Blocked::DataCorrupted { members } => format!(
            "etcd raised the CORRUPT alarm for {}: that member's data differs from the others' (the corruption check found a different hash); the operator changes nothing and never disarms it: find the member whose data is wrong (etcdctl endpoint hashkv), remove and replace it, then disarm the alarm (etcdctl alarm disarm)",
            members.join(", ")
        ),
        Blocked::SpaceExhausted { in_use, quota } => format!(
            "NOSPACE: after compaction the data in use ({}) is still {}% of the quota ({}), so defragmenting cannot make room; raise ETCD_QUOTA_BACKEND_BYTES in spec.pod.etcdEnv (the members pick it up as they are replaced) or delete keys, then the operator defragments and disarms the alarm",
            mib(*in_use),
            in_use.saturating_mul(100) / (*quota).max(1),
            mib(*quota)
        ),
    }
}

/// Bytes as MiB, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// What the status says of raised alarms, with the database sizes: `None` without alarms.
fn alarm_report(obs: &Observed) -> Option<(&'static str, String)> {
    use crate::planner::AlarmKind;
    let members = |kind: AlarmKind| -> Vec<&str> {
        obs.alarms
            .iter()
            .filter(|a| a.kind == kind)
            .map(|a| a.member.as_str())
            .collect()
    };
    let corrupt = members(AlarmKind::Corrupt);
    if !corrupt.is_empty() {
        return Some((
            "CorruptAlarm",
            format!(
                "etcd raised CORRUPT for {}: that member's data differs from the others'",
                corrupt.join(", ")
            ),
        ));
    }
    let full = members(AlarmKind::NoSpace);
    if full.is_empty() {
        return None;
    }
    let sizes = obs.members.as_ref().ok().map(|m| {
        let total = m.iter().map(|m| m.db.total).max().unwrap_or(0);
        let in_use = m
            .iter()
            .map(|m| m.db.in_use)
            .filter(|u| *u > 0)
            .min()
            .unwrap_or(0);
        (total, in_use)
    });
    let sizes = match sizes {
        Some((total, in_use)) if in_use > 0 => {
            format!("database {} on disk, {} in use", mib(total), mib(in_use))
        }
        Some((total, _)) => format!("database {} on disk", mib(total)),
        None => "database size unknown".into(),
    };
    Some((
        "NoSpaceAlarm",
        format!(
            "etcd raised NOSPACE for {} ({sizes}, quota {}): writes are refused, reads and deletes are served",
            full.join(", "),
            mib(obs.quota_bytes)
        ),
    ))
}

/// Member pods stuck terminating past their deletion deadline, in words.
fn stuck_report(obs: &Observed, stuck_after: std::time::Duration) -> Option<String> {
    let stuck: Vec<String> = obs
        .pods
        .iter()
        .filter(|p| p.terminating && p.overdue > stuck_after)
        .map(|p| {
            format!(
                "{} ({} s past its grace period)",
                p.name,
                p.overdue.as_secs()
            )
        })
        .collect();
    (!stuck.is_empty()).then(|| {
        format!(
            "pods stuck terminating (their node is gone or a finalizer holds them): {}",
            stuck.join(", ")
        )
    })
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

fn phase(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
    previous: Option<ClusterPhase>,
) -> ClusterPhase {
    // A cluster is Creating until it first matches its spec.
    let creating = !obs.bootstrapped || matches!(previous, None | Some(ClusterPhase::Creating));
    match step {
        Step::Blocked(Blocked::Paused) => ClusterPhase::Paused,
        Step::Blocked(
            Blocked::QuorumLost { .. }
            | Blocked::AllMembersLost
            | Blocked::QuorumLostForGood { .. },
        ) if obs.bootstrapped => ClusterPhase::QuorumLost,
        Step::StartRecovery { .. } | Step::FinishRecovery => ClusterPhase::Recovering,
        // Back to normal operation: the phase follows from the next reconcile.
        Step::AbortRecovery { .. } => ClusterPhase::Degraded,
        // The snapshot is part of the change it comes before.
        Step::TakeSafetyBackup { guarded, .. } => phase(view, obs, guarded, previous),
        _ if obs.recovery.is_some() => ClusterPhase::Recovering,
        Step::Blocked(
            Blocked::UpgradeNotSupported(_)
            | Blocked::SafetyBackupFailed { .. }
            | Blocked::DataCorrupted { .. }
            | Blocked::SpaceExhausted { .. }
            | Blocked::AnotherOperator { .. },
        ) => ClusterPhase::Degraded,
        // An alarm refuses writes (NOSPACE) or everything (CORRUPT) while quorum holds.
        _ if !obs.alarms.is_empty() && obs.bootstrapped => ClusterPhase::Degraded,
        Step::Done => ClusterPhase::Running,
        // Adopting CoreOS' members: members are added, then removed.
        _ if !obs.coreos_members().is_empty() => ClusterPhase::Scaling,
        // Replacing members made with TLS files they must no longer use, or that speak
        // otherwise than the cluster asks: added, then removed.
        _ if crate::planner::rollout::in_progress(view, obs) => ClusterPhase::Upgrading,
        _ if creating => ClusterPhase::Creating,
        // Moving clients off or onto a member is part of whatever takes it down.
        Step::SetServing { .. } | Step::Wait(Waiting::LeavingService(_)) => previous
            .filter(|p| !p.is_failure())
            .unwrap_or(ClusterPhase::Running),
        Step::Defragment {
            reason: DefragReason::Fragmented,
            ..
        } => ClusterPhase::Running,
        // The snapshot barrier and the wait for the snapshots past it come before an
        // upgrade's first member moves: part of the upgrade, as Progressing says.
        Step::UpgradeMember { .. }
        | Step::TransferLeadership { .. }
        | Step::RecordSnapshotBarrier { .. }
        | Step::Wait(Waiting::MemberUpgrading(_) | Waiting::SnapshotBeforeUpgrade { .. }) => {
            ClusterPhase::Upgrading
        }
        Step::RemoveMember { reason, .. } => match reason {
            RemovalReason::Replace | RemovalReason::StuckTerminating => ClusterPhase::Recovering,
            RemovalReason::ScaleDown | RemovalReason::Adopted => ClusterPhase::Scaling,
            RemovalReason::Rollout => ClusterPhase::Upgrading,
        },
        Step::Wait(Waiting::Unhealthy(_)) => ClusterPhase::Degraded,
        _ => ClusterPhase::Scaling,
    }
}

/// Why a failure phase (QuorumLost, Degraded) is one: the step that the failure blocks or waits
/// on, in a word.
fn failure_reason(phase: ClusterPhase, step: &Step, obs: &Observed) -> Option<String> {
    if !phase.is_failure() {
        return None;
    }
    let reason = match step {
        Step::Blocked(Blocked::QuorumLost { .. }) => "QuorumLost",
        Step::Blocked(Blocked::AllMembersLost) => "AllMembersLost",
        Step::Blocked(Blocked::QuorumLostForGood { .. }) => "QuorumLostForGood",
        Step::Blocked(Blocked::UpgradeNotSupported(_)) => "UpgradeNotSupported",
        Step::Blocked(Blocked::SafetyBackupFailed { .. }) => "SafetyBackupFailed",
        Step::Blocked(Blocked::SpaceExhausted { .. }) => "SpaceExhausted",
        Step::AbortRecovery { .. } => "RecoveryAborted",
        Step::Blocked(Blocked::AnotherOperator { .. }) => "AnotherOperator",
        _ if !obs.alarms.is_empty() => alarm_report(obs).map_or("Alarm", |(reason, _)| reason),
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
            | Step::TransferLeadership {
                before: Handover::Upgrade,
                ..
            }
            | Step::Wait(Waiting::MemberUpgrading(_))
    );
    moving
        || current
            .and_then(|v| v.parse::<EtcdVersion>().ok())
            .is_some_and(|v| v != view.version)
}

/// What the status records beside the model and the step: the records the reconcile read,
/// and what carrying the step out left.
#[derive(Debug, Clone, Default)]
pub struct StepRecords {
    /// The step was carried out (else it counts as not taken).
    pub carried_out: bool,
    /// The safety-backup record to keep (the one just taken, else the stored one); `None`
    /// for a cluster without `spec.safetyBackup`.
    pub safety_backup: Option<etcd_shared::types::SafetyBackupRecord>,
    /// The recovery in progress, as the stored status records it.
    pub recovering: Option<etcd_shared::types::RecoveryStatus>,
    /// The recovery the step just started.
    pub started_recovery: Option<etcd_shared::types::RecoveryStatus>,
    /// The last recovery finished, as the stored status records it.
    pub last_recovery: Option<etcd_shared::types::RecoveryRecord>,
}

/// The status after `step`, computed once from the model, the step and its records: what
/// [`compute`] says, with the safety-backup, maintenance and recovery records the step leaves.
pub fn after_step(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
    records: StepRecords,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let mut new = compute(view, obs, step, previous, now);
    if view.safety_backup.is_some() {
        new.last_safety_backup = records.safety_backup;
    }
    let taken = if records.carried_out {
        step
    } else {
        &Step::Done
    };
    let time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now);
    let members: Option<Vec<String>> = obs
        .members
        .as_ref()
        .ok()
        .map(|m| m.iter().map(|m| m.name.clone()).collect());
    new.maintenance = crate::planner::maintenance::record_after(
        previous.and_then(|s| s.maintenance.as_ref()),
        taken,
        members.as_deref(),
        obs.has_alarm(crate::planner::AlarmKind::NoSpace),
        &time,
    );
    (new.recovery, new.last_recovery) = crate::planner::recovery::records_after(
        records.recovering,
        records.started_recovery,
        records.last_recovery,
        taken,
        &time,
    );
    new
}

/// Whether a quorum of the voters is healthy, and why, in words; the healthy members.
struct Availability {
    available: bool,
    reason: &'static str,
    message: String,
    ready: usize,
}

fn availability(obs: &Observed) -> Availability {
    let members = obs.members.as_ref().ok();
    let voters: Vec<&MemberState> = members
        .map(|m| m.iter().filter(|m| !m.learner).collect())
        .unwrap_or_default();
    let healthy_voters = voters.iter().filter(|m| m.health.is_healthy()).count();
    let available = members.is_some()
        && !voters.is_empty()
        && healthy_voters >= ClusterView::quorum(voters.len());
    let ready = members.map_or(0, |m| m.iter().filter(|m| m.health.is_healthy()).count());
    let (reason, message) = match (&obs.members, available) {
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
    Availability {
        available,
        reason,
        message,
        ready,
    }
}

/// The Degraded condition: whether the cluster is, its reason and message (the first of: a
/// quorum lost, a recovery, a blocked change, an alarm, unreachable or stuck or unhealthy
/// members).
fn degradation(view: &ClusterView, obs: &Observed, step: &Step) -> (bool, &'static str, String) {
    let members = obs.members.as_ref().ok();
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
    let alarm = alarm_report(obs);
    let stuck = stuck_report(obs, STUCK_REPORT_AFTER);
    match step {
        Step::Blocked(Blocked::QuorumLost { unconfirmed, .. }) if obs.bootstrapped => (
            true,
            "QuorumLost",
            format!(
                "{}; {}: the operator waits (spec.recovery.policy {} acts only when the data of a majority is known to be gone)",
                describe(step),
                if unconfirmed.is_empty() {
                    "the missing members' data is on their claims or pods, so they can come back"
                } else {
                    "unknown is not gone"
                },
                if view.recover_automatically {
                    "Automatic"
                } else {
                    "Manual"
                }
            ),
        ),
        Step::Blocked(Blocked::AllMembersLost) => (true, "AllMembersLost", describe(step)),
        Step::Blocked(Blocked::QuorumLostForGood { .. }) => {
            (true, "QuorumLostForGood", describe(step))
        }
        Step::StartRecovery { .. } | Step::FinishRecovery => (true, "Recovering", describe(step)),
        Step::AbortRecovery { .. } => (true, "RecoveryAborted", describe(step)),
        Step::Blocked(Blocked::AnotherOperator { .. }) => (true, "AnotherOperator", describe(step)),
        _ if obs.recovery.is_some() => (
            true,
            "Recovering",
            format!(
                "recovering from permanent quorum loss; next: {}",
                describe(step)
            ),
        ),
        Step::Blocked(Blocked::SpaceExhausted { .. }) => (true, "SpaceExhausted", describe(step)),
        _ if alarm.is_some() => {
            let (reason, message) = alarm.clone().unwrap_or_default();
            (true, reason, message)
        }
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
        _ if stuck.is_some() => (true, "PodsStuckTerminating", stuck.unwrap_or_default()),
        _ if !unhealthy.is_empty() => (
            true,
            "MembersUnhealthy",
            format!("unhealthy members: {}", unhealthy.join(", ")),
        ),
        _ => (false, "AsExpected", "all members are healthy".to_string()),
    }
}

/// The Progressing condition's reason for `step` (every step of an adoption, of a rollout, ...).
fn progressing_reason(view: &ClusterView, obs: &Observed, step: &Step) -> &'static str {
    match step {
        // Every step of an adoption (adding, promoting, waiting, handing over, removing).
        _ if !obs.coreos_members().is_empty() && !matches!(step, Step::Blocked(_)) => {
            "AdoptingCoreOSMembers"
        }
        _ if crate::planner::rollout::switching_transport(view, obs)
            && !matches!(step, Step::Blocked(_)) =>
        {
            "SwitchingToTLS"
        }
        _ if crate::planner::rollout::in_progress(view, obs)
            && !matches!(step, Step::Blocked(_)) =>
        {
            "ReplacingForCertificates"
        }
        Step::Bootstrap(_) => "Bootstrapping",
        Step::AddMember { .. } | Step::PromoteLearner { .. } | Step::CreatePod(_) => "ScalingUp",
        Step::DeletePod(_) | Step::DeleteClaim(_) => "ScalingDown",
        Step::RemoveMember { reason, .. } => match reason {
            RemovalReason::ScaleDown => "ScalingDown",
            RemovalReason::Replace | RemovalReason::StuckTerminating => "ReplacingMember",
            RemovalReason::Adopted => "AdoptingCoreOSMembers",
            RemovalReason::Rollout => "ReplacingForCertificates",
        },
        Step::RestartBootstrap(_) => "Bootstrapping",
        Step::StartRecovery { .. } | Step::FinishRecovery => "Recovering",
        Step::AbortRecovery { .. } => "RecoveryAborted",
        _ if obs.recovery.is_some() => "Recovering",
        Step::TakeSafetyBackup { .. } => "TakingSafetyBackup",
        Step::Compact { .. } | Step::DisarmAlarm(_) => "HealingNoSpace",
        Step::Defragment { reason, .. } => match reason {
            DefragReason::NoSpace => "HealingNoSpace",
            DefragReason::Fragmented => "Defragmenting",
        },
        Step::UpgradeMember { .. }
        | Step::TransferLeadership { .. }
        | Step::RecordSnapshotBarrier { .. }
        | Step::Wait(Waiting::MemberUpgrading(_))
        | Step::Wait(Waiting::SnapshotBeforeUpgrade { .. }) => "Upgrading",
        Step::SetServing { .. } | Step::Wait(Waiting::LeavingService(_)) => "MovingClients",
        Step::Wait(_) => "WaitingForMembers",
        Step::Blocked(Blocked::Paused) => "Paused",
        Step::Blocked(_) => "Blocked",
        Step::Done => "Reconciled",
    }
}

/// The Spread condition: whether two members are known to run on one node.
fn spread_condition(
    at: &Stamp,
    placement: &[etcd_shared::types::MemberPlacement],
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    let shared = placement::shared_nodes(placement);
    if shared.is_empty() {
        at.condition(
            SPREAD,
            true,
            "OneMemberPerNode",
            "no two members are known to run on one node".into(),
        )
    } else {
        at.condition(
            SPREAD,
            false,
            "MembersShareANode",
            format!(
                "members share a node, so losing that node loses all of them: {} (spread them with spec.pod.antiAffinity: true, or more nodes and zones)",
                shared.join("; ")
            ),
        )
    }
}

/// The conditions of the status: Available, Progressing, Degraded (`degraded`, from
/// [`degradation`]), Paused and Spread, each keeping its last transition time while it stays.
fn conditions(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
    at: &Stamp,
    placement: &[etcd_shared::types::MemberPlacement],
    (degraded, degraded_reason, degraded_message): (bool, &'static str, String),
    previous: Option<&EtcdClusterStatus>,
) -> Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    let available = availability(obs);
    let progressing = step.is_change() || matches!(step, Step::Wait(_));
    let progressing_message = match step {
        Step::Done => "the cluster matches its spec".to_string(),
        _ => format!("next: {}", describe(step)),
    };
    let (paused_reason, paused_message) = if view.paused {
        (
            "PausedBySpec",
            "spec.paused is set: the operator makes no change",
        )
    } else {
        ("NotPaused", "the operator manages the cluster")
    };
    let mut conditions = vec![
        at.condition(
            AVAILABLE,
            available.available,
            available.reason,
            available.message,
        ),
        at.condition(
            PROGRESSING,
            progressing,
            progressing_reason(view, obs, step),
            progressing_message,
        ),
        at.condition(DEGRADED, degraded, degraded_reason, degraded_message),
        at.condition(PAUSED, view.paused, paused_reason, paused_message.into()),
        spread_condition(at, placement),
    ];
    if let Some(prev) = previous {
        conditions::carry_transition_times(&mut conditions, &prev.conditions);
    }
    conditions
}

/// The snapshot a restored cluster was seeded from.
fn restored_from(view: &ClusterView) -> Option<RestoredFrom> {
    view.seed.as_ref().map(|seed| RestoredFrom {
        restore: seed.restore.clone(),
        path: seed.source.path().unwrap_or_default().to_string(),
        revision: seed.revision,
        sha256: seed.sha256.clone(),
        etcd_version: seed.etcd_version.clone(),
    })
}

/// The scale subresource's label selector of the member pods (CoreOS' while its members run).
fn selector(view: &ClusterView, obs: &Observed) -> String {
    crate::builders::member_selector(view, !obs.coreos_members().is_empty())
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The status of a reconciled cluster.
pub fn compute(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let generation = view.generation;
    let members = obs.members.as_ref().ok();
    let previous_phase = previous.and_then(|s| s.phase);
    let ready = availability(obs).ready;
    let degraded = degradation(view, obs, step);
    let degraded_reason = degraded.1;
    let at = Stamp::new(generation, now);
    let placement = placement::after(previous.map_or(&[][..], |p| p.placement.as_slice()), obs);
    let conditions = conditions(view, obs, step, &at, &placement, degraded, previous);
    // Pods on their way out (deleted, stuck terminating) are not members anyone waits for.
    let expected: Vec<String> = obs
        .pods
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| p.name.clone())
        .collect();
    let phase = phase(view, obs, step, previous_phase);
    let current_version = members
        .and_then(|m| min_version(m))
        .map(|v| v.to_string())
        .or_else(|| previous.and_then(|s| s.current_version.clone()));
    let target_version =
        upgrading(view, step, current_version.as_deref()).then(|| view.version.to_string());
    EtcdClusterStatus {
        phase: Some(phase),
        reason: failure_reason(phase, step, obs)
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
        restored_from: restored_from(view),
        // Written by the pipeline when it takes one; kept until the next.
        last_safety_backup: previous.and_then(|p| p.last_safety_backup.clone()),
        // Written by the pipeline once the step is carried out (see
        // `planner::maintenance::record_after` and `planner::recovery::records_after`).
        maintenance: previous.and_then(|p| p.maintenance.clone()),
        recovery: previous.and_then(|p| p.recovery.clone()),
        last_recovery: previous.and_then(|p| p.last_recovery.clone()),
        selector: Some(selector(view, obs)),
        placement,
        another_operator_pods: obs.another_operator.clone(),
        coreos_members: obs
            .coreos_members()
            .into_iter()
            .map(str::to_string)
            .collect(),
        // Written by the pipeline from what the members mount (see `certificates::switching`).
        tls: previous.and_then(|p| p.tls.clone()),
    }
}

/// A switch of the certificates' source in progress: the Progressing condition says so (with
/// `note`: its phase and what it waits for) unless it reports other work already, in which case
/// the note is added to its message.
pub fn note_certificate_switch(status: &mut EtcdClusterStatus, note: &str, now: Timestamp) {
    note_progress(status, "SwitchingCertificates", note, now);
}

/// Work the operator does beside the planner's step (a certificate switch, a point-in-time
/// restore's replay while clients are held): the Progressing condition says so, with `reason`
/// and `note`, unless it reports other work already, in which case the note is added to its
/// message.
pub fn note_progress(status: &mut EtcdClusterStatus, reason: &str, note: &str, now: Timestamp) {
    let Some(c) = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == PROGRESSING)
    else {
        return;
    };
    if c.status == "True" && c.reason != "ReplacingForCertificates" {
        c.message = crate::conditions::bounded_message(format!("{}; {note}", c.message));
        return;
    }
    if c.status != "True" {
        c.status = "True".into();
        c.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now);
    }
    c.reason = reason.into();
    c.message = crate::conditions::bounded_message(note.to_string());
}

/// The status of a cluster whose spec is invalid: Degraded with the violations and the reason
/// InvalidSpec, nothing else changed.
pub fn invalid(
    error: &InvalidCluster,
    generation: Option<i64>,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let at = Stamp::new(generation, now);
    let mut status = previous.cloned().unwrap_or_default();
    let conditions = vec![
        at.condition(DEGRADED, true, "InvalidSpec", error.to_string()),
        at.condition(
            PROGRESSING,
            false,
            "InvalidSpec",
            "the spec must be fixed before the operator acts".into(),
        ),
    ];
    conditions::replace(&mut status.conditions, conditions);
    status.observed_generation = generation;
    status.reason = Some("InvalidSpec".into());
    status
}

/// The status of a cluster the operator cannot observe (its TLS Secret is broken, the API
/// server refused a read): phase Degraded with the error's reason, `Degraded` True with the
/// error, `Available` Unknown (nobody can tell), `Progressing` False; the rest as it was. The
/// status never keeps saying `Running` while the operator is blind.
pub fn observation_failed(
    error: &crate::error::Error,
    view: &ClusterView,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let reason = match error {
        crate::error::Error::OperatorTls { .. } => "OperatorTLSSecretInvalid",
        _ => "ObservationFailed",
    };
    let message = format!("the operator cannot observe the cluster: {error}");
    blind(reason, message, view, previous, now)
}

/// The status of a cluster whose certificates the operator cannot issue (its own CA's, or
/// cert-manager's Certificates refused): as [`observation_failed`], reason
/// `CertificatesFailed`.
pub fn certificates_failed(
    error: &crate::error::Error,
    view: &ClusterView,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let message = format!("the operator cannot keep the cluster's certificates: {error}");
    blind("CertificatesFailed", message, view, previous, now)
}

fn blind(
    reason: &str,
    message: String,
    view: &ClusterView,
    previous: Option<&EtcdClusterStatus>,
    now: Timestamp,
) -> EtcdClusterStatus {
    let generation = view.generation;
    let mut status = previous.cloned().unwrap_or_default();
    let at = Stamp::new(generation, now);
    let mut available = at.condition(AVAILABLE, false, reason, message.clone());
    available.status = "Unknown".into();
    let conditions = vec![
        available,
        at.condition(
            PROGRESSING,
            false,
            reason,
            "the operator makes no change until it can observe the cluster".into(),
        ),
        at.condition(DEGRADED, true, reason, message),
    ];
    conditions::replace(&mut status.conditions, conditions);
    status.conditions.sort_by_key(|c| {
        [AVAILABLE, PROGRESSING, DEGRADED, PAUSED]
            .iter()
            .position(|t| *t == c.type_)
            .unwrap_or(usize::MAX)
    });
    status.phase = Some(ClusterPhase::Degraded);
    status.reason = Some(reason.into());
    status.observed_generation = generation;
    status.service_name = Some(names::client_service_name(&view.name));
    status.client_port = Some(CLIENT_PORT);
    status.next_step = None;
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

pub mod placement;
#[cfg(test)]
mod tests;
