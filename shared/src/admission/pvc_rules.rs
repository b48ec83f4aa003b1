//! Rules on this operator's extension storage type `PVC`: a `pvc` source names a
//! PersistentVolumeClaim of the namespace (`claimName`) and a file inside it (`path`).
//!
//! The path is joined under the claim's mount point by the backup and restore pods, so it must
//! stay inside the claim: relative, no `.` or `..` segment, no empty segment, no control
//! character. Its file name leaves room for what the backup pod adds to it: the periodic
//! suffix `_v<revision>_<2006-01-02-15:04:05>` (at most [`PERIODIC_SUFFIX_BYTES`]) and the
//! names of the temporary file and the metadata beside the snapshot
//! ([`TEMPORARY_SUFFIX`], [`METADATA_SUFFIX`]), within a file system's 255-byte names.

use super::Report;
use super::syntax::{is_dns1123_subdomain, quoted};
use crate::types::storage::{PVC_STORAGE_TYPE, PvcSource, StorageSource};

/// Longest `pvc.path`, bytes.
pub const MAX_CLAIM_PATH_BYTES: usize = 1024;

/// Longest name of a file or directory on the file systems claims use (`NAME_MAX`).
pub const MAX_NAME_BYTES: usize = 255;

/// Longest periodic suffix: `_v`, a 19-digit revision, `_`, 19 characters of time.
pub const PERIODIC_SUFFIX_BYTES: usize = 2 + 19 + 1 + 19;

/// Suffix of the temporary file a snapshot is written to before it is renamed into place.
pub const TEMPORARY_SUFFIX: &str = ".part";

/// Suffix of the metadata file (JSON) beside each snapshot.
pub const METADATA_SUFFIX: &str = ".meta.json";

/// Longest file name of `pvc.path`: with the periodic suffix and the longer of the temporary
/// and metadata suffixes, it stays within [`MAX_NAME_BYTES`].
pub const MAX_FILE_NAME_BYTES: usize =
    MAX_NAME_BYTES - PERIODIC_SUFFIX_BYTES - METADATA_SUFFIX.len();

/// An example of a good path, for messages.
const EXAMPLE_PATH: &str = "example/snapshot.db";

/// Why a `pvc.path` is refused. Messages quote at most 64 characters of the path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimPathError {
    /// Longer than [`MAX_CLAIM_PATH_BYTES`].
    #[error("is {bytes} bytes long; at most {MAX_CLAIM_PATH_BYTES}")]
    TooLong {
        /// Its length.
        bytes: usize,
    },
    /// Starts with `/`.
    #[error(
        "must be relative to the claim's root, such as {EXAMPLE_PATH}, got {path}: it is joined under the claim's mount point"
    )]
    Absolute {
        /// The path, quoted.
        path: String,
    },
    /// `//` or a trailing `/`.
    #[error(
        "{path} has an empty segment ('//' or a trailing '/'): name a file, such as {EXAMPLE_PATH}"
    )]
    EmptySegment {
        /// The path, quoted.
        path: String,
    },
    /// A `.` or `..` segment.
    #[error("{path} has a segment '.' or '..': the path must stay inside the claim")]
    DotSegment {
        /// The path, quoted.
        path: String,
    },
    /// A control character.
    #[error("{path} holds the control character {character}")]
    ControlCharacter {
        /// The path, quoted.
        path: String,
        /// The character, as `U+XXXX`.
        character: String,
    },
    /// A directory name longer than a file system takes.
    #[error(
        "{path} has a directory name of {bytes} bytes; file systems take at most {MAX_NAME_BYTES}"
    )]
    NameTooLong {
        /// The path, quoted.
        path: String,
        /// The longest segment's length.
        bytes: usize,
    },
    /// A file name without room for the suffixes the backup adds.
    #[error(
        "{path} ends in a file name of {bytes} bytes; at most {MAX_FILE_NAME_BYTES}, so that a periodic snapshot's name (with _v<revision>_<time>) and its {METADATA_SUFFIX} file fit in {MAX_NAME_BYTES} bytes"
    )]
    FileNameTooLong {
        /// The path, quoted.
        path: String,
        /// The file name's length.
        bytes: usize,
    },
    /// A file name ending as the backup's own temporary or metadata files do.
    #[error(
        "{path} ends in {suffix}, which the backup uses for its own files beside each snapshot; choose another name"
    )]
    ReservedSuffix {
        /// The path, quoted.
        path: String,
        /// The suffix.
        suffix: &'static str,
    },
}

impl ClaimPathError {
    /// The rule's name.
    pub fn rule(&self) -> &'static str {
        "pvc-path"
    }
}

/// Checks a `pvc.path`: a relative file path that stays inside the claim and leaves room for
/// the backup's suffixes (see the module docs).
pub fn check_claim_path(path: &str) -> Result<(), ClaimPathError> {
    let q = || quoted(path);
    if path.len() > MAX_CLAIM_PATH_BYTES {
        return Err(ClaimPathError::TooLong { bytes: path.len() });
    }
    if path.starts_with('/') {
        return Err(ClaimPathError::Absolute { path: q() });
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(ClaimPathError::ControlCharacter {
            path: q(),
            character: format!("U+{:04X}", u32::from(c)),
        });
    }
    let segments: Vec<&str> = path.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return Err(ClaimPathError::EmptySegment { path: q() });
    }
    if segments.iter().any(|s| *s == "." || *s == "..") {
        return Err(ClaimPathError::DotSegment { path: q() });
    }
    let (file, dirs) = segments.split_last().unwrap_or((&"", &[]));
    if let Some(long) = dirs.iter().map(|d| d.len()).find(|&n| n > MAX_NAME_BYTES) {
        return Err(ClaimPathError::NameTooLong {
            path: q(),
            bytes: long,
        });
    }
    if file.len() > MAX_FILE_NAME_BYTES {
        return Err(ClaimPathError::FileNameTooLong {
            path: q(),
            bytes: file.len(),
        });
    }
    for suffix in [TEMPORARY_SUFFIX, METADATA_SUFFIX] {
        if file.ends_with(suffix) {
            return Err(ClaimPathError::ReservedSuffix { path: q(), suffix });
        }
    }
    Ok(())
}

/// A `pvc` source at `prefix`: the claim's name and the path.
pub(crate) fn check_pvc(pvc: &PvcSource, prefix: &str, report: &mut Report) {
    let claim_field = format!("{prefix}.claimName");
    if pvc.claim_name.is_empty() {
        report.refuse(
            "pvc-claim",
            claim_field,
            "is required: the name of a PersistentVolumeClaim of this namespace",
        );
    } else if !is_dns1123_subdomain(&pvc.claim_name) {
        report.refuse(
            "pvc-claim",
            claim_field,
            format!(
                "must be a PersistentVolumeClaim name (a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253), got {}",
                quoted(&pvc.claim_name)
            ),
        );
    }
    let path_field = format!("{prefix}.path");
    if pvc.path.is_empty() {
        report.refuse(
            "pvc-path",
            path_field,
            format!(
                "is required: the snapshot file relative to the claim's root, such as {EXAMPLE_PATH}"
            ),
        );
    } else if let Err(e) = check_claim_path(&pvc.path) {
        report.refuse(e.rule(), path_field, e.to_string());
    }
}

/// The storage of type `PVC` at `prefix`: exactly the `pvc` source, and it passes
/// [`check_pvc`]. `type_name` is the storage type field's name, for messages.
pub(crate) fn check_pvc_storage(
    type_name: &str,
    source: &StorageSource,
    prefix: &str,
    report: &mut Report,
) {
    for other in source.set_sources() {
        if other != "pvc" {
            report.refuse(
                "storage-source",
                format!("{prefix}.{other}"),
                format!(
                    "must not be set with {type_name} {PVC_STORAGE_TYPE}: exactly the source of the storage type (pvc) is set"
                ),
            );
        }
    }
    match &source.pvc {
        Some(pvc) => check_pvc(pvc, &format!("{prefix}.pvc"), report),
        None => report.refuse(
            "storage-source",
            format!("{prefix}.pvc"),
            format!("is required with {type_name} {PVC_STORAGE_TYPE}: claimName and path"),
        ),
    }
}
