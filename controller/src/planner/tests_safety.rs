//! Tests of the rules that keep the operator's own automation from turning a live cluster into
//! a lost one (issue 32): unknown is not gone, no recovery while anything has a quorum, a
//! recovery never waits on a pod already being deleted and keeps the survivor until the new
//! cluster holds a quorum, CORRUPT does not freeze self-healing.

use std::time::Duration;

use super::*;
use crate::planner::fixtures::{healthy_member, ready_pod};
use crate::view::fixtures::view_of;

const AUTOMATIC: &str = "size: 3\nrecovery:\n  policy: Automatic";

fn plan_for(spec: &str, obs: &Observed) -> Step {
    plan(&view_of(spec), obs, &PlannerSettings::default())
}

fn member(i: u32) -> MemberState {
    healthy_member(
        &format!("demo-{i}"),
        100 + u64::from(i),
        "3.6.16".parse().ok(),
        i == 1,
    )
}

fn silent(mut m: MemberState) -> MemberState {
    m.health = Health::Unhealthy("deadline exceeded".into());
    m.answered = false;
    m
}

/// The demo of issue 32, item 1: members 1 and 2 on node-b, whose kubelet went silent; their
/// pods were evicted and stay Terminating past their grace period (etcd may still run there
/// and hold the quorum); member 0, on node-a, answers without a leader (cut off from them).
fn evicted_from_silent_node(node: NodeState) -> Observed {
    let mut pods: Vec<PodState> = (0..3).map(|i| ready_pod(i, "3.6.16")).collect();
    for p in &mut pods[1..] {
        p.terminating = true;
        p.ready = false;
        p.overdue = Duration::from_secs(600);
        p.node = Some("node-b".into());
        p.node_state = node;
    }
    let mut lone = member(0);
    lone.health = Health::Unhealthy("no leader".into());
    lone.raft_index = 500;
    Observed {
        pods,
        members: Ok(vec![lone, silent(member(1)), silent(member(2))]),
        bootstrapped: true,
        ..Observed::default()
    }
}

/// Item 1: pods stuck Terminating on a silent node are not lost data, under Automatic too;
/// the status names the node and the command that says it is down. Once that is known (the
/// taint, the Node gone, or its Ready kubelet reporting etcd stopped), the recovery starts.
#[test]
fn pods_terminating_on_a_silent_node_are_not_lost_data() {
    let step = plan_for(AUTOMATIC, &evicted_from_silent_node(NodeState::NotReady));
    let Step::Blocked(Blocked::QuorumLost { unconfirmed, .. }) = &step else {
        panic!("recovering beside a majority that may still serve: {step:?}");
    };
    assert_eq!(
        unconfirmed
            .iter()
            .map(|u| u.member.as_str())
            .collect::<Vec<_>>(),
        ["demo-1", "demo-2"]
    );
    assert!(
        unconfirmed
            .iter()
            .all(|u| u.node.as_deref() == Some("node-b"))
    );
    let said = crate::status::describe(&step);
    assert!(
        said.contains("kubectl taint node node-b node.kubernetes.io/out-of-service"),
        "{said}"
    );
    // The node cannot be read (no permission, an API error): unknown, so the same.
    assert!(matches!(
        plan_for(AUTOMATIC, &evicted_from_silent_node(NodeState::Unknown)),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
    for known in [NodeState::OutOfService, NodeState::Gone] {
        assert!(
            matches!(
                plan_for(AUTOMATIC, &evicted_from_silent_node(known)),
                Step::StartRecovery { .. }
            ),
            "{known:?}"
        );
    }
    let mut reported = evicted_from_silent_node(NodeState::Ready);
    assert!(
        matches!(
            plan_for(AUTOMATIC, &reported),
            Step::Blocked(Blocked::QuorumLost { .. })
        ),
        "Ready kubelet that has not reported etcd stopped"
    );
    for p in &mut reported.pods[1..] {
        p.container_stopped = true;
    }
    assert!(matches!(
        plan_for(AUTOMATIC, &reported),
        Step::StartRecovery { .. }
    ));
}

/// Item 1: pods deleted (gone from the API) while their node is silent are not lost data
/// either; gone from a Ready node (its kubelet stops what the API no longer has), they are.
#[test]
fn pods_deleted_while_their_node_is_silent_are_not_lost_data() {
    let gone_from = |state: NodeState| {
        let mut obs = evicted_from_silent_node(NodeState::NotReady);
        obs.pods.truncate(1);
        obs.absent = (1..3)
            .map(|i| AbsentPod {
                member: format!("demo-{i}"),
                node: "node-b".into(),
                node_state: state,
            })
            .collect();
        obs
    };
    assert!(matches!(
        plan_for(AUTOMATIC, &gone_from(NodeState::NotReady)),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
    let mut no_record = gone_from(NodeState::NotReady);
    no_record.absent.clear();
    assert!(
        matches!(
            plan_for(AUTOMATIC, &no_record),
            Step::Blocked(Blocked::QuorumLost { .. })
        ),
        "no record of where they ran"
    );
    assert!(matches!(
        plan_for(AUTOMATIC, &gone_from(NodeState::Ready)),
        Step::StartRecovery { .. }
    ));
    // With no member list at all, a deleted pod whose node is silent still may run.
    let mut blind = gone_from(NodeState::NotReady);
    blind.pods.clear();
    blind.members = Err(crate::planner::MembersUnread::Unanswered(
        "no member pod is running with an IP yet".into(),
    ));
    assert!(
        !matches!(plan_for(AUTOMATIC, &blind), Step::StartRecovery { .. }),
        "{:?}",
        plan_for(AUTOMATIC, &blind)
    );
}

/// Item 1: the operator asks terminating pods' members too; members that answer with a leader
/// are alive, and a healthy member stuck terminating is replaced one at a time (the next only
/// once a replacement joined), never all at once.
#[test]
fn members_that_answer_are_alive_and_replaced_one_at_a_time() {
    let mut obs = evicted_from_silent_node(NodeState::NotReady);
    obs.members = Ok((0..3).map(member).collect());
    assert_eq!(
        plan_for(AUTOMATIC, &obs),
        crate::planner::fixtures::remove_member(2, RemovalReason::StuckTerminating),
        "quorum holds: the follower stuck terminating is replaced (the leader after)"
    );
    members(&mut obs).remove(2);
    obs.pods.remove(2);
    assert!(
        matches!(plan_for(AUTOMATIC, &obs), Step::AddMember { .. }),
        "the replacement joins before the next stuck member goes: {:?}",
        plan_for(AUTOMATIC, &obs)
    );
    // The replacement is in the list but has not started (its pod holds the member list of
    // then): nothing is removed, its pod is created.
    let mut joining = member(3);
    joining.learner = true;
    joining.started = false;
    joining.health = Health::Unhealthy("not started".into());
    joining.answered = false;
    members(&mut obs).push(joining);
    assert!(
        matches!(plan_for(AUTOMATIC, &obs), Step::CreatePod(ref p) if p.name == "demo-3"),
        "{:?}",
        plan_for(AUTOMATIC, &obs)
    );
    obs.pods.push(ready_pod(3, "3.6.16"));
    members(&mut obs)[2].started = true;
    members(&mut obs)[2].health = Health::Healthy {
        version: "3.6.16".parse().ok(),
        leader: false,
    };
    assert!(
        matches!(plan_for(AUTOMATIC, &obs), Step::PromoteLearner { .. }),
        "a learner is no healthy voter yet: {:?}",
        plan_for(AUTOMATIC, &obs)
    );
    members(&mut obs)[2].learner = false;
    assert_eq!(
        plan_for(AUTOMATIC, &obs),
        crate::planner::fixtures::remove_member(1, RemovalReason::StuckTerminating),
        "three healthy voters again: the next stuck one goes"
    );
}

fn members(obs: &mut Observed) -> &mut Vec<MemberState> {
    obs.members
        .as_mut()
        .unwrap_or_else(|e| panic!("fixture without a member list: {e}"))
}

/// Item 2: no recovery while any member reports a leader or a majority answers (it may elect
/// one), whatever is known of the others.
#[test]
fn no_recovery_while_anything_may_have_a_quorum() {
    let mut leader_seen = evicted_from_silent_node(NodeState::OutOfService);
    members(&mut leader_seen)[0].health = Health::Healthy {
        version: "3.6.16".parse().ok(),
        leader: false,
    };
    assert!(matches!(
        plan_for(AUTOMATIC, &leader_seen),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
    let mut majority_answers = evicted_from_silent_node(NodeState::OutOfService);
    members(&mut majority_answers)[1].answered = true;
    assert!(matches!(
        plan_for(AUTOMATIC, &majority_answers),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
}

/// Item 2: a member of the lost cluster answering with a leader mid-way stops the recovery.
#[test]
fn a_lost_cluster_that_serves_stops_the_recovery() {
    let record = etcd_shared::types::RecoveryStatus {
        from_member: Some("demo-0".into()),
        member_endpoint: Some("http://demo-0.demo.ns1.svc:2379".into()),
        sha256: "ab".repeat(32),
        replaced: vec!["demo-0".into(), "demo-1".into(), "demo-2".into()],
        ..Default::default()
    };
    let obs = Observed {
        bootstrapped: true,
        recovery: Some(Recovering {
            seed: recovery::seed_plan(&record),
            replaced_pods: vec![],
            replaced_claims: vec![],
            lost_names: record.replaced.clone(),
            lost_cluster_serves: Some("member demo-1 answers with leader 65".into()),
        }),
        ..Observed::default()
    };
    assert_eq!(
        plan_for(AUTOMATIC, &obs),
        Step::AbortRecovery {
            why: "member demo-1 answers with leader 65".into()
        }
    );
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let (kept, last) =
        recovery::records_after(Some(record), None, None, &plan_for(AUTOMATIC, &obs), &now);
    assert_eq!(
        (kept, last),
        (None, None),
        "the record goes, nothing is 'recovered'"
    );
}

/// Item 8: with CORRUPT raised, a durable member whose pod ended is deleted *and* created
/// again on its claim (self-healing goes on); data-moving changes stay blocked.
#[test]
fn corrupt_does_not_freeze_self_healing() {
    let spec = "size: 3\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi";
    let mut obs = Observed {
        pods: (0..3).map(|i| ready_pod(i, "3.6.16")).collect(),
        claims: (0..3).map(|i| format!("demo-{i}")).collect(),
        members: Ok((0..3).map(member).collect()),
        bootstrapped: true,
        alarms: vec![Alarm {
            member_id: 100,
            member: "demo-0".into(),
            kind: AlarmKind::Corrupt,
        }],
        ..Observed::default()
    };
    obs.pods[2].phase = PodPhase::Ended;
    members(&mut obs)[2] = silent(member(2));
    assert_eq!(plan_for(spec, &obs), Step::DeletePod("demo-2".into()));
    obs.pods.remove(2);
    assert!(
        matches!(plan_for(spec, &obs), Step::CreatePod(ref p) if p.name == "demo-2"),
        "{:?}",
        plan_for(spec, &obs)
    );
    // Back, healthy: everything that moves data waits for a human.
    obs.pods.push(ready_pod(2, "3.6.16"));
    members(&mut obs)[2] = member(2);
    assert!(matches!(
        plan_for(&format!("{spec}\nversion: 3.7.3"), &obs),
        Step::Blocked(Blocked::DataCorrupted { .. })
    ));
}

/// Item 7: an approval on a cluster that has its quorum approves nothing and is discarded; it
/// stays while the quorum is lost (the incident it approves) and when it starts a recovery.
#[test]
fn an_approval_belongs_to_one_incident() {
    let approved = {
        let mut c = crate::view::fixtures::cluster_of("size: 3");
        c.metadata.annotations = Some(
            [(
                etcd_shared::names::ANNOTATION_RECOVER.to_string(),
                etcd_shared::names::RECOVER_NOW.to_string(),
            )]
            .into(),
        );
        crate::view::ClusterView::new(&c, &etcd_shared::admission::AdmissionPolicy::default())
            .unwrap_or_else(|e| panic!("{e}"))
    };
    let settings = PlannerSettings::default();
    let healthy = Observed {
        pods: (0..3).map(|i| ready_pod(i, "3.6.16")).collect(),
        members: Ok((0..3).map(member).collect()),
        bootstrapped: true,
        ..Observed::default()
    };
    let step = plan(&approved, &healthy, &settings);
    assert!(recovery::approval_is_stale(&approved, &healthy, &step));
    let lost = evicted_from_silent_node(NodeState::NotReady);
    let step = plan(&approved, &lost, &settings);
    assert!(
        !recovery::approval_is_stale(&approved, &lost, &step),
        "{step:?}"
    );
    let known = evicted_from_silent_node(NodeState::Gone);
    let step = plan(&approved, &known, &settings);
    assert!(matches!(step, Step::StartRecovery { .. }), "{step:?}");
    assert!(!recovery::approval_is_stale(&approved, &known, &step));
    let not_approved = view_of("size: 3");
    let step = plan(&not_approved, &healthy, &settings);
    assert!(!recovery::approval_is_stale(&not_approved, &healthy, &step));
}

/// Item 5: a NOSPACE episode's compaction is kept while the alarm is raised (the heal goes on
/// past it) and dropped once it is gone (the next episode compacts anew).
#[test]
fn the_compaction_record_belongs_to_one_alarm_episode() {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let members = vec!["demo-0".to_string()];
    let compacted = maintenance::record_after(
        None,
        &Step::Compact { revision: 9 },
        Some(&members),
        true,
        &now,
    );
    assert_eq!(
        compacted
            .as_ref()
            .and_then(|r| r.compaction.as_ref())
            .map(|c| c.revision),
        Some(9)
    );
    let still =
        maintenance::record_after(compacted.as_ref(), &Step::Done, Some(&members), true, &now);
    assert!(
        still.and_then(|r| r.compaction).is_some(),
        "kept while the alarm is raised"
    );
    let healed = maintenance::record_after(
        compacted.as_ref(),
        &Step::DisarmAlarm(vec![]),
        Some(&members),
        false,
        &now,
    );
    assert!(
        healed.and_then(|r| r.compaction).is_none(),
        "dropped with the alarm"
    );
}

/// Item 12: the only member of a one-member cluster is never defragmented by the periodic
/// policy (it would be a full outage); NOSPACE is still healed.
#[test]
fn a_one_member_cluster_is_not_defragmented_periodically() {
    let mib = 1024 * 1024;
    let mut one = Observed {
        pods: vec![ready_pod(0, "3.6.16")],
        members: Ok(vec![healthy_member(
            "demo-0",
            100,
            "3.6.16".parse().ok(),
            true,
        )]),
        bootstrapped: true,
        ..Observed::default()
    };
    members(&mut one)[0].db = DbSize {
        total: 600 * mib,
        in_use: 100 * mib,
    };
    assert_eq!(plan_for("size: 1", &one), Step::Done);
    let mut three = one.clone();
    for i in 1..3 {
        three.pods.push(ready_pod(i, "3.6.16"));
        let mut m = member(i);
        m.health = Health::Healthy {
            version: "3.6.16".parse().ok(),
            leader: false,
        };
        m.db = members(&mut one)[0].db;
        members(&mut three).push(m);
    }
    assert!(matches!(
        plan_for("size: 3", &three),
        Step::Defragment {
            reason: DefragReason::Fragmented,
            ..
        }
    ));
}

/// Item 6: the operator's own restarts and defragmentations wait while the budget allows no
/// disruption (a drain evicting), as a drain's evictions would.
#[test]
fn restarts_and_defragmentations_respect_the_budget() {
    let mut obs = Observed {
        pods: (0..3).map(|i| ready_pod(i, "3.6.16")).collect(),
        members: Ok((0..3).map(member).collect()),
        bootstrapped: true,
        ..Observed::default()
    };
    let upgrade = "size: 3\nversion: 3.7.3";
    assert!(matches!(
        plan_for(upgrade, &obs),
        Step::UpgradeMember { .. }
    ));
    obs.disruptions_allowed = Some(0);
    assert_eq!(
        plan_for(upgrade, &obs),
        Step::Wait(Waiting::DisruptionBudget("demo-0".into()))
    );
    obs.disruptions_allowed = Some(1);
    assert!(matches!(
        plan_for(upgrade, &obs),
        Step::UpgradeMember { .. }
    ));
    // A one-member cluster's budget never allows a disruption: its upgrade is the outage the
    // spec asks for, and goes on.
    let one = Observed {
        pods: vec![ready_pod(0, "3.6.16")],
        members: Ok(vec![healthy_member(
            "demo-0",
            100,
            "3.6.16".parse().ok(),
            true,
        )]),
        bootstrapped: true,
        disruptions_allowed: Some(0),
        ..Observed::default()
    };
    assert!(matches!(
        plan_for("size: 1\nversion: 3.7.3", &one),
        Step::UpgradeMember { .. }
    ));
}

/// Item 11: a hop etcd calls unsafe is refused with the command that fixes it.
#[test]
fn an_unsafe_hop_is_refused_with_the_command_that_fixes_it() {
    let members: Vec<MemberState> = (0..3)
        .map(|i| {
            let mut m = member(i);
            m.health = Health::Healthy {
                version: "3.5.20".parse().ok(),
                leader: i == 1,
            };
            m
        })
        .collect();
    let obs = Observed {
        pods: (0..3).map(|i| ready_pod(i, "3.5.20")).collect(),
        members: Ok(members),
        bootstrapped: true,
        ..Observed::default()
    };
    let step = plan_for("size: 3\nversion: 3.6.16", &obs);
    let Step::Blocked(Blocked::UpgradeNotSupported(why)) = &step else {
        panic!("{step:?}");
    };
    assert!(
        why.contains(r#"kubectl patch etcdcluster demo -n ns1 --type merge -p '{"spec":{"version":"3.5.33"}}'"#),
        "{why}"
    );
}

/// Item 9: a member pod CoreOS' operator created after this operator took over means it still
/// runs: nothing is changed (the status says what to do) while that pod is there.
#[test]
fn a_running_coreos_operator_stops_this_one() {
    let mut obs = Observed {
        pods: (0..3).map(|i| ready_pod(i, "3.6.16")).collect(),
        members: Ok((0..3).map(member).collect()),
        bootstrapped: true,
        ..Observed::default()
    };
    obs.pods[2].name = "demo-zp6t0r7y2f".into();
    obs.pods[2].coreos = true;
    let listed = vec!["demo-zp6t0r7y2f".to_string()];
    assert!(
        adoption::another_operator(&obs, true, &listed, &[]).is_empty(),
        "listed before: adopted"
    );
    assert!(
        adoption::another_operator(&obs, false, &[], &[]).is_empty(),
        "a status CoreOS wrote: first look"
    );
    let found = adoption::another_operator(&obs, true, &[], &[]);
    assert_eq!(found, listed, "new since the status this operator wrote");
    assert_eq!(
        adoption::another_operator(&obs, true, &listed, &found),
        listed,
        "sticky while it is there"
    );
    obs.another_operator = found;
    let step = plan_for("size: 5", &obs);
    assert!(
        matches!(&step, Step::Blocked(Blocked::AnotherOperator { pods }) if pods == &listed),
        "{step:?}"
    );
    assert!(
        crate::status::describe(&step)
            .contains("kubectl scale deployment etcd-operator --replicas=0")
    );
}
