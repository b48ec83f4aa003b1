//! The checked-in CRD manifest is the one the types generate, and the users' example parses.

use std::path::Path;

use etcd_shared::EtcdCluster;
use etcd_shared::crd::{CRD_MANIFEST_PATH, crd_yaml};

fn repo_file(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[test]
fn checked_in_crd_matches_the_types() {
    let path = repo_file(CRD_MANIFEST_PATH);
    let on_disk = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let generated = crd_yaml().expect("CRD renders");
    assert!(
        on_disk == generated,
        "{CRD_MANIFEST_PATH} is stale: run `cargo run -p etcd-shared --bin crdgen -- --write` and commit it"
    );
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
    // Size 0 is refused with a message that says why a Go client sent it.
    let size = schema_at(root, "spec.size").expect("present");
    assert!(
        size["x-kubernetes-validations"][0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("CoreOS' Go client sends 0")),
        "{size}"
    );
}
