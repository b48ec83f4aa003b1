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
//!   is skipped, and said.

use futures::{StreamExt as _, TryStreamExt as _};
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
        if !ours || spec.storage_type == PVC_STORAGE_TYPE {
            continue;
        }
        let origin = format!("EtcdBackup {}", backup.name_any());
        let listing = async {
            let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
            let credentials = credentials(client, &view.namespace, &location).await?;
            let bucket = store::open(&location, &credentials, timeouts)?;
            let dir = location.key.rsplit_once('/').map(|(d, _)| d);
            let keys: Vec<String> = bucket
                .list(dir.map(object_store::path::Path::from).as_ref())
                .map_ok(|m| m.location.to_string())
                .try_collect()
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
        "the cluster has no safety backup and no EtcdBackup in an object store".into()
    } else {
        format!("none checks: {}", skipped.join("; "))
    }))
}

/// The time a recovery record keeps: now.
pub fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())
}
