//! The two Services of a cluster: headless for peers (member DNS names), and one for clients.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use etcd_shared::names::{self, CLIENT_PORT, PEER_PORT};

use crate::view::ClusterView;

/// The selector of a cluster's member pods for its Services and budget: this operator's member
/// labels, or, while member pods made by CoreOS' operator are there (`coreos_members`), CoreOS'
/// own selector (`app=etcd, etcd_cluster=NAME`), which selects those and this operator's
/// members alike (and no other pod this operator makes). So a Service never stops selecting
/// members that serve, from the first reconcile of an adopted cluster to its last CoreOS
/// member, and the switch back selects the same pods.
pub fn member_selector(view: &ClusterView, coreos_members: bool) -> BTreeMap<String, String> {
    if coreos_members {
        return names::coreos_selector(&view.name);
    }
    let mut s = names::selector_labels(&view.name);
    s.insert(names::LABEL_COMPONENT.into(), "member".into());
    s
}

fn meta(view: &ClusterView, name: String, component: &str) -> ObjectMeta {
    let labels = names::object_labels(&view.name, component);
    ObjectMeta {
        name: Some(name),
        namespace: Some(view.namespace.clone()),
        labels: Some(labels),
        owner_references: Some(vec![view.owner.clone()]),
        ..ObjectMeta::default()
    }
}

fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// Headless Service that gives every member `MEMBER.NAME.NS.svc` and publishes members
/// before they are ready (a joining member must be reachable to catch up). `coreos_members`:
/// see [`member_selector`].
pub fn peer_service(view: &ClusterView, coreos_members: bool) -> Service {
    Service {
        metadata: meta(view, names::peer_service_name(&view.name), "peer-service"),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".into()),
            publish_not_ready_addresses: Some(true),
            selector: Some(member_selector(view, coreos_members)),
            ports: Some(vec![
                service_port("client", CLIENT_PORT),
                service_port("peer", PEER_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// Service clients use: only ready members receive traffic. `coreos_members`: see
/// [`member_selector`].
pub fn client_service(view: &ClusterView, coreos_members: bool) -> Service {
    Service {
        metadata: meta(
            view,
            names::client_service_name(&view.name),
            "client-service",
        ),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(member_selector(view, coreos_members)),
            ports: Some(vec![service_port("client", CLIENT_PORT)]),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    #[test]
    fn peer_service_is_headless_and_publishes_not_ready() {
        let s = peer_service(&view_of("size: 3"), false);
        assert_eq!(s.metadata.name.as_deref(), Some("demo"));
        let spec = s.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.publish_not_ready_addresses, Some(true));
        assert_eq!(spec.ports.unwrap().len(), 2);
        assert_eq!(
            spec.selector
                .unwrap()
                .get(names::LABEL_INSTANCE)
                .map(String::as_str),
            Some("demo")
        );
    }

    #[test]
    fn client_service_serves_2379() {
        let s = client_service(&view_of("size: 3"), false);
        assert_eq!(s.metadata.name.as_deref(), Some("demo-client"));
        assert_eq!(
            s.metadata.owner_references.unwrap()[0].controller,
            Some(true)
        );
        let ports = s.spec.unwrap().ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].port, 2379);
    }

    /// Selectors written for CoreOS' operator (`app=etcd,etcd_cluster=NAME`) match our
    /// Services as they matched CoreOS' (issue 13, item 7).
    #[test]
    fn services_carry_coreos_labels() {
        let view = view_of("size: 3");
        for s in [peer_service(&view, false), client_service(&view, false)] {
            let labels = s.metadata.labels.unwrap();
            assert_eq!(labels.get("app").map(String::as_str), Some("etcd"));
            assert_eq!(labels.get("etcd_cluster").map(String::as_str), Some("demo"));
        }
    }

    /// While CoreOS' member pods are there, both Services select with CoreOS' selector, which
    /// this operator's member pods also match; afterwards with this operator's labels (issue
    /// 28: the selectors were re-pointed away from CoreOS' serving members).
    #[test]
    fn services_keep_coreos_selector_while_coreos_members_run() {
        let view = view_of("size: 3");
        let ours = names::member_labels("demo", "demo-0", "3.2.13");
        for (coreos, want) in [
            (true, names::coreos_selector("demo")),
            (false, member_selector(&view, false)),
        ] {
            for s in [peer_service(&view, coreos), client_service(&view, coreos)] {
                let selector = s.spec.and_then(|s| s.selector).unwrap_or_default();
                assert_eq!(selector, want);
                assert!(
                    selector.iter().all(|(k, v)| ours.get(k) == Some(v)),
                    "this operator's member pods match {selector:?}"
                );
            }
        }
        assert_eq!(
            names::coreos_selector("demo"),
            std::collections::BTreeMap::from([
                ("app".to_string(), "etcd".to_string()),
                ("etcd_cluster".to_string(), "demo".to_string())
            ])
        );
    }
}
