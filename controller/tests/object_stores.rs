//! Snapshots into a real Azure Blob Storage server (Azurite) and a real GCS server
//! (fake-gcs-server), both started here, through the controller's one store code
//! (`StoreLocation` and `Credentials` from CoreOS' source and secret keys, `store::open`,
//! `transfer`): upload with metadata, read back and checked, listing and deletion (what
//! periodic retention does), the seed member's `restore fetch` from the secret as mounted
//! files, an encrypted snapshot (age) read back only with its key, and the failures a user meets (a damaged stream leaves no object, a missing object is
//! `NotFound`, a wrong account key is `AccessDenied`).
//!
//! Run: `cargo test -p etcd-controller --test object_stores` (needs `hack/build-tools.sh`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::{Context as _, ensure};
use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::{Attribute, ObjectStore, ObjectStoreExt as _};
use sha2::{Digest as _, Sha256};

use etcd_controller::in_pod::seed::{self, FetchArgs};
use etcd_controller::snapshot::encryption::{self, Identities, Recipients, Sealer};
use etcd_controller::snapshot::store::{self, Credentials, StoreLocation, StoreTimeouts};
use etcd_controller::snapshot::transfer::{self, SnapshotInfo, TransferError};
use etcd_shared::types::storage::StorageSource;
use etcd_tests::Tools;
use etcd_tests::azurite::{self, AzuriteServer};
use etcd_tests::gcs::GcsServer;

/// A stream shaped as etcd's Snapshot RPC sends it: `blocks` 512-byte blocks of a database,
/// then its SHA-256, in 1 MiB chunks.
fn snapshot(blocks: usize, seed: u8) -> (Vec<Result<Bytes, std::io::Error>>, u64) {
    let mut db: Vec<u8> = (0..blocks * 512)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    let hash = Sha256::digest(&db);
    db.extend_from_slice(&hash);
    let size = db.len() as u64;
    let chunks = db
        .chunks(1 << 20)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    (chunks, size)
}

/// The store a source (YAML) names, opened with the secret's keys.
fn open(
    storage_type: &str,
    source: &str,
    secret: &BTreeMap<&str, String>,
) -> anyhow::Result<(StoreLocation, Arc<dyn ObjectStore>)> {
    let source: StorageSource = serde_yaml::from_str(source)?;
    let location = StoreLocation::from_source(storage_type, &source)?;
    let get = |key: &str| secret.get(key).cloned();
    let credentials = Credentials::read(&location.backend, Some(&get))?;
    let bucket = store::open(&location, &credentials, StoreTimeouts::default())?;
    Ok((location, bucket))
}

/// What every store must do; `large` adds a snapshot of several parts (a multipart upload).
async fn exercise(
    storage_type: &str,
    source: &str,
    secret: &BTreeMap<&str, String>,
    large: bool,
) -> anyhow::Result<()> {
    let (location, bucket) = open(storage_type, source, secret)?;
    let info = SnapshotInfo {
        etcd_version: "3.6.16".into(),
        revision: 4242,
        cluster: "ns/demo".into(),
        member: "demo-0".into(),
        encrypted: false,
    };
    let names = location.metadata_names();
    let mut sizes = vec![(64usize, "small.db")];
    if large {
        // 20 MiB: three parts of 8 MiB.
        sizes.push((40 * 1024, "large.db"));
    }
    for (blocks, name) in sizes {
        let key = format!("{}/{name}", location.key);
        let (chunks, size) = snapshot(blocks, 7);
        let uploaded = transfer::upload(
            &bucket,
            &key,
            &info,
            names,
            futures::stream::iter(chunks),
            None,
        )
        .await?;
        ensure!(uploaded.size == size, "{storage_type} {name}: {uploaded:?}");
        let meta = bucket.head(&key.as_str().into()).await?;
        ensure!(meta.size == size, "{storage_type} {name}: {meta:?}");
        let (checked, stored) =
            transfer::verify(&bucket, &key, Some(&uploaded.sha256), None).await?;
        ensure!(checked == uploaded, "{checked:?}");
        ensure!(
            stored.etcd_version.as_deref() == Some("3.6.16") && stored.revision == Some(4242),
            "{storage_type} {name}: metadata {stored:?}"
        );
        println!("figure: {storage_type} {name}: {size} bytes written, read back and checked");
    }
    // Encrypted (issue 35): an age file, marked `etcd-encryption: age` as the store spells
    // it, read back only with its key.
    let (identity, recipient) = encryption::generate();
    let ids = Identities::parse(&identity)?;
    let key = format!("{}/sealed.db", location.key);
    let (chunks, size) = snapshot(64, 3);
    let sealed = SnapshotInfo {
        encrypted: true,
        ..info.clone()
    };
    let sealer = Sealer::new(&Recipients::parse(&recipient)?)?;
    let uploaded = transfer::upload(
        &bucket,
        &key,
        &sealed,
        names,
        futures::stream::iter(chunks),
        Some(sealer),
    )
    .await?;
    ensure!(uploaded.size == size, "{storage_type} sealed: {uploaded:?}");
    let got = bucket
        .get_opts(&key.as_str().into(), Default::default())
        .await?;
    let spelled = names.spell(transfer::meta::ENCRYPTION);
    ensure!(
        got.attributes
            .get(&Attribute::Metadata(spelled.clone().into()))
            .map(|v| v.as_ref().to_string())
            == Some("age".into()),
        "{storage_type}: metadata {spelled} in {:?}",
        got.attributes
    );
    let stored = got.bytes().await?;
    ensure!(
        encryption::is_encrypted(&stored) && stored.len() as u64 > size,
        "{storage_type}: an age file of {} bytes",
        stored.len()
    );
    transfer::verify(&bucket, &key, Some(&uploaded.sha256), Some(&ids)).await?;
    let (stranger, _) = encryption::generate();
    let wrong = transfer::verify(&bucket, &key, None, Some(&Identities::parse(&stranger)?)).await;
    ensure!(
        wrong.as_ref().is_err_and(|e| e.reason() == "WrongIdentity"),
        "{storage_type}: {wrong:?}"
    );
    println!("figure: {storage_type} sealed.db: encrypted, read back only with its key");

    // The metadata as the store keeps it: `etcd_version` on Azure (C# identifiers only).
    let got = bucket
        .get_opts(
            &format!("{}/small.db", location.key).into(),
            Default::default(),
        )
        .await?;
    let spelled = names.spell(transfer::meta::ETCD_VERSION);
    ensure!(
        got.attributes
            .get(&Attribute::Metadata(spelled.clone().into()))
            .map(|v| v.as_ref().to_string())
            == Some("3.6.16".into()),
        "{storage_type}: metadata {spelled} in {:?}",
        got.attributes
    );

    // A stream whose hash does not check leaves nothing.
    let (mut chunks, _) = snapshot(16, 1);
    if let Some(Ok(last)) = chunks.last_mut() {
        let mut bytes = last.to_vec();
        bytes[0] ^= 0xff;
        *last = Bytes::from(bytes);
    }
    let err = transfer::upload(
        &bucket,
        "bad/snapshot.db",
        &info,
        names,
        futures::stream::iter(chunks),
        None,
    )
    .await
    .expect_err("a damaged stream");
    ensure!(matches!(err, TransferError::Integrity(_)), "{err}");

    // Listing and deleting by prefix, as periodic retention does.
    for revision in [10, 20, 30] {
        let (chunks, _) = snapshot(4, revision as u8);
        let key = format!(
            "{}/periodic/snap.db_v{revision}_2026-01-02-15:04:05",
            location.key
        );
        transfer::upload(
            &bucket,
            &key,
            &info,
            names,
            futures::stream::iter(chunks),
            None,
        )
        .await?;
    }
    let prefix = format!("{}/periodic", location.key);
    let list = |bucket: Arc<dyn ObjectStore>, prefix: String| async move {
        let listed: Vec<_> = bucket
            .list(Some(&prefix.as_str().into()))
            .try_collect()
            .await?;
        let mut keys: Vec<String> = listed.iter().map(|m| m.location.to_string()).collect();
        keys.sort();
        anyhow::Ok(keys)
    };
    let keys = list(bucket.clone(), prefix.clone()).await?;
    ensure!(keys.len() == 3, "{storage_type}: listed {keys:?}");
    bucket.delete(&transfer::object_path(&keys[0])?).await?;
    let left = list(bucket.clone(), prefix).await?;
    ensure!(
        left == keys[1..],
        "{storage_type}: after a deletion {left:?}"
    );
    ensure!(
        list(bucket.clone(), "bad".into()).await?.is_empty(),
        "{storage_type}: the damaged upload left an object"
    );

    // A missing object says so.
    let err = transfer::verify(&bucket, "nothing/here.db", None, None)
        .await
        .expect_err("missing");
    ensure!(err.reason() == "NotFound", "{err} ({})", err.reason());

    // The seed member's fetch: the source as arguments, the secret as mounted files.
    let dir = tempfile::tempdir()?;
    let secret_dir = dir.path().join("secret");
    std::fs::create_dir_all(&secret_dir)?;
    for (key, value) in secret {
        std::fs::write(secret_dir.join(key), value)?;
    }
    let (_, sha) = {
        let (chunks, _) = snapshot(64, 7);
        let bytes: Vec<u8> = chunks
            .into_iter()
            .flat_map(|c| c.map(|b| b.to_vec()).unwrap_or_default())
            .collect();
        (bytes.len(), transfer_hash(&bytes))
    };
    let endpoint = source
        .lines()
        .find_map(|l| l.trim().strip_prefix("endpoint: "))
        .unwrap_or_default()
        .to_string();
    let args = FetchArgs {
        storage_type: storage_type.into(),
        path: location.display(&format!("{}/small.db", location.key)),
        file: None,
        member: None,
        tls_dir: None,
        server_name: String::new(),
        endpoint,
        force_path_style: false,
        credentials_dir: Some(secret_dir),
        identity_file: None,
        sha256: sha,
        work_dir: dir.path().join("restore"),
        data_dir: dir.path().join("data"),
    };
    let said = seed::fetch(&args).await?;
    let fetched = std::fs::metadata(
        args.work_dir
            .join(etcd_controller::builders::seed::SNAPSHOT_FILE),
    )?
    .len();
    ensure!(fetched == 64 * 512 + 32, "{said}");
    println!("{storage_type}: restore fetch: {said}");
    Ok(())
}

/// The database hash etcd appended (the last 32 bytes), hex.
fn transfer_hash(stream: &[u8]) -> String {
    stream[stream.len() - 32..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn azure_blob_storage_through_azurite() -> anyhow::Result<()> {
    let server = AzuriteServer::start(&Tools::from_env()?, "127.0.0.1").await?;
    server.create_container("etcd-backups").await?;
    let source = format!(
        "abs:\n  path: etcd-backups/demo/snapshots\n  absSecret: azure\n  endpoint: {}\n",
        server.endpoint()
    );
    let secret = BTreeMap::from([
        ("storage-account", azurite::ACCOUNT.to_string()),
        ("storage-key", azurite::ACCOUNT_KEY.to_string()),
    ]);
    exercise("ABS", &source, &secret, true)
        .await
        .with_context(|| server.log_tail(20))?;

    // A wrong account key is refused by the server's Shared Key check.
    let wrong = BTreeMap::from([
        ("storage-account", azurite::ACCOUNT.to_string()),
        ("storage-key", "d3Jvbmcga2V5".to_string()),
    ]);
    let (_, denied) = open("ABS", &source, &wrong)?;
    let err = transfer::verify(&denied, "demo/snapshots/small.db", None, None)
        .await
        .expect_err("a wrong key");
    ensure!(err.reason() == "AccessDenied", "{err} ({})", err.reason());
    Ok(())
}

#[tokio::test]
async fn google_cloud_storage_through_fake_gcs_server() -> anyhow::Result<()> {
    let server = GcsServer::start(&Tools::from_env()?, "127.0.0.1").await?;
    server.create_bucket("etcd-backups").await?;
    let source = "gcs:\n  path: etcd-backups/demo/snapshots\n  gcpSecret: gcp\n";
    let secret = BTreeMap::from([("credentials.json", server.credentials_json())]);
    // fake-gcs-server has no XML multipart upload: snapshots of one part only.
    exercise("GCS", source, &secret, false)
        .await
        .with_context(|| server.log_tail(20))?;
    Ok(())
}
