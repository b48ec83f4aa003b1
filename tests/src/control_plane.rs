//! A real local Kubernetes control plane: etcd, kube-apiserver and (optionally)
//! kube-controller-manager and kube-scheduler, on free loopback ports, in a temporary directory.
//!
//! ```no_run
//! # async fn demo() -> Result<(), etcd_tests::control_plane::ControlPlaneError> {
//! use etcd_tests::control_plane::{ControlPlane, ControlPlaneOptions};
//! let cp = ControlPlane::start(ControlPlaneOptions::default()).await?;
//! let client = cp.client();
//! let status = cp.kubectl().args(["get", "ns"]).status();
//! # let _ = (client, status);
//! # Ok(())
//! # }
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::config::Kubeconfig;

use crate::kubeconfig::{self, KubeconfigError};
use crate::pki::{CertificateAuthority, ControlPlanePki, PkiError};
use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::tools::{Tools, ToolsError};

/// Name of the etcd component (also its log file stem).
pub const ETCD: &str = "etcd";
/// Name of the kube-apiserver component.
pub const KUBE_APISERVER: &str = "kube-apiserver";
/// Name of the kube-controller-manager component.
pub const KUBE_CONTROLLER_MANAGER: &str = "kube-controller-manager";
/// Name of the kube-scheduler component.
pub const KUBE_SCHEDULER: &str = "kube-scheduler";

/// Lines of each component log shown by [`ControlPlane::log_tails`] in error reports.
pub const LOG_TAIL_LINES: usize = 40;

/// Set to `1` to keep the control plane's temporary directory (logs, certs, etcd data) after it
/// stops; its path is printed.
pub const KEEP_DIR_ENV: &str = "ETCD_TESTS_KEEP_DIR";

/// The Services' ClusterIP range (`--service-cluster-ip-range`; the `kubernetes` Service is its
/// first address, 10.96.0.1).
pub const SERVICE_CIDR: &str = "10.96.0.0/16";

/// Controllers of kube-controller-manager that cannot work without a cloud provider.
/// (`node-ipam-controller` is a no-op without `--allocate-node-cidrs`; the disabled-by-default
/// ones stay off under `*`.)
pub const DISABLED_CONTROLLERS: &[&str] = &[
    "cloud-node-lifecycle-controller",
    "node-route-controller",
    "service-lb-controller",
];

/// What to start and how long to wait.
#[derive(Debug, Clone)]
pub struct ControlPlaneOptions {
    /// Start kube-controller-manager (needed for Deployments, garbage collection, namespace
    /// deletion, service-account tokens). Default: true.
    pub controller_manager: bool,
    /// kube-controller-manager's `--controllers`. Default: `*` (all on-by-default controllers)
    /// minus [`DISABLED_CONTROLLERS`].
    pub controllers: Vec<String>,
    /// Start kube-scheduler (assigns Pods to Nodes; useless without a Node). Default: false.
    pub scheduler: bool,
    /// Deadline for each readiness wait. Default: 60 s.
    pub startup_timeout: Duration,
    /// Grace period between SIGTERM and SIGKILL on shutdown. Default: 5 s.
    pub shutdown_grace: Duration,
    /// Extra kube-apiserver flags (e.g. `--feature-gates=...`), appended last.
    pub extra_apiserver_args: Vec<String>,
    /// Extra kube-controller-manager flags, appended last.
    pub extra_controller_manager_args: Vec<String>,
    /// The tool cache; `None` means [`Tools::from_env`].
    pub tools: Option<Tools>,
}

impl Default for ControlPlaneOptions {
    fn default() -> Self {
        Self {
            controller_manager: true,
            controllers: std::iter::once(String::from("*"))
                .chain(DISABLED_CONTROLLERS.iter().map(|c| format!("-{c}")))
                .collect(),
            scheduler: false,
            startup_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            extra_apiserver_args: Vec::new(),
            extra_controller_manager_args: Vec::new(),
            tools: None,
        }
    }
}

/// How long startup took, measured from the start of [`ControlPlane::start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupTimings {
    /// etcd answered `GET /readyz` with 200.
    pub etcd_ready: Duration,
    /// kube-apiserver answered `GET /readyz` with 200.
    pub apiserver_ready: Duration,
    /// kube-controller-manager is working: its serviceaccount controller created
    /// `default/default`. `None` if it was not started.
    pub controller_manager_ready: Option<Duration>,
}

/// Errors while starting the control plane.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    /// A tool binary is missing (run `hack/build-tools.sh`).
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// Certificate generation failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// A component could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Writing the kubeconfig or building the client failed.
    #[error(transparent)]
    Kubeconfig(#[from] KubeconfigError),
    /// Creating the temporary directory or finding free ports failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A URL the harness built does not parse (a bug).
    #[error("invalid URL: {0}")]
    Url(#[from] http::uri::InvalidUri),
    /// A component did not become ready in time.
    #[error("{component} not ready after {waited:?} (last probe: {last}); component logs:\n{logs}")]
    Timeout {
        /// The component waited for.
        component: &'static str,
        /// How long we waited.
        waited: Duration,
        /// The last probe's result.
        last: String,
        /// Tail of each component's log.
        logs: String,
    },
    /// A component exited during startup or while running.
    #[error("{component} exited ({status}); component logs:\n{logs}")]
    Exited {
        /// The component that exited.
        component: String,
        /// Its exit status.
        status: String,
        /// Tail of each component's log.
        logs: String,
    },
}

/// A running local control plane. Dropping it stops every process (SIGTERM, grace period,
/// SIGKILL) and removes its temporary directory; the children also die with the test binary
/// (see [`crate::process`]).
pub struct ControlPlane {
    tools: Tools,
    processes: Mutex<Vec<ManagedProcess>>,
    dir: Mutex<Option<tempfile::TempDir>>,
    dir_path: PathBuf,
    pki: ControlPlanePki,
    kubeconfig: Kubeconfig,
    kubeconfig_path: PathBuf,
    kubectl: PathBuf,
    client: kube::Client,
    apiserver_url: String,
    apiserver_addr: SocketAddr,
    etcd_url: String,
    timings: StartupTimings,
    shutdown_grace: Duration,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("dir", &self.dir_path)
            .field("apiserver_url", &self.apiserver_url)
            .field("etcd_url", &self.etcd_url)
            .field("timings", &self.timings)
            .finish_non_exhaustive()
    }
}

/// The processes started so far; dropping it (on a startup error) stops them.
struct Starting {
    processes: Vec<ManagedProcess>,
    started: Instant,
    timeout: Duration,
}

impl Starting {
    fn logs(&self) -> String {
        format_log_tails(&self.processes, LOG_TAIL_LINES)
    }

    /// Fails if any process has exited.
    fn check_alive(&mut self) -> Result<(), ControlPlaneError> {
        let exited = self.processes.iter_mut().find_map(|p| {
            p.exit_status()
                .map(|s| (p.name().to_owned(), s.to_string()))
        });
        match exited {
            Some((component, status)) => Err(ControlPlaneError::Exited {
                component,
                status,
                logs: self.logs(),
            }),
            None => Ok(()),
        }
    }

    /// Polls `probe` every 50 ms until it returns `Ok(())`, failing early if a process exits
    /// and with a [`ControlPlaneError::Timeout`] after the startup timeout.
    async fn wait_for<F, Fut>(
        &mut self,
        component: &'static str,
        mut probe: F,
    ) -> Result<Duration, ControlPlaneError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<(), String>>,
    {
        let begin = Instant::now();
        let deadline = begin + self.timeout;
        loop {
            self.check_alive()?;
            let last = match tokio::time::timeout(Duration::from_secs(5), probe()).await {
                Ok(Ok(())) => return Ok(self.started.elapsed()),
                Ok(Err(e)) => e,
                Err(_) => String::from("probe timed out after 5s"),
            };
            if Instant::now() >= deadline {
                return Err(ControlPlaneError::Timeout {
                    component,
                    waited: begin.elapsed(),
                    last,
                    logs: self.logs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Prefix of the control plane directories in the system temp directory.
const DIR_PREFIX: &str = "etcd-operator-cp-";
/// File in the control plane directory holding the pid of the process that owns it.
const OWNER_FILE: &str = "owner.pid";

/// Removes control plane directories left behind by test processes that were killed (their
/// children died with them, see [`crate::process`], but nothing could remove the directory).
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
            continue; // kept on purpose (ETCD_TESTS_KEEP_DIR) or not ours
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

fn format_log_tails(processes: &[ManagedProcess], lines: usize) -> String {
    let mut out = String::new();
    for p in processes {
        out.push_str(&format!(
            "----- last {lines} lines of {} ({}) -----\n{}\n",
            p.name(),
            p.log_path().display(),
            p.log_tail(lines)
        ));
    }
    out
}

/// GET `path` and succeed on a 2xx answer; the error is the status text or transport error.
async fn probe_get(client: &kube::Client, path: &str) -> Result<(), String> {
    let request = http::Request::get(path)
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    client
        .request_text(request)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> ControlPlaneError {
    move |source| ControlPlaneError::Io { what, source }
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver and (per `opts`) kube-controller-manager and kube-scheduler,
    /// and waits until each is ready. Must be called inside a tokio runtime (the returned
    /// client's connection pool lives there).
    pub async fn start(opts: ControlPlaneOptions) -> Result<Self, ControlPlaneError> {
        let started = Instant::now();
        let tools = match opts.tools.clone() {
            Some(tools) => tools,
            None => Tools::from_env()?,
        };
        // Resolve every binary first, so a missing one fails before anything starts.
        let etcd_bin = tools.apiserver_etcd()?;
        let apiserver_bin = tools.kube_apiserver()?;
        let kubectl = tools.kubectl()?;
        let kcm_bin = if opts.controller_manager {
            Some(tools.kube_controller_manager()?)
        } else {
            None
        };
        let scheduler_bin = if opts.scheduler {
            Some(tools.kube_scheduler()?)
        } else {
            None
        };

        sweep_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io("creating the control plane directory"))?;
        let dir_path = dir.path().to_owned();
        std::fs::write(dir_path.join(OWNER_FILE), std::process::id().to_string())
            .map_err(io("writing the owner pid file"))?;
        let [etcd_port, peer_port, apiserver_port] =
            free_ports().map_err(io("finding free loopback ports"))?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let apiserver_url = format!("https://127.0.0.1:{apiserver_port}");

        let mut starting = Starting {
            processes: Vec::new(),
            started,
            timeout: opts.startup_timeout,
        };

        // etcd needs no certificates: start it first.
        let etcd_args = vec![
            "--name=etcd0".into(),
            format!("--data-dir={}", dir_path.join("etcd-data").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=etcd0={peer_url}"),
            "--unsafe-no-fsync".into(),
            // A single member has no peers to lose: a short election timeout only makes the
            // first election (and so readiness) come ~0.5 s sooner.
            "--election-timeout=100".into(),
            "--heartbeat-interval=10".into(),
            "--log-level=warn".into(),
        ];

        starting.processes.push(ManagedProcess::start(
            ETCD,
            &etcd_bin,
            &etcd_args,
            dir_path.join("etcd.log"),
        )?);

        // Certificates take a few milliseconds (ECDSA P-256); the apiserver retries etcd
        // itself, so it starts right away without waiting for etcd.
        let pki = ControlPlanePki::generate()?;
        let files = pki.write_to(&dir_path)?;
        // The API server's identity towards kubelets (`kubectl logs` on a real node): the
        // admin certificate, which the kubelet's webhook authorization admits.
        let (kubelet_client_cert, kubelet_client_key) = pki.admin.write_to(&dir_path, "admin")?;
        let mut apiserver_args = vec![
            format!(
                "--kubelet-client-certificate={}",
                kubelet_client_cert.display()
            ),
            format!("--kubelet-client-key={}", kubelet_client_key.display()),
            // Nodes' names do not resolve here; their InternalIP is where the kubelet serves.
            "--kubelet-preferred-address-types=InternalIP,Hostname".into(),
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--secure-port={apiserver_port}"),
            format!("--cert-dir={}", dir_path.join("apiserver-certs").display()),
            format!("--tls-cert-file={}", files.apiserver_cert.display()),
            format!("--tls-private-key-file={}", files.apiserver_key.display()),
            format!("--client-ca-file={}", files.ca_cert.display()),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--allow-privileged=true".into(),
            format!("--service-account-issuer={apiserver_url}"),
            format!(
                "--service-account-key-file={}",
                files.sa_public_key.display()
            ),
            format!(
                "--service-account-signing-key-file={}",
                files.sa_private_key.display()
            ),
            "--profiling=false".into(),
            // The endpoint reconciler would publish 127.0.0.1 as the `kubernetes` Service
            // endpoint, which validation refuses (loopback), failing on every sync.
            "--endpoint-reconciler-type=none".into(),
        ];
        if !opts.controller_manager {
            // Without the token controller no default ServiceAccount appears and Pods would be
            // refused by the ServiceAccount admission plugin.
            apiserver_args.push("--disable-admission-plugins=ServiceAccount".into());
        }
        apiserver_args.extend(opts.extra_apiserver_args.iter().cloned());
        starting.processes.push(ManagedProcess::start(
            KUBE_APISERVER,
            &apiserver_bin,
            &apiserver_args,
            dir_path.join("kube-apiserver.log"),
        )?);

        let kubeconfig = kubeconfig::build(&apiserver_url, pki.ca.cert_pem(), &pki.admin);
        let kubeconfig_path = dir_path.join("admin.kubeconfig");
        kubeconfig::write(&kubeconfig, &kubeconfig_path)?;
        let client = kubeconfig::client(kubeconfig.clone()).await?;
        // kube's client speaks plain HTTP too: reuse it for etcd's /readyz.
        let etcd_client = kube::Client::try_from(kube::Config::new(etcd_url.parse()?))
            .map_err(KubeconfigError::Client)?;

        let etcd_ready = starting
            .wait_for(ETCD, || probe_get(&etcd_client, "/readyz"))
            .await?;
        let apiserver_ready = starting
            .wait_for(KUBE_APISERVER, || probe_get(&client, "/readyz"))
            .await?;

        let mut controller_manager_ready = None;
        if let Some(kcm_bin) = kcm_bin {
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig_path.display()),
                "--leader-elect=false".into(),
                format!("--root-ca-file={}", files.ca_cert.display()),
                format!(
                    "--service-account-private-key-file={}",
                    files.sa_private_key.display()
                ),
                "--use-service-account-credentials=true".into(),
                format!("--controllers={}", opts.controllers.join(",")),
                format!("--cluster-signing-cert-file={}", files.ca_cert.display()),
                format!("--cluster-signing-key-file={}", files.ca_key.display()),
                "--secure-port=0".into(),
                "--profiling=false".into(),
                // The default client rate limit (20 QPS) throttles the per-controller
                // service-account setup of --use-service-account-credentials: ~5 s to start all
                // controllers instead of ~0.5 s.
                "--kube-api-qps=1000".into(),
                "--kube-api-burst=1000".into(),
            ];
            args.extend(opts.extra_controller_manager_args.iter().cloned());

            starting.processes.push(ManagedProcess::start(
                KUBE_CONTROLLER_MANAGER,
                &kcm_bin,
                &args,
                dir_path.join("kube-controller-manager.log"),
            )?);
        }
        if let Some(scheduler_bin) = scheduler_bin {
            let args = vec![
                format!("--kubeconfig={}", kubeconfig_path.display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--profiling=false".into(),
            ];
            starting.processes.push(ManagedProcess::start(
                KUBE_SCHEDULER,
                &scheduler_bin,
                &args,
                dir_path.join("kube-scheduler.log"),
            )?);
        }
        if opts.controller_manager {
            let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            controller_manager_ready = Some(
                starting
                    .wait_for(KUBE_CONTROLLER_MANAGER, || async {
                        match service_accounts.get_opt("default").await {
                            Ok(Some(_)) => Ok(()),
                            Ok(None) => {
                                Err("ServiceAccount default/default not created yet".into())
                            }
                            Err(e) => Err(e.to_string()),
                        }
                    })
                    .await?,
            );
        }

        let processes = std::mem::take(&mut starting.processes);
        Ok(Self {
            tools,
            processes: Mutex::new(processes),
            dir: Mutex::new(Some(dir)),
            dir_path,
            pki,
            kubeconfig,
            kubeconfig_path,
            kubectl,
            client,
            apiserver_url,
            apiserver_addr: SocketAddr::from((Ipv4Addr::LOCALHOST, apiserver_port)),
            etcd_url,
            timings: StartupTimings {
                etcd_ready,
                apiserver_ready,
                controller_manager_ready,
            },
            shutdown_grace: opts.shutdown_grace,
        })
    }

    /// A client authenticated as `admin` (group `system:masters`). Cheap to clone.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The admin kubeconfig (in the control plane's temporary directory).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The admin kubeconfig, parsed.
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// `kubectl --kubeconfig <admin kubeconfig>`, ready for more arguments.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(&self.kubectl);
        command.arg("--kubeconfig").arg(&self.kubeconfig_path);
        command
    }

    /// The CA certificate (PEM) that signed the apiserver's serving certificate and that the
    /// apiserver trusts for client certificates.
    pub fn ca_pem(&self) -> &str {
        self.pki.ca.cert_pem()
    }

    /// The control plane's CA, e.g. to issue a webhook serving certificate whose `caBundle` is
    /// [`Self::ca_pem`].
    pub fn ca(&self) -> &CertificateAuthority {
        &self.pki.ca
    }

    /// The certificates and keys in use.
    pub fn pki(&self) -> &ControlPlanePki {
        &self.pki
    }

    /// `https://127.0.0.1:PORT`.
    pub fn apiserver_url(&self) -> &str {
        &self.apiserver_url
    }

    /// The API server's address (`127.0.0.1:PORT`), e.g. to cut a pod from it
    /// ([`crate::kubelet::PodNetwork::isolate`]).
    pub fn apiserver_addr(&self) -> SocketAddr {
        self.apiserver_addr
    }

    /// `http://127.0.0.1:PORT`, the etcd backing the apiserver.
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// The tool cache in use.
    pub fn tools(&self) -> &Tools {
        &self.tools
    }

    /// The temporary directory holding certificates, the kubeconfig, logs and etcd data.
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// How long each component took to become ready.
    pub fn timings(&self) -> StartupTimings {
        self.timings
    }

    /// The log file of each component, by name.
    pub fn log_paths(&self) -> Vec<(String, PathBuf)> {
        self.lock_processes()
            .iter()
            .map(|p| (p.name().to_owned(), p.log_path().to_owned()))
            .collect()
    }

    /// The last `lines` lines of every component's log, each under a header.
    pub fn log_tails(&self, lines: usize) -> String {
        format_log_tails(&self.lock_processes(), lines)
    }

    /// Prints [`Self::log_tails`] to stderr.
    pub fn print_log_tails(&self, lines: usize) {
        eprintln!("{}", self.log_tails(lines));
    }

    /// Fails with [`ControlPlaneError::Exited`] if a component has exited.
    pub fn check_running(&self) -> Result<(), ControlPlaneError> {
        let mut processes = self.lock_processes();
        let exited = processes.iter_mut().find_map(|p| {
            p.exit_status()
                .map(|s| (p.name().to_owned(), s.to_string()))
        });
        match exited {
            Some((component, status)) => Err(ControlPlaneError::Exited {
                component,
                status,
                logs: format_log_tails(&processes, LOG_TAIL_LINES),
            }),
            None => Ok(()),
        }
    }

    /// Stops every component (newest first: SIGTERM, up to the grace period, SIGKILL) and
    /// removes the temporary directory (kept if `ETCD_TESTS_KEEP_DIR=1`). Idempotent; `Drop`
    /// calls it.
    pub fn shutdown(&self) {
        let mut processes = std::mem::take(&mut *self.lock_processes());
        // Two stages, each under one deadline: first everything that talks to etcd through the
        // apiserver (controller manager, scheduler, apiserver: signalled together so their
        // shutdown times do not add up), then etcd. Stopping etcd first would leave the
        // apiserver retrying its lease cleanup until SIGKILL.
        let (mut etcd, mut others): (Vec<_>, Vec<_>) =
            processes.drain(..).partition(|p| p.name() == ETCD);
        for stage in [&mut others, &mut etcd] {
            for p in stage.iter_mut().rev() {
                p.signal_term();
            }
            let deadline = Instant::now() + self.shutdown_grace;
            for p in stage.iter_mut().rev() {
                p.wait_or_kill(deadline);
            }
        }
        drop((others, etcd));
        let dir = match self.dir.lock() {
            Ok(mut guard) => guard.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        // Dropping the TempDir removes it, unless it is to be kept.
        if let Some(dir) = dir
            && std::env::var(KEEP_DIR_ENV).is_ok_and(|v| v == "1")
        {
            // Without the owner file, the next run's sweep leaves it alone.
            let _ = std::fs::remove_file(dir.path().join(OWNER_FILE));
            eprintln!("etcd-tests: kept {}", dir.keep().display());
        }
    }

    fn lock_processes(&self) -> std::sync::MutexGuard<'_, Vec<ManagedProcess>> {
        // A panic while holding the lock leaves the Vec intact; keep using it.
        self.processes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.shutdown();
    }
}
