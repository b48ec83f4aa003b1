//! Starts and stops the local control plane N times and prints startup figures.
//!
//! ```text
//! cargo run -p etcd-tests --bin bench_control_plane -- [N]    # N defaults to 5
//! ```
//!
//! Times are measured from the start of `ControlPlane::start`: etcd `/readyz`, kube-apiserver
//! `/readyz`, kube-controller-manager working (its serviceaccount controller created
//! `default/default`), and how long `shutdown` took.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_tests::control_plane::{ControlPlane, ControlPlaneOptions};

fn summary(label: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let (Some(min), Some(max)) = (samples.first(), samples.last()) else {
        return;
    };
    let mid = samples.len() / 2;
    let median = if samples.len().is_multiple_of(2) {
        (samples[mid - 1] + samples[mid]) / 2
    } else {
        samples[mid]
    };
    println!(
        "{label:<28} median {:>7.3}s   min {:>7.3}s   max {:>7.3}s",
        median.as_secs_f64(),
        min.as_secs_f64(),
        max.as_secs_f64()
    );
}

fn main() -> anyhow::Result<()> {
    let runs: usize = match std::env::args().nth(1) {
        Some(n) => n.parse().context("usage: bench_control_plane [N]")?,
        None => 5,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let (mut etcd, mut apiserver, mut kcm, mut stop) = (vec![], vec![], vec![], vec![]);
    for i in 1..=runs {
        let cp = runtime
            .block_on(ControlPlane::start(ControlPlaneOptions::default()))
            .with_context(|| format!("run {i}: starting the control plane"))?;
        let t = cp.timings();
        let kcm_ready = t
            .controller_manager_ready
            .context("the controller manager was not started")?;
        println!(
            "run {i}/{runs}: etcd {:.3}s  apiserver {:.3}s  controller-manager {:.3}s",
            t.etcd_ready.as_secs_f64(),
            t.apiserver_ready.as_secs_f64(),
            kcm_ready.as_secs_f64()
        );
        etcd.push(t.etcd_ready);
        apiserver.push(t.apiserver_ready);
        kcm.push(kcm_ready);
        let begin = Instant::now();
        drop(cp);
        stop.push(begin.elapsed());
    }
    println!("--- {runs} runs ---");
    summary("etcd /readyz", etcd);
    summary("kube-apiserver /readyz", apiserver);
    summary("controller manager up", kcm);
    summary("shutdown (drop)", stop);
    Ok(())
}
