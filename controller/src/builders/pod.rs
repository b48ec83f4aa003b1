//! The pod of one etcd member.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction,
    ObjectFieldSelector, PersistentVolumeClaimVolumeSource, Pod, PodAffinityTerm, PodAntiAffinity,
    PodReadinessGate, PodSpec, Probe, SecretVolumeSource, TCPSocketAction,
    TopologySpreadConstraint, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
// The security contexts of the member pods (see `pod_security_context`).
use k8s_openapi::api::core::v1::{
    Capabilities, PodSecurityContext, SeccompProfile, SecurityContext,
};

use etcd_shared::member_flags::{MemberFlag, POD_ENV, POD_IP};
use etcd_shared::names::{self, CLIENT_PORT, METRICS_PORT, PEER_PORT};
use etcd_shared::version::LineCapabilities;

use super::claim::claim_name_if_durable;
use crate::planner::{InitialState, MemberPlan};
use crate::view::ClusterView;
use crate::view::transport::MemberTransport;

/// Where the data volume is mounted.
pub const DATA_DIR: &str = "/var/lib/etcd";
const PEER_TLS_DIR: &str = "/etc/etcd/peer-tls";
const SERVER_TLS_DIR: &str = "/etc/etcd/server-tls";
/// The etcd binary in the official images.
pub const ETCD_BINARY: &str = "/usr/local/bin/etcd";

/// Records on a member pod the TLS files it is made with (the kubelet mounts the Secrets as
/// they are when it starts the pod, which is after this): what
/// [`crate::planner::rollout`] compares with the files the Secrets hold later.
pub fn stamp_tls_files(pod: &mut Pod, stamp: &crate::planner::TlsStamp) {
    let annotations = pod
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    for (key, value) in [
        (names::ANNOTATION_TLS_TRUST, &stamp.trust),
        (names::ANNOTATION_TLS_LEAVES, &stamp.leaves),
    ] {
        if let Some(value) = value {
            annotations.insert(key.to_string(), value.clone());
        }
    }
}

/// The pod of a member.
pub fn member_pod(view: &ClusterView, plan: &MemberPlan) -> Pod {
    let caps = plan.version.capabilities().unwrap_or(view.capabilities);
    let transport = member_transport(view, plan);
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
        annotations: Some(member_annotations(view, plan, caps, &transport)),
        owner_references: Some(vec![view.owner.clone()]),
        ..ObjectMeta::default()
    };

    let mut args = member_args(view, plan, caps, &transport);
    let mut mounts = vec![VolumeMount {
        name: "data".into(),
        mount_path: DATA_DIR.into(),
        ..VolumeMount::default()
    }];
    let mut volumes = vec![data_volume(view, &plan.name)];
    add_tls_files(view, &transport, &mut args, &mut mounts, &mut volumes);

    // The container's own variables, from the one list the admission rules reserve.
    let mut env: Vec<EnvVar> = POD_ENV
        .iter()
        .map(|(name, path)| field_env(name, path))
        .collect();
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
        readiness_probe: Some(readiness_probe(caps, !transport.serves_plain())),
        security_context: Some(container_security_context()),
        ..Container::default()
    };
    Pod {
        metadata,
        spec: Some(member_pod_spec(view, plan, container, volumes)),
        status: None,
    }
}

/// How the member of `plan` speaks: as its peer URL in `--initial-cluster` says (the one it
/// registered, for a member that joins), else as the cluster asks.
pub fn member_transport(view: &ClusterView, plan: &MemberPlan) -> MemberTransport {
    plan.initial_cluster
        .iter()
        .find(|(name, _)| name == &plan.name)
        .map_or_else(
            || MemberTransport::target(view),
            |(_, url)| MemberTransport::of_member(view, url),
        )
}

/// etcd's flags for a member (every flag through MemberFlag: the admission rules reserve
/// their ETCD_* variables), before those of its TLS files.
fn member_args(
    view: &ClusterView,
    plan: &MemberPlan,
    caps: &etcd_shared::version::LineCapabilities,
    transport: &MemberTransport,
) -> Vec<String> {
    let peer_scheme = transport.peer_scheme();
    let listen_client = transport
        .client_listen_schemes()
        .iter()
        .map(|scheme| format!("{scheme}://$({POD_IP}):{CLIENT_PORT}"))
        .collect::<Vec<_>>()
        .join(",");
    // Advertised: the scheme the operator dials it with (plain while it serves plain).
    let advertise_client = format!(
        "{}://{}:{CLIENT_PORT}",
        transport.dial_scheme(),
        view.member_host(&plan.name)
    );
    let initial_cluster = plan
        .initial_cluster
        .iter()
        .map(|(n, url)| format!("{n}={url}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut args = vec![
        MemberFlag::Name.arg(&plan.name),
        MemberFlag::DataDir.arg(format_args!("{DATA_DIR}/data")),
        MemberFlag::ListenPeerUrls.arg(format_args!("{peer_scheme}://$({POD_IP}):{PEER_PORT}")),
        MemberFlag::ListenClientUrls.arg(listen_client),
        MemberFlag::AdvertiseClientUrls.arg(advertise_client),
        MemberFlag::InitialAdvertisePeerUrls.arg(transport.peer_url(view, &plan.name)),
        MemberFlag::InitialCluster.arg(initial_cluster),
        MemberFlag::InitialClusterState.arg(match plan.state {
            InitialState::New => "new",
            InitialState::Existing => "existing",
        }),
        MemberFlag::InitialClusterToken.arg(&plan.token),
    ];
    if caps.metrics_urls {
        args.push(
            MemberFlag::ListenMetricsUrls.arg(format_args!("http://$({POD_IP}):{METRICS_PORT}")),
        );
    }
    if caps.zap_logger {
        args.push(MemberFlag::Logger.arg("zap"));
    }
    args
}

/// The member's TLS files: the flags that name them, their mounts and their Secret volumes.
fn add_tls_files(
    view: &ClusterView,
    transport: &MemberTransport,
    args: &mut Vec<String>,
    mounts: &mut Vec<VolumeMount>,
    volumes: &mut Vec<Volume>,
) {
    if let Some(secret) = view
        .tls
        .peer_secret
        .as_ref()
        .filter(|_| transport.peer_files)
    {
        args.extend([
            MemberFlag::PeerCertFile.arg(format_args!("{PEER_TLS_DIR}/peer.crt")),
            MemberFlag::PeerKeyFile.arg(format_args!("{PEER_TLS_DIR}/peer.key")),
            MemberFlag::PeerTrustedCaFile.arg(format_args!("{PEER_TLS_DIR}/peer-ca.crt")),
            MemberFlag::PeerClientCertAuth.arg(true),
        ]);
        mounts.push(read_only_mount(names::PEER_TLS_VOLUME, PEER_TLS_DIR));
        volumes.push(tls_volume(
            names::PEER_TLS_VOLUME,
            secret,
            view.tls.layout,
            etcd_shared::tls::CertKind::Peer,
        ));
    }
    if let Some(secret) = view
        .tls
        .server_secret
        .as_ref()
        .filter(|_| transport.serves_tls())
    {
        args.extend([
            MemberFlag::CertFile.arg(format_args!("{SERVER_TLS_DIR}/server.crt")),
            MemberFlag::KeyFile.arg(format_args!("{SERVER_TLS_DIR}/server.key")),
            MemberFlag::TrustedCaFile.arg(format_args!("{SERVER_TLS_DIR}/server-ca.crt")),
            MemberFlag::ClientCertAuth.arg(true),
        ]);
        mounts.push(read_only_mount(names::SERVER_TLS_VOLUME, SERVER_TLS_DIR));
        volumes.push(tls_volume(
            names::SERVER_TLS_VOLUME,
            secret,
            view.tls.layout,
            etcd_shared::tls::CertKind::Server,
        ));
    }
}

/// The pod spec around a member's etcd container.
fn member_pod_spec(
    view: &ClusterView,
    plan: &MemberPlan,
    container: Container,
    volumes: Vec<Volume>,
) -> PodSpec {
    PodSpec {
        hostname: Some(plan.name.clone()),
        subdomain: Some(names::peer_service_name(&view.name)),
        containers: vec![container],
        volumes: Some(volumes),
        restart_policy: Some("Always".into()),
        node_selector: (!view.pod.node_selector.is_empty()).then(|| view.pod.node_selector.clone()),
        affinity: affinity(view),
        tolerations: (!view.pod.tolerations.is_empty()).then(|| view.pod.tolerations.clone()),
        topology_spread_constraints: Some(topology_spread(view)),
        // The operator takes the member out of the client Service before it stops it.
        readiness_gates: Some(vec![PodReadinessGate {
            condition_type: names::CONDITION_SERVING.into(),
        }]),
        priority_class_name: view.pod.priority_class_name.clone(),
        image_pull_secrets: super::with_pull_secrets(
            None,
            view.pod.image_pull_secrets.iter().map(|s| s.name.as_str()),
        ),
        security_context: Some(pod_security_context(view.pod.security_context.as_ref())),
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        termination_grace_period_seconds: Some(30),
        ..PodSpec::default()
    }
}

/// The user and group the members run as by default: 65532, the `nonroot` user of the
/// distroless base image of etcd's own images (which do not set a user, so they would run
/// as root).
pub const MEMBER_UID: i64 = 65532;

/// Whether the user's pod security context asks for root (`runAsUser: 0` or
/// `runAsNonRoot: false`): the documented opt-in for old images and for data volumes that
/// only root can write (CoreOS' operator ran its members as root).
pub fn runs_as_root(user: Option<&PodSecurityContext>) -> bool {
    user.is_some_and(|c| c.run_as_user == Some(0) || c.run_as_non_root == Some(false))
}

/// The pod security context of a member: every field the user set in
/// `spec.pod.securityContext`, and for each one left out the operator's default, which
/// together with [`container_security_context`] passes Pod Security `restricted`:
/// `runAsNonRoot: true`, user, group and fsGroup [`MEMBER_UID`] (so the member can write
/// its data volume and read its TLS secrets, made group-readable by the kubelet),
/// `fsGroupChangePolicy: OnRootMismatch` (the volume is walked once, not on every start)
/// and seccomp `RuntimeDefault`. With the root opt-in ([`runs_as_root`]) only the seccomp
/// default is added; that pod passes `baseline`, not `restricted`.
pub fn pod_security_context(user: Option<&PodSecurityContext>) -> PodSecurityContext {
    let mut context = user.cloned().unwrap_or_default();
    if !runs_as_root(user) {
        context.run_as_non_root.get_or_insert(true);
        context.run_as_user.get_or_insert(MEMBER_UID);
        context.run_as_group.get_or_insert(MEMBER_UID);
        context.fs_group.get_or_insert(MEMBER_UID);
        context
            .fs_group_change_policy
            .get_or_insert_with(|| "OnRootMismatch".into());
    }
    context
        .seccomp_profile
        .get_or_insert_with(|| SeccompProfile {
            type_: "RuntimeDefault".into(),
            localhost_profile: None,
        });
    context
}

/// The etcd container's security context, whatever the spec says (the spec has no
/// container security context): no privilege escalation and no capabilities; etcd needs
/// none, it binds ports above 1024.
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            add: None,
            drop: Some(vec!["ALL".into()]),
        }),
        ..SecurityContext::default()
    }
}

/// The user's pod annotations and the version the member is created with.
fn member_annotations(
    view: &ClusterView,
    plan: &MemberPlan,
    caps: &LineCapabilities,
    transport: &MemberTransport,
) -> BTreeMap<String, String> {
    let mut annotations = view.pod.annotations.clone();
    annotations.insert(
        names::ANNOTATION_CREATED_ON.to_string(),
        plan.version.to_string(),
    );
    // Where a scraper finds `/metrics`: the metrics port when the line has one, else the
    // client port when it is plain HTTP (an in-place upgrade keeps the pod's ports, so this
    // stays true of the pod whatever it runs later).
    if !caps.metrics_urls && transport.serves_plain() {
        annotations.insert(
            names::ANNOTATION_METRICS_ON_CLIENT_PORT.to_string(),
            "true".to_string(),
        );
    }
    annotations
}

/// The readiness path of lines whose `/health` can leave the NOSPACE alarm out.
pub const HEALTH_EXCLUDING_NOSPACE: &str = "/health?exclude=NOSPACE";

/// Readiness: etcd's `/health` (which fails without a leader), on the plain metrics port
/// where the line has one, else on the client port when it is plain HTTP. A TCP check of the
/// client port instead where `/health` cannot be asked without a client certificate, and on
/// 3.2 and 3.3, whose `/health` writes a v2 entry to the raft log that etcd 3.6 cannot
/// replay (see [`LineCapabilities::v3_health`]); the controller checks those members' health
/// itself through the maintenance API.
///
/// Where the line can, the probe asks `/health?exclude=NOSPACE`: NOSPACE is a cluster-wide
/// alarm that fails every member's plain `/health`, which would take every member out of the
/// client Service while reads still work (and the operator heals the alarm). A CORRUPT alarm
/// still fails the probe.
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
    let path = if caps.health_excludes_alarms {
        HEALTH_EXCLUDING_NOSPACE
    } else {
        "/health"
    };
    let health_on = |port: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
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

/// The spec's topology spread constraints, or by default a preference to spread the members
/// over nodes and then zones (`ScheduleAnyway`: a one-node cluster still runs every member;
/// `antiAffinity: true` stays the hard rule). Every member pod carries CoreOS' cluster label,
/// so adopted members count too.
fn topology_spread(view: &ClusterView) -> Vec<TopologySpreadConstraint> {
    if !view.pod.topology_spread_constraints.is_empty() {
        return view.pod.topology_spread_constraints.clone();
    }
    ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
        .into_iter()
        .map(|key| TopologySpreadConstraint {
            max_skew: 1,
            topology_key: key.into(),
            when_unsatisfiable: "ScheduleAnyway".into(),
            label_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    names::LEGACY_LABEL_CLUSTER.to_string(),
                    view.name.clone(),
                )])),
                ..LabelSelector::default()
            }),
            ..TopologySpreadConstraint::default()
        })
        .collect()
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

/// A volume of the secret `secret`, its files in `mode`.
pub(super) fn secret_volume(name: &str, secret: &str, mode: i32) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(mode),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A volume of the certificate Secret `secret` of `kind`, its files named in CoreOS' layout
/// whatever the Secret's (`kubernetes.io/tls` keys are mapped: `tls.crt` -> `peer.crt`, ...),
/// readable by the owner only.
fn tls_volume(
    name: &str,
    secret: &str,
    layout: etcd_shared::tls::SecretLayout,
    kind: etcd_shared::tls::CertKind,
) -> Volume {
    let mut volume = secret_volume(name, secret, 0o400);
    if layout != etcd_shared::tls::SecretLayout::CoreOs
        && let Some(source) = volume.secret.as_mut()
    {
        source.items = Some(
            layout
                .keys(kind)
                .iter()
                .zip(kind.coreos_keys())
                .map(|(key, path)| k8s_openapi::api::core::v1::KeyToPath {
                    key: (*key).to_string(),
                    path: path.to_string(),
                    mode: None,
                })
                .collect(),
        );
    }
    volume
}

/// A read-only mount of volume `name` at `path`.
pub(super) fn read_only_mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    }
}

pub(super) fn field_env(name: &str, path: &str) -> EnvVar {
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

/// The names of the Secrets `pod` pulls its images with, in order.
#[cfg(test)]
pub(crate) fn pull_secret_names(pod: Pod) -> Vec<String> {
    let secrets = pod.spec.and_then(|s| s.image_pull_secrets);
    secrets
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::fixtures::view_of;

    fn plan(view: &ClusterView, state: InitialState) -> MemberPlan {
        let name = names::member_name(&view.name, 0);
        MemberPlan {
            initial_cluster: vec![(name.clone(), view.peer_url(&name))],
            name,
            state,
            version: view.version,
            token: view.token(),
            seed: None,
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

    /// Issue 34: a member that joins a cluster switching to TLS on a plain peer URL is a
    /// bridge: its peer port plain, the peer TLS files held (it can dial TLS peers), clients
    /// served in both schemes on one port; and the flags read back from the pod say so.
    #[test]
    fn a_member_registered_with_a_plain_peer_url_in_a_tls_cluster_is_a_bridge() {
        for version in ["3.2.13", "3.6.16"] {
            let view = view_of(&format!(
                "size: 3\nversion: {version}\nTLS:\n  operatorManaged: {{}}"
            ));
            let mut bridge = plan(&view, InitialState::Existing);
            bridge.initial_cluster = vec![
                ("demo-1".into(), "https://demo-1.demo.ns1.svc:2380".into()),
                ("demo-0".into(), "http://demo-0.demo.ns1.svc:2380".into()),
            ];
            let pod = member_pod(&view, &bridge);
            let a = args(&pod);
            for expected in [
                "--listen-peer-urls=http://$(POD_IP):2380",
                "--initial-advertise-peer-urls=http://demo-0.demo.ns1.svc:2380",
                "--listen-client-urls=http://$(POD_IP):2379,https://$(POD_IP):2379",
                "--advertise-client-urls=http://demo-0.demo.ns1.svc:2379",
                "--peer-trusted-ca-file=/etc/etcd/peer-tls/peer-ca.crt",
                "--cert-file=/etc/etcd/server-tls/server.crt",
            ] {
                assert!(
                    a.iter().any(|x| x == expected),
                    "{version}: {expected} in {a:?}"
                );
            }
            let read = MemberTransport::of_args(a.iter().map(String::as_str));
            assert_eq!(read, Some(MemberTransport::bridge(&view)));
            let probe = pod.spec.as_ref().unwrap().containers[0]
                .readiness_probe
                .clone()
                .unwrap();
            // 3.2's /health is never asked (see `readiness_probe`); 3.6's on the metrics port.
            assert_eq!(probe.tcp_socket.is_none(), version == "3.6.16", "{version}");
            // Registered with TLS: a member as the cluster asks.
            let target = member_pod(&view, &plan(&view, InitialState::Existing));
            let read = MemberTransport::of_args(args(&target).iter().map(String::as_str));
            assert_eq!(read, Some(MemberTransport::target(&view)));
        }
    }

    /// Issue 32, item 10: members spread over nodes, then zones, as a preference by default (a
    /// one-node cluster still runs); the spec's own constraints replace the default.
    #[test]
    fn members_spread_over_nodes_and_zones_by_default() {
        let view = view_of("size: 3");
        let pod = member_pod(&view, &plan(&view, InitialState::New));
        let spread = pod
            .spec
            .as_ref()
            .and_then(|s| s.topology_spread_constraints.clone())
            .unwrap_or_default();
        let keys: Vec<(&str, &str, i32)> = spread
            .iter()
            .map(|c| {
                (
                    c.topology_key.as_str(),
                    c.when_unsatisfiable.as_str(),
                    c.max_skew,
                )
            })
            .collect();
        assert_eq!(
            keys,
            [
                ("kubernetes.io/hostname", "ScheduleAnyway", 1),
                ("topology.kubernetes.io/zone", "ScheduleAnyway", 1)
            ]
        );
        let selector = spread[0]
            .label_selector
            .as_ref()
            .and_then(|s| s.match_labels.clone());
        assert_eq!(
            selector,
            Some(BTreeMap::from([(
                names::LEGACY_LABEL_CLUSTER.to_string(),
                "demo".to_string()
            )]))
        );
        let own = view_of(
            "size: 3\npod:\n  topologySpreadConstraints:\n  - maxSkew: 2\n    topologyKey: rack\n    whenUnsatisfiable: DoNotSchedule",
        );
        let pod = member_pod(&own, &plan(&own, InitialState::New));
        let spread = pod
            .spec
            .and_then(|s| s.topology_spread_constraints)
            .unwrap_or_default();
        assert_eq!(spread.len(), 1);
        assert_eq!(spread[0].topology_key, "rack");
    }

    /// Every `--flag` the builder passes, on every line, plain and with each TLS mode, is one
    /// of the shared [`MemberFlag`]s, so its `ETCD_*` variable is reserved at admission; and
    /// every variable of the container is reserved too. A flag written here by hand and not
    /// added to the shared list fails this test.
    #[test]
    fn every_flag_and_variable_the_builder_sets_is_reserved_at_admission() {
        use etcd_shared::member_flags::reserved_env;
        let tls_modes = [
            "",
            "\nTLS:\n  static:\n    member:\n      peerSecret: p",
            "\nTLS:\n  static:\n    member:\n      serverSecret: s\n    operatorSecret: o",
            "\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o",
        ];
        let mut seen = std::collections::BTreeSet::new();
        for line in etcd_shared::version::LINES {
            for tls in tls_modes {
                let view = view_of(&format!("version: {}.{}.0{tls}", line.major, line.minor));
                for state in [InitialState::New, InitialState::Existing] {
                    let pod = member_pod(&view, &plan(&view, state));
                    let container = &pod.spec.as_ref().unwrap().containers[0];
                    for arg in args(&pod) {
                        let flag = arg
                            .strip_prefix("--")
                            .and_then(|a| a.split_once('=').map(|(f, _)| f))
                            .unwrap_or_else(|| panic!("{arg:?} is not --flag=value"));
                        // etcd's own rule, written out independently of the shared list.
                        let env = format!("ETCD_{}", flag.to_ascii_uppercase().replace('-', "_"));
                        assert!(
                            MemberFlag::from_env(&env).is_some() && reserved_env(&env).is_some(),
                            "{arg} ({env}) on {}.{} is not in etcd_shared::member_flags",
                            line.major,
                            line.minor
                        );
                        seen.insert(flag.to_string());
                    }
                    for var in container.env.as_ref().unwrap() {
                        assert!(
                            reserved_env(&var.name).is_some(),
                            "{} is not reserved",
                            var.name
                        );
                    }
                }
            }
        }
        // Every listed flag is one the builder really passes somewhere.
        let listed: std::collections::BTreeSet<String> = MemberFlag::ALL
            .iter()
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(seen, listed);
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
            ("3.4.45", false, "http 2381/health?exclude=NOSPACE"),
            ("3.4.45", true, "http 2381/health?exclude=NOSPACE"),
            ("3.5.35", false, "http 2381/health?exclude=NOSPACE"),
            ("3.6.16", false, "http 2381/health?exclude=NOSPACE"),
            ("3.7.3", true, "http 2381/health?exclude=NOSPACE"),
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
                    "http {}{}",
                    match h.port {
                        IntOrString::Int(p) => p,
                        _ => 0,
                    },
                    h.path.unwrap_or_default()
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

    /// Where a scraper finds each line's `/metrics`: the `metrics` port from 3.3 on (TLS or
    /// not), the plain client port on 3.2 (the annotation the chart's PodMonitor keys on), and
    /// nowhere without a client certificate (3.2 with client TLS).
    #[test]
    fn metrics_port_or_client_port_annotation_per_line() {
        for (version, tls, metrics_port, on_client_port) in [
            ("3.2.13", false, false, true),
            ("3.2.13", true, false, false),
            ("3.3.27", false, true, false),
            ("3.4.45", true, true, false),
            ("3.6.16", false, true, false),
            ("3.7.3", true, true, false),
        ] {
            let tls_spec = if tls {
                "\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o"
            } else {
                ""
            };
            let view = view_of(&format!("version: {version}{tls_spec}"));
            let pod = member_pod(&view, &plan(&view, InitialState::New));
            let annotated = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::ANNOTATION_METRICS_ON_CLIENT_PORT))
                .map(String::as_str);
            assert_eq!(
                annotated,
                on_client_port.then_some("true"),
                "{version} tls={tls}"
            );
            let ports = pod.spec.unwrap().containers[0].ports.clone().unwrap();
            assert_eq!(
                ports
                    .iter()
                    .any(|p| p.name.as_deref() == Some("metrics") && p.container_port == 2381),
                metrics_port,
                "{version} tls={tls}: {ports:?}"
            );
        }
    }

    /// `spec.pod.imagePullSecrets` reach every member pod, in order; without them the pod
    /// names none.
    #[test]
    fn member_pods_pull_with_the_clusters_secrets() {
        let view =
            view_of("version: 3.6.16\npod:\n  imagePullSecrets:\n  - name: quay\n  - name: mirror");
        let pod = member_pod(&view, &plan(&view, InitialState::New));
        assert_eq!(pull_secret_names(pod), ["quay", "mirror"]);
        let view = view_of("version: 3.6.16");
        let pod = member_pod(&view, &plan(&view, InitialState::New));
        assert_eq!(pod.spec.and_then(|s| s.image_pull_secrets), None);
    }

    /// The default member pod passes Pod Security `restricted`, on every line, plain and
    /// with TLS, on an emptyDir and on a claim: what a namespace labelled
    /// `pod-security.kubernetes.io/enforce=restricted` admits.
    #[test]
    fn the_default_member_pod_passes_pod_security_restricted() {
        use etcd_shared::admission::pod_security::restricted_violations;
        let tls = "\nTLS:\n  static:\n    member:\n      peerSecret: p\n      serverSecret: s\n    operatorSecret: o";
        let claim = "\npod:\n  persistentVolumeClaimSpec:\n    resources:\n      requests:\n        storage: 1Gi";
        for line in etcd_shared::version::LINES {
            for extra in ["", tls, claim] {
                let view = view_of(&format!("version: {}.{}.0{extra}", line.major, line.minor));
                let pod = member_pod(&view, &plan(&view, InitialState::New));
                let found = restricted_violations(&pod);
                assert!(
                    found.is_empty(),
                    "{}.{} {extra:?}: {found:#?}",
                    line.major,
                    line.minor
                );
            }
        }
        // The users' example, unchanged: 3.2.13 as non-root, group-owned volumes.
        let view = view_of("size: 3\nversion: 3.2.13");
        let pod = member_pod(&view, &plan(&view, InitialState::New));
        let spec = pod.spec.as_ref().unwrap();
        let context = spec.security_context.as_ref().unwrap();
        assert_eq!(context.run_as_non_root, Some(true));
        assert_eq!(context.run_as_user, Some(MEMBER_UID));
        assert_eq!(context.run_as_group, Some(MEMBER_UID));
        assert_eq!(context.fs_group, Some(MEMBER_UID));
        assert_eq!(
            context.fs_group_change_policy.as_deref(),
            Some("OnRootMismatch")
        );
        assert_eq!(
            context.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
            Some("RuntimeDefault")
        );
        let container = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(container.allow_privilege_escalation, Some(false));
        assert_eq!(
            container.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
    }

    /// Fields of `spec.pod.securityContext` win over the defaults one by one; asking for
    /// root (`runAsUser: 0` or `runAsNonRoot: false`) is the explicit opt-in for old images,
    /// and gives a pod that passes `baseline` (what the webhook enforces) but not
    /// `restricted`.
    #[test]
    fn the_users_security_context_wins_and_root_is_an_explicit_opt_in() {
        use etcd_shared::admission::pod_security::{baseline_violations, restricted_violations};
        let pod_of = |context: &str| {
            let view = view_of(&format!(
                "version: 3.6.16\npod:\n  securityContext:\n{context}"
            ));
            member_pod(&view, &plan(&view, InitialState::New))
        };
        let context = |pod: &Pod| pod.spec.as_ref().unwrap().security_context.clone().unwrap();

        // CoreOS' documented non-root example: kept as written, the rest defaulted.
        let coreos = pod_of("    runAsUser: 1000\n    fsGroup: 1000");
        let c = context(&coreos);
        assert_eq!((c.run_as_user, c.fs_group), (Some(1000), Some(1000)));
        assert_eq!(c.run_as_non_root, Some(true));
        assert!(restricted_violations(&coreos).is_empty());

        for opt_in in ["    runAsUser: 0", "    runAsNonRoot: false"] {
            let root = pod_of(opt_in);
            let c = context(&root);
            assert_ne!(c.run_as_non_root, Some(true), "{opt_in}");
            assert_eq!(c.run_as_user.filter(|u| *u != 0), None, "{opt_in}");
            assert_eq!(c.fs_group, None, "{opt_in}");
            assert_eq!(
                c.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
                Some("RuntimeDefault")
            );
            assert!(baseline_violations(&root).is_empty(), "{opt_in}");
            assert!(!restricted_violations(&root).is_empty(), "{opt_in}");
        }

        // A seccomp profile of the user's own replaces the default.
        let localhost =
            pod_of("    seccompProfile:\n      type: Localhost\n      localhostProfile: etcd.json");
        assert_eq!(
            context(&localhost).seccomp_profile.unwrap().type_,
            "Localhost"
        );
    }

    /// The restricted check itself refuses what it should: a pod without the defaults.
    #[test]
    fn the_restricted_check_refuses_a_bare_pod() {
        use etcd_shared::admission::pod_security::restricted_violations;
        let view = view_of("version: 3.6.16");
        let mut pod = member_pod(&view, &plan(&view, InitialState::New));
        let spec = pod.spec.as_mut().unwrap();
        spec.security_context = None;
        spec.containers[0].security_context = None;
        let fields: Vec<String> = restricted_violations(&pod)
            .into_iter()
            .map(|v| v.field)
            .collect();
        for want in [
            "spec.containers[0].securityContext.allowPrivilegeEscalation",
            "spec.containers[0].securityContext.runAsNonRoot",
            "spec.containers[0].securityContext.seccompProfile.type",
            "spec.containers[0].securityContext.capabilities.drop",
        ] {
            assert!(fields.iter().any(|f| f == want), "{want} in {fields:?}");
        }
    }
}
