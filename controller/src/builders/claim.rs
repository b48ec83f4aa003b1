//! The data claim of one member, when the spec asks for persistent storage.

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use etcd_shared::names;

use crate::view::ClusterView;

/// Name of a member's claim, when the cluster uses claims.
pub(crate) fn claim_name_if_durable(view: &ClusterView, member: &str) -> Option<String> {
    view.pod
        .persistent_volume_claim_spec
        .as_ref()
        .map(|_| names::data_claim_name(member))
}

/// The claim of a member whose data is first written by `version`, or `None` when the cluster
/// keeps its data in emptyDirs. The claim records that version (annotation
/// [`names::ANNOTATION_CREATED_ON`]): a pod recreated on it later runs a newer version, but the
/// data (and the raft log) began under this one.
pub fn data_claim(
    view: &ClusterView,
    member: &str,
    version: &etcd_shared::version::EtcdVersion,
) -> Option<PersistentVolumeClaim> {
    let mut spec = view.pod.persistent_volume_claim_spec.clone()?;
    if spec.access_modes.as_ref().is_none_or(Vec::is_empty) {
        spec.access_modes = Some(vec!["ReadWriteOnce".into()]);
    }
    let mut labels = names::selector_labels(&view.name);
    labels.insert(names::LABEL_COMPONENT.into(), "data".into());
    labels.insert(names::LABEL_MEMBER.into(), member.into());
    Some(PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(names::data_claim_name(member)),
            namespace: Some(view.namespace.clone()),
            labels: Some(labels),
            annotations: Some(
                [(
                    names::ANNOTATION_CREATED_ON.to_string(),
                    version.to_string(),
                )]
                .into(),
            ),
            owner_references: Some(vec![view.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(spec),
        status: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    #[test]
    fn claims_only_for_durable_clusters() {
        let v = "3.4.45".parse().expect("version");
        assert!(data_claim(&view_of("size: 3"), "demo-0", &v).is_none());
        let view = view_of(
            "pod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi",
        );
        let claim = data_claim(&view, "demo-0", &v).expect("a claim");
        assert_eq!(
            claim
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_CREATED_ON))
                .map(String::as_str),
            Some("3.4.45")
        );
        assert_eq!(claim.metadata.name.as_deref(), Some("demo-0-data"));
        let spec = claim.spec.unwrap();
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
        assert_eq!(claim.metadata.owner_references.unwrap()[0].name, "demo");
    }
}
