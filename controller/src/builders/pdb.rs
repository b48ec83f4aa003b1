//! The PodDisruptionBudget that keeps a voluntary disruption (a node drain) from taking
//! the cluster below quorum.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use etcd_shared::names;

use crate::view::ClusterView;

/// A budget with `minAvailable` = a majority of the desired size. For one member this
/// blocks voluntary evictions altogether: a single member cannot be moved without an outage.
pub fn disruption_budget(view: &ClusterView) -> PodDisruptionBudget {
    let mut selector = names::selector_labels(&view.name);
    selector.insert(names::LABEL_COMPONENT.into(), "member".into());
    let labels = names::object_labels(&view.name, "disruption-budget");
    let quorum = i32::try_from(ClusterView::quorum(view.size)).unwrap_or(i32::MAX);
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(names::pdb_name(&view.name)),
            namespace: Some(view.namespace.clone()),
            labels: Some(labels),
            owner_references: Some(vec![view.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(quorum)),
            selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    #[test]
    fn budget_keeps_a_majority() {
        for (size, min) in [(1, 1), (3, 2), (4, 3), (5, 3), (7, 4)] {
            let pdb = disruption_budget(&view_of(&format!("size: {size}")));
            assert_eq!(
                pdb.spec.unwrap().min_available,
                Some(IntOrString::Int(min)),
                "size {size}"
            );
        }
    }
}
