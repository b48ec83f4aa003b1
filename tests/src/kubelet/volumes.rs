//! Pod volumes as host directories.
//!
//! - Each pod gets `<kubelet dir>/pods/<uid>/`; its volumes live in `volumes/<name>/` and go
//!   with the pod (so an `emptyDir` is deleted with its pod).
//! - A `persistentVolumeClaim` is `<kubelet dir>/claims/<namespace>/<claim>/`, which outlives
//!   the pod as a persistent volume does, and is reused by the next pod mounting the claim. A
//!   Pending claim is bound by creating a `hostPath` PersistentVolume pre-bound to it
//!   (`claimRef`), which kube-controller-manager's persistent-volume binder then binds as it
//!   binds any PV (`kubectl get pvc` shows `Bound`). When the claim is deleted the kubelet
//!   deletes that PV and the directory (see [`forget_claim`]).
//! - `secret`, `configMap`, `downwardAPI` and `projected` (including the service-account
//!   token the ServiceAccount admission plugin adds) are files written from the objects when
//!   the pod starts, in a kubelet's atomic-writer layout (`KEY -> ..data/KEY`,
//!   `..data -> ..<timestamp>`, see [`super::atomic_writer`]). While the pod runs, the files
//!   that come from Secrets and ConfigMaps (of `secret`, `configMap` and `projected` volumes)
//!   are refreshed: the kubelet re-reads the objects every
//!   [`super::KubeletOptions::volume_resync`] and swaps `..data` to a new version when they
//!   changed (the kubelet's `refresh` task). Downward-API files and service-account tokens are not
//!   refreshed (a token is valid for an hour, longer than any test). A `subPath` mount of such
//!   a volume is a copy taken when the container starts, so it is not refreshed either, as in
//!   Kubernetes (`snapshot_sub_path`).
//! - `hostPath` is the host path itself.
//!
//! Containers see these directories through mount-path rewriting (see [`super::expand`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, DownwardAPIVolumeFile, HostPathVolumeSource, KeyToPath, ObjectReference,
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod, Secret, ServiceAccount,
    Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use super::atomic_writer::{self, FileProjection, Payload};
use super::expand::{EnvSources, field_value};

/// Label on the PersistentVolumes the kubelet creates.
pub const PV_LABEL: (&str, &str) = ("etcd-tests.kubelet/provisioned", "true");
const CLAIM_UID_SUFFIX: &str = ".uid";

/// The kubelet's directory layout.
#[derive(Debug, Clone)]
pub struct KubeletDirs {
    /// The kubelet's root directory.
    pub root: PathBuf,
}

impl KubeletDirs {
    /// `<root>/pods/<uid>`: everything of one pod except its logs and claims.
    pub fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pods").join(uid)
    }

    /// `<root>/pods/<uid>/volumes/<name>`.
    pub fn pod_volume_dir(&self, uid: &str, volume: &str) -> PathBuf {
        self.pod_dir(uid).join("volumes").join(volume)
    }

    /// `<root>/claims/<namespace>/<claim>`: the persistent volume of a claim.
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> PathBuf {
        self.root.join("claims").join(namespace).join(claim)
    }

    /// `<root>/logs/<namespace>/<pod>-<uid>`: container logs, kept after the pod is gone.
    pub fn log_dir(&self, namespace: &str, pod: &str, uid: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(namespace)
            .join(format!("{pod}-{uid}"))
    }

    /// The kubelet's own log.
    pub fn kubelet_log(&self) -> PathBuf {
        self.root.join("kubelet.log")
    }
}

/// Why a pod's volumes cannot be set up yet (the pod stays `ContainerCreating`).
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// An object the volume needs is missing (retried).
    #[error("{0}")]
    Missing(String),
    /// A volume type this kubelet does not implement.
    #[error(
        "volume {volume:?}: unsupported volume type (etcd-tests kubelet supports emptyDir, persistentVolumeClaim, secret, configMap, downwardAPI, projected, hostPath)"
    )]
    Unsupported {
        /// The volume name.
        volume: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VolumeError {
    let what = what.into();
    move |source| VolumeError::Io { what, source }
}

fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> VolumeError {
    let what = what.into();
    move |source| VolumeError::Api { what, source }
}

fn create_dir(path: &Path) -> Result<(), VolumeError> {
    std::fs::create_dir_all(path).map_err(io(format!("creating {}", path.display())))
}

/// Adds `bytes` at `relative` to `payload`.
fn add_file(
    payload: &mut Payload,
    relative: &str,
    bytes: &[u8],
    mode: u32,
) -> Result<(), VolumeError> {
    let path = atomic_writer::clean_path(relative).map_err(VolumeError::Missing)?;
    payload.insert(
        path,
        FileProjection {
            data: bytes.to_vec(),
            mode: mode & 0o777,
        },
    );
    Ok(())
}

/// Adds `keys` (key → bytes) to `payload`, all of them or the `items` selected.
fn add_keys(
    payload: &mut Payload,
    what: &str,
    keys: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<(), VolumeError> {
    match items {
        None => {
            for (key, bytes) in keys {
                add_file(payload, key, bytes, default_mode)?;
            }
        }
        Some(items) => {
            for item in items {
                match keys.get(&item.key) {
                    Some(bytes) => add_file(
                        payload,
                        &item.path,
                        bytes,
                        item.mode.map_or(default_mode, |m| m as u32),
                    )?,
                    None if optional => {}
                    None => {
                        return Err(VolumeError::Missing(format!(
                            "{what}: key {:?} not found",
                            item.key
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn secret_keys(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = secret
        .string_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    keys.extend(
        secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone())),
    );
    keys
}

fn config_map_keys(map: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = map
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    keys.extend(
        map.data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
    );
    keys
}

/// The kind of object a volume's files come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    /// A Secret.
    Secret,
    /// A ConfigMap.
    ConfigMap,
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Self::Secret => "secret",
            Self::ConfigMap => "configmap",
        }
    }
}

/// The keys of the objects a volume refers to, by (kind, name); `None`: the object does not
/// exist.
pub(crate) type Objects = BTreeMap<(Kind, String), Option<BTreeMap<String, Vec<u8>>>>;

/// The keys of a Secret or ConfigMap a volume (or a projection of one) holds.
#[derive(Debug, Clone)]
pub(crate) struct KeySource {
    pub(crate) kind: Kind,
    pub(crate) name: String,
    items: Option<Vec<KeyToPath>>,
    mode: u32,
    optional: bool,
}

/// What the files of a `secret`, `configMap`, `downwardAPI` or `projected` volume are made of,
/// in order (a later source's file replaces an earlier one's of the same path).
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// The keys of a Secret or ConfigMap: read again on each refresh.
    Keys(KeySource),
    /// Files computed when the volume was set up (downward-API items, a service-account
    /// token): kept as they are on a refresh.
    Fixed(Payload),
}

/// The files of `sources` built from `objects` (which must hold every object they refer to).
/// A missing object or key that is not optional is an error.
pub(crate) fn build(sources: &[Source], objects: &Objects) -> Result<Payload, VolumeError> {
    let mut payload = Payload::new();
    for source in sources {
        match source {
            Source::Keys(k) => {
                let what = format!("{} {}", k.kind.word(), k.name);
                match objects
                    .get(&(k.kind, k.name.clone()))
                    .and_then(Option::as_ref)
                {
                    Some(keys) => add_keys(
                        &mut payload,
                        &what,
                        keys,
                        k.items.as_deref(),
                        k.mode,
                        k.optional,
                    )?,
                    None if k.optional => {}
                    None => {
                        return Err(VolumeError::Missing(format!(
                            "{} {:?} not found",
                            k.kind.word(),
                            k.name
                        )));
                    }
                }
            }
            Source::Fixed(files) => payload.extend(files.clone()),
        }
    }
    Ok(payload)
}

/// Reads the objects `sources` refer to.
async fn fetch(
    client: &kube::Client,
    ns: &str,
    sources: &[Source],
) -> Result<Objects, VolumeError> {
    let mut objects = Objects::new();
    for source in sources {
        let Source::Keys(k) = source else { continue };
        let key = (k.kind, k.name.clone());
        if objects.contains_key(&key) {
            continue;
        }
        let what = format!("getting {} {}", k.kind.word(), k.name);
        let keys = match k.kind {
            Kind::Secret => Api::<Secret>::namespaced(client.clone(), ns)
                .get_opt(&k.name)
                .await
                .map_err(api(what))?
                .as_ref()
                .map(secret_keys),
            Kind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), ns)
                .get_opt(&k.name)
                .await
                .map_err(api(what))?
                .as_ref()
                .map(config_map_keys),
        };
        objects.insert(key, keys);
    }
    Ok(objects)
}

/// The keys of every Secret (with `secrets`) and ConfigMap (with `config_maps`) of `ns`, read
/// with one list each: what a refresh builds volumes from.
pub(crate) async fn list_objects(
    client: &kube::Client,
    ns: &str,
    secrets: bool,
    config_maps: bool,
) -> Result<BTreeMap<(Kind, String), BTreeMap<String, Vec<u8>>>, kube::Error> {
    let mut out = BTreeMap::new();
    let params = kube::api::ListParams::default();
    if secrets {
        for s in Api::<Secret>::namespaced(client.clone(), ns)
            .list(&params)
            .await?
        {
            out.insert(
                (Kind::Secret, s.metadata.name.clone().unwrap_or_default()),
                secret_keys(&s),
            );
        }
    }
    if config_maps {
        for m in Api::<ConfigMap>::namespaced(client.clone(), ns)
            .list(&params)
            .await?
        {
            out.insert(
                (Kind::ConfigMap, m.metadata.name.clone().unwrap_or_default()),
                config_map_keys(&m),
            );
        }
    }
    Ok(out)
}

/// A `secret`, `configMap` or `projected` volume with Secret or ConfigMap keys, as the kubelet
/// keeps it up to date while the pod runs (see [`super::refresh`]).
#[derive(Debug)]
pub(crate) struct Refreshable {
    /// The volume name.
    pub(crate) volume: String,
    /// Its host directory.
    pub(crate) dir: PathBuf,
    pub(crate) sources: Vec<Source>,
    /// The files it holds.
    pub(crate) payload: Payload,
    /// Any read of the objects that started after this is at least as new as what `payload`
    /// was built from (a read that started earlier could undo a newer write).
    pub(crate) as_of: Instant,
    /// The last refresh failure, logged once.
    pub(crate) failure: Option<String>,
}

impl Refreshable {
    /// The (kind, name) of each object the volume refers to.
    pub(crate) fn objects(&self) -> impl Iterator<Item = (Kind, &str)> {
        self.sources.iter().filter_map(|s| match s {
            Source::Keys(k) => Some((k.kind, k.name.as_str())),
            Source::Fixed(_) => None,
        })
    }
}

/// A pod's volumes once set up.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    /// Volume name → host directory.
    pub(crate) dirs: BTreeMap<String, PathBuf>,
    /// The volumes written in the atomic-writer layout ([`atomic_writer`]): `secret`,
    /// `configMap`, `downwardAPI`, `projected`.
    pub(crate) atomic: BTreeSet<String>,
    /// Those the kubelet refreshes (they hold Secret or ConfigMap keys).
    pub(crate) refreshable: Vec<Refreshable>,
}

/// Sets up the pod's volumes.
pub(crate) async fn prepare(
    client: &kube::Client,
    dirs: &KubeletDirs,
    pod: &Pod,
    sources: &EnvSources,
) -> Result<Prepared, VolumeError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = Prepared::default();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let dir = if let Some(claim) = &volume.persistent_volume_claim {
            ensure_claim(client, dirs, ns, &claim.claim_name).await?
        } else if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            if host.type_.as_deref() == Some("DirectoryOrCreate") {
                create_dir(&path)?;
            }
            path
        } else if volume.empty_dir.is_some() {
            let dir = dirs.pod_volume_dir(uid, &volume.name);
            create_dir(&dir)?;
            dir
        } else {
            let dir = dirs.pod_volume_dir(uid, &volume.name);
            let files = plan(client, ns, pod, volume, sources).await?;
            let objects = fetch(client, ns, &files).await?;
            let as_of = Instant::now();
            let payload = build(&files, &objects)?;
            atomic_writer::write(&dir, &payload)
                .map_err(io(format!("writing volume {}", volume.name)))?;
            out.atomic.insert(volume.name.clone());
            if files.iter().any(|s| matches!(s, Source::Keys(_))) {
                out.refreshable.push(Refreshable {
                    volume: volume.name.clone(),
                    dir: dir.clone(),
                    sources: files,
                    payload,
                    as_of,
                    failure: None,
                });
            }
            dir
        };
        out.dirs.insert(volume.name.clone(), dir);
    }
    Ok(out)
}

/// What the files of a `secret`, `configMap`, `downwardAPI` or `projected` volume are made of.
async fn plan(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    volume: &Volume,
    sources: &EnvSources,
) -> Result<Vec<Source>, VolumeError> {
    if let Some(s) = &volume.secret {
        return Ok(vec![Source::Keys(KeySource {
            kind: Kind::Secret,
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone(),
            mode: s.default_mode.map_or(0o644, |m| m as u32),
            optional: s.optional.unwrap_or(false),
        })]);
    }
    if let Some(c) = &volume.config_map {
        return Ok(vec![Source::Keys(KeySource {
            kind: Kind::ConfigMap,
            name: c.name.clone(),
            items: c.items.clone(),
            mode: c.default_mode.map_or(0o644, |m| m as u32),
            optional: c.optional.unwrap_or(false),
        })]);
    }
    if let Some(d) = &volume.downward_api {
        let mode = d.default_mode.map_or(0o644, |m| m as u32);
        return Ok(vec![Source::Fixed(downward_files(
            pod,
            sources,
            d.items.as_deref().unwrap_or_default(),
            mode,
        )?)]);
    }
    if let Some(p) = &volume.projected {
        let mode = p.default_mode.map_or(0o644, |m| m as u32);
        let mut out = Vec::new();
        for source in p.sources.iter().flatten() {
            project(client, ns, pod, sources, source, mode, &mut out).await?;
        }
        return Ok(out);
    }
    Err(VolumeError::Unsupported {
        volume: volume.name.clone(),
    })
}

fn downward_files(
    pod: &Pod,
    sources: &EnvSources,
    items: &[DownwardAPIVolumeFile],
    mode: u32,
) -> Result<Payload, VolumeError> {
    let mut payload = Payload::new();
    for item in items {
        let Some(field) = &item.field_ref else {
            return Err(VolumeError::Missing(format!(
                "downwardAPI {}: only fieldRef items are supported",
                item.path
            )));
        };
        let value = field_value(pod, sources, &field.field_path)
            .map_err(|e| VolumeError::Missing(format!("downwardAPI {}: {e}", item.path)))?;
        add_file(
            &mut payload,
            &item.path,
            value.as_bytes(),
            item.mode.map_or(mode, |m| m as u32),
        )?;
    }
    Ok(payload)
}

/// Appends the sources of one projection of a `projected` volume to `out`.
async fn project(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    sources: &EnvSources,
    source: &VolumeProjection,
    mode: u32,
    out: &mut Vec<Source>,
) -> Result<(), VolumeError> {
    if let Some(s) = &source.secret {
        out.push(Source::Keys(KeySource {
            kind: Kind::Secret,
            name: s.name.clone(),
            items: s.items.clone(),
            mode,
            optional: s.optional.unwrap_or(false),
        }));
    }
    if let Some(c) = &source.config_map {
        out.push(Source::Keys(KeySource {
            kind: Kind::ConfigMap,
            name: c.name.clone(),
            items: c.items.clone(),
            mode,
            optional: c.optional.unwrap_or(false),
        }));
    }
    if let Some(d) = &source.downward_api {
        out.push(Source::Fixed(downward_files(
            pod,
            sources,
            d.items.as_deref().unwrap_or_default(),
            mode,
        )?));
    }
    if let Some(t) = &source.service_account_token {
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into());
        let request = TokenRequest {
            metadata: ObjectMeta::default(),
            spec: Some(TokenRequestSpec {
                audiences: t.audience.clone().map(|a| vec![a]),
                expiration_seconds: t.expiration_seconds.or(Some(3607)),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
            }),
            status: None,
        };
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
        let issued: TokenRequest = accounts
            .create_subresource("token", &account, &PostParams::default(), &request)
            .await
            .map_err(api(format!(
                "requesting a token for serviceaccount {account}"
            )))?;
        let token = issued.status.and_then(|s| s.token).unwrap_or_default();
        let mut files = Payload::new();
        add_file(&mut files, &t.path, token.as_bytes(), mode)?;
        out.push(Source::Fixed(files));
    }
    Ok(())
}

/// The host path a container's `subPath` mount of atomic-writer volume `dir` stands for: a
/// copy of what `dir/sub` holds now at `dest` (created as an empty directory when `dir/sub`
/// does not exist). As a kubelet's bind mount of a subPath, it does not follow later updates of
/// the volume, and a restarted container gets a fresh copy.
pub(crate) fn snapshot_sub_path(dir: &Path, sub: &str, dest: &Path) -> std::io::Result<PathBuf> {
    fn copy(from: &Path, to: &Path) -> std::io::Result<()> {
        // Follows the volume's symlinks: `from` is a file or directory of the current version.
        let meta = std::fs::metadata(from)?;
        if meta.is_dir() {
            std::fs::create_dir_all(to)?;
            for entry in std::fs::read_dir(from)? {
                let entry = entry?;
                copy(&entry.path(), &to.join(entry.file_name()))?;
            }
        } else {
            std::fs::copy(from, to)?;
        }
        std::fs::set_permissions(to, meta.permissions())
    }
    if dest.is_dir() && !dest.is_symlink() {
        std::fs::remove_dir_all(dest)?;
    } else if dest.symlink_metadata().is_ok() {
        std::fs::remove_file(dest)?;
    }
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let sub = atomic_writer::clean_path(sub).map_err(std::io::Error::other)?;
    let source = dir.join(sub);
    if source.exists() {
        copy(&source, dest)?;
    } else {
        std::fs::create_dir_all(dest)?;
    }
    Ok(dest.to_owned())
}

fn claim_pv_name(uid: &str) -> String {
    format!("etcd-tests-pv-{uid}")
}

fn uid_marker(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(CLAIM_UID_SUFFIX);
    dir.with_file_name(name)
}

/// The directory of claim `namespace/name`, created (and its PV, if the claim is Pending).
pub async fn ensure_claim(
    client: &kube::Client,
    dirs: &KubeletDirs,
    namespace: &str,
    name: &str,
) -> Result<PathBuf, VolumeError> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let claim = claims
        .get_opt(name)
        .await
        .map_err(api(format!("getting persistentvolumeclaim {name}")))?
        .ok_or_else(|| VolumeError::Missing(format!("persistentvolumeclaim {name:?} not found")))?;
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(VolumeError::Missing(format!(
            "persistentvolumeclaim {name:?} is being deleted"
        )));
    }
    let uid = claim.metadata.uid.clone().unwrap_or_default();
    let dir = dirs.claim_dir(namespace, name);
    let marker = uid_marker(&dir);
    // A directory left by an earlier claim of the same name is not this claim's data.
    if std::fs::read_to_string(&marker).is_ok_and(|owner| owner != uid) {
        let _ = std::fs::remove_dir_all(&dir);
    }
    create_dir(&dir)?;
    std::fs::write(&marker, &uid).map_err(io(format!("writing {}", marker.display())))?;

    let spec = claim.spec.clone().unwrap_or_default();
    let pending = claim
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .is_none_or(|p| p == "Pending");
    if pending && spec.volume_name.as_deref().unwrap_or("").is_empty() {
        let storage = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage").cloned())
            .unwrap_or_else(|| Quantity("1Gi".into()));
        let pv = PersistentVolume {
            metadata: ObjectMeta {
                name: Some(claim_pv_name(&uid)),
                labels: Some([(PV_LABEL.0.to_owned(), PV_LABEL.1.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeSpec {
                capacity: Some([("storage".to_owned(), storage)].into()),
                access_modes: spec
                    .access_modes
                    .clone()
                    .filter(|m| !m.is_empty())
                    .or_else(|| Some(vec!["ReadWriteOnce".into()])),
                host_path: Some(HostPathVolumeSource {
                    path: dir.to_string_lossy().into_owned(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: Some(namespace.to_owned()),
                    name: Some(name.to_owned()),
                    uid: Some(uid.clone()),
                    ..ObjectReference::default()
                }),
                storage_class_name: spec.storage_class_name.clone(),
                volume_mode: spec.volume_mode.clone(),
                persistent_volume_reclaim_policy: Some("Retain".into()),
                ..PersistentVolumeSpec::default()
            }),
            status: None,
        };
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        match volumes.create(&PostParams::default(), &pv).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(api(format!("creating a volume for claim {name}"))(e)),
        }
    }
    Ok(dir)
}

/// After claim `claim` was deleted: deletes the PV the kubelet made for it and its directory
/// (unless a newer claim of the same name owns the directory by now).
pub async fn forget_claim(
    client: &kube::Client,
    dirs: &KubeletDirs,
    claim: &PersistentVolumeClaim,
) {
    let (Some(ns), Some(name), Some(uid)) = (
        claim.metadata.namespace.as_deref(),
        claim.metadata.name.as_deref(),
        claim.metadata.uid.as_deref(),
    ) else {
        return;
    };
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    // A failure leaves a Released PV behind: harmless, nothing else uses it.
    let _ = volumes
        .delete(&claim_pv_name(uid), &DeleteParams::default())
        .await;
    let dir = dirs.claim_dir(ns, name);
    let marker = uid_marker(&dir);
    if std::fs::read_to_string(&marker).is_ok_and(|owner| owner == uid) {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(&marker);
    }
}

/// Deletes the contents of `dir`, keeping the directory.
pub fn wipe_contents(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(kind: Kind, name: &str, optional: bool, items: Option<Vec<KeyToPath>>) -> Source {
        Source::Keys(KeySource {
            kind,
            name: name.into(),
            items,
            mode: 0o400,
            optional,
        })
    }

    #[test]
    fn payloads_follow_items_modes_and_optional() {
        let secret = BTreeMap::from([
            ("peer.crt".to_owned(), b"CRT".to_vec()),
            ("peer.key".to_owned(), b"KEY".to_vec()),
        ]);
        let objects = Objects::from([
            ((Kind::Secret, "s".to_owned()), Some(secret)),
            ((Kind::ConfigMap, "gone".to_owned()), None),
        ]);
        let all = build(&[keys(Kind::Secret, "s", false, None)], &objects).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all["peer.key"].mode, 0o400);
        let items = vec![KeyToPath {
            key: "peer.crt".into(),
            path: "/sub/cert.pem".into(),
            mode: Some(0o640),
        }];
        let fixed = Payload::from([(
            "sub/cert.pem".to_owned(),
            FileProjection {
                data: b"FIXED".to_vec(),
                mode: 0o644,
            },
        )]);
        // Projected: in order, a later source wins a path.
        let both = build(
            &[
                Source::Fixed(fixed.clone()),
                keys(Kind::Secret, "s", false, Some(items.clone())),
            ],
            &objects,
        )
        .unwrap();
        assert_eq!(both["sub/cert.pem"].data, b"CRT");
        assert_eq!(both["sub/cert.pem"].mode, 0o640);
        let missing_key = vec![KeyToPath {
            key: "nope".into(),
            path: "x".into(),
            mode: None,
        }];
        assert!(
            build(
                &[keys(Kind::Secret, "s", false, Some(missing_key.clone()))],
                &objects
            )
            .is_err()
        );
        assert!(
            build(
                &[keys(Kind::Secret, "s", true, Some(missing_key))],
                &objects
            )
            .is_ok()
        );
        // A missing object: an error unless optional (then it adds nothing).
        assert!(build(&[keys(Kind::ConfigMap, "gone", false, None)], &objects).is_err());
        assert_eq!(
            build(
                &[
                    Source::Fixed(fixed),
                    keys(Kind::ConfigMap, "gone", true, None)
                ],
                &objects
            )
            .unwrap()
            .len(),
            1
        );
        let escape = vec![KeyToPath {
            key: "peer.crt".into(),
            path: "../escape".into(),
            mode: None,
        }];
        assert!(build(&[keys(Kind::Secret, "s", false, Some(escape))], &objects).is_err());
    }

    #[test]
    fn sub_paths_are_copies_of_the_current_version() {
        let tmp = tempfile::tempdir().unwrap();
        let volume = tmp.path().join("vol");
        let file = |d: &str| FileProjection {
            data: d.as_bytes().to_vec(),
            mode: 0o600,
        };
        let one = Payload::from([
            ("tls.crt".to_owned(), file("one")),
            ("d/x".to_owned(), file("x1")),
        ]);
        atomic_writer::write(&volume, &one).unwrap();
        let dest = tmp.path().join("subpaths/vol/c/0");
        let copy = snapshot_sub_path(&volume, "tls.crt", &dest).unwrap();
        let dir_copy =
            snapshot_sub_path(&volume, "d", &tmp.path().join("subpaths/vol/c/1")).unwrap();
        let two = Payload::from([
            ("tls.crt".to_owned(), file("two")),
            ("d/x".to_owned(), file("x2")),
        ]);
        atomic_writer::write(&volume, &two).unwrap();
        assert_eq!(
            std::fs::read_to_string(volume.join("tls.crt")).unwrap(),
            "two"
        );
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "one");
        assert!(!copy.is_symlink());
        assert_eq!(std::fs::read_to_string(dir_copy.join("x")).unwrap(), "x1");
        // A restarted container gets the current version.
        let copy = snapshot_sub_path(&volume, "tls.crt", &dest).unwrap();
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "two");
        let empty = snapshot_sub_path(&volume, "none", &tmp.path().join("e")).unwrap();
        assert!(empty.is_dir());
    }

    #[test]
    fn wipe_keeps_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data/member")).unwrap();
        std::fs::write(dir.path().join("data/member/x"), "1").unwrap();
        std::fs::write(dir.path().join("y"), "1").unwrap();
        wipe_contents(dir.path()).unwrap();
        assert!(dir.path().is_dir());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(
            uid_marker(Path::new("/a/ns/claim")),
            PathBuf::from("/a/ns/claim.uid")
        );
    }
}
