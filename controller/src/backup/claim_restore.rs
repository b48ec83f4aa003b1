//! The controller's side of the check of a PVC snapshot before a restore touches the cluster.
//! The controller cannot mount the claim, so the restore's verify step is one pod,
//! `NAME-verify`, owned by the EtcdRestore, mounting the claim read-only and running
//! `etcd-controller backup verify`: it reads the file through and checks etcd's hash and the
//! hash its metadata recorded. Its report is what the S3 check gives (path, size, hash,
//! revision, version); the pod is deleted once read. A failed or timed-out check is an
//! error: the cluster is untouched, and the step is retried with backoff (a new pod).
//!
//! The seed member then copies the file from the claim (mounted read-only) and checks it
//! against the hash recorded here before etcd's tool restores it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Resource as _, ResourceExt as _};

use etcd_shared::types::EtcdRestore;

use super::error::BackupError;
use super::one_shot_pod::look;
use crate::builders::OperatorImage;
use crate::builders::claim_pod::{self, ClaimPod, in_claim};
use crate::idempotent;
use crate::snapshot::cluster::CheckedSource;

/// How often a running verify pod is looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// Longest a check may take (beyond the time to start the pod).
pub const VERIFY_TIMEOUT: Duration = Duration::from_secs(600);

/// The name of the verify pod of EtcdRestore `restore`.
pub fn pod_name(restore: &str) -> String {
    claim_pod::pod_name(restore, "-verify")
}

/// One step of the check: `None` while the pod is created or runs, the check once it passed.
pub(crate) async fn verify_step(
    client: &kube::Client,
    image: &OperatorImage,
    restore: &EtcdRestore,
) -> Result<Option<CheckedSource>, BackupError> {
    let pvc = restore
        .spec
        .source
        .pvc
        .as_ref()
        .ok_or(BackupError::NoSource)?;
    let namespace = restore.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let name = pod_name(&restore.name_any());
    let pod = claim_pod::claim_pod(ClaimPod {
        name: name.clone(),
        namespace: namespace.clone(),
        owner: restore.controller_owner_ref(&()).unwrap_or_default(),
        component: "restore-verify",
        image: image.clone(),
        claim: pvc.claim_name.clone(),
        read_only: true,
        args: vec![
            "backup".into(),
            "verify".into(),
            format!("--file={}", in_claim(&pvc.path)),
        ],
        tls_secret: None,
        file: pvc.path.clone(),
    });
    let create = async { Ok(idempotent::create(&pods, &pod, format!("pod {name}")).await?) };
    let Some(outcome) = look(&pods, &name, VERIFY_TIMEOUT, Timestamp::now(), create).await? else {
        return Ok(None);
    };
    let report = outcome?.1;
    Ok(Some(CheckedSource {
        path: format!("{}/{}", pvc.claim_name, pvc.path),
        size: report.size.unwrap_or_default(),
        sha256: report.sha256.unwrap_or_default(),
        revision: report.revision,
        etcd_version: report.etcd_version,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_pods_are_named_after_the_restore() {
        assert_eq!(pod_name("r1"), "r1-verify");
        assert!(pod_name(&"x".repeat(253)).len() <= 253);
    }
}
