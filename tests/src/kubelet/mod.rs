//! A "process kubelet": a Node of the local control plane whose pods run as local processes.
//!
//! It registers a Ready Node, keeps its Lease fresh and posts its status as a kubelet does
//! ([`heartbeat`]), binds pending pods to it when it is the only node (a suite of several,
//! [`nodes`], runs kube-scheduler instead), and for every pod bound to it: gives the pod an IP
//! and DNS name on the pod network ([`netns`]) and a cgroup ([`cgroup`]), maps its images to
//! local binaries ([`images`]), sets up its volumes as
//! directories ([`volumes`]; Secret and ConfigMap files are kept up to date while it runs,
//! `refresh`), expands its command line and environment ([`expand`]), runs its
//! init containers one at a time, in order, each to completion, then each container as a child
//! process restarted per `restartPolicy`, runs its probes ([`probes`]) and writes its status
//! ([`status`]). A changed container image restarts that container on the new binary (how the
//! operator upgrades members); a deleted pod is stopped (SIGTERM, grace period, SIGKILL),
//! cleaned up and removed.
//!
//! Init containers go through the same code as the containers (image mapping, `command`/`args`
//! and `env` expansion, mount-path rewriting, log files, back-off) and share the pod's volumes.
//! A failed one is restarted with the containers' back-off unless `restartPolicy` is `Never`,
//! which fails the pod; once all completed they are not run again for the life of the pod (a
//! crashed container restarts alone). Until then the pod is `Pending`, its `Initialized`
//! condition `False` and its containers wait with `PodInitializing`;
//! `status.initContainerStatuses` report them as a kubelet does. Sidecars (init containers
//! with their own `restartPolicy: Always`) are not supported: such a pod stays `Pending` with
//! a message saying so.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), etcd_tests::kubelet::KubeletError> {
//! use etcd_tests::kubelet::{Kubelet, KubeletOptions};
//! // main() must have called etcd_tests::kubelet::netns::enter() while single-threaded
//! // (Suite::with_kubelet does both).
//! let kubelet = Kubelet::start(client, KubeletOptions::default()).await?;
//! let ip = kubelet.pod_ip("ns", "demo-0");
//! kubelet.kill_container("ns", "demo-0")?;
//! # let _ = ip;
//! # Ok(())
//! # }
//! ```
//!
//! Node faults: [`Kubelet::silence`] and [`Kubelet::resume`] (a paused or partitioned kubelet:
//! no heartbeats, no status, no reaction to the API, containers keep running),
//! [`PodNetwork::partition`] and [`PodNetwork::isolate`] (packets between pods dropped both
//! ways, [`partition`]), [`Kubelet::pause_pod`] (SIGSTOP, a frozen member).
//!
//! Not a full kubelet: no sidecar containers, no `kubectl logs`/`exec`/port-forward (there is
//! no kubelet API server), no resource limits, no Service virtual IPs (nothing routes ClusterIPs),
//! downward-API volume files and service-account tokens are written once per pod start.

pub mod atomic_writer;
pub mod cgroup;
mod container;
pub mod expand;
mod faults;
pub mod heartbeat;
pub mod images;
pub mod log;
pub mod netns;
pub mod node;
pub mod nodes;
pub mod partition;
pub mod probes;
mod refresh;
mod runtime;
pub mod status;
pub mod volumes;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use nix::sys::signal::Signal;

pub use heartbeat::HeartbeatOptions;
pub use images::{ImageError, ImageMap, ImageMapping, ImageRef};
pub use netns::{NetworkError, PodNetwork};
pub use nodes::NodesOptions;
pub use partition::Partition;

use self::log::KubeletLog;
use self::node::NodeConfig;
use self::runtime::{PodUpdate, spawn_worker};
use self::volumes::KubeletDirs;
use crate::process::{ManagedProcess, log_tail};
use crate::tools::{Tools, ToolsError};

/// Default node name.
pub const DEFAULT_NODE_NAME: &str = "etcd-tests-node";
/// The reason a kubelet gives pods it ended in a graceful node shutdown.
pub const NODE_SHUTDOWN_REASON: &str = "Terminated";
/// The message a kubelet gives pods it ended in a graceful node shutdown (its exact words).
pub const NODE_SHUTDOWN_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// Prefix of kubelet directories in the system temp directory.
const DIR_PREFIX: &str = "etcd-operator-kubelet-";
/// File in the kubelet directory holding the pid of the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// How the kubelet runs.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// Node name. Default [`DEFAULT_NODE_NAME`].
    pub node_name: String,
    /// Extra node labels (pods' `nodeSelector` is matched against them).
    pub node_labels: BTreeMap<String, String>,
    /// Node capacity and allocatable. Default: 16 CPUs, 64Gi memory, 110 pods, 100Gi
    /// ephemeral storage.
    pub capacity: BTreeMap<String, Quantity>,
    /// Cluster domain of the pod DNS names. Default `cluster.local`.
    pub cluster_domain: String,
    /// Extra image rules, tried before the etcd rule. Shared: rules registered on it (or on
    /// [`Kubelet::images`]) later still apply.
    pub images: ImageMap,
    /// Add the etcd image rule (see [`images`]). Default true.
    pub etcd_images: bool,
    /// Tool cache for the etcd rule; `None` means [`Tools::from_env`].
    pub tools: Option<Tools>,
    /// Bind pending pods to this node (there is no scheduler). Default true; false with
    /// several nodes (kube-scheduler binds, see [`nodes`]).
    pub bind_pods: bool,
    /// Give the node an IP of its own from the pod range (released when the kubelet stops)
    /// instead of the network's node IP (10.244.0.1). Default false; every node but the first
    /// of a multi-node suite has its own.
    pub allocate_node_ip: bool,
    /// Lease and node status timings (see [`heartbeat`]). Default: a kubelet's.
    pub heartbeat: HeartbeatOptions,
    /// First restart back-off; doubles per crash up to [`Self::max_backoff`]. Default 200 ms.
    pub initial_backoff: Duration,
    /// Restart back-off cap. Default 5 s.
    pub max_backoff: Duration,
    /// When a container ran at least this long, its back-off starts over. Default 10 s.
    pub backoff_reset: Duration,
    /// Grace period between SIGTERM and SIGKILL when the kubelet shuts down. Default 5 s.
    pub shutdown_grace: Duration,
    /// The API server URL, for `KUBERNETES_SERVICE_HOST`/`_PORT` in containers (ClusterIPs
    /// are not routed, so in-cluster clients are pointed at it directly). `Suite` sets it.
    pub apiserver_url: Option<String>,
    /// How often the files of running pods' `secret`, `configMap` and `projected` volumes are
    /// compared with their Secrets and ConfigMaps and swapped when those changed (see
    /// [`volumes`]). Default 2 s. A real kubelet takes its sync period (1 min) plus its cache
    /// TTL or watch delay, about 60-90 s, for an update to show in a pod; tests want to see
    /// that a process picks up new files (certificate rotation) without waiting minutes, and
    /// the mechanism (a `..data` swap under a running process) is the same whatever the
    /// delay. A program must not count on the delay being short. Zero: files are written once
    /// per pod start and never refreshed.
    pub volume_resync: Duration,
}

impl Default for KubeletOptions {
    fn default() -> Self {
        let q = |s: &str| Quantity(s.to_owned());
        Self {
            node_name: DEFAULT_NODE_NAME.into(),
            node_labels: BTreeMap::new(),
            capacity: BTreeMap::from([
                ("cpu".to_owned(), q("16")),
                ("memory".to_owned(), q("64Gi")),
                ("pods".to_owned(), q("110")),
                ("ephemeral-storage".to_owned(), q("100Gi")),
            ]),
            cluster_domain: "cluster.local".into(),
            images: ImageMap::new(),
            etcd_images: true,
            tools: None,
            bind_pods: true,
            allocate_node_ip: false,
            heartbeat: HeartbeatOptions::default(),
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
            backoff_reset: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
            apiserver_url: None,
            volume_resync: Duration::from_secs(2),
        }
    }
}

/// Errors of the kubelet.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    /// The suite was not set up with a kubelet (`Suite::with_kubelet`).
    #[error(
        "this suite runs no kubelet: use Suite::new().with_kubelet(..) or run_suite_with_kubelet"
    )]
    NotEnabled,
    /// The pod network is not available.
    #[error(transparent)]
    Network(#[from] NetworkError),
    /// The tool cache is unusable.
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// What was being done.
        what: String,
        /// The error.
        source: kube::Error,
    },
    /// The suite runs no node of that name.
    #[error("this suite runs no node {0:?}")]
    NoSuchNode(String),
    /// The pod runs without a cgroup (see [`cgroup`]).
    #[error("pod {namespace}/{pod} has no cgroup: {reason}")]
    NoCgroup {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Why.
        reason: String,
    },
    /// The kubelet runs no such pod.
    #[error("the kubelet runs no pod {namespace}/{pod}")]
    NoSuchPod {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
    },
    /// The pod has no such container, or it is not running.
    #[error("container {container:?} of pod {namespace}/{pod} is not running")]
    NotRunning {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Container name (empty: the first).
        container: String,
    },
    /// The pod has no such volume.
    #[error("pod {namespace}/{pod} has no volume {volume:?} (set up yet)")]
    NoSuchVolume {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Volume name.
        volume: String,
    },
}

/// What the kubelet and tests share about one pod: its IP, volume directories and processes.
#[derive(Debug, Default)]
pub(crate) struct PodInfo {
    pub(crate) ip: Option<Ipv4Addr>,
    pub(crate) volumes: BTreeMap<String, PathBuf>,
    /// Running container processes (init containers too), by container name.
    pub(crate) processes: BTreeMap<String, ManagedProcess>,
    /// Container names in spec order (not the init containers).
    pub(crate) containers: Vec<String>,
    /// Asked of the worker: end the pod for good with this `(reason, message)` (a graceful
    /// node shutdown, an eviction); taken by the worker.
    pub(crate) end: Option<(String, String)>,
    /// The worker ended the pod for good.
    pub(crate) ended: bool,
    /// The pod's cgroup (none where cgroups are unavailable).
    pub(crate) cgroup: Option<cgroup::PodCgroup>,
}

/// The log files of one pod's containers, kept after the pod is gone.
#[derive(Debug, Default)]
pub(crate) struct PodLogs {
    /// (container, log file): the init containers, then the containers, in spec order.
    pub(crate) files: Vec<(String, PathBuf)>,
    /// Index in [`Self::files`] of the first container (after the init containers).
    pub(crate) first_container: usize,
}

pub(crate) struct PodEntry {
    /// Order of arrival (the newest pod of a name wins lookups by name).
    pub(crate) seq: u64,
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) updates: tokio::sync::watch::Sender<PodUpdate>,
    pub(crate) info: Arc<Mutex<PodInfo>>,
    pub(crate) task: Option<tokio::task::JoinHandle<()>>,
}

/// State shared by the kubelet's tasks.
pub(crate) struct Shared {
    pub(crate) client: kube::Client,
    pub(crate) options: KubeletOptions,
    pub(crate) images: ImageMap,
    pub(crate) network: &'static PodNetwork,
    /// The node's IP (the pods' `hostIP`).
    pub(crate) node_ip: Ipv4Addr,
    pub(crate) dirs: KubeletDirs,
    pub(crate) log: KubeletLog,
    /// Pods by UID.
    pub(crate) pods: Mutex<BTreeMap<String, PodEntry>>,
    /// UIDs whose worker finished (late watch events for them are ignored).
    pub(crate) finished: Mutex<std::collections::BTreeSet<String>>,
    /// Container log files by (namespace, pod); kept after the pod is gone.
    pub(crate) logs: Mutex<BTreeMap<(String, String), PodLogs>>,
    pub(crate) shutting_down: AtomicBool,
    pub(crate) next_seq: std::sync::atomic::AtomicU64,
    /// How long a pull of an image starting with each prefix takes (none: images are local).
    pub(crate) pull_delays: Mutex<Vec<(String, Duration)>>,
    /// The refreshable volumes of the pods whose volumes are set up, by UID (see
    /// [`refresh`]).
    pub(crate) refreshable: Mutex<BTreeMap<String, refresh::PodVolumes>>,
    /// True while the kubelet is silenced ([`Kubelet::silence`]).
    pub(crate) silenced: tokio::sync::watch::Sender<bool>,
    /// Silences so far; a pod watch started in epoch N brings the pods' state up to date in
    /// epoch N only.
    pub(crate) silence_epoch: std::sync::atomic::AtomicU64,
    /// The epoch of the last pod watch that finished listing (`u64::MAX`: none yet). Until it
    /// is the current one workers write no status: theirs could be older than what the API
    /// holds (a pod deleted while the kubelet was silenced).
    pub(crate) listed_epoch: std::sync::atomic::AtomicU64,
}

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// How long a pull of `image` takes.
    pub(crate) fn pull_delay(&self, image: &str) -> Duration {
        lock(&self.pull_delays)
            .iter()
            .filter(|(prefix, _)| image.starts_with(prefix.as_str()))
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default()
    }

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }

    pub(crate) fn is_silenced(&self) -> bool {
        *self.silenced.borrow()
    }

    /// Whether workers may write pod status: not silenced, and the pods listed since the
    /// last resume.
    pub(crate) fn may_write_status(&self) -> bool {
        !self.is_silenced()
            && self.listed_epoch.load(Ordering::SeqCst) == self.silence_epoch.load(Ordering::SeqCst)
    }

    /// The newest pod `namespace/name` the kubelet runs.
    fn pod_info(&self, namespace: &str, name: &str) -> Result<Arc<Mutex<PodInfo>>, KubeletError> {
        lock(&self.pods)
            .values()
            .filter(|e| e.namespace == namespace && e.name == name)
            .max_by_key(|e| e.seq)
            .map(|e| e.info.clone())
            .ok_or_else(|| KubeletError::NoSuchPod {
                namespace: namespace.into(),
                pod: name.into(),
            })
    }

    /// Hands a watched pod to its worker, starting one for a new UID.
    fn dispatch(self: &Arc<Self>, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        if lock(&self.finished).contains(&uid) || self.is_shutting_down() {
            return;
        }
        let mut pods = lock(&self.pods);
        if let Some(entry) = pods.get(&uid) {
            entry
                .updates
                .send_replace(PodUpdate::Present(Box::new(pod)));
            return;
        }
        let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
        let entry = spawn_worker(self.clone(), pod, seq);
        pods.insert(uid, entry);
    }

    fn gone(&self, uid: &str) {
        if let Some(entry) = lock(&self.pods).get(uid) {
            entry.updates.send_replace(PodUpdate::Gone);
        }
    }
}

/// A running process kubelet. Dropping it stops every container process (SIGTERM, grace,
/// SIGKILL), releases the pod IPs and removes its directory (kept with
/// `ETCD_TESTS_KEEP_DIR=1`); processes also die with the test binary.
pub struct Kubelet {
    shared: Arc<Shared>,
    node: Node,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    dir: Mutex<Option<tempfile::TempDir>>,
    dir_path: PathBuf,
}

impl std::fmt::Debug for Kubelet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kubelet")
            .field("node", &self.shared.options.node_name)
            .field("dir", &self.dir_path)
            .finish_non_exhaustive()
    }
}

fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(DIR_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Some(pid) = std::fs::read_to_string(path.join(OWNER_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        else {
            continue;
        };
        let dead = matches!(
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
            Err(nix::errno::Errno::ESRCH)
        );
        if dead {
            let _ = std::fs::remove_dir_all(&path);
        }
    }
}

impl Kubelet {
    /// Registers the node and starts serving pods bound to it. Needs the pod network
    /// ([`netns::enter`], done by `Suite::with_kubelet`) and a tokio runtime.
    pub async fn start(
        client: kube::Client,
        options: KubeletOptions,
    ) -> Result<Self, KubeletError> {
        let network = netns::current()?;
        let images = options.images.clone();
        if options.etcd_images {
            let tools = match options.tools.clone() {
                Some(tools) => tools,
                None => Tools::from_env()?,
            };
            images.add_etcd_rule(tools);
        }
        sweep_stale_dirs();
        let io = |what: &str| {
            let what = what.to_owned();
            move |source| KubeletError::Io { what, source }
        };
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io("creating the kubelet directory"))?;
        let dir_path = dir.path().to_owned();
        std::fs::write(dir_path.join(OWNER_FILE), std::process::id().to_string())
            .map_err(io("writing the owner pid file"))?;
        let dirs = KubeletDirs {
            root: dir_path.clone(),
        };
        let log =
            KubeletLog::create(&dirs.kubelet_log()).map_err(io("creating the kubelet log"))?;
        let node_ip = if options.allocate_node_ip {
            tokio::task::spawn_blocking(move || network.allocate())
                .await
                .map_err(|e| KubeletError::Io {
                    what: "allocating the node IP".into(),
                    source: std::io::Error::other(e),
                })??
        } else {
            network.node_ip()
        };
        // From here on, an error must give the node IP back.
        let release_ip = |e: KubeletError| {
            if options.allocate_node_ip {
                let _ = network.release(node_ip);
            }
            e
        };

        let config = NodeConfig {
            name: options.node_name.clone(),
            labels: options.node_labels.clone(),
            ip: node_ip,
            capacity: options.capacity.clone(),
            kubelet_version: format!(
                "v{}",
                crate::tools::Versions::pinned()
                    .map(|v| v.kubernetes.clone())
                    .unwrap_or_default()
            ),
            pod_cidr: netns::POD_CIDR.into(),
        };
        let api = |what: &str| {
            let what = what.to_owned();
            move |source| KubeletError::Api { what, source }
        };
        let node = node::register(&client, &config)
            .await
            .map_err(api("registering the node"))
            .map_err(release_ip)?;
        node::renew_lease(&client, &node, options.heartbeat.lease_duration_seconds())
            .await
            .map_err(api("creating the node lease"))
            .map_err(release_ip)?;
        log.line(format_args!(
            "node {} registered ({node_ip}; pod network on {} ({:?}); pod cgroups: {})",
            config.name,
            network.interface(),
            network.interface_kind(),
            match cgroup::root() {
                Ok(root) => root.relative_path().to_owned(),
                Err(e) => e.to_string(),
            }
        ));

        let shared = Arc::new(Shared {
            client: client.clone(),
            options,
            images,
            network,
            node_ip,
            dirs,
            log: log.clone(),
            pods: Mutex::new(BTreeMap::new()),
            finished: Mutex::new(Default::default()),
            logs: Mutex::new(BTreeMap::new()),
            shutting_down: AtomicBool::new(false),
            next_seq: Default::default(),
            pull_delays: Mutex::new(Vec::new()),
            refreshable: Mutex::new(BTreeMap::new()),
            silenced: tokio::sync::watch::Sender::new(false),
            silence_epoch: Default::default(),
            listed_epoch: std::sync::atomic::AtomicU64::new(u64::MAX),
        });
        let heartbeat = heartbeat::Heartbeat {
            client: client.clone(),
            config: config.clone(),
            node: node.clone(),
            options: shared.options.heartbeat,
            silenced: shared.silenced.subscribe(),
            log: log.clone(),
        };
        let mut tasks = vec![
            tokio::spawn(heartbeat.run()),
            tokio::spawn(watch_pods(shared.clone())),
            tokio::spawn(watch_claims(shared.clone())),
            tokio::spawn(refresh::run(shared.clone())),
        ];
        if shared.options.bind_pods {
            tasks.push(tokio::spawn(node::bind_pending(client, config, log)));
        }
        Ok(Self {
            shared,
            node,
            tasks: Mutex::new(tasks),
            dir: Mutex::new(Some(dir)),
            dir_path,
        })
    }

    /// The node name.
    pub fn node_name(&self) -> &str {
        &self.shared.options.node_name
    }

    /// The Node as registered.
    pub fn node(&self) -> &Node {
        &self.node
    }

    /// The node IP (the pods' `hostIP`).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.shared.node_ip
    }

    /// The pod network.
    pub fn network(&self) -> &'static PodNetwork {
        self.shared.network
    }

    /// How often Secret and ConfigMap volume files are refreshed
    /// ([`KubeletOptions::volume_resync`]).
    pub fn volume_resync(&self) -> Duration {
        self.shared.options.volume_resync
    }

    /// The image rules; register more at any time.
    pub fn images(&self) -> &ImageMap {
        &self.shared.images
    }

    /// The kubelet's directory (pods, claims, logs, `kubelet.log`).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// The IP of pod `namespace/pod`, once allocated.
    pub fn pod_ip(&self, namespace: &str, pod: &str) -> Option<Ipv4Addr> {
        self.shared
            .pod_info(namespace, pod)
            .ok()
            .and_then(|info| lock(&info).ip)
    }

    /// The OS pid of the first container's process, if it runs.
    pub fn container_pid(&self, namespace: &str, pod: &str) -> Option<u32> {
        let info = self.shared.pod_info(namespace, pod).ok()?;
        let info = lock(&info);
        let first = info.containers.first()?;
        info.processes.get(first).map(ManagedProcess::pid)
    }

    /// SIGKILLs the first container of `namespace/pod`; the kubelet then restarts it per the
    /// pod's `restartPolicy`. Returns the killed pid.
    pub fn kill_container(&self, namespace: &str, pod: &str) -> Result<u32, KubeletError> {
        self.kill_named_container(namespace, pod, None)
    }

    /// SIGKILLs container `container` (`None`: the first container; an init container's name
    /// works while it runs) of `namespace/pod`.
    pub fn kill_named_container(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> Result<u32, KubeletError> {
        let info = self.shared.pod_info(namespace, pod)?;
        let mut info = lock(&info);
        let name = container
            .map(str::to_owned)
            .or_else(|| info.containers.first().cloned())
            .unwrap_or_default();
        let not_running = || KubeletError::NotRunning {
            namespace: namespace.into(),
            pod: pod.into(),
            container: name.clone(),
        };
        let process = info.processes.get_mut(&name).ok_or_else(not_running)?;
        if process.exit_status().is_some() {
            return Err(not_running());
        }
        process.signal(Signal::SIGKILL);
        let pid = process.pid();
        self.shared.log.line(format_args!(
            "fault injection: SIGKILL {namespace}/{pod}/{name} (pid {pid})"
        ));
        Ok(pid)
    }

    /// Makes the pulls of images starting with `prefix` take `delay` from now on (zero: no
    /// pull), as a slow registry or a large image does: a container waits in
    /// `ContainerCreating` ("Pulling image") and its pod stays `Pending` meanwhile. A pull is
    /// per container and image. A prefix of the test's own (a registry path with its namespace)
    /// keeps other tests' pulls instant.
    pub fn set_image_pull_delay(&self, prefix: &str, delay: Duration) {
        let mut delays = lock(&self.shared.pull_delays);
        delays.retain(|(p, _)| p != prefix);
        if !delay.is_zero() {
            delays.push((prefix.to_owned(), delay));
        }
        self.shared.log.line(format_args!(
            "fault injection: pulls of {prefix}* take {delay:?}"
        ));
    }

    /// Ends pod `namespace/pod` for good as a kubelet does when it evicts a pod or shuts its
    /// node down: its containers get SIGTERM (SIGKILL after the pod's grace period), are not
    /// restarted whatever the `restartPolicy`, and the pod turns `Failed` with `reason` and
    /// `message`; its IP and its emptyDir volumes are released (a claim keeps its data). The pod
    /// stays in the API until someone deletes it (bare pods are never restarted).
    pub fn end_pod(
        &self,
        namespace: &str,
        pod: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), KubeletError> {
        let info = self.shared.pod_info(namespace, pod)?;
        lock(&info).end = Some((reason.to_owned(), message.to_owned()));
        self.shared.log.line(format_args!(
            "fault injection: ending {namespace}/{pod} ({reason}: {message})"
        ));
        Ok(())
    }

    /// A graceful shutdown of the node that runs the pods of `namespace` (the kubelet's
    /// `shutdownGracePeriod`), after which the node comes back: every pod of that namespace ends
    /// `Failed` with reason `Terminated` and the kubelet's message, as [`Self::end_pod`] does;
    /// pods created afterwards run as usual (other namespaces' pods, which other tests own, are
    /// left alone). Returns the pods ended, once each has stopped.
    pub async fn shut_down_gracefully(&self, namespace: &str) -> Result<Vec<String>, KubeletError> {
        let entries: Vec<(String, Arc<Mutex<PodInfo>>)> = lock(&self.shared.pods)
            .values()
            .filter(|e| e.namespace == namespace)
            .map(|e| (e.name.clone(), e.info.clone()))
            .collect();
        self.shared.log.line(format_args!(
            "fault injection: graceful shutdown of the node of {namespace}/ ({} pods)",
            entries.len()
        ));
        for (_, info) in &entries {
            lock(info).end = Some((
                NODE_SHUTDOWN_REASON.to_owned(),
                NODE_SHUTDOWN_MESSAGE.to_owned(),
            ));
        }
        let deadline =
            Instant::now() + self.shared.options.shutdown_grace + Duration::from_secs(60);
        for (_, info) in &entries {
            while !lock(info).ended && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(entries.into_iter().map(|(name, _)| name).collect())
    }

    /// The host directory of volume `volume` of `namespace/pod`.
    pub fn volume_dir(
        &self,
        namespace: &str,
        pod: &str,
        volume: &str,
    ) -> Result<PathBuf, KubeletError> {
        let info = self.shared.pod_info(namespace, pod)?;
        lock(&info)
            .volumes
            .get(volume)
            .cloned()
            .ok_or_else(|| KubeletError::NoSuchVolume {
                namespace: namespace.into(),
                pod: pod.into(),
                volume: volume.into(),
            })
    }

    /// Deletes the contents of volume `volume` of `namespace/pod` (a lost disk). Running
    /// processes keep the files they have open: to simulate a member losing its disk, call
    /// [`Self::kill_container`] right after (the restart has a back-off of at least
    /// [`KubeletOptions::initial_backoff`], so it finds the volume empty).
    pub fn wipe_data(
        &self,
        namespace: &str,
        pod: &str,
        volume: &str,
    ) -> Result<PathBuf, KubeletError> {
        let dir = self.volume_dir(namespace, pod, volume)?;
        volumes::wipe_contents(&dir).map_err(|source| KubeletError::Io {
            what: format!("wiping {}", dir.display()),
            source,
        })?;
        self.shared.log.line(format_args!(
            "fault injection: wiped volume {volume} of {namespace}/{pod} ({})",
            dir.display()
        ));
        Ok(dir)
    }

    /// The directory of claim `namespace/claim` (exists once a pod mounted it).
    pub fn claim_dir(&self, namespace: &str, claim: &str) -> PathBuf {
        self.shared.dirs.claim_dir(namespace, claim)
    }

    /// The log file of container `container` (an init container or a container; `None`: the
    /// first container) of the newest pod `namespace/pod` this kubelet ran (kept after the pod
    /// is gone). Restarts append to it.
    pub fn container_log_path(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> Result<PathBuf, KubeletError> {
        let logs = lock(&self.shared.logs);
        let containers = logs
            .get(&(namespace.to_owned(), pod.to_owned()))
            .ok_or_else(|| KubeletError::NoSuchPod {
                namespace: namespace.into(),
                pod: pod.into(),
            })?;
        let path = match container {
            Some(c) => containers.files.iter().find(|(name, _)| name == c),
            None => containers.files.get(containers.first_container),
        };
        path.map(|(_, path)| path.clone())
            .ok_or_else(|| KubeletError::NotRunning {
                namespace: namespace.into(),
                pod: pod.into(),
                container: container.unwrap_or_default().into(),
            })
    }

    /// The whole log of the first container of `namespace/pod` (every restart).
    pub fn container_log(&self, namespace: &str, pod: &str) -> Result<String, KubeletError> {
        let path = self.container_log_path(namespace, pod, None)?;
        std::fs::read_to_string(&path).map_err(|source| KubeletError::Io {
            what: format!("reading {}", path.display()),
            source,
        })
    }

    /// The kubelet log's lines about `namespace` (all lines for `None`) and the last `lines`
    /// lines of each container log of that namespace, each under a header.
    pub fn log_tails(&self, namespace: Option<&str>, lines: usize) -> String {
        let log_path = self.shared.log.path();
        let kubelet: Vec<String> = std::fs::read_to_string(log_path)
            .unwrap_or_default()
            .lines()
            .filter(|l| namespace.is_none_or(|ns| l.contains(&format!("{ns}/"))))
            .map(str::to_owned)
            .collect();
        let mut out = format!(
            "----- last {lines} lines of the kubelet log ({}) -----\n{}\n",
            log_path.display(),
            kubelet[kubelet.len().saturating_sub(lines)..].join("\n")
        );
        for ((ns, pod), containers) in lock(&self.shared.logs).iter() {
            if namespace.is_some_and(|n| n != ns) {
                continue;
            }
            for (container, path) in &containers.files {
                out.push_str(&format!(
                    "----- last {lines} lines of container {ns}/{pod}/{container} ({}) -----\n{}\n",
                    path.display(),
                    log_tail(path, lines)
                ));
            }
        }
        out
    }

    /// Stops every container process (SIGTERM, up to [`KubeletOptions::shutdown_grace`],
    /// SIGKILL), releases the pod IPs and hosts entries, stops the kubelet's tasks and removes
    /// its directory. Pods stay in the API. Idempotent; `Drop` calls it.
    pub fn shutdown(&self) {
        if self.shared.shutting_down.swap(true, Ordering::SeqCst) {
            return;
        }
        for task in lock(&self.tasks).drain(..) {
            task.abort();
        }
        let entries: Vec<(String, PodEntry)> = std::mem::take(&mut *lock(&self.shared.pods))
            .into_iter()
            .collect();
        for (_, entry) in &entries {
            if let Some(task) = &entry.task {
                task.abort();
            }
            for process in lock(&entry.info).processes.values_mut() {
                process.signal_term();
            }
        }
        let deadline = Instant::now() + self.shared.options.shutdown_grace;
        for (uid, entry) in &entries {
            let mut info = lock(&entry.info);
            for process in info.processes.values_mut() {
                process.wait_or_kill(deadline);
            }
            info.processes.clear();
            if let Some(ip) = info.ip.take() {
                let _ = self.shared.network.release(ip);
            }
            if let Some(cgroup) = info.cgroup.take() {
                cgroup.kill_all();
                let _ = cgroup.remove();
            }
            let _ = self.shared.network.remove_hosts_entry(uid);
        }
        if self.shared.options.allocate_node_ip {
            let _ = self.shared.network.release(self.shared.node_ip);
        }
        let dir = lock(&self.dir).take();
        if let Some(dir) = dir
            && std::env::var(crate::control_plane::KEEP_DIR_ENV).is_ok_and(|v| v == "1")
        {
            let _ = std::fs::remove_file(dir.path().join(OWNER_FILE));
            eprintln!("etcd-tests: kept {}", dir.keep().display());
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Watches the pods bound to the node and hands each to its worker. While the kubelet is
/// silenced the watch is dropped (as a partitioned kubelet's breaks): deletions and new pods go
/// unnoticed. On resume a new watch lists the pods: workers of pods no longer listed (deleted
/// meanwhile, force-deleted too) are told they are gone, pods being deleted are stopped, new
/// pods start.
async fn watch_pods(shared: Arc<Shared>) {
    let mut silenced = shared.silenced.subscribe();
    loop {
        while *silenced.borrow_and_update() {
            if silenced.changed().await.is_err() {
                return;
            }
        }
        let epoch = shared.silence_epoch.load(Ordering::SeqCst);
        let pods: Api<Pod> = Api::all(shared.client.clone());
        let selector = format!("spec.nodeName={}", shared.options.node_name);
        let stream =
            watcher::watcher(pods, watcher::Config::default().fields(&selector)).default_backoff();
        futures::pin_mut!(stream);
        // UIDs listed since the last (re)list: workers of pods not in it are gone.
        let mut listing: Option<std::collections::BTreeSet<String>> = None;
        loop {
            // The silence first: an event that arrived after it must go unnoticed.
            let event = tokio::select! {
                biased;
                changed = silenced.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if *silenced.borrow_and_update() {
                        shared.log.line(format_args!("pod watch dropped (silenced)"));
                        break;
                    }
                    continue;
                }
                event = stream.next() => match event {
                    Some(event) => event,
                    None => return,
                },
            };
            if shared.is_silenced() {
                shared
                    .log
                    .line(format_args!("pod watch dropped (silenced)"));
                break;
            }
            match event {
                Ok(Event::Apply(pod)) => shared.dispatch(pod),
                Ok(Event::InitApply(pod)) => {
                    if let (Some(seen), Some(uid)) = (listing.as_mut(), pod.metadata.uid.clone()) {
                        seen.insert(uid);
                    }
                    shared.dispatch(pod);
                }
                Ok(Event::Delete(pod)) => {
                    if let Some(uid) = pod.metadata.uid.as_deref() {
                        shared.gone(uid);
                    }
                }
                Ok(Event::Init) => listing = Some(Default::default()),
                Ok(Event::InitDone) => {
                    if let Some(seen) = listing.take() {
                        let known: Vec<String> = lock(&shared.pods).keys().cloned().collect();
                        for uid in known.iter().filter(|u| !seen.contains(*u)) {
                            shared.gone(uid);
                        }
                    }
                    shared.listed_epoch.store(epoch, Ordering::SeqCst);
                }
                Err(e) => shared.log.line(format_args!("pod watch: {e}")),
            }
        }
    }
}

/// Deletes the PV and directory of claims that are deleted.
async fn watch_claims(shared: Arc<Shared>) {
    let claims: Api<PersistentVolumeClaim> = Api::all(shared.client.clone());
    let stream = watcher::watcher(claims, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        match event {
            Ok(Event::Delete(claim)) => {
                volumes::forget_claim(&shared.client, &shared.dirs, &claim).await;
                shared.log.line(format_args!(
                    "claim {}/{} deleted: removed its volume",
                    claim.metadata.namespace.as_deref().unwrap_or_default(),
                    claim.metadata.name.as_deref().unwrap_or_default()
                ));
            }
            Ok(_) => {}
            Err(e) => shared.log.line(format_args!("claim watch: {e}")),
        }
    }
}
