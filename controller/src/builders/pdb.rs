//! The PodDisruptionBudget that keeps a voluntary disruption (a node drain) from taking
//! the cluster below quorum: it counts the voting members that exist, not the size the spec
//! asks for (a scale-down that waits, paused or blocked, leaves more voters running), and the
//! budget sees what the operator sees: a voter the operator knows is unhealthy while its pod
//! is Ready (a frozen or leaderless member behind the TCP readiness probe of etcd 3.2 and 3.3)
//! is not counted as one that may be evicted. A step that raises the quorum (a voter added, a
//! learner promoted) gets its budget before it is carried out ([`min_available_after`]).

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use etcd_shared::names;

use crate::planner::{Observed, Step};
use crate::view::ClusterView;

/// The budget's `minAvailable`: a majority of the voting members in the member list, plus
/// every other member pod the budget's selector counts (learners, pods of removed members), so
/// that however the evictions fall, a majority of the voters stays. While the member list
/// cannot be read, every member pod (no voluntary eviction while the operator is blind); with
/// no pod at all, a majority of the spec's size. For one voter this blocks voluntary evictions
/// altogether: a single member cannot be moved without an outage.
pub fn min_available(view: &ClusterView, obs: &Observed) -> usize {
    let pods: Vec<&str> = obs
        .pods
        .iter()
        .filter(|p| !p.terminating)
        .map(|p| p.name.as_str())
        .collect();
    match &obs.members {
        Ok(members) => {
            let voters: Vec<&str> = members
                .iter()
                .filter(|m| !m.learner)
                .map(|m| m.name.as_str())
                .collect();
            let others = pods.iter().filter(|p| !voters.contains(p)).count();
            // Pods the budget counts as healthy (Ready) whose voter is not: evicting a healthy
            // one instead would leave fewer healthy voters than the budget believes.
            let unhealthy_ready = members
                .iter()
                .filter(|m| !m.learner && !m.health.is_healthy())
                .filter(|m| obs.pod(&m.name).is_some_and(|p| p.ready && !p.terminating))
                .count();
            ClusterView::quorum(voters.len()) + others + unhealthy_ready
        }
        Err(_) if pods.is_empty() => ClusterView::quorum(view.size),
        Err(_) => pods.len(),
    }
}

/// The budget's `minAvailable` for carrying out `step`: the stricter of now's and the one
/// after it, so a step that raises the quorum (a voter added, a learner promoted) is covered
/// before a drain can use the old, lower one.
pub fn min_available_after(view: &ClusterView, obs: &Observed, step: &Step) -> usize {
    let now = min_available(view, obs);
    let raised = match (step, &obs.members) {
        (Step::AddMember { learner: false, .. }, Ok(members)) => {
            let voters = members.iter().filter(|m| !m.learner).count();
            let others = min_available(view, obs) - ClusterView::quorum(voters);
            ClusterView::quorum(voters + 1) + others
        }
        (Step::PromoteLearner { .. }, Ok(members)) => {
            let voters = members.iter().filter(|m| !m.learner).count();
            // The learner's pod already counts among the others; as a voter it counts in the
            // new quorum instead.
            let others = min_available(view, obs) - ClusterView::quorum(voters);
            ClusterView::quorum(voters + 1) + others.saturating_sub(1)
        }
        _ => now,
    };
    now.max(raised)
}

/// The cluster's budget for carrying out `step` (see [`min_available_after`]).
pub fn disruption_budget_for(
    view: &ClusterView,
    obs: &Observed,
    step: &Step,
) -> PodDisruptionBudget {
    with_min_available(view, obs, min_available_after(view, obs, step))
}

/// The cluster's budget (see [`min_available`]).
pub fn disruption_budget(view: &ClusterView, obs: &Observed) -> PodDisruptionBudget {
    with_min_available(view, obs, min_available(view, obs))
}

fn with_min_available(view: &ClusterView, obs: &Observed, min: usize) -> PodDisruptionBudget {
    // CoreOS' member pods being adopted are members the budget protects too.
    let coreos = obs.pods.iter().any(|p| p.coreos && !p.terminating);
    let selector = super::services::member_selector(view, coreos);
    let labels = names::object_labels(&view.name, "disruption-budget");
    let quorum = i32::try_from(min).unwrap_or(i32::MAX);
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(names::pdb_name(&view.name)),
            namespace: Some(view.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![view.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(quorum)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::MemberState;
    use crate::planner::fixtures::{healthy_member, ready_pod};
    use crate::view::fixtures::view_of;

    fn member(i: u32, learner: bool) -> MemberState {
        MemberState {
            learner,
            ..healthy_member(&format!("demo-{i}"), u64::from(i) + 1, None, i == 0)
        }
    }

    fn observed(voters: u32, learners: u32, extra_pods: u32) -> Observed {
        let n = voters + learners;
        Observed {
            pods: (0..n + extra_pods)
                .map(|i| ready_pod(i, "3.6.16"))
                .collect(),
            members: Ok((0..n).map(|i| member(i, i >= voters)).collect()),
            bootstrapped: true,
            ..Observed::default()
        }
    }

    fn min(spec: &str, obs: &Observed) -> Option<IntOrString> {
        disruption_budget(&view_of(spec), obs)
            .spec
            .and_then(|s| s.min_available)
    }

    /// Issue 23, item 1: the budget keeps a majority of the voters that run, whatever the
    /// spec says; learners and leftover pods never count towards it.
    #[test]
    fn budget_keeps_a_majority_of_the_voters_that_exist() {
        for (what, spec, obs, want) in [
            ("1 voter", "size: 1", observed(1, 0, 0), 1),
            ("3 voters", "size: 3", observed(3, 0, 0), 2),
            ("4 voters", "size: 4", observed(4, 0, 0), 3),
            ("5 voters", "size: 5", observed(5, 0, 0), 3),
            ("7 voters", "size: 7", observed(7, 0, 0), 4),
            (
                "5 voters, spec 3 (a paused or blocked scale-down)",
                "size: 3\npaused: true",
                observed(5, 0, 0),
                3,
            ),
            (
                "3 voters, spec 5 (scaling up)",
                "size: 5",
                observed(3, 0, 0),
                2,
            ),
            (
                "3 voters and a learner: the learner's pod may not stand in for a voter",
                "size: 5",
                observed(3, 1, 0),
                3,
            ),
            (
                "a removed member's pod still running counts as other",
                "size: 3",
                observed(3, 0, 1),
                3,
            ),
            (
                "member list unreadable: every pod stays",
                "size: 3",
                Observed {
                    pods: (0..3).map(|i| ready_pod(i, "3.6.16")).collect(),
                    ..Observed::default()
                },
                3,
            ),
            (
                "nothing yet: a majority of the spec",
                "size: 3",
                Observed::default(),
                2,
            ),
        ] {
            assert_eq!(min(spec, &obs), Some(IntOrString::Int(want)), "{what}");
        }
    }

    /// Issue 32, item 6: a voter the operator knows is unhealthy while its pod is Ready (a
    /// frozen 3.2 member behind its TCP probe) is not one a drain may count on; a step that
    /// raises the quorum gets its budget first.
    #[test]
    fn the_budget_sees_what_the_operator_sees() {
        let mut frozen = observed(3, 0, 0);
        if let Ok(m) = frozen.members.as_mut() {
            m[2].health = crate::planner::Health::Unhealthy("deadline exceeded".into());
        }
        assert_eq!(min("size: 3", &frozen), Some(IntOrString::Int(3)));
        let view = view_of("size: 5");
        let three = observed(3, 0, 0);
        let add_voter = crate::planner::fixtures::add_member(3, false);
        assert_eq!(min_available_after(&view, &three, &add_voter), 3);
        let add_learner = crate::planner::fixtures::add_member(3, true);
        assert_eq!(min_available_after(&view, &three, &add_learner), 2);
        let with_learner = observed(3, 1, 0);
        let promote = Step::PromoteLearner {
            id: 4,
            name: "demo-3".into(),
        };
        assert_eq!(min_available(&view, &with_learner), 3);
        assert_eq!(min_available_after(&view, &with_learner, &promote), 3);
        let four_and_learner = observed(4, 1, 0);
        assert_eq!(min_available(&view, &four_and_learner), 4);
        assert_eq!(
            min_available_after(&view, &four_and_learner, &promote),
            4,
            "5 voters: quorum 3, every pod a voter"
        );
        assert_eq!(
            min_available_after(&view, &three, &Step::Done),
            2,
            "nothing raised"
        );
    }
}
