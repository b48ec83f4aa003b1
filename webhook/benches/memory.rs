//! Memory benchmark of the webhook binary: peak RSS while it answers 1, 4 and 16 concurrent
//! maximum-size AdmissionReviews, the RSS left a few seconds after the burst, and how long a
//! small request waits while the burst is being answered.
//!
//! ```sh
//! cargo bench -p etcd-webhook --bench memory
//! cargo bench -p etcd-webhook --bench memory -- --body-size 4194304 --runs 3
//! ```
//!
//! Bodies (each as close to `--body-size` as the shape allows, default the server's 4 MiB
//! limit): `env-entries`, an `etcdEnv` of as many small entries as fit (the densest JSON the
//! rules read: the attack of issue #14); `one-string`, one large env value (text only);
//! `managed-fields`, large `metadata.managedFields` (never read by the rules). Each burst runs
//! on a fresh server, so peaks do not hide each other; `VmHWM` is reset before each burst.
//! The server runs with the chart's `GLIBC_TUNABLES` (`--untuned`: glibc's defaults).

#[path = "../tests/support/process.rs"]
mod process;
#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use hyper::StatusCode;
use hyper::body::Bytes;
use process::{GLIBC_TUNABLES, memory_kib, reset_peak, start_server_tuned, stop};
use serde_json::{Value, json};
use support::{Ca, Conn, client_config, cluster, review};

const BINARY: &str = env!("CARGO_BIN_EXE_etcd-webhook");

struct Options {
    runs: usize,
    body_size: usize,
    tuned: bool,
    /// `bodies`, `connections` or both (the default).
    phase: Option<String>,
    /// Connections of the hostile-connection phase (the default `--max-connections`).
    connections: usize,
    /// Only the bodies of this shape (`env-entries`, `one-string`, ...).
    shape: Option<String>,
}

fn options() -> Options {
    let mut o = Options {
        runs: 3,
        body_size: 4 * 1024 * 1024,
        tuned: true,
        phase: None,
        connections: 256,
        shape: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--runs" => o.runs = args.next().and_then(|v| v.parse().ok()).unwrap_or(o.runs),
            "--body-size" => {
                o.body_size = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(o.body_size)
            }
            "--untuned" => o.tuned = false,
            "--phase" => o.phase = args.next(),
            "--shape" => o.shape = args.next(),
            "--connections" => {
                o.connections = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(o.connections)
            }
            _ => {} // cargo bench passes --bench
        }
    }
    o
}

fn wrap(spec: Value, metadata_extra: Value) -> Vec<u8> {
    let mut object = cluster("bench", spec);
    if let (Some(meta), Some(extra)) = (
        object["metadata"].as_object_mut(),
        metadata_extra.as_object(),
    ) {
        for (k, v) in extra {
            meta.insert(k.clone(), v.clone());
        }
    }
    let r = review(
        "0b5d3a8e-7f43-4c3e-9d62-3f0c2e8a9b71",
        "CREATE",
        object,
        Value::Null,
    );
    serde_json::to_vec(&r).expect("serialize")
}

/// The largest body of `shape` not over `limit` bytes: grows `n` by bisection.
fn body(shape: &str, limit: usize) -> Bytes {
    let make = |n: usize| -> Vec<u8> {
        match shape {
            "env-entries" => {
                let env: Vec<Value> = (0..n)
                    .map(|i| json!({"name": format!("E{i}"), "value": "x"}))
                    .collect();
                wrap(
                    json!({"size": 3, "version": "3.6.16", "pod": {"etcdEnv": env}}),
                    json!({}),
                )
            }
            // The densest spec the webhook decodes: just under its 10,000-value bound.
            "env-at-limit" => {
                let env: Vec<Value> = (0..(n.min(3_300)))
                    .map(|i| json!({"name": format!("E{i}"), "value": "x"}))
                    .collect();
                wrap(
                    json!({"size": 3, "version": "3.6.16", "pod": {"etcdEnv": env}}),
                    json!({}),
                )
            }
            "one-string" => wrap(
                json!({"size": 3, "version": "3.6.16", "pod": {"etcdEnv": [{"name": "BIG", "value": "x".repeat(n)}]}}),
                json!({}),
            ),
            "managed-fields" => {
                let fields: Vec<Value> = (0..n)
                    .map(|i| json!({"manager": format!("m{i}"), "operation": "Apply", "apiVersion": "v1", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:size": {}}}}))
                    .collect();
                wrap(
                    json!({"size": 3, "version": "3.6.16"}),
                    json!({"managedFields": fields}),
                )
            }
            other => panic!("unknown shape {other}"),
        }
    };
    let (mut lo, mut hi) = (1usize, limit);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if make(mid).len() <= limit {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    make(lo).into()
}

async fn connect(addr: SocketAddr, ca: &Ca) -> Conn {
    let config = client_config(
        &ca.cert_pem,
        &[b"http/1.1"],
        &[&rustls::version::TLS13, &rustls::version::TLS12],
    );
    Conn::connect(addr, config).await.expect("connect")
}

struct Burst {
    peak_mib: f64,
    after_mib: f64,
    idle_mib: f64,
    statuses: Vec<StatusCode>,
    burst_ms: f64,
    small_ms: f64,
}

/// A fresh server answers `n` concurrent copies of `big` while a small request is timed.
fn burst(
    dir: &std::path::Path,
    ca: &Ca,
    path: &'static str,
    big: &Bytes,
    small: &Bytes,
    n: usize,
    tuned: bool,
) -> Burst {
    let mut server = start_server_tuned(BINARY, dir, ca, &[], tuned);
    let pid = server.child.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let result = rt.block_on(async {
        let mut conns = Vec::new();
        for _ in 0..n {
            conns.push(connect(server.addr, ca).await);
        }
        let mut probe = connect(server.addr, ca).await;
        // Warm the small path and let the server settle before measuring.
        probe
            .post_raw("/validate", Some("application/json"), small.clone())
            .await
            .expect("small");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle_mib = memory_kib(pid).1 as f64 / 1024.0;
        reset_peak(pid);
        let started = Instant::now();
        let tasks: Vec<_> = conns
            .into_iter()
            .map(|mut c| {
                let big = big.clone();
                tokio::spawn(async move {
                    c.post_raw(path, Some("application/json"), big)
                        .await
                        .map(|r| r.status)
                        .unwrap_or(StatusCode::BAD_GATEWAY)
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let sent = Instant::now();
        let reply = probe
            .post_raw("/validate", Some("application/json"), small.clone())
            .await
            .expect("small");
        assert_eq!(
            reply.status,
            StatusCode::OK,
            "the small request during the burst"
        );
        let small_ms = sent.elapsed().as_secs_f64() * 1e3;
        let mut statuses = Vec::new();
        for t in tasks {
            statuses.push(t.await.expect("task"));
        }
        let burst_ms = started.elapsed().as_secs_f64() * 1e3;
        let peak_mib = memory_kib(pid).0 as f64 / 1024.0;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after_mib = memory_kib(pid).1 as f64 / 1024.0;
        Burst {
            peak_mib,
            after_mib,
            idle_mib,
            statuses,
            burst_ms,
            small_ms,
        }
    });
    stop(&mut server);
    result
}

/// RSS growth of a fresh server holding `n` idle TLS connections (HTTP/1 after one request),
/// per connection, KiB.
fn per_connection_kib(dir: &std::path::Path, ca: &Ca, small: &Bytes, n: usize, tuned: bool) -> f64 {
    let mut server = start_server_tuned(BINARY, dir, ca, &[], tuned);
    let pid = server.child.id();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let kib = rt.block_on(async {
        let mut warm = connect(server.addr, ca).await;
        warm.post_raw("/validate", Some("application/json"), small.clone())
            .await
            .expect("small");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = memory_kib(pid).1;
        let mut conns = Vec::new();
        for _ in 0..n {
            let mut c = connect(server.addr, ca).await;
            c.post_raw("/validate", Some("application/json"), small.clone())
                .await
                .expect("small");
            conns.push(c);
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = memory_kib(pid).1;
        drop(conns);
        (after.saturating_sub(before)) as f64 / n as f64
    });
    stop(&mut server);
    kib
}

/// How a hostile client makes each connection hold what it can outside the memory budget.
#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// HTTP/1 on the admission listener: a request head of just under the 64 KiB bound, never
    /// finished (held until the 10 s header timeout).
    Http1Head,
    /// HTTP/2 on the admission listener: the most streams the server allows, each with just
    /// under the header-list bound and a share of the connection window of body, never
    /// finished (the requests wait for their share of the budget, then are answered 429).
    Http2Streams,
    /// HTTP/1 on the plain metrics listener, whose buffers are the process shell's
    /// (hyper's defaults): a 400 KiB head, never finished, on as many connections as
    /// `--max-admin-connections` allows (32).
    MetricsHead,
}

/// RSS growth of a fresh server while `n` connections each hold what `kind` makes them hold:
/// (idle MiB, MiB with the connections open and idle, peak MiB, KiB per connection at the
/// peak on top of an idle one).
fn hostile_connections(
    dir: &std::path::Path,
    ca: &Ca,
    kind: Hostile,
    n: usize,
    tuned: bool,
) -> (f64, f64, f64, f64) {
    use etcd_webhook::server::{
        HTTP1_MAX_BUF_BYTES, HTTP2_MAX_CONCURRENT_STREAMS, HTTP2_MAX_HEADER_LIST_BYTES,
        HTTP2_WINDOW_BYTES,
    };
    use futures::StreamExt;
    use http_body_util::BodyExt;
    use hyper::body::Frame;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use tokio::io::AsyncWriteExt;

    let mut server = start_server_tuned(BINARY, dir, ca, &[], tuned);
    let pid = server.child.id();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (addr, metrics) = (server.addr, server.metrics);
    let result = rt.block_on(async move {
        let tls = |alpn: &'static [u8]| {
            let config = client_config(&ca.cert_pem, &[alpn], &[&rustls::version::TLS13]);
            async move {
                let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
                let name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
                tokio_rustls::TlsConnector::from(config)
                    .connect(name, tcp)
                    .await
                    .expect("TLS")
            }
        };
        // Every connection is open (idle) before the peak is reset; then each fills up.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let idle_mib = memory_kib(pid).1 as f64 / 1024.0;
        let mut held = Vec::new();
        let mut h2 = Vec::new();
        match kind {
            Hostile::Http1Head => {
                for _ in 0..n {
                    held.push(tls(b"http/1.1").await);
                }
            }
            Hostile::Http2Streams => {
                for _ in 0..n {
                    let io = TokioIo::new(tls(b"h2").await);
                    let (sender, conn) =
                        hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                            .await
                            .expect("h2 handshake");
                    tokio::spawn(conn);
                    h2.push(sender);
                }
            }
            Hostile::MetricsHead => {}
        }
        let mut plain = Vec::new();
        if let Hostile::MetricsHead = kind {
            for _ in 0..n {
                plain.push(
                    tokio::net::TcpStream::connect(metrics)
                        .await
                        .expect("connect"),
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let open_mib = memory_kib(pid).1 as f64 / 1024.0;
        reset_peak(pid);
        let head = |pad: usize| {
            format!(
                "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: {}",
                "p".repeat(pad)
            )
        };
        let mut tasks = Vec::new();
        match kind {
            Hostile::Http1Head => {
                let head = head(HTTP1_MAX_BUF_BYTES - 1024);
                for stream in &mut held {
                    stream.write_all(head.as_bytes()).await.expect("write");
                }
            }
            Hostile::MetricsHead => {
                let head = head(400 * 1024);
                for stream in &mut plain {
                    let _ = stream.write_all(head.as_bytes()).await;
                }
            }
            Hostile::Http2Streams => {
                let streams = HTTP2_MAX_CONCURRENT_STREAMS as usize;
                let share = HTTP2_WINDOW_BYTES as usize / streams;
                let pad = "p".repeat(HTTP2_MAX_HEADER_LIST_BYTES as usize - 1024);
                for sender in &h2 {
                    for _ in 0..streams {
                        let chunk = Bytes::from(vec![b' '; share]);
                        let body = BodyExt::boxed(http_body_util::StreamBody::new(
                            futures::stream::once(async move {
                                Ok::<_, std::convert::Infallible>(Frame::data(chunk))
                            })
                            .chain(futures::stream::pending()),
                        ));
                        let request = hyper::Request::post(format!("https://{addr}/validate"))
                            .header("content-type", "application/json")
                            .header("content-length", "4194304")
                            .header("x-pad", pad.as_str())
                            .body(body)
                            .expect("request");
                        let mut sender = sender.clone();
                        tasks.push(tokio::spawn(async move {
                            let _ = sender.ready().await;
                            let _ = sender.send_request(request).await;
                        }));
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(800)).await;
        let peak_mib = memory_kib(pid).0 as f64 / 1024.0;
        for t in tasks {
            t.abort();
        }
        drop((held, h2, plain));
        (
            idle_mib,
            open_mib,
            peak_mib,
            (peak_mib - open_mib.min(peak_mib)) * 1024.0 / n as f64,
        )
    });
    stop(&mut server);
    result
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let o = options();
    let ca = Ca::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let small: Bytes = wrap(json!({"size": 3, "version": "3.6.16"}), json!({})).into();
    println!(
        "etcd-webhook memory benchmark: {} run(s) per phase, bodies up to {} bytes; medians",
        o.runs, o.body_size
    );
    if o.tuned {
        println!(
            "GLIBC_TUNABLES={GLIBC_TUNABLES} (as the chart sets it; --untuned for glibc's defaults)"
        );
    } else {
        println!("glibc's allocator defaults (no GLIBC_TUNABLES)");
    }
    println!(
        "{:<15} {:>4} {:>10} {:>9} {:>10} {:>11} {:>9} {:>10} {:>10}  answers",
        "body", "n", "bytes", "idle MiB", "peak MiB", "peak/body", "after", "burst ms", "small ms"
    );
    if o.phase.as_deref() != Some("bodies") {
        println!(
            "hostile connections: n at once, idle MiB, open (idle connections) MiB, peak MiB, KiB each on top of an idle connection"
        );
        for kind in [
            Hostile::Http1Head,
            Hostile::Http2Streams,
            Hostile::MetricsHead,
        ] {
            let n = match kind {
                Hostile::MetricsHead => 32,
                _ => o.connections,
            };
            let runs: Vec<(f64, f64, f64, f64)> = (0..o.runs)
                .map(|_| hostile_connections(dir.path(), &ca, kind, n, o.tuned))
                .collect();
            println!(
                "{:<15} {:>4} {:>9.1} {:>9.1} {:>10.1} {:>10.1}",
                format!("{kind:?}"),
                n,
                median(runs.iter().map(|r| r.0).collect()),
                median(runs.iter().map(|r| r.1).collect()),
                median(runs.iter().map(|r| r.2).collect()),
                median(runs.iter().map(|r| r.3).collect()),
            );
        }
        if o.phase.as_deref() == Some("connections") {
            return;
        }
    }
    let per_conn = median(
        (0..o.runs)
            .map(|_| per_connection_kib(dir.path(), &ca, &small, 250, o.tuned))
            .collect(),
    );
    println!("idle TLS connection after one request: {per_conn:.1} KiB each (250 open)");
    for (shape, path) in [
        ("env-entries", "/validate"),
        ("env-at-limit", "/validate"),
        ("env-at-limit", "/mutate"),
        ("one-string", "/validate"),
        ("one-string", "/mutate"),
        ("managed-fields", "/validate"),
    ] {
        if o.shape.as_deref().is_some_and(|only| only != shape) {
            continue;
        }
        let big = body(shape, o.body_size);
        for n in [1usize, 4, 16] {
            let runs: Vec<Burst> = (0..o.runs)
                .map(|_| burst(dir.path(), &ca, path, &big, &small, n, o.tuned))
                .collect();
            let peak = median(runs.iter().map(|b| b.peak_mib).collect());
            let idle = median(runs.iter().map(|b| b.idle_mib).collect());
            let mut answers: Vec<String> = runs[0]
                .statuses
                .iter()
                .map(|s| s.as_u16().to_string())
                .collect();
            answers.sort();
            answers.dedup();
            let admitted = runs[0]
                .statuses
                .iter()
                .filter(|s| s.is_success())
                .count()
                .max(1);
            println!(
                "{:<15} {:>4} {:>10} {:>9.1} {:>10.1} {:>11.2} {:>9.1} {:>10.0} {:>10.1}  {}",
                format!("{shape} {}", &path[1..2]),
                n,
                big.len(),
                idle,
                peak,
                (peak - idle) * 1024.0 * 1024.0 / (big.len() * admitted) as f64,
                median(runs.iter().map(|b| b.after_mib).collect()),
                median(runs.iter().map(|b| b.burst_ms).collect()),
                median(runs.iter().map(|b| b.small_ms).collect()),
                answers.join(",")
            );
        }
    }
}
