//! Test fixtures: clusters written as YAML specs, as a user would.

use etcd_shared::EtcdCluster;
use etcd_shared::admission::AdmissionPolicy;

use super::ClusterView;

/// A persisted-looking cluster `demo` in namespace `ns1` with the given spec.
pub(crate) fn cluster_of(spec: &str) -> EtcdCluster {
    let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    let yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: demo\n  namespace: ns1\n  uid: uid-1\n  generation: 1\nspec:\n{indented}"
    );
    serde_yaml::from_str(&yaml).unwrap_or_else(|e| panic!("fixture: {e}\n{yaml}"))
}

/// The validated view of [`cluster_of`].
pub(crate) fn view_of(spec: &str) -> ClusterView {
    ClusterView::new(&cluster_of(spec), &AdmissionPolicy::default())
        .unwrap_or_else(|e| panic!("fixture invalid: {e}"))
}
