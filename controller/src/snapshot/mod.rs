//! Taking, moving and checking etcd snapshots, for backups, restores, safety backups and
//! recoveries alike.
//!
//! - [`integrity`]: etcd's snapshot hash, checked on every stream that passes.
//! - [`keys`]: snapshot keys as CoreOS wrote them, and retention.
//! - [`store`]: the bucket (S3, Azure Blob Storage, GCS) a backup writes to or a restore reads.
//! - [`transfer`]: snapshots to and from the bucket as streams, in constant memory.

pub mod integrity;
pub mod keys;
pub mod store;
pub mod transfer;

/// How long streaming a snapshot from a member may take (a recovery's, or a seed member's
/// fetch from a surviving member).
pub const MEMBER_SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);
