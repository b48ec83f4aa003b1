//! Moving snapshots to and from the store as streams, in constant memory: an upload is a
//! multipart upload of fixed-size parts with a bounded number in flight, completed only when
//! etcd's integrity hash at the end of the stream checks (else aborted, so no partial or
//! damaged object is ever left under the name); a snapshot no larger than one part is
//! written with one request once its hash checked. A download is checked the same way as it
//! passes, and written to a file only by the seed member's fetch. The same code serves every
//! store (S3, Azure Blob Storage, GCS): only the names of the metadata differ ([`meta`]).
//!
//! With encryption ([`super::encryption`]) the upload hashes the plaintext and sends its age
//! ciphertext; the download decrypts as it reads and checks the plaintext, so etcd's hash is
//! always the check of the snapshot itself.

use std::sync::Arc;

use bytes::Bytes;
use futures::{Stream, StreamExt as _, TryStreamExt as _};
use object_store::path::Path;
use object_store::{
    Attribute, AttributeValue, Attributes, ObjectStore, PutMultipartOptions, PutOptions,
    PutPayload, WriteMultipart,
};

use super::encryption::{self, EncryptionError, Identities, Sealer};
use super::integrity::{CheckedSnapshot, IntegrityError, SnapshotHasher};

/// Size of each uploaded part (S3's minimum for all parts but the last is 5 MiB).
pub const PART_SIZE: usize = 8 * 1024 * 1024;

/// Parts uploaded at once: the upload holds at most `(PARTS_IN_FLIGHT + 1) * PART_SIZE` bytes.
pub const PARTS_IN_FLIGHT: usize = 2;

/// User metadata keys on every snapshot object (`x-amz-meta-*` on S3, `x-goog-meta-*` on
/// GCS, `x-ms-meta-*` on Azure Blob Storage, where [`Names::Underscores`] applies).
pub mod meta {
    /// How a store spells the keys.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Names {
        /// As written below (`etcd-version`): S3 and GCS.
        Hyphens,
        /// `-` written `_` (`etcd_version`): Azure, whose metadata names must be C#
        /// identifiers.
        Underscores,
    }

    impl Names {
        /// `key` as this store spells it.
        pub fn spell(self, key: &str) -> String {
            match self {
                Names::Hyphens => key.to_string(),
                Names::Underscores => key.replace('-', "_"),
            }
        }
    }

    /// etcd version of the member the snapshot was taken from.
    pub const ETCD_VERSION: &str = "etcd-version";
    /// etcd revision the snapshot holds at least (read from the member just before).
    pub const ETCD_REVISION: &str = "etcd-revision";
    /// `NAMESPACE/NAME` of the cluster.
    pub const CLUSTER: &str = "etcd-cluster";
    /// The member it was taken from.
    pub const MEMBER: &str = "etcd-member";
    /// `age` when the object is encrypted ([`super::super::encryption`]); absent otherwise.
    pub const ENCRYPTION: &str = "etcd-encryption";
}

/// What is recorded with a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// etcd version of the member.
    pub etcd_version: String,
    /// Revision the snapshot holds at least.
    pub revision: i64,
    /// `NAMESPACE/NAME`.
    pub cluster: String,
    /// The member's name.
    pub member: String,
    /// Whether the object is encrypted.
    pub encrypted: bool,
}

impl SnapshotInfo {
    fn attributes(&self, names: meta::Names) -> Attributes {
        let mut attributes = Attributes::new();
        let mut put = |key: &'static str, value: String| {
            attributes.insert(
                Attribute::Metadata(names.spell(key).into()),
                AttributeValue::from(value),
            );
        };
        put(meta::ETCD_VERSION, self.etcd_version.clone());
        put(meta::ETCD_REVISION, self.revision.to_string());
        put(meta::CLUSTER, self.cluster.clone());
        put(meta::MEMBER, self.member.clone());
        if self.encrypted {
            put(meta::ENCRYPTION, encryption::METADATA_VALUE.to_string());
        }
        attributes
    }
}

/// What a snapshot object's metadata says (each part absent on objects written by others,
/// such as CoreOS' backup operator).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoredInfo {
    /// `etcd-version`.
    pub etcd_version: Option<String>,
    /// `etcd-revision`.
    pub revision: Option<i64>,
}

impl StoredInfo {
    /// Reads either spelling of each key ([`meta::Names`]), whatever the store.
    fn from_attributes(attributes: &Attributes) -> Self {
        let get = |key: &'static str| {
            [meta::Names::Hyphens, meta::Names::Underscores]
                .iter()
                .find_map(|names| attributes.get(&Attribute::Metadata(names.spell(key).into())))
                .map(|v| v.as_ref().trim().to_string())
                .filter(|v| !v.is_empty())
        };
        StoredInfo {
            etcd_version: get(meta::ETCD_VERSION),
            revision: get(meta::ETCD_REVISION).and_then(|r| r.parse().ok()),
        }
    }
}

/// Why a transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The key is not a valid object name.
    #[error("{key:?} is not a valid object key: {source}")]
    BadKey {
        /// The key.
        key: String,
        /// Why.
        #[source]
        source: object_store::path::Error,
    },
    /// The store refused or failed a request.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    /// The source of the stream failed (etcd, for an upload).
    #[error("reading the snapshot: {0}")]
    Source(String),
    /// The upload's writer was already handed on (a bug, never expected).
    #[error("the multipart upload was already finished or aborted")]
    UploadGone,
    /// The stream is not an intact snapshot; the upload was aborted.
    #[error(transparent)]
    Integrity(#[from] IntegrityError),
    /// The snapshot could not be encrypted or decrypted (no identity, the wrong one, a damaged
    /// object); nothing was written.
    #[error(transparent)]
    Encryption(#[from] EncryptionError),
    /// Reading the object failed mid-stream.
    #[error("reading the snapshot from the store: {0}")]
    Read(std::io::Error),
    /// Writing the downloaded snapshot to a file failed.
    #[error("writing {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl TransferError {
    /// A static label for metrics and status reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            TransferError::BadKey { .. } => "BadPath",
            TransferError::Store(object_store::Error::NotFound { .. }) => "NotFound",
            TransferError::Store(
                object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. },
            ) => "AccessDenied",
            TransferError::Store(_) => "StoreFailed",
            TransferError::Source(_) => "SnapshotFailed",
            TransferError::Integrity(_) => "IntegrityCheckFailed",
            TransferError::File { .. } => "WriteFailed",
            TransferError::UploadGone | TransferError::Read(_) => "StoreFailed",
            TransferError::Encryption(e) => e.reason(),
        }
    }
}

impl TransferError {
    /// An error of a (possibly decrypting) download stream: the decryption's own error when it
    /// is one, else the store's.
    fn of_stream(e: std::io::Error) -> Self {
        if e.get_ref()
            .is_some_and(|inner| inner.is::<EncryptionError>())
        {
            if let Some(inner) = e.into_inner()
                && let Ok(encryption) = inner.downcast::<EncryptionError>()
            {
                return TransferError::Encryption(*encryption);
            }
            return TransferError::Source("decryption failed".into());
        }
        TransferError::Read(e)
    }

    /// Whether the snapshot cannot be read with the identity given (none, or the wrong one):
    /// only another identity helps.
    pub fn needs_identity(&self) -> bool {
        matches!(
            self,
            TransferError::Encryption(EncryptionError::Encrypted | EncryptionError::WrongIdentity)
        )
    }
}

/// What the upload sends for each plaintext chunk: the chunk itself, or its ciphertext.
struct Outgoing(Option<Sealer>);

impl Outgoing {
    fn pass(&mut self, chunk: Bytes) -> Result<Bytes, TransferError> {
        match self.0.as_mut() {
            None => Ok(chunk),
            Some(sealer) => Ok(sealer.seal(&chunk)?),
        }
    }

    fn finish(self) -> Result<Bytes, TransferError> {
        match self.0 {
            None => Ok(Bytes::new()),
            Some(sealer) => Ok(sealer.finish()?),
        }
    }
}

/// The object path of `key`, checked.
pub fn object_path(key: &str) -> Result<Path, TransferError> {
    Path::parse(key).map_err(|source| TransferError::BadKey {
        key: key.to_string(),
        source,
    })
}

/// Uploads a snapshot stream to `key` with `info` as its metadata, named as `names` says for
/// the store; writes the object only when etcd's hash at the end of the stream checks.
///
/// Up to [`PART_SIZE`] bytes are held before anything is sent: a snapshot that fits is
/// written with one request (fake-gcs-server, say, has no multipart upload); a larger one goes
/// as a multipart upload, completed when the hash checks and aborted otherwise.
///
/// With a `sealer` the object is the age ciphertext of the stream (the hash is checked on the
/// plaintext); what is held stays bounded as above, plus one age chunk (64 KiB).
pub async fn upload<S, E>(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    info: &SnapshotInfo,
    names: meta::Names,
    mut chunks: S,
    sealer: Option<Sealer>,
) -> Result<CheckedSnapshot, TransferError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let path = object_path(key)?;
    let mut hasher = SnapshotHasher::new();
    let mut held: Vec<Bytes> = Vec::new();
    let mut held_bytes = 0usize;
    let mut ended = true;
    let mut outgoing = Outgoing(sealer);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| TransferError::Source(e.to_string()))?;
        hasher.update(&chunk);
        let chunk = outgoing.pass(chunk)?;
        held_bytes += chunk.len();
        held.push(chunk);
        if held_bytes > PART_SIZE {
            ended = false;
            break;
        }
    }
    if ended {
        let checked = hasher.finish()?;
        held.push(outgoing.finish()?);
        let options = PutOptions {
            attributes: info.attributes(names),
            ..PutOptions::default()
        };
        store
            .put_opts(&path, PutPayload::from_iter(held), options)
            .await?;
        return Ok(checked);
    }
    let options = PutMultipartOptions {
        attributes: info.attributes(names),
        ..PutMultipartOptions::default()
    };
    let upload = store.put_multipart_opts(&path, options).await?;
    let mut guard = AbortOnDrop {
        writer: Some(WriteMultipart::new_with_chunk_size(upload, PART_SIZE)),
        key: key.to_string(),
    };
    let outcome: Result<(), TransferError> = async {
        let writer = guard.writer()?;
        for chunk in held {
            writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
            writer.put(chunk);
        }
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|e| TransferError::Source(e.to_string()))?;
            hasher.update(&chunk);
            let chunk = outgoing.pass(chunk)?;
            writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
            writer.put(chunk);
        }
        let tail = outgoing.finish()?;
        if !tail.is_empty() {
            writer.wait_for_capacity(PARTS_IN_FLIGHT).await?;
            writer.put(tail);
        }
        Ok(())
    }
    .await;
    let checked = outcome.and_then(|()| hasher.finish().map_err(TransferError::from));
    let writer = guard.take()?;
    match checked {
        Ok(checked) => {
            writer.finish().await?;
            Ok(checked)
        }
        Err(e) => {
            if let Err(abort) = writer.abort().await {
                tracing::warn!(key, error = %abort, "aborting the snapshot upload failed");
            }
            Err(e)
        }
    }
}

/// A multipart upload that is aborted when dropped unfinished: a backup whose timeout expires
/// (its future dropped mid-upload) or a controller shutting down leaves no incomplete upload
/// behind in the bucket, where stores keep (and bill) them until aborted.
struct AbortOnDrop {
    writer: Option<WriteMultipart>,
    key: String,
}

impl AbortOnDrop {
    fn writer(&mut self) -> Result<&mut WriteMultipart, TransferError> {
        self.writer.as_mut().ok_or(TransferError::UploadGone)
    }

    /// The upload, no longer aborted on drop: the caller finishes or aborts it.
    fn take(&mut self) -> Result<WriteMultipart, TransferError> {
        self.writer.take().ok_or(TransferError::UploadGone)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        let key = std::mem::take(&mut self.key);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    match writer.abort().await {
                        Ok(()) => tracing::info!(key, "unfinished snapshot upload aborted"),
                        Err(e) => tracing::warn!(key, error = %e, "aborting an unfinished snapshot upload failed"),
                    }
                });
            }
            Err(_) => tracing::warn!(
                key,
                "an unfinished snapshot upload could not be aborted (no runtime)"
            ),
        }
    }
}

/// Reads the snapshot at `key` through, checking etcd's hash (and `expected`, when given),
/// without keeping it: what a restore does before it touches the cluster. An encrypted
/// snapshot is decrypted with `identities` (an error without, or with the wrong ones).
pub async fn verify(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    expected: Option<&str>,
    identities: Option<&Identities>,
) -> Result<(CheckedSnapshot, StoredInfo), TransferError> {
    download(store, key, expected, identities, |_| Ok(())).await
}

/// Reads the snapshot at `key`, handing each chunk of plaintext to `sink` and checking etcd's
/// hash (and `expected`) at the end; an encrypted snapshot is decrypted with `identities` as
/// it passes. `sink` may have been given part of the plaintext when an error comes (a damaged
/// object is found out at the damaged chunk): what it writes must be kept only on success.
pub async fn download<F>(
    store: &Arc<dyn ObjectStore>,
    key: &str,
    expected: Option<&str>,
    identities: Option<&Identities>,
    mut sink: F,
) -> Result<(CheckedSnapshot, StoredInfo), TransferError>
where
    F: FnMut(&[u8]) -> Result<(), TransferError>,
{
    let path = object_path(key)?;
    let result = store.get_opts(&path, Default::default()).await?;
    let info = StoredInfo::from_attributes(&result.attributes);
    let raw = result.into_stream().map_err(std::io::Error::other);
    let mut stream = encryption::plaintext(raw, identities).await?;
    let mut hasher = SnapshotHasher::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(TransferError::of_stream)?;
        hasher.update(&chunk);
        sink(&chunk)?;
    }
    let mut checked = hasher.finish()?;
    if let Some(expected) = expected {
        checked = checked.expect(expected)?;
    }
    Ok((checked, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot as etcd streams it: `blocks` blocks of database and its SHA-256.
    fn snapshot(blocks: usize) -> Vec<u8> {
        use sha2::Digest as _;
        let db: Vec<u8> = (0..blocks * 512).map(|i| (i % 253) as u8).collect();
        let hash = sha2::Sha256::digest(&db);
        let mut out = db;
        out.extend_from_slice(&hash);
        out
    }

    fn keypair() -> (Identities, encryption::Recipients) {
        #[allow(deprecated)]
        let identity = age::x25519::Identity::generate();
        use age::secrecy::ExposeSecret as _;
        let ids = Identities::parse(identity.to_string().expose_secret()).unwrap();
        let recipients = encryption::Recipients::parse(&identity.to_public().to_string()).unwrap();
        (ids, recipients)
    }

    #[tokio::test]
    async fn an_encrypted_upload_is_only_read_back_with_its_key() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let (ids, recipients) = keypair();
        let (other, _) = keypair();
        let info = SnapshotInfo {
            etcd_version: "3.6.16".into(),
            revision: 7,
            cluster: "ns/demo".into(),
            member: "demo-0".into(),
            encrypted: true,
        };
        // Larger than a part: the multipart path; and one that fits in a single request.
        for blocks in [2, PART_SIZE / 512 + 300] {
            let bytes = snapshot(blocks);
            let chunks: Vec<Result<Bytes, std::io::Error>> = bytes
                .chunks(100_000)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let sealer = Some(Sealer::new(&recipients).unwrap());
            let written = upload(
                &store,
                "b/snap.db",
                &info,
                meta::Names::Hyphens,
                futures::stream::iter(chunks),
                sealer,
            )
            .await
            .expect("uploaded");
            let object = store
                .get_opts(&Path::from("b/snap.db"), Default::default())
                .await
                .unwrap();
            assert_eq!(
                object
                    .attributes
                    .get(&Attribute::Metadata("etcd-encryption".into()))
                    .map(|v| v.as_ref().to_string()),
                Some("age".into())
            );
            let stored = object.bytes().await.unwrap();
            assert!(encryption::is_encrypted(&stored));
            assert!(stored.len() > bytes.len(), "age adds its header and tags");
            let mut plain = Vec::new();
            let (read, _) = download(
                &store,
                "b/snap.db",
                Some(&written.sha256),
                Some(&ids),
                |c| {
                    plain.extend_from_slice(c);
                    Ok(())
                },
            )
            .await
            .expect("decrypted and checked");
            assert_eq!(read, written);
            assert!(plain == bytes);
            let wrong = verify(&store, "b/snap.db", None, Some(&other)).await;
            let wrong = wrong.expect_err("another key");
            assert_eq!(wrong.reason(), "WrongIdentity");
            assert!(wrong.needs_identity());
            let none = verify(&store, "b/snap.db", None, None).await;
            assert_eq!(none.expect_err("no key").reason(), "SnapshotEncrypted");
        }
        // A byte changed in the store: found out by age's authentication, said so.
        let path = Path::from("b/snap.db");
        let object = store.get_opts(&path, Default::default()).await.unwrap();
        let mut bytes = object.bytes().await.unwrap().to_vec();
        let middle = bytes.len() / 2;
        bytes[middle] ^= 1;
        store
            .put_opts(&path, PutPayload::from(bytes), PutOptions::default())
            .await
            .unwrap();
        let damaged = verify(&store, "b/snap.db", None, Some(&ids)).await;
        let damaged = damaged.expect_err("damaged");
        assert_eq!(damaged.reason(), "DecryptionFailed", "{damaged}");
        // Not a snapshot: refused before anything is written, encrypted or not.
        let sealer = Some(Sealer::new(&recipients).unwrap());
        let junk =
            futures::stream::iter(vec![Ok::<_, std::io::Error>(Bytes::from_static(b"junk"))]);
        let refused = upload(&store, "b/junk", &info, meta::Names::Hyphens, junk, sealer).await;
        assert_eq!(refused.expect_err("junk").reason(), "IntegrityCheckFailed");
        let junk_path = Path::from("b/junk");
        assert!(
            store
                .get_opts(&junk_path, Default::default())
                .await
                .is_err()
        );
    }
    use etcd_shared::admission::{ESCAPED_KEY_CHARACTERS, check_object_key};

    /// Whether the controller can use `key` as it is: it names an object (the empty key is
    /// the bucket's root), `Path::parse` (every read, write and delete) takes it unchanged,
    /// and `Path::from` (the listing of a periodic backup's directory) does not escape it.
    fn usable(key: &str) -> bool {
        !key.is_empty()
            && Path::parse(key).is_ok_and(|p| p.as_ref() == key)
            && Path::from(key).as_ref() == key
    }

    /// The webhook's key rule (etcd_shared::admission) and object_store agree on every key of
    /// the table: what admission accepts is what the controller uses unchanged, and what
    /// `Path::parse` refuses, admission refuses too.
    #[test]
    fn admission_accepts_exactly_the_keys_object_store_takes_unchanged() {
        let mut keys: Vec<String> = [
            "snapshot.db",
            "example/snapshot.db",
            "a/b/c/d.db",
            "dir/snap.db_v12_2006-01-02-15:04:05",
            "dir/snap_before-upgrade to 3.7_v9_2026-01-02-15:04:05",
            "a key (1)!$&'+,;=@.db",
            "a..b",
            "...",
            ".hidden",
            "-_.",
            "",
            "/",
            "/a",
            "a/",
            "a//b",
            ".",
            "..",
            "a/./b",
            "a/../b",
            "a\nb",
            "a\tb",
            "a\u{0}b",
            "a\u{7f}b",
            "é.db",
            "dir/日本",
            "a\u{85}b",
        ]
        .iter()
        .map(|k| k.to_string())
        .collect();
        keys.extend(ESCAPED_KEY_CHARACTERS.chars().map(|c| format!("dir/a{c}b")));
        keys.extend((0u8..0x80).map(|b| format!("k{}k", char::from(b))));
        for key in &keys {
            let admitted = check_object_key(key).is_ok();
            assert_eq!(
                admitted,
                usable(key),
                "{key:?}: admission says {:?}, Path::parse {:?}, Path::from {:?}",
                check_object_key(key),
                Path::parse(key).map(|p| p.to_string()),
                Path::from(key.as_str()).to_string()
            );
            if Path::parse(key).is_err() {
                assert!(!admitted, "{key:?}: Path::parse refuses it");
            }
        }
    }
}
