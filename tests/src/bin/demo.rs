//! The local demo: a real control plane and the process kubelet on this machine, the operator
//! installed by `helm install` of the repository's chart (its pods run from the binaries built
//! here), and the example `EtcdCluster`, until interrupted. With `--real-node`, the pods run on
//! a real node (kubelet, containerd, runc, CoreDNS) from the images of `hack/build-images.sh`.
//!
//! Run it with `hack/demo.sh` (which builds what is missing first); stop it with Ctrl-C or
//! `hack/demo.sh down`. While it runs, `source <state dir>/env` gives a `KUBECONFIG` for the
//! demo's API server and an `ETCDCTL_ENDPOINTS` for the example cluster: both are forwarded
//! from the host's loopback into the demo's private pod network, like `kubectl port-forward`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Parser;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client};
use tokio::net::{TcpListener, TcpStream};

use etcd_shared::EtcdCluster;
use etcd_shared::names::{CLIENT_PORT, client_service_name};
use etcd_tests::cluster_dns;
use etcd_tests::endpoints::ready_addresses;
use etcd_tests::kubelet::netns;
use etcd_tests::operator::{
    OperatorBinaries, Release, control_plane_options, is_settled, kubectl_apply,
};
use etcd_tests::real_node::{self, RealNode, RealNodeOptions};
use etcd_tests::{ControlPlane, Kubelet, KubeletOptions, Tools, await_condition};

/// Command-line flags of the demo.
#[derive(Debug, Parser)]
#[command(about = "Local demo: control plane, process kubelet, the chart, the example cluster")]
struct Args {
    /// Where the demo writes its kubeconfig, env file and pid file.
    #[arg(long, env = "ETCD_OPERATOR_DEMO_DIR", default_value_os_t = default_state_dir())]
    state_dir: PathBuf,
    /// The EtcdCluster to apply.
    #[arg(long, default_value_os_t = repo_path("examples/example-etcd-cluster.yaml"))]
    example: PathBuf,
    /// Namespace of the example cluster.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Host loopback address forwarded to the demo's API server.
    #[arg(long, default_value = "127.0.0.1:16443")]
    apiserver_address: SocketAddr,
    /// Host loopback address forwarded to the example cluster's client Service.
    #[arg(long, default_value = "127.0.0.1:2379")]
    etcd_address: SocketAddr,
    /// How long to wait for the example cluster to become Available.
    #[arg(long, default_value = "300", value_name = "SECONDS")]
    timeout: u64,
    /// Run the pods on a real node (the pinned kubelet and kube-proxy, containerd, runc, CoreDNS)
    /// from the images of `hack/build-images.sh`, with the chart's defaults, instead of the
    /// process kubelet. Needs root.
    #[arg(long)]
    real_node: bool,
    /// Also run cert-manager (its controller, webhook and CRDs, built by
    /// `ONLY=cert-manager hack/build-tools.sh`) with a CA Issuer `etcd-ca` in the namespace,
    /// for clusters with `spec.TLS.certManager`. The example itself is applied as written.
    #[arg(long)]
    cert_manager: bool,
}

fn repo_path(relative: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    root.canonicalize().unwrap_or(root).join(relative)
}

fn default_state_dir() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("etcd-operator-demo")
}

/// The client port, as a socket port.
const CLIENT_PORT_U16: u16 = CLIENT_PORT as u16;

fn step(started: Instant, what: &str) {
    println!("==> [{:>5.1}s] {what}", started.elapsed().as_secs_f64());
}

fn main() -> ExitCode {
    let args = Args::parse();
    // The forwarded ports are bound in the host's network namespace, before this process
    // moves into the private one (which needs a single thread).
    let listeners = match (
        std::net::TcpListener::bind(args.apiserver_address),
        std::net::TcpListener::bind(args.etcd_address),
    ) {
        (Ok(apiserver), Ok(etcd)) => Listeners { apiserver, etcd },
        (Err(e), _) => {
            return fail(&format!(
                "binding {}: {e} (pass --apiserver-address)",
                args.apiserver_address
            ));
        }
        (_, Err(e)) => {
            return fail(&format!(
                "binding {}: {e} (pass --etcd-address)",
                args.etcd_address
            ));
        }
    };
    if let Err(e) = netns::enter() {
        return fail(&format!("setting up the pod network: {e}"));
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return fail(&format!("starting the runtime: {e}")),
    };
    match runtime.block_on(run(args, listeners)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&format!("{e:#}")),
    }
}

fn fail(message: &str) -> ExitCode {
    eprintln!("demo: error: {message}");
    ExitCode::FAILURE
}

/// Host sockets forwarded into the pod network.
struct Listeners {
    apiserver: std::net::TcpListener,
    etcd: std::net::TcpListener,
}

/// What the demo runs, read before anything starts.
struct Plan {
    args: Args,
    /// The example's text, applied as it is.
    example: String,
    /// Its name.
    name: String,
    started: Instant,
    listeners: Listeners,
}

impl Plan {
    fn step(&self, what: &str) {
        step(self.started, what);
    }
}

async fn run(args: Args, listeners: Listeners) -> anyhow::Result<()> {
    let started = Instant::now();
    let tools = Tools::from_env()?;
    let binaries = OperatorBinaries::locate()?;
    let example = std::fs::read_to_string(&args.example)
        .with_context(|| format!("reading {}", args.example.display()))?;
    let cluster: EtcdCluster = serde_yaml::from_str(&example)
        .with_context(|| format!("{} is not an EtcdCluster", args.example.display()))?;
    let name = cluster
        .metadata
        .name
        .clone()
        .context("the example has no metadata.name")?;
    let version = cluster
        .spec
        .version
        .as_deref()
        .unwrap_or(etcd_shared::version::DEFAULT_VERSION)
        .trim_start_matches('v')
        .to_owned();
    let images = if args.real_node {
        // The real node imports these images; nothing is pulled.
        let images: Vec<String> = ["controller", "webhook", "coredns"]
            .map(String::from)
            .into_iter()
            .chain([format!("etcd-{version}")])
            .collect();
        for image in &images {
            real_node::image_archive(image)?;
        }
        images
    } else {
        // The process kubelet runs the etcd that hack/build-tools.sh built for the version.
        tools.etcd(&version).with_context(|| {
            format!("the example asks for etcd {version}, which this machine has not built")
        })?;
        Vec::new()
    };
    let real = args.real_node;
    let plan = Plan {
        args,
        example,
        name,
        started,
        listeners,
    };

    let mut options = if real {
        plan.step(
            "starting the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler)",
        );
        real_node::control_plane_options()
    } else {
        plan.step("starting the control plane (etcd, kube-apiserver, kube-controller-manager)");
        control_plane_options()
    };
    options.tools = Some(tools.clone());
    let cp = ControlPlane::start(options).await?;
    let result = if real {
        serve_on_a_real_node(&cp, images, plan).await
    } else {
        serve(&cp, &binaries, plan).await
    };
    step(started, "tearing down");
    cp.shutdown();
    result
}

async fn serve(cp: &ControlPlane, binaries: &OperatorBinaries, plan: Plan) -> anyhow::Result<()> {
    plan.step("starting the process kubelet (pods run as local processes)");
    let kubelet = Kubelet::start(
        cp.client(),
        KubeletOptions {
            apiserver_url: Some(cp.apiserver_url().to_owned()),
            tools: Some(cp.tools().clone()),
            ..KubeletOptions::default()
        },
    )
    .await?;
    binaries.register(&kubelet);
    let result = demo(cp, plan).await;
    kubelet.shutdown();
    result
}

/// The demo on a real node: the node with `images` imported, CoreDNS, then the chart with its
/// defaults.
async fn serve_on_a_real_node(
    cp: &ControlPlane,
    images: Vec<String>,
    plan: Plan,
) -> anyhow::Result<()> {
    plan.step("starting a real node (kubelet, kube-proxy, containerd, runc; our images imported)");
    let images: Vec<&str> = images.iter().map(String::as_str).collect();
    let node = RealNode::start(
        cp,
        RealNodeOptions::new("demo-node", cp.tools(), &images)?.with_cluster_dns(),
    )
    .await?;
    plan.step("deploying CoreDNS (the cluster DNS the members' names need)");
    let coredns = cluster_dns::image(&cp.tools().versions().coredns);
    cluster_dns::deploy(&cp.client(), &coredns, Duration::from_secs(120)).await?;
    let result = demo(cp, plan).await;
    if result.is_err() {
        eprintln!("{}", node.log_tails(20));
    }
    result
}

async fn demo(cp: &ControlPlane, plan: Plan) -> anyhow::Result<()> {
    let Plan {
        args,
        example,
        name,
        started,
        listeners,
    } = plan;
    let args = &args;
    step(
        started,
        "helm install etcd-operator charts/etcd-operator (waits for the operator pods)",
    );
    let release = Release::new("etcd-operator", "etcd-operator");
    let release = if args.real_node {
        release.on_real_node()
    } else {
        release
    };
    release.install(cp, &[]).await?;
    let cert_manager = if args.cert_manager {
        step(
            started,
            &format!(
                "starting cert-manager (controller, webhook, CRDs) and a CA Issuer etcd-ca in {}",
                args.namespace
            ),
        );
        let cm = etcd_tests::cert_manager::CertManager::start(cp).await?;
        etcd_tests::cert_manager::ca_issuer(
            cp.client(),
            &args.namespace,
            "etcd-ca",
            Duration::from_secs(args.timeout),
        )
        .await?;
        Some(cm)
    } else {
        None
    };

    step(
        started,
        &format!(
            "kubectl apply -n {} -f {}",
            args.namespace,
            args.example.display()
        ),
    );
    apply(cp, &args.namespace, &example).await?;

    step(
        started,
        &format!("waiting until EtcdCluster {name} is Available with every member ready"),
    );
    let clusters: Api<EtcdCluster> = Api::namespaced(cp.client(), &args.namespace);
    let ready = await_condition(
        clusters,
        &name,
        |c: Option<&EtcdCluster>| c.is_some_and(is_settled),
        Duration::from_secs(args.timeout),
    )
    .await?;
    if ready.is_none() {
        bail!("EtcdCluster {name} was deleted");
    }
    let table = kubectl(cp, &["get", "etcdclusters", "-A", "-o", "wide"]).await?;
    step(started, "ready");
    println!("\n$ kubectl get etcdclusters -A -o wide\n{table}");

    // Forward the host's loopback into the pod network.
    listeners.apiserver.set_nonblocking(true)?;
    listeners.etcd.set_nonblocking(true)?;
    let api_target: SocketAddr = cp
        .apiserver_url()
        .trim_start_matches("https://")
        .parse()
        .context("the API server URL is not https://IP:PORT")?;
    tokio::spawn(forward(
        TcpListener::from_std(listeners.apiserver)?,
        move || async move { Ok(api_target) },
    ));
    let endpoints = ClientEndpoints::new(cp.client(), &args.namespace, &name);
    tokio::spawn(forward(TcpListener::from_std(listeners.etcd)?, move || {
        let endpoints = endpoints.clone();
        async move { endpoints.next().await }
    }));

    let files = write_state(args, cp, &name).await?;
    println!(
        "The demo keeps running until Ctrl-C or `hack/demo.sh down`.\n\n\
         In another shell:\n  \
         source {env}\n  \
         kubectl get etcdclusters,pods,pvc -A\n  \
         etcdctl put hello world && etcdctl get hello\n  \
         etcdctl member list -w table\n  \
         kubectl patch etcdcluster {name} --type merge -p '{{\"spec\":{{\"size\":5}}}}'\n",
        env = files.env.display(),
    );
    if let Some(cm) = &cert_manager {
        println!(
            "cert-manager {} runs, with the CA Issuer etcd-ca in {ns}. A cluster with member TLS from it:\n\n\
             kubectl apply -n {ns} -f - <<EOF\n\
             apiVersion: etcd.database.coreos.com/v1beta2\n\
             kind: EtcdCluster\n\
             metadata: {{name: tls-demo}}\n\
             spec:\n  size: 3\n  TLS:\n    certManager:\n      issuerRef: {{name: etcd-ca, kind: Issuer}}\n\
             EOF\n",
            cm.version(),
            ns = args.namespace,
        );
    }
    shutdown_signal().await;
    for file in [&files.pid, &files.env, &files.kubeconfig] {
        let _ = std::fs::remove_file(file);
    }
    Ok(())
}

/// `kubectl apply` of the example as written, in `namespace` (through the installed webhook),
/// echoing kubectl.
async fn apply(cp: &ControlPlane, namespace: &str, example: &str) -> anyhow::Result<()> {
    let mut kubectl = cp.kubectl();
    kubectl.args(["--namespace", namespace]);
    let out = kubectl_apply(kubectl, example)
        .await
        .context("running kubectl apply")?;
    print!("    {}", String::from_utf8_lossy(&out.stdout));
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        println!("    {line}");
    }
    if !out.status.success() {
        bail!("kubectl apply failed");
    }
    Ok(())
}

async fn kubectl(cp: &ControlPlane, args: &[&str]) -> anyhow::Result<String> {
    let out = tokio::process::Command::from(cp.kubectl())
        .args(args)
        .output()
        .await
        .context("running kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Accepts connections on `listener` and pipes each to the address `target` picks.
async fn forward<F, Fut>(listener: TcpListener, target: F)
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = anyhow::Result<SocketAddr>> + Send + 'static,
{
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        let target = target();
        tokio::spawn(async move {
            let result = async {
                let address = target.await?;
                let mut outbound = TcpStream::connect(address)
                    .await
                    .with_context(|| format!("connecting to {address}"))?;
                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await?;
                anyhow::Ok(())
            }
            .await;
            let reset = result
                .as_ref()
                .err()
                .and_then(|e| e.downcast_ref::<std::io::Error>())
                .is_some_and(|e| {
                    matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
                    )
                });
            if let Err(e) = result.as_ref()
                && !reset
            {
                eprintln!("demo: forwarding: {e:#}");
            }
        });
    }
}

/// The ready endpoints of a cluster's client Service, taken in turn (what kube-proxy does
/// for a ClusterIP).
#[derive(Clone)]
struct ClientEndpoints {
    slices: Api<EndpointSlice>,
    service: String,
    turn: Arc<AtomicUsize>,
}

impl ClientEndpoints {
    fn new(client: Client, namespace: &str, cluster: &str) -> Self {
        Self {
            slices: Api::namespaced(client, namespace),
            service: client_service_name(cluster),
            turn: Arc::default(),
        }
    }

    async fn next(&self) -> anyhow::Result<SocketAddr> {
        let ready: Vec<SocketAddr> = ready_addresses(&self.slices, &self.service)
            .await?
            .iter()
            .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, CLIENT_PORT_U16))
            .collect();
        if ready.is_empty() {
            bail!("Service {} has no ready endpoint", self.service);
        }
        Ok(ready[self.turn.fetch_add(1, Ordering::Relaxed) % ready.len()])
    }
}

/// Files the demo leaves for the user's shell.
struct StateFiles {
    env: PathBuf,
    kubeconfig: PathBuf,
    pid: PathBuf,
}

async fn write_state(args: &Args, cp: &ControlPlane, cluster: &str) -> anyhow::Result<StateFiles> {
    let dir = &args.state_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut kubeconfig = cp.kubeconfig().clone();
    for named in &mut kubeconfig.clusters {
        if let Some(c) = named.cluster.as_mut() {
            c.server = Some(format!("https://{}", args.apiserver_address));
        }
    }
    let kubeconfig_path = dir.join("kubeconfig");
    etcd_tests::kubeconfig::write(&kubeconfig, &kubeconfig_path)?;
    let etcd_bin = cp
        .tools()
        .etcdctl(etcd_shared::version::DEFAULT_VERSION)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let kubectl_bin = cp
        .tools()
        .kubectl()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let mut path = String::new();
    for dir in [etcd_bin, kubectl_bin].into_iter().flatten() {
        path.push_str(&format!("{}:", dir.display()));
    }
    let env = dir.join("env");
    std::fs::write(
        &env,
        format!(
            "# The etcd-operator demo (cluster {cluster}); source this file.\n\
             export KUBECONFIG={kubeconfig}\n\
             export ETCDCTL_ENDPOINTS={etcd}\n\
             export PATH={path}\"$PATH\"\n",
            kubeconfig = kubeconfig_path.display(),
            etcd = args.etcd_address,
        ),
    )?;
    let pid = dir.join("demo.pid");
    std::fs::write(&pid, std::process::id().to_string())?;
    Ok(StateFiles {
        env,
        kubeconfig: kubeconfig_path,
        pid,
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
