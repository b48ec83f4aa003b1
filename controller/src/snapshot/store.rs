//! Object storage for snapshots, through the `object_store` crate, for the three storage
//! types of CoreOS' API this operator supports:
//!
//! - `S3`: a bucket of AWS or of any S3-compatible store (`s3`: `path`, `awsSecret`,
//!   `endpoint`, `forcePathStyle`), with the credentials and region of the AWS shared files the
//!   `awsSecret` holds (keys `credentials` and `config`, profile `default`);
//! - `ABS`: an Azure Blob Storage container (`abs`: `path`, `absSecret` with keys
//!   `storage-account`, `storage-key` and optionally `cloud`; our extension `endpoint` reaches
//!   Azurite or Azure Stack), signed with the account's Shared Key;
//! - `GCS`: a Google Cloud Storage bucket (`gcs`: `path`, optional `gcpSecret` with key
//!   `access-token`, a static OAuth bearer token, or `credentials.json`, a service-account key;
//!   no secret means the application default credentials of the process).
//!
//! One [`StoreLocation`] (built from the spec's `StorageSource` by backups, restores and the
//! seed member's fetch alike) and one [`Credentials`] (read from the secret's keys, whether
//! they come from the API or from files mounted in a pod) open one [`ObjectStore`]: every
//! upload, download, listing and deletion after that is the same code for every store.
//!
//! `object_store` was chosen over OpenDAL: it is the smaller of the two for the services
//! needed (multipart upload, streaming reads, user metadata), its multipart writer bounds
//! memory by part size and parts in flight, and it builds on `reqwest`/`rustls` with `ring`,
//! the TLS stack the operator already uses. Neither reads the AWS shared files from a
//! Secret's bytes, so [`AwsProfile::parse`] does, with the `rust-ini` crate.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use etcd_shared::types::storage::{S3Source, StorageSource, split_path};

/// The region used when the `config` file names none (the AWS default; most S3-compatible
/// stores accept any region).
pub const DEFAULT_REGION: &str = "us-east-1";

/// The Secret keys CoreOS' `awsSecret` holds.
pub const CREDENTIALS_KEY: &str = "credentials";
/// The Secret key of the AWS `config` file (optional).
pub const CONFIG_KEY: &str = "config";
/// The `absSecret` key of the storage account's name.
pub const ABS_ACCOUNT_KEY: &str = "storage-account";
/// The `absSecret` key of the storage account's access key (base64, as Azure shows it).
pub const ABS_STORAGE_KEY: &str = "storage-key";
/// The `absSecret` key naming the Azure cloud (optional; CoreOS' names).
pub const ABS_CLOUD_KEY: &str = "cloud";
/// The `gcpSecret` key of a static OAuth 2.0 access token.
pub const GCS_TOKEN_KEY: &str = "access-token";
/// The `gcpSecret` key of a service-account key file (JSON).
pub const GCS_CREDENTIALS_KEY: &str = "credentials.json";

/// The profile read from the shared files.
const PROFILE: &str = "default";

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The storage type is not one this operator writes to.
    #[error("storage type {0:?} is not supported (supported: S3, ABS, GCS)")]
    Unsupported(String),
    /// The source matching the storage type is missing.
    #[error("storage type {storage_type} needs the {field} source")]
    NoSource {
        /// The storage type.
        storage_type: &'static str,
        /// Its source's JSON field.
        field: &'static str,
    },
    /// The source's `path` is not `BUCKET/KEY` (`CONTAINER/BLOB` for ABS).
    #[error("{field}.path {path:?} is not {shape}")]
    BadPath {
        /// The source's JSON field (`s3`, `abs`, `gcs`).
        field: &'static str,
        /// `BUCKET/KEY` or `CONTAINER/BLOB`.
        shape: &'static str,
        /// The path.
        path: String,
    },
    /// The source names no secret, and its store needs one.
    #[error("{0} is not set")]
    NoSecret(&'static str),
    /// A key the store needs is not in the secret.
    #[error("the secret has no key {0}")]
    MissingKey(&'static str),
    /// A key of the secret cannot be used.
    #[error("the secret's key {key} {message}")]
    BadValue {
        /// The key.
        key: &'static str,
        /// Why, in words.
        message: String,
    },
    /// The `cloud` of an `absSecret` is not one of CoreOS' names.
    #[error(
        "the absSecret's cloud {0:?} is not one of AzurePublicCloud, AzureChinaCloud, AzureGermanCloud, AzureUSGovernmentCloud"
    )]
    UnknownCloud(String),
    /// The credentials are of another store than the location (a caller's mistake).
    #[error("the credentials are not those of a {0} store")]
    WrongCredentials(&'static str),
    /// A shared file is not INI.
    #[error("the awsSecret's {file} file is not in the AWS shared-file format: {message}")]
    BadFile {
        /// `credentials` or `config`.
        file: &'static str,
        /// The parser's message.
        message: String,
    },
    /// The `credentials` file has no usable `[default]` profile.
    #[error(
        "the awsSecret's credentials file has no [default] profile with aws_access_key_id and aws_secret_access_key"
    )]
    NoProfile,
    /// `object_store` refused the configuration (a bad endpoint URL or access key, say).
    #[error("cannot use the object store: {0}")]
    Build(#[source] object_store::Error),
}

impl StoreError {
    /// A static label for metrics and status reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::Unsupported(_) | StoreError::NoSource { .. } => "UnsupportedStorage",
            StoreError::BadPath { .. } => "BadPath",
            StoreError::NoSecret(_) | StoreError::MissingKey(_) => "BadSecret",
            StoreError::BadFile { .. }
            | StoreError::NoProfile
            | StoreError::BadValue { .. }
            | StoreError::UnknownCloud(_)
            | StoreError::WrongCredentials(_) => "BadCredentials",
            StoreError::Build(_) => "BadStore",
        }
    }

    /// Whether only a change of the spec can fix it (no retry helps).
    pub fn needs_spec_change(&self) -> bool {
        matches!(
            self,
            StoreError::Unsupported(_)
                | StoreError::NoSource { .. }
                | StoreError::BadPath { .. }
                | StoreError::NoSecret(_)
        )
    }
}

/// The `[default]` profile of the AWS shared files.
#[derive(Clone, PartialEq, Eq)]
pub struct AwsProfile {
    /// `aws_access_key_id`.
    pub access_key_id: String,
    /// `aws_secret_access_key`.
    pub secret_access_key: String,
    /// `aws_session_token`, for temporary credentials.
    pub session_token: Option<String>,
    /// `region` from the `config` file (or the `credentials` file), else [`DEFAULT_REGION`].
    pub region: String,
}

impl std::fmt::Debug for AwsProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys.
        f.debug_struct("AwsProfile")
            .field("access_key_id", &"<redacted>")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

fn parse_ini(text: &str, file: &'static str) -> Result<ini::Ini, StoreError> {
    ini::Ini::load_from_str(text).map_err(|e| StoreError::BadFile {
        file,
        message: e.to_string(),
    })
}

/// The value of `key` in `section`, trimmed, if set and not empty.
fn value(doc: &ini::Ini, section: &str, key: &str) -> Option<String> {
    doc.section(Some(section))?
        .get(key)
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

impl AwsProfile {
    /// Reads the `[default]` profile from the `credentials` file and, when given, the region
    /// from the `config` file (`[default]` or `[profile default]`).
    pub fn parse(credentials: &str, config: Option<&str>) -> Result<Self, StoreError> {
        let creds = parse_ini(credentials, CREDENTIALS_KEY)?;
        let access_key_id =
            value(&creds, PROFILE, "aws_access_key_id").ok_or(StoreError::NoProfile)?;
        let secret_access_key =
            value(&creds, PROFILE, "aws_secret_access_key").ok_or(StoreError::NoProfile)?;
        let session_token = value(&creds, PROFILE, "aws_session_token");
        let config = config.map(|c| parse_ini(c, CONFIG_KEY)).transpose()?;
        let region = config
            .as_ref()
            .and_then(|c| {
                value(c, PROFILE, "region").or_else(|| value(c, "profile default", "region"))
            })
            .or_else(|| value(&creds, PROFILE, "region"))
            .unwrap_or_else(|| DEFAULT_REGION.to_string());
        Ok(AwsProfile {
            access_key_id,
            secret_access_key,
            session_token,
            region,
        })
    }
}

/// The Azure clouds CoreOS' `absSecret` may name in its `cloud` key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AzureCloud {
    /// `AzurePublicCloud` (also when `cloud` is absent or blank).
    #[default]
    Public,
    /// `AzureChinaCloud`.
    China,
    /// `AzureGermanCloud`.
    German,
    /// `AzureUSGovernmentCloud`.
    UsGovernment,
}

impl AzureCloud {
    /// The cloud a `cloud` value names (CoreOS' names, compared without regard to case as
    /// the Azure SDK CoreOS used did); blank is the public cloud.
    pub fn parse(name: &str) -> Result<Self, StoreError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "" | "azurepubliccloud" => Ok(AzureCloud::Public),
            "azurechinacloud" => Ok(AzureCloud::China),
            "azuregermancloud" => Ok(AzureCloud::German),
            "azureusgovernmentcloud" => Ok(AzureCloud::UsGovernment),
            _ => Err(StoreError::UnknownCloud(name.trim().to_string())),
        }
    }

    /// The DNS suffix of the cloud's Blob service (the account's host is `ACCOUNT.SUFFIX`).
    pub fn blob_suffix(self) -> &'static str {
        match self {
            AzureCloud::Public => "blob.core.windows.net",
            AzureCloud::China => "blob.core.chinacloudapi.cn",
            AzureCloud::German => "blob.core.cloudapi.de",
            AzureCloud::UsGovernment => "blob.core.usgovcloudapi.net",
        }
    }
}

/// The storage account of an `absSecret`.
#[derive(Clone, PartialEq, Eq)]
pub struct AzureAccount {
    /// `storage-account`.
    pub account: String,
    /// `storage-key` (base64).
    pub key: String,
    /// `cloud`.
    pub cloud: AzureCloud,
}

impl std::fmt::Debug for AzureAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("AzureAccount")
            .field("account", &self.account)
            .field("cloud", &self.cloud)
            .finish_non_exhaustive()
    }
}

/// How a GCS client authenticates.
#[derive(Clone, PartialEq, Eq)]
pub enum GcpCredentials {
    /// No `gcpSecret`: the application default credentials of the process
    /// (`GOOGLE_APPLICATION_CREDENTIALS`, gcloud's file, else the metadata server).
    Default,
    /// `access-token`: a static OAuth 2.0 bearer token (not refreshed).
    AccessToken(String),
    /// `credentials.json`: a service-account key. Its `gcs_base_url` and `disable_oauth`
    /// members (read by `object_store`) point it at another server, such as a local one.
    ServiceAccount {
        /// The JSON text.
        json: String,
        /// Its `gcs_base_url`, when set.
        base_url: Option<String>,
    },
}

impl std::fmt::Debug for GcpCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token or the key.
        match self {
            GcpCredentials::Default => f.write_str("Default"),
            GcpCredentials::AccessToken(_) => f.write_str("AccessToken(<redacted>)"),
            GcpCredentials::ServiceAccount { base_url, .. } => f
                .debug_struct("ServiceAccount")
                .field("base_url", base_url)
                .finish_non_exhaustive(),
        }
    }
}

/// The keys of a secret: the text of a key, `None` when the key is absent (read from the API
/// by the controller, from mounted files by the seed member's fetch).
pub type SecretKeys<'a> = dyn Fn(&str) -> Option<String> + 'a;

/// The credentials of one store, as its secret holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// An `awsSecret`'s `[default]` profile.
    Aws(AwsProfile),
    /// An `absSecret`'s storage account.
    Azure(AzureAccount),
    /// A `gcpSecret`'s token or key, or the default credentials.
    Gcp(GcpCredentials),
}

impl Credentials {
    /// Reads the credentials of a store of `backend` from its secret: `secret` gives the text
    /// of a key of the secret (`None` when the key is absent), or is `None` when the source
    /// names no secret (allowed for GCS only: the default credentials).
    pub fn read(backend: &Backend, secret: Option<&SecretKeys<'_>>) -> Result<Self, StoreError> {
        let Some(get) = secret else {
            return match backend {
                Backend::S3 { .. } => Err(StoreError::NoSecret("s3.awsSecret")),
                Backend::Abs { .. } => Err(StoreError::NoSecret("abs.absSecret")),
                Backend::Gcs => Ok(Credentials::Gcp(GcpCredentials::Default)),
            };
        };
        // A key set to blanks counts as absent.
        let get = |key: &str| get(key).filter(|v| !v.trim().is_empty());
        match backend {
            Backend::S3 { .. } => {
                let credentials =
                    get(CREDENTIALS_KEY).ok_or(StoreError::MissingKey(CREDENTIALS_KEY))?;
                let config = get(CONFIG_KEY);
                Ok(Credentials::Aws(AwsProfile::parse(
                    &credentials,
                    config.as_deref(),
                )?))
            }
            Backend::Abs { .. } => {
                let account =
                    get(ABS_ACCOUNT_KEY).ok_or(StoreError::MissingKey(ABS_ACCOUNT_KEY))?;
                let key = get(ABS_STORAGE_KEY).ok_or(StoreError::MissingKey(ABS_STORAGE_KEY))?;
                let cloud = AzureCloud::parse(&get(ABS_CLOUD_KEY).unwrap_or_default())?;
                Ok(Credentials::Azure(AzureAccount {
                    account: account.trim().to_string(),
                    key: key.trim().to_string(),
                    cloud,
                }))
            }
            Backend::Gcs => {
                if let Some(token) = get(GCS_TOKEN_KEY) {
                    return Ok(Credentials::Gcp(GcpCredentials::AccessToken(
                        token.trim().to_string(),
                    )));
                }
                let json = get(GCS_CREDENTIALS_KEY)
                    .ok_or(StoreError::MissingKey("access-token or credentials.json"))?;
                let value: serde_json::Value =
                    serde_json::from_str(&json).map_err(|e| StoreError::BadValue {
                        key: GCS_CREDENTIALS_KEY,
                        message: format!("is not JSON: {e}"),
                    })?;
                let Some(object) = value.as_object() else {
                    return Err(StoreError::BadValue {
                        key: GCS_CREDENTIALS_KEY,
                        message: "is not a JSON object (a service-account key)".into(),
                    });
                };
                let base_url = object
                    .get("gcs_base_url")
                    .and_then(|u| u.as_str())
                    .map(|u| u.trim_end_matches('/').to_string());
                Ok(Credentials::Gcp(GcpCredentials::ServiceAccount {
                    json,
                    base_url,
                }))
            }
        }
    }
}

/// The keys of each store's secret, in the order they are read.
pub fn secret_keys(backend: &Backend) -> &'static [&'static str] {
    match backend {
        Backend::S3 { .. } => &[CREDENTIALS_KEY, CONFIG_KEY],
        Backend::Abs { .. } => &[ABS_ACCOUNT_KEY, ABS_STORAGE_KEY, ABS_CLOUD_KEY],
        Backend::Gcs => &[GCS_TOKEN_KEY, GCS_CREDENTIALS_KEY],
    }
}

/// Which store, and how it is reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// S3.
    S3 {
        /// The store's URL; `None` for AWS.
        endpoint: Option<String>,
        /// Buckets addressed by path rather than by host name.
        force_path_style: bool,
    },
    /// Azure Blob Storage.
    Abs {
        /// The Blob service's URL (our `endpoint` extension); `None` for the account's host
        /// in its cloud.
        endpoint: Option<String>,
    },
    /// Google Cloud Storage.
    Gcs,
}

/// One object (or, for a periodic backup, the prefix of its objects) in a bucket or
/// container, as a backup's or restore's storage source names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreLocation {
    /// The store.
    pub backend: Backend,
    /// The bucket (the container, for ABS).
    pub bucket: String,
    /// The object key (for a periodic backup, the prefix of every snapshot's key).
    pub key: String,
    /// The name of the secret holding the credentials; empty for none (GCS's default
    /// credentials).
    pub secret: String,
}

fn trimmed_url(url: &str) -> Option<String> {
    let url = url.trim();
    (!url.is_empty()).then(|| url.trim_end_matches('/').to_string())
}

impl StoreLocation {
    /// The location the source of `storage_type` names (`S3`, `ABS` or `GCS`).
    pub fn from_source(storage_type: &str, source: &StorageSource) -> Result<Self, StoreError> {
        let split = |field: &'static str, shape: &'static str, path: &str| {
            split_path(path)
                .map(|(b, k)| (b.to_string(), k.to_string()))
                .ok_or_else(|| StoreError::BadPath {
                    field,
                    shape,
                    path: path.to_string(),
                })
        };
        let missing = |storage_type: &'static str, field: &'static str| StoreError::NoSource {
            storage_type,
            field,
        };
        match storage_type {
            "S3" => Self::s3(source.s3.as_ref().ok_or(missing("S3", "s3"))?),
            "ABS" => {
                let abs = source.abs.as_ref().ok_or(missing("ABS", "abs"))?;
                let (bucket, key) = split("abs", "CONTAINER/BLOB", &abs.path)?;
                Ok(StoreLocation {
                    backend: Backend::Abs {
                        endpoint: trimmed_url(&abs.endpoint),
                    },
                    bucket,
                    key,
                    secret: abs.abs_secret.clone(),
                })
            }
            "GCS" => {
                let gcs = source.gcs.as_ref().ok_or(missing("GCS", "gcs"))?;
                let (bucket, key) = split("gcs", "BUCKET/OBJECT", &gcs.path)?;
                Ok(StoreLocation {
                    backend: Backend::Gcs,
                    bucket,
                    key,
                    secret: gcs.gcp_secret.clone(),
                })
            }
            other => Err(StoreError::Unsupported(other.to_string())),
        }
    }

    /// The location an `s3` source names.
    pub fn s3(source: &S3Source) -> Result<Self, StoreError> {
        let (bucket, key) = split_path(&source.path).ok_or_else(|| StoreError::BadPath {
            field: "s3",
            shape: "BUCKET/KEY",
            path: source.path.clone(),
        })?;
        Ok(StoreLocation {
            backend: Backend::S3 {
                endpoint: trimmed_url(&source.endpoint),
                // As in CoreOS' operator: virtual-hosted requests unless `forcePathStyle`
                // (which most S3-compatible stores need) is set.
                force_path_style: source.force_path_style,
            },
            bucket: bucket.to_string(),
            key: key.to_string(),
            secret: source.aws_secret.clone(),
        })
    }

    /// `BUCKET/KEY` of an object of this bucket.
    pub fn display(&self, key: &str) -> String {
        format!("{}/{key}", self.bucket)
    }

    /// How snapshot metadata is named in this store (see [`super::transfer::meta`]).
    pub fn metadata_names(&self) -> super::transfer::meta::Names {
        match self.backend {
            // Azure's metadata names are C# identifiers: no '-'.
            Backend::Abs { .. } => super::transfer::meta::Names::Underscores,
            Backend::S3 { .. } | Backend::Gcs => super::transfer::meta::Names::Hyphens,
        }
    }
}

/// Timeouts and retries of store requests.
#[derive(Debug, Clone, Copy)]
pub struct StoreTimeouts {
    /// Connecting to the store.
    pub connect: Duration,
    /// Longest wait for the next bytes of a response (a whole download of a large snapshot
    /// may take longer; its bound is the backup's or restore's own timeout).
    pub read: Duration,
    /// Retries of one request (with exponential backoff), and the longest time they may take.
    pub retries: usize,
    /// Longest time retries of one request may take.
    pub retry_timeout: Duration,
}

impl Default for StoreTimeouts {
    fn default() -> Self {
        StoreTimeouts {
            connect: Duration::from_secs(5),
            read: Duration::from_secs(30),
            retries: 3,
            retry_timeout: Duration::from_secs(60),
        }
    }
}

/// The keys of every object beside `prefix`'s last component: stores list by directory, and
/// a backup's periodic snapshots, segments' directory and markers are named from `prefix`.
pub async fn keys_beside(
    bucket: &dyn ObjectStore,
    prefix: &str,
) -> Result<Vec<String>, object_store::Error> {
    use futures::TryStreamExt as _;
    let dir = prefix
        .rsplit_once('/')
        .map(|(d, _)| object_store::path::Path::from(d));
    bucket
        .list(dir.as_ref())
        .map_ok(|m| m.location.to_string())
        .try_collect()
        .await
}

/// Opens the bucket (or container) of `location` with `credentials`.
pub fn open(
    location: &StoreLocation,
    credentials: &Credentials,
    timeouts: StoreTimeouts,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    install_tls_provider();
    let endpoint = match (&location.backend, credentials) {
        (Backend::S3 { endpoint, .. }, _) | (Backend::Abs { endpoint }, _) => endpoint.clone(),
        (Backend::Gcs, Credentials::Gcp(GcpCredentials::ServiceAccount { base_url, .. })) => {
            base_url.clone()
        }
        (Backend::Gcs, _) => None,
    };
    let http = endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("http://"));
    let client = ClientOptions::new()
        .with_allow_http(http)
        .with_connect_timeout(timeouts.connect)
        .with_timeout_disabled()
        .with_read_timeout(timeouts.read)
        .with_pool_max_idle_per_host(2);
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: timeouts.retries,
        retry_timeout: timeouts.retry_timeout,
    };
    let store: Arc<dyn ObjectStore> = match (&location.backend, credentials) {
        (
            Backend::S3 {
                force_path_style, ..
            },
            Credentials::Aws(profile),
        ) => {
            let mut builder = AmazonS3Builder::new()
                .with_bucket_name(&location.bucket)
                .with_region(&profile.region)
                .with_access_key_id(&profile.access_key_id)
                .with_secret_access_key(&profile.secret_access_key)
                .with_virtual_hosted_style_request(!force_path_style)
                .with_client_options(client)
                .with_retry(retry);
            if let Some(token) = &profile.session_token {
                builder = builder.with_token(token);
            }
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            Arc::new(builder.build().map_err(StoreError::Build)?)
        }
        (Backend::Abs { .. }, Credentials::Azure(account)) => {
            // The account's URL; with an endpoint (Azurite, Azure Stack) the container is
            // addressed below its path, as in `http://127.0.0.1:10000/devstoreaccount1`.
            let url = endpoint.unwrap_or_else(|| {
                format!(
                    "https://{}.{}",
                    account.account,
                    account.cloud.blob_suffix()
                )
            });
            let builder = MicrosoftAzureBuilder::new()
                .with_account(&account.account)
                .with_access_key(&account.key)
                .with_container_name(&location.bucket)
                .with_endpoint(url)
                .with_client_options(client)
                .with_retry(retry);
            Arc::new(builder.build().map_err(StoreError::Build)?)
        }
        (Backend::Gcs, Credentials::Gcp(gcp)) => {
            let mut builder = GoogleCloudStorageBuilder::new()
                .with_bucket_name(&location.bucket)
                .with_client_options(client)
                .with_retry(retry);
            builder = match gcp {
                GcpCredentials::Default => builder,
                GcpCredentials::AccessToken(token) => builder.with_bearer_token(token),
                GcpCredentials::ServiceAccount { json, .. } => {
                    builder.with_service_account_key(json)
                }
            };
            Arc::new(builder.build().map_err(StoreError::Build)?)
        }
        (Backend::S3 { .. }, _) => return Err(StoreError::WrongCredentials("S3")),
        (Backend::Abs { .. }, _) => return Err(StoreError::WrongCredentials("ABS")),
        (Backend::Gcs, _) => return Err(StoreError::WrongCredentials("GCS")),
    };
    Ok(store)
}

/// `reqwest` is built with `rustls` and no crypto provider of its own: the process uses `ring`,
/// like every other TLS client and server of the operator.
fn install_tls_provider() {
    // An error only says a provider is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_profile_and_region_are_read_from_the_shared_files() {
        let creds = "[other]\naws_access_key_id = X\naws_secret_access_key = Y\n\n[default]\naws_access_key_id = AKID\naws_secret_access_key = SECRET\naws_session_token=TOKEN\n";
        let p = AwsProfile::parse(creds, Some("[default]\nregion = eu-west-1\n")).expect("ok");
        assert_eq!(p.access_key_id, "AKID");
        assert_eq!(p.secret_access_key, "SECRET");
        assert_eq!(p.session_token.as_deref(), Some("TOKEN"));
        assert_eq!(p.region, "eu-west-1");
        let p = AwsProfile::parse(creds, Some("[profile default]\nregion=ap-south-1")).unwrap();
        assert_eq!(p.region, "ap-south-1");
        let p = AwsProfile::parse(creds, None).unwrap();
        assert_eq!(p.region, DEFAULT_REGION);
        assert!(
            !format!("{p:?}").contains("SECRET"),
            "Debug never shows keys"
        );
    }

    #[test]
    fn unusable_files_are_refused_with_the_reason() {
        assert!(matches!(
            AwsProfile::parse("[default]\naws_access_key_id = A\n", None),
            Err(StoreError::NoProfile)
        ));
        assert!(matches!(
            AwsProfile::parse(
                "[other]\naws_access_key_id=A\naws_secret_access_key=B",
                None
            ),
            Err(StoreError::NoProfile)
        ));
        assert!(matches!(
            AwsProfile::parse("[default\naws_access_key_id=A", None),
            Err(StoreError::BadFile {
                file: "credentials",
                ..
            })
        ));
    }

    #[test]
    fn an_s3_source_names_bucket_key_and_endpoint() {
        let src = S3Source {
            path: "backups/example/snap.db".into(),
            aws_secret: "aws".into(),
            endpoint: "http://minio.storage:9000/".into(),
            force_path_style: true,
        };
        let o = StoreLocation::s3(&src).unwrap();
        assert_eq!(o.bucket, "backups");
        assert_eq!(o.key, "example/snap.db");
        assert_eq!(o.secret, "aws");
        assert_eq!(
            o.backend,
            Backend::S3 {
                endpoint: Some("http://minio.storage:9000".into()),
                force_path_style: true
            }
        );
        assert_eq!(o.display("k"), "backups/k");
        let bad = S3Source {
            path: "no-key".into(),
            ..src
        };
        assert!(matches!(
            StoreLocation::s3(&bad),
            Err(StoreError::BadPath { field: "s3", .. })
        ));
    }

    fn source(yaml: &str) -> StorageSource {
        serde_yaml::from_str(yaml).expect("a storage source")
    }

    #[test]
    fn abs_and_gcs_sources_name_their_container_or_bucket() {
        let abs = source(
            "abs:\n  path: etcd/demo/snap.db\n  absSecret: azure\n  endpoint: http://127.0.0.1:10000/devstoreaccount1/\n",
        );
        let o = StoreLocation::from_source("ABS", &abs).unwrap();
        assert_eq!(
            (o.bucket.as_str(), o.key.as_str()),
            ("etcd", "demo/snap.db")
        );
        assert_eq!(o.secret, "azure");
        assert_eq!(
            o.backend,
            Backend::Abs {
                endpoint: Some("http://127.0.0.1:10000/devstoreaccount1".into())
            }
        );
        assert_eq!(
            o.metadata_names(),
            super::super::transfer::meta::Names::Underscores
        );
        let gcs = source("gcs:\n  path: bkt/snap.db\n");
        let o = StoreLocation::from_source("GCS", &gcs).unwrap();
        assert_eq!(
            (o.bucket.as_str(), o.key.as_str(), o.secret.as_str()),
            ("bkt", "snap.db", "")
        );
        assert_eq!(o.backend, Backend::Gcs);
        // The source must match the type, the path must have both parts.
        assert!(matches!(
            StoreLocation::from_source("ABS", &gcs),
            Err(StoreError::NoSource { field: "abs", .. })
        ));
        assert!(matches!(
            StoreLocation::from_source("GCS", &source("gcs:\n  path: bkt/\n")),
            Err(StoreError::BadPath {
                field: "gcs",
                shape: "BUCKET/OBJECT",
                ..
            })
        ));
        let oss = StoreLocation::from_source("OSS", &source("oss:\n  path: b/k\n"));
        assert!(matches!(oss, Err(StoreError::Unsupported(ref t)) if t == "OSS"));
        assert_eq!(oss.map(|_| ()).unwrap_err().reason(), "UnsupportedStorage");
    }

    fn read(backend: &Backend, keys: &[(&str, &str)]) -> Result<Credentials, StoreError> {
        let map: std::collections::BTreeMap<String, String> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Credentials::read(backend, Some(&|k: &str| map.get(k).cloned()))
    }

    #[test]
    fn an_abs_secret_names_the_account_and_its_cloud() {
        let abs = Backend::Abs { endpoint: None };
        let c = read(
            &abs,
            &[("storage-account", "acct "), ("storage-key", "a2V5")],
        )
        .unwrap();
        let Credentials::Azure(account) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(account.account, "acct");
        assert_eq!(account.cloud, AzureCloud::Public);
        assert!(
            !format!("{c:?}").contains("a2V5"),
            "Debug never shows the key"
        );
        for (name, suffix) in [
            ("AzurePublicCloud", "blob.core.windows.net"),
            ("AzureChinaCloud", "blob.core.chinacloudapi.cn"),
            ("azuregermancloud", "blob.core.cloudapi.de"),
            ("AzureUSGovernmentCloud", "blob.core.usgovcloudapi.net"),
        ] {
            let c = read(
                &abs,
                &[
                    ("storage-account", "a"),
                    ("storage-key", "a2V5"),
                    ("cloud", name),
                ],
            )
            .unwrap();
            assert!(
                matches!(&c, Credentials::Azure(a) if a.cloud.blob_suffix() == suffix),
                "{name}: {c:?}"
            );
        }
        let unknown = read(
            &abs,
            &[
                ("storage-account", "a"),
                ("storage-key", "k"),
                ("cloud", "AzureMoonCloud"),
            ],
        )
        .unwrap_err();
        assert!(
            unknown
                .to_string()
                .contains("\"AzureMoonCloud\" is not one of AzurePublicCloud"),
            "{unknown}"
        );
        assert_eq!(unknown.reason(), "BadCredentials");
        let missing = read(&abs, &[("storage-account", "a"), ("storage-key", " ")]).unwrap_err();
        assert!(
            matches!(missing, StoreError::MissingKey("storage-key")),
            "{missing}"
        );
        assert!(matches!(
            Credentials::read(&abs, None),
            Err(StoreError::NoSecret("abs.absSecret"))
        ));
    }

    #[test]
    fn a_gcp_secret_holds_a_token_or_a_service_account_key() {
        assert_eq!(
            Credentials::read(&Backend::Gcs, None).unwrap(),
            Credentials::Gcp(GcpCredentials::Default)
        );
        let token = read(&Backend::Gcs, &[("access-token", "ya29.TOKEN\n")]).unwrap();
        assert_eq!(
            token,
            Credentials::Gcp(GcpCredentials::AccessToken("ya29.TOKEN".into()))
        );
        assert!(!format!("{token:?}").contains("ya29"));
        let key = r#"{"gcs_base_url": "http://127.0.0.1:4443/", "disable_oauth": true, "client_email": "", "private_key": ""}"#;
        let sa = read(&Backend::Gcs, &[("credentials.json", key)]).unwrap();
        assert!(
            matches!(&sa, Credentials::Gcp(GcpCredentials::ServiceAccount { base_url: Some(u), .. }) if u == "http://127.0.0.1:4443"),
            "{sa:?}"
        );
        let bad = read(&Backend::Gcs, &[("credentials.json", "not json")]).unwrap_err();
        assert!(
            bad.to_string()
                .starts_with("the secret's key credentials.json is not JSON"),
            "{bad}"
        );
        let neither = read(&Backend::Gcs, &[("other", "x")]).unwrap_err();
        assert_eq!(
            neither.to_string(),
            "the secret has no key access-token or credentials.json"
        );
    }

    #[test]
    fn stores_open_with_their_own_credentials_only() {
        let t = StoreTimeouts::default();
        let abs = StoreLocation::from_source(
            "ABS",
            &source("abs:\n  path: c/k\n  absSecret: a\n  endpoint: http://127.0.0.1:1/devstoreaccount1\n"),
        )
        .unwrap();
        let azure = Credentials::Azure(AzureAccount {
            account: "devstoreaccount1".into(),
            key: "a2V5".into(),
            cloud: AzureCloud::Public,
        });
        assert!(open(&abs, &azure, t).is_ok());
        let not_base64 = Credentials::Azure(AzureAccount {
            key: "not base64!".into(),
            ..match &azure {
                Credentials::Azure(a) => a.clone(),
                _ => unreachable!(),
            }
        });
        assert_eq!(
            open(&abs, &not_base64, t).map(|_| ()).unwrap_err().reason(),
            "BadStore"
        );
        let gcs = StoreLocation::from_source("GCS", &source("gcs:\n  path: b/k\n")).unwrap();
        let key = r#"{"gcs_base_url": "http://127.0.0.1:1", "disable_oauth": true, "client_email": "", "private_key": "", "private_key_id": ""}"#;
        let sa = read(&Backend::Gcs, &[("credentials.json", key)]).unwrap();
        if let Err(e) = open(&gcs, &sa, t) {
            panic!("{e:?}");
        }
        assert!(matches!(
            open(&gcs, &azure, t),
            Err(StoreError::WrongCredentials("GCS"))
        ));
    }
}
