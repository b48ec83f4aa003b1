//! A small etcd cluster on loopback without Kubernetes (for the recorder's own tests): members
//! on free ports, each can be killed, restarted on its data, or signalled (SIGSTOP/SIGCONT).
//! Its client URLs are plain `http://`, or `https://` with client certificates required
//! ([`LoopbackCluster::start_with_tls`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::wait::{WaitError, poll_until};

/// Errors of the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// No free ports.
    #[error("finding free ports: {0}")]
    Ports(#[from] std::io::Error),
    /// A member did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// No member with that index.
    #[error("the cluster has no member {0}")]
    NoMember(usize),
    /// A member did not become ready.
    #[error("{wait}\nlog of member {member}:\n{log}")]
    NotReady {
        /// The member.
        member: usize,
        /// The wait.
        wait: Box<WaitError>,
        /// Its log tail.
        log: String,
    },
}

/// One member.
struct Member {
    name: String,
    client_url: String,
    args: Vec<String>,
    log: PathBuf,
    process: Option<ManagedProcess>,
}

/// The members' client TLS: every member serves one certificate on `https://` client URLs
/// and requires a client certificate chained to a trusted CA (`--client-cert-auth`). The
/// peers stay on plain `http://`.
#[derive(Clone, Debug)]
pub struct ClusterTls {
    /// The serving certificate, PEM (`--cert-file`). etcd's gRPC gateway presents it as a
    /// client certificate too, so it needs both server and client auth (see
    /// [`crate::pki::CertificateAuthority::issue_peer_cert`]).
    pub cert_file: PathBuf,
    /// Its private key, PEM (`--key-file`).
    pub key_file: PathBuf,
    /// The CA bundle client certificates must chain to, PEM (`--trusted-ca-file`).
    pub trusted_ca_file: PathBuf,
    /// How the cluster's own readiness reads connect: a CA that trusts the serving
    /// certificate, a client identity, and the domain name the certificate is checked
    /// against (members are dialled by IP).
    pub client: etcd_client::TlsOptions,
}

/// A running cluster (stopped when dropped).
pub struct LoopbackCluster {
    etcd: PathBuf,
    members: Vec<Member>,
    tls: Option<ClusterTls>,
}

impl LoopbackCluster {
    /// Starts `size` members of `etcd` (any line from 3.2) with their data and logs in `dir`.
    /// They are not waited for: see [`Self::wait_ready`].
    pub fn start(etcd: &Path, dir: &Path, size: usize) -> Result<Self, ClusterError> {
        Self::start_with(etcd, dir, size, None)
    }

    /// Starts `size` members like [`Self::start`], serving clients over mutual TLS on
    /// `https://127.0.0.1:PORT` URLs (etcd 3.2 and later).
    pub fn start_with_tls(
        etcd: &Path,
        dir: &Path,
        size: usize,
        tls: ClusterTls,
    ) -> Result<Self, ClusterError> {
        Self::start_with(etcd, dir, size, Some(tls))
    }

    fn start_with(
        etcd: &Path,
        dir: &Path,
        size: usize,
        tls: Option<ClusterTls>,
    ) -> Result<Self, ClusterError> {
        let mut ports = Vec::with_capacity(size);
        for _ in 0..size {
            let [client, peer] = free_ports()?;
            ports.push((client, peer));
        }
        let peer_url = |peer: u16| format!("http://127.0.0.1:{peer}");
        let initial_cluster = ports
            .iter()
            .enumerate()
            .map(|(i, &(_, peer))| format!("m{i}={}", peer_url(peer)))
            .collect::<Vec<_>>()
            .join(",");
        let token = format!(
            "recorder-{}-{}",
            std::process::id(),
            ports.first().map_or(0, |p| p.0)
        );
        let mut cluster = LoopbackCluster {
            etcd: etcd.to_path_buf(),
            members: Vec::with_capacity(size),
            tls,
        };
        let scheme = if cluster.tls.is_some() {
            "https"
        } else {
            "http"
        };
        for (i, &(client, peer)) in ports.iter().enumerate() {
            let name = format!("m{i}");
            let client_url = format!("{scheme}://127.0.0.1:{client}");
            let mut args = vec![
                format!("--name={name}"),
                format!("--data-dir={}", dir.join(&name).display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={}", peer_url(peer)),
                format!("--initial-advertise-peer-urls={}", peer_url(peer)),
                format!("--initial-cluster={initial_cluster}"),
                "--initial-cluster-state=new".to_string(),
                format!("--initial-cluster-token={token}"),
            ];
            if let Some(tls) = &cluster.tls {
                args.extend([
                    format!("--cert-file={}", tls.cert_file.display()),
                    format!("--key-file={}", tls.key_file.display()),
                    format!("--trusted-ca-file={}", tls.trusted_ca_file.display()),
                    "--client-cert-auth".to_string(),
                ]);
            }
            let log = dir.join(format!("{name}.log"));
            let process = ManagedProcess::start(&name, etcd, &args, log.clone())?;
            cluster.members.push(Member {
                name,
                client_url,
                args,
                log,
                process: Some(process),
            });
        }
        Ok(cluster)
    }

    /// The members' client URLs, in member order.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// Member `i`'s client URL.
    pub fn endpoint(&self, i: usize) -> Result<String, ClusterError> {
        self.member(i).map(|m| m.client_url.clone())
    }

    fn member(&self, i: usize) -> Result<&Member, ClusterError> {
        self.members.get(i).ok_or(ClusterError::NoMember(i))
    }

    fn member_mut(&mut self, i: usize) -> Result<&mut Member, ClusterError> {
        self.members.get_mut(i).ok_or(ClusterError::NoMember(i))
    }

    /// Waits until every member serves a linearizable read (so has a leader and is caught up).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ClusterError> {
        for i in 0..self.members.len() {
            self.wait_member_ready(i, timeout).await?;
        }
        Ok(())
    }

    /// Waits until member `i` serves a linearizable read.
    pub async fn wait_member_ready(&self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        let member = self.member(i)?;
        let url = member.client_url.clone();
        let tls = self.tls.as_ref().map(|t| t.client.clone());
        let ready = poll_until(&format!("member {} ready", member.name), timeout, || {
            let url = url.clone();
            let tls = tls.clone();
            async move {
                let mut options = etcd_client::ConnectOptions::new()
                    .with_connect_timeout(Duration::from_secs(1))
                    .with_timeout(Duration::from_secs(1));
                if let Some(tls) = tls {
                    options = options.with_tls(tls);
                }
                let mut client = etcd_client::Client::connect([url], Some(options)).await?;
                client.get("health", None).await?;
                Ok::<_, etcd_client::Error>(Some(()))
            }
        })
        .await;
        ready.map_err(|wait| ClusterError::NotReady {
            member: i,
            wait: Box::new(wait),
            log: crate::process::log_tail(&member.log, 30),
        })
    }

    /// SIGKILLs member `i` (its data stays).
    pub fn kill(&mut self, i: usize) -> Result<(), ClusterError> {
        if let Some(mut process) = self.member_mut(i)?.process.take() {
            process.kill();
        }
        Ok(())
    }

    /// Starts member `i` again on its data (after [`Self::kill`]).
    pub fn restart(&mut self, i: usize) -> Result<(), ClusterError> {
        let etcd = self.etcd.clone();
        let member = self.member_mut(i)?;
        if let Some(mut old) = member.process.take() {
            old.kill();
        }
        // Append to the log: it tells the whole story.
        let mut command = std::process::Command::new(&etcd);
        command.args(&member.args);
        member.process = Some(ManagedProcess::start_command(
            &member.name,
            command,
            member.log.clone(),
            true,
        )?);
        Ok(())
    }

    /// Sends `signal` to member `i` (SIGSTOP freezes it, SIGCONT thaws it).
    pub fn signal(&mut self, i: usize, signal: Signal) -> Result<(), ClusterError> {
        if let Some(process) = self.member_mut(i)?.process.as_mut() {
            process.signal(signal);
        }
        Ok(())
    }

    /// The last `lines` lines of member `i`'s log.
    pub fn log_tail(&self, i: usize, lines: usize) -> String {
        self.member(i)
            .map(|m| crate::process::log_tail(&m.log, lines))
            .unwrap_or_default()
    }
}

impl Drop for LoopbackCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(process) = member.process.as_mut() {
                // A frozen member would not see SIGTERM.
                process.signal(Signal::SIGCONT);
            }
        }
        // Each process stops on its own drop (SIGTERM, grace, SIGKILL).
    }
}
