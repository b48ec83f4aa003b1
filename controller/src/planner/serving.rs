//! The serving gate (pure decisions; issue 33, item 5): a member the operator is about to take
//! down on purpose (restarted on a new image, removed in a scale-down, blocked by a
//! defragmentation) leaves the client Service first, and comes back once it serves again, so
//! clients routed through the Service are not sent to a member that is going away.
//!
//! Member pods carry a readiness gate ([`etcd_shared::names::CONDITION_SERVING`]): the pod is
//! Ready only while the operator says the member serves. Before such a step the operator sets
//! the condition False ([`Step::SetServing`]) and waits until the client Service's
//! EndpointSlices no longer list the pod ([`Waiting::LeavingService`]); only then is the step
//! carried out. A member whose gate is False comes back into the Service ([`Step::SetServing`]
//! True) once it answers with a leader on the version its pod runs, its restart done. Pods made
//! before the gate existed (or by CoreOS' operator) have none and are stopped as before.

use std::time::Duration;

use super::model::{Health, Observed, PodState};
use super::{RemovalReason, Step, Waiting};

/// How long a member stays out of the client Service before it is taken down, once the
/// EndpointSlices dropped it: kube-proxy applies an EndpointSlice change within about a second
/// (its minimum sync period); until then new connections through the ClusterIP still reach the
/// pod.
pub const PROXY_PROPAGATION: Duration = Duration::from_secs(2);

/// The member a step takes down on purpose, if any.
fn taken_down(step: &Step) -> Option<&str> {
    match step {
        Step::UpgradeMember { name, .. } | Step::Defragment { name, .. } => Some(name),
        Step::RemoveMember {
            name,
            reason: RemovalReason::ScaleDown | RemovalReason::Rollout,
            ..
        } => Some(name),
        _ => None,
    }
}

/// Whether the member of `pod`, out of the Service, serves again: a voter (not a learner) that
/// answers with a leader, on the version its pod runs, its pod's restart done; or the member list cannot be read (the
/// operator does not keep a member out of the Service for its own blindness: the readiness
/// probe still guards it).
fn serves_again(obs: &Observed, pod: &PodState) -> bool {
    if pod.serving != Some(false) || pod.terminating || pod.restart_pending() {
        return false;
    }
    let Ok(members) = &obs.members else {
        return true;
    };
    // A learner answers but refuses clients' requests (`rpc not supported for learner`): it
    // joins the Service once it is a voter.
    members.iter().any(|m| {
        m.name == pod.name
            && !m.learner
            && matches!(&m.health, Health::Healthy { version, .. }
                if version.is_none() || pod.version.is_none() || *version == pod.version)
    })
}

/// `step`, or the serving-gate step that must come before it: a member that serves again is
/// put back into the Service first; the member `step` takes down leaves the Service before it.
/// While `held` (a point-in-time restore replays its changes) no member is let in.
pub fn gate(obs: &Observed, step: Step, held: bool) -> Step {
    let victim = taken_down(&step);
    if let Some(back) = obs
        .pods
        .iter()
        .filter(|_| !held)
        .find(|p| Some(p.name.as_str()) != victim && serves_again(obs, p))
    {
        return Step::SetServing {
            name: back.name.clone(),
            serving: true,
        };
    }
    let Some(victim) = victim else {
        return step;
    };
    let gate = obs
        .pod(victim)
        .filter(|p| !p.terminating)
        .and_then(|p| p.serving);
    match gate {
        Some(true) => Step::SetServing {
            name: victim.to_string(),
            serving: false,
        },
        Some(false)
            if obs
                .in_service
                .as_ref()
                .is_none_or(|listed| listed.iter().any(|n| n == victim))
                || obs
                    .pod(victim)
                    .and_then(|p| p.serving_changed)
                    .is_some_and(|ago| ago < PROXY_PROPAGATION) =>
        {
            Step::Wait(Waiting::LeavingService(victim.to_string()))
        }
        _ => step,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{healthy_member, ready_pod, upgrade_member};
    use crate::planner::{MemberState, Observed};

    fn cluster() -> Observed {
        Observed {
            pods: (0..3)
                .map(|i| PodState {
                    serving: Some(true),
                    ..ready_pod(i, "3.6.16")
                })
                .collect(),
            members: Ok((0..3)
                .map(|i| {
                    healthy_member(
                        &format!("demo-{i}"),
                        100 + i as u64,
                        "3.6.16".parse().ok(),
                        i == 0,
                    )
                })
                .collect::<Vec<MemberState>>()),
            bootstrapped: true,
            ..Observed::default()
        }
    }

    /// A member to be restarted leaves the Service first: its gate set False, then a wait until
    /// the EndpointSlices drop it, then the restart; once it serves again on the new version, it
    /// comes back before anything else moves.
    #[test]
    fn a_member_leaves_the_service_before_it_is_restarted_and_comes_back_after() {
        let upgrade = upgrade_member(1, "3.7.3");
        let mut obs = cluster();
        assert_eq!(
            gate(&obs, upgrade.clone(), false),
            Step::SetServing {
                name: "demo-1".into(),
                serving: false
            }
        );
        obs.pods[1].serving = Some(false);
        obs.in_service = Some(vec!["demo-0".into(), "demo-1".into(), "demo-2".into()]);
        assert_eq!(
            gate(&obs, upgrade.clone(), false),
            Step::Wait(Waiting::LeavingService("demo-1".into()))
        );
        obs.in_service = None;
        assert_eq!(
            gate(&obs, upgrade.clone(), false),
            Step::Wait(Waiting::LeavingService("demo-1".into())),
            "the EndpointSlices could not be read: wait"
        );
        obs.in_service = Some(vec!["demo-0".into(), "demo-2".into()]);
        obs.pods[1].serving_changed = Some(Duration::from_secs(1));
        assert_eq!(
            gate(&obs, upgrade.clone(), false),
            Step::Wait(Waiting::LeavingService("demo-1".into())),
            "kube-proxy may not have applied it yet"
        );
        obs.pods[1].serving_changed = Some(PROXY_PROPAGATION);
        assert_eq!(
            gate(&obs, upgrade.clone(), false),
            upgrade,
            "out of the Service: restart"
        );
        // Restarting: the old container still answers, on the old version.
        obs.pods[1].version = "3.7.3".parse().ok();
        obs.pods[1].restarts_at_upgrade = Some(0);
        let wait = Step::Wait(Waiting::MemberUpgrading("demo-1".into()));
        assert_eq!(
            gate(&obs, wait.clone(), false),
            wait,
            "restart pending: stays out"
        );
        obs.pods[1].restarts = 1;
        assert_eq!(
            gate(&obs, wait.clone(), false),
            wait,
            "still on the old version: stays out"
        );
        if let Ok(m) = obs.members.as_mut() {
            m[1].health = Health::Healthy {
                version: "3.7.3".parse().ok(),
                leader: false,
            };
        }
        assert_eq!(
            gate(&obs, wait, false),
            Step::SetServing {
                name: "demo-1".into(),
                serving: true
            }
        );
    }

    /// Through the whole planner: an upgrade's first restart is preceded by the member leaving
    /// the Service; the budget does not count the member's own leaving against its restart.
    #[test]
    fn the_planner_takes_a_member_out_before_it_restarts_it() {
        let view = crate::view::fixtures::view_of("size: 3\nversion: 3.7.3");
        let settings = crate::planner::PlannerSettings::default();
        let mut obs = cluster();
        assert_eq!(
            crate::planner::plan(&view, &obs, &settings),
            Step::SetServing {
                name: "demo-1".into(),
                serving: false
            }
        );
        obs.pods[1].serving = Some(false);
        obs.in_service = Some(vec!["demo-0".into(), "demo-2".into()]);
        obs.disruptions_allowed = Some(0);
        assert_eq!(
            crate::planner::plan(&view, &obs, &settings),
            upgrade_member(1, "3.7.3")
        );
    }

    /// A learner answers with a leader but refuses clients' requests: it joins the Service
    /// once it is promoted, not before.
    #[test]
    fn a_learner_stays_out_of_the_service_until_it_is_a_voter() {
        let mut obs = cluster();
        obs.pods[2].serving = Some(false);
        if let Ok(m) = obs.members.as_mut() {
            m[2].learner = true;
        }
        assert_eq!(gate(&obs, Step::Done, false), Step::Done);
        if let Ok(m) = obs.members.as_mut() {
            m[2].learner = false;
        }
        assert_eq!(
            gate(&obs, Step::Done, false),
            Step::SetServing {
                name: "demo-2".into(),
                serving: true
            }
        );
    }

    /// Pods without the gate (an earlier operator's, CoreOS') are restarted as before; a
    /// removal for a replacement is not delayed (the member is gone already).
    #[test]
    fn pods_without_the_gate_are_not_delayed() {
        let mut obs = cluster();
        obs.pods[1].serving = None;
        let upgrade = upgrade_member(1, "3.7.3");
        assert_eq!(gate(&obs, upgrade.clone(), false), upgrade);
        let replace = crate::planner::fixtures::remove_member(2, RemovalReason::Replace);
        assert_eq!(gate(&cluster(), replace.clone(), false), replace);
    }

    /// While a point-in-time restore replays its changes, no member is let into the Service.
    #[test]
    fn held_clients_keep_every_member_out() {
        let mut obs = cluster();
        for p in &mut obs.pods {
            p.serving = Some(false);
        }
        assert!(matches!(
            gate(&obs, Step::Done, false),
            Step::SetServing { serving: true, .. }
        ));
        assert_eq!(gate(&obs, Step::Done, true), Step::Done);
    }
}
