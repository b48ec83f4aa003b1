//! The pod of one etcd member.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodSpec, Probe, SecretVolumeSource, TCPSocketAction, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use etcd_shared::names::{self, CLIENT_PORT, METRICS_PORT, PEER_PORT};
use etcd_shared::version::{EtcdVersion, LineCapabilities};

use super::ClusterView;
use super::claim::claim_name_if_durable;

/// Where the data volume is mounted.
pub const DATA_DIR: &str = "/var/lib/etcd";
const PEER_TLS_DIR: &str = "/etc/etcd/peer-tls";
const SERVER_TLS_DIR: &str = "/etc/etcd/server-tls";
/// The etcd binary in the official images.
pub const ETCD_BINARY: &str = "/usr/local/bin/etcd";

/// Whether a member founds a new cluster or joins an existing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialState {
    /// The first member of a new cluster.
    New,
    /// A member added to a running cluster through the member API.
    Existing,
}

/// What a member pod is started with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberPlan {
    /// Member (and pod) name.
    pub name: String,
    /// `--initial-cluster`: every voter and this member, as (name, peer URL).
    pub initial_cluster: Vec<(String, String)>,
    /// New cluster or joining.
    pub state: InitialState,
    /// Version the member starts with.
    pub version: EtcdVersion,
}

/// The pod of a member.
pub fn member_pod(view: &ClusterView, plan: &MemberPlan) -> Pod {
    let caps = plan.version.capabilities().unwrap_or(view.capabilities);
    let mut labels = view.pod.labels.clone();
    labels.extend(names::member_labels(
        &view.name,
        &plan.name,
        &plan.version.to_string(),
    ));
    let metadata = ObjectMeta {
        name: Some(plan.name.clone()),
        namespace: Some(view.namespace.clone()),
        labels: Some(labels),
        annotations: Some(member_annotations(view, plan)),
        owner_references: Some(vec![view.owner.clone()]),
        ..ObjectMeta::default()
    };

    let client_scheme = view.client_scheme();
    let peer_scheme = if view.tls.peer_secret.is_some() {
        "https"
    } else {
        "http"
    };
    let initial_cluster = plan
        .initial_cluster
        .iter()
        .map(|(n, url)| format!("{n}={url}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        format!("--name={}", plan.name),
        format!("--data-dir={DATA_DIR}/data"),
        format!("--listen-peer-urls={peer_scheme}://$(POD_IP):{PEER_PORT}"),
        format!("--listen-client-urls={client_scheme}://$(POD_IP):{CLIENT_PORT}"),
        format!("--advertise-client-urls={}", view.client_url(&plan.name)),
        format!(
            "--initial-advertise-peer-urls={}",
            view.peer_url(&plan.name)
        ),
        format!("--initial-cluster={initial_cluster}"),
        format!(
            "--initial-cluster-state={}",
            match plan.state {
                InitialState::New => "new",
                InitialState::Existing => "existing",
            }
        ),
        format!("--initial-cluster-token={}", view.token()),
    ];
    if caps.metrics_urls {
        args.push(format!(
            "--listen-metrics-urls=http://$(POD_IP):{METRICS_PORT}"
        ));
    }
    if caps.zap_logger {
        args.push("--logger=zap".into());
    }
    let mut mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..VolumeMount::default()
    }];
    let mut volumes = vec![data_volume(view, &plan.name)];
    if let Some(secret) = &view.tls.peer_secret {
        args.extend([
            format!("--peer-cert-file={PEER_TLS_DIR}/peer.crt"),
            format!("--peer-key-file={PEER_TLS_DIR}/peer.key"),
            format!("--peer-trusted-ca-file={PEER_TLS_DIR}/peer-ca.crt"),
            "--peer-client-cert-auth=true".into(),
        ]);
        mounts.push(secret_mount("peer-tls", PEER_TLS_DIR));
        volumes.push(secret_volume("peer-tls", secret));
    }
    if let Some(secret) = &view.tls.server_secret {
        args.extend([
            format!("--cert-file={SERVER_TLS_DIR}/server.crt"),
            format!("--key-file={SERVER_TLS_DIR}/server.key"),
            format!("--trusted-ca-file={SERVER_TLS_DIR}/server-ca.crt"),
            "--client-cert-auth=true".into(),
        ]);
        mounts.push(secret_mount("server-tls", SERVER_TLS_DIR));
        volumes.push(secret_volume("server-tls", secret));
    }

    let mut env = vec![
        field_env("POD_NAME", "metadata.name"),
        field_env("POD_NAMESPACE", "metadata.namespace"),
        field_env("POD_IP", "status.podIP"),
    ];
    env.extend(view.pod.etcd_env.iter().cloned());

    let mut ports = vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)];
    if caps.metrics_urls {
        ports.push(port("metrics", METRICS_PORT));
    }

    let container = Container {
        name: "etcd".into(),
        image: Some(view.image(&plan.version)),
        command: Some(vec![ETCD_BINARY.into()]),
        args: Some(args),
        env: Some(env),
        ports: Some(ports),
        volume_mounts: Some(mounts),
        resources: view.pod.resources.clone(),
        readiness_probe: Some(readiness_probe(caps, view.tls.server_secret.is_some())),
        ..Container::default()
    };

    Pod {
        metadata,
        spec: Some(PodSpec {
            hostname: Some(plan.name.clone()),
            subdomain: Some(names::peer_service_name(&view.name)),
            containers: vec![container],
            volumes: Some(volumes),
            restart_policy: Some("Always".into()),
            node_selector: (!view.pod.node_selector.is_empty())
                .then(|| view.pod.node_selector.clone()),
            affinity: affinity(view),
            tolerations: (!view.pod.tolerations.is_empty()).then(|| view.pod.tolerations.clone()),
            topology_spread_constraints: (!view.pod.topology_spread_constraints.is_empty())
                .then(|| view.pod.topology_spread_constraints.clone()),
            priority_class_name: view.pod.priority_class_name.clone(),
            security_context: view.pod.security_context.clone(),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(30),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The user's pod annotations and the version the member is created with.
fn member_annotations(view: &ClusterView, plan: &MemberPlan) -> BTreeMap<String, String> {
    let mut annotations = view.pod.annotations.clone();
    annotations.insert(
        names::ANNOTATION_CREATED_ON.to_string(),
        plan.version.to_string(),
    );
    annotations
}

/// Readiness: etcd's `/health` (which fails without a leader), on the plain metrics port
/// where the line has one, else on the client port when it is plain HTTP. A TCP check of the
/// client port instead where `/health` cannot be asked without a client certificate, and on
/// 3.2 and 3.3, whose `/health` writes a v2 entry to the raft log that etcd 3.6 cannot
/// replay (see [`LineCapabilities::v3_health`]); the controller checks those members' health
/// itself through the maintenance API.
///
/// There is deliberately no liveness probe: a probe that kills a busy member turns load into
/// an outage (CoreOS #2110); a crashed etcd exits and is restarted by the kubelet.
fn readiness_probe(caps: &LineCapabilities, client_tls: bool) -> Probe {
    let base = Probe {
        initial_delay_seconds: Some(1),
        period_seconds: Some(5),
        timeout_seconds: Some(5),
        failure_threshold: Some(3),
        ..Probe::default()
    };
    let health_on = |port: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::Int(port),
            scheme: Some("HTTP".into()),
            ..HTTPGetAction::default()
        }),
        ..base.clone()
    };
    match (caps.v3_health, caps.metrics_urls, client_tls) {
        (true, true, _) => health_on(METRICS_PORT),
        (true, false, false) => health_on(CLIENT_PORT),
        _ => Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(CLIENT_PORT),
                ..TCPSocketAction::default()
            }),
            ..base
        },
    }
}

fn affinity(view: &ClusterView) -> Option<Affinity> {
    if !view.pod.anti_affinity {
        return view.pod.affinity.clone();
    }
    let mut affinity = view.pod.affinity.clone().unwrap_or_default();
    affinity.pod_anti_affinity = Some(PodAntiAffinity {
        required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    names::LEGACY_LABEL_CLUSTER.to_string(),
                    view.name.clone(),
                )])),
                ..LabelSelector::default()
            }),
            topology_key: "kubernetes.io/hostname".into(),
            ..PodAffinityTerm::default()
        }]),
        ..PodAntiAffinity::default()
    });
    Some(affinity)
}

fn data_volume(view: &ClusterView, member: &str) -> Volume {
    match claim_name_if_durable(view, member) {
        Some(claim) => Volume {
            name: "data".into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim,
                read_only: None,
            }),
            ..Volume::default()
        },
        None => Volume {
            name: "data".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: view.pod.storage_medium.clone().filter(|m| !m.is_empty()),
                size_limit: None,
            }),
            ..Volume::default()
        },
    }
}

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o400),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn secret_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        value: None,
    }
}

fn port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.into()),
        container_port: port,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builders::fixtures::view_of;

    fn plan(view: &ClusterView, state: InitialState) -> MemberPlan {
        let name = names::member_name(&view.name, 0);
        MemberPlan {
            initial_cluster: vec![(name.clone(), view.peer_url(&name))],
            name,
            state,
            version: view.version,
        }
    }

    fn args(pod: &Pod) -> Vec<String> {
        pod.spec.as_ref().unwrap().containers[0]
            .args
            .clone()
            .unwrap()
    }

    #[test]
    fn seed_member_of_the_users_example() {
        let view = view_of("size: 3\nversion: 3.2.13");
        let pod = member_pod(&view, &plan(&view, InitialState::New));
        assert_eq!(pod.metadata.name.as_deref(), Some("demo-0"));
        assert_eq!(
            pod.metadata.owner_references.as_ref().unwrap()[0].kind,
            "EtcdCluster"
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some("demo-0"));
        assert_eq!(spec.subdomain.as_deref(), Some("demo"));
        assert_eq!(spec.restart_policy.as_deref(), Some("Always"));
        let c = &spec.containers[0];
        assert_eq!(c.image.as_deref(), Some("quay.io/coreos/etcd:v3.2.13"));
        let a = args(&pod);
        assert!(a.contains(&"--initial-cluster-state=new".to_string()));
        assert!(
            a.contains(&"--initial-cluster=demo-0=http://demo-0.demo.ns1.svc:2380".to_string())
        );
        assert!(a.contains(&"--listen-client-urls=http://$(POD_IP):2379".to_string()));
        assert!(a.contains(&"--initial-cluster-token=demo-uid-1".to_string()));
        // 3.2 has neither the metrics listener nor zap.
        assert!(
            !a.iter()
                .any(|x| x.starts_with("--listen-metrics-urls") || x == "--logger=zap")
        );
        // 3.2's /health is a v2 quorum read through raft: probed over TCP instead.
        let probe = c.readiness_probe.as_ref().unwrap();
        assert!(probe.http_get.is_none());
        assert_eq!(
            probe.tcp_socket.as_ref().unwrap().port,
            IntOrString::Int(CLIENT_PORT)
        );
        assert!(c.liveness_probe.is_none());
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(labels.get("etcd_cluster").map(String::as_str), Some("demo"));
        assert_eq!(
            labels.get(names::LABEL_MEMBER).map(String::as_str),
            Some("demo-0")
        );
        assert!(spec.volumes.as_ref().unwrap()[0].empty_dir.is_some());
    }

    #[test]
    fn modern_member_with_claim_tls_and_user_policy() {
        let view = view_of(
            "version: 3.6.16\npod:\n  labels:\n    team: db\n  etcdEnv:\n  - name: ETCD_QUOTA_BACKEND_BYTES\n    value: \"1024\"\n  antiAffinity: true\n  persistentVolumeClaimSpec:\n    storageClassName: fast\n    resources:\n      requests:\n        storage: 1Gi\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o",
        );
        let pod = member_pod(&view, &plan(&view, InitialState::Existing));
        let a = args(&pod);
        assert!(a.contains(&"--initial-cluster-state=existing".to_string()));
        assert!(a.contains(&"--listen-metrics-urls=http://$(POD_IP):2381".to_string()));
        assert!(a.contains(&"--logger=zap".to_string()));
        assert!(
            a.contains(&"--advertise-client-urls=https://demo-0.demo.ns1.svc:2379".to_string())
        );
        assert!(a.contains(&"--peer-client-cert-auth=true".to_string()));
        assert!(a.contains(&"--client-cert-auth=true".to_string()));
        let spec = pod.spec.as_ref().unwrap();
        let c = &spec.containers[0];
        let env: Vec<&str> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(
            env,
            [
                "POD_NAME",
                "POD_NAMESPACE",
                "POD_IP",
                "ETCD_QUOTA_BACKEND_BYTES"
            ]
        );
        let vols = spec.volumes.as_ref().unwrap();
        assert_eq!(
            vols[0].persistent_volume_claim.as_ref().unwrap().claim_name,
            "demo-0-data"
        );
        assert_eq!(
            vols[1].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("p")
        );
        assert_eq!(
            vols[2].secret.as_ref().unwrap().secret_name.as_deref(),
            Some("s")
        );
        assert_eq!(
            pod.metadata
                .labels
                .as_ref()
                .unwrap()
                .get("team")
                .map(String::as_str),
            Some("db")
        );
        let anti = spec
            .affinity
            .as_ref()
            .unwrap()
            .pod_anti_affinity
            .as_ref()
            .unwrap();
        assert_eq!(
            anti.required_during_scheduling_ignored_during_execution
                .as_ref()
                .unwrap()[0]
                .topology_key,
            "kubernetes.io/hostname"
        );
        let probe = c
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.port, IntOrString::Int(METRICS_PORT));
    }

    /// The readiness probe of every line, plain and with client TLS: `/health` only where it
    /// is a v3 read, on the plain metrics port where there is one.
    #[test]
    fn readiness_probe_per_line() {
        for (version, tls, want) in [
            ("3.2.13", false, "tcp 2379"),
            ("3.2.13", true, "tcp 2379"),
            ("3.3.27", false, "tcp 2379"),
            ("3.3.27", true, "tcp 2379"),
            ("3.4.45", false, "http 2381"),
            ("3.4.45", true, "http 2381"),
            ("3.6.16", false, "http 2381"),
            ("3.7.3", true, "http 2381"),
        ] {
            let tls_spec = if tls {
                "\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o"
            } else {
                ""
            };
            let view = view_of(&format!("version: {version}{tls_spec}"));
            let pod = member_pod(&view, &plan(&view, InitialState::New));
            let probe = pod.spec.unwrap().containers[0]
                .readiness_probe
                .clone()
                .unwrap();
            let got = match (probe.http_get, probe.tcp_socket) {
                (Some(h), None) => format!(
                    "http {}",
                    match h.port {
                        IntOrString::Int(p) => p,
                        _ => 0,
                    }
                ),
                (None, Some(t)) => format!(
                    "tcp {}",
                    match t.port {
                        IntOrString::Int(p) => p,
                        _ => 0,
                    }
                ),
                other => panic!("{other:?}"),
            };
            assert_eq!(got, want, "{version} tls={tls}");
        }
    }
}
