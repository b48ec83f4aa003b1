//! The webhook binary as a child process, for the benchmarks: start it with a fresh
//! certificate, read its addresses from its first log lines, read its memory from `/proc`,
//! stop it with SIGTERM.
#![allow(dead_code)] // each benchmark uses a part

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

use crate::support::{Ca, write_pair};

/// A started `etcd-webhook`.
pub struct Server {
    /// The process.
    pub child: Child,
    /// Its HTTPS admission address.
    pub addr: SocketAddr,
    /// Its metrics address.
    pub metrics: SocketAddr,
}

/// glibc's allocator settings of the chart and the image: large buffers always mmapped (so
/// they return to the system when freed; the dynamic threshold otherwise rises after the
/// first large free and later bodies stay in the heap) and two arenas.
pub const GLIBC_TUNABLES: &str = "glibc.malloc.mmap_threshold=131072:glibc.malloc.arena_max=2";

/// Starts the binary at `binary` on loopback with a certificate of `ca` written to `dir`, the
/// `extra` flags and the chart's [`GLIBC_TUNABLES`] (unless `tuned` is false), and waits
/// until it logs that it serves.
pub fn start_server(binary: &str, dir: &Path, ca: &Ca, extra: &[String]) -> Server {
    start_server_tuned(binary, dir, ca, extra, true)
}

/// [`start_server`], with or without the chart's allocator settings.
pub fn start_server_tuned(
    binary: &str,
    dir: &Path,
    ca: &Ca,
    extra: &[String],
    tuned: bool,
) -> Server {
    let (cert, key) = write_pair(dir, &ca.issue(1));
    let mut child = Command::new(binary)
        .arg(format!("--tls-cert-file={}", cert.display()))
        .arg(format!("--tls-private-key-file={}", key.display()))
        .args([
            "--bind-address=127.0.0.1:0",
            "--metrics-bind-address=127.0.0.1:0",
            "--health-probe-bind-address=127.0.0.1:0",
            "--log-format=json",
            "--log-level=info",
        ])
        .args(extra)
        .env_remove("GLIBC_TUNABLES")
        .envs(tuned.then_some(("GLIBC_TUNABLES", GLIBC_TUNABLES)))
        .stderr(Stdio::piped())
        .spawn()
        .expect("start etcd-webhook");
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr")).lines();
    let (addr, metrics) = loop {
        let line = lines
            .next()
            .expect("etcd-webhook exited before serving")
            .expect("read the log");
        let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
        if v["message"] == "etcd-webhook serving" {
            let metrics = v["metrics"].as_str().expect("metrics address");
            let metrics = metrics.trim_start_matches("Some(").trim_end_matches(')');
            break (
                v["admission"]
                    .as_str()
                    .expect("admission address")
                    .parse()
                    .expect("an address"),
                metrics.parse().expect("an address"),
            );
        }
    };
    // Keep draining the log so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Server {
        child,
        addr,
        metrics,
    }
}

/// (`VmHWM`, `VmRSS`) of `pid` in KiB.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// Resets the peak RSS (`VmHWM`) of `pid` to its current RSS.
pub fn reset_peak(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").expect("reset VmHWM");
}

/// Stops the server with SIGTERM and waits for it.
pub fn stop(server: &mut Server) -> std::process::ExitStatus {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(server.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    server.child.wait().expect("wait for etcd-webhook")
}
