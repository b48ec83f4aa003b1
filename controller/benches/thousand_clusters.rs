//! Benchmark: create N `EtcdCluster`s (default 1,000) on the local control plane and time
//! until every one has its objects (peer and client Services, disruption budget, seed pod),
//! with the release controller binary running as its own process; then report its RSS.
//!
//! `cargo bench -p etcd-controller --bench thousand_clusters [-- N]`

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, CustomResourceExt, ResourceExt};

use etcd_shared::{EtcdCluster, EtcdClusterSpec};
use etcd_tests::{ControlPlane, ControlPlaneOptions};

fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
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
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = EtcdCluster::crd();
    crds.patch(
        &crd.name_any(),
        &PatchParams::apply("bench").force(),
        &Patch::Apply(&crd),
    )
    .await?;
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(crds, &crd.name_any(), conditions::is_crd_established()),
    )
    .await
    .context("CRD not established")??;
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
    let mut controller = std::process::Command::new(env!("CARGO_BIN_EXE_etcd-controller"))
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
    let deadline = Instant::now() + Duration::from_secs(300);
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
            bail!("after 300 s only {p} pods, {s} services, {b} budgets");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let all_objects = start.elapsed();
    println!(
        "all {n} clusters have their Services, budget and seed pod after {:.1} s",
        all_objects.as_secs_f64()
    );
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
    println!(
        "controller RSS: {} MiB before, {} MiB at rest after {n} clusters (peak {} MiB)",
        rss_idle.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        rss.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
        hwm.map_or("?".into(), |k| format!("{:.1}", k as f64 / 1024.0)),
    );
    controller.kill().ok();
    controller.wait().ok();
    Ok(())
}
