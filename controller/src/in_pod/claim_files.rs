//! Snapshots as files in a PersistentVolumeClaim (storage type `PVC`), as the backup and
//! restore pods see them under the claim's mount point:
//!
//! - [`write_snapshot`] writes a snapshot stream to `FILE.part`, checking etcd's hash as it
//!   passes, syncs it, and renames it to `FILE` only when the hash checks (then syncs the
//!   directory): no partial or damaged file is ever left under the name;
//! - [`write_metadata`] puts the snapshot's metadata beside it, `FILE.meta.json`, the same way;
//! - [`verify_file`] reads a snapshot file through, checking etcd's hash and the hash its
//!   metadata recorded (and the one the caller expects);
//! - [`retain`] deletes the periodic snapshots beyond `maxBackups`, by the same rule as the S3
//!   ones ([`crate::snapshot::keys::expired`]), with their metadata.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use serde::{Deserialize, Serialize};

use etcd_shared::admission::{METADATA_SUFFIX, TEMPORARY_SUFFIX};

use crate::snapshot::integrity::{CheckedSnapshot, IntegrityError, SnapshotHasher};
use crate::snapshot::keys::{self, Pruning};

/// What is recorded beside each snapshot file, as JSON in `FILE.meta.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Metadata {
    /// etcd version of the member the snapshot was taken from.
    pub etcd_version: String,
    /// etcd revision the snapshot holds at least.
    pub revision: i64,
    /// SHA-256 of the snapshot's database (the hash etcd appended), hex.
    pub sha256: String,
    /// Bytes of the file: the database and the hash.
    pub size: u64,
    /// `NAMESPACE/NAME` of the cluster.
    pub cluster: String,
    /// The member it was taken from.
    pub member: String,
}

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A file system call failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The snapshot stream failed (etcd).
    #[error("reading the snapshot: {0}")]
    Source(String),
    /// The file or stream is not an intact snapshot (or not the one expected).
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    /// The metadata beside the snapshot is not this operator's JSON.
    #[error("{path} is not the metadata this operator writes: {message}")]
    BadMetadata {
        /// The metadata file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
}

impl FileError {
    /// A static label for statuses and metrics (the S3 path's labels where they mean the same).
    pub fn reason(&self) -> &'static str {
        match self {
            FileError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                "NotFound"
            }
            FileError::Io { .. } => "FileFailed",
            FileError::Source(_) => "SnapshotFailed",
            FileError::Integrity(_) => "IntegrityCheckFailed",
            FileError::BadMetadata { .. } => "BadMetadata",
        }
    }
}

/// Turns an I/O error of `what` on `path` into a [`FileError`] (for `map_err`).
pub(crate) fn io(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FileError {
    let path = path.to_path_buf();
    move |source| FileError::Io { what, path, source }
}

/// `path` with `suffix` appended to its file name.
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// The metadata file of a snapshot file.
pub fn metadata_path(snapshot: &Path) -> PathBuf {
    with_suffix(snapshot, METADATA_SUFFIX)
}

/// The temporary file a snapshot is written to before it is renamed into place.
pub fn temporary_path(snapshot: &Path) -> PathBuf {
    with_suffix(snapshot, TEMPORARY_SUFFIX)
}

/// Syncs the directory holding `path`, so a rename into it is durable.
fn sync_parent(path: &Path) -> Result<(), FileError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing", dir))
}

/// Writes `bytes` to `path` through a temporary file, synced and renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    let partial = temporary_path(path);
    let written = std::fs::File::create(&partial)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            f.sync_all()
        })
        .map_err(io("writing", &partial));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    std::fs::rename(&partial, path).map_err(io("renaming", &partial))?;
    sync_parent(path)
}

/// Writes a snapshot stream to `target` (its directories created): into `target.part`,
/// hashed as it passes, synced, and renamed to `target` only when etcd's hash checks. On any
/// failure the temporary file is removed and `target` is untouched.
pub async fn write_snapshot<S, E>(
    target: &Path,
    mut chunks: S,
) -> Result<CheckedSnapshot, FileError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    if let Some(dir) = target.parent() {
        std::fs::create_dir_all(dir).map_err(io("creating", dir))?;
    }
    let partial = temporary_path(target);
    let mut out = std::fs::File::create(&partial).map_err(io("creating", &partial))?;
    // Removed if this future is dropped mid-write (the save's timeout): no leftover.
    let mut cleanup = RemoveOnDrop(Some(partial.clone()));
    let outcome: Result<CheckedSnapshot, FileError> = async {
        let mut hasher = SnapshotHasher::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| FileError::Source(e.to_string()))?;
            hasher.update(&chunk);
            out.write_all(&chunk).map_err(io("writing", &partial))?;
        }
        let checked = hasher.finish()?;
        out.sync_all().map_err(io("syncing", &partial))?;
        Ok(checked)
    }
    .await;
    drop(out);
    match outcome {
        Ok(checked) => {
            std::fs::rename(&partial, target).map_err(io("renaming", &partial))?;
            cleanup.0 = None;
            sync_parent(target)?;
            Ok(checked)
        }
        Err(e) => Err(e),
    }
}

/// Removes a file when dropped, unless emptied first.
struct RemoveOnDrop(Option<PathBuf>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Removes the temporary files an earlier backup of `target` (or, for a periodic backup, of
/// any snapshot of `prefix`) left when its pod was killed before it could clean up (a timeout
/// deletes the pod). Only this backup's own temporary names are touched. Returns what was
/// removed.
pub fn remove_leftovers(target: &Path, prefix: Option<&Path>) -> Result<Vec<PathBuf>, FileError> {
    let dir = target.parent().unwrap_or(Path::new("."));
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("listing", dir)(e)),
    };
    let own = |path: &Path| {
        let name = path.to_string_lossy();
        let Some(snapshot) = name.strip_suffix(TEMPORARY_SUFFIX) else {
            return false;
        };
        snapshot == target.to_string_lossy()
            || prefix.is_some_and(|p| keys::is_periodic_of(&p.to_string_lossy(), snapshot))
    };
    let mut removed = Vec::new();
    for entry in entries {
        let path = entry.map_err(io("listing", dir))?.path();
        if own(&path) {
            std::fs::remove_file(&path).map_err(io("deleting", &path))?;
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Whether an I/O failure of a save is the claim being full.
pub fn is_full(error: &FileError) -> bool {
    matches!(error, FileError::Io { source, .. }
        if source.kind() == std::io::ErrorKind::StorageFull || source.raw_os_error() == Some(28))
}

/// Writes the metadata of the snapshot `target` beside it.
pub fn write_metadata(target: &Path, metadata: &Metadata) -> Result<(), FileError> {
    let path = metadata_path(target);
    // Serializing strings and numbers cannot fail.
    let json = serde_json::to_vec_pretty(metadata).unwrap_or_default();
    write_atomically(&path, &json)
}

/// The metadata beside the snapshot `target`; `None` when there is none (a file put there by
/// hand or by another tool).
pub fn read_metadata(target: &Path) -> Result<Option<Metadata>, FileError> {
    let path = metadata_path(target);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("reading", &path)(e)),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| FileError::BadMetadata {
            path,
            message: e.to_string(),
        })
}

/// Reads the snapshot file `target` through, handing each chunk to `sink`, and checks it:
/// etcd's hash at its end, the hash its metadata recorded (when there is metadata), and
/// `expected` (when given). Returns the check and the metadata.
pub fn verify_file<F>(
    target: &Path,
    expected: Option<&str>,
    mut sink: F,
) -> Result<(CheckedSnapshot, Option<Metadata>), FileError>
where
    F: FnMut(&[u8]) -> Result<(), FileError>,
{
    let metadata = read_metadata(target)?;
    let mut file = std::fs::File::open(target).map_err(io("opening", target))?;
    let mut hasher = SnapshotHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io("reading", target))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        sink(&buf[..n])?;
    }
    let mut checked = hasher.finish()?;
    if let Some(recorded) = &metadata {
        checked = checked.expect(&recorded.sha256)?;
    }
    if let Some(expected) = expected {
        checked = checked.expect(expected)?;
    }
    Ok((checked, metadata))
}

/// Deletes the periodic snapshots of `prefix` (the path's file, without the periodic suffix)
/// that `rule` does not keep (`maxBackups` or `retention`), never `keep` (the one just
/// written), each with its metadata; files not named as periodic snapshots of `prefix` are
/// never touched. Returns what was deleted.
pub fn retain(prefix: &Path, rule: &Pruning, keep: &Path) -> Result<Vec<PathBuf>, FileError> {
    if rule.keeps_all() {
        return Ok(Vec::new());
    }
    let dir = prefix.parent().unwrap_or(Path::new("."));
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io("listing", dir))? {
        let entry = entry.map_err(io("listing", dir))?;
        names.push(entry.path().to_string_lossy().into_owned());
    }
    let doomed = rule.expired(&prefix.to_string_lossy(), &names, &keep.to_string_lossy());
    let mut deleted = Vec::new();
    for file in doomed {
        let file = PathBuf::from(file);
        std::fs::remove_file(&file).map_err(io("deleting", &file))?;
        match std::fs::remove_file(metadata_path(&file)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io("deleting", &metadata_path(&file))(e)),
        }
        deleted.push(file);
    }
    Ok(deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::integrity::HASH_LEN;
    use sha2::{Digest as _, Sha256};

    /// A database of `blocks` 512-byte blocks and etcd's hash after it.
    fn snapshot(blocks: usize) -> Vec<u8> {
        let db: Vec<u8> = (0..blocks * 512).map(|i| (i % 251) as u8).collect();
        let mut out = db.clone();
        out.extend_from_slice(&Sha256::digest(&db));
        out
    }

    fn stream(bytes: Vec<u8>, fail: bool) -> impl Stream<Item = Result<Bytes, String>> + Unpin {
        let mut items: Vec<Result<Bytes, String>> = bytes
            .chunks(700)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        if fail {
            items.push(Err("connection reset".into()));
        }
        futures::stream::iter(items)
    }

    #[tokio::test]
    async fn an_intact_stream_is_renamed_into_place_a_damaged_one_leaves_nothing() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("a/b/snap.db");
        let good = snapshot(3);
        let checked = write_snapshot(&target, stream(good.clone(), false))
            .await
            .expect("written");
        assert_eq!(checked.size, good.len() as u64);
        assert_eq!(std::fs::read(&target).expect("file"), good);
        assert!(!temporary_path(&target).exists());

        // A damaged stream, a failing one and a short one: the good file stays as it was.
        let mut bad = good.clone();
        bad[10] ^= 1;
        let e = write_snapshot(&target, stream(bad, false))
            .await
            .expect_err("damaged");
        assert_eq!(e.reason(), "IntegrityCheckFailed");
        let e = write_snapshot(&target, stream(good.clone(), true))
            .await
            .expect_err("failed");
        assert_eq!(e.reason(), "SnapshotFailed");
        let e = write_snapshot(&target, stream(good[..HASH_LEN].to_vec(), false))
            .await
            .expect_err("short");
        assert_eq!(e.reason(), "IntegrityCheckFailed");
        assert_eq!(std::fs::read(&target).expect("file"), good);
        assert!(!temporary_path(&target).exists());
    }

    #[tokio::test]
    async fn a_file_is_verified_against_its_hash_and_its_metadata() {
        let dir = tempfile::tempdir().expect("dir");
        let target = dir.path().join("snap.db");
        let checked = write_snapshot(&target, stream(snapshot(2), false))
            .await
            .expect("written");
        // No metadata: etcd's hash alone.
        let (again, meta) = verify_file(&target, None, |_| Ok(())).expect("intact");
        assert_eq!(again.sha256, checked.sha256);
        assert_eq!(meta, None);
        let metadata = Metadata {
            etcd_version: "3.6.16".into(),
            revision: 42,
            sha256: checked.sha256.clone(),
            size: checked.size,
            cluster: "ns/demo".into(),
            member: "demo-0".into(),
        };
        write_metadata(&target, &metadata).expect("metadata");
        let mut copied = Vec::new();
        let (_, meta) = verify_file(&target, Some(&checked.sha256.to_uppercase()), |c| {
            copied.extend_from_slice(c);
            Ok(())
        })
        .expect("intact");
        assert_eq!(meta, Some(metadata.clone()));
        assert_eq!(copied, std::fs::read(&target).expect("file"));
        // Another expected hash, metadata naming another snapshot, damaged bytes.
        let e = verify_file(&target, Some(&"0".repeat(64)), |_| Ok(())).expect_err("other");
        assert!(e.to_string().contains("expected 0000"), "{e}");
        write_metadata(
            &target,
            &Metadata {
                sha256: "ab".repeat(32),
                ..metadata
            },
        )
        .expect("metadata");
        let e = verify_file(&target, None, |_| Ok(())).expect_err("metadata mismatch");
        assert_eq!(e.reason(), "IntegrityCheckFailed");
        std::fs::remove_file(metadata_path(&target)).expect("rm");
        let mut bytes = std::fs::read(&target).expect("file");
        bytes[100] ^= 0xff;
        std::fs::write(&target, bytes).expect("write");
        let e = verify_file(&target, None, |_| Ok(())).expect_err("damaged");
        assert!(e.to_string().contains("integrity hash mismatch"), "{e}");
        std::fs::write(metadata_path(&target), "not json").expect("write");
        let e = verify_file(&target, None, |_| Ok(())).expect_err("bad metadata");
        assert_eq!(e.reason(), "BadMetadata");
        let e = verify_file(&dir.path().join("missing.db"), None, |_| Ok(())).expect_err("missing");
        assert_eq!(e.reason(), "NotFound");
    }

    #[test]
    fn retention_keeps_the_newest_and_never_touches_other_files() {
        let dir = tempfile::tempdir().expect("dir");
        let prefix = dir.path().join("snap.db");
        let name = |rev: i64, time: &str| dir.path().join(format!("snap.db_v{rev}_{time}"));
        let files = [
            name(10, "2026-01-01-00:00:00"),
            name(20, "2026-01-02-00:00:00"),
            name(30, "2026-01-03-00:00:00"),
            name(40, "2026-01-04-00:00:00"),
        ];
        for f in &files {
            std::fs::write(f, b"x").expect("write");
            std::fs::write(metadata_path(f), b"{}").expect("write");
        }
        let others = [
            dir.path().join("snap.db"),
            dir.path().join("other.db_v1_2020-01-01-00:00:00"),
            temporary_path(&name(50, "2026-01-05-00:00:00")),
        ];
        for f in &others {
            std::fs::write(f, b"x").expect("write");
        }
        assert_eq!(
            retain(&prefix, &Pruning::MaxBackups(0), &files[3]).expect("none"),
            Vec::<PathBuf>::new()
        );
        let deleted = retain(&prefix, &Pruning::MaxBackups(2), &files[3]).expect("retained");
        assert_eq!(deleted, vec![files[0].clone(), files[1].clone()]);
        for f in &files[..2] {
            assert!(!f.exists() && !metadata_path(f).exists(), "{}", f.display());
        }
        for f in files[2..].iter().chain(&others) {
            assert!(f.exists(), "{}", f.display());
        }
        // Retention: keepLast 1 and keepWeekly 2 keep 01-04 and 01-03's week's newest... the
        // 1st to 4th of January 2026 are Thursday to Sunday, one ISO week: 01-04 alone.
        let weekly = Pruning::Retention(
            etcd_shared::types::Retention {
                keep_last: 1,
                keep_weekly: 2,
                ..Default::default()
            },
            k8s_openapi::jiff::tz::TimeZone::UTC,
        );
        let deleted = retain(&prefix, &weekly, &files[3]).expect("retained");
        assert_eq!(deleted, vec![files[2].clone()]);
        assert!(files[3].exists() && !metadata_path(&files[2]).exists());
        for f in &others {
            assert!(f.exists(), "{}", f.display());
        }
    }

    /// Issue 23, item 8: a save cut short by its timeout (the future dropped mid-write) leaves
    /// no temporary file; what a killed pod left is removed by the next save of the same
    /// backup, and nothing else is.
    #[tokio::test]
    async fn an_interrupted_save_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("snap.db");
        let endless =
            futures::stream::iter(vec![Ok::<Bytes, String>(Bytes::from(vec![1u8; 4096]))])
                .chain(futures::stream::pending());
        let cut = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            write_snapshot(&target, endless),
        )
        .await;
        assert!(cut.is_err(), "the write should still be waiting");
        assert!(!temporary_path(&target).exists(), "a .part file was left");
        assert!(!target.exists());

        // Leftovers of a killed pod: this backup's own are removed, others' are kept.
        let prefix = dir.path().join("periodic.db");
        let own = [
            temporary_path(&target),
            temporary_path(&dir.path().join("periodic.db_v12_2026-01-02-15:04:05")),
        ];
        let others = [
            temporary_path(&dir.path().join("other.db")),
            temporary_path(&dir.path().join("periodic.db.notes")),
            dir.path().join("periodic.db_v11_2026-01-02-15:04:04"),
        ];
        for f in own.iter().chain(&others) {
            std::fs::write(f, b"x").expect("write");
        }
        let mut removed = remove_leftovers(&target, Some(&prefix)).expect("cleanup");
        removed.sort();
        let mut want = own.to_vec();
        want.sort();
        assert_eq!(removed, want);
        for f in &others {
            assert!(f.exists(), "{} was removed", f.display());
        }
    }

    #[test]
    fn a_full_claim_is_told_from_other_failures() {
        let full = FileError::Io {
            what: "writing",
            path: "x".into(),
            source: std::io::Error::from_raw_os_error(28),
        };
        assert!(is_full(&full));
        let denied = FileError::Io {
            what: "writing",
            path: "x".into(),
            source: std::io::Error::from(std::io::ErrorKind::PermissionDenied),
        };
        assert!(!is_full(&denied));
    }
}
