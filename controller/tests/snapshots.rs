//! Snapshots from real etcd members into a real S3 server (versitygw) and back: the Snapshot
//! RPC streamed into a multipart upload with its metadata, read back and checked, accepted by
//! etcd's own `snapshot restore` (etcdctl on 3.2, etcdutl on 3.6), and every damaged case
//! refused: a stream whose hash does not check leaves no object, a stored object changed on
//! disk fails the check, a missing one is `NotFound`.
//!
//! Run: `cargo test -p etcd-controller --test snapshots` (needs `hack/build-tools.sh`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use etcd_controller::etcd::EtcdAccess;
use etcd_controller::snapshot::integrity::IntegrityError;
use etcd_controller::snapshot::store::{
    self, AwsProfile, Credentials, StoreLocation, StoreTimeouts,
};
use etcd_controller::snapshot::transfer::{self, SnapshotInfo, TransferError, meta::Names};
use etcd_shared::types::storage::S3Source;
use etcd_tests::member::SingleMember;
use etcd_tests::s3::S3Server;
use etcd_tests::{Tools, poll_until};
use futures::StreamExt as _;
use object_store::ObjectStore;

const KEYS: usize = 2_000;

async fn open_bucket(server: &S3Server, bucket: &str) -> anyhow::Result<Arc<dyn ObjectStore>> {
    server.create_bucket(bucket).await?;
    let source = S3Source {
        path: format!("{bucket}/unused"),
        aws_secret: "aws".into(),
        endpoint: server.endpoint().into(),
        force_path_style: true,
    };
    let profile = AwsProfile::parse(&server.credentials_file(), Some(&server.config_file()))?;
    Ok(store::open(
        &StoreLocation::s3(&source)?,
        &Credentials::Aws(profile),
        StoreTimeouts::default(),
    )?)
}

/// A member of `version` with [`KEYS`] keys, snapshotted into the bucket, read back, checked,
/// and restored by etcd's own tool.
async fn round_trip(
    tools: &Tools,
    server: &S3Server,
    bucket: &Arc<dyn ObjectStore>,
    version: &str,
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let member = SingleMember::start(&tools.etcd(version)?, dir.path(), &[])?;
    let access = EtcdAccess {
        timeout: Duration::from_secs(3),
        ..EtcdAccess::default()
    };
    poll_until("member up", Duration::from_secs(30), || async {
        anyhow::Ok(
            access
                .status(&member.endpoint)
                .await
                .ok()
                .filter(|s| s.leader != 0),
        )
    })
    .await?;
    let mut client = etcd_client::Client::connect([member.endpoint.as_str()], None).await?;
    for i in 0..KEYS {
        client
            .put(
                format!("key-{i:05}"),
                format!("value-{i}-{}", "x".repeat(200)),
                None,
            )
            .await?;
    }
    let status = access.status(&member.endpoint).await?;
    ensure!(
        status.revision > KEYS as i64,
        "revision {}",
        status.revision
    );

    let key = format!("{version}/snapshot.db");
    let info = SnapshotInfo {
        etcd_version: status.version.clone(),
        revision: status.revision,
        cluster: "test/a".into(),
        member: "a".into(),
        encrypted: false,
    };
    let stream = access
        .snapshot(&member.endpoint, Duration::from_secs(60))
        .await?;
    let uploaded = transfer::upload(bucket, &key, &info, Names::Hyphens, stream, None).await?;
    ensure!(
        // The snapshot commits the backend first, so it may be a little larger.
        uploaded.db_size > 0 && (uploaded.db_size as i64) < 2 * status.db_size + (1 << 20),
        "db {} vs status {}",
        uploaded.db_size,
        status.db_size
    );

    // Read back: the same bytes, the metadata as written.
    let (checked, stored) = transfer::verify(bucket, &key, Some(&uploaded.sha256), None).await?;
    ensure!(checked == uploaded, "{checked:?} != {uploaded:?}");
    ensure!(
        stored.etcd_version.as_deref() == Some(version),
        "{stored:?}"
    );
    ensure!(stored.revision == Some(status.revision), "{stored:?}");

    // etcd's own restore takes it (it checks the hash too).
    let file = dir.path().join("downloaded.db");
    let mut out = std::fs::File::create(&file)?;
    transfer::download(bucket, &key, None, None, |chunk| {
        std::io::Write::write_all(&mut out, chunk).map_err(|source| TransferError::File {
            path: "downloaded.db".into(),
            source,
        })
    })
    .await?;
    drop(out);
    let restore_dir = dir.path().join("restored");
    let line_has_etcdutl = !version.starts_with("3.2") && !version.starts_with("3.3");
    let output = if line_has_etcdutl && tools.etcdutl(version).is_ok() {
        std::process::Command::new(tools.etcdutl(version)?)
            .args(["snapshot", "restore"])
            .arg(&file)
            .arg(format!("--data-dir={}", restore_dir.display()))
            .output()?
    } else {
        std::process::Command::new(tools.etcdctl(version)?)
            .env("ETCDCTL_API", "3")
            .args(["snapshot", "restore"])
            .arg(&file)
            .arg(format!("--data-dir={}", restore_dir.display()))
            .output()?
    };
    ensure!(
        output.status.success(),
        "snapshot restore on {version}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(restore_dir.join("member/snap/db").is_file());

    // A stored object changed on disk fails the check.
    let stored_file = server.object_file("snapshots", &key);
    let mut bytes = std::fs::read(&stored_file).context("the stored object")?;
    bytes[4096] ^= 0x5a;
    std::fs::write(&stored_file, &bytes)?;
    let err = transfer::verify(bucket, &key, None, None)
        .await
        .expect_err("a changed object must fail");
    ensure!(
        matches!(
            err,
            TransferError::Integrity(IntegrityError::Mismatch { .. })
        ),
        "{err}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_go_to_s3_and_back_intact() -> anyhow::Result<()> {
    let tools = Tools::from_env()?;
    let server = S3Server::start(&tools, "127.0.0.1").await?;
    let bucket = open_bucket(&server, "snapshots").await?;
    for version in ["3.2.13", "3.6.16"] {
        round_trip(&tools, &server, &bucket, version)
            .await
            .with_context(|| format!("etcd {version}"))?;
    }

    // A stream whose hash does not check is aborted: nothing is left under its name.
    let mut db = vec![7u8; 3 * 512];
    db.extend_from_slice(&[0u8; 32]);
    let info = SnapshotInfo {
        etcd_version: "3.6.16".into(),
        revision: 1,
        cluster: "test/a".into(),
        member: "a".into(),
        encrypted: false,
    };
    let chunks = futures::stream::iter(
        db.chunks(100)
            .map(|c| Ok::<_, String>(Bytes::copy_from_slice(c)))
            .collect::<Vec<_>>(),
    );
    let err = transfer::upload(
        &bucket,
        "bad/snapshot.db",
        &info,
        Names::Hyphens,
        chunks,
        None,
    )
    .await
    .expect_err("a bad hash must fail");
    ensure!(matches!(err, TransferError::Integrity(_)), "{err}");
    let listed: Vec<_> = bucket.list(Some(&"bad".into())).collect::<Vec<_>>().await;
    ensure!(listed.is_empty(), "an aborted upload left {listed:?}");

    // A source that fails midway is aborted too.
    let failing = futures::stream::iter(vec![
        Ok(Bytes::from(vec![1u8; 1024])),
        Err("member went away".to_string()),
    ]);
    let err = transfer::upload(
        &bucket,
        "bad/failing.db",
        &info,
        Names::Hyphens,
        failing,
        None,
    )
    .await
    .expect_err("a failed source must fail");
    ensure!(matches!(err, TransferError::Source(_)), "{err}");

    // Missing objects and wrong keys say so.
    let err = transfer::verify(&bucket, "nothing/here.db", None, None)
        .await
        .expect_err("missing");
    ensure!(err.reason() == "NotFound", "{err}");

    // Wrong credentials are refused by the server's SigV4 check.
    let source = S3Source {
        path: "snapshots/x".into(),
        aws_secret: "aws".into(),
        endpoint: server.endpoint().into(),
        force_path_style: true,
    };
    let wrong = AwsProfile::parse(
        &format!(
            "[default]\naws_access_key_id={}\naws_secret_access_key=wrong\n",
            server.access_key()
        ),
        None,
    )?;
    let denied = store::open(
        &StoreLocation::s3(&source)?,
        &Credentials::Aws(wrong),
        StoreTimeouts::default(),
    )?;
    let err = transfer::verify(&denied, "3.6.16/snapshot.db", None, None)
        .await
        .expect_err("wrong secret");
    ensure!(err.reason() == "AccessDenied", "{err} ({})", err.reason());
    Ok(())
}

/// Every file under `dir`, recursively (relative paths; directories are not listed: the
/// server keeps an empty scaffolding of its own).
fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path.clone());
                continue;
            }
            out.push(
                path.strip_prefix(dir)
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            );
        }
    }
    out.sort();
    out
}

/// Issue 23, item 8: a backup whose timeout expires mid-upload (its future dropped, as
/// `timeoutInSecond` does) aborts its multipart upload: the S3 server holds nothing of it
/// afterwards. Before, the upload was abandoned, its parts kept (and billed) by the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_upload_is_aborted_not_abandoned() -> anyhow::Result<()> {
    let tools = Tools::from_env()?;
    let server = S3Server::start(&tools, "127.0.0.1").await?;
    let bucket = open_bucket(&server, "abandoned").await?;
    let before = files_under(server.root());
    // 20 MiB (more than one part) of a snapshot that never ends: the member stalls.
    let chunks = futures::stream::iter(
        (0..20).map(|_| Ok::<Bytes, std::io::Error>(Bytes::from(vec![7u8; 1024 * 1024]))),
    )
    .chain(futures::stream::pending());
    let info = SnapshotInfo {
        etcd_version: "3.6.16".into(),
        revision: 1,
        cluster: "test/a".into(),
        member: "a".into(),
        encrypted: false,
    };
    let upload = transfer::upload(
        &bucket,
        "stalled/snapshot.db",
        &info,
        Names::Hyphens,
        chunks,
        None,
    );
    let timed_out = tokio::time::timeout(Duration::from_secs(5), upload).await;
    ensure!(
        timed_out.is_err(),
        "the stalled upload ended: {timed_out:?}"
    );
    let during = files_under(server.root());
    println!(
        "while uploading, the store held {} more files",
        during.len() - before.len()
    );
    ensure!(during.len() > before.len(), "the upload wrote no part");
    poll_until(
        "nothing left of the aborted upload",
        Duration::from_secs(30),
        || {
            let now = files_under(server.root());
            let before = before.clone();
            async move { anyhow::Ok((now == before).then_some(())) }
        },
    )
    .await
    .with_context(|| {
        format!(
            "left in the store: {:?}",
            files_under(server.root())
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect::<Vec<_>>()
        )
    })?;
    Ok(())
}
