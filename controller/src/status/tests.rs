//! Table tests of [`compute`]: every field it decides (phase, reason, the conditions, the
//! members, the versions) for each kind of step; then the CoreOS status fields (`targetVersion`
//! only during an upgrade, `controlPaused` while paused, `reason` only with a failure phase),
//! carried transition times and stale fields of another writer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use etcd_shared::admission::{Refusal, Violation};
use etcd_shared::types::status::unknown_time;

use super::*;
use crate::planner::PodState;
use crate::planner::fixtures::new_member_plan as plan;
use crate::planner::fixtures::{add_member, remove_member, upgrade_member};
use crate::view::fixtures::view_of;

fn v(s: &str) -> EtcdVersion {
    s.parse().expect("version")
}

fn now() -> Timestamp {
    Timestamp::from_second(1_800_000_000).expect("a valid second")
}

fn pod(i: u32, version: &str) -> PodState {
    crate::planner::fixtures::ready_pod(i, version)
}

fn member(i: u32, version: &str, healthy: bool) -> MemberState {
    let id = 100 + u64::from(i);
    let mut m = crate::planner::fixtures::healthy_member(
        &format!("demo-{i}"),
        id,
        Some(v(version)),
        i == 0,
    );
    if !healthy {
        m.health = Health::Unhealthy("connection refused".into());
        m.answered = false;
    }
    m
}

/// Three bootstrapped members at the given versions; `None` is an unhealthy member.
fn three(versions: [Option<&str>; 3]) -> Observed {
    Observed {
        pods: (0..3u32)
            .map(|i| pod(i, versions[i as usize].unwrap_or("3.6.16")))
            .collect(),
        claims: vec![],
        members: Ok((0..3u32)
            .map(|i| {
                let v = versions[i as usize];
                member(i, v.unwrap_or("3.6.16"), v.is_some())
            })
            .collect()),
        bootstrapped: true,
        ..Observed::default()
    }
}

const AT_3_6: [Option<&str>; 3] = [Some("3.6.16"), Some("3.6.16"), Some("3.6.16")];
const AT_3_5: [Option<&str>; 3] = [Some("3.5.35"), Some("3.5.35"), Some("3.5.35")];
const MIXED: [Option<&str>; 3] = [Some("3.6.16"), Some("3.5.35"), Some("3.5.35")];

/// One case of [`compute`]: what it is given and every field it decides.
struct Row {
    what: &'static str,
    spec: &'static str,
    obs: Observed,
    step: Step,
    phase: ClusterPhase,
    reason: Option<&'static str>,
    target: Option<&'static str>,
    paused: bool,
    /// `(status, reason)` of the Available, Progressing and Degraded conditions.
    available: (bool, &'static str),
    progressing: (bool, &'static str),
    degraded: (bool, &'static str),
    /// `members.ready` and `members.unready`; `readyMembers` is the first's length.
    ready: &'static [&'static str],
    unready: &'static [&'static str],
}

const ALL: &[&str] = &["demo-0", "demo-1", "demo-2"];
const NONE: &[&str] = &[];

fn rows() -> Vec<Row> {
    let upgrade = upgrade_member(2, "3.6.16");
    let healthy = (false, "AsExpected");
    let quorum = (true, "QuorumHealthy");
    let base = Row {
        what: "running at the spec's version",
        spec: "size: 3\nversion: 3.6.16",
        obs: three(AT_3_6),
        step: Step::Done,
        phase: ClusterPhase::Running,
        reason: None,
        target: None,
        paused: false,
        available: quorum,
        progressing: (false, "Reconciled"),
        degraded: healthy,
        ready: ALL,
        unready: NONE,
    };
    vec![
        Row {
            what: "creating: no member list yet",
            obs: Observed::default(),
            step: Step::Wait(Waiting::MemberStarting("demo-0".into())),
            phase: ClusterPhase::Creating,
            available: (false, "Bootstrapping"),
            progressing: (true, "WaitingForMembers"),
            ready: NONE,
            ..base.clone()
        },
        Row {
            what: "creating: the first member",
            obs: Observed::default(),
            step: Step::Bootstrap(plan("demo-0")),
            phase: ClusterPhase::Creating,
            available: (false, "Bootstrapping"),
            progressing: (true, "Bootstrapping"),
            ready: NONE,
            ..base.clone()
        },
        Row {
            what: "the first member is upgraded",
            obs: three(AT_3_5),
            step: upgrade,
            phase: ClusterPhase::Upgrading,
            target: Some("3.6.16"),
            progressing: (true, "Upgrading"),
            ..base.clone()
        },
        Row {
            what: "waiting for an upgraded member",
            obs: three(MIXED),
            step: Step::Wait(Waiting::MemberUpgrading("demo-0".into())),
            phase: ClusterPhase::Upgrading,
            target: Some("3.6.16"),
            progressing: (true, "Upgrading"),
            ..base.clone()
        },
        Row {
            what: "leadership handed over before the leader is upgraded",
            obs: three(MIXED),
            step: Step::TransferLeadership {
                from: "demo-0".into(),
                to: "demo-1".into(),
                to_id: 101,
                before: crate::planner::Handover::Upgrade,
            },
            phase: ClusterPhase::Upgrading,
            target: Some("3.6.16"),
            progressing: (true, "Upgrading"),
            ..base.clone()
        },
        Row {
            what: "a snapshot barrier recorded before an upgrade",
            obs: three(AT_3_5),
            step: Step::RecordSnapshotBarrier { index: 1000 },
            phase: ClusterPhase::Upgrading,
            target: Some("3.6.16"),
            progressing: (true, "Upgrading"),
            ..base.clone()
        },
        Row {
            what: "waiting for the members' snapshots before an upgrade",
            obs: three(AT_3_5),
            step: Step::Wait(Waiting::SnapshotBeforeUpgrade {
                members: vec!["demo-1".into()],
                entries_left: 10,
            }),
            phase: ClusterPhase::Upgrading,
            target: Some("3.6.16"),
            progressing: (true, "Upgrading"),
            ..base.clone()
        },
        Row {
            what: "paused in the middle of an upgrade",
            spec: "size: 3\nversion: 3.6.16\npaused: true",
            obs: three(MIXED),
            step: Step::Blocked(Blocked::Paused),
            phase: ClusterPhase::Paused,
            target: Some("3.6.16"),
            paused: true,
            progressing: (false, "Paused"),
            ..base.clone()
        },
        Row {
            what: "paused at the spec's version",
            spec: "size: 3\nversion: 3.6.16\npaused: true",
            step: Step::Blocked(Blocked::Paused),
            phase: ClusterPhase::Paused,
            paused: true,
            progressing: (false, "Paused"),
            ..base.clone()
        },
        Row {
            what: "an upgrade etcd does not support",
            obs: three(AT_3_5),
            step: Step::Blocked(Blocked::UpgradeNotSupported(
                "3.5.20 cannot move to 3.6".into(),
            )),
            phase: ClusterPhase::Degraded,
            reason: Some("UpgradeNotSupported"),
            target: Some("3.6.16"),
            progressing: (false, "Blocked"),
            degraded: (true, "UpgradeNotSupported"),
            ..base.clone()
        },
        Row {
            what: "quorum lost",
            obs: three([Some("3.6.16"), None, None]),
            step: Step::Blocked(Blocked::QuorumLost {
                missing: vec!["demo-1".into(), "demo-2".into()],
                voters: 3,
                unconfirmed: vec![],
            }),
            phase: ClusterPhase::QuorumLost,
            reason: Some("QuorumLost"),
            available: (false, "QuorumLost"),
            progressing: (false, "Blocked"),
            degraded: (true, "QuorumLost"),
            ready: &["demo-0"],
            unready: &["demo-1", "demo-2"],
            ..base.clone()
        },
        Row {
            what: "every member lost",
            obs: three([None, None, None]),
            step: Step::Blocked(Blocked::AllMembersLost),
            phase: ClusterPhase::QuorumLost,
            reason: Some("AllMembersLost"),
            available: (false, "QuorumLost"),
            progressing: (false, "Blocked"),
            degraded: (true, "AllMembersLost"),
            ready: NONE,
            unready: ALL,
            ..base.clone()
        },
        Row {
            what: "an unhealthy member the kubelet restarts",
            obs: three([Some("3.6.16"), Some("3.6.16"), None]),
            step: Step::Wait(Waiting::Unhealthy(vec!["demo-2".into()])),
            phase: ClusterPhase::Degraded,
            reason: Some("MembersUnhealthy"),
            progressing: (true, "WaitingForMembers"),
            degraded: (true, "MembersUnhealthy"),
            ready: &["demo-0", "demo-1"],
            unready: &["demo-2"],
            ..base.clone()
        },
        Row {
            what: "an unhealthy member replaced",
            obs: three([Some("3.6.16"), Some("3.6.16"), None]),
            step: remove_member(2, RemovalReason::Replace),
            phase: ClusterPhase::Recovering,
            progressing: (true, "ReplacingMember"),
            degraded: (true, "MembersUnhealthy"),
            ready: &["demo-0", "demo-1"],
            unready: &["demo-2"],
            ..base.clone()
        },
        Row {
            what: "scaling up is no failure",
            spec: "size: 5\nversion: 3.6.16",
            step: add_member(3, true),
            phase: ClusterPhase::Scaling,
            progressing: (true, "ScalingUp"),
            ..base.clone()
        },
        Row {
            what: "a learner catching up",
            spec: "size: 5\nversion: 3.6.16",
            step: Step::Wait(Waiting::LearnerCatchingUp("demo-3".into())),
            phase: ClusterPhase::Scaling,
            progressing: (true, "WaitingForMembers"),
            ..base.clone()
        },
        Row {
            what: "scaling down",
            spec: "size: 1\nversion: 3.6.16",
            step: remove_member(2, RemovalReason::ScaleDown),
            phase: ClusterPhase::Scaling,
            progressing: (true, "ScalingDown"),
            ..base.clone()
        },
        base,
    ]
}

impl Clone for Row {
    fn clone(&self) -> Self {
        Row {
            obs: self.obs.clone(),
            step: self.step.clone(),
            ..*self
        }
    }
}

/// The condition of `type_` as `(status, reason)`.
fn condition_of(s: &EtcdClusterStatus, type_: &str) -> (bool, String) {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition"));
    (c.status == "True", c.reason.clone())
}

#[test]
fn compute_table() {
    for row in rows() {
        // Past creation (a cluster is Creating until it first matches its spec).
        let previous = EtcdClusterStatus {
            phase: row.obs.bootstrapped.then_some(ClusterPhase::Running),
            ..EtcdClusterStatus::default()
        };
        let view = view_of(row.spec);
        let s = compute(&view, &row.obs, &row.step, Some(&previous), now());
        let what = row.what;
        assert_eq!(s.phase, Some(row.phase), "{what}");
        assert_eq!(s.reason.as_deref(), row.reason, "{what}: reason");
        assert_eq!(
            s.target_version.as_deref(),
            row.target,
            "{what}: targetVersion"
        );
        assert_eq!(s.control_paused, row.paused, "{what}: controlPaused");
        // A failure phase has a reason and any other phase has none.
        assert_eq!(s.reason.is_some(), row.phase.is_failure(), "{what}");
        for (type_, (status, reason)) in [
            (AVAILABLE, row.available),
            (PROGRESSING, row.progressing),
            (DEGRADED, row.degraded),
            (
                PAUSED,
                (
                    row.paused,
                    if row.paused {
                        "PausedBySpec"
                    } else {
                        "NotPaused"
                    },
                ),
            ),
        ] {
            assert_eq!(
                condition_of(&s, type_),
                (status, reason.to_string()),
                "{what}: {type_}"
            );
        }
        assert!(
            s.conditions
                .iter()
                .all(|c| c.observed_generation == view.generation
                    && c.last_transition_time == Time(now())),
            "{what}: {:?}",
            s.conditions
        );
        let members = s.members.clone().unwrap_or_default();
        assert_eq!(members.ready, row.ready, "{what}: members.ready");
        assert_eq!(members.unready, row.unready, "{what}: members.unready");
        assert_eq!(
            s.ready_members,
            i32::try_from(row.ready.len()).ok(),
            "{what}: readyMembers"
        );
        assert_eq!(s.observed_generation, view.generation, "{what}");
        assert_eq!(s.service_name.as_deref(), Some("demo-client"), "{what}");
        assert_eq!(s.client_port, Some(CLIENT_PORT), "{what}");
        assert_eq!(
            s.next_step,
            Some(describe(&row.step)).filter(|d| !d.is_empty()),
            "{what}"
        );
    }
}

#[test]
fn the_serialized_status_says_only_what_holds() {
    let running = compute(
        &view_of("size: 3\nversion: 3.6.16"),
        &three(AT_3_6),
        &Step::Done,
        None,
        now(),
    );
    let json = serde_json::to_value(&running).expect("serializes");
    for absent in ["targetVersion", "reason", "controlPaused"] {
        assert!(json.get(absent).is_none(), "{absent} in {json}");
    }
    assert_eq!(json["currentVersion"], "3.6.16");
    let paused = compute(
        &view_of("size: 3\nversion: 3.6.16\npaused: true"),
        &three(AT_3_6),
        &Step::Blocked(Blocked::Paused),
        None,
        now(),
    );
    assert_eq!(
        serde_json::to_value(&paused).expect("serializes")["controlPaused"],
        true
    );
}

/// A status CoreOS' operator left behind (phase Failed, its reason, controlPaused, a
/// targetVersion, its conditions) is not carried over; only known transition times are.
#[test]
fn a_coreos_status_left_behind_is_replaced() {
    let coreos: EtcdClusterStatus = serde_json::from_value(serde_json::json!({
        "phase": "Failed",
        "reason": "Fail to create seed member",
        "controlPaused": true,
        "conditions": [
            {"type": "Available", "status": "True", "lastUpdateTime": "2018-03-01T10:00:00Z",
             "lastTransitionTime": "2018-03-01T09:00:00Z", "reason": "Cluster available"},
            {"type": "Scaling", "status": "True", "reason": "Scaling up"}
        ],
        "size": 3, "members": {}, "currentVersion": "3.2.13", "targetVersion": "3.3.27"
    }))
    .expect("CoreOS status reads");
    let s = compute(
        &view_of("size: 3\nversion: 3.6.16"),
        &three(AT_3_6),
        &Step::Done,
        Some(&coreos),
        now(),
    );
    assert_eq!(s.phase, Some(ClusterPhase::Running));
    assert_eq!(s.reason, None);
    assert!(!s.control_paused);
    assert_eq!(s.target_version, None);
    assert_eq!(s.current_version.as_deref(), Some("3.6.16"));
    let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, [AVAILABLE, PROGRESSING, DEGRADED, PAUSED, SPREAD]);
    let available = &s.conditions[0];
    assert_eq!(
        available.last_transition_time,
        Time("2018-03-01T09:00:00Z".parse().expect("time")),
        "available since CoreOS said so"
    );
}

#[test]
fn an_unknown_transition_time_is_not_carried() {
    let previous = EtcdClusterStatus {
        conditions: vec![Condition {
            type_: AVAILABLE.into(),
            status: "True".into(),
            reason: String::new(),
            message: String::new(),
            observed_generation: None,
            last_transition_time: unknown_time(),
        }],
        ..EtcdClusterStatus::default()
    };
    let s = compute(
        &view_of("size: 3\nversion: 3.6.16"),
        &three(AT_3_6),
        &Step::Done,
        Some(&previous),
        now(),
    );
    assert_eq!(s.conditions[0].last_transition_time, Time(now()));
}

#[test]
fn an_invalid_spec_gives_the_reason() {
    let error = InvalidCluster::Spec(Refusal(vec![Violation::new(
        "version-unsupported",
        "spec.version",
        "3.1.0 is older than the operator supports",
    )]));
    let previous = EtcdClusterStatus {
        phase: Some(ClusterPhase::Running),
        ..EtcdClusterStatus::default()
    };
    let s = invalid(&error, Some(2), Some(&previous), now());
    assert_eq!(s.reason.as_deref(), Some("InvalidSpec"));
    assert_eq!(
        s.phase,
        Some(ClusterPhase::Running),
        "the phase is left alone"
    );
}

/// What CoreOS' operator left in the status and this controller does not write is removed by
/// a merge patch (server-side apply would leave it: another manager owns it).
#[test]
fn stale_fields_of_another_writer_are_nulled() {
    let stored: EtcdClusterStatus = serde_json::from_value(serde_json::json!({
        "phase": "Running", "reason": "leftover", "controlPaused": true,
        "size": 3, "serviceName": "demo-client", "clientPort": 2379,
        "members": {"ready": ["demo-0000"], "unready": ["demo-0001"]},
        "currentVersion": "3.5.35", "targetVersion": "3.6.16"
    }))
    .expect("reads");
    let new = compute(
        &view_of("size: 3\nversion: 3.6.16"),
        &three(AT_3_6),
        &Step::Done,
        Some(&stored),
        now(),
    );
    assert_eq!(
        stale_fields(&new, &stored),
        Some(serde_json::json!({"status": {
            "reason": null, "controlPaused": null, "targetVersion": null,
            "members": {"unready": null}
        }}))
    );
    assert_eq!(stale_fields(&new, &new), None, "nothing left over");
}

/// A member pod the kubelet reports Ready that the operator cannot reach (a certificate that
/// does not work): Degraded says so with etcd's error, and `reason` names it; the phase is
/// not Running.
#[test]
fn ready_pods_the_operator_cannot_reach_are_degraded_not_healthy() {
    let view = view_of("size: 1\nversion: 3.6.16");
    let obs = Observed {
        pods: vec![pod(0, "3.6.16")],
        claims: vec![],
        members: Err(crate::planner::MembersUnread::Unanswered(
            "etcd over TLS: invalid peer certificate: NotValidForName".into(),
        )),
        bootstrapped: false,
        ..Observed::default()
    };
    let step = Step::Wait(Waiting::MemberStarting("demo-0".into()));
    let status = compute(&view, &obs, &step, None, now());
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == DEGRADED)
        .expect("a Degraded condition");
    assert_eq!(degraded.status, "True");
    assert_eq!(degraded.reason, "MembersUnreachable");
    assert!(
        degraded.message.contains("NotValidForName"),
        "{}",
        degraded.message
    );
    assert_eq!(status.reason.as_deref(), Some("MembersUnreachable"));
    assert_ne!(status.phase, Some(ClusterPhase::Running));
}

/// While members of CoreOS' operator are adopted, the status lists them, the phase is Scaling
/// and Progressing says `AdoptingCoreOSMembers` for every step of it; a failure still says so
/// as a failure (issue 28).
#[test]
fn an_adoption_is_reported_with_the_coreos_members_left() {
    let view = view_of("size: 3\nversion: 3.6.16");
    let mut obs = three(AT_3_6);
    obs.pods[1].coreos = true;
    obs.pods[2].coreos = true;
    let previous = EtcdClusterStatus {
        phase: Some(ClusterPhase::Running),
        ..EtcdClusterStatus::default()
    };
    for step in [
        add_member(3, true),
        Step::Wait(Waiting::LearnerCatchingUp("demo-3".into())),
        remove_member(1, crate::planner::RemovalReason::Adopted),
        Step::TransferLeadership {
            from: "demo-2".into(),
            to: "demo-0".into(),
            to_id: 100,
            before: crate::planner::Handover::Removal,
        },
    ] {
        let s = compute(&view, &obs, &step, Some(&previous), now());
        assert_eq!(s.phase, Some(ClusterPhase::Scaling), "{step:?}");
        assert_eq!(
            condition_of(&s, PROGRESSING),
            (true, "AdoptingCoreOSMembers".into()),
            "{step:?}"
        );
        assert_eq!(s.coreos_members, ["demo-1", "demo-2"], "{step:?}");
        // The scale subresource's selector names the member pods the Services select.
        assert_eq!(
            s.selector.as_deref(),
            Some("app=etcd,etcd_cluster=demo"),
            "{step:?}"
        );
        assert_eq!(s.target_version, None, "a handover is no upgrade: {step:?}");
    }
    let lost = compute(
        &view,
        &obs,
        &Step::Blocked(Blocked::QuorumLost {
            missing: vec!["demo-1".into(), "demo-2".into()],
            voters: 3,
            unconfirmed: vec![],
        }),
        Some(&previous),
        now(),
    );
    assert_eq!(lost.phase, Some(ClusterPhase::QuorumLost));
    assert_eq!(condition_of(&lost, PROGRESSING).1, "Blocked");
    // Adopted: nothing listed, and the field is left out of the JSON.
    let done = compute(&view, &three(AT_3_6), &Step::Done, Some(&previous), now());
    assert!(done.coreos_members.is_empty());
    assert_eq!(
        done.selector.as_deref(),
        Some(
            "app.kubernetes.io/component=member,app.kubernetes.io/instance=demo,app.kubernetes.io/managed-by=etcd-operator,app.kubernetes.io/name=etcd"
        )
    );
    assert!(
        serde_json::to_value(&done)
            .expect("serializes")
            .get("coreosMembers")
            .is_none()
    );
}

/// Issue 32, item 10: members sharing a node are said (MembersSpread False, naming the node);
/// one member per node is True.
#[test]
fn members_sharing_a_node_are_said() {
    let mut obs = three(AT_3_6);
    let s = compute(&view_of("size: 3"), &obs, &Step::Done, None, now());
    let spread = s
        .conditions
        .iter()
        .find(|c| c.type_ == SPREAD)
        .expect("MembersSpread");
    assert_eq!(
        (spread.status.as_str(), spread.reason.as_str()),
        ("True", "OneMemberPerNode")
    );
    for p in &mut obs.pods {
        p.node = Some("node-a".into());
    }
    let s = compute(&view_of("size: 3"), &obs, &Step::Done, None, now());
    let spread = s
        .conditions
        .iter()
        .find(|c| c.type_ == SPREAD)
        .expect("MembersSpread");
    assert_eq!(spread.status, "False");
    assert!(
        spread.message.contains("node-a: demo-0, demo-1, demo-2"),
        "{}",
        spread.message
    );
    assert_eq!(s.placement.len(), 3);
}

#[test]
fn a_certificate_switch_is_progress() {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    let at = Time(Timestamp::from_second(1_000).unwrap_or_else(|e| panic!("{e}")));
    let idle = Condition {
        type_: super::PROGRESSING.into(),
        status: "False".into(),
        reason: "AsExpected".into(),
        message: "nothing to do".into(),
        observed_generation: Some(1),
        last_transition_time: at.clone(),
    };
    let mut status = EtcdClusterStatus {
        conditions: vec![idle.clone()],
        ..Default::default()
    };
    let now = Timestamp::from_second(2_000).unwrap_or_else(|e| panic!("{e}"));
    super::note_certificate_switch(&mut status, "moving (phase hold)", now);
    let c = &status.conditions[0];
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "SwitchingCertificates")
    );
    assert_eq!(c.last_transition_time.0, now);
    // Other work is kept, the switch added to its message.
    let mut busy = idle;
    busy.status = "True".into();
    busy.reason = "ScalingUp".into();
    busy.message = "adding demo-3".into();
    let mut status = EtcdClusterStatus {
        conditions: vec![busy],
        ..Default::default()
    };
    super::note_certificate_switch(&mut status, "moving (phase hold)", now);
    let c = &status.conditions[0];
    assert_eq!(c.reason, "ScalingUp");
    assert_eq!(c.message, "adding demo-3; moving (phase hold)");
}
