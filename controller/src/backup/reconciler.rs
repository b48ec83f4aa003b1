//! The `EtcdBackup` reconciler: when a backup is due ([`schedule::next`]), it finds the cluster
//! the endpoints name (in the backup's namespace only), asks every running member its revision,
//! streams a snapshot from the member with the highest one into the bucket
//! ([`transfer::upload`]: completed only when etcd's hash checks), deletes periodic snapshots
//! beyond `maxBackups`, and reports the outcome in the status, an Event and the metrics.
//!
//! A backup of storage type PVC goes through a pod instead ([`super::claim_backup`]): the
//! same cluster, member, naming, status, Event and metrics, with the snapshot streamed and
//! checked by a pod that mounts the claim.
//!
//! Errors in the spec (endpoints naming no cluster, a bad path, a storage type without
//! support) are reported and wait for a spec change; everything else is retried with backoff.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt as _;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::Action;
use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, ResourceExt as _};

use crate::builders::OperatorImage;
use crate::controller_loop::{Reconciled, object_key as key};
use crate::status_writer::write_status;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tracing::{info, warn};

use etcd_shared::admission::{AdmissionPolicy, Defaults};
use etcd_shared::endpoints::{EndpointError, cluster_of_endpoints};
use etcd_shared::names;
use etcd_shared::types::storage::PVC_STORAGE_TYPE;
use etcd_shared::types::{EtcdBackup, EtcdCluster};

use super::claim_backup::{self, Progress};
use super::schedule::{self, Next, Success};
use crate::backoff::Backoff;
use crate::error::Error;
use crate::etcd::{EtcdAccess, MemberStatus};
use crate::events::Events;
use crate::metrics::backup::BackupMetrics;
use crate::observe;
use crate::snapshot::keys;
use crate::snapshot::store::{self, Credentials, StoreError, StoreLocation, StoreTimeouts};
use crate::snapshot::transfer::{self, SnapshotInfo, TransferError};
use crate::view::ClusterView;

/// Why a backup failed.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// The endpoints name no cluster of the namespace.
    #[error("etcdEndpoints: {0}")]
    Endpoints(#[from] EndpointError),
    /// The source matching the storage type is missing.
    #[error("the storage source matching the storage type is missing")]
    NoSource,
    /// The cluster does not exist.
    #[error("EtcdCluster {0:?} not found in this namespace")]
    ClusterNotFound(String),
    /// The cluster's spec cannot be read.
    #[error("EtcdCluster {name:?} cannot be read: {reason}")]
    ClusterInvalid {
        /// The cluster.
        name: String,
        /// Why.
        reason: String,
    },
    /// No member answered.
    #[error("no member of {cluster:?} answered: {last}")]
    NoMember {
        /// The cluster.
        cluster: String,
        /// The last error, or why none was asked.
        last: String,
    },
    /// A Secret could not be read or used.
    #[error("secret {name:?}: {reason}")]
    Secret {
        /// The Secret.
        name: String,
        /// Why.
        reason: String,
    },
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The snapshot could not be taken or written.
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// An etcd or Kubernetes call failed.
    #[error(transparent)]
    Controller(#[from] Error),
    /// The whole backup took longer than `timeoutInSecond`.
    #[error("the backup took longer than its timeout of {0:?}")]
    Timeout(Duration),
    /// A PVC backup or restore needs a pod of the operator's image, and none is configured.
    #[error(
        "the controller runs without --restore-image (the chart sets it), so it cannot start the pod that mounts the claim"
    )]
    NoImage,
    /// The pod that mounts the claim failed: its reason and message.
    #[error("the pod mounting the claim failed: {1}")]
    Pod(&'static str, String),
    /// No snapshot of the cluster to recover from checks.
    #[error("no snapshot of the cluster to recover from: {0}")]
    NoSnapshot(String),
}

impl BackupError {
    /// A static label: the status reason, the Event reason and the metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            BackupError::Endpoints(_) => "BadEndpoints",
            BackupError::NoSource => "UnsupportedStorage",
            BackupError::ClusterNotFound(_) => "ClusterNotFound",
            BackupError::ClusterInvalid { .. } => "ClusterInvalid",
            BackupError::NoMember { .. } => "NoMemberReachable",
            BackupError::Secret { .. } => "BadSecret",
            BackupError::Store(e) => e.reason(),
            BackupError::Transfer(e) => e.reason(),
            BackupError::Controller(_) => "ApiFailed",
            BackupError::Timeout(_) => "Timeout",
            BackupError::NoImage => "NoRestoreImage",
            BackupError::Pod(reason, _) => reason,
            BackupError::NoSnapshot(_) => "NoSnapshot",
        }
    }

    /// The cluster `name` cannot be read (its spec, or the etcd line it runs), for `reason`.
    pub fn invalid<E: std::fmt::Display>(name: impl Into<String>) -> impl FnOnce(E) -> BackupError {
        let name = name.into();
        move |reason| BackupError::ClusterInvalid {
            name,
            reason: reason.to_string(),
        }
    }

    /// What a reconcile that failed with it returns: a wait for a change of the spec when only
    /// that can fix it ([`BackupError::needs_spec_change`]), else the error (retried).
    pub fn into_action(self) -> Result<Action, BackupError> {
        if self.needs_spec_change() {
            Ok(Action::await_change())
        } else {
            Err(self)
        }
    }

    /// Whether only a change of the spec (or of the objects it names) can fix it: reported
    /// and not retried on a timer.
    pub fn needs_spec_change(&self) -> bool {
        matches!(
            self,
            BackupError::Endpoints(_)
                | BackupError::NoSource
                | BackupError::Transfer(TransferError::BadKey { .. })
                | BackupError::NoImage
        ) || matches!(self, BackupError::Store(e) if e.needs_spec_change())
    }
}

/// Settings of the backup reconciler.
#[derive(Debug, Clone)]
pub struct BackupConfig {
    /// Timeout of each etcd call but the snapshot.
    pub etcd_timeout: Duration,
    /// Store timeouts and retries.
    pub store: StoreTimeouts,
    /// First retry delay after a failure (doubling up to `max_backoff`).
    pub base_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
    /// The rules the cluster's spec is read with.
    pub policy: AdmissionPolicy,
    /// The operator's image, for the pods of PVC backups (the controller's `--restore-image`).
    pub image: Option<OperatorImage>,
}

impl Default for BackupConfig {
    fn default() -> Self {
        BackupConfig {
            etcd_timeout: Duration::from_secs(3),
            store: StoreTimeouts::default(),
            base_backoff: Duration::from_secs(5),
            max_backoff: Duration::from_secs(300),
            policy: AdmissionPolicy::new(Defaults::default()),
            image: None,
        }
    }
}

/// What every backup reconcile shares.
pub struct BackupReconciler {
    pub(crate) client: kube::Client,
    metrics: BackupMetrics,
    recorder: Recorder,
    pub(crate) config: BackupConfig,
    backoff: Backoff,
}

impl BackupReconciler {
    /// A reconciler publishing events as `reporter`.
    pub fn new(
        client: kube::Client,
        metrics: BackupMetrics,
        reporter: Reporter,
        config: BackupConfig,
    ) -> Self {
        BackupReconciler {
            recorder: Recorder::new(client.clone(), reporter),
            backoff: Backoff::new(config.base_backoff, config.max_backoff),
            client,
            metrics,
            config,
        }
    }
}

impl Reconciled for BackupReconciler {
    type Object = EtcdBackup;
    type Error = BackupError;
    const KIND: &'static str = "EtcdBackup";

    fn reconcile(
        self: Arc<Self>,
        backup: Arc<EtcdBackup>,
    ) -> impl std::future::Future<Output = Result<Action, BackupError>> + Send + 'static {
        reconcile(backup, self)
    }

    fn retry(&self, backup: &EtcdBackup, error: &BackupError) -> Action {
        let delay = self.backoff.failed(&key(backup));
        warn!(backup = %key(backup), %error, retry_in = ?delay, "backup failed; retrying");
        match schedule::interval(&backup.spec) {
            // A periodic backup never waits longer than its interval.
            Some(every) => Action::requeue(delay.min(every)),
            None => Action::requeue(delay),
        }
    }

    fn forget(&self, namespace: &str, name: &str) {
        self.metrics.forget(namespace, name);
        self.backoff.succeeded(&format!("{namespace}/{name}"));
    }
}

async fn reconcile(
    backup: Arc<EtcdBackup>,
    r: Arc<BackupReconciler>,
) -> Result<Action, BackupError> {
    let generation = backup.metadata.generation;
    let now = Timestamp::now();
    match schedule::next(&backup.spec, backup.status.as_ref(), generation, now) {
        Next::Done => return Ok(Action::await_change()),
        Next::WaitFor(wait) => return Ok(Action::requeue(wait)),
        Next::TakeNow => {}
    }
    let limit = schedule::timeout(&backup.spec);
    let started = Instant::now();
    let outcome = if backup.spec.storage_type == PVC_STORAGE_TYPE {
        match claim_backup::step(&backup, &r, now).await {
            Ok(Progress::Waiting) => return Ok(Action::requeue(claim_backup::POLL)),
            Ok(Progress::Finished(outcome)) => outcome,
            Err(e) => Err(e),
        }
    } else {
        match tokio::time::timeout(limit, take(&backup, &r, now)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(BackupError::Timeout(limit)),
        }
    };
    let events = Events::of(&r.recorder, &*backup);
    let namespace = backup.namespace().unwrap_or_default();
    let name = backup.name_any();
    match outcome {
        Ok(success) => {
            let status = schedule::succeeded(
                backup.status.as_ref(),
                &success,
                generation,
                Timestamp::now(),
            );
            write_status(&r.client, &*backup, &status).await?;
            r.metrics.succeeded(
                &namespace,
                &name,
                success.took,
                success.size,
                status.last_success_date.as_ref().map(|t| t.0),
            );
            r.backoff.succeeded(&key(&*backup));
            let note = status.conditions.first().map(|c| c.message.clone());
            events
                .normal("BackupSucceeded", note.unwrap_or_default())
                .await;
            info!(backup = %key(&*backup), path = %success.path, revision = success.revision, size = success.size, took = ?started.elapsed(), "backup written");
            Ok(match schedule::interval(&backup.spec) {
                Some(every) => Action::requeue(every),
                None => Action::await_change(),
            })
        }
        Err(error) => {
            let reason = error.reason();
            let message = error.to_string();
            let status = schedule::failed(
                backup.status.as_ref(),
                reason,
                &message,
                generation,
                Timestamp::now(),
            );
            r.metrics.failed(reason);
            events.warning(reason, message).await;
            if let Err(e) = write_status(&r.client, &*backup, &status).await {
                warn!(backup = %key(&*backup), error = %e, "could not write the backup's status");
            }
            error.into_action()
        }
    }
}

/// Takes one snapshot: the cluster, its most advanced member, the bucket, the upload, then
/// retention.
async fn take(
    backup: &EtcdBackup,
    r: &BackupReconciler,
    now: Timestamp,
) -> Result<Success, BackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let spec = &backup.spec;
    let location = StoreLocation::from_source(&spec.storage_type, &spec.source)?;
    let (view, tls_secret) = target(backup, r).await?;
    let periodic = schedule::interval(spec).is_some();
    let (success, bucket) = snapshot_cluster(
        &r.client,
        &view,
        tls_secret.as_deref(),
        &location,
        &SnapshotSettings {
            etcd_timeout: r.config.etcd_timeout,
            limit: schedule::timeout(spec),
            store: r.config.store,
        },
        |revision| keys::snapshot_key(&location.key, periodic, revision, now),
    )
    .await?;
    if periodic {
        let max = spec.backup_policy.as_ref().map_or(0, |p| p.max_backups);
        let prefix = &location.key;
        let key = success.path.split_once('/').map_or("", |(_, k)| k);
        if let Err(e) = retain(&bucket, prefix, max, key).await {
            // The snapshot is written; old ones are tried again after the next one.
            warn!(backup = %namespace, error = %e, "deleting old snapshots failed");
        }
    }
    Ok(success)
}

/// The cluster the backup's endpoints name (in its namespace), read, and the Secret with the
/// client certificate to reach its members with (`clientTLSSecret`, else the operator's own
/// for a cluster with client TLS).
pub(crate) async fn target(
    backup: &EtcdBackup,
    r: &BackupReconciler,
) -> Result<(ClusterView, Option<String>), BackupError> {
    let namespace = backup.namespace().unwrap_or_default();
    let spec = &backup.spec;
    let cluster_name = cluster_of_endpoints(&spec.etcd_endpoints, &namespace)?;
    let clusters: Api<EtcdCluster> = Api::namespaced(r.client.clone(), &namespace);
    let cluster = clusters
        .get_opt(&cluster_name)
        .await
        .map_err(Error::kube(format!("get EtcdCluster {cluster_name}")))?
        .ok_or_else(|| BackupError::ClusterNotFound(cluster_name.clone()))?;
    let view = ClusterView::new(&cluster, &r.config.policy)
        .map_err(BackupError::invalid(&cluster_name))?;
    let tls_secret = match spec.client_tls_secret.as_str() {
        "" => view.tls.operator_secret.clone(),
        secret => Some(secret.to_string()),
    };
    Ok((view, tls_secret))
}

/// How to reach the members of `view`: with the client certificate of `tls_secret` when given.
pub(crate) async fn member_access(
    client: &kube::Client,
    view: &ClusterView,
    tls_secret: Option<&str>,
    etcd_timeout: Duration,
) -> Result<EtcdAccess, BackupError> {
    let tls = match tls_secret {
        None => None,
        Some(secret) => Some(
            observe::secret_tls(client, &view.namespace, secret, &view.tls_server_name()).await?,
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
/// when the cluster serves TLS. The one way every snapshot is taken: EtcdBackups and the safety
/// backups before risky changes.
pub async fn snapshot_cluster(
    client: &kube::Client,
    view: &ClusterView,
    tls_secret: Option<&str>,
    location: &StoreLocation,
    settings: &SnapshotSettings,
    key_of: impl FnOnce(i64) -> String,
) -> Result<(Success, Arc<dyn ObjectStore>), BackupError> {
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
    };
    let stream = access.snapshot(&endpoint, settings.limit).await?;
    let checked = transfer::upload(&bucket, &key, &info, location.metadata_names(), stream).await?;
    Ok((
        Success {
            path: location.display(&key),
            etcd_version: status.version,
            revision: status.revision,
            size: checked.size,
            sha256: checked.sha256,
            took: started.elapsed(),
        },
        bucket,
    ))
}

/// Asks every running member pod of the cluster its status and picks the one with the highest
/// revision (a voter over a learner when they are level).
pub(crate) async fn most_advanced_member(
    client: &kube::Client,
    view: &ClusterView,
    access: &EtcdAccess,
) -> Result<(String, String, MemberStatus), BackupError> {
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
            Some((observe::endpoint(view, ip), p.name_any()))
        })
        .collect();
    if candidates.is_empty() {
        return Err(BackupError::NoMember {
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
    best.ok_or_else(|| BackupError::NoMember {
        cluster: view.name.clone(),
        last,
    })
}

/// The credentials of `location`'s store, from the secret its source names (none for GCS
/// without `gcpSecret`: the default credentials).
pub(crate) async fn credentials(
    client: &kube::Client,
    namespace: &str,
    location: &StoreLocation,
) -> Result<Credentials, BackupError> {
    let name = location.secret.as_str();
    if name.is_empty() {
        return Ok(Credentials::read(&location.backend, None)?);
    }
    let secret_error = |reason: String| BackupError::Secret {
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
            e => BackupError::Store(e),
        }
    })
}

/// Deletes the periodic snapshots of `prefix` beyond `max`, keeping `keep`.
async fn retain(
    bucket: &Arc<dyn ObjectStore>,
    prefix: &str,
    max: i64,
    keep: &str,
) -> Result<(), TransferError> {
    if max <= 0 {
        return Ok(());
    }
    // Listing is by directory: the objects beside the prefix's last component.
    let dir = prefix.rsplit_once('/').map(|(d, _)| d);
    let listed: Vec<_> = bucket
        .list(dir.map(object_store::path::Path::from).as_ref())
        .try_collect()
        .await?;
    let keys: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
    for doomed in keys::expired(prefix, &keys, max, keep) {
        bucket.delete(&transfer::object_path(&doomed)?).await?;
        info!(key = %doomed, "old snapshot deleted (maxBackups)");
    }
    Ok(())
}
