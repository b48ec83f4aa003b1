//! The rollout of members made with TLS files they must no longer use ([`super::rollout`]):
//! a CA rotation's replacements, surge first, the leader last, quorum never below the size.

use super::*;
use crate::planner::fixtures::{add_member as add, healthy_member, ready_pod, remove_member};
use crate::view::fixtures::view_of;
use crate::view::transport::MemberTransport;

const V: &str = "3.6.16";

fn stamp(trust: &str, leaves: &str) -> TlsStamp {
    TlsStamp {
        trust: Some(trust.into()),
        leaves: Some(leaves.into()),
    }
}

fn files(trust: &str, leaves: &str, rotating: bool) -> Option<TlsFiles> {
    Some(TlsFiles {
        current: stamp(trust, leaves),
        rotating,
    })
}

/// Members `demo-i` for each `(i, trust)`, all healthy on `version`, the first the leader.
fn cluster(version: &str, members: &[(u32, &str)], current: Option<TlsFiles>) -> Observed {
    let v: EtcdVersion = version.parse().unwrap_or_else(|e| panic!("{e}"));
    Observed {
        pods: members
            .iter()
            .map(|(i, trust)| {
                let mut p = ready_pod(*i, version);
                p.tls = stamp(trust, "leaves-1");
                p
            })
            .collect(),
        members: Ok(members
            .iter()
            .enumerate()
            .map(|(n, (i, _))| {
                healthy_member(&format!("demo-{i}"), 100 + u64::from(*i), Some(v), n == 0)
            })
            .collect()),
        bootstrapped: true,
        tls: current,
        ..Observed::default()
    }
}

fn plan_for(obs: &Observed) -> Step {
    let version = obs
        .pods
        .first()
        .and_then(|p| p.version)
        .map_or_else(|| V.to_string(), |v| v.to_string());
    plan(
        &view_of(&format!("size: 3\nversion: {version}")),
        obs,
        &PlannerSettings::default(),
    )
}

#[test]
fn a_rotation_replaces_every_member_surge_first_the_leader_last() {
    let now = files("both", "leaves-1", true);
    // Every member trusts the old bundle: one more member, made with the new one.
    let obs = cluster(V, &[(0, "old"), (1, "old"), (2, "old")], now.clone());
    assert_eq!(plan_for(&obs), add(3, true));
    // It joined as a learner and caught up: promoted, as any scale-up's.
    let mut obs = cluster(
        V,
        &[(0, "old"), (1, "old"), (2, "old"), (3, "both")],
        now.clone(),
    );
    if let Ok(m) = obs.members.as_mut() {
        m[3].learner = true;
    }
    assert!(matches!(
        plan_for(&obs),
        Step::PromoteLearner { id: 103, .. }
    ));
    // Four voters: a follower made with the old files goes (it leaves the Service first).
    let mut obs = cluster(
        V,
        &[(0, "old"), (1, "old"), (2, "old"), (3, "both")],
        now.clone(),
    );
    assert_eq!(plan_for(&obs), remove_member(1, RemovalReason::Rollout));
    // Through the budget: none while it allows none.
    obs.disruptions_allowed = Some(0);
    assert_eq!(
        plan_for(&obs),
        Step::Wait(Waiting::DisruptionBudget("demo-1".into()))
    );
    // The leader is the last one: leadership goes to a member made with the current files.
    let obs = cluster(
        V,
        &[(0, "old"), (3, "both"), (4, "both"), (5, "both")],
        now.clone(),
    );
    assert_eq!(
        plan_for(&obs),
        Step::TransferLeadership {
            from: "demo-0".into(),
            to: "demo-3".into(),
            to_id: 103,
            before: Handover::Rollout,
        }
    );
    // Done: nothing more to replace.
    let obs = cluster(V, &[(3, "both"), (4, "both"), (5, "both")], now);
    assert_eq!(plan_for(&obs), Step::Done);
}

#[test]
fn nothing_is_replaced_while_a_member_is_unready_or_unhealthy() {
    let now = files("both", "leaves-1", true);
    let mut obs = cluster(V, &[(0, "old"), (1, "old"), (2, "both")], now.clone());
    obs.pods[2].ready = false;
    assert_ne!(plan_for(&obs), add(3, true));
    let mut obs = cluster(V, &[(0, "old"), (1, "old"), (2, "both")], now);
    if let Ok(m) = obs.members.as_mut() {
        m[1].health = Health::Unhealthy("connection refused".into());
    }
    assert!(
        matches!(plan_for(&obs), Step::Wait(_)),
        "{:?}",
        plan_for(&obs)
    );
}

#[test]
fn a_replacement_voter_still_starting_is_waited_for_not_scaled_away() {
    // 3.2 has no learners: the replacement joins as a voter and is unhealthy while it starts.
    let now = files("both", "leaves-1", true);
    let mut obs = cluster(
        "3.2.13",
        &[(0, "old"), (1, "old"), (2, "old"), (3, "both")],
        now,
    );
    if let Ok(m) = obs.members.as_mut() {
        m[3].health = Health::Unhealthy("not started".into());
        m[3].started = false;
    }
    obs.pods[3].age = std::time::Duration::from_secs(5);
    obs.pods[3].running_for = Some(std::time::Duration::from_secs(5));
    obs.pods[3].ready = false;
    assert_eq!(
        plan_for(&obs),
        Step::Wait(Waiting::MemberStarting("demo-3".into()))
    );
}

#[test]
fn renewed_certificates_replace_members_only_on_lines_that_do_not_reload_them() {
    // The trust is current; the leaves were renewed since the pods were made.
    let now = files("one", "leaves-2", false);
    let obs = cluster("3.6.16", &[(0, "one"), (1, "one"), (2, "one")], now.clone());
    assert_eq!(
        plan_for(&obs),
        Step::Done,
        "3.6 reloads its certificate files"
    );
    let obs = cluster("3.2.13", &[(0, "one"), (1, "one"), (2, "one")], now);
    assert_eq!(
        plan_for(&obs),
        add(3, false),
        "3.2 serves what it started with"
    );
}

#[test]
fn pods_that_recorded_nothing_count_as_current_except_during_a_rotation() {
    let mut obs = cluster(
        V,
        &[(0, "x"), (1, "x"), (2, "x")],
        files("one", "leaves-1", false),
    );
    for p in &mut obs.pods {
        p.tls = TlsStamp::default();
    }
    assert_eq!(plan_for(&obs), Step::Done);
    obs.tls = files("both", "leaves-1", true);
    assert_eq!(plan_for(&obs), add(3, true));
    // Without operator-managed TLS nothing is compared.
    obs.tls = None;
    assert_eq!(plan_for(&obs), Step::Done);
}

/// Members `demo-i` for each `(i, transport)`, all healthy, the first the leader.
fn speaking(members: &[(u32, MemberTransport)]) -> Observed {
    let mut obs = cluster(
        V,
        &members.iter().map(|(i, _)| (*i, "ca")).collect::<Vec<_>>(),
        None,
    );
    for (pod, (_, transport)) in obs.pods.iter_mut().zip(members) {
        pod.transport = Some(*transport);
    }
    obs
}

#[test]
fn a_switch_to_tls_adds_bridges_then_tls_members_the_least_current_first_the_leader_last() {
    let view = view_of("size: 3\nversion: 3.6.16\nTLS:\n  operatorManaged: {}");
    let p = MemberTransport::target(&view_of("size: 3\nversion: 3.6.16"));
    let b = MemberTransport::bridge(&view);
    let t = MemberTransport::target(&view);
    let settings = PlannerSettings::default();
    let step = |members: &[(u32, MemberTransport)]| {
        let mut obs = speaking(members);
        obs.tls = files("ca", "leaves-1", false);
        plan(&view, &obs, &settings)
    };
    // The certificates are not made yet (cert-manager has not written its Secrets): nothing.
    assert_eq!(
        plan(&view, &speaking(&[(0, p), (1, p), (2, p)]), &settings),
        Step::Done
    );
    // Plain members cannot dial a TLS peer: the first new member is a bridge (plain peer URL).
    assert_eq!(step(&[(0, p), (1, p), (2, p)]), add(3, true));
    // A plain follower goes first, before the bridge, which is not current either.
    assert_eq!(
        step(&[(0, p), (1, p), (2, p), (3, b)]),
        remove_member(1, RemovalReason::Rollout)
    );
    // The last plain member leads: it hands over to a bridge before it goes.
    assert_eq!(
        step(&[(0, p), (3, b), (4, b), (5, b)]),
        Step::TransferLeadership {
            from: "demo-0".into(),
            to: "demo-3".into(),
            to_id: 103,
            before: Handover::Rollout,
        }
    );
    // Every member can dial a TLS peer: the next one listens with TLS.
    assert_eq!(
        step(&[(3, b), (4, b), (5, b)]),
        Step::AddMember {
            name: "demo-6".into(),
            peer_url: "https://demo-6.demo.ns1.svc:2380".into(),
            learner: true,
        }
    );
    // Bridges go, followers first; the leading bridge hands over to a TLS member.
    assert_eq!(
        step(&[(3, b), (4, b), (5, b), (6, t)]),
        remove_member(4, RemovalReason::Rollout)
    );
    assert_eq!(
        step(&[(3, b), (6, t), (7, t), (8, t)]),
        Step::TransferLeadership {
            from: "demo-3".into(),
            to: "demo-6".into(),
            to_id: 106,
            before: Handover::Rollout,
        }
    );
    assert_eq!(step(&[(6, t), (7, t), (8, t)]), Step::Done);
    // A scale-up during the switch adds a bridge too.
    assert_eq!(
        plan(
            &view_of("size: 4\nversion: 3.6.16\nTLS:\n  operatorManaged: {}"),
            &Observed {
                tls: files("ca", "leaves-1", false),
                ..speaking(&[(0, p), (3, b), (4, b)])
            },
            &settings
        ),
        add(5, true)
    );
}

#[test]
fn members_mounting_other_certificate_secrets_are_replaced_during_a_switch() {
    // A switch of the certificates' source: the view names the switch Secret, two members
    // still mount the old source's; the fingerprints are equal (the hold phase copies them).
    let mut view = view_of(&format!(
        "size: 3\nversion: {V}\nTLS:\n  operatorManaged: {{}}"
    ));
    view.tls.peer_secret = Some("demo-tls-switch".into());
    view.tls.server_secret = Some("demo-tls-switch".into());
    let mut obs = cluster(
        V,
        &[(0, "t"), (1, "t"), (2, "t")],
        files("t", "leaves-1", true),
    );
    for (i, p) in obs.pods.iter_mut().enumerate() {
        p.tls_secrets = if i == 0 {
            vec!["demo-tls-switch".into(); 2]
        } else {
            vec!["demo-peer-tls".into(), "demo-server-tls".into()]
        };
    }
    let members = obs.members.clone().unwrap_or_default();
    assert_eq!(
        rollout::outdated_members(&view, &obs, &members),
        ["demo-1", "demo-2"]
    );
    // Once every member mounts the Secrets the view names, none is.
    for p in &mut obs.pods {
        p.tls_secrets = vec!["demo-tls-switch".into(); 2];
    }
    assert!(rollout::outdated_members(&view, &obs, &members).is_empty());
    // cert-manager's steady files track no trust: a pod made with a switch's stamp is current.
    let cm = files("t", "leaves-1", false).map(|mut f| {
        f.current.trust = None;
        f
    });
    obs.tls = cm;
    assert!(rollout::outdated_members(&view, &obs, &members).is_empty());
}
