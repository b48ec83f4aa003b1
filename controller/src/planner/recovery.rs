//! Recovery from permanent quorum loss (pure decisions; issues 24 and 32).
//!
//! **When.** Only when quorum can never return on its own and nothing still has one: the data
//! of a majority of the voting members is *known* to be gone ([`permanent_loss`]): an emptyDir
//! member whose process is known to have stopped ([`super::liveness`]: its pod ended, its node
//! is gone or out of service, or its Ready kubelet reported it stopped), a member whose claim is
//! gone, a member that never started. A member whose data is on its claim, whose pod still
//! runs, or whose pod is terminating or gone while its node is silent may come back (or may
//! still be serving): that loss is waited for, whatever the policy. No member may answer with
//! a leader, and fewer than a majority may answer at all.
//!
//! **From what.** The surviving member with the most data (the highest raft index it
//! reports; the Snapshot RPC answers without quorum on every line 3.2-3.7), else, when no
//! member's data survives, the newest snapshot of the cluster's backups that checks.
//!
//! **How.** `spec.recovery.policy: Automatic`, or the approval annotation under `Manual`,
//! starts it ([`Step::StartRecovery`]): the snapshot is taken and verified first, the survivor
//! untouched. Then, from the record the status keeps (so a restart goes on where it stopped):
//! a new first member under a new name and cluster token restores the snapshot, checked
//! against the verified hash ([`plan_recovery`]); the new cluster grows as usual, and only once
//! it holds a quorum of its own size are the lost cluster's pods (those not already being
//! deleted) and claims removed: until then the survivor keeps the only other copy. Should a
//! member of the lost cluster answer with a leader at any point (it was not lost after all),
//! the recovery stops ([`Step::AbortRecovery`]) and the cluster goes back to normal operation.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::liveness::{Liveness, Unconfirmed, liveness, of_pod};
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

/// Whether `m`'s data is known to be gone.
fn data_gone(view: &ClusterView, obs: &Observed, m: &MemberState) -> bool {
    let on_claim = is_durable(view) && obs.has_claim(&m.name);
    if on_claim || m.answered {
        return false;
    }
    !m.started || liveness(obs, &m.name).is_stopped()
}

/// The voters whose data may be gone but is not known to be: their pods are terminating or
/// gone while their processes may still run (see [`super::liveness`]).
pub fn unconfirmed_losses(view: &ClusterView, obs: &Observed) -> Vec<Unconfirmed> {
    let Ok(members) = &obs.members else {
        return Vec::new();
    };
    members
        .iter()
        .filter(|m| !m.learner && m.started && !m.answered)
        .filter(|m| !(is_durable(view) && obs.has_claim(&m.name)))
        .filter_map(|m| match liveness(obs, &m.name) {
            Liveness::Unconfirmed(u) => Some(u),
            Liveness::Present | Liveness::Stopped(_) => None,
        })
        .collect()
}

/// The permanent loss of a cluster whose quorum is lost, if it is one. `None` for a temporary
/// loss (a majority of the voters may still hold its data), while any member answers with a
/// leader or a majority of the voters answers at all (something still has, or may regain, a
/// quorum), and for a cluster that never formed.
pub fn permanent_loss(
    view: &ClusterView,
    obs: &Observed,
    settings: &PlannerSettings,
) -> Option<PermanentLoss> {
    match &obs.members {
        Ok(members) => {
            let voters: Vec<&MemberState> = members.iter().filter(|m| !m.learner).collect();
            let quorum = ClusterView::quorum(voters.len());
            let answering = voters.iter().filter(|m| m.answered).count();
            let may_have_quorum =
                voters.iter().any(|m| m.health.is_healthy()) || answering >= quorum;
            if may_have_quorum && !settings.broken_recover_beside_a_quorum {
                return None;
            }
            let lost: Vec<String> = voters
                .iter()
                .filter(|m| data_gone(view, obs, m))
                .map(|m| m.name.clone())
                .collect();
            if voters.len() - lost.len() >= quorum {
                return None;
            }
            // Every member not lost may hold data: the one with the most that answers.
            let holders: Vec<&MemberState> = members
                .iter()
                .filter(|m| !data_gone(view, obs, m))
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
            // data or still run (no pod or deleted pod whose process may run, no claim) is known
            // to be lost.
            let may_run = obs.pods.iter().any(|p| !of_pod(p).is_stopped())
                || obs
                    .absent
                    .iter()
                    .any(|a| !liveness(obs, &a.member).is_stopped());
            (obs.bootstrapped && !may_run && obs.claims.is_empty()).then(|| PermanentLoss {
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

/// Whether the approval annotation (`recover=now`) approves nothing: the cluster has its
/// quorum (a majority of its voters healthy) and no recovery starts. An approval belongs to
/// the loss it approves; kept on a healthy cluster it would silently approve the next one,
/// weeks later, with no one asked (a GitOps tool re-applying it does the same).
pub fn approval_is_stale(view: &ClusterView, obs: &Observed, step: &Step) -> bool {
    if !view.recover_now || matches!(step, Step::StartRecovery { .. }) || obs.recovery.is_some() {
        return false;
    }
    obs.members.as_ref().is_ok_and(|members| {
        let voters: Vec<&MemberState> = members.iter().filter(|m| !m.learner).collect();
        let healthy = voters.iter().filter(|m| m.health.is_healthy()).count();
        !voters.is_empty() && healthy >= ClusterView::quorum(voters.len())
    })
}

/// The next step of a recovery in progress (`obs.recovery` is set): the new first member;
/// then, while the new cluster holds fewer healthy members than a quorum of its size, `None`
/// (it grows as any cluster does, the survivor kept); then the lost cluster's pods (those not
/// already being deleted) and claims removed one at a time, then done. A lost cluster that
/// answers with a leader stops it.
pub fn plan_recovery(
    view: &ClusterView,
    obs: &Observed,
    settings: &PlannerSettings,
) -> Option<Step> {
    let recovering = obs.recovery.as_ref()?;
    if let Some(why) = &recovering.lost_cluster_serves
        && !settings.broken_recover_beside_a_quorum
    {
        return Some(Step::AbortRecovery { why: why.clone() });
    }
    let members = obs.members.as_ref().map_or(&[][..], Vec::as_slice);
    let healthy = members.iter().filter(|m| m.health.is_healthy()).count();
    if healthy > 0 {
        // Keep the only other copy until the new cluster is one a single failure cannot lose:
        // a quorum of its size of voters (a learner counts for no quorum) that answer and serve
        // (their pods Ready, in the client Service).
        let serving_voters = members
            .iter()
            .filter(|m| m.health.is_healthy() && !m.learner)
            .filter(|m| obs.pod(&m.name).is_some_and(|p| p.in_service))
            .count();
        if serving_voters < ClusterView::quorum(view.size) {
            return None;
        }
        if let Some(pod) = recovering.replaced_pods.iter().find(|p| !p.terminating) {
            return Some(Step::DeletePod(pod.name.clone()));
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

/// Where a recovery's data comes from, as a metric label: `member` or `backup`.
pub fn source_kind(record: &RecoveryStatus) -> &'static str {
    if record.from_member.is_some() {
        "member"
    } else {
        "backup"
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
        // The lost cluster serves: the record goes, the last finished recovery stays.
        (Some(_), Step::AbortRecovery { .. }) => (None, last),
        (Some(mut r), Step::Bootstrap(plan)) => {
            r.seed = Some(plan.name.clone());
            (Some(r), last)
        }
        (recovering, _) => (recovering, last),
    }
}
