//! Client-side encryption of snapshots with [age](https://age-encryption.org) (issue 35): an
//! EtcdBackup with `spec.encryption.recipientsSecret` encrypts each snapshot to the X25519
//! recipients (`age1...`) of that Secret before a byte leaves the controller; a restore (or a
//! recovery) decrypts with the identity (`AGE-SECRET-KEY-1...`) of its `identitySecret`.
//!
//! Both directions stream in constant memory: [`Sealer`] turns plaintext chunks into age's
//! STREAM format (64 KiB authenticated chunks) as they pass, and [`plaintext`] opens a stream
//! that may or may not be encrypted: an age file is told by its first bytes ([`AGE_MAGIC`]; no
//! etcd snapshot starts with them), so objects written before encryption was turned on, or by
//! others, keep restoring as they are. etcd's integrity hash is always checked on the
//! plaintext, by the caller.
//!
//! age authenticates each chunk and marks the last one, so a wrong identity, a damaged byte or a
//! truncated object is an error of the stream, never plaintext handed on: and since every
//! consumer writes to a temporary file that is kept only when the whole stream checked, nothing
//! undecryptable ever reaches etcd's tool.
//!
//! The recipients are X25519 (`age1...`), as the issue asks and `age-keygen` makes by default;
//! age 0.13 marks them deprecated in favour of its post-quantum hybrid (`age1pq...`), which a
//! later change may accept beside them.
#![allow(deprecated)]

use std::io::Write as _;
use std::sync::{Arc, Mutex};

use age::x25519;
use bytes::Bytes;
use futures::io::AsyncReadExt as _;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _, TryStreamExt as _};

/// The first bytes of every age file (its header's version line).
pub const AGE_MAGIC: &[u8] = b"age-encryption.org/v1\n";

pub use etcd_shared::names::{IDENTITY_KEY, RECIPIENTS_KEY};

/// The value of the snapshot object's `etcd-encryption` metadata when it is encrypted.
pub const METADATA_VALUE: &str = "age";

/// Bytes read from the decrypting reader at once.
const READ_CHUNK: usize = 64 * 1024;

/// Why a snapshot could not be encrypted or decrypted.
#[derive(Debug, thiserror::Error)]
pub enum EncryptionError {
    /// A line of the recipients is not an X25519 recipient.
    #[error("line {line} of the recipients is not an age X25519 recipient (age1...): {reason}")]
    BadRecipient {
        /// The line, from 1.
        line: usize,
        /// The parser's words.
        reason: &'static str,
    },
    /// The recipients hold no recipient.
    #[error("the recipients hold no age1... line")]
    NoRecipient,
    /// A line of the identity is not an X25519 identity (its text is never shown).
    #[error(
        "line {line} of the identity is not an age X25519 identity (AGE-SECRET-KEY-1...): {reason}"
    )]
    BadIdentity {
        /// The line, from 1.
        line: usize,
        /// The parser's words.
        reason: &'static str,
    },
    /// The identity holds no identity.
    #[error("the identity holds no AGE-SECRET-KEY-1... line")]
    NoIdentity,
    /// The snapshot is encrypted and no identity was given.
    #[error(
        "the snapshot is encrypted (age) and no identity was given: set spec.encryption.identitySecret to a Secret holding its key"
    )]
    Encrypted,
    /// None of the identities is one of the snapshot's recipients.
    #[error(
        "the snapshot is encrypted to other recipients: the identitySecret's key does not decrypt it (the wrong key, or a backup made before a rotation?)"
    )]
    WrongIdentity,
    /// The encrypted snapshot is damaged or truncated, or not an age file after all.
    #[error("the encrypted snapshot cannot be decrypted: {0}")]
    Damaged(String),
    /// Encrypting failed.
    #[error("encrypting the snapshot: {0}")]
    Encrypt(String),
}

impl EncryptionError {
    /// A static label for metrics and status reasons.
    pub fn reason(&self) -> &'static str {
        match self {
            EncryptionError::BadRecipient { .. } | EncryptionError::NoRecipient => "BadRecipients",
            EncryptionError::BadIdentity { .. } | EncryptionError::NoIdentity => "BadIdentity",
            EncryptionError::Encrypted => "SnapshotEncrypted",
            EncryptionError::WrongIdentity => "WrongIdentity",
            EncryptionError::Damaged(_) => "DecryptionFailed",
            EncryptionError::Encrypt(_) => "EncryptionFailed",
        }
    }
}

/// The lines of `text` that hold a key: trimmed, without blank lines and `#` comments, with
/// their line numbers (from 1).
fn key_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
}

/// The X25519 recipients a backup encrypts to.
#[derive(Clone)]
pub struct Recipients(Vec<x25519::Recipient>);

impl std::fmt::Debug for Recipients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|r| r.to_string()))
            .finish()
    }
}

impl Recipients {
    /// Reads one `age1...` recipient a line; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Self, EncryptionError> {
        let recipients = key_lines(text)
            .map(|(line, l)| {
                l.parse::<x25519::Recipient>()
                    .map_err(|reason| EncryptionError::BadRecipient { line, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if recipients.is_empty() {
            return Err(EncryptionError::NoRecipient);
        }
        Ok(Recipients(recipients))
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none (never, once parsed).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The X25519 identities a restore decrypts with (never shown by `Debug`).
#[derive(Clone)]
pub struct Identities(Arc<Vec<x25519::Identity>>);

impl std::fmt::Debug for Identities {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Identities({} redacted)", self.0.len())
    }
}

impl Identities {
    /// Reads one `AGE-SECRET-KEY-1...` identity a line; blank lines and `#` comments (as
    /// `age-keygen` writes) are skipped.
    pub fn parse(text: &str) -> Result<Self, EncryptionError> {
        let identities = key_lines(text)
            .map(|(line, l)| {
                l.parse::<x25519::Identity>()
                    .map_err(|reason| EncryptionError::BadIdentity { line, reason })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if identities.is_empty() {
            return Err(EncryptionError::NoIdentity);
        }
        Ok(Identities(Arc::new(identities)))
    }

    fn iter(&self) -> impl Iterator<Item = &dyn age::Identity> {
        self.0.iter().map(|i| i as &dyn age::Identity)
    }
}

/// What the encryptor has written and not yet been handed on.
#[derive(Clone, Default)]
struct Pending(Arc<Mutex<Vec<u8>>>);

impl Pending {
    fn take(&self) -> Bytes {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Bytes::from(std::mem::take(&mut *held))
    }
}

impl std::io::Write for Pending {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut held = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        held.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Encrypts a stream to its recipients chunk by chunk: what it holds at most is one age chunk
/// (64 KiB) and the ciphertext of the last plaintext chunk handed in.
pub struct Sealer {
    writer: age::stream::StreamWriter<Pending>,
    pending: Pending,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer").finish_non_exhaustive()
    }
}

impl Sealer {
    /// A new age file (a new file key) for `recipients`; its header is the first output.
    pub fn new(recipients: &Recipients) -> Result<Self, EncryptionError> {
        let encryptor =
            age::Encryptor::with_recipients(recipients.0.iter().map(|r| r as &dyn age::Recipient))
                .map_err(|e| EncryptionError::Encrypt(e.to_string()))?;
        let pending = Pending::default();
        let writer = encryptor
            .wrap_output(pending.clone())
            .map_err(|e| EncryptionError::Encrypt(e.to_string()))?;
        Ok(Sealer { writer, pending })
    }

    /// Encrypts `plain`; returns the ciphertext ready so far (possibly empty).
    pub fn seal(&mut self, plain: &[u8]) -> Result<Bytes, EncryptionError> {
        self.writer
            .write_all(plain)
            .map_err(|e| EncryptionError::Encrypt(e.to_string()))?;
        Ok(self.pending.take())
    }

    /// Ends the file (its last, marked chunk); returns the rest of the ciphertext.
    pub fn finish(self) -> Result<Bytes, EncryptionError> {
        let pending = self.pending.clone();
        self.writer
            .finish()
            .map_err(|e| EncryptionError::Encrypt(e.to_string()))?;
        Ok(pending.take())
    }
}

/// A stream of snapshot bytes, as read from a store.
pub type ByteStream = BoxStream<'static, std::io::Result<Bytes>>;

/// The plaintext of `chunks`: the stream itself when it is not an age file, else its
/// decryption with `identities` (an error when there are none, or none is a recipient; a
/// damaged or truncated file is an error of the returned stream, at the latest at its end).
pub async fn plaintext<S>(
    chunks: S,
    identities: Option<&Identities>,
) -> Result<ByteStream, EncryptionError>
where
    S: Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static,
{
    let (encrypted, whole) = sniff(chunks).await;
    if !encrypted {
        return Ok(whole);
    }
    let identities = identities.ok_or(EncryptionError::Encrypted)?;
    let decryptor = age::Decryptor::new_async_buffered(whole.into_async_read())
        .await
        .map_err(|e| EncryptionError::Damaged(e.to_string()))?;
    let reader = decryptor
        .decrypt_async(identities.iter())
        .map_err(|e| match e {
            age::DecryptError::NoMatchingKeys => EncryptionError::WrongIdentity,
            e => EncryptionError::Damaged(e.to_string()),
        })?;
    let plain = futures::stream::unfold(Some(reader), |reader| async move {
        let mut reader = reader?;
        let mut buf = vec![0u8; READ_CHUNK];
        match reader.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok(Bytes::from(buf)), Some(reader)))
            }
            // The error ends the stream.
            Err(e) => Some((Err(damaged(e)), None)),
        }
    });
    Ok(plain.boxed())
}

/// A decryption error of the stream, in words a status can show: age reports a chunk that
/// does not authenticate, or a missing last chunk, as invalid or truncated data; any other
/// error is the store's (a connection lost mid-object), passed on as it is.
fn damaged(e: std::io::Error) -> std::io::Error {
    match e.kind() {
        std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => std::io::Error::new(
            e.kind(),
            EncryptionError::Damaged(format!(
                "{e} (a damaged or truncated object, or not the one that was written)"
            )),
        ),
        _ => e,
    }
}

/// Whether `chunks` starts with [`AGE_MAGIC`], and the whole stream again.
async fn sniff<S>(mut chunks: S) -> (bool, ByteStream)
where
    S: Stream<Item = std::io::Result<Bytes>> + Send + Unpin + 'static,
{
    let mut head: Vec<std::io::Result<Bytes>> = Vec::new();
    let mut seen: Vec<u8> = Vec::with_capacity(AGE_MAGIC.len());
    while seen.len() < AGE_MAGIC.len() {
        match chunks.next().await {
            Some(Ok(chunk)) => {
                let want = AGE_MAGIC.len() - seen.len();
                seen.extend_from_slice(&chunk[..chunk.len().min(want)]);
                head.push(Ok(chunk));
            }
            Some(Err(e)) => {
                head.push(Err(e));
                break;
            }
            None => break,
        }
    }
    let encrypted = seen == AGE_MAGIC;
    (encrypted, futures::stream::iter(head).chain(chunks).boxed())
}

/// A new X25519 key pair as text, as `age-keygen` prints it: the identity
/// (`AGE-SECRET-KEY-1...`, for an `identitySecret`) and its recipient (`age1...`, for a
/// `recipientsSecret`).
pub fn generate() -> (String, String) {
    use age::secrecy::ExposeSecret as _;
    let identity = x25519::Identity::generate();
    let recipient = identity.to_public().to_string();
    (identity.to_string().expose_secret().to_string(), recipient)
}

/// Whether `head` (a file's first bytes) is an age file's.
pub fn is_encrypted(head: &[u8]) -> bool {
    head.starts_with(AGE_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use age::secrecy::ExposeSecret as _;

    fn keys() -> (String, String) {
        let identity = x25519::Identity::generate();
        let recipient = identity.to_public().to_string();
        (identity.to_string().expose_secret().to_string(), recipient)
    }

    fn seal_all(recipients: &Recipients, plain: &[u8], chunk: usize) -> Vec<u8> {
        let mut sealer = Sealer::new(recipients).expect("sealer");
        let mut out = Vec::new();
        for part in plain.chunks(chunk) {
            out.extend_from_slice(&sealer.seal(part).expect("seal"));
        }
        out.extend_from_slice(&sealer.finish().expect("finish"));
        out
    }

    async fn open_all(
        cipher: Vec<u8>,
        chunk: usize,
        identities: Option<&Identities>,
    ) -> Result<Vec<u8>, String> {
        let chunks: Vec<std::io::Result<Bytes>> = cipher
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut plain = plaintext(futures::stream::iter(chunks), identities)
            .await
            .map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(c) = plain.next().await {
            out.extend_from_slice(&c.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    #[test]
    fn recipients_are_read_one_a_line_with_comments() {
        let (_, a) = keys();
        let (_, b) = keys();
        let text = format!("# ops team\n{a}\n\n  {b}  \n");
        assert_eq!(Recipients::parse(&text).expect("two").len(), 2);
        let bad = Recipients::parse(&format!("{a}\nage1nope\n")).expect_err("bad line");
        assert!(
            bad.to_string().starts_with("line 2 of the recipients"),
            "{bad}"
        );
        assert_eq!(bad.reason(), "BadRecipients");
        assert!(matches!(
            Recipients::parse("# nothing\n\n"),
            Err(EncryptionError::NoRecipient)
        ));
        // An identity is not a recipient (a common mix-up), and is not echoed back.
        let (secret, _) = keys();
        let mixed = Recipients::parse(&secret).expect_err("identity");
        assert!(!mixed.to_string().contains(&secret[15..]), "{mixed}");
    }

    #[test]
    fn identities_are_read_as_age_keygen_writes_them() {
        let identity = x25519::Identity::generate();
        let file = format!(
            "# created: 2026-01-01T00:00:00Z\n# public key: {}\n{}\n",
            identity.to_public(),
            identity.to_string().expose_secret()
        );
        let ids = Identities::parse(&file).expect("identity");
        assert!(!format!("{ids:?}").contains("AGE-SECRET"));
        assert!(matches!(
            Identities::parse("\n# only comments\n"),
            Err(EncryptionError::NoIdentity)
        ));
        let (_, recipient) = keys();
        let e = Identities::parse(&recipient).expect_err("a recipient");
        assert!(
            matches!(e, EncryptionError::BadIdentity { line: 1, .. }),
            "{e}"
        );
    }

    #[tokio::test]
    async fn a_snapshot_round_trips_only_with_its_key() {
        let (secret, recipient) = keys();
        let (other_secret, other_recipient) = keys();
        let recipients = Recipients::parse(&format!("{recipient}\n{other_recipient}")).unwrap();
        let plain: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let cipher = seal_all(&recipients, &plain, 10_000);
        assert!(is_encrypted(&cipher));
        assert_ne!(&cipher[100..200], &plain[100..200]);
        // Either recipient's identity decrypts, whatever the chunking of the download.
        for (id, chunk) in [(&secret, 1), (&secret, 7), (&other_secret, 65_536)] {
            let ids = Identities::parse(id).unwrap();
            let out = open_all(cipher.clone(), chunk, Some(&ids)).await.unwrap();
            assert!(out == plain, "chunk {chunk}");
        }
        // Another key: refused before any plaintext, with the reason.
        let (stranger, _) = keys();
        let wrong = open_all(
            cipher.clone(),
            4096,
            Some(&Identities::parse(&stranger).unwrap()),
        )
        .await
        .expect_err("wrong key");
        assert!(wrong.contains("encrypted to other recipients"), "{wrong}");
        let none = open_all(cipher.clone(), 4096, None)
            .await
            .expect_err("no key");
        assert!(none.contains("no identity was given"), "{none}");
        // Truncated or damaged: an error of the stream, never silently short plaintext.
        let ids = Identities::parse(&secret).unwrap();
        let short = open_all(cipher[..cipher.len() - 100].to_vec(), 4096, Some(&ids)).await;
        let short = short.expect_err("truncated");
        assert!(short.contains("cannot be decrypted"), "{short}");
        let mut flipped = cipher.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 1;
        let flipped = open_all(flipped, 4096, Some(&ids)).await;
        let flipped = flipped.expect_err("damaged");
        assert!(flipped.contains("cannot be decrypted"), "{flipped}");
    }

    #[tokio::test]
    async fn plaintext_passes_through_with_or_without_an_identity() {
        let (secret, _) = keys();
        let plain: Vec<u8> = (0..5000u32).map(|i| (i % 13) as u8).collect();
        let ids = Identities::parse(&secret).unwrap();
        assert!(open_all(plain.clone(), 3, None).await.unwrap() == plain);
        assert!(open_all(plain.clone(), 3, Some(&ids)).await.unwrap() == plain);
        assert!(open_all(Vec::new(), 3, None).await.unwrap().is_empty());
        assert!(open_all(b"age".to_vec(), 1, None).await.unwrap() == b"age");
    }

    /// Files of the reference implementation (Go's `age`, `age-keygen`) and ours are the same
    /// format both ways. Skipped, and said, where the `age` package is not installed (.ci/run
    /// installs it).
    #[tokio::test]
    async fn age_cli_files_interoperate_both_ways() {
        use std::process::Command;
        if Command::new("age").arg("--version").output().is_err() {
            eprintln!("skipped: the age command is not installed (apt-get install age)");
            return;
        }
        let dir = tempfile::tempdir().expect("dir");
        let key = dir.path().join("key.txt");
        let keygen = Command::new("age-keygen").arg("-o").arg(&key).output();
        assert!(keygen.is_ok_and(|o| o.status.success()), "age-keygen");
        let text = std::fs::read_to_string(&key).expect("key file");
        let ids = Identities::parse(&text).expect("age-keygen's file is an identity");
        let recipient = Command::new("age-keygen")
            .arg("-y")
            .arg(&key)
            .output()
            .expect("age-keygen -y");
        let recipient = String::from_utf8(recipient.stdout).expect("text");
        let recipients = Recipients::parse(&recipient).expect("age-keygen -y's recipient");
        let plain: Vec<u8> = (0..200_000u32).map(|i| (i % 241) as u8).collect();
        // Ours -> age -d.
        let sealed = dir.path().join("ours.age");
        std::fs::write(&sealed, seal_all(&recipients, &plain, 30_000)).expect("write");
        let out = Command::new("age")
            .arg("-d")
            .arg("-i")
            .arg(&key)
            .arg(&sealed)
            .output()
            .expect("age -d");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.stdout == plain, "age -d gives the plaintext back");
        // age -r -> ours.
        let input = dir.path().join("plain");
        std::fs::write(&input, &plain).expect("write");
        let theirs = dir.path().join("theirs.age");
        let out = Command::new("age")
            .arg("-r")
            .arg(recipient.trim())
            .arg("-o")
            .arg(&theirs)
            .arg(&input)
            .output()
            .expect("age -r");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cipher = std::fs::read(&theirs).expect("read");
        let opened = open_all(cipher, 10_000, Some(&ids))
            .await
            .expect("decrypts");
        assert!(opened == plain);
    }

    #[test]
    fn an_empty_snapshot_is_a_valid_age_file() {
        let (_, recipient) = keys();
        let recipients = Recipients::parse(&recipient).unwrap();
        let cipher = seal_all(&recipients, b"", 1);
        assert!(is_encrypted(&cipher));
    }
}
