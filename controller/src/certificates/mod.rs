//! The certificates of `spec.TLS.operatorManaged`: the operator keeps a CA per cluster and
//! issues, renews and reissues the members' peer and server certificates and its own client
//! certificate, in the Secrets the static TLS plumbing already mounts and reads; and the
//! cert-manager Certificates of `spec.TLS.certManager` ([`cert_manager`]).
//!
//! - [`plan`]: pure decisions (keep until the renewal time, or issue, and why);
//! - [`inspect`]: what the Secrets hold;
//! - [`issue`]: making the CA and the leaves (rcgen);
//! - [`apply`]: the reconcile's step that puts them together.
//!
//! - [`rotation`]: the phases of a CA rotation (pure).
//! - [`switch`]: the phases of a switch from one source of certificates to another (pure);
//!   [`switching`]: carrying it out.
//!
//! Members of 3.3+ pick renewed certificates up without a restart: the kubelet swaps the
//! Secret volume's files and etcd loads its certificate files for each new TLS handshake. A
//! new trust bundle (a CA rotation), and a renewed certificate on 3.2, reach a member only in a
//! new process: [`crate::planner::rollout`] replaces such members one at a time.

pub mod apply;
pub mod cert_manager;
pub mod inspect;
pub mod issue;
pub mod plan;
pub mod rotation;
pub mod served;
pub mod switch;
pub mod switching;

pub use apply::{Expiry, MemberFiles, Outcome, PodFiles, ensure};
