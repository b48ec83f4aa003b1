//! Tests of the planner: every case of the issue, failures included. Single decisions are
//! one table ([`single_decisions`]); what takes several steps (scale-down, an upgrade, a member
//! that never starts) is a scenario of its own.

use std::time::Duration;

use super::*;
use crate::planner::fixtures::{
    add_member as add, remove_member as remove, upgrade_member as upgrade,
};
use crate::view::fixtures::view_of;
use etcd_shared::names;

const OLD: Duration = Duration::from_secs(3600);
const YOUNG: Duration = Duration::from_secs(5);

fn v(s: &str) -> EtcdVersion {
    s.parse().expect("version")
}

fn pod(i: u32, version: &str) -> PodState {
    crate::planner::fixtures::ready_pod(i, version)
}

fn member(i: u32, version: &str) -> MemberState {
    let id = 100 + u64::from(i);
    crate::planner::fixtures::healthy_member(&format!("demo-{i}"), id, Some(v(version)), i == 0)
}

fn unhealthy(mut m: MemberState) -> MemberState {
    m.health = Health::Unhealthy("connection refused".into());
    m.answered = false;
    m
}

fn learner(mut m: MemberState) -> MemberState {
    m.learner = true;
    m
}

fn unstarted(mut m: MemberState) -> MemberState {
    m.started = false;
    m.health = Health::Unhealthy("not started".into());
    m
}

fn young(mut p: PodState) -> PodState {
    p.age = YOUNG;
    p.running_for = Some(YOUNG);
    p.ready = false;
    p
}

/// A healthy cluster of `n` members at `version`.
fn healthy(n: u32, version: &str) -> Observed {
    Observed {
        pods: (0..n).map(|i| pod(i, version)).collect(),
        claims: vec![],
        members: Ok((0..n).map(|i| member(i, version)).collect()),
        bootstrapped: true,
        ..Observed::default()
    }
}

fn plan_for(spec: &str, obs: &Observed) -> Step {
    plan(&view_of(spec), obs, &PlannerSettings::default())
}

fn peer(i: u32) -> (String, String) {
    (
        format!("demo-{i}"),
        format!("http://demo-{i}.demo.ns1.svc:2380"),
    )
}

fn member_plan(
    i: u32,
    peers: std::ops::Range<u32>,
    state: InitialState,
    version: &str,
) -> MemberPlan {
    MemberPlan {
        name: format!("demo-{i}"),
        initial_cluster: peers.map(peer).collect(),
        token: "demo-uid-1".into(),
        state,
        version: v(version),
        seed: None,
    }
}

/// A wait of `kind` on `demo-{i}`.
fn wait(kind: fn(String) -> Waiting, i: u32) -> Step {
    Step::Wait(kind(format!("demo-{i}")))
}

/// `obs` changed by `f`.
fn edit(mut obs: Observed, f: impl FnOnce(&mut Observed)) -> Observed {
    f(&mut obs);
    obs
}

/// The members of `obs` (the test's own fixtures always have a member list).
fn members(obs: &mut Observed) -> &mut Vec<MemberState> {
    obs.members
        .as_mut()
        .unwrap_or_else(|e| panic!("fixture without a member list: {e}"))
}

/// Records that member `demo-i`'s pod, gone from the API, last ran on a node in `state`.
fn gone_from(obs: &mut Observed, i: u32, state: NodeState) {
    obs.absent.push(AbsentPod {
        member: format!("demo-{i}"),
        node: format!("node-{i}"),
        node_state: state,
    });
}

const DURABLE: &str =
    "pod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi";

/// One observation, one decision: (what, spec, observed, the step the planner must take).
#[test]
fn single_decisions() {
    let durable_members = || (0..3).map(|i| format!("demo-{i}")).collect::<Vec<_>>();
    let rows: Vec<(&str, &str, Observed, Step)> = vec![
        (
            "a new cluster starts with one seed",
            "size: 3\nversion: 3.6.16",
            Observed::default(),
            Step::Bootstrap(member_plan(0, 0..1, InitialState::New, "3.6.16")),
        ),
        (
            "scale-up adds one learner at a time",
            "size: 3\nversion: 3.6.16",
            healthy(1, "3.6.16"),
            add(1, true),
        ),
        (
            "lines without learners add voters",
            "size: 3\nversion: 3.2.13",
            healthy(1, "3.2.13"),
            add(1, false),
        ),
        (
            "an added member gets its pod, joining the existing cluster",
            "size: 3\nversion: 3.6.16",
            edit(healthy(1, "3.6.16"), |o| {
                members(o).push(unstarted(learner(member(1, "3.6.16"))));
            }),
            Step::CreatePod(member_plan(1, 0..2, InitialState::Existing, "3.6.16")),
        ),
        (
            "a restart after a member add creates the pod instead of adding again",
            "size: 5",
            edit(healthy(3, "3.6.16"), |o| {
                members(o).push(unstarted(learner(member(3, "3.6.16"))));
            }),
            Step::CreatePod(member_plan(3, 0..4, InitialState::Existing, "3.6.16")),
        ),
        (
            "a learner that never catches up is removed",
            "size: 3",
            edit(healthy(2, "3.6.16"), |o| {
                members(o)[1] = unhealthy(learner(member(1, "3.6.16")));
                o.pods[1].age = Duration::from_secs(601);
            }),
            remove(1, RemovalReason::Replace),
        ),
        (
            "scale-down removes an unhealthy member first",
            "size: 2",
            edit(healthy(3, "3.6.16"), |o| {
                members(o)[0] = unhealthy(member(0, "3.6.16"));
            }),
            remove(0, RemovalReason::ScaleDown),
        ),
        (
            "scale-down never removes the leader (demo-0) while another can go",
            "size: 1",
            healthy(2, "3.6.16"),
            remove(1, RemovalReason::ScaleDown),
        ),
        (
            // 5 voters, 2 unhealthy: removing a healthy one would leave 2 healthy of 4
            // (quorum 3); an unhealthy one goes, which is always safe.
            "scale-down never breaks quorum",
            "size: 3",
            edit(healthy(5, "3.6.16"), |o| {
                for i in [3, 4] {
                    members(o)[i] = unhealthy(member(i as u32, "3.6.16"));
                }
            }),
            remove(3, RemovalReason::ScaleDown),
        ),
        (
            "a durable member whose pod vanished is restarted on its claim, not replaced",
            DURABLE,
            edit(healthy(3, "3.6.16"), |o| {
                o.claims = durable_members();
                o.pods.remove(1);
                members(o)[1] = unhealthy(member(1, "3.6.16"));
            }),
            Step::CreatePod(member_plan(1, 0..3, InitialState::Existing, "3.6.16")),
        ),
        (
            "a whole durable cluster comes back after all its pods vanished",
            DURABLE,
            Observed {
                claims: durable_members(),
                members: Err(MembersUnread::Unanswered("no endpoint".into())),
                bootstrapped: true,
                ..Observed::default()
            },
            Step::CreatePod(member_plan(0, 0..3, InitialState::Existing, "3.6.16")),
        ),
        (
            "an ephemeral cluster whose members all vanished is not silently recreated",
            "size: 3",
            Observed {
                bootstrapped: true,
                ..Observed::default()
            },
            Step::Blocked(Blocked::QuorumLostForGood {
                loss: PermanentLoss {
                    lost: vec![],
                    voters: 0,
                    from: Some(RecoverFrom::Backup),
                },
                approve:
                    "kubectl annotate etcdcluster demo -n ns1 etcd.database.coreos.com/recover=now"
                        .into(),
            }),
        ),
        (
            "a crashed member with its data is waited for",
            "size: 3",
            edit(healthy(3, "3.6.16"), |o| {
                members(o)[2] = unhealthy(member(2, "3.6.16"));
                o.pods[2].ready = false;
            }),
            Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()])),
        ),
        (
            "a starting voter on old lines is not reported as quorum loss",
            "size: 3\nversion: 3.2.13",
            edit(healthy(1, "3.2.13"), |o| {
                members(o).push(unstarted(member(1, "3.2.13")));
                o.pods.push(young(pod(1, "3.2.13")));
            }),
            wait(Waiting::MemberStarting, 1),
        ),
        (
            "terminating pods are waited for",
            "size: 3",
            edit(healthy(3, "3.6.16"), |o| o.pods[2].terminating = true),
            wait(Waiting::PodTerminating, 2),
        ),
        (
            "member names are never reused",
            "size: 3",
            edit(healthy(2, "3.6.16"), |o| {
                o.pods[1].name = "demo-7".into();
                members(o)[1].name = "demo-7".into();
            }),
            Step::AddMember {
                name: "demo-8".into(),
                peer_url: "http://demo-8.demo.ns1.svc:2380".into(),
                learner: true,
            },
        ),
        (
            "a lone leader is upgraded without a handover",
            "size: 1\nversion: 3.7.3",
            healthy(1, "3.6.16"),
            upgrade(0, "3.7.3"),
        ),
        (
            "no upgrade while a member is unhealthy",
            "version: 3.7.3",
            edit(healthy(3, "3.6.16"), |o| {
                members(o)[2] = unhealthy(member(2, "3.6.16"));
            }),
            Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()])),
        ),
        (
            "paused changes nothing",
            "size: 3\npaused: true",
            healthy(1, "3.6.16"),
            Step::Blocked(Blocked::Paused),
        ),
        (
            "a healthy cluster that matches its spec is done",
            "size: 3\nversion: 3.6.16",
            healthy(3, "3.6.16"),
            Step::Done,
        ),
    ];
    for (what, spec, obs, expected) in rows {
        assert_eq!(plan_for(spec, &obs), expected, "{what}");
    }
}

#[test]
fn waits_for_the_seed_then_restarts_it_if_it_never_comes_up() {
    let mut obs = Observed {
        pods: vec![young(pod(0, "3.6.16"))],
        ..Observed::default()
    };
    assert_eq!(plan_for("size: 3", &obs), wait(Waiting::MemberStarting, 0));
    obs.pods[0].age = OLD;
    obs.pods[0].running_for = Some(OLD);
    assert_eq!(
        plan_for("size: 3", &obs),
        Step::RestartBootstrap("demo-0".into())
    );
}

#[test]
fn promotes_a_learner_once_it_caught_up_and_waits_before() {
    let mut obs = healthy(2, "3.6.16");
    obs.members.as_mut().unwrap()[1] = learner(member(1, "3.6.16"));
    assert_eq!(
        plan_for("size: 3", &obs),
        Step::PromoteLearner {
            id: 101,
            name: "demo-1".into()
        }
    );
    obs.members.as_mut().unwrap()[1] = unhealthy(learner(member(1, "3.6.16")));
    obs.pods[1] = young(pod(1, "3.6.16"));
    assert_eq!(
        plan_for("size: 3", &obs),
        wait(Waiting::LearnerCatchingUp, 1)
    );
}

#[test]
fn a_member_that_never_becomes_healthy_is_removed_after_the_timeout() {
    let mut obs = healthy(3, "3.6.16");
    obs.members.as_mut().unwrap()[2] = unstarted(member(2, "3.6.16"));
    obs.pods[2] = young(pod(2, "3.6.16"));
    assert_eq!(plan_for("size: 3", &obs), wait(Waiting::MemberStarting, 2));
    obs.pods[2].age = Duration::from_secs(301);
    assert_eq!(
        plan_for("size: 3", &obs),
        wait(Waiting::MemberStarting, 2),
        "its etcd has run for 5 s only (it was pulling its image)"
    );
    obs.pods[2].running_for = Some(Duration::from_secs(301));
    assert_eq!(plan_for("size: 3", &obs), remove(2, RemovalReason::Replace));
}

#[test]
fn scale_down_removes_the_member_before_its_pod_and_claim() {
    let spec = "size: 3\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi";
    let mut obs = healthy(5, "3.6.16");
    obs.claims = (0..5).map(|i| format!("demo-{i}")).collect();
    // The newest follower goes first.
    assert_eq!(plan_for(spec, &obs), remove(4, RemovalReason::ScaleDown));
    obs.members.as_mut().unwrap().pop();
    assert_eq!(plan_for(spec, &obs), Step::DeletePod("demo-4".into()));
    obs.pods.pop();
    assert_eq!(plan_for(spec, &obs), Step::DeleteClaim("demo-4".into()));
    obs.claims.pop();
    assert_eq!(plan_for(spec, &obs), remove(3, RemovalReason::ScaleDown));
}

#[test]
fn replaces_a_member_whose_ephemeral_data_is_gone() {
    let mut obs = healthy(3, "3.6.16");
    obs.pods.remove(1);
    obs.members.as_mut().unwrap()[1] = unhealthy(member(1, "3.6.16"));
    assert_eq!(plan_for("size: 3", &obs), remove(1, RemovalReason::Replace));
    // Once removed, a new member with a new name is added.
    obs.members.as_mut().unwrap().remove(1);
    let step = plan_for("size: 3", &obs);
    assert!(
        matches!(&step, Step::AddMember { name, learner: true, .. } if name == "demo-3"),
        "{step:?}"
    );
}

#[test]
fn does_nothing_risky_when_quorum_is_lost() {
    let mut obs = healthy(3, "3.6.16");
    for i in [1, 2] {
        obs.members.as_mut().unwrap()[i] = unhealthy(member(i as u32, "3.6.16"));
    }
    // Their pods are still there (down, data kept): a temporary loss, waited for.
    assert_eq!(
        plan_for("size: 3", &obs),
        Step::Blocked(Blocked::QuorumLost {
            missing: vec!["demo-1".into(), "demo-2".into()],
            voters: 3,
            unconfirmed: vec![],
        })
    );
    // Their (ephemeral) pods gone from a Ready node (its kubelet stopped them): lost for good,
    // but no removal and no recovery without the approval (spec.recovery.policy Manual, the
    // default).
    obs.pods.truncate(1);
    gone_from(&mut obs, 1, NodeState::Ready);
    gone_from(&mut obs, 2, NodeState::Ready);
    // (while the survivor still reports a leader, something has a quorum: issue 32, item 2)
    assert!(matches!(
        plan_for("size: 3", &obs),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
    members(&mut obs)[0].health = Health::Unhealthy("no leader".into());
    assert!(
        matches!(
            plan_for("size: 3", &obs),
            Step::Blocked(Blocked::QuorumLostForGood { .. })
        ),
        "{:?}",
        plan_for("size: 3", &obs)
    );
    // Unreadable member list with members long up: quorum lost too.
    let obs = Observed {
        pods: vec![pod(0, "3.6.16"), pod(1, "3.6.16")],
        members: Err(MembersUnread::Unanswered("deadline exceeded".into())),
        bootstrapped: true,
        ..Observed::default()
    };
    let mut p0 = obs.clone();
    p0.pods.iter_mut().for_each(|p| p.ready = false);
    assert!(matches!(
        plan_for("size: 3", &p0),
        Step::Blocked(Blocked::QuorumLost { .. })
    ));
}

#[test]
fn a_member_added_on_the_spec_version_and_not_ready_yet_is_starting_not_upgrading() {
    // Scale-up: the new member answers etcd's health check before the kubelet's readiness
    // probe passes. Its pod was created on the spec's version, so nothing is upgrading.
    let mut obs = healthy(5, "3.6.16");
    obs.pods[4].ready = false;
    assert_eq!(
        plan_for("size: 5\nversion: 3.6.16", &obs),
        wait(Waiting::MemberStarting, 4)
    );
    // The same not-Ready pod moved to this version by the operator is still upgrading.
    obs.pods[4].created_on = Some(v("3.5.35"));
    assert_eq!(
        plan_for("size: 5\nversion: 3.6.16", &obs),
        wait(Waiting::MemberUpgrading, 4)
    );
}

#[test]
fn upgrades_followers_first_one_at_a_time() {
    let obs = healthy(3, "3.6.16");
    let step = plan_for("version: 3.7.3", &obs);
    assert_eq!(step, upgrade(1, "3.7.3"));
    // demo-1 has the new image but still reports the old version: wait.
    let mut obs = healthy(3, "3.6.16");
    obs.pods[1].image = "quay.io/coreos/etcd:v3.7.3".into();
    assert_eq!(
        plan_for("version: 3.7.3", &obs),
        wait(Waiting::MemberUpgrading, 1)
    );
    // demo-1 answers on the new version and its pod reads Ready, but the kubelet has not
    // reported the restart the image change causes: that Ready is the old container's.
    obs.members.as_mut().unwrap()[1] = member(1, "3.7.3");
    obs.pods[1].restarts_at_upgrade = Some(0);
    assert_eq!(
        plan_for("version: 3.7.3", &obs),
        wait(Waiting::MemberUpgrading, 1)
    );
    // demo-1 done; demo-2 next, the leader demo-0 last.
    obs.pods[1].restarts = 1;
    assert!(
        matches!(plan_for("version: 3.7.3", &obs), Step::UpgradeMember { name, .. } if name == "demo-2")
    );
    obs.pods[2].image = "quay.io/coreos/etcd:v3.7.3".into();
    obs.members.as_mut().unwrap()[2] = member(2, "3.7.3");
    // The leader demo-0 is the only one left: it hands leadership to an upgraded voter first.
    let leader = obs.members.as_ref().unwrap()[0].clone();
    assert!(matches!(
        leader.health,
        Health::Healthy { leader: true, .. }
    ));
    let successor_id = obs.members.as_ref().unwrap()[1].id;
    assert_eq!(
        plan_for("version: 3.7.3", &obs),
        Step::TransferLeadership {
            from: "demo-0".into(),
            to: "demo-1".into(),
            to_id: successor_id,
            before: Handover::Upgrade,
        }
    );
    // Once demo-1 leads, demo-0 is a follower and moves.
    set_leader(&mut obs, 1);
    assert!(
        matches!(plan_for("version: 3.7.3", &obs), Step::UpgradeMember { name, .. } if name == "demo-0")
    );
    obs.pods[0].image = "quay.io/coreos/etcd:v3.7.3".into();
    obs.members.as_mut().unwrap()[0] = member(0, "3.7.3");
    assert_eq!(plan_for("version: 3.7.3", &obs), Step::Done);
}

/// Makes member `index` the leader and every other one a follower.
fn set_leader(obs: &mut Observed, index: usize) {
    for (i, m) in obs.members.as_mut().unwrap().iter_mut().enumerate() {
        if let Health::Healthy { leader, .. } = &mut m.health {
            *leader = i == index;
        }
    }
}

#[test]
fn leadership_goes_to_a_ready_healthy_voter_on_the_new_image_first() {
    let mut obs = healthy(4, "3.6.16");
    let image = "quay.io/coreos/etcd:v3.7.3";
    obs.pods[3].image = image.into();
    let members = obs.members.clone().unwrap();
    // demo-3 already runs the new image: it is preferred over the lower names.
    assert_eq!(
        successor(&obs, &members, "demo-0", image).map(|m| m.name.as_str()),
        Some("demo-3")
    );
    // Not Ready, it is skipped; then the lowest name.
    obs.pods[3].ready = false;
    assert_eq!(
        successor(&obs, &members, "demo-0", image).map(|m| m.name.as_str()),
        Some("demo-1")
    );
    // Learners and unhealthy members never lead.
    let mut members = members;
    members[1].learner = true;
    members[2] = unhealthy(members[2].clone());
    assert_eq!(successor(&obs, &members, "demo-0", image), None);
}

#[test]
fn an_upgraded_member_must_be_ready_before_the_next_one_moves() {
    // demo-1 runs and reports the new version, but its pod is not Ready again yet.
    let mut obs = healthy(3, "3.6.16");
    obs.pods[1].image = "quay.io/coreos/etcd:v3.7.3".into();
    obs.pods[1].ready = false;
    obs.members.as_mut().unwrap()[1] = member(1, "3.7.3");
    assert_eq!(
        plan_for("version: 3.7.3", &obs),
        wait(Waiting::MemberUpgrading, 1)
    );
    // A not-ready pod on the old image holds the upgrade too.
    let mut obs = healthy(3, "3.6.16");
    obs.pods[2].ready = false;
    assert_eq!(
        plan_for("version: 3.7.3", &obs),
        Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()]))
    );
}

#[test]
fn refuses_an_upgrade_path_etcd_does_not_support() {
    let obs = healthy(3, "3.5.35");
    let step = plan_for("version: 3.7.3", &obs);
    let Step::Blocked(Blocked::UpgradeNotSupported(msg)) = step else {
        panic!("{step:?}")
    };
    assert!(msg.contains("one minor line at a time"), "{msg}");
}

#[test]
fn a_spec_change_mid_step_is_followed_from_the_current_state() {
    // Scaling 3 -> 5 added a learner; the user went back to 3: the learner goes first.
    let mut obs = healthy(3, "3.6.16");
    obs.members
        .as_mut()
        .unwrap()
        .push(learner(unhealthy(member(3, "3.6.16"))));
    obs.pods.push(young(pod(3, "3.6.16")));
    assert_eq!(
        plan_for("size: 3", &obs),
        wait(Waiting::LearnerCatchingUp, 3)
    );
    obs.members.as_mut().unwrap()[3] = learner(member(3, "3.6.16"));
    // Once caught up it is promoted (a learner is never left behind), then scaled away.
    assert!(matches!(
        plan_for("size: 3", &obs),
        Step::PromoteLearner { id: 103, .. }
    ));
    let obs = healthy(4, "3.6.16");
    assert!(matches!(
        plan_for("size: 3", &obs),
        Step::RemoveMember {
            id: 103,
            reason: RemovalReason::ScaleDown,
            ..
        }
    ));
}

/// The member API calls a line lacks are never planned: learners need every member on 3.4+,
/// a handover needs the leader on 3.3+. Table: (running, spec, expect a learner, expect a
/// handover before the leader restarts).
#[test]
fn calls_follow_the_oldest_running_line() {
    for (running, spec, learner, handover) in [
        ("3.2.13", "3.2.13", false, None),
        ("3.3.27", "3.3.27", false, None),
        ("3.4.45", "3.4.45", true, None),
        // Upgrades in progress: the old line decides.
        ("3.2.13", "3.3.27", false, Some(false)),
        ("3.3.27", "3.4.45", false, Some(true)),
        ("3.4.45", "3.5.35", true, Some(true)),
    ] {
        // Scale-up (2 -> 3) of a healthy cluster whose members run `running`.
        let obs = healthy(2, running);
        let step = plan_for(&format!("size: 3\nversion: {spec}"), &obs);
        assert!(
            matches!(&step, Step::AddMember { learner: l, .. } if *l == learner),
            "{running}: {step:?}"
        );
        // An upgrade whose last outdated member is the leader.
        let Some(handover) = handover else { continue };
        let image = format!("quay.io/coreos/etcd:v{spec}");
        let mut obs = healthy(3, running);
        for i in 1..3 {
            obs.pods[i].image = image.clone();
            obs.pods[i].restarts = 1;
            obs.pods[i].version = Some(v(spec));
            obs.members.as_mut().unwrap()[i] = member(i as u32, spec);
        }
        let step = plan_for(&format!("size: 3\nversion: {spec}"), &obs);
        if handover {
            assert!(
                matches!(&step, Step::TransferLeadership { from, .. } if from == "demo-0"),
                "{running} -> {spec}: {step:?}"
            );
        } else {
            assert!(
                matches!(&step, Step::UpgradeMember { name, .. } if name == "demo-0"),
                "{running} -> {spec}: {step:?}"
            );
        }
    }
}

/// Every durable member's pod ended (a whole node shut down) just as the spec moved to 3.7:
/// they come back on their claims on the version they last ran (the status's), and move to
/// 3.7 through the upgrade and its snapshot barrier, never by being recreated on it (CI found
/// both 3.4-born members recreated on 3.7, crash-looping on "unmarshal should never fail").
#[test]
fn members_recreated_on_claims_keep_the_version_they_last_ran() {
    let spec = format!("size: 3\nversion: 3.7.3\n{DURABLE}");
    let claims: Vec<String> = (0..3).map(|i| format!("demo-{i}")).collect();
    let deleted = Observed {
        pods: vec![],
        claims: claims.clone(),
        members: Err(MembersUnread::Unanswered("no member pod is running".into())),
        bootstrapped: true,
        last_version: Some(v("3.6.16")),
        ..Observed::default()
    };
    match plan_for(&spec, &deleted) {
        Step::CreatePod(plan) => assert_eq!(plan.version, v("3.6.16"), "{plan:?}"),
        other => panic!("{other:?}"),
    }
    // One member back (its pod on 3.6), the others' pods gone: the running one tells.
    let one_back = edit(healthy(3, "3.6.16"), |o| {
        o.claims = claims.clone();
        o.pods.retain(|p| p.name == "demo-0");
        o.last_version = None;
    });
    match plan_for(&spec, &one_back) {
        Step::CreatePod(plan) => assert_eq!(plan.version, v("3.6.16"), "{plan:?}"),
        other => panic!("{other:?}"),
    }
    // Nothing known of an older version (a cluster never observed): the spec's.
    let unknown = Observed {
        last_version: None,
        ..deleted
    };
    match plan_for(&spec, &unknown) {
        Step::CreatePod(plan) => assert_eq!(plan.version, v("3.7.3"), "{plan:?}"),
        other => panic!("{other:?}"),
    }
}

/// etcd 3.7 cannot replay the v2-format raft entries that members on 3.4 or older wrote: a
/// cluster born there moves to 3.7 only after every member snapshotted past them (found by
/// the upgrade chain test: "unmarshal should never fail" on the first 3.7 member).
#[test]
fn a_cluster_born_before_3_5_snapshots_past_its_v2_entries_before_3_7() {
    let spec = "size: 3\nversion: 3.7.3";
    let mut obs = healthy(3, "3.6.16");
    for (i, m) in obs.members.as_mut().unwrap().iter_mut().enumerate() {
        m.applied_index = 500 + i as u64;
    }
    for p in &mut obs.pods {
        p.created_on = Some(v("3.2.13"));
        p.data_created_on = Some(v("3.2.13"));
    }
    assert_eq!(
        plan_for(spec, &obs),
        Step::RecordSnapshotBarrier { index: 502 }
    );
    // Issue 23, item 11: durable members recreated on their claims run pods made on 3.6 over
    // data begun on 3.2: the data decides.
    let mut recreated = obs.clone();
    for p in &mut recreated.pods {
        p.created_on = Some(v("3.6.16"));
    }
    assert_eq!(
        plan_for(spec, &recreated),
        Step::RecordSnapshotBarrier { index: 502 }
    );
    for p in &mut obs.pods {
        p.snapshot_barrier = Some(502);
    }
    let step = plan_for(spec, &obs);
    assert!(
        matches!(&step, Step::Wait(Waiting::SnapshotBeforeUpgrade { members, entries_left })
            if members.len() == 3 && *entries_left == 502 + 10_000 + 1 - 500),
        "{step:?}"
    );
    // Two members applied a snapshot's worth of entries past the barrier; demo-2 has not.
    for (i, m) in obs.members.as_mut().unwrap().iter_mut().enumerate() {
        m.applied_index = if i == 2 { 9_000 } else { 10_600 };
    }
    assert!(matches!(
        plan_for(spec, &obs),
        Step::Wait(Waiting::SnapshotBeforeUpgrade { members, .. }) if members == vec!["demo-2".to_string()]
    ));
    obs.members.as_mut().unwrap()[2].applied_index = 10_503;
    assert!(
        matches!(plan_for(spec, &obs), Step::UpgradeMember { name, .. } if name == "demo-1"),
        "{:?}",
        plan_for(spec, &obs)
    );
    // etcdEnv's ETCD_SNAPSHOT_COUNT is the members' real snapshot interval.
    let small = "size: 3\nversion: 3.7.3\npod:\n  etcdEnv:\n  - name: ETCD_SNAPSHOT_COUNT\n    value: \"100\"";
    obs.members.as_mut().unwrap()[2].applied_index = 603;
    assert!(matches!(plan_for(small, &obs), Step::UpgradeMember { .. }));
    // Pods made by an earlier operator do not say where they were born: counted as old.
    for p in &mut obs.pods {
        p.created_on = None;
        p.data_created_on = None;
    }
    obs.members.as_mut().unwrap()[2].applied_index = 600;
    assert!(matches!(
        plan_for(spec, &obs),
        Step::Wait(Waiting::SnapshotBeforeUpgrade { .. })
    ));
    // A cluster born on 3.5 or later has no v2-format entries: no wait.
    for p in &mut obs.pods {
        p.created_on = Some(v("3.5.35"));
        p.data_created_on = Some(v("3.5.35"));
    }
    assert!(matches!(plan_for(spec, &obs), Step::UpgradeMember { .. }));
}

/// Issue 23, item 3: a durable member whose pod ended (a graceful node shutdown, an eviction)
/// gets its pod back on its claim, also when every member's pod ended (no quorum, no member
/// list); an ephemeral one is replaced (its data went with the pod).
#[test]
fn failed_pods_come_back_on_their_claims_with_or_without_quorum() {
    let ended = |mut p: PodState| {
        p.phase = PodPhase::Ended;
        p.ready = false;
        p.reason = Some("Terminated".into());
        p
    };
    let claims: Vec<String> = (0..3).map(|i| format!("demo-{i}")).collect();
    // Every node shut down gracefully: all three pods Failed, the member list unreadable.
    let all_failed = Observed {
        pods: (0..3).map(|i| ended(pod(i, "3.6.16"))).collect(),
        claims: claims.clone(),
        members: Err(MembersUnread::Unanswered("no member pod is running".into())),
        bootstrapped: true,
        ..Observed::default()
    };
    assert_eq!(
        plan_for(DURABLE, &all_failed),
        Step::DeletePod("demo-0".into())
    );
    let deleted = Observed {
        pods: vec![],
        ..all_failed.clone()
    };
    assert_eq!(
        plan_for(DURABLE, &deleted),
        Step::CreatePod(member_plan(0, 0..3, InitialState::Existing, "3.6.16"))
    );
    // One evicted member while the others keep quorum.
    let one = edit(healthy(3, "3.6.16"), |o| {
        o.claims = claims.clone();
        o.pods[1] = ended(pod(1, "3.6.16"));
        members(o)[1] = unhealthy(member(1, "3.6.16"));
    });
    assert_eq!(plan_for(DURABLE, &one), Step::DeletePod("demo-1".into()));
    // Without a claim the data is gone: replaced, not restarted.
    let ephemeral = edit(one.clone(), |o| o.claims.clear());
    assert_eq!(
        plan_for("size: 3", &ephemeral),
        remove(1, RemovalReason::Replace)
    );
    // Every ephemeral pod ended: nothing to restart, nothing silently recreated.
    let all_ephemeral = Observed {
        claims: vec![],
        ..all_failed
    };
    assert!(
        matches!(
            plan_for("size: 3", &all_ephemeral),
            Step::Blocked(Blocked::QuorumLostForGood { .. })
        ),
        "{:?}",
        plan_for("size: 3", &all_ephemeral)
    );
}

/// Issue 23, item 4: a pod stuck terminating past its grace period (its node died, a
/// finalizer) no longer freezes the cluster: its member is removed when quorum allows and a
/// replacement joins under a new name; within the grace period it is waited for.
#[test]
fn a_pod_stuck_terminating_is_replaced_under_a_new_name() {
    let stuck = |overdue: u64| {
        edit(healthy(3, "3.6.16"), move |o| {
            o.pods[1].terminating = true;
            o.pods[1].ready = false;
            o.pods[1].overdue = Duration::from_secs(overdue);
            members(o)[1] = unhealthy(member(1, "3.6.16"));
        })
    };
    assert_eq!(
        plan_for("size: 5", &stuck(30)),
        wait(Waiting::PodTerminating, 1),
        "within the stuck timeout"
    );
    assert_eq!(
        plan_for("size: 5", &stuck(61)),
        remove(1, RemovalReason::StuckTerminating)
    );
    // Removed: the stuck pod is left to its finalizer, and the scale-up goes on past it.
    let removed = edit(stuck(61), |o| {
        members(o).remove(1);
    });
    assert_eq!(plan_for("size: 5", &removed), add(3, true));
    // A healthy member whose pod is stuck (an unreachable kubelet still running it) goes only
    // when quorum holds without it.
    let healthy_stuck = edit(healthy(3, "3.6.16"), |o| {
        o.pods[1].terminating = true;
        o.pods[1].overdue = Duration::from_secs(61);
        members(o)[2] = unhealthy(member(2, "3.6.16"));
    });
    assert_eq!(
        plan_for("size: 3", &healthy_stuck),
        Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()])),
        "2 healthy of 3: removing the healthy stuck one would leave 1 of 2"
    );
    let only_stuck = edit(healthy(3, "3.6.16"), |o| {
        o.pods[1].terminating = true;
        o.pods[1].overdue = Duration::from_secs(61);
    });
    assert_eq!(
        plan_for("size: 3", &only_stuck),
        remove(1, RemovalReason::StuckTerminating)
    );
    // Quorum lost: nothing is removed, the loss is reported.
    let lost = edit(stuck(61), |o| {
        members(o)[2] = unhealthy(member(2, "3.6.16"));
    });
    assert!(
        matches!(
            plan_for("size: 3", &lost),
            Step::Blocked(Blocked::QuorumLost { .. })
        ),
        "{:?}",
        plan_for("size: 3", &lost)
    );
}

/// Issue 23, item 5: the first member is never killed into a broken cluster: Pending (an
/// image pull, a restore's download) and Ready-but-unreachable are waited for; one that ended
/// or ran for `member_start` without becoming ready starts over clean, under a new name and
/// token.
#[test]
fn a_slow_first_member_is_waited_for_and_a_failed_one_starts_over_clean() {
    let seed = |f: fn(&mut PodState)| {
        let mut p = pod(0, "3.6.16");
        p.ready = false;
        p.age = OLD;
        f(&mut p);
        Observed {
            pods: vec![p],
            ..Observed::default()
        }
    };
    let pending = seed(|p| {
        p.phase = PodPhase::Pending;
        p.running_for = None;
    });
    assert_eq!(
        plan_for("size: 3", &pending),
        wait(Waiting::MemberPending, 0),
        "an hour Pending is not failing"
    );
    let restored_late = seed(|p| p.running_for = Some(YOUNG));
    assert_eq!(
        plan_for("size: 3", &restored_late),
        wait(Waiting::MemberStarting, 0),
        "its etcd started 5 s ago, after a long restore"
    );
    let unreachable = seed(|p| p.ready = true);
    assert_eq!(
        plan_for("size: 3", &unreachable),
        wait(Waiting::MemberStarting, 0),
        "a Ready seed the operator cannot reach keeps running"
    );
    let hung = seed(|_| {});
    assert_eq!(
        plan_for("size: 3", &hung),
        Step::RestartBootstrap("demo-0".into())
    );
    let ended = seed(|p| p.phase = PodPhase::Ended);
    assert_eq!(
        plan_for("size: 3", &ended),
        Step::RestartBootstrap("demo-0".into())
    );
    let mut on_claim = ended.clone();
    on_claim.claims = vec!["demo-0".into()];
    assert_eq!(
        plan_for(DURABLE, &on_claim),
        Step::DeletePod("demo-0".into()),
        "a durable seed whose pod ended keeps its claim"
    );
    on_claim.pods.clear();
    let again = plan_for(DURABLE, &on_claim);
    assert!(
        matches!(&again, Step::Bootstrap(p) if p.name == "demo-0" && p.token == "demo-uid-1"),
        "{again:?}"
    );
    // Started over: the old pod terminating, its claim being deleted; the new seed gets the
    // next name and its own token.
    let restarting = seed(|p| p.terminating = true);
    let next = plan_for("size: 3", &restarting);
    assert!(
        matches!(&next, Step::Bootstrap(p) if p.name == "demo-1" && p.token == "demo-uid-1-1" && p.state == InitialState::New),
        "{next:?}"
    );
    let durable_restart = Observed {
        pods: vec![],
        deleting_claims: vec!["demo-0".into()],
        ..Observed::default()
    };
    let next = plan_for(DURABLE, &durable_restart);
    assert!(
        matches!(&next, Step::Bootstrap(p) if p.name == "demo-1"),
        "{next:?}"
    );
}

fn with_db(mut o: Observed, total: u64, in_use: u64, revision: i64) -> Observed {
    for m in members(&mut o) {
        m.db = DbSize { total, in_use };
        m.revision = revision;
    }
    o
}

fn alarm(i: u32, kind: AlarmKind) -> Alarm {
    Alarm {
        member_id: 100 + u64::from(i),
        member: format!("demo-{i}"),
        kind,
    }
}

const MIB: u64 = 1024 * 1024;

/// Issue 23, item 2: NOSPACE is healed without a human: compaction, then one member at a time
/// (followers first, the leader last), then the alarm disarmed; a compacted database still
/// over the quota is said, not looped on; CORRUPT blocks everything.
#[test]
fn no_space_is_healed_one_member_at_a_time_and_corrupt_is_left_to_a_human() {
    let spec = "size: 3";
    let full = |o: Observed| {
        let mut o = with_db(o, 17 * MIB, 16 * MIB, 500);
        o.alarms = vec![alarm(1, AlarmKind::NoSpace)];
        o.quota_bytes = 16 * MIB;
        o
    };
    let obs = full(healthy(3, "3.6.16"));
    assert_eq!(plan_for(spec, &obs), Step::Compact { revision: 500 });
    // Compacted 10 s ago: the history is gone, the files are not smaller yet.
    let mut compacted = with_db(obs.clone(), 17 * MIB, MIB, 500);
    compacted.maintenance.compacted = Some((500, Duration::from_secs(10)));
    let defrag = |name: &str| Step::Defragment {
        name: name.into(),
        reason: DefragReason::NoSpace,
    };
    assert_eq!(plan_for(spec, &compacted), defrag("demo-1"));
    compacted.maintenance.defragmented = vec![("demo-1".into(), Duration::from_secs(5))];
    assert_eq!(plan_for(spec, &compacted), defrag("demo-2"));
    // A defragmentation from before the compaction does not count.
    compacted
        .maintenance
        .defragmented
        .push(("demo-2".into(), Duration::from_secs(3600)));
    assert_eq!(plan_for(spec, &compacted), defrag("demo-2"));
    compacted.maintenance.defragmented = vec![
        ("demo-1".into(), Duration::from_secs(5)),
        ("demo-2".into(), Duration::from_secs(3)),
    ];
    assert_eq!(
        plan_for(spec, &compacted),
        defrag("demo-0"),
        "the leader last"
    );
    compacted
        .maintenance
        .defragmented
        .push(("demo-0".into(), Duration::from_secs(1)));
    assert_eq!(
        plan_for(spec, &compacted),
        Step::DisarmAlarm(vec![alarm(1, AlarmKind::NoSpace)])
    );
    // Nothing else happens meanwhile (no scale-up while the database is full).
    assert_eq!(plan_for("size: 5", &obs), Step::Compact { revision: 500 });
    // Data that fills the quota after compaction: the figures before a defragmentation are not
    // exact (pages the compaction freed may still count), so the first follower is
    // defragmented; its exact figure fills the quota: said, and nothing more is defragmented.
    let mut exhausted = with_db(obs.clone(), 17 * MIB, 15 * MIB, 500);
    exhausted.maintenance.compacted = Some((500, Duration::from_secs(10)));
    assert_eq!(plan_for(spec, &exhausted), defrag("demo-1"));
    exhausted.maintenance.defragmented = vec![("demo-1".into(), Duration::from_secs(5))];
    assert_eq!(
        plan_for(spec, &exhausted),
        Step::Blocked(Blocked::SpaceExhausted {
            in_use: 15 * MIB,
            quota: 16 * MIB
        })
    );
    // Stale figures on every member (all still counting the freed pages): defragmenting the
    // first member finds the room, and the heal goes on.
    let mut stale = with_db(obs.clone(), 17 * MIB, 15 * MIB, 500);
    stale.maintenance.compacted = Some((500, Duration::from_secs(10)));
    stale.maintenance.defragmented = vec![("demo-1".into(), Duration::from_secs(5))];
    members(&mut stale)[1].db = DbSize {
        total: MIB,
        in_use: MIB,
    };
    assert_eq!(plan_for(spec, &stale), defrag("demo-2"));
    // Keys deleted since (the revision moved): compacted again to free them, at most once a
    // minute (issue 32, item 5).
    let mut moved = with_db(exhausted.clone(), 17 * MIB, 15 * MIB, 520);
    assert!(matches!(
        plan_for(spec, &moved),
        Step::Blocked(Blocked::SpaceExhausted { .. })
    ));
    moved.maintenance.compacted = Some((500, Duration::from_secs(31)));
    assert_eq!(plan_for(spec, &moved), Step::Compact { revision: 520 });
    // Healing goes on while deletes and lease expiries keep moving the revision: compacted
    // once per episode, never again (issue 32, item 5).
    let mut busy = with_db(compacted.clone(), 17 * MIB, MIB, 9_000);
    busy.maintenance.defragmented = vec![];
    assert_eq!(plan_for(spec, &busy), defrag("demo-1"));
    // The fullest member decides whether there is room, on exact figures: those of members
    // defragmented since the compaction (issue 32, item 5).
    let mut uneven = with_db(obs.clone(), 17 * MIB, MIB, 500);
    uneven.maintenance.compacted = Some((500, Duration::from_secs(10)));
    members(&mut uneven)[2].db.in_use = 15 * MIB;
    assert_eq!(
        plan_for(spec, &uneven),
        defrag("demo-1"),
        "not yet defragmented: no exact figure, the first follower is defragmented"
    );
    uneven.maintenance.defragmented = vec![
        ("demo-1".into(), Duration::from_secs(5)),
        ("demo-2".into(), Duration::from_secs(3)),
    ];
    assert!(matches!(
        plan_for(spec, &uneven),
        Step::Blocked(Blocked::SpaceExhausted { in_use, .. }) if in_use == 15 * MIB
    ));
    // The members' own revision retention is kept.
    let retention = "size: 3\npod:\n  etcdEnv:\n  - name: ETCD_AUTO_COMPACTION_MODE\n    value: revision\n  - name: ETCD_AUTO_COMPACTION_RETENTION\n    value: \"100\"";
    assert_eq!(plan_for(retention, &obs), Step::Compact { revision: 400 });
    // CORRUPT: nothing is changed, nothing disarmed.
    let mut corrupt = obs.clone();
    corrupt.alarms.push(alarm(2, AlarmKind::Corrupt));
    assert_eq!(
        plan_for("size: 5", &corrupt),
        Step::Blocked(Blocked::DataCorrupted {
            members: vec!["demo-2".into()]
        })
    );
    // A member unhealthy for another reason: the heal waits for it.
    let mut sick = compacted.clone();
    members(&mut sick)[2] = unhealthy(member(2, "3.6.16"));
    assert_eq!(
        plan_for(spec, &sick),
        Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()]))
    );
}

/// Issue 23, item 2: members whose files hold much more than their data are defragmented one
/// at a time, each at most once per interval, only when nothing else is to be done.
#[test]
fn fragmented_members_are_defragmented_once_per_interval() {
    let settings = PlannerSettings::default();
    let obs = with_db(healthy(3, "3.6.16"), 600 * MIB, 100 * MIB, 9);
    let view = view_of("size: 3");
    assert_eq!(
        plan(&view, &obs, &settings),
        Step::Defragment {
            name: "demo-1".into(),
            reason: DefragReason::Fragmented
        }
    );
    let mut done = obs.clone();
    done.maintenance.defragmented = vec![("demo-1".into(), Duration::from_secs(60))];
    assert_eq!(
        plan(&view, &done, &settings),
        Step::Defragment {
            name: "demo-2".into(),
            reason: DefragReason::Fragmented
        }
    );
    done.maintenance.defragmented = ["demo-0", "demo-1", "demo-2"]
        .iter()
        .map(|m| (m.to_string(), Duration::from_secs(3600)))
        .collect();
    assert_eq!(
        plan(&view, &done, &settings),
        Step::Done,
        "within the interval"
    );
    let small = with_db(healthy(3, "3.6.16"), 60 * MIB, 10 * MIB, 9);
    assert_eq!(
        plan(&view, &small, &settings),
        Step::Done,
        "too little to reclaim"
    );
    let off = PlannerSettings {
        defragmentation: DefragmentationPolicy {
            interval: None,
            ..DefragmentationPolicy::default()
        },
        ..settings
    };
    assert_eq!(plan(&view, &obs, &off), Step::Done, "turned off");
    // Not while anything else is to be done, nor while a pod is not Ready.
    assert_eq!(plan(&view_of("size: 5"), &obs, &settings), add(3, true));
    let mut unready = obs.clone();
    unready.pods[2].ready = false;
    let step = plan(&view, &unready, &settings);
    assert!(!matches!(step, Step::Defragment { .. }), "{step:?}");
}

/// Issue 24: a permanent loss (the data of a majority of voters provably gone) is recovered
/// from the surviving member with the most data, under `Automatic` or once approved; a
/// temporary loss (data on claims) never is; a member that may hold data but has not answered
/// is waited for rather than passed over.
#[test]
fn a_permanent_loss_is_recovered_from_the_best_survivor_only_when_approved() {
    let lost_two = |mut o: Observed| {
        for i in [1, 2] {
            members(&mut o)[i] = unhealthy(member(i as u32, "3.6.16"));
        }
        o.pods.truncate(1);
        members(&mut o)[0].health = Health::Unhealthy("no leader".into());
        members(&mut o)[0].raft_index = 120;
        gone_from(&mut o, 1, NodeState::Ready);
        gone_from(&mut o, 2, NodeState::Ready);
        o
    };
    let obs = lost_two(healthy(3, "3.6.16"));
    let automatic = "size: 3\nrecovery:\n  policy: Automatic";
    assert_eq!(
        plan_for(automatic, &obs),
        Step::StartRecovery {
            from: RecoverFrom::Member {
                name: "demo-0".into(),
                raft_index: 120
            },
            lost: vec!["demo-1".into(), "demo-2".into()],
        }
    );
    // Manual: the approval annotation starts it.
    let view = crate::view::ClusterView::new(
        &{
            let mut c = crate::view::fixtures::cluster_of("size: 3");
            c.metadata.annotations = Some(
                [(
                    names::ANNOTATION_RECOVER.to_string(),
                    names::RECOVER_NOW.to_string(),
                )]
                .into(),
            );
            c
        },
        &etcd_shared::admission::AdmissionPolicy::default(),
    )
    .expect("view");
    assert!(matches!(
        plan(&view, &obs, &PlannerSettings::default()),
        Step::StartRecovery { .. }
    ));
    // Temporary: the same two members with their data on claims are brought back, never
    // recovered from.
    let mut durable = obs.clone();
    durable.claims = (0..3).map(|i| format!("demo-{i}")).collect();
    assert_eq!(
        plan(
            &view_of(&format!("{automatic}\n{DURABLE}")),
            &durable,
            &PlannerSettings::default()
        ),
        Step::CreatePod(member_plan(1, 0..3, InitialState::Existing, "3.6.16"))
    );
    // The survivor with the most data is chosen.
    let mut five = healthy(5, "3.6.16");
    for i in [2, 3, 4] {
        members(&mut five)[i] = unhealthy(member(i as u32, "3.6.16"));
    }
    five.pods.truncate(2);
    for i in [2, 3, 4] {
        gone_from(&mut five, i, NodeState::Gone);
    }
    members(&mut five)[0].raft_index = 90;
    members(&mut five)[1].raft_index = 95;
    for i in [0, 1] {
        members(&mut five)[i].health = Health::Unhealthy("no leader".into());
    }
    assert!(
        matches!(plan_for("size: 5\nrecovery:\n  policy: Automatic", &five),
            Step::StartRecovery { from: RecoverFrom::Member { name, raft_index: 95 }, .. } if name == "demo-1"),
        "{:?}",
        plan_for("size: 5\nrecovery:\n  policy: Automatic", &five)
    );
    // A member that may hold data but did not answer: waited for.
    let mut silent = obs.clone();
    members(&mut silent)[0].answered = false;
    assert!(matches!(
        plan_for(automatic, &silent),
        Step::Blocked(Blocked::QuorumLostForGood {
            loss: PermanentLoss { from: None, .. },
            ..
        })
    ));
    // Every member and its data gone: from the newest backup.
    let none_left = Observed {
        bootstrapped: true,
        ..Observed::default()
    };
    assert_eq!(
        plan_for(automatic, &none_left),
        Step::StartRecovery {
            from: RecoverFrom::Backup,
            lost: vec![],
        }
    );
}

/// Issue 24: a recovery in progress seeds a new first member (a new name past every name of
/// the lost cluster, its own token, the recorded snapshot, revisions bumped), waits for it,
/// then removes the lost cluster's pods and claims one at a time, then finishes; the records
/// follow each step.
#[test]
fn a_recovery_in_progress_seeds_then_removes_the_lost_cluster() {
    use etcd_shared::types::RecoveryStatus;
    let record = RecoveryStatus {
        from_member: Some("demo-0".into()),
        member_endpoint: Some("http://demo-0.demo.ns1.svc:2379".into()),
        sha256: "ab".repeat(32),
        revision: Some(101),
        members_lost: 2,
        replaced: vec!["demo-0".into(), "demo-1".into(), "demo-2".into()],
        ..RecoveryStatus::default()
    };
    let recovering = |pods: Vec<String>, claims: Vec<String>| Recovering {
        seed: recovery::seed_plan(&record),
        replaced_pods: pods
            .into_iter()
            .map(|name| ReplacedPod {
                name,
                uid: None,
                terminating: false,
            })
            .collect(),
        replaced_claims: claims,
        lost_names: record.replaced.clone(),
        lost_cluster_serves: None,
    };
    let mut obs = Observed {
        bootstrapped: true,
        recovery: Some(recovering(vec!["demo-0".into()], vec![])),
        ..Observed::default()
    };
    let step = plan_for("size: 3", &obs);
    let Step::Bootstrap(seed) = &step else {
        panic!("{step:?}");
    };
    assert_eq!(seed.name, "demo-3");
    assert_eq!(seed.token, "demo-uid-1-3");
    assert_eq!(seed.state, InitialState::New);
    assert_eq!(
        seed.seed,
        Some(SeedPlan {
            from: SeedFrom::Member("http://demo-0.demo.ns1.svc:2379".into()),
            sha256: "ab".repeat(32),
            bump_revision: true,
        })
    );
    // The seed restoring (init containers): waited for, the survivor kept.
    let mut restoring = pod(3, "3.6.16");
    restoring.phase = PodPhase::Pending;
    restoring.ready = false;
    obs.pods = vec![restoring];
    assert_eq!(plan_for("size: 3", &obs), wait(Waiting::MemberPending, 3));
    // It runs: the new cluster grows as any does while the survivor (the only other copy)
    // is kept (issue 32, item 4).
    obs.pods[0].phase = PodPhase::Running;
    obs.pods[0].ready = true;
    obs.members = Ok(vec![member(3, "3.6.16")]);
    assert_eq!(plan_for("size: 3", &obs), add(4, true));
    // The second member still a learner, then a voter whose pod is not in the client Service
    // yet: no quorum of its size holds the data, the survivor stays.
    obs.pods.push(pod(4, "3.6.16"));
    members(&mut obs).push(learner(member(4, "3.6.16")));
    assert!(
        matches!(
            plan_for("size: 3", &obs),
            Step::PromoteLearner { id: 104, .. }
        ),
        "{:?}",
        plan_for("size: 3", &obs)
    );
    members(&mut obs)[1].learner = false;
    obs.pods[1].in_service = false;
    assert_ne!(plan_for("size: 3", &obs), Step::DeletePod("demo-0".into()));
    // A quorum of its size healthy and serving: the lost cluster goes, pods then claims, then
    // the recovery is over.
    obs.pods[1].in_service = true;
    assert_eq!(plan_for("size: 3", &obs), Step::DeletePod("demo-0".into()));
    // A pod of the lost cluster already being deleted (a finalizer, a silent node) is not
    // deleted again: the recovery goes on past it (issue 32, item 3).
    obs.recovery = Some(Recovering {
        replaced_pods: vec![ReplacedPod {
            name: "demo-0".into(),
            uid: None,
            terminating: true,
        }],
        ..recovering(vec![], vec![])
    });
    assert_eq!(plan_for("size: 3", &obs), Step::FinishRecovery);
    obs.recovery = Some(recovering(vec![], vec!["demo-1".into()]));
    assert_eq!(
        plan_for("size: 3", &obs),
        Step::DeleteClaim("demo-1".into())
    );
    obs.recovery = Some(recovering(vec![], vec![]));
    assert_eq!(plan_for("size: 3", &obs), Step::FinishRecovery);
    // Paused: nothing, even mid-recovery.
    assert_eq!(
        plan_for("size: 3\npaused: true", &obs),
        Step::Blocked(Blocked::Paused)
    );
    // The records.
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    );
    let (kept, last) = recovery::records_after(Some(record.clone()), None, None, &step, &now);
    assert_eq!(kept.and_then(|r| r.seed).as_deref(), Some("demo-3"));
    assert_eq!(last, None);
    let (kept, last) = recovery::records_after(
        Some(record.clone()),
        None,
        None,
        &Step::FinishRecovery,
        &now,
    );
    assert_eq!(kept, None);
    let last = last.expect("lastRecovery");
    assert_eq!(last.source, "member demo-0");
    assert_eq!(last.revision, Some(101));
    assert_eq!(last.members_lost, 2);
}
