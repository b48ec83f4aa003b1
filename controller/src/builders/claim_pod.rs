//! The short-lived pods that mount a PersistentVolumeClaim for the controller (storage type
//! `PVC`): the operator's image running `etcd-controller backup save|verify` (see
//! [`crate::in_pod::claim_command`]), one container, `restartPolicy: Never`, owned by the
//! EtcdBackup or EtcdRestore they work for (deleted with it), no service-account token, the
//! restricted security context of the members, the report in the termination message.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, PersistentVolumeClaimVolumeSource, Pod, PodSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use etcd_shared::names;

use super::OperatorImage;
use super::pod::{
    container_security_context, pod_security_context, read_only_mount, secret_volume,
};
use super::seed::CONTROLLER_BINARY;

/// Kubernetes' default termination message path, where the pod's command writes its report.
pub const TERMINATION_LOG: &str = "/dev/termination-log";
/// Where the claim is mounted in the pod.
pub const CLAIM_MOUNT: &str = "/var/lib/etcd-backup/claim";
/// Where the client certificate is mounted, for a cluster with client TLS.
pub const TLS_DIR: &str = "/etc/etcd-backup/tls";
/// Annotation on a backup pod: the snapshot file it writes, relative to the claim.
pub const ANNOTATION_FILE: &str = "etcd.database.coreos.com/snapshot-file";

const CLAIM_VOLUME: &str = "claim";
const TLS_VOLUME: &str = "client-tls";

/// What a claim pod is made of.
#[derive(Debug, Clone)]
pub struct ClaimPod {
    /// The pod's name.
    pub name: String,
    /// Its namespace (the claim's and the owner's).
    pub namespace: String,
    /// The EtcdBackup or EtcdRestore it works for.
    pub owner: OwnerReference,
    /// `app.kubernetes.io/component`: `backup` or `restore-verify`.
    pub component: &'static str,
    /// The operator's image, and the Secrets the pod pulls it with.
    pub image: OperatorImage,
    /// The claim.
    pub claim: String,
    /// Mounted read-only (a restore's check).
    pub read_only: bool,
    /// `backup save` or `backup verify` and their flags (paths under [`CLAIM_MOUNT`]).
    pub args: Vec<String>,
    /// A Secret with a client certificate (CoreOS' layout), mounted at [`TLS_DIR`].
    pub tls_secret: Option<String>,
    /// The snapshot file, relative to the claim (annotation [`ANNOTATION_FILE`]).
    pub file: String,
}

/// The name of the claim pod of the EtcdBackup or EtcdRestore `owner`: `owner` and `suffix`
/// (`-backup`, `-verify`), cut to fit a DNS-1123 subdomain.
pub fn pod_name(owner: &str, suffix: &str) -> String {
    let mut base = owner.to_string();
    base.truncate(253 - suffix.len());
    format!("{}{suffix}", base.trim_end_matches(['-', '.']))
}

/// The path in the pod of `relative` (a checked `pvc.path`, or a name made from one).
pub fn in_claim(relative: &str) -> String {
    format!("{CLAIM_MOUNT}/{relative}")
}

/// The pod.
pub fn claim_pod(spec: ClaimPod) -> Pod {
    let mut mounts = vec![VolumeMount {
        name: CLAIM_VOLUME.into(),
        mount_path: CLAIM_MOUNT.into(),
        read_only: spec.read_only.then_some(true),
        ..VolumeMount::default()
    }];
    let mut volumes = vec![Volume {
        name: CLAIM_VOLUME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: spec.claim.clone(),
            read_only: spec.read_only.then_some(true),
        }),
        ..Volume::default()
    }];
    if let Some(secret) = &spec.tls_secret {
        mounts.push(read_only_mount(TLS_VOLUME, TLS_DIR));
        volumes.push(secret_volume(TLS_VOLUME, secret, 0o440));
    }
    let mut args = spec.args;
    args.push(format!("--termination-message-path={TERMINATION_LOG}"));
    let labels = BTreeMap::from([
        (
            names::LABEL_MANAGED_BY.to_string(),
            names::MANAGED_BY.to_string(),
        ),
        (
            names::LABEL_COMPONENT.to_string(),
            spec.component.to_string(),
        ),
    ]);
    Pod {
        metadata: ObjectMeta {
            name: Some(spec.name),
            namespace: Some(spec.namespace),
            labels: Some(labels),
            annotations: Some(BTreeMap::from([(ANNOTATION_FILE.to_string(), spec.file)])),
            owner_references: Some(vec![spec.owner]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            restart_policy: Some("Never".into()),
            image_pull_secrets: super::with_pull_secrets(
                None,
                spec.image.pull_secrets.iter().map(String::as_str),
            ),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            security_context: Some(pod_security_context(None)),
            containers: vec![Container {
                name: spec.component.into(),
                image: Some(spec.image.reference.clone()),
                command: Some(vec![CONTROLLER_BINARY.into()]),
                args: Some(args),
                volume_mounts: Some(mounts),
                termination_message_path: Some(TERMINATION_LOG.into()),
                termination_message_policy: Some("File".into()),
                security_context: Some(container_security_context()),
                ..Container::default()
            }],
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(read_only: bool, tls: Option<&str>) -> ClaimPod {
        ClaimPod {
            name: "nightly-backup".into(),
            namespace: "ns1".into(),
            owner: OwnerReference {
                api_version: "etcd.database.coreos.com/v1beta2".into(),
                kind: "EtcdBackup".into(),
                name: "nightly".into(),
                uid: "u1".into(),
                controller: Some(true),
                ..OwnerReference::default()
            },
            component: "backup",
            image: OperatorImage {
                reference: "registry.example/etcd-controller:1".into(),
                pull_secrets: vec!["registry-credentials".into()],
            },
            claim: "backups".into(),
            read_only,
            args: vec![
                "backup".into(),
                "save".into(),
                format!("--file={}", in_claim("d/s.db")),
            ],
            tls_secret: tls.map(str::to_string),
            file: "d/s.db".into(),
        }
    }

    #[test]
    fn a_backup_pod_mounts_the_claim_and_reports_in_its_termination_message() {
        let pod = claim_pod(spec(false, Some("client-tls")));
        let meta = &pod.metadata;
        assert_eq!(meta.owner_references.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            meta.annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_FILE))
                .map(String::as_str),
            Some("d/s.db")
        );
        let spec = pod.spec.expect("spec");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
        assert_eq!(spec.automount_service_account_token, Some(false));
        // The operator's image is pulled with the controller's pull secrets.
        let pull: Vec<&str> = spec
            .image_pull_secrets
            .iter()
            .flatten()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(pull, ["registry-credentials"]);
        let c = &spec.containers[0];
        let args = c.args.clone().unwrap_or_default().join(" ");
        assert!(
            args.starts_with("backup save --file=/var/lib/etcd-backup/claim/d/s.db"),
            "{args}"
        );
        assert!(
            args.ends_with("--termination-message-path=/dev/termination-log"),
            "{args}"
        );
        assert_eq!(c.termination_message_path.as_deref(), Some(TERMINATION_LOG));
        assert_eq!(c.security_context, Some(container_security_context()));
        let volumes = spec.volumes.unwrap_or_default();
        let claim = volumes[0].persistent_volume_claim.as_ref().expect("claim");
        assert_eq!(claim.claim_name, "backups");
        assert_eq!(claim.read_only, None);
        assert!(
            volumes[1]
                .secret
                .as_ref()
                .is_some_and(|s| s.secret_name.as_deref() == Some("client-tls"))
        );
    }

    #[test]
    fn a_verify_pod_mounts_the_claim_read_only() {
        let pod = claim_pod(spec(true, None));
        let spec = pod.spec.expect("spec");
        let volumes = spec.volumes.unwrap_or_default();
        assert_eq!(volumes.len(), 1);
        assert_eq!(
            volumes[0]
                .persistent_volume_claim
                .as_ref()
                .and_then(|c| c.read_only),
            Some(true)
        );
        let mounts = spec.containers[0].volume_mounts.clone().unwrap_or_default();
        assert_eq!(mounts[0].read_only, Some(true));
    }
}
