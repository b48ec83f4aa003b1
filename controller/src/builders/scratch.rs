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
            etcd_shared::names::IDENTITY_KEY
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

#[cfg(test)]
mod tests {
    use etcd_shared::types::storage::S3Source;

    use super::*;

    fn pod(etcdutl: bool, identity: Option<&str>) -> Pod {
        scratch_pod(ScratchPod {
            backup: "nightly".into(),
            namespace: "ns".into(),
            owner: OwnerReference::default(),
            operator_image: OperatorImage::new("example.com/etcd-operator:1"),
            etcd_image: "quay.io/coreos/etcd:v3.6.16".into(),
            etcdutl,
            source: StorageSource {
                s3: Some(S3Source {
                    path: "b/k_v9".into(),
                    aws_secret: "aws".into(),
                    endpoint: "http://s3:9000".into(),
                    force_path_style: true,
                }),
                ..StorageSource::default()
            },
            sha256: "ab".repeat(32),
            identity_secret: identity.map(String::from),
        })
    }

    fn args(c: &Container) -> Vec<String> {
        c.args.clone().unwrap_or_default()
    }

    #[test]
    fn a_scratch_pod_fetches_restores_and_serves_the_snapshot_alone() {
        let p = pod(true, None);
        assert_eq!(p.metadata.name.as_deref(), Some("nightly-scratch"));
        let labels = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            labels.get(names::LABEL_COMPONENT).map(String::as_str),
            Some(COMPONENT)
        );
        assert!(
            !labels.contains_key("etcd_cluster"),
            "never a member: {labels:?}"
        );
        let spec = p.spec.expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        let init = spec.init_containers.expect("init");
        let fetch = args(&init[0]);
        for want in [
            "restore",
            "fetch",
            "--path=b/k_v9",
            "--storage-type=S3",
            "--force-path-style",
        ] {
            assert!(fetch.iter().any(|a| a == want), "{want} in {fetch:?}");
        }
        assert!(fetch.contains(&format!("--sha256={}", "ab".repeat(32))));
        assert_eq!(init[1].command, Some(vec![ETCDUTL_BINARY.to_string()]));
        let etcd = args(&spec.containers[0]);
        assert!(
            etcd.contains(&"--listen-client-urls=http://$(POD_IP):2379".to_string()),
            "{etcd:?}"
        );
        assert!(
            etcd.iter().all(|a| !a.contains("initial-cluster-state")),
            "{etcd:?}"
        );
        let volumes = spec.volumes.expect("volumes");
        assert!(volumes.iter().any(|v| v.empty_dir.is_some()));
        assert!(
            volumes
                .iter()
                .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some("aws"))
        );
    }

    #[test]
    fn an_old_line_restores_with_etcdctl_and_an_encrypted_snapshot_gets_its_identity() {
        let p = pod(false, Some("backup-identity"));
        let spec = p.spec.expect("spec");
        let init = spec.init_containers.expect("init");
        assert_eq!(init[1].command, Some(vec![ETCDCTL_BINARY.to_string()]));
        let env = init[1].env.clone().unwrap_or_default();
        assert!(env.iter().any(|e| e.name == "ETCDCTL_API"), "{env:?}");
        assert!(
            args(&init[0])
                .iter()
                .any(|a| a.starts_with("--identity-file="))
        );
        let volumes = spec.volumes.expect("volumes");
        assert!(
            volumes
                .iter()
                .any(|v| v.secret.as_ref().and_then(|s| s.secret_name.as_deref())
                    == Some("backup-identity"))
        );
    }
}
