//! Rules on where snapshots are kept, shared by `EtcdBackup`, `EtcdRestore`, an EtcdCluster's
//! `spec.safetyBackup` and its restore-seed annotation: the storage type (`S3`, `ABS` or
//! `GCS`; this operator's `PVC` is handed to `pvc_rules`), the inline source that matches it,
//! and that source's path (each store's bucket or container naming; one key rule for all),
//! secret and endpoint.
//!
//! Object keys are checked against what the controller's object store client (the
//! `object_store` crate) does with them: a key is accepted only when `Path::parse` takes it
//! unchanged (no empty segment, no `.` or `..` segment, no control character) and `Path::from`,
//! which the controller uses to list a periodic backup's directory, leaves it unescaped (no
//! character of its escape set, no non-ASCII character). A test of the controller
//! (`controller/src/snapshot/transfer.rs`) checks a table of keys against both.

use super::Report;
use super::syntax::{is_dns1123_subdomain, quoted};
use crate::types::storage::{
    AbsSource, GcsSource, PVC_STORAGE_TYPE, S3Source, STORAGE_TYPES, SUPPORTED_STORAGE_TYPES,
    StorageSource, source_field,
};

/// Longest object key S3 accepts, bytes.
pub const MAX_KEY_BYTES: usize = 1024;

/// The printable ASCII characters the `object_store` crate escapes in a key segment
/// (`INVALID` in its `src/path/parts.rs`: AWS' and Google's characters to avoid), besides
/// control characters and `/`.
pub const ESCAPED_KEY_CHARACTERS: &str = "\\{^}%`]\">[~<#|*?";

/// The storage types this operator supports, for messages.
const SUPPORTED: &str = "S3, ABS or GCS";

/// An example of a good path, for messages.
const EXAMPLE_PATH: &str = "etcd-backups/example/snapshot.db";

/// Why an `s3.path` (`BUCKET/KEY`) is refused. The messages quote at most 64 characters of
/// the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ObjectPathError {
    /// No `/` between a bucket and a key.
    #[error("must be BUCKET/KEY, such as {EXAMPLE_PATH}, got {path}")]
    NotBucketKey {
        /// The path, quoted.
        path: String,
    },
    /// The bucket is shorter than 3 or longer than 63 characters.
    #[error("the bucket {bucket} must be 3 to 63 characters long (S3's bucket naming), got {len}")]
    BucketLength {
        /// The bucket, quoted.
        bucket: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The bucket holds other characters than S3 allows, or starts or ends with one that may
    /// only be inside.
    #[error(
        "the bucket {bucket} may hold only lowercase letters, digits, '.' and '-', and must start and end with a letter or digit (S3's bucket naming)"
    )]
    BucketSyntax {
        /// The bucket, quoted.
        bucket: String,
    },
    /// The bucket holds `..`.
    #[error("the bucket {bucket} must not hold two adjacent periods (S3's bucket naming)")]
    BucketPeriods {
        /// The bucket, quoted.
        bucket: String,
    },
    /// The bucket is formatted as an IPv4 address.
    #[error("the bucket {bucket} must not be formatted as an IP address (S3's bucket naming)")]
    BucketIpAddress {
        /// The bucket, quoted.
        bucket: String,
    },
    /// Nothing after the bucket.
    #[error("the key after {bucket}/ is empty: name the object, such as {EXAMPLE_PATH}")]
    EmptyKey {
        /// The bucket, quoted.
        bucket: String,
    },
    /// The key is longer than S3 allows.
    #[error("the key is {bytes} bytes long; S3 keys are at most {MAX_KEY_BYTES} bytes")]
    KeyTooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// A leading or trailing `/`, or `//`.
    #[error(
        "the key {key} has an empty segment (a leading or trailing '/', or '//'), which the object store client refuses or drops"
    )]
    EmptySegment {
        /// The key, quoted.
        key: String,
    },
    /// A segment `.` or `..`.
    #[error("the key {key} has a segment '.' or '..', which the object store client refuses")]
    DotSegment {
        /// The key, quoted.
        key: String,
    },
    /// A control character.
    #[error("the key {key} holds the control character {character}")]
    ControlCharacter {
        /// The key, quoted.
        key: String,
        /// The character, as `U+XXXX`.
        character: String,
    },
    /// A character of the escape set.
    #[error(
        "the key {key} holds {character:?}, one of the characters the object store client escapes in keys (\\ {{ ^ }} % ` ] \" > [ ~ < # | * ?: AWS' characters to avoid), so the key it lists would not be the key it wrote"
    )]
    EscapedCharacter {
        /// The key, quoted.
        key: String,
        /// The character.
        character: char,
    },
    /// A character outside ASCII.
    #[error(
        "the key {key} holds the non-ASCII character {character:?}: the object store client escapes it in listings, so periodic backups could not find their snapshots; use ASCII"
    )]
    NonAscii {
        /// The key, quoted.
        key: String,
        /// The character.
        character: char,
    },
}

impl ObjectPathError {
    /// The rule broken: `s3-path`, `s3-bucket` or `s3-key`.
    pub fn rule(&self) -> &'static str {
        match self {
            ObjectPathError::NotBucketKey { .. } => "s3-path",
            ObjectPathError::BucketLength { .. }
            | ObjectPathError::BucketSyntax { .. }
            | ObjectPathError::BucketPeriods { .. }
            | ObjectPathError::BucketIpAddress { .. } => "s3-bucket",
            _ => "s3-key",
        }
    }
}

/// Checks an `s3.path` and splits it into the bucket and the key (at the first `/`).
pub fn check_object_path(path: &str) -> Result<(&str, &str), ObjectPathError> {
    let Some((bucket, key)) = path.split_once('/') else {
        return Err(ObjectPathError::NotBucketKey { path: quoted(path) });
    };
    if bucket.is_empty() {
        return Err(ObjectPathError::NotBucketKey { path: quoted(path) });
    }
    check_bucket_name(bucket)?;
    if key.is_empty() {
        return Err(ObjectPathError::EmptyKey {
            bucket: quoted(bucket),
        });
    }
    check_object_key(key)?;
    Ok((bucket, key))
}

/// Checks a bucket name against S3's naming rules: 3 to 63 characters, lowercase letters,
/// digits, `.` and `-`, starting and ending with a letter or digit, no `..`, not an IPv4
/// address.
pub fn check_bucket_name(bucket: &str) -> Result<(), ObjectPathError> {
    let shown = || quoted(bucket);
    if !(3..=63).contains(&bucket.len()) {
        return Err(ObjectPathError::BucketLength {
            bucket: shown(),
            len: bucket.len(),
        });
    }
    let inner = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = bucket.as_bytes();
    if !bytes.iter().all(|&b| inner(b) || b == b'.' || b == b'-')
        || !bytes.first().is_some_and(|&b| inner(b))
        || !bytes.last().is_some_and(|&b| inner(b))
    {
        return Err(ObjectPathError::BucketSyntax { bucket: shown() });
    }
    if bucket.contains("..") {
        return Err(ObjectPathError::BucketPeriods { bucket: shown() });
    }
    let parts: Vec<&str> = bucket.split('.').collect();
    if parts.len() == 4
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(ObjectPathError::BucketIpAddress { bucket: shown() });
    }
    Ok(())
}

/// Checks an object key: 1 to [`MAX_KEY_BYTES`] bytes, no empty, `.` or `..` segment, only
/// printable ASCII outside [`ESCAPED_KEY_CHARACTERS`] (what `object_store`'s `Path::parse` takes
/// unchanged and `Path::from` does not escape).
pub fn check_object_key(key: &str) -> Result<(), ObjectPathError> {
    if key.len() > MAX_KEY_BYTES {
        return Err(ObjectPathError::KeyTooLong { bytes: key.len() });
    }
    let shown = || quoted(key);
    if key.split('/').any(str::is_empty) {
        return Err(ObjectPathError::EmptySegment { key: shown() });
    }
    if key.split('/').any(|s| s == "." || s == "..") {
        return Err(ObjectPathError::DotSegment { key: shown() });
    }
    for c in key.chars() {
        if c.is_ascii_control() {
            return Err(ObjectPathError::ControlCharacter {
                key: shown(),
                character: format!("U+{:04X}", u32::from(c)),
            });
        }
        if ESCAPED_KEY_CHARACTERS.contains(c) {
            return Err(ObjectPathError::EscapedCharacter {
                key: shown(),
                character: c,
            });
        }
        if !c.is_ascii() {
            return Err(ObjectPathError::NonAscii {
                key: shown(),
                character: c,
            });
        }
    }
    Ok(())
}

/// Why an `s3.endpoint` is not an `http(s)://HOST[:PORT][/PATH]` URL, or `None`.
pub(crate) fn endpoint_problem(url: &str) -> Option<&'static str> {
    if url
        .chars()
        .any(|c| c.is_whitespace() || c.is_control() || !c.is_ascii())
    {
        return Some("it holds whitespace, a control or a non-ASCII character");
    }
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        return Some("the scheme must be http:// or https://");
    };
    if rest.contains('?') || rest.contains('#') {
        return Some("a query or fragment is not allowed");
    }
    let authority = rest.split('/').next().unwrap_or_default();
    if authority.contains('@') {
        return Some(
            "user information (USER:PASSWORD@) is not allowed: credentials come from awsSecret",
        );
    }
    let port = if let Some(v6) = authority.strip_prefix('[') {
        let Some((address, after)) = v6.split_once(']') else {
            return Some("the IPv6 address has no closing ']'");
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return Some("the host is not a valid IPv6 address");
        }
        match after {
            "" => None,
            p => match p.strip_prefix(':') {
                Some(port) => Some(port),
                None => return Some("the IPv6 address must be followed by :PORT or nothing"),
            },
        }
    } else {
        let (host, port) = match authority.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        };
        if !is_host_name(host) {
            return Some("the host must be a DNS name or an IPv4 address");
        }
        port
    };
    if let Some(port) = port {
        let valid = !port.is_empty()
            && port.len() <= 5
            && port.bytes().all(|b| b.is_ascii_digit())
            && port.parse::<u32>().is_ok_and(|p| (1..=65535).contains(&p));
        if !valid {
            return Some("the port must be a number from 1 to 65535");
        }
    }
    None
}

/// A DNS name (labels of letters, digits, `-` and `_`, up to 63 characters each, 253 in all)
/// or an IPv4 address.
fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.trim_end_matches('.').split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// The storage type field and the inline sources of one object: `type_field` is the path of
/// `storageType` (or `backupStorageType`), `prefix` the path of the object holding the sources.
pub(crate) fn check_storage(
    storage_type: &str,
    type_field: &str,
    source: &StorageSource,
    prefix: &str,
    report: &mut Report,
) {
    let type_name = type_field.rsplit('.').next().unwrap_or(type_field);
    if storage_type.is_empty() {
        report.refuse(
            "storage-type",
            type_field,
            format!(
                "is required: set it to {SUPPORTED} and the matching source (s3, abs or gcs) beside it, or to {PVC_STORAGE_TYPE} and the source pvc"
            ),
        );
        return;
    }
    if storage_type == PVC_STORAGE_TYPE {
        super::pvc_rules::check_pvc_storage(type_name, source, prefix, report);
        return;
    }
    if !SUPPORTED_STORAGE_TYPES.contains(&storage_type) {
        if STORAGE_TYPES.contains(&storage_type) {
            report.refuse(
                "storage-type-unsupported",
                type_field,
                format!(
                    "{storage_type} is a storage type of CoreOS' API that this operator does not support; use {SUPPORTED} (S3: AWS, or any S3-compatible store through s3.endpoint)"
                ),
            );
        } else {
            report.refuse(
                "storage-type",
                type_field,
                format!(
                    "must be S3, ABS, GCS or {PVC_STORAGE_TYPE} (CoreOS' OSS is not supported), got {}",
                    quoted(storage_type)
                ),
            );
        }
        return;
    }
    let wanted = source_field(storage_type).unwrap_or("s3");
    for other in source.set_sources() {
        if other != wanted {
            report.refuse(
                "storage-source",
                format!("{prefix}.{other}"),
                format!(
                    "must not be set with {type_name} {storage_type}: exactly the source of the storage type ({wanted}) is set"
                ),
            );
        }
    }
    let field = format!("{prefix}.{wanted}");
    let missing = |what: &str, report: &mut Report| {
        report.refuse(
            "storage-source",
            field.clone(),
            format!("is required with {type_name} {storage_type}: {what}"),
        );
    };
    match storage_type {
        "ABS" => match &source.abs {
            Some(abs) => check_abs(abs, &field, report),
            None => missing("path, absSecret and optionally endpoint", report),
        },
        "GCS" => match &source.gcs {
            Some(gcs) => check_gcs(gcs, &field, report),
            None => missing("path and optionally gcpSecret", report),
        },
        _ => match &source.s3 {
            Some(s3) => check_s3(s3, &field, report),
            None => missing("path, awsSecret and optionally endpoint", report),
        },
    }
}

/// The source of a restore seed (its one set source, of a supported type or `PVC`) at
/// `prefix`.
pub(crate) fn check_seed_source(source: &StorageSource, prefix: &str, report: &mut Report) {
    match source.storage_type() {
        Some(t) if SUPPORTED_STORAGE_TYPES.contains(&t) || t == PVC_STORAGE_TYPE => {
            let field = format!("{prefix}.{}", source_field(t).unwrap_or("s3"));
            match (&source.s3, &source.abs, &source.gcs, &source.pvc) {
                (Some(s3), _, _, _) => check_s3(s3, &field, report),
                (_, Some(abs), _, _) => check_abs(abs, &field, report),
                (_, _, Some(gcs), _) => check_gcs(gcs, &field, report),
                (_, _, _, Some(pvc)) => super::pvc_rules::check_pvc(pvc, &field, report),
                _ => {}
            }
        }
        _ => report.refuse(
            "restore-seed",
            prefix,
            format!(
                "must hold exactly one source, s3, abs, gcs or pvc; it holds {}",
                match source.set_sources().as_slice() {
                    [] => "none".to_string(),
                    set => set.join(", "),
                }
            ),
        ),
    }
}

/// A secret name at `field`: required unless `optional`, a DNS-1123 subdomain when set.
fn check_secret(
    name: &str,
    rule: &'static str,
    field: String,
    holds: &str,
    optional: bool,
    report: &mut Report,
) {
    if name.is_empty() {
        if !optional {
            report.refuse(
                rule,
                field,
                format!("is required: the name of a Secret of this namespace with {holds}"),
            );
        }
    } else if !is_dns1123_subdomain(name) {
        report.refuse(
            rule,
            field,
            format!(
                "must be a Secret name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.'), got {}",
                quoted(name)
            ),
        );
    }
}

/// An `abs` source at `prefix`: `CONTAINER/BLOB` (Azure's container naming, the key rule of
/// every store), the `absSecret` and our `endpoint` extension.
pub(crate) fn check_abs(abs: &AbsSource, prefix: &str, report: &mut Report) {
    let path_field = format!("{prefix}.path");
    match abs.path.split_once('/') {
        _ if abs.path.is_empty() => report.refuse(
            "abs-path",
            path_field,
            format!("is required: CONTAINER/BLOB of the snapshot, such as {EXAMPLE_PATH}"),
        ),
        Some((container, blob)) if !container.is_empty() => {
            if let Some(why) = container_problem(container) {
                report.refuse(
                    "abs-container",
                    path_field.clone(),
                    format!(
                        "the container {} {why} (Azure's container naming)",
                        quoted(container)
                    ),
                );
            }
            if blob.is_empty() {
                report.refuse(
                    "abs-blob",
                    path_field,
                    format!(
                        "the blob after {}/ is empty: name it, such as {EXAMPLE_PATH}",
                        quoted(container)
                    ),
                );
            } else if let Err(e) = check_object_key(blob) {
                report.refuse("abs-blob", path_field, e.to_string());
            }
        }
        _ => report.refuse(
            "abs-path",
            path_field,
            format!(
                "must be CONTAINER/BLOB, such as {EXAMPLE_PATH}, got {}",
                quoted(&abs.path)
            ),
        ),
    }
    check_secret(
        &abs.abs_secret,
        "abs-secret",
        format!("{prefix}.absSecret"),
        "keys storage-account, storage-key and optionally cloud",
        false,
        report,
    );
    if !abs.endpoint.is_empty()
        && let Some(why) = endpoint_problem(&abs.endpoint)
    {
        report.refuse(
            "abs-endpoint",
            format!("{prefix}.endpoint"),
            format!(
                "must be empty (the account's host in its cloud) or the Blob service's http:// or https:// URL, such as http://azurite.storage:10000/devstoreaccount1, got {}: {why}",
                quoted(&abs.endpoint)
            ),
        );
    }
}

/// Why a container name breaks Azure's rules (3 to 63 characters: lowercase letters, digits
/// and '-', starting and ending with a letter or digit, no "--"), or `None`.
fn container_problem(container: &str) -> Option<String> {
    if !(3..=63).contains(&container.len()) {
        return Some(format!(
            "must be 3 to 63 characters long, got {}",
            container.len()
        ));
    }
    let inner = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = container.as_bytes();
    if !bytes.iter().all(|&b| inner(b) || b == b'-')
        || !bytes.first().is_some_and(|&b| inner(b))
        || !bytes.last().is_some_and(|&b| inner(b))
    {
        return Some(
            "may hold only lowercase letters, digits and '-', and must start and end with a letter or digit"
                .into(),
        );
    }
    if container.contains("--") {
        return Some("must not hold two adjacent hyphens".into());
    }
    None
}

/// A `gcs` source at `prefix`: `BUCKET/OBJECT` (Google's bucket naming, the key rule of every
/// store) and the optional `gcpSecret`.
pub(crate) fn check_gcs(gcs: &GcsSource, prefix: &str, report: &mut Report) {
    let path_field = format!("{prefix}.path");
    match gcs.path.split_once('/') {
        _ if gcs.path.is_empty() => report.refuse(
            "gcs-path",
            path_field,
            format!("is required: BUCKET/OBJECT of the snapshot, such as {EXAMPLE_PATH}"),
        ),
        Some((bucket, object)) if !bucket.is_empty() => {
            if let Some(why) = gcs_bucket_problem(bucket) {
                report.refuse(
                    "gcs-bucket",
                    path_field.clone(),
                    format!(
                        "the bucket {} {why} (Google's bucket naming)",
                        quoted(bucket)
                    ),
                );
            }
            if object.is_empty() {
                report.refuse(
                    "gcs-object",
                    path_field,
                    format!(
                        "the object after {}/ is empty: name it, such as {EXAMPLE_PATH}",
                        quoted(bucket)
                    ),
                );
            } else if let Err(e) = check_object_key(object) {
                report.refuse("gcs-object", path_field, e.to_string());
            }
        }
        _ => report.refuse(
            "gcs-path",
            path_field,
            format!(
                "must be BUCKET/OBJECT, such as {EXAMPLE_PATH}, got {}",
                quoted(&gcs.path)
            ),
        ),
    }
    check_secret(
        &gcs.gcp_secret,
        "gcs-secret",
        format!("{prefix}.gcpSecret"),
        "key access-token or credentials.json",
        true,
        report,
    );
}

/// Why a bucket name breaks Google's rules (3 to 63 characters, or up to 222 with dots and 63
/// between them; lowercase letters, digits, '-', '_' and '.'; starting and ending with a letter
/// or digit; not an IPv4 address; not starting with "goog" nor holding "google"), or `None`.
fn gcs_bucket_problem(bucket: &str) -> Option<String> {
    let max = if bucket.contains('.') { 222 } else { 63 };
    if bucket.len() < 3 || bucket.len() > max {
        return Some(format!(
            "must be 3 to 63 characters long (222 with dots), got {}",
            bucket.len()
        ));
    }
    let inner = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = bucket.as_bytes();
    if !bytes
        .iter()
        .all(|&b| inner(b) || b == b'-' || b == b'_' || b == b'.')
        || !bytes.first().is_some_and(|&b| inner(b))
        || !bytes.last().is_some_and(|&b| inner(b))
    {
        return Some(
            "may hold only lowercase letters, digits, '-', '_' and '.', and must start and end with a letter or digit"
                .into(),
        );
    }
    if bucket.split('.').any(|p| p.is_empty() || p.len() > 63) {
        return Some("must have 1 to 63 characters between dots".into());
    }
    let parts: Vec<&str> = bucket.split('.').collect();
    if parts.len() == 4 && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_digit())) {
        return Some("must not be formatted as an IP address".into());
    }
    if bucket.starts_with("goog") || bucket.contains("google") {
        return Some("must not start with \"goog\" nor hold \"google\"".into());
    }
    None
}

/// An `s3` source at `prefix`: the path, the secret and the endpoint.
pub(crate) fn check_s3(s3: &S3Source, prefix: &str, report: &mut Report) {
    let path_field = format!("{prefix}.path");
    if s3.path.is_empty() {
        report.refuse(
            "s3-path",
            path_field,
            format!("is required: BUCKET/KEY of the snapshot, such as {EXAMPLE_PATH}"),
        );
    } else if let Err(e) = check_object_path(&s3.path) {
        report.refuse(e.rule(), path_field, e.to_string());
    }
    check_secret(
        &s3.aws_secret,
        "s3-secret",
        format!("{prefix}.awsSecret"),
        "the AWS shared files (key credentials, optionally config)",
        false,
        report,
    );
    if !s3.endpoint.is_empty()
        && let Some(why) = endpoint_problem(&s3.endpoint)
    {
        report.refuse(
            "s3-endpoint",
            format!("{prefix}.endpoint"),
            format!(
                "must be empty (AWS) or an http:// or https:// URL with a host and an optional port, such as http://minio.storage:9000, got {}: {why}",
                quoted(&s3.endpoint)
            ),
        );
    }
}
