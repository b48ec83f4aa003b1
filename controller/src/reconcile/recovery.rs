//! Starting a recovery from permanent quorum loss (the I/O of [`Step::StartRecovery`], issue
//! 24): the snapshot is taken from the best surviving member (or the newest backup is found)
//! and verified before anything of the cluster is touched; the record it yields (kept in
//! `status.recovery`) lists the pods and claims of the lost cluster, removed once the new
//! first member runs. The approval annotation, if any, is removed (with an Event).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::Recorder;

use etcd_shared::EtcdCluster;
use etcd_shared::names;
use etcd_shared::types::RecoveryStatus;

use super::recovery_source;
use crate::context::Context;
use crate::error::Error;
use crate::events::Events;
use crate::observe::Observation;
use crate::planner::RecoverFrom;
use crate::planner::recovery::source_of;
use crate::view::ClusterView;

/// Takes and verifies the snapshot a recovery starts from; the record of the recovery.
pub async fn start(
    ctx: &Context,
    recorder: &Recorder,
    cluster: &EtcdCluster,
    view: &ClusterView,
    obs: &Observation,
    from: &RecoverFrom,
    lost: &[String],
) -> Result<RecoveryStatus, Error> {
    let events = Events::of(recorder, cluster);
    let mut record = RecoveryStatus {
        started: Some(Time(Timestamp::now())),
        members_lost: i32::try_from(lost.len()).unwrap_or(i32::MAX),
        ..RecoveryStatus::default()
    };
    match from {
        RecoverFrom::Member { name, .. } => {
            let endpoint = obs
                .endpoint_of(name)
                .ok_or_else(|| Error::NoEndpoint(name.clone()))?;
            let checked = recovery_source::verify_member(&obs.access, endpoint).await?;
            record.from_member = Some(name.clone());
            record.member_endpoint = Some(view.client_url(name));
            record.sha256 = checked.sha256;
            record.revision = obs
                .model
                .members
                .as_ref()
                .ok()
                .and_then(|m| m.iter().find(|m| &m.name == name))
                .map(|m| m.revision)
                .filter(|r| *r > 0);
        }
        RecoverFrom::Backup => {
            let (seed, origin, skipped) =
                recovery_source::newest_backup(&ctx.client, view, cluster.status.as_ref())
                    .await
                    .map_err(|e| Error::Recovery(e.to_string()))?;
            if !skipped.is_empty() {
                let note = format!("skipped: {}", skipped.join("; "));
                events.warning("RecoverySnapshotSkipped", note).await;
            }
            tracing::info!(cluster = %view.name, namespace = %view.namespace, %origin, "recovering from a backup");
            record.sha256 = seed.sha256.clone();
            record.revision = seed.revision;
            record.from_backup = Some(seed);
        }
    }
    // Everything of the lost cluster: its pods, its claims, its members' names and the names
    // its last status knew (so the new first member's name, and with it its cluster token, is
    // one no member of the lost cluster ever had, also when nothing of it is left to see).
    let known = cluster
        .status
        .as_ref()
        .and_then(|s| s.members.as_ref())
        .map(|m| {
            m.ready
                .iter()
                .chain(&m.unready)
                .chain(&m.learners)
                .cloned()
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    if lost.is_empty() {
        // Nothing of the cluster answered: every member its last status knew is lost: its
        // members' names or, once a status written after the pods went lists none, the member
        // count it last read (`status.size` keeps it while no member answers).
        let last_size = cluster
            .status
            .as_ref()
            .and_then(|s| s.size)
            .and_then(|s| usize::try_from(s).ok())
            .unwrap_or(0);
        record.members_lost = i32::try_from(known.len().max(last_size)).unwrap_or(i32::MAX);
    }
    let mut replaced: Vec<String> = obs
        .model
        .pods
        .iter()
        .map(|p| p.name.clone())
        .chain(obs.model.claims.iter().cloned())
        .chain(obs.model.deleting_claims.iter().cloned())
        .chain(
            obs.model
                .members
                .as_ref()
                .map(|m| m.iter().map(|m| m.name.clone()).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .chain(known)
        .collect();
    replaced.sort();
    replaced.dedup();
    record.replaced = replaced;
    if view.recover_now {
        remove_approval(ctx, view).await?;
        let (annotation, value) = (names::ANNOTATION_RECOVER, names::RECOVER_NOW);
        let note = format!("{annotation}={value} acted on and removed");
        events.normal("RecoveryApproved", note).await;
    }
    Ok(record)
}

/// The Event's words for a recovery just started.
pub fn started_note(record: &RecoveryStatus) -> String {
    format!(
        "quorum lost for good ({} voting members lost their data): recovering from {}, snapshot verified (sha256 {}, revision {}); the cluster is replaced by one seeded from it",
        record.members_lost,
        source_of(record),
        record.sha256,
        record
            .revision
            .map_or_else(|| "unknown".to_string(), |r| r.to_string())
    )
}

/// Removes an approval that approves nothing (see
/// [`crate::planner::recovery::approval_is_stale`]), with an Event saying so.
pub async fn discard_stale_approval(
    ctx: &Context,
    recorder: &Recorder,
    cluster: &EtcdCluster,
    view: &ClusterView,
) -> Result<(), Error> {
    remove_approval(ctx, view).await?;
    let (annotation, value) = (names::ANNOTATION_RECOVER, names::RECOVER_NOW);
    let note = format!(
        "{annotation}={value} removed: the cluster has its quorum and nothing was lost; an approval belongs to one loss, so annotate again when the status asks for it (QuorumLostForGood)"
    );
    Events::of(recorder, cluster)
        .normal("RecoveryApprovalDiscarded", note)
        .await;
    Ok(())
}

/// Removes the approval annotation (a JSON merge patch of metadata only).
async fn remove_approval(ctx: &Context, view: &ClusterView) -> Result<(), Error> {
    let api: Api<EtcdCluster> = Api::namespaced(ctx.client.clone(), &view.namespace);
    let patch = serde_json::json!({
        "metadata": { "annotations": { names::ANNOTATION_RECOVER: null } }
    });
    api.patch(&view.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::kube(format!(
            "remove the {} annotation",
            names::ANNOTATION_RECOVER
        )))?;
    Ok(())
}
