//! Adopting a cluster CoreOS' operator left running (pure decisions; issue 28).
//!
//! CoreOS' member pods (bare pods, `restartPolicy: Never`, labels `app=etcd`,
//! `etcd_cluster=NAME`, `etcd_node=MEMBER`) are members like any other for the safety rules:
//! their health counts for quorum, a pod that ended took its data with it and its member is
//! replaced, nothing is bootstrapped while they exist. What differs is that they are never
//! upgraded, restarted or recreated: once every member is healthy, this operator's members are
//! added one at a time (voters on 3.2/3.3, learners promoted once caught up on 3.4+) until it
//! runs the spec's size of its own, then CoreOS' members are removed one at a time, followers
//! first and the leader last (leadership handed to one of this operator's members first where
//! the line has MoveLeader), each pod deleted only once its member is out of the member list.

use etcd_shared::names;

use super::model::{Health, MemberState, Observed};
use super::{Handover, RemovalReason, Step, member_capabilities, next_index};
use crate::view::ClusterView;

/// Member pods CoreOS' operator created after this operator took the cluster over: CoreOS'
/// made pods this operator's status did not list when it last wrote it (`previous_coreos`,
/// from a status this operator wrote: `ours`), plus those found before (`previous_found`)
/// that are still there. CoreOS' operator deletes this operator's members as "unexpected" and
/// makes its own again; each operator acting on the other's pods would go on forever.
pub fn another_operator(
    obs: &Observed,
    ours: bool,
    previous_coreos: &[String],
    previous_found: &[String],
) -> Vec<String> {
    if !ours {
        return Vec::new();
    }
    let mut found: Vec<String> = obs
        .pods
        .iter()
        .filter(|p| p.coreos)
        .filter(|p| !previous_coreos.contains(&p.name) || previous_found.contains(&p.name))
        .map(|p| p.name.clone())
        .collect();
    found.sort();
    found
}

fn is_leader(m: &MemberState) -> bool {
    matches!(m.health, Health::Healthy { leader: true, .. })
}

/// The next step of an adoption, for a cluster whose members are all healthy: `None` once no
/// member of CoreOS' operator is left in the member list.
pub fn adopt(view: &ClusterView, obs: &Observed, members: &[MemberState]) -> Option<Step> {
    let coreos: Vec<&MemberState> = members.iter().filter(|m| obs.is_coreos(&m.name)).collect();
    if coreos.is_empty() {
        return None;
    }
    let ours = members.len() - coreos.len();
    if ours < view.size {
        let name = names::member_name(&view.name, next_index(view, obs));
        return Some(Step::AddMember {
            peer_url: super::new_member_peer_url(view, obs, members, &name),
            name,
            learner: member_capabilities(view, obs, members).learners,
        });
    }
    // Followers first (by name), the leader last.
    let victim = coreos
        .iter()
        .min_by_key(|m| (is_leader(m), m.name.clone()))?;
    if is_leader(victim) && member_capabilities(view, obs, members).move_leader {
        let successor = members
            .iter()
            .filter(|m| !obs.is_coreos(&m.name) && !m.learner && m.started)
            .filter(|m| m.health.is_healthy() && obs.pod(&m.name).is_some_and(|p| p.ready))
            .min_by_key(|m| m.name.clone());
        if let Some(to) = successor {
            return Some(Step::TransferLeadership {
                from: victim.name.clone(),
                to: to.name.clone(),
                to_id: to.id,
                before: Handover::Removal,
            });
        }
    }
    Some(Step::RemoveMember {
        id: victim.id,
        name: victim.name.clone(),
        reason: RemovalReason::Adopted,
    })
}
