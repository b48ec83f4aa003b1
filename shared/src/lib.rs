//! The `EtcdCluster` API shared by the webhook and the controller: the CRD types, the
//! admission rules (validation and defaulting, pure functions), the etcd version capability
//! table, the flags and variables every member is started with, and the names and labels of
//! every object the controller derives from a cluster.

#![forbid(unsafe_code)]

pub mod admission;
pub mod crd;
pub mod duration;
pub mod endpoints;
pub mod member_flags;
pub mod names;
pub mod schedule;
pub mod tls;
pub mod types;
pub mod version;

pub use types::{EtcdCluster, EtcdClusterSpec, EtcdClusterStatus};
