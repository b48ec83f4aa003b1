//! `etcd-controller restore fetch|place`: the two steps the operator's own image runs as init
//! containers of a restored cluster's first member, around etcd's own
//! `etcdutl snapshot restore` (`etcdctl` on 3.2-3.4) in the etcd image:
//!
//! 1. **fetch** downloads the snapshot into `WORK/snapshot.db` (or, for storage type PVC,
//!    copies it from the claim mounted read-only, `--file`), checking etcd's hash and the hash
//!    the restore controller verified, and empties `WORK/data` (where etcd's tool writes);
//! 2. etcd's tool restores `WORK/snapshot.db` into `WORK/data` (a new member and cluster ID);
//! 3. **place** moves `WORK/data` to the member's data directory, unless the member has data
//!    already.
//!
//! The steps run again when the pod's init containers do (a node restart): the downloaded
//! snapshot is kept in `WORK` and reused when its hash checks, so a rerun needs no object
//! store, and a member that has data keeps it (the rerun's restore output is discarded).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args as ClapArgs, Parser, Subcommand};

use etcd_shared::types::storage::{AbsSource, GcsSource, S3Source, StorageSource};

use super::claim_files::{self, FileError, io};
use crate::builders::seed::{RESTORED_DIR, SNAPSHOT_FILE};
use crate::snapshot::encryption::Identities;
use crate::snapshot::integrity::SnapshotHasher;
use crate::snapshot::store::{self, Credentials, StoreLocation, StoreTimeouts};
use crate::snapshot::transfer::{self, TransferError};

/// `etcd-controller restore ...`.
#[derive(Debug, Parser)]
#[command(
    name = "etcd-controller restore",
    about = "The steps of seeding a restored etcd member (run by the operator as init containers)"
)]
pub struct RestoreCommand {
    /// The step.
    #[command(subcommand)]
    pub step: RestoreStep,
}

/// A step of the seed member's restore.
#[derive(Debug, Subcommand)]
pub enum RestoreStep {
    /// Download and check the snapshot into the work directory.
    Fetch(Box<FetchArgs>),
    /// Move the restored data directory into place.
    Place(PlaceArgs),
}

/// `restore fetch`.
#[derive(Debug, ClapArgs)]
pub struct FetchArgs {
    /// The store: S3, ABS or GCS (the restore's `backupStorageType`); unused with `--file`.
    #[arg(long, default_value = "S3")]
    pub storage_type: String,
    /// BUCKET/KEY (CONTAINER/BLOB for ABS) of the snapshot, in the object store.
    #[arg(long, default_value = "", required_unless_present_any = ["file", "member"])]
    pub path: String,
    /// The snapshot file, in a claim mounted read-only (PVC): copied instead of downloaded.
    #[arg(long, conflicts_with = "path")]
    pub file: Option<PathBuf>,
    /// The client URL of a member to stream the snapshot from over etcd's Snapshot RPC (a
    /// recovery from its last surviving member), instead of a store.
    #[arg(long, conflicts_with_all = ["path", "file"])]
    pub member: Option<String>,
    /// With `--member`: a directory holding the operator's client certificate (etcd-client.crt,
    /// etcd-client.key, etcd-client-ca.crt), for members that serve clients over TLS.
    #[arg(long, requires = "member")]
    pub tls_dir: Option<PathBuf>,
    /// With `--tls-dir`: the name the member's certificate is verified against.
    #[arg(long, default_value = "")]
    pub server_name: String,
    /// URL of the store (S3: an S3-compatible store, blank for AWS; ABS: the Blob service,
    /// blank for the account's host in its cloud).
    #[arg(long, default_value = "")]
    pub endpoint: String,
    /// Address the bucket by path (S3).
    #[arg(long)]
    pub force_path_style: bool,
    /// Directory holding the store's secret as files (awsSecret, absSecret or gcpSecret);
    /// absent for GCS with the default credentials and for a PVC `--file`.
    #[arg(long)]
    pub credentials_dir: Option<PathBuf>,
    /// The SHA-256 (hex) the snapshot's database must have (with `--member`: the one the
    /// recovery verified, for the record; the stream is checked against etcd's own hash).
    #[arg(long)]
    pub sha256: String,
    /// A file holding the age identities (`AGE-SECRET-KEY-1...`, the identitySecret's key
    /// `identity`) that decrypt an encrypted snapshot from a store.
    #[arg(long, conflicts_with_all = ["file", "member"])]
    pub identity_file: Option<PathBuf>,
    /// Work directory on the member's data volume.
    #[arg(long)]
    pub work_dir: PathBuf,
    /// The member's data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
}

/// `restore place`.
#[derive(Debug, ClapArgs)]
pub struct PlaceArgs {
    /// Work directory on the member's data volume.
    #[arg(long)]
    pub work_dir: PathBuf,
    /// The member's data directory.
    #[arg(long)]
    pub data_dir: PathBuf,
}

/// Why a step failed.
#[derive(Debug, thiserror::Error)]
pub enum SeedError {
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    /// The download failed or did not check (or could not be decrypted).
    #[error(transparent)]
    Transfer(#[from] TransferError),
    /// The identity file cannot be read or used.
    #[error("the identity file {path}: {reason}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file or directory operation failed, or the copy from the claim did not check.
    #[error(transparent)]
    File(#[from] FileError),
    /// etcd's tool left no member directory.
    #[error("{0} holds no restored member (member/snap/db): did the restore step run?")]
    NothingRestored(PathBuf),
    /// The member could not be reached, or its client certificate not used.
    #[error("the snapshot from the member: {0}")]
    Member(String),
    /// The member's snapshot checks, but is not the one the recovery verified.
    #[error(
        "the member's snapshot has sha256 {got}, the recovery verified {expected}: its data changed since"
    )]
    Changed {
        /// What was verified.
        expected: String,
        /// What came.
        got: String,
    },
}

/// Whether `data_dir` holds a member's data.
fn has_member(data_dir: &Path) -> bool {
    data_dir.join("member").is_dir()
}

/// Runs one step; returns what it did, in words.
pub async fn run(command: RestoreCommand) -> Result<String, SeedError> {
    match command.step {
        RestoreStep::Fetch(args) => fetch(&args).await,
        RestoreStep::Place(args) => place(&args),
    }
}

/// The SHA-256 of the database in a snapshot file, if the file is an intact snapshot.
fn file_hash(path: &Path) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut hasher = SnapshotHasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = std::io::Read::read(&mut file, &mut buf).ok()?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hasher.finish().ok().map(|c| c.sha256)
}

/// Step 1: the snapshot in `WORK/snapshot.db` (kept when already there and intact), and an
/// empty `WORK/data`.
pub async fn fetch(args: &FetchArgs) -> Result<String, SeedError> {
    std::fs::create_dir_all(&args.work_dir).map_err(io("creating", &args.work_dir))?;
    let restored = args.work_dir.join(RESTORED_DIR);
    if restored.exists() {
        std::fs::remove_dir_all(&restored).map_err(io("removing", &restored))?;
    }
    let snapshot = args.work_dir.join(SNAPSHOT_FILE);
    let expected = args.sha256.trim().to_ascii_lowercase();
    if let Some(member) = &args.member {
        return from_member(args, member, &snapshot).await;
    }
    if file_hash(&snapshot).as_deref() == Some(expected.as_str()) {
        return Ok(format!(
            "{} is already here and intact (sha256 {expected})",
            snapshot.display()
        ));
    }
    if let Some(file) = &args.file {
        return copy(file, &expected, &args.work_dir, &snapshot);
    }

    let location = StoreLocation::from_source(&args.storage_type, &fetch_source(args))?;
    let credentials = match &args.credentials_dir {
        Some(dir) => Credentials::read(
            &location.backend,
            Some(&|key: &str| std::fs::read_to_string(dir.join(key)).ok()),
        )?,
        None => Credentials::read(&location.backend, None)?,
    };
    let identities = args
        .identity_file
        .as_deref()
        .map(read_identities)
        .transpose()?;
    let bucket = store::open(&location, &credentials, StoreTimeouts::default())?;
    let partial = args.work_dir.join(format!("{SNAPSHOT_FILE}.part"));
    let mut out = std::fs::File::create(&partial).map_err(io("creating", &partial))?;
    let outcome = download(
        &bucket,
        &location.key,
        &expected,
        identities.as_ref(),
        &mut out,
        &partial,
    )
    .await;
    drop(out);
    let size = keep_if_done(&partial, &snapshot, outcome)?;
    Ok(format!(
        "downloaded {} ({size} bytes, sha256 {expected}) to {}",
        args.path,
        snapshot.display()
    ))
}

/// The age identities of the mounted identitySecret's file.
fn read_identities(path: &Path) -> Result<Identities, SeedError> {
    let failed = |reason: String| SeedError::Identity {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| failed(e.to_string()))?;
    Identities::parse(&text).map_err(|e| failed(e.to_string()))
}

/// Moves the temporary file `partial` to `snapshot` when it was written (`outcome` is `Ok`),
/// else removes it.
fn keep_if_done<T>(
    partial: &Path,
    snapshot: &Path,
    outcome: Result<T, SeedError>,
) -> Result<T, SeedError> {
    if outcome.is_ok() {
        std::fs::rename(partial, snapshot).map_err(io("renaming", partial))?;
    } else {
        let _ = std::fs::remove_file(partial);
    }
    outcome
}

/// Streams the snapshot of the member at `member` into `snapshot` (through a temporary file,
/// etcd's hash checked as it passes); one already there and intact is kept (a rerun).
///
/// The bytes differ from the snapshot the recovery verified (etcd commits its backend before
/// each snapshot, which moves bbolt's transaction ID), so the check is etcd's own hash, not the
/// recovery's; the data cannot differ: a member without quorum applies nothing.
async fn from_member(args: &FetchArgs, member: &str, snapshot: &Path) -> Result<String, SeedError> {
    if let Some(sha256) = file_hash(snapshot) {
        return Ok(format!(
            "{} is already here and intact (sha256 {sha256})",
            snapshot.display()
        ));
    }
    let tls = args
        .tls_dir
        .as_deref()
        .map(|dir| super::claim_command::member_tls(dir, &args.server_name))
        .transpose()
        .map_err(|e| SeedError::Member(e.to_string()))?;
    let access = crate::etcd::EtcdAccess {
        tls: tls.map(Arc::new),
        tls_id: 0,
        timeout: std::time::Duration::from_secs(10),
        pool: None,
    };
    let stream = access
        .snapshot(member, crate::snapshot::MEMBER_SNAPSHOT_TIMEOUT)
        .await
        .map_err(|e| SeedError::Member(e.to_string()))?;
    let checked = claim_files::write_snapshot(snapshot, stream).await?;
    Ok(format!(
        "streamed the snapshot of {member} ({} bytes, sha256 {}) to {}",
        checked.size,
        checked.sha256,
        snapshot.display()
    ))
}

/// Copies the snapshot `file` (a claim mounted read-only) to `snapshot` through a temporary
/// file, checking etcd's hash, its metadata's and `expected` as it passes.
fn copy(
    file: &Path,
    expected: &str,
    work_dir: &Path,
    snapshot: &Path,
) -> Result<String, SeedError> {
    let partial = work_dir.join(format!("{SNAPSHOT_FILE}.part"));
    let mut out = std::fs::File::create(&partial).map_err(io("creating", &partial))?;
    let copied = claim_files::verify_file(file, Some(expected), |chunk| {
        out.write_all(chunk).map_err(io("writing", &partial))
    })
    .map_err(SeedError::from)
    .and_then(|(checked, _)| {
        out.sync_all().map_err(io("syncing", &partial))?;
        Ok(checked)
    });
    drop(out);
    let checked = keep_if_done(&partial, snapshot, copied)?;
    Ok(format!(
        "copied {} ({} bytes, sha256 {expected}) to {}",
        file.display(),
        checked.size,
        snapshot.display()
    ))
}

/// The storage source the arguments name (the secret is the mounted directory, not a name).
fn fetch_source(args: &FetchArgs) -> StorageSource {
    let path = args.path.clone();
    let endpoint = args.endpoint.clone();
    match args.storage_type.as_str() {
        "ABS" => StorageSource {
            abs: Some(AbsSource {
                path,
                endpoint,
                ..AbsSource::default()
            }),
            ..StorageSource::default()
        },
        "GCS" => StorageSource {
            gcs: Some(GcsSource {
                path,
                ..GcsSource::default()
            }),
            ..StorageSource::default()
        },
        _ => StorageSource {
            s3: Some(S3Source {
                path,
                endpoint,
                force_path_style: args.force_path_style,
                ..S3Source::default()
            }),
            ..StorageSource::default()
        },
    }
}

async fn download(
    bucket: &Arc<dyn object_store::ObjectStore>,
    key: &str,
    expected: &str,
    identities: Option<&Identities>,
    out: &mut std::fs::File,
    partial: &Path,
) -> Result<u64, SeedError> {
    let (checked, _) = transfer::download(bucket, key, Some(expected), identities, |chunk| {
        out.write_all(chunk).map_err(|source| TransferError::File {
            path: partial.display().to_string(),
            source,
        })
    })
    .await?;
    out.sync_all().map_err(io("syncing", partial))?;
    Ok(checked.size)
}

/// Step 3: `WORK/data` becomes the member's data directory, unless it has data already.
pub fn place(args: &PlaceArgs) -> Result<String, SeedError> {
    let restored = args.work_dir.join(RESTORED_DIR);
    if has_member(&args.data_dir) {
        if restored.exists() {
            std::fs::remove_dir_all(&restored).map_err(io("removing", &restored))?;
        }
        return Ok(format!(
            "{} has member data already; kept (the restore ran before)",
            args.data_dir.display()
        ));
    }
    if !restored.join("member/snap/db").is_file() {
        return Err(SeedError::NothingRestored(restored));
    }
    if args.data_dir.exists() {
        // An empty directory left by an earlier start: rename replaces only empty ones.
        std::fs::remove_dir(&args.data_dir).map_err(io("removing", &args.data_dir))?;
    }
    std::fs::rename(&restored, &args.data_dir).map_err(io("moving into place", &restored))?;
    Ok(format!(
        "restored member data moved to {}",
        args.data_dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place_args(dir: &Path) -> PlaceArgs {
        PlaceArgs {
            work_dir: dir.join("restore"),
            data_dir: dir.join("data"),
        }
    }

    #[test]
    fn place_moves_the_restored_member_once() {
        let dir = tempfile::tempdir().expect("dir");
        let args = place_args(dir.path());
        // Nothing restored: an error, nothing moved.
        assert!(matches!(place(&args), Err(SeedError::NothingRestored(_))));
        let db = args.work_dir.join("data/member/snap/db");
        std::fs::create_dir_all(db.parent().expect("parent")).expect("mkdir");
        std::fs::write(&db, b"first").expect("write");
        std::fs::create_dir_all(&args.data_dir).expect("empty data dir");
        place(&args).expect("placed");
        assert_eq!(
            std::fs::read(args.data_dir.join("member/snap/db")).expect("db"),
            b"first"
        );
        assert!(!args.work_dir.join("data").exists());
        // A rerun restores again: the member keeps its data, the new output is discarded.
        std::fs::create_dir_all(db.parent().expect("parent")).expect("mkdir");
        std::fs::write(&db, b"second").expect("write");
        place(&args).expect("kept");
        assert_eq!(
            std::fs::read(args.data_dir.join("member/snap/db")).expect("db"),
            b"first"
        );
        assert!(!args.work_dir.join("data").exists());
    }

    /// A snapshot file as etcd streams it: 2 blocks of database and its SHA-256.
    fn snapshot_bytes() -> (Vec<u8>, String) {
        use sha2::Digest as _;
        let db: Vec<u8> = (0..1024u32).map(|i| (i % 251) as u8).collect();
        let hash = sha2::Sha256::digest(&db);
        let mut out = db;
        out.extend_from_slice(&hash);
        (out, crate::snapshot::integrity::hex(&hash))
    }

    #[tokio::test]
    async fn fetch_copies_a_claim_file_only_when_it_is_the_verified_snapshot() {
        let dir = tempfile::tempdir().expect("dir");
        let (bytes, sha) = snapshot_bytes();
        let file = dir.path().join("claim/demo/snap.db");
        std::fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
        std::fs::write(&file, &bytes).expect("write");
        let args = |sha256: &str| FetchArgs {
            storage_type: "S3".into(),
            path: String::new(),
            file: Some(file.clone()),
            member: None,
            tls_dir: None,
            server_name: String::new(),
            endpoint: String::new(),
            force_path_style: false,
            credentials_dir: None,
            identity_file: None,
            sha256: sha256.to_string(),
            work_dir: dir.path().join("restore"),
            data_dir: dir.path().join("data"),
        };
        // Another snapshot than the one verified: refused, nothing left behind.
        let e = fetch(&args(&"0".repeat(64)))
            .await
            .expect_err("not the verified one");
        assert!(e.to_string().contains("expected 0000"), "{e}");
        assert!(!dir.path().join("restore/snapshot.db").exists());
        assert!(!dir.path().join("restore/snapshot.db.part").exists());
        let done = fetch(&args(&sha)).await.expect("copied");
        assert!(done.starts_with("copied"), "{done}");
        assert_eq!(
            std::fs::read(dir.path().join("restore/snapshot.db")).expect("copy"),
            bytes
        );
        // A rerun keeps the copy without reading the claim.
        std::fs::remove_file(&file).expect("rm");
        let again = fetch(&args(&sha)).await.expect("kept");
        assert!(again.contains("already here"), "{again}");
    }

    #[test]
    fn the_command_line_parses() {
        let c = RestoreCommand::try_parse_from([
            "restore",
            "fetch",
            "--path=b/k",
            "--endpoint=http://s3:9000",
            "--force-path-style",
            "--credentials-dir=/etc/aws",
            "--sha256=ab",
            "--work-dir=/var/lib/etcd/restore",
            "--data-dir=/var/lib/etcd/data",
        ])
        .expect("parses");
        assert!(
            matches!(c.step, RestoreStep::Fetch(ref f) if f.force_path_style && f.path == "b/k")
        );
        assert!(RestoreCommand::try_parse_from(["restore", "place"]).is_err());
        // PVC: a file instead of a path and credentials; not both.
        let pvc = RestoreCommand::try_parse_from([
            "restore",
            "fetch",
            "--file=/var/lib/etcd-restore/claim/s.db",
            "--sha256=ab",
            "--work-dir=/w",
            "--data-dir=/d",
        ])
        .expect("parses");
        assert!(
            matches!(pvc.step, RestoreStep::Fetch(ref f) if f.file.is_some() && f.credentials_dir.is_none())
        );
        assert!(
            RestoreCommand::try_parse_from([
                "restore",
                "fetch",
                "--sha256=ab",
                "--work-dir=/w",
                "--data-dir=/d"
            ])
            .is_err(),
            "a source is required"
        );
        assert!(
            RestoreCommand::try_parse_from([
                "restore",
                "fetch",
                "--file=/f",
                "--path=b/k",
                "--sha256=ab",
                "--work-dir=/w",
                "--data-dir=/d"
            ])
            .is_err(),
            "one source only"
        );
        let RestoreStep::Fetch(s3) = c.step else {
            panic!("fetch")
        };
        assert_eq!(s3.storage_type, "S3", "the default, as before ABS and GCS");
        let location = StoreLocation::from_source(&s3.storage_type, &fetch_source(&s3)).unwrap();
        assert_eq!(
            location.backend,
            store::Backend::S3 {
                endpoint: Some("http://s3:9000".into()),
                force_path_style: true
            }
        );
    }

    #[test]
    fn abs_and_gcs_fetches_name_their_store() {
        let parse = |args: &[&str]| {
            let mut all = vec![
                "restore",
                "fetch",
                "--sha256=ab",
                "--work-dir=/w",
                "--data-dir=/d",
            ];
            all.extend_from_slice(args);
            match RestoreCommand::try_parse_from(all).expect("parses").step {
                RestoreStep::Fetch(f) => f,
                RestoreStep::Place(_) => panic!("fetch"),
            }
        };
        let abs = parse(&[
            "--storage-type=ABS",
            "--path=etcd/snap.db",
            "--endpoint=http://azurite:10000/devstoreaccount1",
            "--credentials-dir=/etc/abs",
        ]);
        let location = StoreLocation::from_source("ABS", &fetch_source(&abs)).unwrap();
        assert_eq!(
            location.backend,
            store::Backend::Abs {
                endpoint: Some("http://azurite:10000/devstoreaccount1".into())
            }
        );
        assert_eq!(
            (location.bucket.as_str(), location.key.as_str()),
            ("etcd", "snap.db")
        );
        // GCS with the default credentials: no secret directory.
        let gcs = parse(&["--storage-type=GCS", "--path=bkt/snap.db"]);
        assert!(gcs.credentials_dir.is_none());
        let location = StoreLocation::from_source("GCS", &fetch_source(&gcs)).unwrap();
        assert_eq!(location.backend, store::Backend::Gcs);
    }
}
