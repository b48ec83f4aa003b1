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
//!   the pod starts; they are not refreshed while it runs.
//! - `hostPath` is the host path itself.
//!
//! Containers see these directories through mount-path rewriting (see [`super::expand`]).

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

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

/// Writes `bytes` to `dir/relative` with `mode` (replacing a read-only file of an earlier
/// attempt).
fn write_file(dir: &Path, relative: &str, bytes: &[u8], mode: u32) -> Result<(), VolumeError> {
    let relative = relative.trim_start_matches('/');
    if relative.split('/').any(|c| c == "..") {
        return Err(VolumeError::Missing(format!(
            "refusing path {relative:?} outside the volume"
        )));
    }
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        create_dir(parent)?;
    }
    let _ = std::fs::remove_file(&path);
    std::fs::write(&path, bytes).map_err(io(format!("writing {}", path.display())))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o777))
        .map_err(io(format!("chmod {}", path.display())))
}

/// Writes `keys` (key → bytes) into `dir`, all of them or the `items` selected.
fn write_keys(
    dir: &Path,
    what: &str,
    keys: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    default_mode: u32,
    optional: bool,
) -> Result<(), VolumeError> {
    match items {
        None => {
            for (key, bytes) in keys {
                write_file(dir, key, bytes, default_mode)?;
            }
        }
        Some(items) => {
            for item in items {
                match keys.get(&item.key) {
                    Some(bytes) => write_file(
                        dir,
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

/// Sets up the pod's volumes and returns volume name → host directory.
pub async fn prepare(
    client: &kube::Client,
    dirs: &KubeletDirs,
    pod: &Pod,
    sources: &EnvSources,
) -> Result<BTreeMap<String, PathBuf>, VolumeError> {
    let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let mut out = BTreeMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let dir = if let Some(claim) = &volume.persistent_volume_claim {
            ensure_claim(client, dirs, ns, &claim.claim_name).await?
        } else if let Some(host) = &volume.host_path {
            let path = PathBuf::from(&host.path);
            if host.type_.as_deref() == Some("DirectoryOrCreate") {
                create_dir(&path)?;
            }
            path
        } else {
            let dir = dirs.pod_volume_dir(uid, &volume.name);
            create_dir(&dir)?;
            fill(client, ns, pod, volume, &dir, sources).await?;
            dir
        };
        out.insert(volume.name.clone(), dir);
    }
    Ok(out)
}

/// Fills a pod-local volume directory (emptyDir stays empty).
async fn fill(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    volume: &Volume,
    dir: &Path,
    sources: &EnvSources,
) -> Result<(), VolumeError> {
    if volume.empty_dir.is_some() {
        return Ok(());
    }
    if let Some(s) = &volume.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let mode = s.default_mode.map_or(0o644, |m| m as u32);
        return write_secret(
            client,
            ns,
            &name,
            dir,
            s.items.as_deref(),
            mode,
            s.optional.unwrap_or(false),
        )
        .await;
    }
    if let Some(c) = &volume.config_map {
        let mode = c.default_mode.map_or(0o644, |m| m as u32);
        return write_config_map(
            client,
            ns,
            &c.name,
            dir,
            c.items.as_deref(),
            mode,
            c.optional.unwrap_or(false),
        )
        .await;
    }
    if let Some(d) = &volume.downward_api {
        let mode = d.default_mode.map_or(0o644, |m| m as u32);
        return write_downward(
            pod,
            sources,
            dir,
            d.items.as_deref().unwrap_or_default(),
            mode,
        );
    }
    if let Some(p) = &volume.projected {
        let mode = p.default_mode.map_or(0o644, |m| m as u32);
        for source in p.sources.iter().flatten() {
            project(client, ns, pod, sources, dir, source, mode).await?;
        }
        return Ok(());
    }
    Err(VolumeError::Unsupported {
        volume: volume.name.clone(),
    })
}

async fn write_secret(
    client: &kube::Client,
    ns: &str,
    name: &str,
    dir: &Path,
    items: Option<&[KeyToPath]>,
    mode: u32,
    optional: bool,
) -> Result<(), VolumeError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    match secrets
        .get_opt(name)
        .await
        .map_err(api(format!("getting secret {name}")))?
    {
        Some(secret) => write_keys(
            dir,
            &format!("secret {name}"),
            &secret_keys(&secret),
            items,
            mode,
            optional,
        ),
        None if optional => Ok(()),
        None => Err(VolumeError::Missing(format!("secret {name:?} not found"))),
    }
}

async fn write_config_map(
    client: &kube::Client,
    ns: &str,
    name: &str,
    dir: &Path,
    items: Option<&[KeyToPath]>,
    mode: u32,
    optional: bool,
) -> Result<(), VolumeError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    match maps
        .get_opt(name)
        .await
        .map_err(api(format!("getting configmap {name}")))?
    {
        Some(map) => write_keys(
            dir,
            &format!("configmap {name}"),
            &config_map_keys(&map),
            items,
            mode,
            optional,
        ),
        None if optional => Ok(()),
        None => Err(VolumeError::Missing(format!(
            "configmap {name:?} not found"
        ))),
    }
}

fn write_downward(
    pod: &Pod,
    sources: &EnvSources,
    dir: &Path,
    items: &[DownwardAPIVolumeFile],
    mode: u32,
) -> Result<(), VolumeError> {
    for item in items {
        let Some(field) = &item.field_ref else {
            return Err(VolumeError::Missing(format!(
                "downwardAPI {}: only fieldRef items are supported",
                item.path
            )));
        };
        let value = field_value(pod, sources, &field.field_path)
            .map_err(|e| VolumeError::Missing(format!("downwardAPI {}: {e}", item.path)))?;
        write_file(
            dir,
            &item.path,
            value.as_bytes(),
            item.mode.map_or(mode, |m| m as u32),
        )?;
    }
    Ok(())
}

async fn project(
    client: &kube::Client,
    ns: &str,
    pod: &Pod,
    sources: &EnvSources,
    dir: &Path,
    source: &VolumeProjection,
    mode: u32,
) -> Result<(), VolumeError> {
    if let Some(s) = &source.secret {
        write_secret(
            client,
            ns,
            &s.name,
            dir,
            s.items.as_deref(),
            mode,
            s.optional.unwrap_or(false),
        )
        .await?;
    }
    if let Some(c) = &source.config_map {
        write_config_map(
            client,
            ns,
            &c.name,
            dir,
            c.items.as_deref(),
            mode,
            c.optional.unwrap_or(false),
        )
        .await?;
    }
    if let Some(d) = &source.downward_api {
        write_downward(
            pod,
            sources,
            dir,
            d.items.as_deref().unwrap_or_default(),
            mode,
        )?;
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
        write_file(dir, &t.path, token.as_bytes(), mode)?;
    }
    Ok(())
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

    #[test]
    fn keys_are_written_with_items_and_modes() {
        let dir = tempfile::tempdir().unwrap();
        let keys = BTreeMap::from([
            ("peer.crt".to_owned(), b"CRT".to_vec()),
            ("peer.key".to_owned(), b"KEY".to_vec()),
        ]);
        write_keys(dir.path(), "secret s", &keys, None, 0o400, false).unwrap();
        // A second attempt replaces read-only files.
        write_keys(dir.path(), "secret s", &keys, None, 0o400, false).unwrap();
        let meta = std::fs::metadata(dir.path().join("peer.key")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o400);
        let items = [KeyToPath {
            key: "peer.crt".into(),
            path: "sub/cert.pem".into(),
            mode: None,
        }];
        write_keys(dir.path(), "secret s", &keys, Some(&items), 0o644, false).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("sub/cert.pem")).unwrap(),
            b"CRT"
        );
        let missing = [KeyToPath {
            key: "nope".into(),
            path: "x".into(),
            mode: None,
        }];
        assert!(write_keys(dir.path(), "secret s", &keys, Some(&missing), 0o644, false).is_err());
        assert!(write_keys(dir.path(), "secret s", &keys, Some(&missing), 0o644, true).is_ok());
        assert!(write_file(dir.path(), "../escape", b"", 0o644).is_err());
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
