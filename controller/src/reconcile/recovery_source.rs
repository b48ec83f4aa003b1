//! Where a recovery from permanent quorum loss takes its data (issue 24), checked before
//! anything of the cluster is touched:
//!
//! - [`verify_member`]: the surviving member's snapshot, streamed over etcd's Snapshot RPC and
//!   checked against etcd's hash (every line serves it without quorum);
//! - [`newest_backup`]: when no member's data survives, the newest snapshot of the cluster
//!   among its safety backups (`status.lastSafetyBackup`) and its EtcdBackups' objects (S3, ABS,
//!   GCS; every periodic snapshot of each), read through and checked as an EtcdRestore checks
//!   one; a damaged or unreadable one is skipped for the next newest, and said. An encrypted
//!   one is decrypted with its EtcdBackup's `spec.encryption.identitySecret`; without one it
//!   is skipped, and said. A PersistentVolumeClaim backup (`storageType: PVC`) is a candidate by
//!   what its EtcdBackup recorded of its latest snapshot (path, SHA-256, revision, version):
//!   reading a claim takes a pod, so its bytes are checked by the seed member's fetch, against
//!   that SHA-256 and etcd's hash, before the seed member starts (older snapshots in the claim
//!   are not searched).

use futures::StreamExt as _;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};

use etcd_shared::endpoints::cluster_of_endpoints;
use etcd_shared::types::storage::{PVC_STORAGE_TYPE, StorageSource};
use etcd_shared::types::{EtcdBackup, EtcdClusterStatus, RestoreSeed};

use crate::error::Error;
use crate::etcd::EtcdAccess;
use crate::snapshot::cluster::{credentials, identities, lines_fit};
use crate::snapshot::error::SnapshotError;
use crate::snapshot::integrity::{CheckedSnapshot, SnapshotHasher};
use crate::snapshot::keys;
use crate::snapshot::store::{self, StoreLocation, StoreTimeouts};
use crate::snapshot::transfer;
use crate::view::ClusterView;

/// Streams the snapshot of the member at `endpoint` and checks etcd's hash at its end; nothing
/// is kept.
pub async fn verify_member(access: &EtcdAccess, endpoint: &str) -> Result<CheckedSnapshot, Error> {
    let stream = access
        .snapshot(endpoint, crate::snapshot::MEMBER_SNAPSHOT_TIMEOUT)
        .await?;
    let mut stream = std::pin::pin!(stream);
    let mut hasher = SnapshotHasher::new();
    while let Some(chunk) = stream.next().await {
        hasher.update(&chunk?);
    }
    hasher.finish().map_err(|e| Error::SnapshotCheck {
        endpoint: endpoint.to_string(),
        reason: e.to_string(),
    })
}

/// A snapshot of the cluster kept in an object store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// When it was taken, as periodic keys write times (sorts as time does).
    pub time: String,
    /// The storage type (`S3`, `ABS`, `GCS`).
    pub storage_type: String,
    /// Its source, with the path of this very object.
    pub source: StorageSource,
    /// What it is, for messages: `EtcdBackup NAME` or `safety backup before CHANGE`.
    pub origin: String,
    /// The Secret with the identity that decrypts it, blank when none is named.
    pub identity_secret: String,
    /// For a snapshot in a claim: what its EtcdBackup recorded of it (checked at the fetch).
    pub recorded: Option<Recorded>,
}

/// What an EtcdBackup recorded of a snapshot it wrote in a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Its etcd revision.
    pub revision: Option<i64>,
    /// The etcd version it was taken from.
    pub etcd_version: Option<String>,
}

/// The latest snapshot a PVC EtcdBackup recorded (`status.lastBackupPath` is `CLAIM/FILE`), as
/// a candidate; `None` without a successful one with its SHA-256, or in another claim.
pub fn claim_candidate(backup: &EtcdBackup) -> Option<Candidate> {
    let pvc = backup.spec.source.pvc.as_ref()?;
    let status = backup.status.as_ref()?;
    let (claim, file) = status.last_backup_path.as_deref()?.split_once('/')?;
    let sha256 = status
        .last_backup_sha256
        .clone()
        .filter(|s| !s.is_empty())?;
    if claim != pvc.claim_name || file.is_empty() {
        return None;
    }
    Some(Candidate {
        time: status
            .last_success_date
            .as_ref()
            .map_or_else(String::new, |t| keys::sortable_time(t.0)),
        storage_type: PVC_STORAGE_TYPE.to_string(),
        source: StorageSource {
            pvc: Some(etcd_shared::types::PvcSource {
                claim_name: claim.to_string(),
                path: file.to_string(),
            }),
            ..StorageSource::default()
        },
        origin: format!("EtcdBackup {} (claim {claim})", backup.name_any()),
        identity_secret: String::new(),
        recorded: Some(Recorded {
            sha256,
            revision: status.etcd_revision,
            etcd_version: status.etcd_version.clone(),
        }),
    })
}

/// `source` (of `storage_type`) with its path set to `BUCKET/key`.
fn at_key(storage_type: &str, source: &StorageSource, bucket: &str, key: &str) -> StorageSource {
    let mut only = source.only(storage_type).unwrap_or_default();
    let path = format!("{bucket}/{key}");
    if let Some(s3) = only.s3.as_mut() {
        s3.path = path.clone();
    }
    if let Some(abs) = only.abs.as_mut() {
        abs.path = path.clone();
    }
    if let Some(gcs) = only.gcs.as_mut() {
        gcs.path = path;
    }
    only
}

/// Every snapshot of the cluster its safety backups and EtcdBackups hold, newest first.
pub async fn candidates(
    client: &kube::Client,
    view: &ClusterView,
    status: Option<&EtcdClusterStatus>,
    timeouts: StoreTimeouts,
) -> Result<(Vec<Candidate>, Vec<String>), SnapshotError> {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    if let (Some(spec), Some(record)) = (
        view.safety_backup.as_ref(),
        status.and_then(|s| s.last_safety_backup.as_ref()),
    ) && let Some((bucket, key)) = record.path.split_once('/')
    {
        found.push(Candidate {
            time: record
                .time
                .as_ref()
                .map_or_else(String::new, |t| keys::sortable_time(t.0)),
            storage_type: spec.storage_type.clone(),
            source: at_key(&spec.storage_type, &spec.source, bucket, key),
            origin: format!("safety backup before {}", record.before),
            identity_secret: String::new(),
            recorded: None,
        });
    }
    let backups: Api<EtcdBackup> = Api::namespaced(client.clone(), &view.namespace);
    let listed = backups
        .list(&ListParams::default())
        .await
        .map_err(Error::kube("list EtcdBackups"))?;
    for backup in listed.items {
        let spec = &backup.spec;
        let ours = cluster_of_endpoints(&spec.etcd_endpoints, &view.namespace)
            .is_ok_and(|c| c == view.name);
        if !ours {
            continue;
        }
        if spec.storage_type == PVC_STORAGE_TYPE {
            found.extend(claim_candidate(&backup));
            continue;
        }
        let origin = format!("EtcdBackup {}", backup.name_any());
        let listing = async {
            let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
            let credentials = credentials(client, &view.namespace, &location).await?;
            let bucket = store::open(&location, &credentials, timeouts)?;
            let keys = store::keys_beside(bucket.as_ref(), &location.key)
                .await
                .map_err(transfer::TransferError::from)?;
            Ok::<_, SnapshotError>((location, keys))
        }
        .await;
        let (location, keys) = match listing {
            Ok(listed) => listed,
            Err(e) => {
                skipped.push(format!("{origin}: {e}"));
                continue;
            }
        };
        let mut add = |time: String, key: &str| {
            found.push(Candidate {
                time,
                storage_type: spec.storage_type.clone(),
                source: at_key(&spec.storage_type, &spec.source, &location.bucket, key),
                origin: origin.clone(),
                identity_secret: spec
                    .encryption
                    .as_ref()
                    .map(|e| e.identity_secret.clone())
                    .unwrap_or_default(),
                recorded: None,
            });
        };
        if keys::is_periodic(spec) {
            for (time, key) in keys::periodic_snapshots(&location.key, &keys) {
                add(time, &key);
            }
        } else if keys.contains(&location.key) {
            let time = backup
                .status
                .as_ref()
                .and_then(|s| s.last_success_date.as_ref())
                .map_or_else(String::new, |t| keys::sortable_time(t.0));
            add(time, &location.key);
        }
    }
    found.sort_by(|a, b| b.time.cmp(&a.time));
    Ok((found, skipped))
}

/// The newest snapshot of the cluster that reads through and checks (and whose etcd line the
/// cluster's can restore), as the seed of the recovered cluster; with what was skipped and why.
pub async fn newest_backup(
    client: &kube::Client,
    view: &ClusterView,
    status: Option<&EtcdClusterStatus>,
) -> Result<(RestoreSeed, String, Vec<String>), SnapshotError> {
    let timeouts = StoreTimeouts::default();
    let (candidates, mut skipped) = candidates(client, view, status, timeouts).await?;
    for candidate in candidates {
        if let Some(recorded) = &candidate.recorded {
            // In a claim: its bytes are checked by the seed's fetch; the line is checked here.
            match lines_fit(recorded.etcd_version.as_deref(), &view.version) {
                Ok(()) => {
                    let seed = RestoreSeed {
                        restore: format!("recovery of {}", view.name),
                        source: candidate.source.clone(),
                        sha256: recorded.sha256.clone(),
                        revision: recorded.revision,
                        etcd_version: recorded.etcd_version.clone(),
                        identity_secret: String::new(),
                    };
                    return Ok((seed, candidate.origin.clone(), skipped));
                }
                Err(e) => {
                    skipped.push(format!("{} ({}): {e}", candidate.origin, candidate.time));
                    continue;
                }
            }
        }
        let checked = async {
            let location = StoreLocation::from_source(&candidate.storage_type, &candidate.source)?;
            let credentials = credentials(client, &view.namespace, &location).await?;
            let bucket = store::open(&location, &credentials, timeouts)?;
            let identities = match candidate.identity_secret.as_str() {
                "" => None,
                name => Some(identities(client, &view.namespace, name).await?),
            };
            let (checked, info) =
                transfer::verify(&bucket, &location.key, None, identities.as_ref()).await?;
            lines_fit(info.etcd_version.as_deref(), &view.version)
                .map_err(SnapshotError::invalid(&view.name))?;
            Ok::<_, SnapshotError>((location.display(&location.key), checked, info))
        }
        .await;
        match checked {
            Ok((path, checked, info)) => {
                let seed = RestoreSeed {
                    restore: format!("recovery of {}", view.name),
                    source: candidate.source,
                    sha256: checked.sha256,
                    revision: info.revision,
                    etcd_version: info.etcd_version,
                    identity_secret: candidate.identity_secret,
                };
                return Ok((seed, format!("{} ({path})", candidate.origin), skipped));
            }
            Err(e) => skipped.push(format!("{} ({}): {e}", candidate.origin, candidate.time)),
        }
    }
    Err(SnapshotError::NoSnapshot(if skipped.is_empty() {
        "the cluster has no safety backup and no EtcdBackup with a snapshot".into()
    } else {
        format!("none checks: {}", skipped.join("; "))
    }))
}

/// The time a recovery record keeps: now.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pvc_backup(path: Option<&str>, sha: Option<&str>) -> EtcdBackup {
        let mut backup: EtcdBackup = serde_yaml::from_str(
            "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdBackup\nmetadata:\n  name: nightly\nspec:\n  etcdEndpoints: [\"http://demo-client:2379\"]\n  storageType: PVC\n  pvc:\n    claimName: backups\n    path: demo/s.db\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        backup.status = Some(etcd_shared::types::EtcdBackupStatus {
            succeeded: true,
            last_backup_path: path.map(str::to_string),
            last_backup_sha256: sha.map(str::to_string),
            etcd_revision: Some(42),
            etcd_version: Some("3.6.16".into()),
            ..Default::default()
        });
        backup
    }

    #[test]
    fn a_pvc_backup_is_a_candidate_by_what_its_status_recorded() {
        let c = claim_candidate(&pvc_backup(Some("backups/demo/s.db"), Some("ab12")))
            .expect("candidate");
        let pvc = c.source.pvc.as_ref().expect("pvc source");
        assert_eq!(
            (pvc.claim_name.as_str(), pvc.path.as_str()),
            ("backups", "demo/s.db")
        );
        let recorded = c.recorded.expect("recorded");
        assert_eq!(
            (recorded.sha256.as_str(), recorded.revision),
            ("ab12", Some(42))
        );
        // Nothing checkable: no candidate.
        assert!(claim_candidate(&pvc_backup(Some("backups/demo/s.db"), None)).is_none());
        assert!(claim_candidate(&pvc_backup(None, Some("ab12"))).is_none());
        assert!(claim_candidate(&pvc_backup(Some("other/demo/s.db"), Some("ab12"))).is_none());
    }
}
