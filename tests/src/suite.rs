//! One control plane per test binary, one namespace per test: a custom test `main` on
//! libtest-mimic, so `cargo test` filtering, `--list`, `--test-threads` and the standard
//! `test result: ok. N passed; M failed; ...` summary line all keep working.
//!
//! ```no_run
//! // tests/my_suite.rs, declared in Cargo.toml with `harness = false`
//! use etcd_tests::suite::{TestContext, run_suite};
//!
//! async fn lists_configmaps(ctx: TestContext) -> anyhow::Result<()> {
//!     let api = ctx.api::<k8s_openapi::api::core::v1::ConfigMap>();
//!     api.list(&Default::default()).await?;
//!     Ok(())
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     run_suite(etcd_tests::tests![lists_configmaps])
//! }
//! ```
//!
//! The control plane starts lazily with the first test that runs (so `--list` or a filter that
//! matches nothing starts nothing) and stops after the last one. Each test runs as a tokio task
//! on one shared multi-thread runtime; a panic, an error or the per-test timeout fails that test
//! and its failure message carries the tail of every component log. The test's namespace is
//! deleted afterwards in every case.

use std::fmt::Debug;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::NamespaceResourceScope;
use kube::{Api, Resource};
use libtest_mimic::{Arguments, Failed, Trial};

use crate::control_plane::{ControlPlane, ControlPlaneOptions, LOG_TAIL_LINES};
use crate::kubelet::{
    Kubelet, KubeletError, KubeletOptions, NodesOptions, PodNetwork, cgroup, netns, partition,
};
use crate::namespace::Namespace;

/// Overrides the per-test timeout, in seconds.
pub const TEST_TIMEOUT_ENV: &str = "ETCD_TESTS_TIMEOUT_SECS";
/// Set to `1` to print every component's log tail after the suite (not only on failure).
pub const SHOW_LOGS_ENV: &str = "ETCD_TESTS_SHOW_LOGS";

/// Default per-test timeout.
pub const DEFAULT_TEST_TIMEOUT: Duration = Duration::from_secs(180);

/// The share of its timeout past which a passing test is reported as close to it.
const NEAR_TIMEOUT: f64 = 0.8;

type TestFn = Box<dyn FnOnce(TestContext) -> BoxFuture<'static, Result<(), String>> + Send>;

/// One test of a suite: a name and an async function of a [`TestContext`].
pub struct Test {
    name: String,
    ignored: bool,
    timeout: Option<Duration>,
    run: TestFn,
}

impl Debug for Test {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Test")
            .field("name", &self.name)
            .field("ignored", &self.ignored)
            .finish_non_exhaustive()
    }
}

impl Test {
    /// A test named `name` running `f`. Any error type with `Debug` works (`anyhow::Error`
    /// prints its cause chain).
    pub fn new<F, Fut, E>(name: impl Into<String>, f: F) -> Self
    where
        F: FnOnce(TestContext) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Debug + 'static,
    {
        Self {
            name: name.into(),
            ignored: false,
            timeout: None,
            run: Box::new(move |ctx| {
                let fut = f(ctx);
                Box::pin(async move { fut.await.map_err(|e| format!("{e:?}")) })
            }),
        }
    }

    /// Marks the test ignored (runs only with `--ignored` / `--include-ignored`).
    pub fn ignored(mut self, ignored: bool) -> Self {
        self.ignored = ignored;
        self
    }

    /// Gives the test its own time limit instead of the suite's (`ETCD_TESTS_TIMEOUT_SECS`,
    /// which still wins when it is longer): for tests that walk many steps on real members.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The test name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// `tests![a, b, c]` is `vec![Test::new("a", a), ...]`.
#[macro_export]
macro_rules! tests {
    ($($test:ident),* $(,)?) => {
        vec![$($crate::suite::Test::new(stringify!($test), $test)),*]
    };
}

/// What a test gets: its own namespace and the shared control plane.
#[derive(Clone)]
pub struct TestContext {
    name: String,
    namespace: Namespace,
    control_plane: Arc<ControlPlane>,
    /// The suite's kubelets, one per node (none without [`Suite::with_kubelet`] or
    /// [`Suite::with_nodes`]).
    kubelets: Arc<[Arc<Kubelet>]>,
}

impl Debug for TestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestContext")
            .field("name", &self.name)
            .field("namespace", &self.namespace.name())
            .finish_non_exhaustive()
    }
}

impl TestContext {
    /// The test name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test's namespace.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The test's namespace name.
    pub fn ns(&self) -> &str {
        self.namespace.name()
    }

    /// An admin client.
    pub fn client(&self) -> kube::Client {
        self.control_plane.client()
    }

    /// An `Api` for a namespaced kind in the test's namespace.
    pub fn api<K>(&self) -> Api<K>
    where
        K: Resource<Scope = NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        self.namespace.api()
    }

    /// `kubectl --kubeconfig <admin> --namespace <test namespace>`.
    pub fn kubectl(&self) -> Command {
        let mut command = self.control_plane.kubectl();
        command.arg("--namespace").arg(self.ns());
        command
    }

    /// The shared control plane.
    pub fn control_plane(&self) -> &ControlPlane {
        &self.control_plane
    }

    /// The shared process kubelet, when the suite runs one ([`Suite::with_kubelet`]); the
    /// first node's with [`Suite::with_nodes`].
    pub fn kubelet(&self) -> Result<&Kubelet, KubeletError> {
        self.kubelets
            .first()
            .map(AsRef::as_ref)
            .ok_or(KubeletError::NotEnabled)
    }

    /// The kubelet of every node, in order (one with [`Suite::with_kubelet`]).
    pub fn nodes(&self) -> Result<&[Arc<Kubelet>], KubeletError> {
        if self.kubelets.is_empty() {
            return Err(KubeletError::NotEnabled);
        }
        Ok(&self.kubelets)
    }

    /// The kubelet of node `name`.
    pub fn node(&self, name: &str) -> Result<&Kubelet, KubeletError> {
        self.nodes()?
            .iter()
            .find(|k| k.node_name() == name)
            .map(AsRef::as_ref)
            .ok_or_else(|| KubeletError::NoSuchNode(name.to_owned()))
    }

    /// The pod network the kubelets share (partitions: [`PodNetwork::partition`],
    /// [`PodNetwork::isolate`]).
    pub fn network(&self) -> Result<&'static PodNetwork, KubeletError> {
        if self.kubelets.is_empty() {
            return Err(KubeletError::NotEnabled);
        }
        Ok(netns::current()?)
    }
}

/// The kubelets a suite runs.
#[derive(Debug, Clone)]
enum Kubelets {
    /// One node, with its own binder (no scheduler).
    Single(KubeletOptions),
    /// Several nodes, scheduled by kube-scheduler.
    Several(NodesOptions),
}

/// A suite runner with options; [`run_suite`] is `Suite::new().run(tests)`.
#[derive(Debug, Clone)]
pub struct Suite {
    options: ControlPlaneOptions,
    test_timeout: Duration,
    pod_network: bool,
    kubelets: Option<Kubelets>,
}

impl Default for Suite {
    fn default() -> Self {
        Self::new()
    }
}

struct Shared {
    runtime: tokio::runtime::Handle,
    options: ControlPlaneOptions,
    test_timeout: Duration,
    control_plane: OnceLock<Result<Arc<ControlPlane>, String>>,
    startup_failure_reported: AtomicBool,
    kubelet_options: Option<Kubelets>,
    kubelets: OnceLock<Result<Arc<[Arc<Kubelet>]>, String>>,
}

impl Shared {
    fn control_plane(&self) -> Result<Arc<ControlPlane>, Failed> {
        let result = self.control_plane.get_or_init(|| {
            let mut options = self.options.clone();
            if let Some(Kubelets::Several(nodes)) = &self.kubelet_options {
                nodes.validate()?;
                nodes.apply_to(&mut options);
            }
            self.runtime
                .block_on(ControlPlane::start(options))
                .map(|cp| {
                    let t = cp.timings();
                    eprintln!(
                        "etcd-tests: control plane up in {:?} (etcd {:?}, apiserver {:?}, controller manager {:?}) at {}",
                        t.controller_manager_ready.unwrap_or(t.apiserver_ready),
                        t.etcd_ready,
                        t.apiserver_ready,
                        t.controller_manager_ready,
                        cp.dir().display()
                    );
                    Arc::new(cp)
                })
                .map_err(|e| e.to_string())
        });
        match result {
            Ok(cp) => Ok(cp.clone()),
            Err(e) if !self.startup_failure_reported.swap(true, Ordering::SeqCst) => {
                Err(format!("the control plane did not start: {e}").into())
            }
            Err(_) => Err("the control plane did not start (see the first failure)".into()),
        }
    }

    /// The kubelets (started after the control plane, once), if the suite runs any.
    fn kubelets(&self, cp: &ControlPlane) -> Result<Arc<[Arc<Kubelet>]>, Failed> {
        let options = match &self.kubelet_options {
            None => return Ok(Arc::from(Vec::new())),
            Some(Kubelets::Single(options)) => vec![options.clone()],
            Some(Kubelets::Several(nodes)) => nodes.kubelet_options(),
        };
        let result = self.kubelets.get_or_init(|| {
            let mut kubelets = Vec::with_capacity(options.len());
            for mut options in options {
                if options.apiserver_url.is_none() {
                    options.apiserver_url = Some(cp.apiserver_url().to_owned());
                }
                if options.tools.is_none() {
                    options.tools = Some(cp.tools().clone());
                }
                let started = std::time::Instant::now();
                let kubelet = self
                    .runtime
                    .block_on(Kubelet::start(cp.client(), options))
                    .map_err(|e| e.to_string())?;
                eprintln!(
                    "etcd-tests: kubelet up in {:?}: node {} ({}), pod network on {} ({:?}) at {}",
                    started.elapsed(),
                    kubelet.node_name(),
                    kubelet.node_ip(),
                    kubelet.network().interface(),
                    kubelet.network().interface_kind(),
                    kubelet.dir().display()
                );
                kubelets.push(Arc::new(kubelet));
            }
            Ok(Arc::from(kubelets))
        });
        match result {
            Ok(kubelets) => Ok(kubelets.clone()),
            Err(e) => Err(format!("the kubelet did not start: {e}").into()),
        }
    }

    /// After a test: a node it left silenced is resumed (the next test needs it), said on
    /// stderr.
    fn restore_nodes(kubelets: &[Arc<Kubelet>], test: &str) {
        for kubelet in kubelets.iter().filter(|k| k.is_silenced()) {
            eprintln!(
                "etcd-tests: {test} left node {} silenced: resuming it",
                kubelet.node_name()
            );
            kubelet.resume();
        }
    }

    fn run(&self, test: Test) -> Result<(), Failed> {
        let control_plane = self.control_plane()?;
        let kubelets = self.kubelets(&control_plane)?;
        let timeout = test
            .timeout
            .map_or(self.test_timeout, |t| t.max(self.test_timeout));
        let name = test.name;
        let run = test.run;
        let cp = control_plane.clone();
        let test_kubelets = kubelets.clone();
        let test_name = name.clone();
        let namespace_name = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
        let namespace_slot = namespace_name.clone();
        let outcome: Result<(), String> = self.runtime.block_on(async move {
            let namespace = Namespace::create(cp.client(), &name)
                .await
                .map_err(|e| format!("creating the test namespace: {e}"))?;
            if let Ok(mut slot) = namespace_slot.lock() {
                *slot = Some(namespace.name().to_owned());
            }
            if cp.timings().controller_manager_ready.is_some() {
                namespace
                    .wait_for_default_service_account(Duration::from_secs(30))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            let ctx = TestContext {
                name,
                namespace: namespace.clone(),
                control_plane: cp,
                kubelets: test_kubelets.clone(),
            };
            let task = tokio::spawn(run(ctx));
            let abort = task.abort_handle();
            let began = std::time::Instant::now();
            let result = match tokio::time::timeout(timeout, task).await {
                Ok(Ok(result)) => result,
                Ok(Err(join)) if join.is_panic() => {
                    Err(format!("panicked: {}", panic_message(join.into_panic())))
                }
                Ok(Err(join)) => Err(format!("test task failed: {join}")),
                Err(_) => {
                    abort.abort();
                    Err(format!(
                        "timed out after {timeout:?} (set {TEST_TIMEOUT_ENV} to change)"
                    ))
                }
            };
            // A test that passes close to its limit fails on a slower machine: say so.
            let took = began.elapsed();
            if result.is_ok() && took > timeout.mul_f64(NEAR_TIMEOUT) {
                eprintln!(
                    "etcd-tests: {test_name} took {took:.1?} of its {timeout:?} timeout: raise it (Test::with_timeout)"
                );
            }
            Self::restore_nodes(&test_kubelets, &test_name);
            if let Err(e) = namespace.delete().await {
                eprintln!("etcd-tests: cleanup: {e}");
            }
            result
        });
        outcome.map_err(|message| {
            let health = match control_plane.check_running() {
                Ok(()) => String::from("all control plane components still running"),
                Err(e) => e.to_string(),
            };
            let kubelet_logs = match namespace_name.lock().ok().and_then(|n| n.clone()) {
                Some(ns) => kubelets
                    .iter()
                    .map(|k| {
                        let tails = k.log_tails(Some(&ns), LOG_TAIL_LINES);
                        if kubelets.len() > 1 {
                            format!("===== node {} =====\n{tails}", k.node_name())
                        } else {
                            tails
                        }
                    })
                    .collect::<String>(),
                None => String::new(),
            };
            Failed::from(format!(
                "{message}\n\n{health}\n{}{kubelet_logs}",
                control_plane.log_tails(LOG_TAIL_LINES)
            ))
        })
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(s) => (*s).to_owned(),
            Err(_) => String::from("(non-string panic payload)"),
        },
    }
}

impl Suite {
    /// Default options: controller manager on, no scheduler, [`DEFAULT_TEST_TIMEOUT`] (or
    /// `$ETCD_TESTS_TIMEOUT_SECS`).
    pub fn new() -> Self {
        let test_timeout = std::env::var(TEST_TIMEOUT_ENV)
            .ok()
            .and_then(|s| s.parse().ok())
            .map(Duration::from_secs)
            .unwrap_or(DEFAULT_TEST_TIMEOUT);
        Self {
            options: ControlPlaneOptions::default(),
            test_timeout,
            pod_network: false,
            kubelets: None,
        }
    }

    /// Runs the suite in a private network and mount namespace with a pod network (see
    /// [`crate::kubelet::netns`]): entered at the start of [`Self::run`], which must then be
    /// called before the process starts any thread.
    pub fn with_pod_network(mut self) -> Self {
        self.pod_network = true;
        self
    }

    /// Runs a process kubelet (see [`crate::kubelet`]) next to the control plane, shared by
    /// every test ([`TestContext::kubelet`]); implies [`Self::with_pod_network`]. Its
    /// `apiserver_url` and `tools` default to the control plane's.
    pub fn with_kubelet(mut self, options: KubeletOptions) -> Self {
        self.pod_network = true;
        self.kubelets = Some(Kubelets::Single(options));
        self
    }

    /// Runs several process kubelets, one per node (see [`crate::kubelet::nodes`]), instead of
    /// [`Self::with_kubelet`]'s one: kube-scheduler is started to place pods, and the node-fault
    /// timings of `nodes` are passed to the controller manager and the API server (added to the
    /// options of [`Self::options`], in whichever order the two are called). [`TestContext::nodes`] lists them,
    /// [`TestContext::kubelet`] is the first. Node faults are suite-wide, so the tests run one
    /// at a time unless `--test-threads` says otherwise. Implies [`Self::with_pod_network`].
    pub fn with_nodes(mut self, nodes: NodesOptions) -> Self {
        self.pod_network = true;
        self.kubelets = Some(Kubelets::Several(nodes));
        self
    }

    /// Control plane options for this suite.
    pub fn options(mut self, options: ControlPlaneOptions) -> Self {
        self.options = options;
        self
    }

    /// Per-test timeout.
    pub fn test_timeout(mut self, timeout: Duration) -> Self {
        self.test_timeout = timeout;
        self
    }

    /// Parses the command line, runs the selected tests and returns the exit code for `main`.
    pub fn run(self, tests: Vec<Test>) -> ExitCode {
        if self.pod_network {
            // Before any thread exists (the runtime below starts some). A failure is reported
            // by the tests that need the kubelet, so `--list` still works.
            if let Err(e) = netns::enter() {
                eprintln!("etcd-tests: no pod network: {e}");
            }
        }
        let mut args = Arguments::from_args();
        if matches!(self.kubelets, Some(Kubelets::Several(_))) && args.test_threads.is_none() {
            args.test_threads = Some(1);
        }
        let runtime = match tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("etcd-tests-rt")
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("etcd-tests: cannot build the tokio runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shared = Arc::new(Shared {
            runtime: runtime.handle().clone(),
            options: self.options,
            test_timeout: self.test_timeout,
            control_plane: OnceLock::new(),
            startup_failure_reported: AtomicBool::new(false),
            kubelet_options: self.kubelets,
            kubelets: OnceLock::new(),
        });
        let trials = tests
            .into_iter()
            .map(|test| {
                let shared = shared.clone();
                let name = test.name.clone();
                let ignored = test.ignored;
                Trial::test(name, move || shared.run(test)).with_ignored_flag(ignored)
            })
            .collect();
        let conclusion = libtest_mimic::run(&args, trials);

        // The kubelets first: their processes talk to the control plane, not the other way
        // round.
        if let Some(Ok(kubelets)) = shared.kubelets.get() {
            partition::heal_all();
            for kubelet in kubelets.iter() {
                if std::env::var(SHOW_LOGS_ENV).is_ok_and(|v| v == "1") {
                    eprintln!("{}", kubelet.log_tails(None, LOG_TAIL_LINES));
                }
                kubelet.shutdown();
            }
            cgroup::remove_root();
        }
        if let Some(Ok(cp)) = shared.control_plane.get() {
            if std::env::var(SHOW_LOGS_ENV).is_ok_and(|v| v == "1") {
                cp.print_log_tails(LOG_TAIL_LINES);
            }
            cp.shutdown();
        }
        drop(shared);
        runtime.shutdown_timeout(Duration::from_secs(5));
        conclusion.exit_code()
    }
}

/// Runs `tests` against one shared control plane with default options; call it from a test
/// binary's `main` (declared with `harness = false`).
pub fn run_suite(tests: Vec<Test>) -> ExitCode {
    Suite::new().run(tests)
}

/// Like [`run_suite`], with the pod network and a process kubelet with default options
/// (`Suite::new().with_kubelet(KubeletOptions::default())`).
pub fn run_suite_with_kubelet(tests: Vec<Test>) -> ExitCode {
    Suite::new()
        .with_kubelet(KubeletOptions::default())
        .run(tests)
}
