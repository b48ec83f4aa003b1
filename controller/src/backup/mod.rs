//! Backups and restores of etcd clusters: CoreOS' `EtcdBackup` and `EtcdRestore` kinds, served
//! by this controller beside `EtcdCluster`.
//!
//! - [`integrity`]: etcd's snapshot hash, checked on every stream that passes.
//! - [`store`]: the S3 bucket a backup writes to or a restore reads from.

pub mod integrity;
pub mod store;
pub mod transfer;
