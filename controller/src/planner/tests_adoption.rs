//! Tests of the adoption of clusters CoreOS' operator left running (issue 28): the whole
//! sequence stepped through a model of the cluster, and the single decisions around it.

use std::time::Duration;

use super::*;
use crate::planner::fixtures::{healthy_member, ready_pod};
use crate::view::fixtures::view_of;

/// CoreOS' member names: the cluster name and 10 random characters.
const COREOS: [&str; 3] = ["demo-4bq7xk2m9z", "demo-8hd3n5wq1c", "demo-zp6t0r7y2f"];

fn coreos_pod(name: &str, version: &str) -> PodState {
    PodState {
        name: name.into(),
        image: format!("quay.io/coreos/etcd:v{version}"),
        created_on: None,
        data_created_on: None,
        coreos: true,
        ..ready_pod(0, version)
    }
}

fn member_named(name: &str, id: u64, version: &str, leader: bool) -> MemberState {
    MemberState {
        peer_url: Some(format!("http://{name}.demo.ns1.svc:2380")),
        ..healthy_member(name, id, version.parse().ok(), leader)
    }
}

/// Three healthy members made by CoreOS' operator at `version`, the second one leading.
fn coreos_cluster(version: &str) -> Observed {
    Observed {
        pods: COREOS.iter().map(|n| coreos_pod(n, version)).collect(),
        members: Ok(COREOS
            .iter()
            .enumerate()
            .map(|(i, n)| member_named(n, 900 + i as u64, version, i == 1))
            .collect()),
        bootstrapped: true,
        ..Observed::default()
    }
}

fn plan_for(spec: &str, obs: &Observed) -> Step {
    plan(&view_of(spec), obs, &PlannerSettings::default())
}

/// Carries out `step` on the model as the cluster would (a new member starts and catches up
/// at once; a removed member's etcd stops).
fn apply(obs: &mut Observed, step: &Step, version: &str, next_id: &mut u64) {
    let members = obs.members.as_mut().expect("a member list");
    match step {
        Step::AddMember { name, learner, .. } => {
            let mut m = member_named(name, *next_id, version, false);
            *next_id += 1;
            m.learner = *learner;
            m.started = false;
            m.health = Health::Unhealthy("not started".into());
            members.push(m);
        }
        Step::CreatePod(plan) => {
            let m = members
                .iter_mut()
                .find(|m| m.name == plan.name)
                .expect("the member was added");
            m.started = true;
            m.health = Health::Healthy {
                version: Some(plan.version),
                leader: false,
            };
            let index = names::member_index("demo", &plan.name).expect("our name");
            obs.pods.push(ready_pod(index, &plan.version.to_string()));
        }
        Step::PromoteLearner { name, .. } => {
            if let Some(m) = members.iter_mut().find(|m| &m.name == name) {
                m.learner = false;
            }
        }
        Step::RemoveMember { name, .. } => {
            members.retain(|m| &m.name != name);
            // The removed member's etcd exits: its pod (restartPolicy Never) fails.
            if let Some(p) = obs.pods.iter_mut().find(|p| &p.name == name) {
                p.phase = PodPhase::Ended;
                p.ready = false;
            }
        }
        Step::DeletePod(name) => obs.pods.retain(|p| &p.name != name),
        Step::TransferLeadership { to, .. } => {
            for m in members.iter_mut() {
                if let Health::Healthy { leader, .. } = &mut m.health {
                    *leader = &m.name == to;
                }
            }
        }
        other => panic!("unexpected step during an adoption: {other:?}"),
    }
}

/// Runs the planner on the model until it is done; the steps taken.
fn adopt_to_the_end(spec: &str, mut obs: Observed, version: &str) -> (Vec<Step>, Observed) {
    let mut steps = Vec::new();
    let mut next_id = 1;
    loop {
        let step = plan_for(spec, &obs);
        if step == Step::Done {
            return (steps, obs);
        }
        assert!(steps.len() < 40, "no end in sight: {steps:#?}");
        // At most one member joining or leaving at a time: a change starts only when every
        // member runs and is healthy (the learners of 3.4+ aside, which are promoted first).
        if matches!(step, Step::AddMember { .. } | Step::RemoveMember { .. }) {
            let members = obs.members.as_ref().expect("a member list");
            assert!(
                members
                    .iter()
                    .all(|m| m.started && m.health.is_healthy() && !m.learner),
                "{step:?} while a member is not a healthy voter: {members:#?}"
            );
        }
        apply(&mut obs, &step, version, &mut next_id);
        steps.push(step);
    }
}

fn names_of(steps: &[Step], f: impl Fn(&Step) -> Option<&str>) -> Vec<String> {
    steps.iter().filter_map(f).map(str::to_string).collect()
}

/// etcd 3.2 (no learners, no MoveLeader): three voters of this operator join one at a time,
/// then CoreOS' three leave one at a time, followers first, the leader last, each pod deleted
/// after its member is out; the cluster ends at its size on this operator's members alone.
#[test]
fn a_coreos_cluster_on_3_2_is_adopted_one_member_at_a_time() {
    let spec = "size: 3\nversion: 3.2.13";
    let (steps, end) = adopt_to_the_end(spec, coreos_cluster("3.2.13"), "3.2.13");
    let added = names_of(&steps, |s| match s {
        Step::AddMember { name, learner, .. } => {
            assert!(!learner, "3.2 has no learners");
            Some(name)
        }
        _ => None,
    });
    assert_eq!(added, ["demo-0", "demo-1", "demo-2"]);
    let removed = names_of(&steps, |s| match s {
        Step::RemoveMember {
            name,
            reason: RemovalReason::Adopted,
            ..
        } => Some(name),
        _ => None,
    });
    // Followers by name, then the leader (COREOS[1]); 3.2 cannot hand leadership over.
    assert_eq!(removed, [COREOS[0], COREOS[2], COREOS[1]]);
    assert!(
        !steps
            .iter()
            .any(|s| matches!(s, Step::TransferLeadership { .. })),
        "{steps:#?}"
    );
    // Every addition comes before any removal, and every pod goes after its member.
    let first_removal = steps
        .iter()
        .position(|s| matches!(s, Step::RemoveMember { .. }))
        .expect("a removal");
    assert!(
        steps[first_removal..]
            .iter()
            .all(|s| !matches!(s, Step::AddMember { .. }))
    );
    for name in COREOS {
        let out = steps
            .iter()
            .position(|s| matches!(s, Step::RemoveMember { name: n, .. } if n == name));
        let deleted = steps
            .iter()
            .position(|s| matches!(s, Step::DeletePod(n) if n == name));
        assert!(out < deleted, "{name}: {steps:#?}");
    }
    // Members joined at the version the cluster runs.
    for s in &steps {
        if let Step::CreatePod(plan) = s {
            assert_eq!(plan.version.to_string(), "3.2.13");
            assert_eq!(plan.state, InitialState::Existing);
        }
    }
    assert!(end.pods.iter().all(|p| !p.coreos));
    assert_eq!(end.members.as_ref().map(Vec::len).ok(), Some(3));
}

/// etcd 3.4+: this operator's members join as learners and are promoted before the next one;
/// the leader, last, hands leadership to one of this operator's voters before it is removed.
#[test]
fn a_coreos_cluster_on_3_4_joins_learners_and_hands_leadership_over() {
    let spec = "size: 3\nversion: 3.4.37";
    let (steps, end) = adopt_to_the_end(spec, coreos_cluster("3.4.37"), "3.4.37");
    let kinds: Vec<&str> = steps
        .iter()
        .map(|s| match s {
            Step::AddMember { learner: true, .. } => "add-learner",
            Step::CreatePod(_) => "pod",
            Step::PromoteLearner { .. } => "promote",
            Step::RemoveMember { .. } => "remove",
            Step::DeletePod(_) => "delete",
            Step::TransferLeadership { .. } => "handover",
            _ => "other",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "add-learner",
            "pod",
            "promote",
            "add-learner",
            "pod",
            "promote",
            "add-learner",
            "pod",
            "promote",
            "remove",
            "delete",
            "remove",
            "delete",
            "handover",
            "remove",
            "delete",
        ]
    );
    assert!(steps.contains(&Step::TransferLeadership {
        from: COREOS[1].into(),
        to: "demo-0".into(),
        to_id: 1,
        before: Handover::Removal,
    }));
    assert!(end.pods.iter().all(|p| !p.coreos));
}

#[test]
fn adoption_single_decisions() {
    let rows: Vec<(&str, &str, Observed, Step)> = vec![
        (
            "paused: nothing is adopted",
            "size: 3\nversion: 3.2.13\npaused: true",
            coreos_cluster("3.2.13"),
            Step::Blocked(Blocked::Paused),
        ),
        (
            "a CoreOS pod that failed (restartPolicy Never) took its data: its member is replaced",
            "size: 3\nversion: 3.2.13",
            {
                let mut o = coreos_cluster("3.2.13");
                o.pods[0].phase = PodPhase::Ended;
                o.pods[0].ready = false;
                o.members.as_mut().expect("members")[0].health =
                    Health::Unhealthy("connection refused".into());
                o
            },
            Step::RemoveMember {
                id: 900,
                name: COREOS[0].into(),
                reason: RemovalReason::Replace,
            },
        ),
        (
            "an unhealthy CoreOS member still running is waited for, nothing added",
            "size: 3\nversion: 3.2.13",
            {
                let mut o = coreos_cluster("3.2.13");
                o.members.as_mut().expect("members")[2].health =
                    Health::Unhealthy("no leader".into());
                o
            },
            Step::Wait(Waiting::Unhealthy(vec![COREOS[2].into()])),
        ),
        (
            "the spec's newer version waits until the adoption is over: members join at the running one",
            "size: 3\nversion: 3.3.27",
            coreos_cluster("3.2.13"),
            Step::AddMember {
                name: "demo-0".into(),
                peer_url: "http://demo-0.demo.ns1.svc:2380".into(),
                learner: false,
            },
        ),
        (
            "a smaller size: CoreOS' members still all go, after this operator's joined",
            "size: 1\nversion: 3.2.13",
            {
                let mut o = coreos_cluster("3.2.13");
                o.pods.push(ready_pod(0, "3.2.13"));
                o.members
                    .as_mut()
                    .expect("members")
                    .push(member_named("demo-0", 1, "3.2.13", false));
                o
            },
            Step::RemoveMember {
                id: 900,
                name: COREOS[0].into(),
                reason: RemovalReason::Adopted,
            },
        ),
    ];
    for (what, spec, obs, want) in rows {
        assert_eq!(plan_for(spec, &obs), want, "{what}");
    }
}

/// A cluster CoreOS' operator made is never bootstrapped over, even when the operator cannot
/// read its member list (a TLS secret it cannot use) or only one of its pods is left.
#[test]
fn never_a_new_cluster_beside_coreos_members() {
    let spec = "size: 3\nversion: 3.2.13";
    let mut unreadable = coreos_cluster("3.2.13");
    unreadable.members = Err(crate::planner::MembersUnread::Unanswered(
        "tls: bad certificate".into(),
    ));
    unreadable.bootstrapped = false;
    let mut lone = unreadable.clone();
    lone.pods.truncate(1);
    let mut lone_old = lone.clone();
    lone_old.pods[0].ready = false;
    lone_old.pods[0].restarts = 3;
    lone_old.pods[0].age = Duration::from_secs(3600);
    for obs in [unreadable, lone, lone_old] {
        let step = plan_for(spec, &obs);
        assert!(
            !matches!(
                step,
                Step::Bootstrap(_) | Step::RestartBootstrap(_) | Step::DeletePod(_)
            ),
            "{step:?}"
        );
    }
}

/// A joining member names every member by the peer URL etcd lists for it: CoreOS' members may
/// advertise another form (here the cluster domain) than this operator would compute.
#[test]
fn a_joining_member_names_coreos_members_by_their_listed_peer_urls() {
    let mut obs = coreos_cluster("3.2.13");
    for m in obs.members.as_mut().expect("members") {
        m.peer_url = Some(format!("http://{}.demo.ns1.svc.cluster.local:2380", m.name));
    }
    let mut joining = member_named("demo-0", 1, "3.2.13", false);
    joining.started = false;
    joining.health = Health::Unhealthy("not started".into());
    obs.members.as_mut().expect("members").push(joining);
    let Step::CreatePod(plan) = plan_for("size: 3\nversion: 3.2.13", &obs) else {
        panic!("the new member's pod is created");
    };
    assert_eq!(plan.name, "demo-0");
    assert!(plan.initial_cluster.contains(&(
        COREOS[0].to_string(),
        format!("http://{}.demo.ns1.svc.cluster.local:2380", COREOS[0])
    )));
    assert!(
        plan.initial_cluster
            .contains(&("demo-0".into(), "http://demo-0.demo.ns1.svc:2380".into()))
    );
}
