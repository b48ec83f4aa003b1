//! Replacing members whose TLS files are out of date (issue 34): etcd reads its trusted CA
//! files once, at start, and 3.2 serves the certificates it started with until it restarts. A
//! CA rotation (the members must trust the old and the new CA, then the new alone) and a
//! renewed certificate on a line that does not reload it reach a member only through a new
//! process; a member pod cannot be restarted in place without a change to its spec, and an
//! emptyDir member whose pod is deleted loses its data. So a member made with old files is
//! replaced, one at a time, surge first:
//!
//! 1. with every member healthy and Ready and as many members as the spec asks for, a member
//!    is added (a learner where the line has them) whose pod is made with the current files;
//! 2. once it is a voter (the cluster is one over its size), an outdated member is removed:
//!    followers first, the leader last after it handed leadership to a member made with the
//!    current files;
//! 3. its pod and claim go as any removed member's do, and the next one follows.
//!
//! The same replacement carries a running cluster from plain HTTP to TLS: members that speak
//! otherwise than the cluster asks are outdated too, the least current first (a member that
//! cannot dial a TLS peer before a bridge), each new member a bridge or a TLS member as
//! [`crate::view::transport`] decides.
//!
//! The cluster never has fewer healthy voters than its size during the rollout, and the data
//! is copied by raft, as in any scale-up. Pods that recorded no fingerprints (made by an
//! earlier operator) count as current, except during a CA rotation, when what they trust is
//! unknown and they are replaced too.

use etcd_shared::names;

use super::model::{Health, MemberState, Observed, PodPhase, PodState};
use super::{
    Handover, PlannerSettings, RemovalReason, Step, Waiting, member_capabilities, next_index,
};
use crate::view::ClusterView;
use crate::view::transport::TransportStage;

/// Whether the member of `pod` runs with the TLS files the Secrets hold now (or with files its
/// line reloads).
fn files_current(obs: &Observed, pod: &PodState) -> bool {
    let Some(files) = &obs.tls else {
        return true;
    };
    // No trust fingerprint in the files: what the members trust is not tracked (cert-manager's
    // CA, outside a switch).
    let trust_ok = match (&pod.tls.trust, &files.current.trust) {
        (Some(t), Some(current)) => t == current,
        (Some(_), None) => true,
        (None, _) => !files.rotating,
    };
    let reloads = pod
        .version
        .and_then(|v| v.capabilities())
        .is_some_and(|c| c.reloads_certificates);
    let leaves_ok = reloads
        || match &pod.tls.leaves {
            Some(l) => Some(l) == files.current.leaves.as_ref(),
            None => true,
        };
    trust_ok && leaves_ok
}

/// Whether the member of `pod` mounts the certificate Secrets the cluster's members use now
/// (during a switch of the certificates' source: the switch Secret, then the new source's).
fn mounts_current(view: &ClusterView, pod: &PodState) -> bool {
    let wanted = [&view.tls.peer_secret, &view.tls.server_secret];
    pod.tls_secrets
        .iter()
        .all(|s| wanted.iter().any(|w| w.as_deref() == Some(s.as_str())))
}

/// How current a member pod is, lowest first: how far its transport is from what the cluster
/// asks (a switch from plain HTTP to TLS), then whether it mounts the current certificate
/// Secrets and their files are current. A pod whose flags name no peer URL counts as speaking
/// as the cluster asks.
fn currency(view: &ClusterView, obs: &Observed, pod: &PodState) -> (TransportStage, bool) {
    let stage = pod
        .transport
        .map_or(TransportStage::Target, |t| t.stage(view));
    (stage, mounts_current(view, pod) && files_current(obs, pod))
}

/// Whether the member of `pod` must be replaced: it speaks otherwise than the cluster asks,
/// or runs with TLS files it must no longer use.
pub fn outdated(view: &ClusterView, obs: &Observed, pod: &PodState) -> bool {
    currency(view, obs, pod) != (TransportStage::Target, true)
}

fn is_leader(m: &MemberState) -> bool {
    matches!(m.health, Health::Healthy { leader: true, .. })
}

/// The currency of a member by its pod (`None`: no pod).
fn member_currency(
    view: &ClusterView,
    obs: &Observed,
    m: &MemberState,
) -> Option<(TransportStage, bool)> {
    obs.pod(&m.name).map(|p| currency(view, obs, p))
}

fn member_outdated(view: &ClusterView, obs: &Observed, m: &MemberState) -> bool {
    obs.pod(&m.name).is_some_and(|p| outdated(view, obs, p))
}

/// Whether a member pod must be replaced: a rollout is in progress.
pub fn in_progress(view: &ClusterView, obs: &Observed) -> bool {
    obs.pods
        .iter()
        .any(|p| !p.terminating && outdated(view, obs, p))
}

/// Whether a member pod speaks otherwise than the cluster asks: a switch from plain HTTP to
/// TLS is in progress.
pub fn switching_transport(view: &ClusterView, obs: &Observed) -> bool {
    obs.pods.iter().any(|p| {
        !p.terminating
            && p.transport
                .is_some_and(|t| t.stage(view) != TransportStage::Target)
    })
}

/// The members to be replaced, by name.
pub fn outdated_members(
    view: &ClusterView,
    obs: &Observed,
    members: &[MemberState],
) -> Vec<String> {
    members
        .iter()
        .filter(|m| member_outdated(view, obs, m))
        .map(|m| m.name.clone())
        .collect()
}

/// Step 1: the member that replaces an outdated one, for a cluster whose members are all
/// healthy and as many as its spec asks for; `None` when no member is outdated or a pod is not
/// Ready (a second member out would cost the client Service and the budget).
pub fn surge(view: &ClusterView, obs: &Observed, members: &[MemberState]) -> Option<Step> {
    if members.len() != view.size || !members.iter().any(|m| member_outdated(view, obs, m)) {
        return None;
    }
    // Certificates the operator or cert-manager makes are waited for (a switch to TLS starts
    // before cert-manager wrote its Secrets): a pod cannot start without its Secrets.
    let issued = view.tls.issuing.is_some() || view.tls.cert_manager.is_some();
    if issued && obs.tls.is_none() {
        return None;
    }
    if members
        .iter()
        .any(|m| !m.health.is_healthy() || obs.pod(&m.name).is_none_or(|p| !p.ready))
    {
        return None;
    }
    let name = names::member_name(&view.name, next_index(view, obs));
    Some(Step::AddMember {
        peer_url: super::new_member_peer_url(view, obs, members, &name),
        name,
        learner: member_capabilities(view, obs, members).learners,
    })
}

/// Step 2: with the cluster over its size, the outdated member that goes (followers first,
/// by name), or the leadership handover before the leader goes; `None` when no member is
/// outdated (a scale-down then picks its own).
pub fn removal(
    view: &ClusterView,
    obs: &Observed,
    members: &[MemberState],
    settings: &PlannerSettings,
) -> Option<Step> {
    if members.len() <= view.size {
        return None;
    }
    // The least current first (a member that cannot dial a TLS peer before a bridge), the
    // leader last among equals.
    let victim = members
        .iter()
        .filter(|m| member_outdated(view, obs, m))
        .min_by_key(|m| (member_currency(view, obs, m), is_leader(m), m.name.clone()))?;
    let victim_currency = member_currency(view, obs, victim);
    // The member that replaces it may still be starting (a voter on lines without learners):
    // it is waited for, not taken for an unhealthy member to scale away.
    if let Some(starting) = members.iter().find(|m| {
        !m.health.is_healthy()
            && !member_outdated(view, obs, m)
            && obs.pod(&m.name).is_none_or(|p| {
                p.phase == PodPhase::Pending || !m.started || p.age < settings.member_start
            })
    }) {
        return Some(Step::Wait(Waiting::MemberStarting(starting.name.clone())));
    }
    if members.iter().any(|m| !m.health.is_healthy()) {
        return None;
    }
    let voters = members.iter().filter(|m| !m.learner).count();
    let healthy_voters = voters;
    let healthy_after = healthy_voters - usize::from(victim.health.is_healthy() && !victim.learner);
    if healthy_after < ClusterView::quorum(voters.saturating_sub(1)) {
        return None;
    }
    if is_leader(victim) && member_capabilities(view, obs, members).move_leader {
        let successor = members
            .iter()
            .filter(|m| m.id != victim.id && !m.learner && m.started && m.health.is_healthy())
            .filter(|m| obs.pod(&m.name).is_some_and(|p| p.ready))
            .filter(|m| member_currency(view, obs, m) > victim_currency)
            .max_by_key(|m| {
                (
                    member_currency(view, obs, m),
                    std::cmp::Reverse(m.name.clone()),
                )
            });
        if let Some(to) = successor {
            return Some(Step::TransferLeadership {
                from: victim.name.clone(),
                to: to.name.clone(),
                to_id: to.id,
                before: Handover::Rollout,
            });
        }
    }
    Some(Step::RemoveMember {
        id: victim.id,
        name: victim.name.clone(),
        reason: RemovalReason::Rollout,
    })
}
