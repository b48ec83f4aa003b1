//! One worker task per pod: network, volumes, init containers (one at a time, in order, each
//! to completion), container processes (start, exit, restart with back-off, in-place image
//! change), probes, status, and termination.
//!
//! Init containers and containers are one list ([`Worker::containers`], init containers
//! first), so both go through the same start, exit, back-off and status code; only the order
//! they run in ([`Worker::run_init_containers`]) and the restart verdict differ: an init
//! container is restarted only when it failed (and `restartPolicy` is not `Never`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerStateTerminated, Pod, PodCondition, Secret,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use tokio::sync::{mpsc, watch};

use super::container::{ContainerRt, Instance, exit_code};
use super::expand::{self, EnvSources, MountMap};
use super::images::ImageMapping;
use super::probes::{self, ExecContext, ProbeEvent, ProbeKind, ProbeTarget};
use super::refresh::{self, PodVolumes};
use super::status::{self, PodView};
use super::volumes;
use super::{PodEntry, PodInfo, PodLogs, Shared, lock};
use crate::process::ManagedProcess;

/// A container's `terminationMessagePath` when its spec sets none (Kubernetes' default).
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// Longest termination message kept, bytes (Kubernetes' limit per container).
const TERMINATION_MESSAGE_BYTES: usize = 4096;

/// How often the worker checks its processes and timers.
const TICK: Duration = Duration::from_millis(50);
/// How long the worker waits for the processes of a pod's cgroup to be gone.
const CGROUP_REMOVAL: Duration = Duration::from_secs(2);
/// Retry interval for volumes and container configuration that cannot be set up yet.
const CONFIG_RETRY: Duration = Duration::from_secs(1);
/// Where service-account credentials are mounted (the ServiceAccount admission plugin's
/// projected volume); in-cluster clients read this path.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// PATH of a typical container image.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the pod watcher tells a worker.
#[derive(Debug, Clone)]
pub(crate) enum PodUpdate {
    /// The pod's latest version.
    Present(Box<Pod>),
    /// The pod is gone from the API.
    Gone,
}

/// Starts the worker of `pod` and returns its registry entry.
pub(crate) fn spawn_worker(shared: Arc<Shared>, pod: Pod, seq: u64) -> PodEntry {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let init_specs: Vec<Container> = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.clone())
        .unwrap_or_default();
    let specs: Vec<Container> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.clone())
        .unwrap_or_default();
    let info = Arc::new(Mutex::new(PodInfo {
        containers: specs.iter().map(|c| c.name.clone()).collect(),
        ..PodInfo::default()
    }));
    let log_dir = shared.dirs.log_dir(&namespace, &name, &uid);
    let logs = PodLogs {
        files: init_specs
            .iter()
            .chain(&specs)
            .map(|c| (c.name.clone(), log_dir.join(format!("{}.log", c.name))))
            .collect(),
        first_container: init_specs.len(),
    };
    lock(&shared.logs).insert((namespace.clone(), name.clone()), logs);
    let init_count = init_specs.len();
    // As a kubelet reports them: everything waits with PodInitializing in a pod that has init
    // containers.
    let waiting = if init_count == 0 {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let (updates, receiver) = watch::channel(PodUpdate::Present(Box::new(pod.clone())));
    let (probe_tx, probe_rx) = mpsc::unbounded_channel();
    let initial_backoff = shared.options.initial_backoff;
    let worker = Worker {
        shared,
        namespace: namespace.clone(),
        name: name.clone(),
        uid,
        containers: init_specs
            .into_iter()
            .chain(specs)
            .map(|spec| ContainerRt::new(spec, initial_backoff, waiting))
            .collect(),
        init_count,
        initialized: false,
        pod,
        info: info.clone(),
        updates: receiver,
        probe_tx,
        probe_rx,
        log_dir,
        start_time: Timestamp::now(),
        ip: None,
        sandbox_ready: false,
        volumes: BTreeMap::new(),
        atomic_volumes: BTreeSet::new(),
        pod_message: None,
        next_setup: Instant::now(),
        last_patch: None,
        last_conditions: Vec::new(),
        generation: 0,
        ended: None,
    };
    let task = tokio::spawn(worker.run());
    PodEntry {
        seq,
        namespace,
        name,
        updates,
        info,
        task: Some(task),
    }
}

struct Worker {
    shared: Arc<Shared>,
    namespace: String,
    name: String,
    uid: String,
    pod: Pod,
    /// The init containers (the first [`Self::init_count`]), then the containers, in spec
    /// order; indexes into it identify a container everywhere (probes too).
    containers: Vec<ContainerRt>,
    /// How many of [`Self::containers`] are init containers.
    init_count: usize,
    /// Every init container completed (they are not run again).
    initialized: bool,
    info: Arc<Mutex<PodInfo>>,
    updates: watch::Receiver<PodUpdate>,
    probe_tx: mpsc::UnboundedSender<ProbeEvent>,
    probe_rx: mpsc::UnboundedReceiver<ProbeEvent>,
    log_dir: PathBuf,
    start_time: Timestamp,
    ip: Option<Ipv4Addr>,
    sandbox_ready: bool,
    volumes: BTreeMap<String, PathBuf>,
    /// The volumes in the atomic-writer layout (their `subPath` mounts are copies).
    atomic_volumes: BTreeSet<String>,
    pod_message: Option<String>,
    next_setup: Instant,
    last_patch: Option<serde_json::Value>,
    last_conditions: Vec<PodCondition>,
    generation: u64,
    /// The kubelet ended the pod for good: `(reason, message)` of its Failed status.
    ended: Option<(String, String)>,
}

/// Why the worker's loop ended.
enum End {
    /// The pod has a deletionTimestamp: stop, clean up, delete it with grace 0.
    Deleted,
    /// The pod is gone from the API: stop and clean up.
    Gone,
    /// The kubelet is shutting down (it stops the processes itself).
    Shutdown,
}

impl Worker {
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn log(&self, args: std::fmt::Arguments<'_>) {
        self.shared.log.line(format_args!("{}: {args}", self.key()));
    }

    fn restart_policy(&self) -> &str {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.restart_policy.as_deref())
            .unwrap_or("Always")
    }

    fn grace(&self) -> Duration {
        let seconds = self
            .pod
            .metadata
            .deletion_grace_period_seconds
            .or_else(|| {
                self.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.termination_grace_period_seconds)
            })
            .unwrap_or(30);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    }

    async fn run(mut self) {
        self.log(format_args!("accepted (uid {})", self.uid));
        self.set_up_network().await;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut fresh = true;
        let end = loop {
            if self.shared.is_shutting_down() {
                break End::Shutdown;
            }
            if std::mem::take(&mut fresh) {
                let update = self.updates.borrow_and_update().clone();
                match update {
                    PodUpdate::Gone => break End::Gone,
                    PodUpdate::Present(pod) => {
                        let deleting = pod.metadata.deletion_timestamp.is_some();
                        self.apply_update(*pod).await;
                        if deleting {
                            break End::Deleted;
                        }
                    }
                }
            }
            let end = lock(&self.info).end.take();
            if let Some(end) = end
                && self.ended.is_none()
            {
                self.end(end).await;
            }
            if self.ended.is_none() {
                self.step().await;
            }
            self.publish_status().await;
            tokio::select! {
                _ = tick.tick() => {}
                changed = self.updates.changed() => {
                    if changed.is_err() {
                        break End::Shutdown;
                    }
                    fresh = true;
                }
                Some(event) = self.probe_rx.recv() => self.on_probe(event).await,
            }
        };
        match end {
            End::Shutdown => {}
            End::Gone | End::Deleted => self.terminate(matches!(end, End::Deleted)).await,
        }
    }

    async fn set_up_network(&mut self) {
        let network = self.shared.network;
        let ip = match tokio::task::spawn_blocking(move || network.allocate()).await {
            Ok(Ok(ip)) => ip,
            Ok(Err(e)) => {
                self.pod_message = Some(format!("cannot allocate a pod IP: {e}"));
                self.log(format_args!("cannot allocate a pod IP: {e}"));
                return;
            }
            Err(e) => {
                self.pod_message = Some(format!("cannot allocate a pod IP: {e}"));
                return;
            }
        };
        self.ip = Some(ip);
        lock(&self.info).ip = Some(ip);
        match super::cgroup::root().and_then(|root| root.create(&self.uid)) {
            Ok(cgroup) => {
                network.set_pod_cgroup(ip, cgroup.relative_path());
                lock(&self.info).cgroup = Some(cgroup);
            }
            // Logged once per kubelet at registration when cgroups are unavailable.
            Err(super::cgroup::CgroupError::Unavailable(_)) => {}
            Err(e) => self.log(format_args!("no pod cgroup: {e}")),
        }
        let names = self.dns_names();
        if !names.is_empty()
            && let Err(e) = network.set_hosts_entry(&self.uid, ip, &names)
        {
            self.log(format_args!("writing /etc/hosts: {e}"));
        }
        self.log(format_args!("pod IP {ip}, names {names:?}"));
    }

    /// `HOSTNAME.SUBDOMAIN.NS.svc.DOMAIN` (and without the domain) for pods with both.
    fn dns_names(&self) -> Vec<String> {
        let spec = self.pod.spec.as_ref();
        let hostname = spec
            .and_then(|s| s.hostname.as_deref())
            .filter(|h| !h.is_empty());
        let subdomain = spec
            .and_then(|s| s.subdomain.as_deref())
            .filter(|s| !s.is_empty());
        match (hostname, subdomain) {
            (Some(h), Some(s)) => {
                let short = format!("{h}.{s}.{}.svc", self.namespace);
                vec![
                    format!("{short}.{}", self.shared.options.cluster_domain),
                    short,
                ]
            }
            _ => Vec::new(),
        }
    }

    fn env_sources_base(&self) -> EnvSources {
        EnvSources {
            pod_ip: self.ip.map(|ip| ip.to_string()),
            host_ip: Some(self.shared.node_ip.to_string()),
            ..EnvSources::default()
        }
    }

    /// Takes a new version of the pod: a changed image restarts that container (a running init
    /// container too; one that completed is not run again).
    async fn apply_update(&mut self, pod: Pod) {
        let specs: Vec<Container> = pod
            .spec
            .as_ref()
            .map(|s| {
                s.init_containers
                    .iter()
                    .flatten()
                    .chain(&s.containers)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        self.notice_status_drift(&pod);
        self.pod = pod;
        for spec in specs {
            // Names are unique across init containers and containers.
            let Some(index) = self.containers.iter().position(|c| c.name() == spec.name) else {
                continue;
            };
            let (changed, running, finished) = {
                let c = &mut self.containers[index];
                let changed = c.spec.image != spec.image;
                c.spec = spec;
                if changed {
                    c.pull_failures = 0;
                    c.next_attempt = Instant::now();
                }
                (changed, c.running.is_some(), c.finished.is_some())
            };
            if !changed {
                continue;
            }
            let new_image = self.containers[index].image();
            if running {
                self.log(format_args!(
                    "container {} image changed to {new_image}: restarting it",
                    self.containers[index].name()
                ));
                let grace = self.grace();
                self.stop_container(index, grace).await;
                // Restart right away whatever the restart policy, without back-off: the
                // definition changed, the container did not crash (as a kubelet does).
                self.reap(index, false);
                self.containers[index].next_attempt = Instant::now();
            } else if !finished {
                self.containers[index].waiting = ("ContainerCreating".into(), None);
            }
        }
    }

    /// Volumes, then init container starts and exits, then container starts and exits.
    async fn step(&mut self) {
        let sidecars: Vec<&str> = self.containers[..self.init_count]
            .iter()
            .filter(|c| c.spec.restart_policy.as_deref() == Some("Always"))
            .map(ContainerRt::name)
            .collect();
        if !sidecars.is_empty() {
            // Running the pod without its sidecars would hide the gap: stay Pending.
            self.pod_message = Some(format!(
                "sidecar containers (init containers with restartPolicy Always: {}) are not \
                 supported by the etcd-tests kubelet",
                sidecars.join(", ")
            ));
            return;
        }
        if !self.sandbox_ready {
            if self.ip.is_none() || Instant::now() < self.next_setup {
                return;
            }
            let sources = self.env_sources_base();
            match volumes::prepare(&self.shared.client, &self.shared.dirs, &self.pod, &sources)
                .await
            {
                Ok(prepared) => {
                    lock(&self.info).volumes = prepared.dirs.clone();
                    self.volumes = prepared.dirs;
                    self.atomic_volumes = prepared.atomic;
                    refresh::register(
                        &self.shared,
                        &self.uid,
                        PodVolumes {
                            namespace: self.namespace.clone(),
                            name: self.name.clone(),
                            volumes: prepared.refreshable,
                        },
                    );
                    self.sandbox_ready = true;
                    self.pod_message = None;
                    if let Err(e) = std::fs::create_dir_all(&self.log_dir) {
                        self.log(format_args!("creating {}: {e}", self.log_dir.display()));
                    }
                }
                Err(e) => {
                    let message = format!("MountVolume.SetUp failed: {e}");
                    if self.pod_message.as_deref() != Some(&message) {
                        self.log(format_args!("{message}"));
                    }
                    self.pod_message = Some(message);
                    self.next_setup = Instant::now() + CONFIG_RETRY;
                    return;
                }
            }
        }
        if !self.run_init_containers().await {
            return;
        }
        for index in self.init_count..self.containers.len() {
            if self.containers[index].running.is_some() {
                self.reap(index, true);
            } else if self.containers[index].finished.is_none()
                && Instant::now() >= self.containers[index].next_attempt
            {
                self.start_container(index).await;
            }
        }
    }

    /// Runs the init containers one at a time, in spec order, each to completion: notices the
    /// exit of the one running, starts the next (or restarts a failed one after its back-off).
    /// True once all completed; false while one runs or waits, and for good once one failed
    /// with `restartPolicy: Never` (the pod is Failed; its containers never start).
    async fn run_init_containers(&mut self) -> bool {
        if self.initialized {
            return true;
        }
        for index in 0..self.init_count {
            if self.containers[index].running.is_some() {
                self.reap(index, true);
            }
            let c = &self.containers[index];
            if c.completed() {
                continue;
            }
            if c.running.is_none() && c.finished.is_none() && Instant::now() >= c.next_attempt {
                self.start_container(index).await;
            }
            return false;
        }
        self.initialized = true;
        if self.init_count > 0 {
            self.log(format_args!(
                "init containers completed: starting the containers"
            ));
        }
        true
    }

    /// Notices the exit of container `index` (if it exited) and decides about the restart.
    /// `crashed == false` means the kubelet stopped it on purpose (image change, pod
    /// termination): no back-off, no restart-policy verdict; the caller decides what follows.
    fn reap(&mut self, index: usize, crashed: bool) {
        let name = self.containers[index].name().to_owned();
        let status = {
            let mut info = lock(&self.info);
            let exited = info
                .processes
                .get_mut(&name)
                .map_or(Some(None), |p| p.exit_status().map(Some));
            if exited.is_some() {
                info.processes.remove(&name);
            }
            exited
        };
        let Some(status) = status else { return };
        // Dropping the instance (at the end of this function) stops its probes.
        let Some(instance) = self.containers[index].running.take() else {
            return;
        };
        let (code, signal) = status.map_or((-1, None), exit_code);
        let terminated = ContainerStateTerminated {
            exit_code: code,
            signal,
            reason: Some(if code == 0 { "Completed" } else { "Error" }.into()),
            message: self.termination_message(&name),
            started_at: Some(Time(instance.started_at)),
            finished_at: Some(Time(Timestamp::now())),
            container_id: Some(instance.container_id.clone()),
        };
        let init = index < self.init_count;
        // An init container that completed is done for the life of the pod, whatever the
        // restart policy; a failed one is retried unless the policy is Never.
        let restart = match self.restart_policy() {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => !init || code != 0,
        };
        let options = &self.shared.options;
        let pod_key = self.key();
        let c = &mut self.containers[index];
        let ran = instance.started_instant.elapsed();
        if crashed && !restart {
            c.finished = Some(terminated);
        } else {
            c.last_terminated = Some(terminated);
        }
        if crashed && restart {
            if ran >= options.backoff_reset {
                c.backoff = options.initial_backoff;
            }
            c.next_attempt = Instant::now() + c.backoff;
            c.waiting = (
                "CrashLoopBackOff".into(),
                Some(format!(
                    "back-off {:?} restarting failed container={name} pod={}",
                    c.backoff, self.name
                )),
            );
            c.backoff = (c.backoff * 2).min(options.max_backoff);
        }
        self.shared.log.line(format_args!(
            "{pod_key}: {}container {name} exited with {code}{} after {ran:?}{}",
            if init { "init " } else { "" },
            signal.map(|s| format!(" (signal {s})")).unwrap_or_default(),
            match (crashed, restart) {
                (false, _) => "; stopped by the kubelet",
                (true, true) => "; restarting after back-off",
                (true, false) if init && code == 0 => "; completed",
                (true, false) if init => "; not restarting (restartPolicy): the pod failed",
                (true, false) => "; not restarting (restartPolicy)",
            }
        ));
    }

    /// Fetches the ConfigMaps and Secrets the container's environment refers to.
    async fn env_sources(&self, container: &Container) -> Result<EnvSources, kube::Error> {
        let mut sources = self.env_sources_base();
        let (maps, secrets) = expand::env_references(container);
        let map_api: Api<ConfigMap> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        for name in maps {
            let map = map_api.get_opt(&name).await?;
            sources.config_maps.insert(name, map);
        }
        let secret_api: Api<Secret> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        for name in secrets {
            let secret = secret_api.get_opt(&name).await?;
            sources.secrets.insert(name, secret);
        }
        Ok(sources)
    }

    fn base_env(&self) -> Vec<(String, String)> {
        let hostname = self
            .pod
            .spec
            .as_ref()
            .and_then(|s| s.hostname.clone())
            .unwrap_or_else(|| self.name.clone());
        let mut env = vec![
            ("PATH".to_owned(), CONTAINER_PATH.to_owned()),
            ("HOSTNAME".to_owned(), hostname),
            (
                "HOME".to_owned(),
                self.shared
                    .dirs
                    .pod_dir(&self.uid)
                    .to_string_lossy()
                    .into_owned(),
            ),
        ];
        if let Some(url) = &self.shared.options.apiserver_url
            && let Ok(uri) = url.parse::<http::Uri>()
            && let Some(host) = uri.host()
        {
            let port = uri.port_u16().unwrap_or(443).to_string();
            env.extend([
                ("KUBERNETES_SERVICE_HOST".to_owned(), host.to_owned()),
                ("KUBERNETES_SERVICE_PORT".to_owned(), port.clone()),
                ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), port.clone()),
                ("KUBERNETES_PORT".to_owned(), format!("tcp://{host}:{port}")),
            ]);
        }
        env
    }

    /// The host file standing for container `name`'s `terminationMessagePath`.
    fn termination_file(&self, name: &str) -> PathBuf {
        self.shared
            .dirs
            .pod_dir(&self.uid)
            .join("termination")
            .join(name)
    }

    /// What the container's last instance wrote to its `terminationMessagePath` (at most
    /// 4096 bytes, as a kubelet keeps), if anything.
    fn termination_message(&self, name: &str) -> Option<String> {
        let bytes = std::fs::read(self.termination_file(name)).ok()?;
        let mut end = bytes.len().min(TERMINATION_MESSAGE_BYTES);
        while end > 0 && std::str::from_utf8(&bytes[..end]).is_err() {
            end -= 1;
        }
        let text = String::from_utf8_lossy(&bytes[..end]).into_owned();
        (!text.is_empty()).then_some(text)
    }

    /// `mountPath` → host directory (with `subPath`) for the container's mounts, and the
    /// container's `terminationMessagePath` (default `/dev/termination-log`) → a fresh host
    /// file the kubelet reads when the container exits (see [`Self::termination_message`]):
    /// a program that is given the path, as an argument, writes its message there.
    fn mounts(&self, container: &Container) -> Result<MountMap, String> {
        let termination = self.termination_file(&container.name);
        if let Some(dir) = termination.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        // A new instance starts without the message of the one before.
        let _ = std::fs::remove_file(&termination);
        let mut pairs = vec![(
            container
                .termination_message_path
                .clone()
                .filter(|p| !p.is_empty())
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.to_owned()),
            termination,
        )];
        for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
            let Some(dir) = self.volumes.get(&mount.name) else {
                return Err(format!("volumeMount {:?}: no such volume", mount.name));
            };
            let dir = match mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
                // A copy (a kubelet bind-mounts the file of the version current at the start).
                Some(sub) if self.atomic_volumes.contains(&mount.name) => {
                    let dest = self
                        .shared
                        .dirs
                        .pod_dir(&self.uid)
                        .join("volume-subpaths")
                        .join(&mount.name)
                        .join(&container.name)
                        .join(index.to_string());
                    volumes::snapshot_sub_path(dir, sub, &dest)
                        .map_err(|e| format!("subPath {sub:?} of volume {}: {e}", mount.name))?
                }
                Some(sub) => {
                    let path = dir.join(sub.trim_start_matches('/'));
                    if !path.exists() {
                        std::fs::create_dir_all(&path)
                            .map_err(|e| format!("creating subPath {}: {e}", path.display()))?;
                    }
                    path
                }
                None => dir.clone(),
            };
            pairs.push((mount.mount_path.clone(), dir));
        }
        Ok(MountMap::new(pairs))
    }

    /// In-cluster clients read their credentials from [`SERVICE_ACCOUNT_DIR`], a path that
    /// cannot be rewritten inside a program. When the container mounts a service-account
    /// token there (and sets no `KUBECONFIG`), a kubeconfig using that token file and CA is
    /// written next to them and `KUBECONFIG` points to it: kube-rs, client-go and kubectl all
    /// prefer `KUBECONFIG` over the in-cluster files. Returns its path.
    fn service_account_kubeconfig(
        &self,
        mounts: &MountMap,
        env: &[(String, String)],
    ) -> Option<String> {
        let server = self.shared.options.apiserver_url.as_deref()?;
        if env.iter().any(|(k, _)| k == "KUBECONFIG") {
            return None;
        }
        let dir = mounts
            .mounts()
            .iter()
            .find(|(m, _)| m == SERVICE_ACCOUNT_DIR)
            .map(|(_, d)| d.clone())?;
        let token = dir.join("token");
        if !token.is_file() {
            return None;
        }
        let kubeconfig = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{ "name": "in-cluster", "cluster": {
                "server": server,
                "certificate-authority": dir.join("ca.crt"),
            }}],
            "users": [{ "name": "service-account", "user": { "tokenFile": token } }],
            "contexts": [{ "name": "in-cluster", "context": {
                "cluster": "in-cluster",
                "user": "service-account",
                "namespace": self.namespace,
            }}],
            "current-context": "in-cluster",
        });
        let path = dir.join("kubeconfig");
        match std::fs::write(&path, kubeconfig.to_string()) {
            Ok(()) => Some(path.to_string_lossy().into_owned()),
            Err(e) => {
                self.log(format_args!("writing {}: {e}", path.display()));
                None
            }
        }
    }

    fn wait(&mut self, index: usize, reason: &str, message: String, retry: Duration) {
        let c = &mut self.containers[index];
        let changed = c.waiting.0 != reason || c.waiting.1.as_deref() != Some(&message);
        if changed {
            self.shared.log.line(format_args!(
                "{}/{}: container {}: {reason}: {message}",
                self.namespace,
                self.name,
                c.name()
            ));
        }
        c.waiting = (reason.to_owned(), Some(message));
        c.next_attempt = Instant::now() + retry;
    }

    /// Resolves the image, environment and command line of container `index`, and starts it.
    async fn start_container(&mut self, index: usize) {
        let spec = self.containers[index].spec.clone();
        let image = self.containers[index].image();
        let mapping: ImageMapping = match self.shared.images.resolve(&image) {
            Ok(mapping) => mapping,
            Err(e) => {
                let c = &mut self.containers[index];
                c.pull_failures += 1;
                let retry = (self.shared.options.initial_backoff
                    * 2u32.saturating_pow(c.pull_failures.min(8)))
                .min(self.shared.options.max_backoff);
                let reason = if c.pull_failures == 1 {
                    "ErrImagePull"
                } else {
                    "ImagePullBackOff"
                };
                self.wait(index, reason, e.to_string(), retry);
                return;
            }
        };
        self.containers[index].pull_failures = 0;
        let delay = self.shared.pull_delay(&image);
        if !delay.is_zero() && self.containers[index].pulled.as_deref() != Some(image.as_str()) {
            let until = match &self.containers[index].pulling {
                Some((pulling, until)) if *pulling == image => *until,
                _ => {
                    let until = Instant::now() + delay;
                    self.containers[index].pulling = Some((image.clone(), until));
                    until
                }
            };
            let now = Instant::now();
            if now < until {
                self.wait(
                    index,
                    "ContainerCreating",
                    format!("Pulling image \"{image}\""),
                    until - now,
                );
                return;
            }
        }
        self.containers[index].pulled = Some(image.clone());
        self.containers[index].pulling = None;
        self.containers[index].image_id = mapping.image_id();
        let sources = match self.env_sources(&spec).await {
            Ok(sources) => sources,
            Err(e) => {
                self.wait(
                    index,
                    "CreateContainerConfigError",
                    e.to_string(),
                    CONFIG_RETRY,
                );
                return;
            }
        };
        let env = match expand::container_env(&self.pod, &spec, &sources, &self.base_env()) {
            Ok(env) => env,
            Err(e) => {
                self.wait(
                    index,
                    "CreateContainerConfigError",
                    e.to_string(),
                    CONFIG_RETRY,
                );
                return;
            }
        };
        let mounts = match self.mounts(&spec) {
            Ok(mounts) => mounts,
            Err(e) => {
                self.wait(index, "CreateContainerConfigError", e, CONFIG_RETRY);
                return;
            }
        };
        // Expand with the container's values, then rewrite mount paths once (see expand.rs).
        let argv: Vec<String> = expand::command_line(&spec, &env, mapping.entrypoint())
            .iter()
            .map(|a| mounts.rewrite(a))
            .collect();
        let mut env: Vec<(String, String)> = env
            .into_iter()
            .map(|(k, v)| {
                let v = mounts.rewrite(&v);
                (k, v)
            })
            .collect();
        if let Some(kubeconfig) = self.service_account_kubeconfig(&mounts, &env) {
            env.push(("KUBECONFIG".to_owned(), kubeconfig));
        }
        let binary = match argv.first().map(|p| mapping.resolve(p)) {
            Some(Ok(binary)) => binary.to_owned(),
            Some(Err(e)) => {
                let retry = self.containers[index].backoff;
                self.wait(index, "CreateContainerError", e, retry);
                return;
            }
            None => return,
        };
        let pod_dir = self.shared.dirs.pod_dir(&self.uid);
        let cwd = match spec.working_dir.as_deref().filter(|w| !w.is_empty()) {
            Some(dir) => expand::host_path(&mounts, dir, &pod_dir),
            None => pod_dir.clone(),
        };
        if let Err(e) = std::fs::create_dir_all(&cwd) {
            self.wait(
                index,
                "CreateContainerError",
                format!("creating {}: {e}", cwd.display()),
                CONFIG_RETRY,
            );
            return;
        }
        let log_path = self.log_dir.join(format!("{}.log", spec.name));
        let mut command = std::process::Command::new(&binary);
        command
            .args(&argv[1..])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .current_dir(&cwd);
        if let Some(cgroup) = &lock(&self.info).cgroup {
            cgroup.join_on_exec(&mut command);
        }
        let process_name = format!("{}/{}", self.key(), spec.name);
        let started = {
            let mut info = lock(&self.info);
            if self.shared.is_shutting_down() {
                return;
            }
            ManagedProcess::start_command(&process_name, command, log_path.clone(), true).map(|p| {
                let pid = p.pid();
                info.processes.insert(spec.name.clone(), p);
                pid
            })
        };
        let pid = match started {
            Ok(pid) => pid,
            Err(e) => {
                let retry = self.containers[index].backoff;
                self.wait(index, "RunContainerError", e.to_string(), retry);
                return;
            }
        };
        self.generation += 1;
        let generation = self.generation;
        let now = Instant::now();
        let probes = self.ip.and_then(|pod_ip| {
            probes::spawn(
                &spec,
                index,
                generation,
                now,
                ProbeTarget {
                    pod_ip,
                    ports: spec.ports.clone().unwrap_or_default(),
                    exec: ExecContext {
                        mapping: mapping.clone(),
                        env: env.clone(),
                        mounts: mounts.clone(),
                        cwd: cwd.clone(),
                        log: self.log_dir.join(format!("{}.probes.log", spec.name)),
                    },
                },
                self.probe_tx.clone(),
            )
        });
        let c = &mut self.containers[index];
        if c.instances > 0 {
            c.restart_count += 1;
        }
        c.instances += 1;
        c.running = Some(Instance {
            generation,
            image: image.clone(),
            image_id: mapping.image_id(),
            container_id: format!("process://{pid}"),
            started_at: Timestamp::now(),
            started_instant: now,
            started: spec.startup_probe.is_none(),
            ready_probe: false,
            probes,
        });
        let restarts = c.restart_count;
        self.log(format_args!(
            "{}container {} started: pid {pid}, image {image}, restart {restarts}: {} {}",
            if index < self.init_count { "init " } else { "" },
            spec.name,
            binary.display(),
            argv[1..].join(" ")
        ));
    }

    async fn on_probe(&mut self, event: ProbeEvent) {
        let Some(c) = self.containers.get_mut(event.container) else {
            return;
        };
        let name = c.name().to_owned();
        let Some(instance) = c
            .running
            .as_mut()
            .filter(|i| i.generation == event.generation)
        else {
            return;
        };
        let mut kill = None;
        match (event.kind, event.healthy) {
            (ProbeKind::Startup, true) => instance.started = true,
            (ProbeKind::Readiness, ready) => instance.ready_probe = ready,
            (ProbeKind::Startup, false) => kill = Some("startup"),
            (ProbeKind::Liveness, false) => kill = Some("liveness"),
            (ProbeKind::Liveness, true) => {}
        }
        self.log(format_args!(
            "container {name}: {:?} probe {}{}",
            event.kind,
            if event.healthy { "succeeded" } else { "failed" },
            if event.message.is_empty() {
                String::new()
            } else {
                format!(": {}", event.message)
            }
        ));
        if let Some(probe) = kill {
            self.log(format_args!(
                "container {name} failed its {probe} probe, will be restarted"
            ));
            let grace = self.grace();
            self.stop_container(event.container, grace).await;
            self.reap(event.container, true);
        }
    }

    /// SIGTERM, up to `grace`, SIGKILL. The exit is picked up by [`Self::reap`].
    async fn stop_container(&mut self, index: usize, grace: Duration) {
        let name = self.containers[index].name().to_owned();
        if let Some(p) = lock(&self.info).processes.get_mut(&name) {
            p.signal_term();
        }
        let deadline = Instant::now() + grace;
        loop {
            let exited = lock(&self.info)
                .processes
                .get_mut(&name)
                .is_none_or(|p| p.exit_status().is_some());
            if exited {
                return;
            }
            if Instant::now() >= deadline {
                if let Some(p) = lock(&self.info).processes.get_mut(&name) {
                    p.kill();
                }
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Forgets the last status written when the API's `Ready` condition of the pod is not the
    /// one written (the node lifecycle controller marks the pods of an `Unknown` node not
    /// ready), so the next [`Self::publish_status`] writes it again, as a kubelet's status
    /// manager reconciles.
    fn notice_status_drift(&mut self, pod: &Pod) {
        let ready = |conditions: &[PodCondition]| {
            conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status.clone())
        };
        let Some(ours) = self.last_patch.as_ref().and(ready(&self.last_conditions)) else {
            return;
        };
        let theirs = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .and_then(ready);
        if theirs.as_deref() != Some(ours.as_str()) {
            self.log(format_args!(
                "Ready is {} in the API, {ours} here: writing the status again",
                theirs.as_deref().unwrap_or("missing")
            ));
            self.last_patch = None;
        }
    }

    /// What the status is built from: the pod and its containers as the kubelet runs them.
    fn view(&self) -> PodView<'_> {
        PodView {
            pod: &self.pod,
            pod_ip: self.ip,
            host_ip: self.shared.node_ip,
            start_time: self.start_time,
            sandbox_ready: self.sandbox_ready,
            init_containers: self.containers[..self.init_count]
                .iter()
                .map(ContainerRt::init_view)
                .collect(),
            containers: self.containers[self.init_count..]
                .iter()
                .map(ContainerRt::view)
                .collect(),
            message: self.pod_message.clone(),
            ended: self.ended.clone(),
        }
    }

    /// Writes the status through `pods/status` when it changed. Not while the kubelet is
    /// silenced or has not listed the pods since it resumed, nor when a newer version of the
    /// pod waits to be read or the pod is being deleted: a status built from an older pod could
    /// flip an evicted or terminating pod back to ready.
    async fn publish_status(&mut self) {
        if !self.shared.may_write_status()
            || self.updates.has_changed().unwrap_or(true)
            || self.pod.metadata.deletion_timestamp.is_some()
        {
            return;
        }
        let view = self.view();
        let previous = if self.last_conditions.is_empty() {
            self.pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default()
        } else {
            self.last_conditions.clone()
        };
        let status = status::build(&view, &previous, Timestamp::now());
        let patch = status::merge_patch(&status);
        if self.last_patch.as_ref() == Some(&patch) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                self.last_conditions = status.conditions.unwrap_or_default();
                self.last_patch = Some(patch);
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => self.log(format_args!("writing the status: {e}")),
        }
    }

    /// Before a deleted pod is removed, writes its last status as a kubelet does (1.27 on): its
    /// containers terminated and the pod in a terminal phase (`Succeeded` when every container
    /// exited 0, else `Failed`), so whoever watches the pod knows its processes stopped (a pod
    /// a finalizer holds stays so). Not while silenced.
    async fn publish_terminal_status(&mut self) {
        if !self.shared.may_write_status() {
            return;
        }
        let view = self.view();
        let mut status = status::build(&view, &self.last_conditions, Timestamp::now());
        let all_zero = status.container_statuses.iter().flatten().all(|c| {
            c.state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0)
        });
        if self.ended.is_none() {
            status.phase = Some(if all_zero { "Succeeded" } else { "Failed" }.into());
        }
        for c in status.conditions.iter_mut().flatten() {
            if c.type_ == "Ready" || c.type_ == "ContainersReady" {
                c.status = "False".into();
                c.reason = Some("PodCompleted".into());
            }
        }
        let patch = status::merge_patch(&status);
        let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.namespace);
        match api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => self.log(format_args!("writing the final status: {e}")),
        }
    }

    /// Ends the pod for good (eviction, graceful node shutdown): stops its containers (SIGTERM,
    /// the pod's grace period, SIGKILL), keeps them from restarting, releases its IP and its
    /// pod directory (emptyDir volumes; a claim keeps its data) and reports it `Failed` with
    /// `(reason, message)`. The pod stays until it is deleted.
    async fn end(&mut self, (reason, message): (String, String)) {
        self.log(format_args!("ending the pod: {reason}: {message}"));
        let grace = self.grace();
        for index in 0..self.containers.len() {
            if self.containers[index].running.is_some() {
                self.stop_container(index, grace).await;
                self.reap(index, false);
            }
            let c = &mut self.containers[index];
            if c.finished.is_none() {
                c.finished =
                    Some(
                        c.last_terminated
                            .clone()
                            .unwrap_or_else(|| ContainerStateTerminated {
                                exit_code: 137,
                                reason: Some("ContainerStatusUnknown".into()),
                                ..ContainerStateTerminated::default()
                            }),
                    );
            }
        }
        self.remove_cgroup().await;
        let _ = self.shared.network.remove_hosts_entry(&self.uid);
        let ip = lock(&self.info).ip.take();
        if let Some(ip) = ip {
            let network = self.shared.network;
            let _ = tokio::task::spawn_blocking(move || network.release(ip)).await;
        }
        self.ip = None;
        refresh::forget(&self.shared, &self.uid);
        let pod_dir = self.shared.dirs.pod_dir(&self.uid);
        if let Err(e) = std::fs::remove_dir_all(&pod_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            self.log(format_args!("removing {}: {e}", pod_dir.display()));
        }
        self.ended = Some((reason, message));
        lock(&self.info).ended = true;
    }

    /// Kills what the stopped containers left in the pod's cgroup and removes it.
    async fn remove_cgroup(&mut self) {
        let Some(cgroup) = lock(&self.info).cgroup.take() else {
            return;
        };
        cgroup.kill_all();
        let removed =
            crate::wait::poll_until("the pod cgroup to be removed", CGROUP_REMOVAL, || async {
                cgroup.remove().map(|()| Some(()))
            })
            .await;
        if let Err(e) = removed {
            self.log(format_args!("{e}"));
        }
    }

    /// Stops every container, releases the IP and the pod directory, and (for a deleted pod)
    /// removes the pod from the API with grace period 0.
    async fn terminate(mut self, delete: bool) {
        let grace = self.grace();
        self.log(format_args!(
            "{}: stopping its containers (grace {grace:?})",
            if delete { "deleted" } else { "gone" }
        ));
        for p in lock(&self.info).processes.values_mut() {
            p.signal_term();
        }
        let deadline = Instant::now() + grace;
        loop {
            let running = lock(&self.info)
                .processes
                .values_mut()
                .any(|p| p.exit_status().is_none());
            if !running {
                break;
            }
            if Instant::now() >= deadline {
                for p in lock(&self.info).processes.values_mut() {
                    p.kill();
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for index in 0..self.containers.len() {
            if self.containers[index].running.is_some() {
                self.reap(index, false);
            }
        }
        self.remove_cgroup().await;
        let _ = self.shared.network.remove_hosts_entry(&self.uid);
        let ip = lock(&self.info).ip.take();
        if let Some(ip) = ip {
            let network = self.shared.network;
            match tokio::task::spawn_blocking(move || network.release(ip)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => self.log(format_args!("releasing {ip}: {e}")),
                Err(e) => self.log(format_args!("releasing {ip}: {e}")),
            }
        }
        refresh::forget(&self.shared, &self.uid);
        let pod_dir = self.shared.dirs.pod_dir(&self.uid);
        if let Err(e) = std::fs::remove_dir_all(&pod_dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            self.log(format_args!("removing {}: {e}", pod_dir.display()));
        }
        if delete {
            self.publish_terminal_status().await;
            let api: Api<Pod> = Api::namespaced(self.shared.client.clone(), &self.namespace);
            let params = DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: Some(Preconditions {
                    uid: Some(self.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match api.delete(&self.name, &params).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => self.log(format_args!("deleting: {e}")),
            }
        }
        self.log(format_args!("terminated and cleaned up"));
        lock(&self.shared.finished).insert(self.uid.clone());
        lock(&self.shared.pods).remove(&self.uid);
    }
}
