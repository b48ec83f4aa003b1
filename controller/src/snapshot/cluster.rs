//! The snapshot service: taking, locating and checking the snapshots of a cluster, for the
//! EtcdBackup and EtcdRestore controllers ([`crate::backup`]) and for the EtcdCluster side
//! (its safety backups, [`crate::reconcile::safety`], and the source of a recovery,
//! [`crate::reconcile::recovery_source`]) alike.
//!
//! - [`target`]: the cluster an EtcdBackup's endpoints name, and the Secret to reach it with;
//! - [`member_access`], [`most_advanced_member`]: how to reach its members, and the one with
//!   the highest revision;
//! - [`credentials`]: the credentials of a store, from the Secret its source names;
//! - [`recipients`], [`identities`]: the age keys of an encrypted backup, from their Secrets;
//! - [`snapshot_cluster`]: the one way every snapshot is taken;
//! - [`lines_fit`], [`CheckedSource`]: whether a snapshot can be restored into a cluster, and
//!   what its check found.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::ListParams;
use kube::{Api, ResourceExt as _};
use object_store::ObjectStore;

use etcd_shared::admission::AdmissionPolicy;
use etcd_shared::endpoints::cluster_of_endpoints;
use etcd_shared::names;
use etcd_shared::types::{EtcdBackup, EtcdCluster};
use etcd_shared::version::EtcdVersion;

use super::encryption::{self, Identities, Recipients, Sealer};
use super::error::SnapshotError;
use super::store::{self, Credentials, StoreError, StoreLocation, StoreTimeouts};
use super::transfer::{self, SnapshotInfo};
use crate::error::Error;
use crate::etcd::{EtcdAccess, KvFingerprint, MemberStatus};
use crate::observe;
use crate::view::ClusterView;
use crate::view::transport::MemberTransport;

/// A snapshot written: what a successful backup (or safety backup) records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Success {
    /// `BUCKET/KEY` of the snapshot.
    pub path: String,
    /// etcd version of the member.
    pub etcd_version: String,
    /// Revision the snapshot holds at least.
    pub revision: i64,
    /// Bytes of the snapshot object.
    pub size: u64,
    /// The database's SHA-256, hex.
    pub sha256: String,
    /// How long it took.
    pub took: Duration,
    /// The source member's `HashKV` and key count at `revision`, asked right after the
    /// snapshot (`None` when it could not say: the revision compacted meanwhile, say).
    pub source: Option<KvFingerprint>,
}

/// The cluster the backup's endpoints name (in its namespace), read, and the Secret with the
/// client certificate to reach its members with (`clientTLSSecret`, else the operator's own
/// for a cluster with client TLS).
pub async fn target(
    client: &kube::Client,
    policy: &AdmissionPolicy,
    backup: &EtcdBackup,
) -> Result<(ClusterView, Option<String>), SnapshotError> {
    let namespace = backup.namespace().unwrap_or_default();
    let spec = &backup.spec;
    let cluster_name = cluster_of_endpoints(&spec.etcd_endpoints, &namespace)?;
    let clusters: Api<EtcdCluster> = Api::namespaced(client.clone(), &namespace);
    let cluster = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(Error::kube(format!("get EtcdCluster {cluster_name}")))?
        .ok_or_else(|| SnapshotError::ClusterNotFound(cluster_name.clone()))?;
    let mut view =
        ClusterView::new(&cluster, policy).map_err(SnapshotError::invalid(&cluster_name))?;
    if let Some(mode) = crate::certificates::switching::dialling_mode(&view, &cluster) {
        view.tls = mode;
    }
    let tls_secret = match spec.client_tls_secret.as_str() {
        "" => view.tls.operator_secret.clone(),
        secret => Some(secret.to_string()),
    };
    Ok((view, tls_secret))
}

/// How to reach the members of `view`: with the client certificate of `tls_secret` when given.
pub async fn member_access(
    client: &kube::Client,
    view: &ClusterView,
    tls_secret: Option<&str>,
    etcd_timeout: Duration,
) -> Result<EtcdAccess, SnapshotError> {
    let tls = match tls_secret {
        None => None,
        Some(secret) => Some(
            observe::secret_tls(
                client,
                &view.namespace,
                secret,
                &view.tls_server_name(),
                view.tls.layout,
            )
            .await?,
        ),
    };
    Ok(EtcdAccess {
        tls_id: tls.as_ref().map_or(0, |(_, id)| *id),
        tls: tls.map(|(tls, _)| tls),
        timeout: etcd_timeout,
        pool: None,
    })
}

/// Timeouts of one snapshot.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotSettings {
    /// Each etcd call but the snapshot.
    pub etcd_timeout: Duration,
    /// The snapshot stream.
    pub limit: Duration,
    /// The store's requests.
    pub store: StoreTimeouts,
}

/// Writes a snapshot of the cluster of `view` to the bucket (S3, GCS) or container (ABS) of
/// `location`, under the key `key_of` gives for the snapshot's revision: from the member with
/// the highest revision, reached with the client certificate of `tls_secret` (CoreOS' layout)
/// when the cluster serves TLS, encrypted to `recipients` when given. The one way every
/// snapshot is taken: EtcdBackups and the safety backups before risky changes.
pub async fn snapshot_cluster(
    client: &kube::Client,
    view: &ClusterView,
    tls_secret: Option<&str>,
    location: &StoreLocation,
    settings: &SnapshotSettings,
    recipients: Option<&Recipients>,
    key_of: impl FnOnce(i64) -> String,
) -> Result<(Success, Arc<dyn ObjectStore>), SnapshotError> {
    let started = Instant::now();
    let access = member_access(client, view, tls_secret, settings.etcd_timeout).await?;
    let (endpoint, member, status) = most_advanced_member(client, view, &access).await?;
    let credentials = credentials(client, &view.namespace, location).await?;
    let bucket = store::open(location, &credentials, settings.store)?;
    let key = key_of(status.revision);
    let info = SnapshotInfo {
        etcd_version: status.version.clone(),
        revision: status.revision,
        cluster: format!("{}/{}", view.namespace, view.name),
        member,
        encrypted: recipients.is_some(),
    };
    let sealer = recipients
        .map(Sealer::new)
        .transpose()
        .map_err(|source| SnapshotError::Transfer(transfer::TransferError::Encryption(source)))?;
    let stream = access.snapshot(&endpoint, settings.limit).await?;
    let names = location.metadata_names();
    let checked = transfer::upload(&bucket, &key, &info, names, stream, sealer).await?;
    // What the snapshot holds at its revision, from the member it came from: what a
    // verification compares with. A failure here leaves the snapshot good, and unverifiable.
    let source = match access.kv_fingerprint(&endpoint, status.revision).await {
        Ok(fingerprint) => Some(fingerprint),
        Err(e) => {
            tracing::warn!(%key, error = %e, "no hashKV of the snapshot's revision");
            None
        }
    };
    Ok((
        Success {
            path: location.display(&key),
            etcd_version: status.version,
            revision: status.revision,
            size: checked.size,
            sha256: checked.sha256,
            took: started.elapsed(),
            source,
        },
        bucket,
    ))
}

/// Asks every running member pod of the cluster its status and picks the one with the highest
/// revision (a voter over a learner when they are level).
pub async fn most_advanced_member(
    client: &kube::Client,
    view: &ClusterView,
    access: &EtcdAccess,
) -> Result<(String, String, MemberStatus), SnapshotError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &view.namespace);
    // Every member pod: this operator's and those of CoreOS' operator being adopted.
    let selector = names::coreos_selector(&view.name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(Error::kube(format!("list member pods of {}", view.name)))?;
    let candidates: Vec<(String, String)> = listed
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| observe::member_pod_origin(&p.metadata, view).is_some())
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.as_deref()?;
            let transport = MemberTransport::of_pod(p);
            Some((
                observe::endpoint(view, transport.as_ref(), ip),
                p.name_any(),
            ))
        })
        .collect();
    if candidates.is_empty() {
        return Err(SnapshotError::NoMember {
            cluster: view.name.clone(),
            last: "no member pod has an IP".into(),
        });
    }
    let answers = futures::future::join_all(candidates.iter().map(|(endpoint, member)| async {
        (
            endpoint.clone(),
            member.clone(),
            access.status(endpoint).await,
        )
    }))
    .await;
    let mut last = String::new();
    let mut best: Option<(String, String, MemberStatus)> = None;
    for (endpoint, member, answer) in answers {
        match answer {
            Ok(status) => {
                let better = best.as_ref().is_none_or(|(_, _, b)| {
                    (status.revision, !status.is_learner) > (b.revision, !b.is_learner)
                });
                if better {
                    best = Some((endpoint, member, status));
                }
            }
            Err(e) => last = e.to_string(),
        }
    }
    best.ok_or_else(|| SnapshotError::NoMember {
        cluster: view.name.clone(),
        last,
    })
}

/// The credentials of `location`'s store, from the secret its source names (none for GCS
/// without `gcpSecret`: the default credentials).
pub async fn credentials(
    client: &kube::Client,
    namespace: &str,
    location: &StoreLocation,
) -> Result<Credentials, SnapshotError> {
    let name = location.secret.as_str();
    if name.is_empty() {
        return Ok(Credentials::read(&location.backend, None)?);
    }
    let secret_error = |reason: String| SnapshotError::Secret {
        name: name.to_string(),
        reason,
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get secret {name}")))?
        .ok_or_else(|| secret_error("not found".into()))?;
    let data = secret.data.unwrap_or_default();
    let mut text = std::collections::BTreeMap::new();
    for key in store::secret_keys(&location.backend) {
        if let Some(bytes) = data.get(*key) {
            let value = String::from_utf8(bytes.0.clone())
                .map_err(|_| secret_error(format!("key {key} is not UTF-8 text")))?;
            text.insert(*key, value);
        }
    }
    Credentials::read(&location.backend, Some(&|key: &str| text.get(key).cloned())).map_err(|e| {
        match e {
            StoreError::MissingKey(key) => secret_error(format!("has no key {key}")),
            e => SnapshotError::Store(e),
        }
    })
}

/// The text of `key` in the Secret `name` of `namespace`: a clear error when the Secret or the
/// key is missing, or the key is not text.
async fn secret_text(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, SnapshotError> {
    let secret_error = |reason: String| SnapshotError::Secret {
        name: name.to_string(),
        reason,
    };
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get secret {name}")))?
        .ok_or_else(|| secret_error("not found".into()))?;
    let bytes = secret
        .data
        .unwrap_or_default()
        .remove(key)
        .ok_or_else(|| secret_error(format!("has no key {key}")))?;
    String::from_utf8(bytes.0).map_err(|_| secret_error(format!("key {key} is not UTF-8 text")))
}

/// The age recipients of the Secret `name` (key `recipients`), read at each backup.
pub async fn recipients(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Recipients, SnapshotError> {
    let text = secret_text(client, namespace, name, encryption::RECIPIENTS_KEY).await?;
    Recipients::parse(&text).map_err(|source| SnapshotError::Key {
        name: name.to_string(),
        source,
    })
}

/// The age identities of the Secret `name` (key `identity`).
pub async fn identities(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<Identities, SnapshotError> {
    let text = secret_text(client, namespace, name, encryption::IDENTITY_KEY).await?;
    Identities::parse(&text).map_err(|source| SnapshotError::Key {
        name: name.to_string(),
        source,
    })
}

/// Whether a snapshot taken by `snapshot` (when known) can be restored by the tool of
/// `cluster`'s line: the same line or the next one (etcd's rule), never an older one.
pub fn lines_fit(snapshot: Option<&str>, cluster: &EtcdVersion) -> Result<(), String> {
    let Some(snapshot) = snapshot else {
        return Ok(());
    };
    let taken: EtcdVersion = snapshot
        .parse()
        .map_err(|e| format!("the snapshot's etcd version {snapshot:?} does not parse: {e}"))?;
    if (taken.major, taken.minor) > (cluster.major, cluster.minor) {
        return Err(format!(
            "the snapshot was taken by etcd {taken}, newer than the cluster's {cluster}: an older etcd cannot restore it; set spec.version to {}.{}.x or later first",
            taken.major, taken.minor
        ));
    }
    if taken.major != cluster.major || cluster.minor > taken.minor + 1 {
        return Err(format!(
            "the snapshot was taken by etcd {taken}; the cluster runs {cluster}: restore into {}.{}.x or {}.{}.x, then upgrade one line at a time",
            taken.major,
            taken.minor,
            taken.major,
            taken.minor + 1
        ));
    }
    Ok(())
}

/// What the check of a snapshot found, wherever it is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSource {
    /// `BUCKET/KEY` or `CLAIM/PATH`.
    pub path: String,
    /// Bytes of the snapshot.
    pub size: u64,
    /// SHA-256 of its database, hex.
    pub sha256: String,
    /// etcd revision, when its metadata says.
    pub revision: Option<i64>,
    /// etcd version that took it, when its metadata says.
    pub etcd_version: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_restored_by_its_line_or_the_next() {
        let v = |s: &str| s.parse::<EtcdVersion>().expect("version");
        assert!(lines_fit(Some("3.5.35"), &v("3.5.21")).is_ok());
        assert!(lines_fit(Some("3.5.35"), &v("3.6.16")).is_ok());
        assert!(
            lines_fit(None, &v("3.6.16")).is_ok(),
            "unknown: etcd's tool decides"
        );
        let newer = lines_fit(Some("3.6.16"), &v("3.5.35")).expect_err("newer");
        assert!(newer.contains("newer than the cluster's"), "{newer}");
        let skip = lines_fit(Some("3.4.45"), &v("3.6.16")).expect_err("skip");
        assert!(skip.contains("restore into 3.4.x or 3.5.x"), "{skip}");
        assert!(lines_fit(Some("garbage"), &v("3.6.16")).is_err());
    }
}
