//! The scratch member of a backup's verification (`spec.verify`): a short-lived pod, owned by
//! the EtcdBackup, that fetches one snapshot from the store (`restore fetch`, checking its
//! hash), restores it with etcd's own tool and serves it with etcd alone (no peers, clients on
//! the pod's IP), so that the controller can ask it `HashKV` and the key count at the
//! snapshot's revision. The controller deletes it once asked.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, Pod, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use etcd_shared::names;
use etcd_shared::types::StorageSource;

use super::OperatorImage;
use super::claim_pod::pod_name as claim_pod_name;
use super::pod::{
    ETCD_BINARY, container_security_context, field_env, pod_security_context, read_only_mount,
    secret_volume,
};
use super::seed::{
    CONTROLLER_BINARY, ETCDCTL_BINARY, ETCDUTL_BINARY, IDENTITY_DIR, RESTORED_DIR, store_source,
};

/// Where the scratch pod keeps the snapshot and the restored data.
const SCRATCH_DIR: &str = "/var/lib/etcd-scratch";
/// Its emptyDir.
const SCRATCH_VOLUME: &str = "scratch";
/// The identity's Secret volume, for an encrypted snapshot.
const IDENTITY_VOLUME: &str = "scratch-identity";
/// The scratch member's name (and its only peer URL, never listened on by another member).
const MEMBER: &str = "scratch";
/// The port the scratch member serves clients on.
pub const CLIENT_PORT: u16 = 2379;
/// `app.kubernetes.io/component` of scratch pods.
pub const COMPONENT: &str = "backup-scratch";

/// What a scratch pod is made of.
#[derive(Debug, Clone)]
pub struct ScratchPod {
    /// The EtcdBackup's name.
    pub backup: String,
    /// Its namespace.
    pub namespace: String,
    /// Its owner reference (the EtcdBackup).
    pub owner: OwnerReference,
    /// The operator's image (`restore fetch`).
    pub operator_image: OperatorImage,
    /// The etcd image of the snapshot's version (the cluster's repository).
    pub etcd_image: String,
    /// etcdutl is in the image (3.5+); `etcdctl snapshot restore` otherwise.
    pub etcdutl: bool,
    /// The store, with `path` the snapshot's BUCKET/KEY.
    pub source: StorageSource,
    /// The snapshot's SHA-256 recorded at upload, hex.
    pub sha256: String,
    /// The Secret with an age identity for an encrypted snapshot.
    pub identity_secret: Option<String>,
}

/// The name of the scratch pod of EtcdBackup `backup`.
pub fn pod_name(backup: &str) -> String {
    claim_pod_name(backup, "-scratch")
}

fn scratch_mount() -> VolumeMount {
    VolumeMount {
        name: SCRATCH_VOLUME.into(),
        mount_path: SCRATCH_DIR.into(),
        ..VolumeMount::default()
    }
}

/// The pod.
pub fn scratch_pod(spec: ScratchPod) -> Pod {
    let work = format!("{SCRATCH_DIR}/work");
    let data = format!("{SCRATCH_DIR}/data");
    let mut fetch_args = vec![
        "restore".to_string(),
        "fetch".into(),
        format!("--sha256={}", spec.sha256),
        format!("--work-dir={work}"),
        format!("--data-dir={data}"),
    ];
    let mut fetch_mounts = vec![scratch_mount()];
    let mut volumes = vec![Volume {
        name: SCRATCH_VOLUME.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }];
    volumes.extend(store_source(
        &spec.source,
        &mut fetch_args,
        &mut fetch_mounts,
    ));
    if let Some(identity) = &spec.identity_secret {
        fetch_args.push(format!(
            "--identity-file={IDENTITY_DIR}/{}",
            crate::snapshot::encryption::IDENTITY_KEY
        ));
        fetch_mounts.push(read_only_mount(IDENTITY_VOLUME, IDENTITY_DIR));
        volumes.push(secret_volume(IDENTITY_VOLUME, identity, 0o440));
    }
    // The pod's own address only: a node's pods may share its network.
    let pod_ip = field_env("POD_IP", "status.podIP");
    let peer = "http://$(POD_IP):2380";
    let client = format!("http://$(POD_IP):{CLIENT_PORT}");
    let (tool, env) = if spec.etcdutl {
        (ETCDUTL_BINARY, vec![pod_ip.clone()])
    } else {
        let api = EnvVar {
            name: "ETCDCTL_API".into(),
            value: Some("3".into()),
            ..EnvVar::default()
        };
        (ETCDCTL_BINARY, vec![pod_ip.clone(), api])
    };
    let restored = format!("{work}/{RESTORED_DIR}");
    let init = vec![
        Container {
            name: "fetch".into(),
            image: Some(spec.operator_image.reference.clone()),
            command: Some(vec![CONTROLLER_BINARY.into()]),
            args: Some(fetch_args),
            volume_mounts: Some(fetch_mounts),
            security_context: Some(container_security_context()),
            ..Container::default()
        },
        Container {
            name: "restore".into(),
            image: Some(spec.etcd_image.clone()),
            command: Some(vec![tool.into()]),
            args: Some(vec![
                "snapshot".into(),
                "restore".into(),
                format!("{work}/snapshot.db"),
                format!("--name={MEMBER}"),
                format!("--data-dir={restored}"),
                format!("--initial-cluster={MEMBER}={peer}"),
                format!("--initial-advertise-peer-urls={peer}"),
            ]),
            env: Some(env),
            volume_mounts: Some(vec![scratch_mount()]),
            security_context: Some(container_security_context()),
            ..Container::default()
        },
    ];
    let etcd = Container {
        name: "etcd".into(),
        image: Some(spec.etcd_image),
        command: Some(vec![ETCD_BINARY.into()]),
        args: Some(vec![
            format!("--name={MEMBER}"),
            format!("--data-dir={restored}"),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={MEMBER}={peer}"),
        ]),
        env: Some(vec![pod_ip]),
        volume_mounts: Some(vec![scratch_mount()]),
        security_context: Some(container_security_context()),
        ..Container::default()
    };
    let labels = BTreeMap::from([
        (
            names::LABEL_MANAGED_BY.to_string(),
            names::MANAGED_BY.to_string(),
        ),
        (names::LABEL_COMPONENT.to_string(), COMPONENT.to_string()),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(pod_name(&spec.backup)),
            namespace: Some(spec.namespace),
            labels: Some(labels),
            owner_references: Some(vec![spec.owner]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            image_pull_secrets: super::with_pull_secrets(
                None,
                spec.operator_image.pull_secrets.iter().map(String::as_str),
            ),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(pod_security_context(None)),
            init_containers: Some(init),
            containers: vec![etcd],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}
