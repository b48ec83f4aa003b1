//! Load benchmark of the webhook binary: starts `etcd-webhook` (the release build under
//! `cargo bench`) as a child process pinned to one CPU, drives it over keep-alive TLS
//! connections from the other CPU, and reports requests/s, latency percentiles, the server's
//! CPU use and its peak RSS (`VmHWM`).
//!
//! ```sh
//! cargo bench -p etcd-webhook --bench admission              # 3 runs of 3 s per phase
//! cargo bench -p etcd-webhook --bench admission -- --runs 5 --seconds 5
//! ```
//!
//! Phases: closed loop (each connection sends its next request when the answer arrives) at
//! 1, 4, 16 and 64 connections on `/validate` and 16 on `/mutate`, against a server pinned to
//! one CPU with one runtime thread; then an open loop at a fixed 1,000 requests/s against an
//! unpinned server with its default threads, whose latency counts from each request's
//! scheduled send time (so a stalled server cannot hide queueing). "server p99" is read from
//! the server's own duration histogram (a bucket bound). Figures are medians over the runs.

#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use process::{Server, memory_kib, stop};
use serde_json::{Value, json};
use support::{Ca, Conn, client_config, cluster, review};

struct Options {
    runs: usize,
    seconds: f64,
    rate: u64,
}

fn options() -> Options {
    let mut o = Options {
        runs: 3,
        seconds: 3.0,
        rate: 1000,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => o.runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(o.runs),
            "--seconds" => {
                o.seconds = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(o.seconds)
            }
            "--rate" => o.rate = args.next().and_then(|v| v.parse().ok()).unwrap_or(o.rate),
            _ => {} // cargo bench passes --bench
        }
    }
    o
}

/// The CPUs this process may use.
fn cpus() -> Vec<usize> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
    (0..nix::sched::CpuSet::count())
        .filter(|&i| set.is_set(i).unwrap_or(false))
        .collect()
}

fn pin(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    set.set(cpu).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

fn unpin(all: &[usize]) {
    let mut set = nix::sched::CpuSet::new();
    for &c in all {
        set.set(c).unwrap();
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// Starts the binary, pinned to `cpu` with one runtime thread if given (children inherit the
/// affinity of this process at spawn time), else free with the default threads.
fn start_server(dir: &std::path::Path, ca: &Ca, cpu: Option<usize>, all: &[usize]) -> Server {
    if let Some(cpu) = cpu {
        pin(cpu);
    }
    let extra: Vec<String> = cpu
        .map(|_| "--worker-threads=1".to_string())
        .into_iter()
        .collect();
    let server = process::start_server(env!("CARGO_BIN_EXE_etcd-webhook"), dir, ca, &extra);
    unpin(all);
    server
}

/// CPU seconds (user + system) used by `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // Fields 14 and 15 of stat (utime, stime), counted after the ")" from field 3.
    // /proc reports clock ticks in USER_HZ, which Linux fixes at 100.
    let hz = 100.0;
    (ticks(11) + ticks(12)) / hz
}

#[derive(Clone, Copy, Default)]
struct Figures {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    max_us: f64,
    server_cpu: f64,
    /// Upper bound of the server's own p99 (its duration histogram), µs.
    server_p99_us: f64,
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64
}

fn figures(mut latencies: Vec<u32>, elapsed: Duration, cpu: f64) -> Figures {
    latencies.sort_unstable();
    Figures {
        rps: latencies.len() as f64 / elapsed.as_secs_f64(),
        p50_us: percentile(&latencies, 0.50),
        p99_us: percentile(&latencies, 0.99),
        max_us: latencies.last().copied().unwrap_or(0) as f64,
        server_cpu: cpu / elapsed.as_secs_f64(),
        server_p99_us: f64::NAN,
    }
}

async fn connections(addr: SocketAddr, ca: &Ca, n: usize) -> Vec<Conn> {
    let config = client_config(
        &ca.cert_pem,
        &[b"http/1.1"],
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    );
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        conns.push(Conn::connect(addr, config.clone()).await.expect("connect"));
    }
    conns
}

async fn send(conn: &mut Conn, path: &str, body: &hyper::body::Bytes) {
    let reply = conn
        .post_raw(path, Some("application/json"), body.clone())
        .await
        .expect("request");
    assert_eq!(reply.status, hyper::StatusCode::OK);
}

/// Closed loop: `n` connections, each sending its next request when the answer arrives.
async fn closed_loop(
    server: &Server,
    ca: &Ca,
    path: &'static str,
    body: &hyper::body::Bytes,
    n: usize,
    seconds: f64,
) -> Figures {
    let conns = connections(server.addr, ca, n).await;
    let warmup = Duration::from_millis(300);
    let run = Duration::from_secs_f64(seconds);
    let start = Instant::now();
    let measure_from = start + warmup;
    let end = measure_from + run;
    let pid = server.child.id();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::with_capacity(65_536);
                loop {
                    let sent = Instant::now();
                    if sent >= end {
                        break;
                    }
                    send(&mut conn, path, &body).await;
                    if sent >= measure_from {
                        latencies.push(sent.elapsed().as_micros() as u32);
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu_before = cpu_seconds(pid);
    tokio::time::sleep_until(end.into()).await;
    let cpu_after = cpu_seconds(pid);
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    figures(all, run, cpu_after - cpu_before)
}

/// Open loop: requests scheduled at `rate` per second over a pool of connections; latency
/// counts from the scheduled time.
async fn open_loop(
    server: &Server,
    ca: &Ca,
    body: &hyper::body::Bytes,
    rate: u64,
    seconds: f64,
) -> Figures {
    let conns = connections(server.addr, ca, 8).await;
    let (tx, rx) = async_channel();
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut conn| {
            let rx = rx.clone();
            let body = body.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while let Some((scheduled, measured)) = rx.recv().await {
                    send(&mut conn, "/validate", &body).await;
                    if measured {
                        latencies.push(Instant::now().duration_since(scheduled).as_micros() as u32);
                    }
                }
                latencies
            })
        })
        .collect();
    drop(rx);
    let warmup = (rate as f64 * 0.3) as u64;
    let total = warmup + (rate as f64 * seconds) as u64;
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let pid = server.child.id();
    // The schedule runs on a thread of its own, sleeping to each send time (nanosleep is
    // precise to tens of microseconds; tokio's timer only to the millisecond).
    let (cpu_before, measure_start) = tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let mut cpu_before = 0.0;
        let mut measure_start = start;
        for i in 0..total {
            let scheduled = start + period.mul_f64(i as f64);
            if i == warmup {
                cpu_before = cpu_seconds(pid);
                measure_start = scheduled;
            }
            let now = Instant::now();
            if scheduled > now {
                std::thread::sleep(scheduled - now);
            }
            tx.blocking_send((scheduled, i >= warmup));
        }
        (cpu_before, measure_start)
    })
    .await
    .unwrap();
    let elapsed = Instant::now().duration_since(measure_start);
    let cpu = cpu_seconds(pid) - cpu_before;
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let mut f = figures(all, elapsed, cpu);
    f.rps = (total - warmup) as f64 / elapsed.as_secs_f64();
    f
}

/// A tiny multi-consumer channel over a tokio mutex-guarded receiver.
fn async_channel() -> (Tx, Rx) {
    let (tx, rx) = tokio::sync::mpsc::channel(4096);
    (Tx(tx), Rx(Arc::new(tokio::sync::Mutex::new(rx))))
}

struct Tx(tokio::sync::mpsc::Sender<(Instant, bool)>);

impl Tx {
    fn blocking_send(&self, item: (Instant, bool)) {
        let _ = self.0.blocking_send(item);
    }
}

#[derive(Clone)]
struct Rx(Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<(Instant, bool)>>>);

impl Rx {
    async fn recv(&self) -> Option<(Instant, bool)> {
        self.0.lock().await.recv().await
    }
}

/// The server's duration histogram of `endpoint`: (upper bound in s, cumulative count).
async fn histogram(server: &Server, endpoint: &str) -> Vec<(f64, f64)> {
    let reply = support::http_get(server.metrics, "/metrics").await.unwrap();
    let samples = support::parse_prometheus(&reply.text()).unwrap();
    samples
        .iter()
        .filter(|s| {
            s.name == "etcd_webhook_request_duration_seconds_bucket"
                && s.labels["endpoint"] == endpoint
        })
        .map(|s| {
            let le = s.labels["le"].parse().unwrap_or(f64::INFINITY);
            (le, s.value)
        })
        .collect()
}

/// The smallest bucket bound under which 99% of the requests between two snapshots fell, µs.
fn server_p99(before: &[(f64, f64)], after: &[(f64, f64)]) -> f64 {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let total = delta.last().map(|d| d.1).unwrap_or(0.0);
    delta
        .iter()
        .find(|(_, n)| *n >= 0.99 * total)
        .map(|(le, _)| le * 1e6)
        .unwrap_or(f64::NAN)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn body(path: &str) -> hyper::body::Bytes {
    let spec = json!({
        "size": 3,
        "version": "3.6.16",
        "pod": {
            "labels": {"team": "storage"},
            "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
            "etcdEnv": [{"name": "ETCD_QUOTA_BACKEND_BYTES", "value": "8589934592"}],
            "persistentVolumeClaimSpec": {"storageClassName": "fast", "resources": {"requests": {"storage": "8Gi"}}}
        }
    });
    let mut spec = spec;
    if path == "/mutate" {
        spec.as_object_mut().unwrap().remove("version");
    }
    let r = review(
        "0b5d3a8e-7f43-4c3e-9d62-3f0c2e8a9b71",
        "CREATE",
        cluster("bench", spec),
        Value::Null,
    );
    serde_json::to_vec(&r).unwrap().into()
}

fn main() {
    let o = options();
    let all_cpus = cpus();
    let (server_cpu, client_cpu) = match all_cpus.as_slice() {
        [a, b, ..] => (Some(*a), Some(*b)),
        _ => (None, None),
    };
    let ca = Ca::new();
    let validate = body("/validate");
    let mutate = body("/mutate");
    println!(
        "etcd-webhook admission benchmark: {} run(s), {} s per phase, server on CPU {:?} (1 runtime thread), client on CPU {:?}; request body {} bytes",
        o.runs,
        o.seconds,
        server_cpu,
        client_cpu,
        validate.len()
    );
    // The admission work alone, in this process: no TLS, no HTTP.
    let reviewer = etcd_webhook::admission::Reviewer::default();
    for (endpoint, b) in [
        (etcd_webhook::admission::Endpoint::Validate, &validate),
        (etcd_webhook::admission::Endpoint::Mutate, &mutate),
    ] {
        let n = 20_000;
        let started = Instant::now();
        for _ in 0..n {
            std::hint::black_box(reviewer.review(endpoint, b).unwrap());
        }
        println!(
            "in-process {}: {:.1} µs per review (no TLS, no HTTP)",
            endpoint.as_str(),
            started.elapsed().as_secs_f64() * 1e6 / n as f64
        );
    }
    let phases: Vec<(String, &'static str, usize)> = vec![
        ("validate c=1".into(), "/validate", 1),
        ("validate c=4".into(), "/validate", 4),
        ("validate c=16".into(), "/validate", 16),
        ("validate c=64".into(), "/validate", 64),
        ("mutate c=16".into(), "/mutate", 16),
    ];
    let mut results: Vec<Vec<Figures>> = vec![Vec::new(); phases.len() + 1];
    let mut peaks = Vec::new();
    let mut idle = Vec::new();
    for run in 0..o.runs {
        let dir = tempfile::tempdir().unwrap();
        let mut server = start_server(dir.path(), &ca, server_cpu, &all_cpus);
        idle.push(memory_kib(server.child.id()).1);
        if let Some(cpu) = client_cpu {
            pin(cpu);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            for (i, (_, path, n)) in phases.iter().enumerate() {
                let b = if *path == "/mutate" {
                    &mutate
                } else {
                    &validate
                };
                let endpoint = path.trim_start_matches('/');
                let before = histogram(&server, endpoint).await;
                let mut f = closed_loop(&server, &ca, path, b, *n, o.seconds).await;
                f.server_p99_us = server_p99(&before, &histogram(&server, endpoint).await);
                results[i].push(f);
            }
        });
        drop(rt);
        unpin(&all_cpus);
        let (hwm, rss) = memory_kib(server.child.id());
        peaks.push(hwm);
        let status = stop(&mut server);
        println!(
            "run {}: pinned server: peak RSS {:.1} MiB, RSS at end {:.1} MiB, exit on SIGTERM: {status}",
            run + 1,
            hwm as f64 / 1024.0,
            rss as f64 / 1024.0
        );

        // The open loop asks for latency, not throughput: neither side is pinned (a pinned
        // process waits whenever something else runs on its CPU) and the server has its
        // default threads.
        let mut server = start_server(dir.path(), &ca, None, &all_cpus);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let before = histogram(&server, "validate").await;
            let mut f = open_loop(&server, &ca, &validate, o.rate, o.seconds).await;
            f.server_p99_us = server_p99(&before, &histogram(&server, "validate").await);
            results[phases.len()].push(f);
        });
        let (hwm, _) = memory_kib(server.child.id());
        let status = stop(&mut server);
        println!(
            "run {}: free server (default threads): peak RSS {:.1} MiB, exit on SIGTERM: {status}",
            run + 1,
            hwm as f64 / 1024.0,
        );
        peaks.push(hwm);
    }
    println!();
    println!(
        "{:<20} {:>10} {:>8} {:>8} {:>8} {:>15} {:>11} {:>14}",
        "phase",
        "requests/s",
        "p50 µs",
        "p99 µs",
        "max µs",
        "server p99 ≤ µs",
        "server CPU",
        "req/s per core"
    );
    let mut names: Vec<String> = phases.iter().map(|p| p.0.clone()).collect();
    names.push(format!("open loop {}/s", o.rate));
    for (name, runs) in names.iter().zip(&results) {
        let m = |f: fn(&Figures) -> f64| median(runs.iter().map(f).collect());
        let cpu = m(|f| f.server_cpu);
        println!(
            "{:<20} {:>10.0} {:>8.0} {:>8.0} {:>8.0} {:>15.0} {:>10.0}% {:>14.0}",
            name,
            m(|f| f.rps),
            m(|f| f.p50_us),
            m(|f| f.p99_us),
            m(|f| f.max_us),
            m(|f| f.server_p99_us),
            cpu * 100.0,
            m(|f| f.rps) / cpu.max(f64::EPSILON)
        );
    }
    let peak = median(peaks.iter().map(|&k| k as f64).collect());
    let start = median(idle.iter().map(|&k| k as f64).collect());
    println!();
    println!(
        "server RSS: {:.1} MiB after start, peak (VmHWM) {:.1} MiB (median over every server started)",
        start / 1024.0,
        peak / 1024.0
    );
}
