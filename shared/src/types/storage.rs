//! Where snapshots are kept: CoreOS' storage types and inline sources, shared by
//! [`EtcdBackup`](super::backup::EtcdBackup) (where a backup goes) and
//! [`EtcdRestore`](super::restore::EtcdRestore) (where a restore reads from).
//!
//! The JSON names are CoreOS' (`storageType`, `s3.path`, `s3.awsSecret`, ...), and so is the
//! shape: the source is inline in the spec, one of `s3`, `abs`, `gcs` or `oss`, matching the
//! storage type. This operator adds one type of its own, [`PVC_STORAGE_TYPE`] with the source
//! `pvc` ([`PvcSource`]): a directory or file inside a PersistentVolumeClaim of the namespace,
//! for clusters without object storage.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The storage types CoreOS' API names, as written in `storageType` / `backupStorageType`.
pub const STORAGE_TYPES: [&str; 4] = ["S3", "ABS", "GCS", "OSS"];

/// The storage types this operator writes to and reads from (CoreOS' `OSS` is not one yet).
pub const SUPPORTED_STORAGE_TYPES: [&str; 3] = ["S3", "ABS", "GCS"];

/// This operator's extension storage type (not in CoreOS' API): a PersistentVolumeClaim of the
/// namespace, source `pvc`. Written and read by short-lived pods that mount the claim, not by
/// the controller itself; EtcdBackup and EtcdRestore take it, `spec.safetyBackup` does not.
pub const PVC_STORAGE_TYPE: &str = "PVC";

/// The storage sources, inline in a backup's or a restore's spec (CoreOS' `BackupSource` and
/// `RestoreSource`): exactly the one matching the storage type is set.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct StorageSource {
    /// An S3 bucket of AWS or of any S3-compatible store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Source>,

    /// An Azure Blob Storage container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abs: Option<AbsSource>,

    /// A Google Cloud Storage bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<GcsSource>,

    /// An Alibaba Cloud OSS bucket (CoreOS' API; not supported by this operator yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oss: Option<OssSource>,

    /// A file in a PersistentVolumeClaim of the namespace (this operator's extension, storage
    /// type `PVC`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc: Option<PvcSource>,
}

impl StorageSource {
    /// The source of the given storage type, as the JSON field name and whether it is set.
    pub fn has(&self, storage_type: &str) -> bool {
        match storage_type {
            "S3" => self.s3.is_some(),
            "ABS" => self.abs.is_some(),
            "GCS" => self.gcs.is_some(),
            "OSS" => self.oss.is_some(),
            PVC_STORAGE_TYPE => self.pvc.is_some(),
            _ => false,
        }
    }

    /// A copy holding only the source of `storage_type`; `None` when that one is not set.
    pub fn only(&self, storage_type: &str) -> Option<StorageSource> {
        let mut only = StorageSource::default();
        match storage_type {
            "S3" => only.s3 = Some(self.s3.clone()?),
            "ABS" => only.abs = Some(self.abs.clone()?),
            "GCS" => only.gcs = Some(self.gcs.clone()?),
            "OSS" => only.oss = Some(self.oss.clone()?),
            PVC_STORAGE_TYPE => only.pvc = Some(self.pvc.clone()?),
            _ => return None,
        }
        Some(only)
    }

    /// The `path` of the first source that is set (`s3`, `abs`, `gcs`, `oss`, `pvc` in that
    /// order).
    pub fn path(&self) -> Option<&str> {
        self.s3
            .as_ref()
            .map(|s| s.path.as_str())
            .or_else(|| self.abs.as_ref().map(|s| s.path.as_str()))
            .or_else(|| self.gcs.as_ref().map(|s| s.path.as_str()))
            .or_else(|| self.oss.as_ref().map(|s| s.path.as_str()))
            .or_else(|| self.pvc.as_ref().map(|s| s.path.as_str()))
    }

    /// The storage type of the one source that is set (`S3` for `s3`, ..., `PVC` for `pvc`);
    /// `None` when none or several are.
    pub fn storage_type(&self) -> Option<&'static str> {
        match self.set_sources().as_slice() {
            [one] => STORAGE_TYPES
                .into_iter()
                .chain([PVC_STORAGE_TYPE])
                .find(|t| source_field(t) == Some(*one)),
            _ => None,
        }
    }

    /// The JSON names of the sources that are set.
    pub fn set_sources(&self) -> Vec<&'static str> {
        let mut set = Vec::new();
        if self.s3.is_some() {
            set.push("s3");
        }
        if self.abs.is_some() {
            set.push("abs");
        }
        if self.gcs.is_some() {
            set.push("gcs");
        }
        if self.oss.is_some() {
            set.push("oss");
        }
        if self.pvc.is_some() {
            set.push("pvc");
        }
        set
    }
}

/// The JSON field of the source that goes with a storage type (`S3` -> `s3`).
pub fn source_field(storage_type: &str) -> Option<&'static str> {
    match storage_type {
        "S3" => Some("s3"),
        "ABS" => Some("abs"),
        "GCS" => Some("gcs"),
        "OSS" => Some("oss"),
        PVC_STORAGE_TYPE => Some("pvc"),
        _ => None,
    }
}

/// An S3 location (CoreOS' `S3BackupSource` / `S3RestoreSource`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct S3Source {
    /// BUCKET/KEY of the snapshot object, such as `etcd-backups/example/snapshot.db`. A
    /// periodic backup appends `_v<revision>_<time as 2006-01-02-15:04:05>` to the key of each
    /// snapshot it takes.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub path: String,

    /// Name of a Secret in the same namespace with the AWS shared files: key `credentials`
    /// (a `[default]` profile with aws_access_key_id and aws_secret_access_key) and optionally
    /// key `config` (a `[default]` profile with region).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub aws_secret: String,

    /// URL of an S3-compatible store, such as `http://minio.storage:9000`; blank means AWS.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 2048))]
    pub endpoint: String,

    /// Address buckets by path (`ENDPOINT/BUCKET/KEY`) instead of by host name
    /// (`BUCKET.ENDPOINT/KEY`): what most S3-compatible stores need.
    #[serde(default)]
    pub force_path_style: bool,
}

/// An Azure Blob Storage location (CoreOS' `ABSBackupSource`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbsSource {
    /// CONTAINER/BLOB of the snapshot.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub path: String,

    /// Secret with keys `storage-account`, `storage-key` and optionally `cloud`
    /// (`AzurePublicCloud`, the default, `AzureChinaCloud`, `AzureGermanCloud` or
    /// `AzureUSGovernmentCloud`).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub abs_secret: String,

    /// This operator's extension (CoreOS has no such field): URL of the Blob service, such as
    /// `http://azurite.storage:10000/devstoreaccount1` (Azurite, path-style) or an Azure Stack
    /// endpoint; blank means `https://ACCOUNT.blob.<the cloud's suffix>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 2048))]
    pub endpoint: String,
}

/// A Google Cloud Storage location (CoreOS' `GCSBackupSource`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GcsSource {
    /// BUCKET/OBJECT of the snapshot.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub path: String,

    /// Secret with key `access-token` or `credentials.json`; blank for the default account.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 253))]
    pub gcp_secret: String,
}

/// An Alibaba Cloud OSS location (CoreOS' `OSSBackupSource`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OssSource {
    /// BUCKET/OBJECT of the snapshot.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub path: String,

    /// Secret with keys `accessKeyID` and `accessKeySecret`.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub oss_secret: String,

    /// OSS endpoint, such as `http://oss-cn-hangzhou.aliyuncs.com`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 2048))]
    pub endpoint: String,
}

/// A file inside a PersistentVolumeClaim (this operator's extension, storage type `PVC`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PvcSource {
    /// Name of a PersistentVolumeClaim of the same namespace. A backup's pod mounts it
    /// read-write, a restore's pods read-only: with ReadWriteOnce, the claim must be
    /// attachable to the node those pods land on.
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub claim_name: String,

    /// The snapshot file, relative to the claim's root, such as `example/snapshot.db`
    /// (directories are created). A periodic backup appends
    /// `_v<revision>_<time as 2006-01-02-15:04:05>` to the file name of each snapshot it
    /// takes; each snapshot has its metadata beside it in `<file>.meta.json`.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub path: String,
}

/// Splits an object path `BUCKET/KEY` into the bucket and the key; `None` when either is empty.
pub fn split_path(path: &str) -> Option<(&str, &str)> {
    let (bucket, key) = path.split_once('/')?;
    (!bucket.is_empty() && !key.is_empty()).then_some((bucket, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_at_the_first_slash() {
        assert_eq!(split_path("b/k"), Some(("b", "k")));
        assert_eq!(split_path("b/dir/k.db"), Some(("b", "dir/k.db")));
        assert_eq!(split_path("b/"), None);
        assert_eq!(split_path("/k"), None);
        assert_eq!(split_path("bk"), None);
    }

    #[test]
    fn each_type_has_its_source_field() {
        for t in STORAGE_TYPES.iter().chain([&PVC_STORAGE_TYPE]) {
            let field = source_field(t).expect("a field");
            assert_eq!(field, t.to_ascii_lowercase());
        }
        assert_eq!(source_field("s3"), None);
        let s = StorageSource {
            s3: Some(S3Source::default()),
            ..StorageSource::default()
        };
        assert!(s.has("S3"));
        assert!(!s.has("GCS"));
        assert_eq!(s.set_sources(), vec!["s3"]);
        assert_eq!(s.storage_type(), Some("S3"));
        let both = StorageSource {
            gcs: Some(GcsSource::default()),
            ..s
        };
        assert_eq!(both.storage_type(), None);
        assert_eq!(StorageSource::default().storage_type(), None);
        assert_eq!(both.only("GCS").and_then(|o| o.storage_type()), Some("GCS"));
        assert_eq!(both.only("ABS"), None);
        let p = StorageSource {
            pvc: Some(PvcSource::default()),
            ..StorageSource::default()
        };
        assert!(p.has("PVC"));
        assert!(!p.has("S3"));
        assert_eq!(p.set_sources(), vec!["pvc"]);
        assert_eq!(p.storage_type(), Some("PVC"));
        assert_eq!(p.path(), Some(""));
        assert_eq!(p.only("PVC"), Some(p.clone()));
        assert_eq!(p.only("S3"), None);
    }
}
