//! Pure builders: from a validated cluster view to the Kubernetes objects that should exist.
//! No I/O here; every builder is tested with fixtures.

mod claim;
pub mod claim_pod;
mod network_policy;
mod operator_image;
mod pdb;
mod pod;
pub mod scratch;
pub mod seed;
mod services;

/// The builders' input, defined in [`crate::view`].
pub use crate::view::{ClusterView, InvalidCluster, TlsMode};
pub use claim::data_claim;
pub use network_policy::{NetworkAccess, network_policy, wants_network_policy};
pub use operator_image::{OperatorImage, with_pull_secrets};
pub use pdb::{disruption_budget, disruption_budget_for};
pub use pod::{member_pod, stamp_tls_files};
pub use seed::seed_member;
pub use services::{client_service, member_selector, peer_service};
