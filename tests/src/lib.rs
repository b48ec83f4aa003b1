//! Test harness for the etcd operator: a real local Kubernetes control plane (etcd,
//! kube-apiserver, kube-controller-manager) built from the pinned Go tools, plus a test runner
//! that shares one control plane per test binary and gives each test its own namespace.
//!
//! - [`tools`]: where `hack/build-tools.sh` put the binaries, at the versions of
//!   `hack/versions.env`.
//! - [`pki`]: CA, serving and client certificates, service-account keys (rcgen).
//! - [`control_plane`]: [`ControlPlane::start`], kubeconfig, client, `kubectl`, log tails.
//! - [`suite`]: [`run_suite`] for `harness = false` test binaries; [`TestContext`].
//! - [`namespace`], [`wait`]: per-test namespaces and deadline-bounded waits.
//! - [`kubelet`]: a "process kubelet" (opt-in, [`Suite::with_kubelet`]): a Node whose pods run
//!   as local processes on a private pod network, so the operator's member pods are real etcd
//!   members.
//! - [`operator`]: the operator as its Helm chart installs it, its pods run by the kubelet
//!   from the binaries built in this workspace (the demo and the `installed` suite).
//! - [`endpoints`]: the ready addresses behind a Service.
//! - [`helm`]: the one helm runner (Helm 3 and Helm 4, [`HelmMajor`]).
//! - [`s3`], [`azurite`], [`gcs`]: real object store servers for the backup tests (versitygw,
//!   Azurite, fake-gcs-server).
//! - [`cert_manager`]: real cert-manager (controller and webhook processes, its CRDs, its
//!   webhook registered with the API server), started on demand ([`cert_manager::shared`]).
//! - [`prometheus`]: a real Prometheus discovering targets through the API server as the
//!   Prometheus Operator configures it, its HTTP API, and promtool.
//! - [`chart`]: what the chart suites share: rendered manifests and checks of them.
//! - [`recorder`]: client traffic and watches recorded while the operator acts, the history
//!   checked for linearizability (issue 33).
//! - [`process`], [`ports`], [`kubeconfig`]: plumbing.
//!
//! Run the harness's own tests with `cargo test -p etcd-tests --test control_plane`.

#![warn(missing_docs)]

pub mod azurite;
pub mod cert_manager;
pub mod chart;
pub mod clientv3;
pub mod cluster_dns;
pub mod control_plane;
pub mod crds;
pub mod endpoints;
pub mod gcs;
pub mod helm;
pub mod kubeconfig;
pub mod kubelet;
pub mod member;
pub mod namespace;
pub mod network_policies;
pub mod operator;
pub mod pki;
pub mod ports;
pub mod process;
pub mod prometheus;
pub mod real_node;
pub mod recorder;
pub mod s3;
pub mod suite;
pub mod tools;
pub mod wait;

pub use control_plane::{ControlPlane, ControlPlaneError, ControlPlaneOptions, StartupTimings};
pub use helm::{Helm, HelmError, HelmMajor};
pub use kubelet::{Kubelet, KubeletError, KubeletOptions};
pub use namespace::Namespace;
pub use pki::{CertificateAuthority, IssuedCert};
pub use suite::{Suite, Test, TestContext, run_suite, run_suite_with_kubelet};
pub use tools::{Tools, Versions};
pub use wait::{WaitError, await_condition, poll_until};
