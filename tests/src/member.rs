//! A single-member etcd cluster on loopback, for tests and benchmarks that need a real etcd
//! server without Kubernetes around it.

use std::path::Path;

use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};

/// A running one-member etcd (stopped when dropped).
pub struct SingleMember {
    /// The process.
    pub process: ManagedProcess,
    /// Its client URL, `http://127.0.0.1:PORT`.
    pub endpoint: String,
}

/// Errors starting the member.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// No free ports.
    #[error("finding free ports: {0}")]
    Ports(#[from] std::io::Error),
    /// The process did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

impl SingleMember {
    /// Starts `etcd` (any line) as member `a` with its data and log in `dir`, plus `extra`
    /// flags. It is not waited for: poll its status before use.
    pub fn start(etcd: &Path, dir: &Path, extra: &[String]) -> Result<Self, MemberError> {
        let [client, peer] = free_ports()?;
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut args = vec![
            "--name=a".to_string(),
            format!("--data-dir={}", dir.join("member").display()),
            format!("--listen-client-urls={endpoint}"),
            format!("--advertise-client-urls={endpoint}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=a={peer_url}"),
        ];
        args.extend(extra.iter().cloned());
        let process = ManagedProcess::start("etcd", etcd, &args, dir.join("etcd.log"))?;
        Ok(SingleMember { process, endpoint })
    }
}
