//! Object storage for snapshots, through the `object_store` crate: an S3 bucket of AWS or of
//! any S3-compatible store (CoreOS' `s3` source: `path`, `awsSecret`, `endpoint`,
//! `forcePathStyle`), with the credentials and region of the AWS shared files the
//! `awsSecret` holds (keys `credentials` and `config`, profile `default`).
//!
//! `object_store` was chosen over OpenDAL: it is the smaller of the two for the one service
//! needed (S3 with SigV4, multipart upload, streaming reads, user metadata), its multipart
//! writer bounds memory by part size and parts in flight, and it builds on `reqwest`/`rustls`
//! with `ring`, the TLS stack the operator already uses. Neither reads the AWS shared files
//! from a Secret's bytes, so [`AwsProfile::parse`] does, with the `rust-ini` crate.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use etcd_shared::types::storage::{S3Source, split_path};

/// The region used when the `config` file names none (the AWS default; most S3-compatible
/// stores accept any region).
pub const DEFAULT_REGION: &str = "us-east-1";

/// The Secret keys CoreOS' `awsSecret` holds.
pub const CREDENTIALS_KEY: &str = "credentials";
/// The Secret key of the AWS `config` file (optional).
pub const CONFIG_KEY: &str = "config";

/// The profile read from the shared files.
const PROFILE: &str = "default";

/// Why a store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `s3.path` is not `BUCKET/KEY`.
    #[error("s3.path {0:?} is not BUCKET/KEY")]
    BadPath(String),
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
    /// `object_store` refused the configuration (a bad endpoint URL, say).
    #[error("cannot use the S3 store: {0}")]
    Build(#[source] object_store::Error),
}

impl StoreError {
    /// A static label for metrics and status reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            StoreError::BadPath(_) => "BadPath",
            StoreError::BadFile { .. } | StoreError::NoProfile => "BadCredentials",
            StoreError::Build(_) => "BadStore",
        }
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

/// One object in an S3 bucket, as an `s3` source names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Object {
    /// The bucket.
    pub bucket: String,
    /// The object key (for a periodic backup, the prefix of every snapshot's key).
    pub key: String,
    /// The store's URL; `None` for AWS.
    pub endpoint: Option<String>,
    /// Buckets addressed by path rather than by host name.
    pub force_path_style: bool,
}

impl S3Object {
    /// The object an `s3` source names.
    pub fn from_source(source: &S3Source) -> Result<Self, StoreError> {
        let (bucket, key) =
            split_path(&source.path).ok_or_else(|| StoreError::BadPath(source.path.clone()))?;
        let endpoint = source.endpoint.trim();
        Ok(S3Object {
            bucket: bucket.to_string(),
            key: key.to_string(),
            endpoint: (!endpoint.is_empty()).then(|| endpoint.trim_end_matches('/').to_string()),
            // As in CoreOS' operator: virtual-hosted requests unless `forcePathStyle` (which
            // most S3-compatible stores need) is set.
            force_path_style: source.force_path_style,
        })
    }

    /// `BUCKET/KEY` of an object of this bucket.
    pub fn display(&self, key: &str) -> String {
        format!("{}/{key}", self.bucket)
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

/// Opens the bucket of `object` with `profile`'s credentials.
pub fn open(
    object: &S3Object,
    profile: &AwsProfile,
    timeouts: StoreTimeouts,
) -> Result<Arc<dyn ObjectStore>, StoreError> {
    install_tls_provider();
    let http = object
        .endpoint
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
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(&object.bucket)
        .with_region(&profile.region)
        .with_access_key_id(&profile.access_key_id)
        .with_secret_access_key(&profile.secret_access_key)
        .with_virtual_hosted_style_request(!object.force_path_style)
        .with_client_options(client)
        .with_retry(retry);
    if let Some(token) = &profile.session_token {
        builder = builder.with_token(token);
    }
    if let Some(endpoint) = &object.endpoint {
        builder = builder.with_endpoint(endpoint);
    }
    Ok(Arc::new(builder.build().map_err(StoreError::Build)?))
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
        let o = S3Object::from_source(&src).unwrap();
        assert_eq!(o.bucket, "backups");
        assert_eq!(o.key, "example/snap.db");
        assert_eq!(o.endpoint.as_deref(), Some("http://minio.storage:9000"));
        assert_eq!(o.display("k"), "backups/k");
        let bad = S3Source {
            path: "no-key".into(),
            ..src
        };
        assert!(matches!(
            S3Object::from_source(&bad),
            Err(StoreError::BadPath(_))
        ));
    }
}
