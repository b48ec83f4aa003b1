//! Carrying out the planner's step: the pod and claim calls and etcd member calls one step
//! takes, and the Event and metric that record it (chosen by [`record_of`], a pure function).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{EventType, Recorder};
use tracing::{info, warn};

use etcd_shared::EtcdCluster;
use etcd_shared::names;

use super::safety;
use crate::backoff::RetryGate;
use crate::builders;
use crate::conditions::bounded_message;
use crate::context::Context;
use crate::error::Error;
use crate::events::Events;
use crate::failpoints::Failpoint;
use crate::idempotent;
use crate::observe::Observation;
use etcd_shared::types::RecoveryStatus;
use etcd_shared::types::SafetyBackupRecord;

use crate::planner::{MemberPlan, RemovalReason, Step};
use crate::status;
use crate::view::ClusterView;

/// How a change is recorded once made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepRecord {
    /// The Event's reason (and action).
    pub reason: &'static str,
    /// The `member_changes_total{kind}` label.
    pub kind: &'static str,
    /// The object the change concerns, named in the Event's `related` field: `(kind, name)`,
    /// a member's pod or claim.
    pub related: Option<(&'static str, String)>,
}

/// How `step` is recorded; `None` for the steps that change nothing.
pub fn record_of(step: &Step) -> Option<StepRecord> {
    let pod = |name: &str| Some(("Pod", name.to_string()));
    let (reason, kind, related) = match step {
        Step::Bootstrap(plan) => ("ClusterBootstrapped", "bootstrap", pod(&plan.name)),
        Step::AddMember { name, .. } => ("MemberAdded", "add", pod(name)),
        Step::CreatePod(plan) => ("MemberPodCreated", "start", pod(&plan.name)),
        Step::PromoteLearner { name, .. } => ("MemberPromoted", "promote", pod(name)),
        Step::RemoveMember { name, reason, .. } => {
            let (reason, kind) = match reason {
                RemovalReason::ScaleDown => ("MemberRemoved", "remove"),
                RemovalReason::Replace => ("MemberReplaced", "replace"),
                RemovalReason::StuckTerminating => ("StuckMemberReplaced", "replace_stuck"),
                RemovalReason::Adopted => ("CoreOSMemberRemoved", "remove_coreos"),
                RemovalReason::Rollout => {
                    ("MemberReplacedForCertificates", "replace_for_certificates")
                }
            };
            (reason, kind, pod(name))
        }
        Step::RestartBootstrap(name) => ("BootstrapRestarted", "restart_bootstrap", pod(name)),
        Step::Compact { .. } => ("Compacted", "compact", None),
        Step::Defragment { name, .. } => ("MemberDefragmented", "defragment", pod(name)),
        Step::DisarmAlarm(_) => ("AlarmDisarmed", "disarm_alarm", None),
        Step::StartRecovery { .. } => ("RecoveryStarted", "start_recovery", None),
        Step::FinishRecovery => ("Recovered", "finish_recovery", None),
        Step::AbortRecovery { .. } => ("RecoveryAborted", "abort_recovery", None),
        Step::SetServing { name, serving } => (
            if *serving {
                "MemberInService"
            } else {
                "MemberOutOfService"
            },
            "set_serving",
            pod(name),
        ),
        Step::DeletePod(name) => ("MemberPodDeleted", "delete_pod", pod(name)),
        Step::DeleteClaim(member) => (
            "MemberClaimDeleted",
            "delete_claim",
            Some(("PersistentVolumeClaim", names::data_claim_name(member))),
        ),
        Step::UpgradeMember { name, .. } => ("MemberUpgraded", "upgrade", pod(name)),
        Step::TransferLeadership { to, .. } => {
            ("LeadershipTransferred", "transfer_leadership", pod(to))
        }
        Step::RecordSnapshotBarrier { .. } => ("SnapshotBarrierRecorded", "snapshot_barrier", None),
        Step::TakeSafetyBackup { .. } | Step::Wait(_) | Step::Blocked(_) | Step::Done => {
            return None;
        }
    };
    Some(StepRecord {
        reason,
        kind,
        related,
    })
}

/// What carrying out a step gives the status to keep.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The record of a recovery just started (its verified snapshot).
    pub recovery: Option<RecoveryStatus>,
    /// The record of a safety backup just written.
    pub safety_backup: Option<etcd_shared::types::SafetyBackupRecord>,
}

/// Writes the safety backup before `change` ([`safety::take`]), with an Event either way; a
/// failure is remembered by `retries` (the planner blocks the change until the next attempt is
/// due) and makes the cluster's reconciles back off.
async fn take_safety_backup(
    ctx: &Context,
    recorder: &Recorder,
    cluster: &EtcdCluster,
    view: &ClusterView,
    change: &crate::planner::safety::RiskyChange,
    retries: &RetryGate,
) -> Result<SafetyBackupRecord, Error> {
    let key = view.key();
    let events = Events::of(recorder, cluster);
    let spec = view
        .safety_backup
        .as_ref()
        .ok_or_else(|| Error::SafetyBackup {
            change: change.to_string(),
            reason: "spec.safetyBackup is not set".into(),
        })?;
    match safety::take(&ctx.client, view, spec, change, ctx.config.etcd_timeout).await {
        Ok(record) => {
            retries.succeeded(&key);
            let note = format!(
                "snapshot of revision {} written to {} before {change}",
                record.revision.unwrap_or(0),
                record.path
            );
            events.normal("SafetyBackupWritten", note).await;
            Ok(record)
        }
        Err(e) => {
            // One bounded line: a store's answer can be a multi-line XML document.
            let reason = bounded_message(e.to_string());
            let delay = retries.failed(&key, &reason);
            warn!(cluster = %view.name, namespace = %view.namespace, %change, error = %reason, retry_in = ?delay, "safety backup failed; the change waits");
            let note = format!("{change} waits: {reason}");
            events.warning("SafetyBackupFailed", note).await;
            Err(Error::SafetyBackup {
                change: change.to_string(),
                reason,
            })
        }
    }
}

/// Carries out one step, and records it as an Event and a metric.
pub async fn execute(
    ctx: &Context,
    recorder: &Recorder,
    cluster: &EtcdCluster,
    view: &ClusterView,
    obs: &Observation,
    step: &Step,
    safety_retries: &RetryGate,
) -> Result<Outcome, Error> {
    if let Step::TakeSafetyBackup { change, .. } = step {
        let record =
            take_safety_backup(ctx, recorder, cluster, view, change, safety_retries).await?;
        return Ok(Outcome {
            safety_backup: Some(record),
            ..Outcome::default()
        });
    }
    let Some(record) = record_of(step) else {
        return Ok(Outcome::default());
    };
    let mut outcome = Outcome::default();
    if let Step::StartRecovery { from, lost } = step {
        let started = super::recovery::start(ctx, recorder, cluster, view, obs, from, lost).await?;
        let note = super::recovery::started_note(&started);
        outcome.recovery = Some(started);
        ctx.metrics.member_change(record.kind);
        Events::of(recorder, cluster)
            .warning(record.reason, note)
            .await;
        return Ok(outcome);
    }
    if !carry_out(ctx, view, obs, step).await? {
        return Ok(outcome);
    }
    let note = status::describe(step);
    info!(cluster = %view.name, namespace = %view.namespace, step = %note, "member change");
    ctx.metrics.member_change(record.kind);
    match step {
        Step::Defragment { reason, .. } => ctx.metrics.defragmented(reason.label()),
        Step::DisarmAlarm(_) => ctx.metrics.alarm_healed("NOSPACE"),
        _ => {}
    }
    let related = record.related.map(|(kind, name)| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some(kind.into()),
        name: Some(name),
        namespace: Some(view.namespace.clone()),
        ..ObjectReference::default()
    });
    let type_ = if matches!(step, Step::AbortRecovery { .. }) {
        EventType::Warning
    } else {
        EventType::Normal
    };
    Events::of(recorder, cluster)
        .publish(type_, record.reason, note, related)
        .await;
    Ok(outcome)
}

/// The calls of one step. `Ok(false)`: etcd did not take the change yet (a learner not caught
/// up), so there is nothing to record.
async fn carry_out(
    ctx: &Context,
    view: &ClusterView,
    obs: &Observation,
    step: &Step,
) -> Result<bool, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &view.namespace);
    if ctx.config.broken.is_none() {
        recheck_lost_cluster(obs, step).await?;
    }
    match step {
        Step::Bootstrap(plan) | Step::CreatePod(plan) => {
            create_member_pod(ctx, view, plan, obs.model.tls.as_ref()).await?;
            if plan.seed.is_some() && obs.model.recovery.is_some() {
                ctx.config.failpoints.pass(Failpoint::MidRecovery)?;
            }
        }
        Step::AddMember {
            peer_url, learner, ..
        } => {
            obs.access
                .add_member(obs.member_change_endpoint()?, peer_url, *learner)
                .await?;
            ctx.config.failpoints.pass(Failpoint::AfterMemberAdd)?;
        }
        Step::PromoteLearner { id, name } => {
            if !obs
                .access
                .promote_member(obs.member_change_endpoint()?, *id)
                .await?
            {
                info!(member = %name, "learner not caught up yet");
                return Ok(false);
            }
        }
        Step::RemoveMember { id, .. } => {
            obs.access
                .remove_member(obs.member_change_endpoint()?, *id)
                .await?;
            ctx.config.failpoints.pass(Failpoint::AfterMemberRemove)?;
        }
        Step::DeletePod(name) => delete_pod(&pods, obs, name).await?,
        Step::SetServing { name, serving } => set_serving(&pods, name, *serving).await?,
        Step::DeleteClaim(member) => delete_claim(ctx, view, obs, member).await?,
        Step::RestartBootstrap(name) => {
            delete_pod(&pods, obs, name).await?;
            delete_claim(ctx, view, obs, name).await?;
        }
        Step::Compact { .. } | Step::Defragment { .. } | Step::DisarmAlarm(_) => {
            maintain(obs, step).await?;
        }
        // Carried out by `execute` (it yields a record); nothing to call for the finish.
        Step::StartRecovery { .. }
        | Step::FinishRecovery
        | Step::AbortRecovery { .. }
        | Step::TakeSafetyBackup { .. } => {}
        Step::UpgradeMember {
            name,
            image,
            version,
        } => {
            upgrade_pod(&pods, obs, name, image, version).await?;
            ctx.config.failpoints.pass(Failpoint::MidUpgrade)?;
        }
        Step::TransferLeadership { from, to_id, .. } => {
            let endpoint = obs
                .endpoint_of(from)
                .ok_or_else(|| Error::NoEndpoint(from.clone()))?;
            obs.access.move_leader(endpoint, *to_id).await?;
        }
        Step::RecordSnapshotBarrier { index } => {
            record_snapshot_barrier(&pods, obs, *index).await?;
        }
        Step::Wait(_) | Step::Blocked(_) | Step::Done => return Ok(false),
    }
    Ok(true)
}

/// A maintenance step through etcd's API: a compaction, a defragmentation, a disarm.
async fn maintain(obs: &Observation, step: &Step) -> Result<(), Error> {
    match step {
        Step::Compact { revision } => {
            obs.access
                .compact(obs.member_change_endpoint()?, *revision)
                .await?;
        }
        Step::Defragment { name, .. } => {
            let endpoint = obs
                .endpoint_of(name)
                .ok_or_else(|| Error::NoEndpoint(name.clone()))?;
            obs.access.defragment(endpoint, DEFRAGMENT_TIMEOUT).await?;
        }
        Step::DisarmAlarm(alarms) => {
            let endpoint = obs.member_change_endpoint()?;
            for alarm in alarms {
                obs.access
                    .disarm_no_space(endpoint, alarm.member_id)
                    .await?;
            }
        }
        _ => {}
    }
    Ok(())
}

/// Moves member pod `name` to `image` (the kubelet restarts the container). The restart count
/// goes with the image, so the planner can tell the new container's readiness from the old
/// one's.
async fn upgrade_pod(
    pods: &Api<Pod>,
    obs: &Observation,
    name: &str,
    image: &str,
    version: &etcd_shared::version::EtcdVersion,
) -> Result<(), Error> {
    let restarts = obs.model.pod(name).map_or(0, |p| p.restarts);
    let patch = serde_json::json!({
        "metadata": {
            "labels": BTreeMap::from([(names::LABEL_VERSION, version.to_string())]),
            "annotations": BTreeMap::from([(
                names::ANNOTATION_RESTARTS_AT_UPGRADE,
                restarts.to_string(),
            )]),
        },
        "spec": { "containers": [ { "name": "etcd", "image": image } ] },
    });
    pods.patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(Error::kube(format!("upgrade pod {name}")))?;
    Ok(())
}

/// Records raft index `index` as the snapshot barrier on every member pod.
async fn record_snapshot_barrier(
    pods: &Api<Pod>,
    obs: &Observation,
    index: u64,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": { "annotations": { names::ANNOTATION_SNAPSHOT_BARRIER: index.to_string() } },
    });
    for pod in &obs.model.pods {
        pods.patch(&pod.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::kube(format!(
                "record the snapshot barrier on {}",
                pod.name
            )))?;
    }
    Ok(())
}

/// Sets member pod `name`'s serving gate condition (a strategic merge of that one condition
/// into `status.conditions`, which the kubelet keeps: it owns only its own condition types).
async fn set_serving(pods: &Api<Pod>, name: &str, serving: bool) -> Result<(), Error> {
    let (status, reason, message) = if serving {
        ("True", "Serving", "the member serves clients")
    } else {
        (
            "False",
            "TakenDown",
            "the operator takes the member down on purpose (a restart, a removal, a defragmentation)",
        )
    };
    let patch = serde_json::json!({ "status": { "conditions": [{
        "type": names::CONDITION_SERVING,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now()
        ),
    }]}});
    pods.patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .map_err(Error::kube(format!("set the serving gate of pod {name}")))?;
    Ok(())
}

/// Right before a recovery's seed member is created or a pod of the lost cluster (the survivor)
/// deleted, the lost cluster's members are asked once more whether they have a leader: if one
/// does, the step is refused (the next observation stops the recovery). The observation asked
/// them too; this closes the window between the two.
async fn recheck_lost_cluster(obs: &Observation, step: &Step) -> Result<(), Error> {
    let guarded = match step {
        Step::Bootstrap(plan) => plan.seed.is_some() && obs.model.recovery.is_some(),
        Step::DeletePod(name) => obs.replaced_endpoints.iter().any(|(pod, _)| pod == name),
        _ => false,
    };
    if !guarded || obs.replaced_endpoints.is_empty() {
        return Ok(());
    }
    match crate::observe::lost_cluster_serves(&obs.access, &obs.replaced_endpoints).await {
        Some(why) => Err(Error::Recovery(format!(
            "{} refused: {why}; the recovery stops",
            status::describe(step)
        ))),
        None => Ok(()),
    }
}

/// How long one member's defragmentation may take: it rewrites the whole database file (about
/// 100 MB/s on a slow disk, so a full 8 GiB backend takes well under this).
pub const DEFRAGMENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

/// Deletes a pod; one already gone is fine.
/// Deletes the member pod `name` the observation saw (its UID as a precondition: a pod created
/// under that name since is left alone); one already gone is fine.
async fn delete_pod(pods: &Api<Pod>, obs: &Observation, name: &str) -> Result<(), Error> {
    let uid = obs.model.pod(name).and_then(|p| p.uid.clone()).or_else(|| {
        obs.model
            .recovery
            .as_ref()?
            .replaced_pods
            .iter()
            .find(|p| p.name == name)?
            .uid
            .clone()
    });
    idempotent::delete_exact(pods, name, uid.as_deref(), format!("pod {name}")).await
}

/// Deletes a member's data claim; one already gone (or never made) is fine.
/// Deletes the data claim of `member` the observation saw (its UID as a precondition); one
/// already gone (or never made) is fine.
async fn delete_claim(
    ctx: &Context,
    view: &ClusterView,
    obs: &Observation,
    member: &str,
) -> Result<(), Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &view.namespace);
    let claim = names::data_claim_name(member);
    let uid = obs.claim_uids.get(member).map(String::as_str);
    idempotent::delete_exact(&claims, &claim, uid, format!("claim {claim}")).await
}

/// Creates a member's claim (when it keeps its data on one) and its pod; either already
/// existing is fine (a retried step).
async fn create_member_pod(
    ctx: &Context,
    view: &ClusterView,
    plan: &MemberPlan,
    tls: Option<&crate::planner::TlsFiles>,
) -> Result<(), Error> {
    if let Some(claim) = builders::data_claim(view, &plan.name, &plan.version) {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(ctx.client.clone(), &view.namespace);
        idempotent::create(&claims, &claim, format!("claim of {}", plan.name)).await?;
    }
    let mut pod = builders::member_pod(view, plan);
    if let Some(files) = tls {
        builders::stamp_tls_files(&mut pod, &files.current);
    }
    // The first member of a restored or recovered cluster is seeded from the snapshot.
    if let Some(seed) = &plan.seed {
        let image = ctx
            .config
            .restore_image
            .as_ref()
            .ok_or(Error::NoRestoreImage)?;
        builders::seed_member(&mut pod, view, plan, seed, image);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &view.namespace);
    idempotent::create(&pods, &pod, format!("pod {}", plan.name)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::new_member_plan as plan;
    use crate::planner::{Blocked, Waiting};

    /// Every change names the member it concerns, so two members' events of one reason are
    /// two series, each with its own note; steps that change nothing record nothing.
    #[test]
    fn every_change_is_recorded_with_its_member() {
        let pod = |n: &str| Some(("Pod", n.to_string()));
        for (step, reason, kind, related) in [
            (
                Step::Bootstrap(plan("demo-0")),
                "ClusterBootstrapped",
                "bootstrap",
                pod("demo-0"),
            ),
            (
                crate::planner::fixtures::add_member(3, true),
                "MemberAdded",
                "add",
                pod("demo-3"),
            ),
            (
                Step::CreatePod(plan("demo-3")),
                "MemberPodCreated",
                "start",
                pod("demo-3"),
            ),
            (
                Step::PromoteLearner {
                    id: 7,
                    name: "demo-3".into(),
                },
                "MemberPromoted",
                "promote",
                pod("demo-3"),
            ),
            (
                crate::planner::fixtures::remove_member(2, RemovalReason::ScaleDown),
                "MemberRemoved",
                "remove",
                pod("demo-2"),
            ),
            (
                crate::planner::fixtures::remove_member(1, RemovalReason::Replace),
                "MemberReplaced",
                "replace",
                pod("demo-1"),
            ),
            (
                Step::DeletePod("demo-2".into()),
                "MemberPodDeleted",
                "delete_pod",
                pod("demo-2"),
            ),
            (
                Step::DeleteClaim("demo-2".into()),
                "MemberClaimDeleted",
                "delete_claim",
                Some(("PersistentVolumeClaim", "demo-2-data".to_string())),
            ),
            (
                crate::planner::fixtures::upgrade_member(1, "3.7.3"),
                "MemberUpgraded",
                "upgrade",
                pod("demo-1"),
            ),
            (
                Step::TransferLeadership {
                    from: "demo-0".into(),
                    to: "demo-1".into(),
                    to_id: 9,
                    before: crate::planner::Handover::Upgrade,
                },
                "LeadershipTransferred",
                "transfer_leadership",
                pod("demo-1"),
            ),
            (
                Step::RecordSnapshotBarrier { index: 100 },
                "SnapshotBarrierRecorded",
                "snapshot_barrier",
                None,
            ),
        ] {
            assert_eq!(
                record_of(&step),
                Some(StepRecord {
                    reason,
                    kind,
                    related
                }),
                "{step:?}"
            );
        }
        for quiet in [
            Step::Done,
            Step::Blocked(Blocked::Paused),
            Step::Wait(Waiting::MemberStarting("demo-1".into())),
        ] {
            assert_eq!(record_of(&quiet), None, "{quiet:?}");
        }
    }
}
