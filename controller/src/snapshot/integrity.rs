//! etcd's snapshot integrity hash: the Snapshot RPC streams the backend database followed by
//! the SHA-256 of those bytes (32 bytes), and `etcdctl`/`etcdutl snapshot restore` refuse a
//! file whose last 32 bytes are not the hash of the rest. [`SnapshotHasher`] checks a stream of
//! that shape as it passes, in constant memory, whoever reads it: the backup (from etcd to the
//! store), the restore's check before anything is touched, and the seed member's download.

use sha2::{Digest, Sha256};

/// Length of the hash etcd appends.
pub const HASH_LEN: usize = 32;

/// bbolt's page-size multiple: a database is a whole number of 512-byte blocks, so a stream
/// whose length is `512n + 32` carries a hash (etcd's own test in `snapshot restore`).
const BLOCK: u64 = 512;

/// Why a stream is not an intact etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntegrityError {
    /// The stream is shorter than a hash, or its length does not fit a database plus a hash.
    #[error(
        "{size} bytes is no etcd snapshot with an integrity hash (a database of 512-byte blocks followed by its 32-byte SHA-256)"
    )]
    NoHash {
        /// Bytes seen.
        size: u64,
    },
    /// The hash at the end is not the hash of the bytes before it.
    #[error(
        "integrity hash mismatch: the snapshot says {expected}, its {size} bytes hash to {actual}"
    )]
    Mismatch {
        /// The hash at the end of the stream, hex.
        expected: String,
        /// The hash of the bytes before it, hex.
        actual: String,
        /// Bytes of the database.
        size: u64,
    },
    /// The stream is whole but is not the snapshot it was expected to be.
    #[error("the snapshot's hash is {actual}, expected {expected}")]
    NotExpected {
        /// The hash expected (from the backup's status or the object's metadata), hex.
        expected: String,
        /// The snapshot's own hash, hex.
        actual: String,
    },
}

/// What a checked snapshot is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedSnapshot {
    /// The database's SHA-256 (the hash etcd appended), lowercase hex.
    pub sha256: String,
    /// Bytes of the database.
    pub db_size: u64,
    /// Bytes of the stream: the database and the hash.
    pub size: u64,
}

/// Hashes a snapshot stream as it passes, keeping its last 32 bytes back until the end.
#[derive(Clone, Default)]
pub struct SnapshotHasher {
    hasher: Sha256,
    tail: Vec<u8>,
    size: u64,
}

impl std::fmt::Debug for SnapshotHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotHasher")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl SnapshotHasher {
    /// A hasher that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes seen so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Takes the next bytes of the stream.
    pub fn update(&mut self, chunk: &[u8]) {
        self.size += chunk.len() as u64;
        if chunk.len() >= HASH_LEN {
            self.hasher.update(&self.tail);
            let (body, tail) = chunk.split_at(chunk.len() - HASH_LEN);
            self.hasher.update(body);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(chunk);
            if self.tail.len() > HASH_LEN {
                let excess = self.tail.len() - HASH_LEN;
                self.hasher.update(&self.tail[..excess]);
                self.tail.drain(..excess);
            }
        }
    }

    /// Checks the end of the stream: its last 32 bytes must be the hash of the rest.
    pub fn finish(self) -> Result<CheckedSnapshot, IntegrityError> {
        if self.tail.len() != HASH_LEN || self.size % BLOCK != HASH_LEN as u64 {
            return Err(IntegrityError::NoHash { size: self.size });
        }
        let actual = hex(&self.hasher.finalize());
        let expected = hex(&self.tail);
        let db_size = self.size - HASH_LEN as u64;
        if actual != expected {
            return Err(IntegrityError::Mismatch {
                expected,
                actual,
                size: db_size,
            });
        }
        Ok(CheckedSnapshot {
            sha256: actual,
            db_size,
            size: self.size,
        })
    }
}

impl CheckedSnapshot {
    /// Checks that this is the snapshot whose hash is `expected` (hex, any case).
    pub fn expect(self, expected: &str) -> Result<Self, IntegrityError> {
        if self.sha256.eq_ignore_ascii_case(expected.trim()) {
            Ok(self)
        } else {
            Err(IntegrityError::NotExpected {
                expected: expected.trim().to_ascii_lowercase(),
                actual: self.sha256,
            })
        }
    }
}

/// Lowercase hex of bytes.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A database of `blocks` 512-byte blocks and etcd's hash after it.
    fn snapshot(blocks: usize) -> Vec<u8> {
        let db: Vec<u8> = (0..blocks * 512).map(|i| (i * 7 % 251) as u8).collect();
        let mut out = db.clone();
        out.extend_from_slice(&Sha256::digest(&db));
        out
    }

    fn check(stream: &[u8], chunk: usize) -> Result<CheckedSnapshot, IntegrityError> {
        let mut h = SnapshotHasher::new();
        for c in stream.chunks(chunk.max(1)) {
            h.update(c);
        }
        h.finish()
    }

    #[test]
    fn an_intact_snapshot_checks_whatever_the_chunking() {
        let s = snapshot(9);
        let whole = check(&s, s.len()).expect("intact");
        assert_eq!(whole.db_size, 9 * 512);
        assert_eq!(whole.size, 9 * 512 + 32);
        assert_eq!(whole.sha256, hex(&Sha256::digest(&s[..9 * 512])));
        for chunk in [1, 5, 31, 32, 33, 64, 511, 512, 513, 4096] {
            assert_eq!(check(&s, chunk).as_ref(), Ok(&whole), "chunks of {chunk}");
        }
        assert!(whole.clone().expect(&whole.sha256.to_uppercase()).is_ok());
        assert!(matches!(
            whole.expect(&"0".repeat(64)),
            Err(IntegrityError::NotExpected { .. })
        ));
    }

    #[test]
    fn damaged_snapshots_are_refused() {
        let s = snapshot(4);
        let mut flipped = s.clone();
        flipped[100] ^= 1;
        assert!(matches!(
            check(&flipped, 64),
            Err(IntegrityError::Mismatch { .. })
        ));
        let mut bad_hash = s.clone();
        let last = bad_hash.len() - 1;
        bad_hash[last] ^= 0x80;
        assert!(matches!(
            check(&bad_hash, 7),
            Err(IntegrityError::Mismatch { .. })
        ));
        // Truncated: the length no longer fits a database and a hash.
        assert!(matches!(
            check(&s[..s.len() - 1], 100),
            Err(IntegrityError::NoHash { .. })
        ));
        assert!(matches!(
            check(&s[..1000], 100),
            Err(IntegrityError::NoHash { .. })
        ));
        // A bare database (no hash appended) and nothing at all.
        assert!(matches!(
            check(&s[..4 * 512], 100),
            Err(IntegrityError::NoHash { .. })
        ));
        assert!(matches!(
            check(&[], 1),
            Err(IntegrityError::NoHash { size: 0 })
        ));
    }
}
