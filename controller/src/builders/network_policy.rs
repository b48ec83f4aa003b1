//! The NetworkPolicy of a cluster's members (`spec.network`): the peer port admits only the
//! cluster's own members, the client port the pods `clientSelectors` names (any pod when
//! unset), the operator's namespace and its PVC backup pods, the metrics port the monitoring namespace (anywhere when none is
//! configured). Traffic from the members' own nodes (kubelet probes) is always admitted by
//! NetworkPolicy's semantics.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

use etcd_shared::names::{self, CLIENT_PORT, METRICS_PORT, PEER_PORT};
use etcd_shared::types::network_policy;

use crate::view::ClusterView;

/// Where the operator itself and the monitoring run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NetworkAccess {
    /// The operator's namespace (its pods dial the client port). Unknown (the controller runs
    /// outside a pod): the client port is not restricted, so the operator is never cut off.
    pub operator_namespace: Option<String>,
    /// The namespace Prometheus scrapes from; `None`: the metrics port admits any source.
    pub monitoring_namespace: Option<String>,
}

/// Whether the cluster keeps its NetworkPolicy (`spec.network.policy` other than `None`).
pub fn wants_network_policy(view: &ClusterView) -> bool {
    view.network.policy.as_deref() != Some(network_policy::NONE)
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..NetworkPolicyPort::default()
    }
}

fn namespace_peer(namespace: &str) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_string(),
                namespace.to_string(),
            )])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// The members' NetworkPolicy, or `None` when `spec.network.policy` is `None`.
pub fn network_policy(view: &ClusterView, access: &NetworkAccess) -> Option<NetworkPolicy> {
    if !wants_network_policy(view) {
        return None;
    }
    // Every member pod, this operator's and CoreOS' (adopted members), carries CoreOS' selector.
    let members = LabelSelector {
        match_labels: Some(names::coreos_selector(&view.name)),
        ..LabelSelector::default()
    };
    let metrics_on_client_port = !view.capabilities.metrics_urls;
    let client_from = match (
        &access.operator_namespace,
        view.network.client_selectors.is_empty(),
    ) {
        (_, true) | (None, false) => None,
        (Some(operator), false) => {
            let mut peers = view.network.client_selectors.clone();
            peers.push(namespace_peer(operator));
            // The operator's own backup pods (PVC backups) run in the cluster's namespace and
            // stream the snapshot from the client port.
            peers.push(NetworkPolicyPeer {
                pod_selector: Some(LabelSelector {
                    match_labels: Some(BTreeMap::from([
                        (
                            names::LABEL_MANAGED_BY.to_string(),
                            names::MANAGED_BY.to_string(),
                        ),
                        (names::LABEL_COMPONENT.to_string(), "backup".to_string()),
                    ])),
                    ..LabelSelector::default()
                }),
                ..NetworkPolicyPeer::default()
            });
            if metrics_on_client_port && let Some(monitoring) = &access.monitoring_namespace {
                peers.push(namespace_peer(monitoring));
            }
            Some(peers)
        }
    };
    let mut ingress = vec![
        NetworkPolicyIngressRule {
            from: Some(vec![NetworkPolicyPeer {
                pod_selector: Some(members.clone()),
                ..NetworkPolicyPeer::default()
            }]),
            ports: Some(vec![tcp(PEER_PORT)]),
        },
        NetworkPolicyIngressRule {
            from: client_from,
            ports: Some(vec![tcp(CLIENT_PORT)]),
        },
    ];
    if view.capabilities.metrics_urls {
        ingress.push(NetworkPolicyIngressRule {
            from: access
                .monitoring_namespace
                .as_deref()
                .map(|ns| vec![namespace_peer(ns)]),
            ports: Some(vec![tcp(METRICS_PORT)]),
        });
    }
    Some(NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(names::network_policy_name(&view.name)),
            namespace: Some(view.namespace.clone()),
            labels: Some(names::object_labels(&view.name, "network-policy")),
            owner_references: Some(vec![view.owner.clone()]),
            ..ObjectMeta::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(members),
            policy_types: Some(vec!["Ingress".into()]),
            ingress: Some(ingress),
            egress: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    fn ports(rule: &NetworkPolicyIngressRule) -> Vec<IntOrString> {
        rule.ports
            .iter()
            .flatten()
            .filter_map(|p| p.port.clone())
            .collect()
    }

    fn rules(policy: &NetworkPolicy) -> &[NetworkPolicyIngressRule] {
        policy
            .spec
            .as_ref()
            .and_then(|s| s.ingress.as_deref())
            .unwrap_or_default()
    }

    #[test]
    fn by_default_peers_are_members_only_and_clients_anyone() {
        let view = view_of("size: 3\nversion: 3.6.16");
        let policy = network_policy(&view, &NetworkAccess::default()).expect("a policy");
        let rules = rules(&policy);
        assert_eq!(ports(&rules[0]), [IntOrString::Int(2380)]);
        let peer = &rules[0].from.as_ref().expect("peer sources")[0];
        assert_eq!(
            peer.pod_selector
                .as_ref()
                .and_then(|s| s.match_labels.clone()),
            Some(names::coreos_selector("demo"))
        );
        assert!(
            peer.namespace_selector.is_none(),
            "peers of this namespace only"
        );
        assert_eq!(ports(&rules[1]), [IntOrString::Int(2379)]);
        assert!(rules[1].from.is_none(), "clients: anyone");
        assert_eq!(ports(&rules[2]), [IntOrString::Int(2381)]);
        assert!(
            rules[2].from.is_none(),
            "metrics: anyone without a monitoring namespace"
        );
    }

    #[test]
    fn client_selectors_admit_the_operator_and_monitoring_where_metrics_share_the_port() {
        let view = view_of(
            "size: 3\nversion: 3.2.13\nnetwork:\n  clientSelectors:\n  - podSelector:\n      matchLabels:\n        app: api",
        );
        let access = NetworkAccess {
            operator_namespace: Some("etcd-operator".into()),
            monitoring_namespace: Some("monitoring".into()),
        };
        let policy = network_policy(&view, &access).expect("a policy");
        let rules = rules(&policy);
        assert_eq!(rules.len(), 2, "3.2 serves metrics on the client port");
        let from = rules[1].from.as_ref().expect("client sources");
        assert_eq!(from.len(), 4);
        assert_eq!(from[1], namespace_peer("etcd-operator"));
        let backup = from[2]
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .expect("the backup pods' selector");
        assert_eq!(
            backup.get(names::LABEL_COMPONENT).map(String::as_str),
            Some("backup"),
            "the operator's PVC backup pods reach the client port"
        );
        assert_eq!(from[3], namespace_peer("monitoring"));
    }

    #[test]
    fn an_unknown_operator_namespace_leaves_the_client_port_open() {
        let view = view_of(
            "size: 3\nnetwork:\n  clientSelectors:\n  - podSelector:\n      matchLabels:\n        app: api",
        );
        let policy = network_policy(&view, &NetworkAccess::default()).expect("a policy");
        assert!(rules(&policy)[1].from.is_none());
    }

    #[test]
    fn policy_none_opts_out() {
        let view = view_of("size: 3\nnetwork:\n  policy: None");
        assert!(network_policy(&view, &NetworkAccess::default()).is_none());
    }
}
