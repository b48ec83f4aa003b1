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
