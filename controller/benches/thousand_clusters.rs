//! Benchmark: create N `EtcdCluster`s (default 1,000) on the local control plane and time
//! until every one has its objects (peer and client Services, disruption budget, seed pod),
//! with the release controller binary running as its own process; then report its RSS and the
//! server-side applies it sent per reconcile (its `/metrics`), while the clusters were created
//! and at rest.
//!
//! `cargo bench -p etcd-controller --bench thousand_clusters [-- N]`

use std::os::unix::process::CommandExt as _;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};

use etcd_shared::{EtcdCluster, EtcdClusterSpec};
use etcd_tests::{ControlPlane, ControlPlaneOptions};

/// A command line the controller is run under (a profiler), before its own.
const WRAPPER_ENV: &str = "ETCD_BENCH_CONTROLLER_WRAPPER";

fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The controller's `/metrics` text.
async fn scrape(port: u16) -> anyhow::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response)
}

/// The sum of every series of `metric` (all label values).
fn total(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// Server-side applies and reconciles (ok or failed) so far.
async fn applies_and_reconciles(port: u16) -> anyhow::Result<(f64, f64)> {
    let text = scrape(port).await?;
    Ok((
        total(&text, "etcd_controller_applies_total"),
        total(&text, "etcd_controller_reconcile_total"),
    ))
}

fn per_reconcile((applies, reconciles): (f64, f64)) -> String {
    format!(
        "{applies:.0} applies in {reconciles:.0} reconciles: {:.2} per reconcile",
        if reconciles > 0.0 {
            applies / reconciles
        } else {
            0.0
        }
    )
}

async fn count<K>(api: &Api<K>, selector: &str) -> anyhow::Result<usize>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list_metadata(&ListParams::default().labels(selector))
        .await?
        .items
        .len())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(1000);
    let cp = ControlPlane::start(ControlPlaneOptions {
        controller_manager: false,
        ..ControlPlaneOptions::default()
    })
    .await?;
    let client = cp.client();
    // Every CRD the controller serves, as the chart installs them (a kind without its CRD
    // would be a watch failing and retrying beside the measurement).
    etcd_tests::crds::install_all(&client, Duration::from_secs(60)).await?;
    let ns = "bench";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;

    let [metrics, probes] = etcd_tests::ports::free_ports::<2>()?;
    // `ETCD_BENCH_CONTROLLER_WRAPPER="heaptrack -o /tmp/controller"` runs the controller under
    // a profiler (the RSS figures are then the wrapper's, not the controller's).
    let wrapper = std::env::var(WRAPPER_ENV).unwrap_or_default();
    let mut words = wrapper.split_whitespace();
    let controller_bin = env!("CARGO_BIN_EXE_etcd-controller");
    let mut command = match words.next() {
        Some(program) => {
            let mut c = std::process::Command::new(program);
            c.args(words).arg(controller_bin);
            c
        }
        None => std::process::Command::new(controller_bin),
    };
    let mut controller = command
        .arg("--kubeconfig")
        .arg(cp.kubeconfig_path())
        .args([
            "--namespace",
            ns,
            "--concurrent-reconciles",
            "8",
            "--log-level",
            "warn",
        ])
        .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
        .arg(format!("--health-probe-bind-address=127.0.0.1:{probes}"))
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        // Its own process group: a wrapper's child is stopped with it.
        .process_group(0)
        .spawn()
        .context("starting the controller")?;
    let pid = controller.id();
    let rss_idle = {
        // Wait for readiness before measuring the empty controller.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", probes)).is_ok() {
                break;
            }
            if Instant::now() > deadline {
                bail!("controller probe port never opened");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        rss_kib(pid, "VmRSS:")
    };

    let api: Api<EtcdCluster> = Api::namespaced(client.clone(), ns);
    let start = Instant::now();
    stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                let c = EtcdCluster::new(
                    &format!("c{i}"),
                    EtcdClusterSpec {
                        size: Some(3),
                        ..EtcdClusterSpec::default()
                    },
                );
                api.create(&PostParams::default(), &c).await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await?;
    let created = start.elapsed();
    println!("created {n} EtcdClusters in {:.1} s", created.as_secs_f64());

    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let services: Api<Service> = Api::namespaced(client.clone(), ns);
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), ns);
    let selector = "app.kubernetes.io/managed-by=etcd-operator";
    // 300 s, or 0.3 s per cluster for more than 1,000.
    let limit = Duration::from_secs(300).max(Duration::from_millis(300) * n as u32);
    let deadline = Instant::now() + limit;
    let mut next_report = Instant::now();
    loop {
        let (p, s, b) = (
            count(&pods, selector).await?,
            count(&services, selector).await?,
            count(&pdbs, selector).await?,
        );
        if p >= n && s >= 2 * n && b >= n {
            break;
        }
        if Instant::now() >= next_report {
            println!(
                "  {:5.1} s: {p} seed pods, {s} services, {b} budgets",
                start.elapsed().as_secs_f64()
            );
            next_report += Duration::from_secs(5);
        }
        if Instant::now() > deadline {
            bail!(
                "after {} s only {p} pods, {s} services, {b} budgets",
                limit.as_secs()
            );
        }
        // Each poll lists every object of three kinds: 250 ms per 1,000 clusters, so the
        // benchmark's own lists do not become the API server's main load.
        tokio::time::sleep(Duration::from_millis(250 * (n as u64).div_ceil(1000))).await;
    }
    let all_objects = start.elapsed();
    println!(
        "all {n} clusters have their Services, budget and seed pod after {:.1} s",
        all_objects.as_secs_f64()
    );
    let created_counts = applies_and_reconciles(metrics).await?;
    println!("while creating: {}", per_reconcile(created_counts));
    let statuses = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|c| c.status.is_some())
        .count();
    println!("{statuses} of {n} have a status");
    // At rest: the clusters wait for members that never start (no kubelet); give the
    // periodic requeues a few rounds, then read the memory.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let rss = rss_kib(pid, "VmRSS:");
    let hwm = rss_kib(pid, "VmHWM:");
    // Anonymous memory (heap, stacks) and the mapped binary's pages.
    let (anon, file) = (rss_kib(pid, "RssAnon:"), rss_kib(pid, "RssFile:"));
    // Every cluster's periodic reconcile (30 s) falls in the next 20 s or the 15 s before.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let rest = applies_and_reconciles(metrics).await?;
    println!(
        "at rest (35 s): {}",
        per_reconcile((rest.0 - created_counts.0, rest.1 - created_counts.1))
    );
    println!(
        "controller RSS: {} MiB before, {} MiB at rest after {n} clusters (peak {} MiB)",
        rss_idle.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        rss.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        hwm.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
    );
    println!(
        "  at rest: {} MiB anonymous, {} MiB of files (the binary)",
        anon.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        file.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
    );
    // A profiler writes its data when the controller exits on SIGTERM.
    let signal = if wrapper.is_empty() { "-KILL" } else { "-TERM" };
    std::process::Command::new("kill")
        .args([signal, "--", &format!("-{pid}")])
        .status()
        .context("stopping the controller")?;
    controller.wait().ok();
    Ok(())
}
