//! Recovery from permanent quorum loss (pure decisions; issue 24).
//!
//! **When.** Only when quorum can never return on its own: the data of a majority of the
//! voting members is provably gone ([`permanent_loss`]): an emptyDir member whose pod is gone
//! or ended, a member whose claim is gone, a member that never started. A member whose data is
//! on its claim, or whose pod still runs, may come back: that loss is temporary and is waited
//! for, whatever the policy.
//!
//! **From what.** The surviving member with the most data (the highest raft index it
//! reports; the Snapshot RPC answers without quorum on every line 3.2-3.7), else, when no
//! member's data survives, the newest snapshot of the cluster's backups that checks.
//!
//! **How.** `spec.recovery.policy: Automatic`, or the approval annotation under `Manual`,
//! starts it ([`Step::StartRecovery`]): the snapshot is taken and verified first, the survivor
//! untouched. Then, from the record the status keeps (so a restart goes on where it stopped):
//! a new first member under a new name and cluster token restores the snapshot
//! ([`plan_recovery`]), and once it runs, the pods and claims of the lost cluster are removed,
//! the recovery is finished, and the cluster grows back to its size as usual.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::model::{MemberState, Observed, PodPhase};
use super::{
    Blocked, InitialState, PlannerSettings, SeedFrom, SeedPlan, Step, Waiting, is_durable,
    is_stuck, member_plan, next_index,
};
use crate::view::ClusterView;
use etcd_shared::names;
use etcd_shared::types::{RecoveryRecord, RecoveryStatus};

/// Where a recovery takes its data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoverFrom {
    /// The surviving member with the most data.
    Member {
        /// Its name.
        name: String,
        /// The raft index it reports.
        raft_index: u64,
    },
    /// The newest snapshot of the cluster's backups that checks (no member's data survives).
    Backup,
}

/// A quorum loss that cannot heal by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermanentLoss {
    /// Voting members whose data is gone.
    pub lost: Vec<String>,
    /// Voting members the cluster had.
    pub voters: usize,
    /// Where a recovery would take its data; `None` while a member that may hold data has not
    /// answered yet (it is waited for rather than passed over for an older backup).
    pub from: Option<RecoverFrom>,
}

/// Whether `m`'s data is provably gone.
fn data_gone(
    view: &ClusterView,
    obs: &Observed,
    m: &MemberState,
    settings: &PlannerSettings,
) -> bool {
    let on_claim = is_durable(view) && obs.has_claim(&m.name);
    if on_claim {
        return false;
    }
    match obs.pod(&m.name) {
        None => true,
        Some(p) => !m.started || p.phase == PodPhase::Ended || is_stuck(p, settings),
    }
}

/// The permanent loss of a cluster whose quorum is lost, if it is one. `None` for a temporary
/// loss (a majority of the voters still holds its data) and for a cluster that never formed.
pub fn permanent_loss(
    view: &ClusterView,
    obs: &Observed,
    settings: &PlannerSettings,
) -> Option<PermanentLoss> {
    match &obs.members {
        Ok(members) => {
            let voters: Vec<&MemberState> = members.iter().filter(|m| !m.learner).collect();
            let lost: Vec<String> = voters
                .iter()
                .filter(|m| data_gone(view, obs, m, settings))
                .map(|m| m.name.clone())
                .collect();
            if voters.len() - lost.len() >= ClusterView::quorum(voters.len()) {
                return None;
            }
            // Every member not lost may hold data: the one with the most that answers.
            let holders: Vec<&MemberState> = members
                .iter()
                .filter(|m| !data_gone(view, obs, m, settings))
                .collect();
            let best = holders
                .iter()
                .filter(|m| m.answered)
                .max_by_key(|m| (m.applied_index.max(m.raft_index), m.revision))
                .map(|m| RecoverFrom::Member {
                    name: m.name.clone(),
                    raft_index: m.applied_index.max(m.raft_index),
                });
            let from = match best {
                Some(member) => Some(member),
                None if holders.is_empty() => Some(RecoverFrom::Backup),
                None => None,
            };
            Some(PermanentLoss {
                lost,
                voters: voters.len(),
                from,
            })
        }
        Err(_) => {
            // Nobody answered the member list: only a cluster with nothing left that could hold
            // data (no pod that may run again, no claim) is known to be lost.
            let live = obs
                .pods
                .iter()
                .any(|p| p.phase != PodPhase::Ended && !is_stuck(p, settings));
            (obs.bootstrapped && !live && obs.claims.is_empty()).then(|| PermanentLoss {
                lost: obs.pods.iter().map(|p| p.name.clone()).collect(),
                voters: obs.pods.len(),
                from: Some(RecoverFrom::Backup),
            })
        }
    }
}

/// What a cluster whose quorum is lost for good does: recover (`Automatic`, or approved) or
/// say so and wait for the approval.
pub fn on_permanent_loss(view: &ClusterView, loss: PermanentLoss) -> Step {
    match loss.from {
        Some(from) if view.recover_automatically || view.recover_now => Step::StartRecovery {
            from,
            lost: loss.lost,
        },
        _ => Step::Blocked(Blocked::QuorumLostForGood {
            loss,
            approve: format!(
                "kubectl annotate etcdcluster {} -n {} {}={}",
                view.name,
                view.namespace,
                names::ANNOTATION_RECOVER,
                names::RECOVER_NOW
            ),
        }),
    }
}

/// The next step of a recovery in progress (`obs.recovery` is set): the new first member,
/// then, once it runs, the lost cluster's pods and claims removed one at a time, then done.
pub fn plan_recovery(
    view: &ClusterView,
    obs: &Observed,
    settings: &PlannerSettings,
) -> Option<Step> {
    let recovering = obs.recovery.as_ref()?;
    let seeded = obs
        .members
        .as_ref()
        .is_ok_and(|m| m.iter().any(|m| m.health.is_healthy()));
    if seeded {
        if let Some(pod) = recovering.replaced_pods.first() {
            return Some(Step::DeletePod(pod.clone()));
        }
        if let Some(claim) = recovering.replaced_claims.first() {
            return Some(Step::DeleteClaim(claim.clone()));
        }
        return Some(Step::FinishRecovery);
    }
    let live: Vec<_> = obs.pods.iter().filter(|p| !is_stuck(p, settings)).collect();
    Some(match live.as_slice() {
        [] => {
            let name = names::member_name(&view.name, next_index(view, obs));
            let mut plan = member_plan(view, &name, &[], InitialState::New, view.version);
            plan.seed = Some(recovering.seed.clone());
            Step::Bootstrap(plan)
        }
        [seed, ..] if seed.terminating => Step::Wait(Waiting::PodTerminating(seed.name.clone())),
        // Ended (its node went away): deleted, then created again (the survivor still runs).
        [seed, ..] if seed.phase == PodPhase::Ended => Step::DeletePod(seed.name.clone()),
        [seed, ..] if seed.phase == PodPhase::Pending => {
            Step::Wait(Waiting::MemberPending(seed.name.clone()))
        }
        [seed, ..] => Step::Wait(Waiting::MemberStarting(seed.name.clone())),
    })
}

/// What the new first member of a recovery is seeded from, by its record.
pub fn seed_plan(record: &RecoveryStatus) -> SeedPlan {
    let from = match (&record.from_backup, &record.member_endpoint) {
        (Some(seed), _) => SeedFrom::Store(Box::new(seed.clone())),
        (None, Some(endpoint)) => SeedFrom::Member(endpoint.clone()),
        // A record without a source cannot be written by this controller; the fetch fails
        // clearly on an empty endpoint.
        (None, None) => SeedFrom::Member(String::new()),
    };
    SeedPlan {
        from,
        sha256: record.sha256.clone(),
        bump_revision: true,
    }
}

/// Where a recovery's data came from, in words: `member NAME` or `S3 BUCKET/KEY`.
pub fn source_of(record: &RecoveryStatus) -> String {
    if let Some(member) = &record.from_member {
        return format!("member {member}");
    }
    let Some(seed) = &record.from_backup else {
        return "unknown".into();
    };
    let source = &seed.source;
    let (kind, path) = match (&source.s3, &source.abs, &source.gcs, &source.pvc) {
        (Some(s3), ..) => ("S3", s3.path.clone()),
        (None, Some(abs), ..) => ("ABS", abs.path.clone()),
        (None, None, Some(gcs), _) => ("GCS", gcs.path.clone()),
        (None, None, None, Some(pvc)) => ("PVC", format!("{}/{}", pvc.claim_name, pvc.path)),
        _ => ("backup", String::new()),
    };
    format!("{kind} {path}")
}

/// The recovery records after `step` was carried out at `now`: the record of a recovery just
/// started; the new first member's name once created; on [`Step::FinishRecovery`], the record
/// moved to `lastRecovery` with the time it finished.
pub fn records_after(
    recovering: Option<RecoveryStatus>,
    started: Option<RecoveryStatus>,
    last: Option<RecoveryRecord>,
    step: &Step,
    now: &Time,
) -> (Option<RecoveryStatus>, Option<RecoveryRecord>) {
    if let Some(started) = started {
        return (Some(started), last);
    }
    match (recovering, step) {
        (Some(r), Step::FinishRecovery) => {
            let record = RecoveryRecord {
                started: r.started.clone(),
                finished: Some(now.clone()),
                source: source_of(&r),
                revision: r.revision,
                sha256: r.sha256.clone(),
                members_lost: r.members_lost,
            };
            (None, Some(record))
        }
        (Some(mut r), Step::Bootstrap(plan)) => {
            r.seed = Some(plan.name.clone());
            (Some(r), last)
        }
        (recovering, _) => (recovering, last),
    }
}
