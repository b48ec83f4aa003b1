//! Every status CoreOS' operator wrote reads, and this operator's own status round-trips.

use serde_json::{Value, json};

use super::*;
use crate::EtcdCluster;

fn read(status: Value) -> EtcdClusterStatus {
    serde_json::from_value(status.clone())
        .unwrap_or_else(|e| panic!("status does not read ({e}): {status}"))
}

fn time(s: &str) -> Time {
    Time(s.parse().expect("RFC 3339"))
}

#[test]
fn the_status_coreos_go_client_sends_on_create_reads_as_empty() {
    // ClusterStatus{} as Go's encoding/json writes it: phase, size, members, currentVersion and
    // targetVersion have no omitempty.
    let s = read(
        json!({"phase": "", "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
    );
    assert_eq!(s.phase, None, "\"\" is CoreOS' ClusterPhaseNone");
    assert_eq!(s.size, Some(0));
    assert_eq!(s.members, Some(MembersStatus::default()));
    assert_eq!(s.current_version, None);
    assert_eq!(s.target_version, None);
    assert_eq!(s.reason, None);
    assert!(!s.control_paused);
    assert!(s.conditions.is_empty());
}

#[test]
fn a_failed_coreos_status_with_its_conditions_reads() {
    let s = read(json!({
        "phase": "Failed",
        "reason": "Fail to create seed member: pods \"x-0000\" is forbidden",
        "controlPaused": true,
        "conditions": [
            // SetReadyCondition: message "" is left out by omitempty.
            {"type": "Available", "status": "True", "lastUpdateTime": "2018-03-01T10:00:00Z",
             "lastTransitionTime": "2018-03-01T09:00:00Z", "reason": "Cluster available"},
            // lastTransitionTime is omitempty too: only the update time is known.
            {"type": "Scaling", "status": "True", "lastUpdateTime": "2018-03-02T10:00:00Z",
             "reason": "Scaling up", "message": "Current cluster size: 1, desired cluster size: 3"},
            // Nothing but the required fields.
            {"type": "Recovering", "status": "False"}
        ],
        "size": 1,
        "serviceName": "x-client",
        "clientPort": 2379,
        "members": {"ready": ["x-0000"], "unready": ["x-0001"]},
        "currentVersion": "3.2.13",
        "targetVersion": ""
    }));
    assert_eq!(s.phase, Some(ClusterPhase::Failed));
    assert!(
        s.reason
            .as_deref()
            .is_some_and(|r| r.starts_with("Fail to create seed member"))
    );
    assert!(s.control_paused);
    assert_eq!(s.size, Some(1));
    assert_eq!(s.service_name.as_deref(), Some("x-client"));
    assert_eq!(s.client_port, Some(2379));
    let members = s.members.clone().unwrap_or_default();
    assert_eq!(members.ready, ["x-0000"]);
    assert_eq!(members.unready, ["x-0001"]);
    assert!(members.learners.is_empty());
    assert_eq!(s.current_version.as_deref(), Some("3.2.13"));
    assert_eq!(s.target_version, None);

    let types: Vec<&str> = s.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["Available", "Scaling", "Recovering"]);
    let [available, scaling, recovering] = &s.conditions[..] else {
        panic!("{:?}", s.conditions)
    };
    assert_eq!(available.status, "True");
    assert_eq!(available.reason, "Cluster available");
    assert_eq!(available.message, "");
    assert_eq!(available.observed_generation, None);
    assert_eq!(available.last_transition_time, time("2018-03-01T09:00:00Z"));
    assert_eq!(
        scaling.last_transition_time,
        time("2018-03-02T10:00:00Z"),
        "the update time stands in"
    );
    assert_eq!(
        scaling.message,
        "Current cluster size: 1, desired cluster size: 3"
    );
    assert!(is_unknown_time(&recovering.last_transition_time));
    assert!(!is_unknown_time(&available.last_transition_time));
}

#[test]
fn an_older_coreos_status_without_omitempty_reads() {
    // Before CoreOS added omitempty to reason, controlPaused and conditions (and while backups
    // lived in the cluster spec).
    let s = read(json!({
        "phase": "Running", "reason": "", "controlPaused": false, "conditions": null,
        "size": 3, "members": {"ready": ["a-0000", "a-0001", "a-0002"]},
        "currentVersion": "3.1.8", "targetVersion": "",
        "backupServiceStatus": {"recentBackup": null, "backupSize": 0}
    }));
    assert_eq!(s.phase, Some(ClusterPhase::Running));
    assert_eq!(s.reason, None);
    assert!(!s.control_paused);
    assert!(s.conditions.is_empty());
    assert_eq!(s.members.map(|m| m.ready.len()), Some(3));
}

#[test]
fn values_of_the_wrong_shape_read_as_absent() {
    let s = read(json!({
        "phase": "Exploded", "reason": 7, "controlPaused": "yes",
        "conditions": [{"reason": "no type"}, "Available", {"type": "Available", "status": "True", "lastTransitionTime": "yesterday"}],
        "currentVersion": 3.5, "members": {"ready": null, "unready": ["b", 1]}
    }));
    assert_eq!(s.phase, None);
    assert_eq!(s.reason, None);
    assert!(!s.control_paused);
    assert_eq!(s.conditions.len(), 1, "{:?}", s.conditions);
    assert!(is_unknown_time(&s.conditions[0].last_transition_time));
    assert_eq!(s.current_version, None);
    let members = s.members.unwrap_or_default();
    assert!(members.ready.is_empty());
    assert_eq!(members.unready, ["b"]);
    // Not an array at all.
    assert!(
        read(json!({"conditions": {"type": "Available"}}))
            .conditions
            .is_empty()
    );
}

#[test]
fn this_operators_status_round_trips_and_writes_only_what_is_set() {
    let ours = EtcdClusterStatus {
        phase: Some(ClusterPhase::QuorumLost),
        reason: Some("QuorumLost".into()),
        control_paused: true,
        conditions: vec![Condition {
            type_: "Available".into(),
            status: "False".into(),
            reason: "QuorumLost".into(),
            message: "only 1 of 3 voting members are healthy".into(),
            observed_generation: Some(4),
            last_transition_time: time("2026-01-01T00:00:00Z"),
        }],
        observed_generation: Some(4),
        size: Some(3),
        ready_members: Some(1),
        current_version: Some("3.6.16".into()),
        target_version: None,
        members: Some(MembersStatus {
            ready: vec!["demo-0".into()],
            unready: vec!["demo-1".into(), "demo-2".into()],
            learners: vec![],
        }),
        service_name: Some("demo-client".into()),
        client_port: Some(2379),
        next_step: None,
        restored_from: Some(RestoredFrom {
            restore: "demo-restore".into(),
            path: "backups/demo/snapshot.db".into(),
            revision: Some(10041),
            sha256: "ab".repeat(32),
            etcd_version: Some("3.6.16".into()),
        }),
        last_safety_backup: None,
        maintenance: Some(super::MaintenanceStatus {
            compaction: Some(super::CompactionRecord {
                revision: 500,
                time: time("2026-01-01T00:00:00Z"),
            }),
            defragmentations: vec![super::DefragmentationRecord {
                member: "demo-1".into(),
                time: time("2026-01-01T00:01:00Z"),
            }],
        }),
        recovery: None,
        last_recovery: Some(super::RecoveryRecord {
            started: Some(time("2026-01-01T00:00:00Z")),
            finished: Some(time("2026-01-01T00:01:00Z")),
            source: "member demo-0".into(),
            revision: Some(10041),
            sha256: "ab".repeat(32),
            members_lost: 2,
        }),
        selector: Some("app=etcd,etcd_cluster=demo".into()),
        placement: vec![super::MemberPlacement {
            member: "demo-1".into(),
            node: "node-b".into(),
        }],
        another_operator_pods: vec![],
        coreos_members: vec!["demo-4bq7xk2m9z".into()],
        tls: Some(crate::types::TlsInUse {
            source: "certManager".into(),
            issuer: Some("Issuer.cert-manager.io/ca".into()),
            peer_secret: Some("demo-peer-tls".into()),
            ..Default::default()
        }),
    };
    let written = serde_json::to_value(&ours).expect("serializes");
    assert_eq!(written["tls"]["issuer"], "Issuer.cert-manager.io/ca");
    assert_eq!(written["tls"]["peerSecret"], "demo-peer-tls");
    assert_eq!(written["placement"][0]["node"], "node-b");
    assert_eq!(written["lastRecovery"]["source"], "member demo-0");
    assert_eq!(written["coreosMembers"][0], "demo-4bq7xk2m9z");
    assert_eq!(written["lastRecovery"]["membersLost"], 2);
    assert_eq!(written["maintenance"]["compaction"]["revision"], 500);
    assert_eq!(
        written["maintenance"]["defragmentations"][0]["member"],
        "demo-1"
    );
    assert_eq!(written["restoredFrom"]["revision"], 10041);
    assert_eq!(written["controlPaused"], true);
    assert_eq!(written["reason"], "QuorumLost");
    assert!(written.get("targetVersion").is_none());
    assert_eq!(read(written), ours);

    let quiet = serde_json::to_value(EtcdClusterStatus::default()).expect("serializes");
    assert_eq!(quiet, json!({}), "nothing unset is written");
}

#[test]
fn yaml_reads_the_same_way() {
    let s: EtcdClusterStatus =
        serde_yaml::from_str("phase: \"\"\nsize: 0\nmembers: {}\ncurrentVersion: \"\"\n")
            .expect("YAML status reads");
    assert_eq!(s.phase, None);
    assert_eq!(s.current_version, None);
}

#[test]
fn a_whole_object_as_coreos_go_client_wrote_it_reads() {
    let object = r#"{"kind":"EtcdCluster","apiVersion":"etcd.database.coreos.com/v1beta2","metadata":{"name":"x","namespace":"default","creationTimestamp":null},"spec":{"size":3,"version":"3.2.13","pod":{"resources":{},"ClusterDomain":""}},"status":{"phase":"Failed","reason":"boom","conditions":[{"type":"Available","status":"False","lastUpdateTime":"2018-03-01T10:00:00Z","reason":"Cluster unavailable"}],"size":0,"members":{},"currentVersion":"","targetVersion":""}}"#;
    let c: EtcdCluster = serde_json::from_str(object).expect("reads");
    let s = c.status.expect("status");
    assert_eq!(s.phase, Some(ClusterPhase::Failed));
    assert_eq!(s.conditions.len(), 1);
    assert_eq!(
        c.spec.pod.and_then(|p| p.cluster_domain).as_deref(),
        Some("")
    );
}

#[test]
fn phase_names() {
    for p in ClusterPhase::READABLE {
        assert_eq!(ClusterPhase::from_name(p.as_str()), Some(p));
        assert_eq!(serde_json::to_value(p).expect("serializes"), p.as_str());
    }
    assert_eq!(ClusterPhase::from_name(""), None);
    assert!(
        !ClusterPhase::ALL.contains(&ClusterPhase::Failed),
        "never written"
    );
    let failing: Vec<_> = ClusterPhase::READABLE
        .into_iter()
        .filter(|p| p.is_failure())
        .collect();
    assert_eq!(
        failing,
        [
            ClusterPhase::Degraded,
            ClusterPhase::QuorumLost,
            ClusterPhase::Failed
        ]
    );
}
