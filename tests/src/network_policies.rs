//! NetworkPolicies enforced on the real node ([`crate::real_node`]) by the real enforcer,
//! `sigs.k8s.io/kube-network-policies` (the one kind ships), built by
//! `ONLY=netpol hack/build-tools.sh` at `KUBE_NETWORK_POLICIES_VERSION` of `hack/versions.env`.
//!
//! It runs as a process in the node's network namespace (where the pods' bridge is), as its
//! DaemonSet's pod would with `hostNetwork`: the admin kubeconfig (a `--kubeconfig` flag this
//! build adds), the node's name (`--hostname-override`), its NRI plugin connected to the node's
//! own containerd (`NRI_PLUGIN_SOCKET`, a connected socket as its stdin). It programs the
//! nftables table `inet kube-network-policies`: the first packet of each connection to or from
//! a local pod that a policy selects goes to nfqueue [`QUEUE_ID`], and the process answers
//! accept or drop from the policies it watches. Fail-closed (upstream's default): with the
//! enforcer gone, such packets are dropped.
//!
//! On this kernel the queue statement is the xtables NFQUEUE target through nft_compat
//! (no nft_queue here; see `build_netpol` in `hack/build-tools.sh`).
//!
//! Its log is `kube-network-policies.log` in the node's directory (`-v=2`: one line per
//! queued packet, with its verdict); its Prometheus metrics (`packet_count` by verdict) at
//! [`Enforcer::metrics_address`].

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};

use crate::Tools;
use crate::process::ManagedProcess;
use crate::tools::{VERSIONS_ENV, parse_env_file};

/// The key of `hack/versions.env` that pins kube-network-policies.
pub const VERSION_KEY: &str = "KUBE_NETWORK_POLICIES_VERSION";
/// The nfqueue the enforcer reads (upstream's default).
pub const QUEUE_ID: u16 = 100;
/// The port of its metrics, on the node's IP.
pub const METRICS_PORT: u16 = 9080;
/// The nftables table it programs (`inet` family).
pub const TABLE: &str = "kube-network-policies";

/// The pinned version (`KUBE_NETWORK_POLICIES_VERSION`, without a leading `v`).
pub fn version() -> anyhow::Result<String> {
    parse_env_file(VERSIONS_ENV)?
        .get(VERSION_KEY)
        .map(|v| v.trim_start_matches('v').to_owned())
        .filter(|v| !v.is_empty())
        .with_context(|| format!("hack/versions.env does not set {VERSION_KEY}"))
}

/// The enforcer's binary in `tools`' cache, checked to be built.
pub fn binary(tools: &Tools) -> anyhow::Result<PathBuf> {
    let dir = tools
        .root()
        .join("kube-network-policies")
        .join(format!("v{}", version()?));
    let bin = dir.join("bin/kube-network-policies");
    ensure!(
        dir.join(".complete").is_file() && bin.is_file(),
        "{} is missing: run ONLY=netpol hack/build-tools.sh",
        bin.display()
    );
    Ok(bin)
}

/// A running enforcer: stopped (its table removed) on drop, before the node's kubelet.
pub struct Enforcer {
    process: ManagedProcess,
    metrics: SocketAddr,
}

impl Enforcer {
    /// Starts `bin` for node `node_name` (whose IP is `node_ip`) against the API server of
    /// `kubeconfig`, logging to `log`; its NRI plugin talks to the containerd listening on
    /// `nri_socket`. Returns once its rules are in place and it reads its queue
    /// ([`Self::wait_ready`]).
    pub(crate) async fn start(
        bin: &Path,
        kubeconfig: &Path,
        node_name: &str,
        node_ip: Ipv4Addr,
        nri_socket: &Path,
        log: PathBuf,
    ) -> anyhow::Result<Self> {
        let metrics = SocketAddr::V4(SocketAddrV4::new(node_ip, METRICS_PORT));
        let mut command = Command::new(bin);
        command.args([
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={node_name}"),
            format!("--nfqueue-id={QUEUE_ID}"),
            format!("--metrics-bind-address={metrics}"),
            "-v=2".into(),
        ]);
        // The NRI plugin's connection (pod IPs from the runtime before the API server has
        // them): the node's containerd, never whichever one owns /var/run/nri/nri.sock.
        let nri = wait_for_socket(nri_socket, Duration::from_secs(30)).await?;
        command.env("NRI_PLUGIN_SOCKET", "0");
        // SAFETY: the hook runs in the forked child before exec and only calls dup2(2)
        // (async-signal-safe, no allocation); `nri` lives in the closure until the Command is
        // dropped after the spawn.
        unsafe {
            command.pre_exec(move || {
                nix::unistd::dup2_stdin(&nri).map_err(std::io::Error::from)?;
                Ok(())
            });
        }
        let process = ManagedProcess::start_command("kube-network-policies", command, log, false)?;
        let mut enforcer = Self { process, metrics };
        enforcer.wait_ready(Duration::from_secs(60)).await?;
        Ok(enforcer)
    }

    /// Waits until the enforcer reads nfqueue [`QUEUE_ID`] (it opens the queue once its
    /// informers have synced and its nftables rules are written) and its log shows no refused
    /// rules.
    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let log = std::fs::read_to_string(self.process.log_path()).unwrap_or_default();
            // Upstream logs a refused transaction and carries on, enforcing nothing.
            if let Some(at) = log.find("\"syncing nftables rules\"") {
                // klog writes a multi-line value as `error=<`, its lines, `>`.
                let said: Vec<&str> = log[at..].lines().take(6).collect();
                bail!(
                    "kube-network-policies' nftables rules were refused: {}",
                    said.join("\n")
                );
            }
            if queue_bound(QUEUE_ID) {
                return Ok(());
            }
            if let Some(status) = self.process.exit_status() {
                bail!(
                    "kube-network-policies exited ({status}):\n{}",
                    self.process.log_tail(30)
                );
            }
            ensure!(
                Instant::now() < deadline,
                "kube-network-policies did not read nfqueue {QUEUE_ID} in {timeout:?}:\n{}",
                self.process.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process.
    pub fn process(&self) -> &ManagedProcess {
        &self.process
    }

    /// Where its Prometheus metrics are served (`/metrics`).
    pub fn metrics_address(&self) -> SocketAddr {
        self.metrics
    }

    /// Its `kube_network_policies_packet_count` of `verdict` (`accept`, `drop`) summed over
    /// protocols and families: packets it judged, read from its metrics.
    pub fn packets(&self, verdict: &str) -> anyhow::Result<u64> {
        let text = http_get(self.metrics, "/metrics")?;
        let label = format!("verdict=\"{verdict}\"");
        Ok(text
            .lines()
            .filter(|l| l.starts_with("kube_network_policies_packet_count{") && l.contains(&label))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// The tail of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// SIGINT (the only signal upstream's main handles: it then deletes its table), up to
    /// 5 s for its "Shutting down controller" (logged after the table is gone), then SIGKILL
    /// (it would sleep another 5 s).
    pub fn stop(&mut self) {
        self.process.signal(nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && self.process.exit_status().is_none() {
            let log = std::fs::read_to_string(self.process.log_path()).unwrap_or_default();
            if log.contains("Shutting down controller") {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.process.kill();
    }
}

impl Drop for Enforcer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether a process reads nfqueue `queue` in this network namespace
/// (`/proc/net/netfilter/nfnetlink_queue`: one line per bound queue, its number first).
pub fn queue_bound(queue: u16) -> bool {
    std::fs::read_to_string("/proc/net/netfilter/nfnetlink_queue")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().next() == Some(&queue.to_string()))
}

/// Connects to `socket` once it exists (containerd creates it as it starts its NRI).
async fn wait_for_socket(socket: &Path, timeout: Duration) -> anyhow::Result<UnixStream> {
    let deadline = Instant::now() + timeout;
    loop {
        match UnixStream::connect(socket) {
            Ok(stream) => return Ok(stream),
            Err(e) if Instant::now() >= deadline => {
                bail!("connecting to NRI at {}: {e}", socket.display())
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// A plain HTTP/1.0 GET (the metrics endpoint), its body.
fn http_get(address: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("no end of headers")?;
    ensure!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "GET {path}: {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_owned())
}

/// A TCP connect to `address` from inside the network namespace `netns` (a pod's:
/// `/proc/PID/ns/net`), on a thread of its own (`setns(2)` moves only the calling thread),
/// given up after `timeout`. A connection a policy refuses times out: the enforcer drops the
/// SYN (and its retransmissions), nothing answers.
pub async fn connect_from(
    netns: &Path,
    address: SocketAddr,
    timeout: Duration,
) -> std::io::Result<()> {
    let netns = netns.to_owned();
    tokio::task::spawn_blocking(move || {
        // A fresh thread, never one of the blocking pool's (they are reused).
        std::thread::spawn(move || {
            let ns = std::fs::File::open(&netns)?;
            nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(std::io::Error::from)?;
            TcpStream::connect_timeout(&address, timeout).map(drop)
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
    })
    .await
    .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}
