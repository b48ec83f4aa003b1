//! A real node beside the process kubelet: the pinned kubelet on containerd 2.x and Debian's
//! runc, pods on a CNI bridge, images imported from `hack/build-images.sh`'s docker-archives
//! (never pulled). It runs inside the suite's private network and mount namespace
//! ([`crate::kubelet::netns`], `Suite::with_pod_network`), so its bridge, addresses and mounts
//! vanish with the test binary.
//!
//! What this machine needs, measured (see `../shared/notes/real-node.md`):
//! - cgroups are hybrid v1: the kubelet runs with `failCgroupV1: false` and the cgroupfs
//!   driver, under a cgroup root of its own ([`CGROUP_PARENT`]/NAME) made in every v1
//!   hierarchy first (the kubelet refuses a root with missing paths);
//! - the harness may not lower `oom_score_adj` (the kubelet asks -998 for sandboxes):
//!   containerd's `restrict_oom_score_adj` keeps it at the runtime's own;
//! - containerd and its shims run in that cgroup root too, so stopping the node kills every
//!   process it started (shims outlive containerd otherwise).
//!
//! The API server reaches the kubelet (`kubectl logs`) at the node's IP with the admin client
//! certificate (`--kubelet-client-certificate`, see [`crate::control_plane`]).
//!
//! NetworkPolicies are not enforced unless asked for
//! ([`RealNodeOptions::with_network_policies`]): then kube-network-policies runs beside the
//! kubelet ([`crate::network_policies`]).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::control_plane::{ControlPlane, ControlPlaneOptions, SERVICE_CIDR};
use crate::kubelet::netns::{NODE_IP, POD_INTERFACE};
use crate::network_policies::Enforcer;
use crate::process::ManagedProcess;

/// Control plane options for a real node: the scheduler places pods (Deployments have no
/// node), and the API server listens on every address and advertises the pod network's node IP
/// (published by the lease reconciler), so the `kubernetes` Service has an endpoint pods reach.
pub fn control_plane_options() -> ControlPlaneOptions {
    ControlPlaneOptions {
        scheduler: true,
        extra_apiserver_args: vec![
            "--bind-address=0.0.0.0".into(),
            format!("--advertise-address={NODE_IP}"),
            "--endpoint-reconciler-type=lease".into(),
        ],
        ..ControlPlaneOptions::default()
    }
}

/// The pause image of `hack/build-images.sh`, the node's pod sandbox.
pub const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Where `hack/build-images.sh` writes its images (`IMAGES_OUT`, default `target/images`).
pub fn images_dir() -> PathBuf {
    std::env::var_os("IMAGES_OUT").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/images"),
        PathBuf::from,
    )
}

/// The docker-archive of image `name` (`pause`, `coredns`, `controller`, `etcd-3.6.16`, ...),
/// checked to exist.
pub fn image_archive(name: &str) -> anyhow::Result<PathBuf> {
    let path = images_dir().join(format!("{name}.tar"));
    ensure!(
        path.is_file(),
        "{} is missing: run hack/build-images.sh",
        path.display()
    );
    Ok(path)
}

/// The cgroup (in every v1 hierarchy) under which each real node keeps its own root.
pub const CGROUP_PARENT: &str = "etcd-tests-real-node";

/// The cgroup v1 hierarchies the kubelet checks for its root.
const HIERARCHIES: [&str; 9] = [
    "cpu", "cpuacct", "cpuset", "memory", "pids", "blkio", "devices", "freezer", "systemd",
];

/// How to start a real node.
#[derive(Debug, Clone)]
pub struct RealNodeOptions {
    /// The Node's name.
    pub name: String,
    /// The node's IP, added to the pod network's interface (the kubelet serves there).
    pub node_ip: Ipv4Addr,
    /// The subnet of this node's pods (the CNI bridge's, a /24).
    pub pod_subnet: String,
    /// Directory of the real node's binaries (`Tools::node_bin`).
    pub bin: PathBuf,
    /// Docker-archives to import into containerd (`target/images/*.tar`).
    pub images: Vec<PathBuf>,
    /// The sandbox image (in `images`).
    pub sandbox_image: String,
    /// The cluster DNS Service's IP the kubelet gives pods (`clusterDNS`), if the suite runs
    /// one ([`crate::cluster_dns`]).
    pub cluster_dns: Option<Ipv4Addr>,
    /// The NetworkPolicy enforcer's binary (kube-network-policies), if the node runs one
    /// ([`Self::with_network_policies`]).
    pub network_policies: Option<PathBuf>,
}

impl RealNodeOptions {
    /// Node `name` at 10.244.255.1 with pods in 10.245.0.0/24, the pinned node binaries of
    /// `tools`, and the images of `hack/build-images.sh` named in `images` (`etcd-3.6.16`,
    /// `controller`, ...; the pause image is always imported), each checked to exist.
    pub fn new(name: &str, tools: &crate::Tools, images: &[&str]) -> anyhow::Result<Self> {
        Ok(Self {
            name: name.into(),
            node_ip: Ipv4Addr::new(10, 244, 255, 1),
            pod_subnet: "10.245.0.0/24".into(),
            bin: tools.node_bin()?,
            images: std::iter::once("pause")
                .chain(images.iter().copied().filter(|i| *i != "pause"))
                .map(image_archive)
                .collect::<anyhow::Result<_>>()?,
            sandbox_image: SANDBOX_IMAGE.into(),
            cluster_dns: None,
            network_policies: None,
        })
    }

    /// The same node, its pods told to use the cluster DNS ([`crate::cluster_dns`]).
    pub fn with_cluster_dns(mut self) -> Self {
        self.cluster_dns = Some(crate::cluster_dns::CLUSTER_DNS_IP);
        self
    }

    /// The same node with NetworkPolicies enforced: kube-network-policies of `tools`
    /// (`ONLY=netpol hack/build-tools.sh`) started beside the kubelet, in the node's network
    /// namespace, with the admin kubeconfig; [`RealNode::start`] returns once it reads its
    /// queue. Its log is `kube-network-policies.log` beside the kubelet's; it stops with the
    /// node (first, its nftables table removed).
    pub fn with_network_policies(mut self, tools: &crate::Tools) -> anyhow::Result<Self> {
        self.network_policies = Some(crate::network_policies::binary(tools)?);
        Ok(self)
    }
}

/// A running real node; stopped (every process it started killed, its cgroups removed) on drop.
pub struct RealNode {
    name: String,
    dir: tempfile::TempDir,
    bin: PathBuf,
    cgroup: String,
    containerd: Option<ManagedProcess>,
    kubelet: Option<ManagedProcess>,
    kube_proxy: Option<ManagedProcess>,
    network_policies: Option<Enforcer>,
}

impl RealNode {
    /// Starts containerd, imports the images, starts the kubelet registered to `control_plane`
    /// and waits until the Node is Ready.
    pub async fn start(
        control_plane: &ControlPlane,
        opts: RealNodeOptions,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("etcd-tests-real-node-")
            .tempdir()?;
        let cgroup = format!("{CGROUP_PARENT}/{}-{}", opts.name, std::process::id());
        make_cgroups(&cgroup)?;
        let mut node = RealNode {
            name: opts.name.clone(),
            bin: opts.bin.clone(),
            cgroup,
            containerd: None,
            kubelet: None,
            kube_proxy: None,
            network_policies: None,
            dir,
        };
        add_address(opts.node_ip)?;
        route_services()?;
        node.start_containerd(&opts).await?;
        node.import_images(&opts.images)?;
        node.start_kubelet(control_plane, &opts)?;
        node.start_kube_proxy(control_plane, &opts)?;
        if let Some(bin) = &opts.network_policies {
            let enforcer = Enforcer::start(
                bin,
                control_plane.kubeconfig_path(),
                &opts.name,
                opts.node_ip,
                &node.nri_socket(),
                node.dir.path().join("kube-network-policies.log"),
            )
            .await
            .with_context(|| node.log_tails(20))?;
            node.network_policies = Some(enforcer);
        }
        node.wait_ready(control_plane).await?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The cgroup root of this node (relative to each v1 hierarchy).
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The NetworkPolicy enforcer, when the node runs one
    /// ([`RealNodeOptions::with_network_policies`]).
    pub fn network_policies(&self) -> Option<&Enforcer> {
        self.network_policies.as_ref()
    }

    /// The pids of pod `uid`'s processes (its sandbox's and its containers'), from the
    /// kubelet's pod cgroup (`.../pod<UID>`, pids hierarchy); empty when it has none.
    pub fn pod_pids(&self, uid: &str) -> Vec<u32> {
        let want = format!("pod{uid}");
        let mut stack = vec![Path::new("/sys/fs/cgroup/pids").join(&self.cgroup)];
        while let Some(dir) = stack.pop() {
            if dir.file_name().is_some_and(|n| n == want.as_str()) {
                let cgroup = dir.strip_prefix("/sys/fs/cgroup/pids").unwrap_or(&dir);
                return pids_in(&cgroup.to_string_lossy());
            }
            stack.extend(
                std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        Vec::new()
    }

    /// The network namespace of pod `uid` (`/proc/PID/ns/net` of one of its processes).
    pub fn pod_netns(&self, uid: &str) -> anyhow::Result<PathBuf> {
        let pid = self
            .pod_pids(uid)
            .into_iter()
            .next()
            .with_context(|| format!("no process of pod {uid} on node {}", self.name))?;
        Ok(PathBuf::from(format!("/proc/{pid}/ns/net")))
    }

    /// `ctr` against this node's containerd, in the Kubernetes namespace.
    pub fn ctr(&self) -> Command {
        let mut c = Command::new(self.bin.join("ctr"));
        c.arg("--address")
            .arg(self.socket())
            .args(["--namespace", "k8s.io"]);
        c
    }

    /// The tail of the kubelet's, kube-proxy's and containerd's logs, and of every container's.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut tails: Vec<String> = [&self.kubelet, &self.kube_proxy, &self.containerd]
            .into_iter()
            .flatten()
            .chain(self.network_policies.iter().map(Enforcer::process))
            .map(|p| format!("--- {} ---\n{}", p.name(), p.log_tail(lines)))
            .collect();
        let mut stack = vec![self.dir.path().join("pod-logs")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                } else {
                    tails.push(format!(
                        "--- {} ---\n{}",
                        path.display(),
                        crate::process::log_tail(&path, lines)
                    ));
                }
            }
        }
        tails.join("\n")
    }

    fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// containerd's NRI socket when the node runs the enforcer (whose NRI plugin connects to
    /// it); without one, containerd's default (/var/run/nri/nri.sock) as before.
    fn nri_socket(&self) -> PathBuf {
        self.dir.path().join("nri.sock")
    }

    async fn start_containerd(&mut self, opts: &RealNodeOptions) -> anyhow::Result<()> {
        let d = self.dir.path();
        let cni_conf = d.join("cni");
        std::fs::create_dir_all(&cni_conf)?;
        std::fs::write(
            cni_conf.join("10-bridge.conflist"),
            serde_json::to_vec_pretty(&serde_json::json!({
                "cniVersion": "1.0.0",
                "name": "real-node",
                "plugins": [
                    {"type": "bridge", "bridge": "realnode0", "isGateway": true, "isDefaultGateway": true, "ipMasq": false,
                     "hairpinMode": true,
                     "ipam": {"type": "host-local", "ranges": [[{"subnet": opts.pod_subnet}]],
                              "dataDir": d.join("cni-ipam")}},
                    {"type": "portmap", "capabilities": {"portMappings": true}}
                ]
            }))?,
        )?;
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox}'
{nri}[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
    runtime_type = 'io.containerd.runc.v2'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
      BinaryName = '{runc}'
      Root = '{runc_root}'
      SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ['{cni_bin}']
    conf_dir = '{cni_conf}'
"#,
            root = d.join("containerd-root").display(),
            state = d.join("containerd-state").display(),
            socket = self.socket().display(),
            sandbox = opts.sandbox_image,
            runc = which("runc")?.display(),
            runc_root = d.join("runc").display(),
            cni_bin = self.bin.join("cni").display(),
            cni_conf = cni_conf.display(),
            nri = if opts.network_policies.is_some() {
                format!(
                    "[plugins.'io.containerd.nri.v1.nri']\n  disable = false\n  socket_path = '{}'\n",
                    self.nri_socket().display()
                )
            } else {
                String::new()
            },
        );
        let config_path = d.join("containerd.toml");
        std::fs::write(&config_path, config)?;
        let mut command = Command::new(self.bin.join("containerd"));
        command.arg("--config").arg(&config_path);
        // The shim is found on PATH, beside containerd.
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{path}", self.bin.display()));
        let process =
            ManagedProcess::start_command("containerd", command, d.join("containerd.log"), false)?;
        // containerd, and the shims it starts, in the node's cgroup root.
        join_cgroups(&self.cgroup, process.pid())?;
        self.containerd = Some(process);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.socket().exists() {
            ensure!(
                Instant::now() < deadline,
                "containerd did not open {} in 30 s:\n{}",
                self.socket().display(),
                self.log_tails(20)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    fn import_images(&self, images: &[PathBuf]) -> anyhow::Result<()> {
        for image in images {
            let out = self.ctr().args(["images", "import"]).arg(image).output()?;
            ensure!(
                out.status.success(),
                "ctr images import {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }

    fn start_kubelet(
        &mut self,
        control_plane: &ControlPlane,
        opts: &RealNodeOptions,
    ) -> anyhow::Result<()> {
        let d = self.dir.path();
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
containerRuntimeEndpoint: unix://{socket}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
address: {ip}
port: 10250
readOnlyPort: 0
healthzPort: 0
clusterDomain: cluster.local
{cluster_dns}failSwapOn: false
serializeImagePulls: false
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
podLogsDir: {logs}
imageGCHighThresholdPercent: 100
evictionHard: {{}}
"#,
            cgroup = self.cgroup,
            socket = self.socket().display(),
            ca = write(d, "ca.crt", control_plane.ca_pem())?.display(),
            ip = opts.node_ip,
            logs = d.join("pod-logs").display(),
            cluster_dns = opts
                .cluster_dns
                .map(|ip| format!("clusterDNS: [{ip}]\n"))
                .unwrap_or_default(),
        );
        let config_path = write(d, "kubelet.yaml", &config)?;
        let args = vec![
            format!("--config={}", config_path.display()),
            format!("--kubeconfig={}", control_plane.kubeconfig_path().display()),
            format!("--hostname-override={}", opts.name),
            format!("--node-ip={}", opts.node_ip),
            format!("--root-dir={}", d.join("kubelet").display()),
            format!("--cert-dir={}", d.join("kubelet-pki").display()),
        ];
        let process = ManagedProcess::start(
            "kubelet",
            &self.bin.join("kubelet"),
            &args,
            d.join("kubelet.log"),
        )?;
        self.kubelet = Some(process);
        Ok(())
    }

    /// kube-proxy in iptables mode: ClusterIPs (the `kubernetes` Service for in-cluster
    /// clients, a webhook's Service for the API server) route to their endpoints in this
    /// namespace, from pods and from local processes alike.
    fn start_kube_proxy(
        &mut self,
        control_plane: &ControlPlane,
        opts: &RealNodeOptions,
    ) -> anyhow::Result<()> {
        let d = self.dir.path();
        let config = format!(
            r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
hostnameOverride: {name}
bindAddress: {ip}
healthzBindAddress: {ip}:10256
metricsBindAddress: {ip}:10249
clusterCIDR: {subnet}
iptables:
  localhostNodePorts: false
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
"#,
            kubeconfig = control_plane.kubeconfig_path().display(),
            name = opts.name,
            ip = opts.node_ip,
            subnet = opts.pod_subnet,
        );
        let config_path = write(d, "kube-proxy.yaml", &config)?;
        let process = ManagedProcess::start(
            "kube-proxy",
            &self.bin.join("kube-proxy"),
            &[format!("--config={}", config_path.display())],
            d.join("kube-proxy.log"),
        )?;
        self.kube_proxy = Some(process);
        Ok(())
    }

    async fn wait_ready(&self, control_plane: &ControlPlane) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(control_plane.client());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(node) = nodes.get_opt(&self.name).await?
                && node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} not Ready in 60 s:\n{}",
                    self.name,
                    self.log_tails(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        // The enforcer first: it removes its nftables table (fail-closed rules whose queue
        // nobody would read) while the node's pods still exist.
        drop(self.network_policies.take());
        if let Some(kubelet) = self.kubelet.as_mut() {
            kubelet.stop(Duration::from_secs(5));
        }
        if let Some(proxy) = self.kube_proxy.as_mut() {
            proxy.stop(Duration::from_secs(5));
        }
        // Every container, sandbox and shim: all in the node's cgroup root.
        for _ in 0..50 {
            if kill_cgroup(&self.cgroup) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(containerd) = self.containerd.as_mut() {
            containerd.stop(Duration::from_secs(5));
        }
        // Overlay, netns, shm and volume mounts under the node's directory, then the
        // directory itself (its TempDir cannot remove a mount point).
        unmount_below(self.dir.path());
        let _ = std::fs::remove_dir_all(self.dir.path());
        remove_cgroups(&self.cgroup);
    }
}

/// Detaches every mount at or below `dir` (from `/proc/self/mountinfo`), deepest first.
fn unmount_below(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        // mountinfo writes a space, tab, newline and backslash as octal escapes.
        .map(|p| {
            PathBuf::from(
                p.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\"),
            )
        })
        .filter(|p| p.starts_with(dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for point in points {
        let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn write(dir: &Path, name: &str, contents: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, contents).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

fn which(program: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| {
            format!("{program} is not installed (Debian: apt-get install -y {program})")
        })
}

/// Adds `ip/32` to the pod network's interface (once: a later node of the same suite finds it;
/// iproute2 says "File exists", or the kernel's "Address already assigned").
fn add_address(ip: Ipv4Addr) -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(["addr", "add", &format!("{ip}/32"), "dev", POD_INTERFACE])
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success()
            || said.contains("File exists")
            || said.contains("Address already assigned"),
        "ip addr add {ip}: {said}"
    );
    Ok(())
}

/// A route for the Services' ClusterIPs ([`SERVICE_CIDR`]) in this namespace: without one, a
/// local process (the API server calling a webhook's Service) gets "network is unreachable"
/// before kube-proxy's DNAT in `OUTPUT` can send the packet to a pod.
fn route_services() -> anyhow::Result<()> {
    let out = Command::new("ip")
        .args(["route", "add", SERVICE_CIDR, "dev", POD_INTERFACE])
        .output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    ensure!(
        out.status.success() || said.contains("File exists"),
        "ip route add {SERVICE_CIDR}: {said}"
    );
    Ok(())
}

fn make_cgroups(cgroup: &str) -> anyhow::Result<()> {
    for h in HIERARCHIES {
        let base = Path::new("/sys/fs/cgroup").join(h);
        if !base.is_dir() {
            continue;
        }
        let mut path = base.clone();
        for part in cgroup.split('/') {
            path.push(part);
            if !path.is_dir() {
                std::fs::create_dir(&path)
                    .with_context(|| format!("creating cgroup {}", path.display()))?;
            }
            // cpuset: a new cgroup has no CPUs or memory nodes until given its parent's.
            if h == "cpuset" {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let parent =
                        std::fs::read_to_string(path.parent().unwrap_or(&base).join(file))?;
                    std::fs::write(path.join(file), parent.trim())?;
                }
            }
        }
    }
    Ok(())
}

fn join_cgroups(cgroup: &str, pid: u32) -> anyhow::Result<()> {
    for h in HIERARCHIES {
        let dir = Path::new("/sys/fs/cgroup").join(h).join(cgroup);
        if dir.is_dir() {
            std::fs::write(dir.join("cgroup.procs"), pid.to_string())
                .with_context(|| format!("moving {pid} into {}", dir.display()))?;
        }
    }
    Ok(())
}

/// SIGKILLs every process in `cgroup` and below (the pids hierarchy); returns how many were
/// still there.
fn kill_cgroup(cgroup: &str) -> usize {
    let pids = pids_in(cgroup);
    for pid in &pids {
        if let Ok(pid) = i32::try_from(*pid) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    pids.len()
}

/// Every process in `cgroup` (pids hierarchy) or below.
fn pids_in(cgroup: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let mut stack = vec![Path::new("/sys/fs/cgroup/pids").join(cgroup)];
    while let Some(dir) = stack.pop() {
        if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            found.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
        if let Ok(entries) = std::fs::read_dir(&dir) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
    found
}

/// Removes `cgroup` and everything below it, deepest first, in every hierarchy.
fn remove_cgroups(cgroup: &str) {
    fn remove(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&e.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for h in HIERARCHIES {
        let hierarchy = Path::new("/sys/fs/cgroup").join(h);
        remove(&hierarchy.join(cgroup));
        // The shared parent too, once no other node uses it.
        let _ = std::fs::remove_dir(hierarchy.join(CGROUP_PARENT));
    }
}

/// `field` of `/proc/PID/status` (`Uid`, `VmRSS`), trimmed.
pub fn proc_status(pid: u32, field: &str) -> anyhow::Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// The cgroup v1 memory directory of `pid`.
pub fn memory_cgroup(pid: u32) -> anyhow::Result<PathBuf> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let path = cgroups
        .lines()
        .find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            controllers
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_string())
        })
        .context("no memory cgroup")?;
    Ok(Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')))
}

/// The pid of the process whose command line contains `needle`, in `cgroup` (pids hierarchy)
/// or below.
pub fn process_in(cgroup: &str, needle: &str) -> Option<u32> {
    pids_in(cgroup).into_iter().find(|pid| {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        String::from_utf8_lossy(&cmdline).contains(needle)
    })
}
