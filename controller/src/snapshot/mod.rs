//! Taking, moving and checking etcd snapshots, for backups, restores, safety backups and
//! recoveries alike.
//!
//! - [`cluster`]: the snapshot service: taking, locating and checking the snapshots of a
//!   cluster (its members, its store's credentials), and the one way every snapshot is taken.
//! - [`encryption`]: client-side encryption of snapshots (age), streaming both ways.
//! - [`error`]: why that failed.
//! - [`integrity`]: etcd's snapshot hash, checked on every stream that passes.
//! - [`keys`]: snapshot keys as CoreOS wrote them, and retention.
//! - [`segments`]: continuous backup between snapshots (segments of changes) and the choice of
//!   what a restore to a revision replays.
//! - [`store`]: the bucket (S3, Azure Blob Storage, GCS) a backup writes to or a restore reads.
//! - [`transfer`]: snapshots to and from the bucket as streams, in constant memory.

pub mod cluster;
pub mod encryption;
pub mod error;
pub mod integrity;
pub mod keys;
pub mod segments;
pub mod store;
pub mod transfer;

/// How long streaming a snapshot from a member may take (a recovery's, or a seed member's
/// fetch from a surviving member).
pub const MEMBER_SNAPSHOT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// CoreOS' default of `timeoutInSecond`: how long a whole backup may take (a safety backup's
/// too, when its spec sets none).
pub const DEFAULT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
