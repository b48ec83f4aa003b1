//! The controller's side of a backup of storage type PVC. The controller cannot mount a
//! claim, so a due backup is one pod, `NAME-backup`, owned by the EtcdBackup:
//!
//! 1. no pod yet: the controller finds the cluster and its member with the highest revision
//!    (as for S3), names the file as for S3 ([`keys::snapshot_key`]: the path, or
//!    `PATH_v<revision>_<time>` for a periodic backup) and creates the pod, which streams the
//!    snapshot from that member into the claim (`etcd-controller backup save`);
//! 2. the pod runs: the controller looks again every [`POLL`]; past the backup's timeout
//!    (plus the start grace of [`one_shot_pod`](super::one_shot_pod), whose lifecycle the pod
//!    follows) the pod is deleted and the backup fails with `Timeout`;
//! 3. the pod finished: its report becomes the outcome the reconciler records as for S3
//!    (status, Event, metrics), and the pod is deleted.
//!
//! One name per EtcdBackup: a reconcile never leaves more than one pod for it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::{Api, Resource as _, ResourceExt as _};

use etcd_shared::types::EtcdBackup;

use super::config::BackupConfig;
use super::error::BackupError;
use super::one_shot_pod::look;
use super::schedule;
use crate::builders::claim_pod::{self, ANNOTATION_FILE, ClaimPod, TLS_DIR, in_claim};
use crate::idempotent;
use crate::in_pod::pod_report::PodReport;
use crate::snapshot::cluster::{Success, member_access, most_advanced_member, target};
use crate::snapshot::keys;

/// How often a running backup pod is looked at.
pub const POLL: Duration = Duration::from_secs(2);

/// Where a PVC backup stands.
#[derive(Debug)]
pub enum Progress {
    /// Its pod was created or is running.
    Waiting,
    /// Its pod finished (and was deleted): the outcome to record.
    Finished(Result<Success, BackupError>),
}

/// The name of the backup pod of EtcdBackup `backup` (a DNS-1123 subdomain).
pub fn pod_name(backup: &str) -> String {
    claim_pod::pod_name(backup, "-backup")
}

/// The success a backup pod's report stands for.
pub fn success(claim: &str, file: &str, report: &PodReport, took: Duration) -> Success {
    Success {
        path: format!("{claim}/{file}"),
        etcd_version: report.etcd_version.clone().unwrap_or_default(),
        revision: report.revision.unwrap_or_default(),
        size: report.size.unwrap_or_default(),
        sha256: report.sha256.clone().unwrap_or_default(),
        took,
        source: None,
    }
}

/// One step of a due PVC backup (see the module docs).
pub(crate) async fn step(
    backup: &EtcdBackup,
    client: &kube::Client,
    config: &BackupConfig,
    now: Timestamp,
) -> Result<Progress, BackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let name = pod_name(&backup.name_any());
    let limit = schedule::timeout(&backup.spec);
    let create = start(backup, client, config, &pods, &name, now);
    let Some(outcome) = look(&pods, &name, limit, now, create).await? else {
        return Ok(Progress::Waiting);
    };
    Ok(Progress::Finished(outcome.map(|(pod, report)| {
        let pvc = backup.spec.source.pvc.as_ref();
        let claim = pvc.map_or("", |p| p.claim_name.as_str());
        let file = pod
            .annotations()
            .get(ANNOTATION_FILE)
            .map_or("", String::as_str);
        let took = (pod.metadata.creation_timestamp.as_ref())
            .and_then(|c| Duration::try_from(now.duration_since(c.0)).ok())
            .unwrap_or_default();
        success(claim, file, &report, took)
    })))
}

/// Creates the backup pod: the cluster's most advanced member, the file named for its revision.
async fn start(
    backup: &EtcdBackup,
    client: &kube::Client,
    config: &BackupConfig,
    pods: &Api<Pod>,
    name: &str,
    now: Timestamp,
) -> Result<(), BackupError> {
    let spec = &backup.spec;
    let pvc = spec.source.pvc.as_ref().ok_or(BackupError::NoSource)?;
    let image = config.image.clone().ok_or(BackupError::NoImage)?;
    // An object read from the API has a UID; without one the API server refuses the pod.
    let owner = backup.controller_owner_ref(&()).unwrap_or_default();
    let (view, tls_secret) = target(client, &config.policy, backup).await?;
    let access = member_access(client, &view, tls_secret.as_deref(), config.etcd_timeout).await?;
    let (endpoint, member, status) = most_advanced_member(client, &view, &access).await?;
    let periodic = keys::is_periodic(spec);
    let file = keys::snapshot_key(&pvc.path, periodic, status.revision, now);
    let limit = schedule::timeout(spec);
    let mut args = vec![
        "backup".to_string(),
        "save".into(),
        format!("--endpoint={endpoint}"),
        format!("--file={}", in_claim(&file)),
        format!("--etcd-version={}", status.version),
        format!("--revision={}", status.revision),
        format!("--cluster={}/{}", view.namespace, view.name),
        format!("--member={member}"),
        format!("--timeout-seconds={}", limit.as_secs()),
    ];
    if periodic {
        let max = spec.backup_policy.as_ref().map_or(0, |p| p.max_backups);
        args.push(format!("--prefix={}", in_claim(&pvc.path)));
        args.push(format!("--max-backups={max}"));
        if let Some(r) = &spec.retention {
            for (flag, n) in [
                ("keep-last", r.keep_last),
                ("keep-hourly", r.keep_hourly),
                ("keep-daily", r.keep_daily),
                ("keep-weekly", r.keep_weekly),
                ("keep-monthly", r.keep_monthly),
            ] {
                if n > 0 {
                    args.push(format!("--{flag}={n}"));
                }
            }
            if !spec.time_zone.is_empty() {
                args.push(format!("--time-zone={}", spec.time_zone));
            }
        }
    }
    if tls_secret.is_some() {
        args.push(format!("--tls-dir={TLS_DIR}"));
        args.push(format!("--server-name={}", view.tls_server_name()));
    }
    let pod = claim_pod::claim_pod(ClaimPod {
        name: name.to_string(),
        namespace: view.namespace.clone(),
        owner,
        component: "backup",
        image,
        claim: pvc.claim_name.clone(),
        read_only: false,
        args,
        tls_secret,
        file,
    });
    // One created by a reconcile before this one is the backup's pod: one pod per backup.
    Ok(idempotent::create(pods, &pod, format!("pod {name}")).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_names_fit_and_end_well() {
        assert_eq!(pod_name("nightly"), "nightly-backup");
        let long = format!("{}.{}", "a".repeat(245), "b".repeat(7));
        let name = pod_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(name.ends_with("a-backup"), "{name}");
    }

    #[test]
    fn a_report_becomes_the_success_the_status_records() {
        let report = PodReport {
            ok: true,
            size: Some(1056),
            sha256: Some("ab".repeat(32)),
            revision: Some(12),
            etcd_version: Some("3.6.16".into()),
            ..Default::default()
        };
        let s = success(
            "backups",
            "demo/s.db_v12_2026-01-01-00:00:00",
            &report,
            Duration::from_secs(3),
        );
        assert_eq!(s.path, "backups/demo/s.db_v12_2026-01-01-00:00:00");
        assert_eq!((s.revision, s.size), (12, 1056));
        assert_eq!(s.etcd_version, "3.6.16");
    }
}
