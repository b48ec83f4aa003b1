//! The checked-in CRD manifest is the one the types generate, and the users' example parses.

use std::path::Path;

use etcd_shared::EtcdCluster;
use etcd_shared::crd::{CRD_MANIFEST_PATH, REPLACE_DIR, all_crds, crd_yaml, replacement_crds};
use etcd_shared::types::{EtcdBackup, EtcdRestore};

fn repo_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[test]
fn checked_in_crds_match_the_types() {
    let crds = all_crds();
    assert_eq!(crds[0].path, CRD_MANIFEST_PATH);
    assert_eq!(
        crds[0].yaml().expect("renders"),
        crd_yaml().expect("renders")
    );
    for generated in crds.into_iter().chain(replacement_crds()) {
        let path = repo_file(&generated.path);
        let on_disk = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        assert!(
            on_disk == generated.yaml().expect("CRD renders"),
            "{} is stale: run `cargo run -p etcd-shared --bin crdgen -- --write` and commit it",
            generated.path
        );
    }
    // Nothing else in crds/: a CRD removed from the types is removed from the chart.
    let mut on_disk: Vec<String> = std::fs::read_dir(repo_file("charts/etcd-operator/crds"))
        .expect("crds/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut generated: Vec<String> = all_crds()
        .iter()
        .map(|g| g.path.rsplit('/').next().unwrap_or_default().to_string())
        .collect();
    generated.sort();
    assert_eq!(on_disk, generated);
    // crds-replace/ holds the same CRDs, and nothing else.
    let mut replacing: Vec<String> = std::fs::read_dir(repo_file(REPLACE_DIR))
        .expect("crds-replace/")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    replacing.sort();
    assert_eq!(replacing, generated);
}

/// The chart's CRDs leave `preserveUnknownFields` unsaid (a second server-side applier, Helm 4
/// after `kubectl apply --server-side`, would conflict on a false the API server omits); the
/// replacement manifests say false, which turns off the `true` CoreOS' v1beta1-born CRD is
/// stored with. Otherwise they are the same CRDs.
#[test]
fn only_the_replacement_crds_turn_preserve_unknown_fields_off() {
    for (chart, replacing) in all_crds().into_iter().zip(replacement_crds()) {
        assert_eq!(
            chart.crd.spec.preserve_unknown_fields, None,
            "{}",
            chart.path
        );
        assert_eq!(
            replacing.crd.spec.preserve_unknown_fields,
            Some(false),
            "{}",
            replacing.path
        );
        let mut same = replacing.crd.clone();
        same.spec.preserve_unknown_fields = None;
        assert_eq!(same, chart.crd, "{}", replacing.path);
        assert!(
            replacing
                .yaml()
                .expect("renders")
                .contains(etcd_shared::crd::REPLACE_COMMAND),
            "{}: its header says how to apply it",
            replacing.path
        );
    }
}

fn schema_root(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> serde_json::Value {
    let crd = serde_json::to_value(crd).expect("JSON");
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone()
}

/// Every field of CoreOS' EtcdBackup and EtcdRestore (pkg/apis/etcd/v1beta2/backup_types.go
/// and restore_types.go), under its exact JSON name, `Reason` with its capital R.
#[test]
fn every_coreos_backup_and_restore_field_is_in_the_schema() {
    let crds = all_crds();
    let backup = schema_root(&crds[1].crd);
    let restore = schema_root(&crds[2].crd);
    let sources = [
        "s3",
        "s3.path",
        "s3.awsSecret",
        "s3.endpoint",
        "s3.forcePathStyle",
        "abs",
        "abs.path",
        "abs.absSecret",
        "gcs",
        "gcs.path",
        "gcs.gcpSecret",
        "oss",
        "oss.path",
        "oss.ossSecret",
        "oss.endpoint",
    ];
    let backup_fields = [
        "spec.etcdEndpoints",
        "spec.storageType",
        "spec.backupPolicy",
        "spec.backupPolicy.timeoutInSecond",
        "spec.backupPolicy.backupIntervalInSecond",
        "spec.backupPolicy.maxBackups",
        "spec.clientTLSSecret",
        "status.succeeded",
        "status.Reason",
        "status.etcdVersion",
        "status.etcdRevision",
        "status.lastSuccessDate",
    ];
    let restore_fields = [
        "spec.backupStorageType",
        "spec.etcdCluster",
        "spec.etcdCluster.name",
        "status.succeeded",
        "status.reason",
    ];
    let mut missing = Vec::new();
    for (kind, root, fields) in [
        ("EtcdBackup", &backup, &backup_fields[..]),
        ("EtcdRestore", &restore, &restore_fields[..]),
    ] {
        let all = fields
            .iter()
            .map(|f| f.to_string())
            .chain(sources.iter().map(|s| format!("spec.{s}")));
        missing.extend(
            all.filter(|p| schema_at(root, p).is_none())
                .map(|p| format!("{kind} {p}")),
        );
    }
    assert!(missing.is_empty(), "not in the CRD schemas: {missing:?}");
    for root in [&backup, &restore] {
        let types = root["properties"]["spec"]["properties"]
            .as_object()
            .and_then(|p| p.values().find(|v| v.get("enum").is_some()))
            .expect("a storage type enum");
        // CoreOS' four, then this operator's extension.
        assert_eq!(
            types["enum"],
            serde_json::json!(["S3", "ABS", "GCS", "OSS", "PVC"])
        );
        let pvc = &root["properties"]["spec"]["properties"]["pvc"]["properties"];
        assert!(
            pvc["claimName"].is_object() && pvc["path"].is_object(),
            "the pvc source: {pvc}"
        );
    }
}

/// What CoreOS' Go client sends for an EtcdBackup and an EtcdRestore (json.Marshal of its
/// v1beta2 structs: `lastSuccessDate: null`, `forcePathStyle: false`, the restore's
/// `endpoint: ""`), read as ours.
#[test]
fn coreos_go_client_bytes_decode() {
    let backup: EtcdBackup = serde_json::from_str(
        r#"{"kind":"EtcdBackup","apiVersion":"etcd.database.coreos.com/v1beta2","metadata":{"name":"example-etcd-cluster-backup","namespace":"default","creationTimestamp":null},"spec":{"etcdEndpoints":["http://example-etcd-cluster-client:2379"],"storageType":"S3","backupPolicy":{"timeoutInSecond":60,"backupIntervalInSecond":120,"maxBackups":5},"s3":{"path":"etcd-backups/example","awsSecret":"aws","endpoint":"http://s3.storage:8333","forcePathStyle":true}},"status":{"succeeded":false,"lastSuccessDate":null}}"#,
    )
    .expect("backup decodes");
    assert_eq!(backup.spec.storage_type, "S3");
    let s3 = backup.spec.source.s3.as_ref().expect("s3");
    assert_eq!(s3.path, "etcd-backups/example");
    assert!(s3.force_path_style);
    let policy = backup.spec.backup_policy.as_ref().expect("policy");
    assert_eq!(
        (
            policy.timeout_in_second,
            policy.backup_interval_in_second,
            policy.max_backups
        ),
        (60, 120, 5)
    );
    let status = backup.status.expect("status");
    assert!(!status.succeeded);
    assert_eq!(status.last_success_date, None);

    let restore: EtcdRestore = serde_json::from_str(
        r#"{"kind":"EtcdRestore","apiVersion":"etcd.database.coreos.com/v1beta2","metadata":{"name":"example-etcd-cluster","creationTimestamp":null},"spec":{"backupStorageType":"S3","s3":{"path":"etcd-backups/example","awsSecret":"aws","endpoint":"","forcePathStyle":false},"etcdCluster":{"name":"example-etcd-cluster"}},"status":{"succeeded":false}}"#,
    )
    .expect("restore decodes");
    assert_eq!(restore.spec.etcd_cluster.name, "example-etcd-cluster");
    assert_eq!(restore.spec.source.s3.expect("s3").endpoint, "");
    // A status CoreOS' backup operator wrote, with its capital-R Reason.
    let written: EtcdBackup = serde_json::from_str(
        r#"{"apiVersion":"etcd.database.coreos.com/v1beta2","kind":"EtcdBackup","metadata":{"name":"b"},"spec":{"storageType":"S3","s3":{"path":"b/k","awsSecret":"aws"}},"status":{"succeeded":false,"Reason":"failed to save snapshot","etcdVersion":"3.2.13","etcdRevision":42,"lastSuccessDate":"2019-03-01T10:00:00Z"}}"#,
    )
    .expect("a CoreOS status decodes");
    let status = written.status.expect("status");
    assert_eq!(status.reason.as_deref(), Some("failed to save snapshot"));
    assert_eq!(status.etcd_revision, Some(42));
    assert!(status.last_success_date.is_some());
    // Written back, the JSON names are CoreOS'.
    let back = serde_json::to_value(&status).expect("JSON");
    assert_eq!(back["Reason"], "failed to save snapshot");
    assert_eq!(back["etcdVersion"], "3.2.13");
}

#[test]
fn crd_schema_carries_the_static_bounds_and_docs() {
    let crd: serde_json::Value =
        serde_yaml::from_str(&crd_yaml().expect("CRD renders")).expect("YAML");
    let version = &crd["spec"]["versions"][0];
    assert_eq!(version["name"], "v1beta2");
    assert!(
        version["subresources"]["status"].is_object(),
        "status subresource"
    );
    // `kubectl scale` and autoscalers act on spec.size (issue 27, item 4).
    assert_eq!(
        version["subresources"]["scale"],
        serde_json::json!({
            "specReplicasPath": ".spec.size",
            "statusReplicasPath": ".status.size",
            "labelSelectorPath": ".status.selector"
        })
    );
    let size = &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"];
    assert_eq!(size["minimum"], 1.0);
    assert_eq!(size["maximum"], 7.0);
    assert!(
        size["description"]
            .as_str()
            .is_some_and(|d| d.contains("Number of etcd members"))
    );
    let columns: Vec<&str> = version["additionalPrinterColumns"]
        .as_array()
        .expect("printer columns")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(columns, ["Size", "Version", "Ready", "Phase", "Age"]);
    assert_eq!(crd["spec"]["names"]["shortNames"][0], "etcd");
}

#[test]
fn the_users_example_parses_and_is_unchanged() {
    let ours = std::fs::read_to_string(repo_file("examples/example-etcd-cluster.yaml"))
        .expect("repo copy");
    // CI and developers have the team's copy beside the repo: ours must be the same file.
    if let Ok(theirs) =
        std::fs::read_to_string(repo_file("../shared/examples/example-etcd-cluster.yaml"))
    {
        assert_eq!(
            ours, theirs,
            "examples/example-etcd-cluster.yaml differs from ../shared/examples/"
        );
    }
    let c: EtcdCluster = serde_yaml::from_str(&ours).expect("example parses as an EtcdCluster");
    assert_eq!(c.metadata.name.as_deref(), Some("example-etcd-cluster"));
    assert_eq!(c.spec.size, Some(3));
}

/// The schema node at `path` (dot-separated properties, `[]` for array items) under the root.
fn schema_at<'a>(root: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(root, |node, key| match key {
        "[]" => node.get("items"),
        _ => node.get("properties")?.get(key),
    })
}

/// Every field of CoreOS' `etcd.database.coreos.com/v1beta2` EtcdCluster (pkg/apis/etcd/v1beta2
/// cluster.go, cluster_tls.go and status.go), so `kubectl apply --validate=strict` and strict
/// field validation accept whatever its manifests and Go clients send.
#[test]
fn every_coreos_v1beta2_field_is_in_the_schema() {
    let crd: serde_json::Value =
        serde_yaml::from_str(&crd_yaml().expect("CRD renders")).expect("YAML");
    let root = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let spec = [
        "size",
        "repository",
        "version",
        "paused",
        "pod",
        "TLS",
        "pod.labels",
        "pod.nodeSelector",
        "pod.affinity",
        "pod.antiAffinity",
        "pod.resources",
        "pod.tolerations",
        "pod.etcdEnv",
        "pod.persistentVolumeClaimSpec",
        "pod.annotations",
        "pod.busyboxImage",
        "pod.securityContext",
        "pod.DNSTimeoutInSecond",
        "pod.ClusterDomain",
        "TLS.static",
        "TLS.static.member",
        "TLS.static.member.peerSecret",
        "TLS.static.member.serverSecret",
        "TLS.static.operatorSecret",
    ];
    let status = [
        "phase",
        "reason",
        "controlPaused",
        "conditions",
        "conditions.[].type",
        "conditions.[].status",
        "conditions.[].lastUpdateTime",
        "conditions.[].lastTransitionTime",
        "conditions.[].reason",
        "conditions.[].message",
        "size",
        "serviceName",
        "clientPort",
        "members",
        "members.ready",
        "members.unready",
        "currentVersion",
        "targetVersion",
    ];
    let missing: Vec<String> = spec
        .iter()
        .map(|p| format!("spec.{p}"))
        .chain(status.iter().map(|p| format!("status.{p}")))
        .filter(|p| schema_at(root, p).is_none())
        .collect();
    assert!(missing.is_empty(), "not in the CRD schema: {missing:?}");

    let timeout = schema_at(root, "spec.pod.DNSTimeoutInSecond").expect("present");
    assert_eq!(timeout["format"], "int64");
    assert!(
        timeout["description"]
            .as_str()
            .is_some_and(|d| d.contains("accepted and ignored")),
        "kubectl explain says it is ignored: {timeout}"
    );
    // CoreOS' phases, "" included, and its conditions, which lack observedGeneration and may
    // lack lastTransitionTime and message.
    let phases = &schema_at(root, "status.phase").expect("present")["enum"];
    for phase in ["", "Creating", "Running", "Failed"] {
        assert!(
            phases.as_array().is_some_and(|a| a.contains(&phase.into())),
            "{phase:?} not in {phases}"
        );
    }
    let condition = schema_at(root, "status.conditions.[]").expect("present");
    assert_eq!(condition["required"], serde_json::json!(["status", "type"]));
    // Issue 24: kubectl explain etcdcluster.spec.recovery documents the extension.
    let recovery = schema_at(root, "spec.recovery").expect("spec.recovery in the schema");
    assert!(
        recovery["description"]
            .as_str()
            .is_some_and(|d| d.contains("lost quorum for good")),
        "{recovery}"
    );
    let policy = schema_at(root, "spec.recovery.policy").expect("present");
    assert_eq!(policy["enum"], serde_json::json!(["Manual", "Automatic"]));
    assert!(
        policy["description"]
            .as_str()
            .is_some_and(|d| d.contains("etcd.database.coreos.com/recover=now")),
        "{policy}"
    );
    for field in [
        "status.recovery",
        "status.lastRecovery",
        "status.maintenance",
    ] {
        assert!(
            schema_at(root, field).is_some(),
            "{field} not in the schema"
        );
    }
    // Size 0 is refused with a message that says why a Go client sent it.
    let size = schema_at(root, "spec.size").expect("present");
    assert!(
        size["x-kubernetes-validations"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("CoreOS' Go client sends 0")),
        "{size}"
    );
}
