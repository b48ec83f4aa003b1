//! Startup, readiness and liveness probes: `httpGet` (plain HTTP), `tcpSocket` and `exec`,
//! with `initialDelaySeconds`, `periodSeconds`, `timeoutSeconds`, `successThreshold` and
//! `failureThreshold` as a kubelet applies them. One task per running container instance
//! reports each *transition* (healthy ↔ unhealthy) to the pod's worker; the worker aborts it
//! when the instance stops.
//!
//! As in a kubelet: readiness starts failed and liveness starts healthy; readiness and liveness
//! only begin after a startup probe succeeded; a liveness or startup probe stops once it has
//! failed (the container is restarted and a new task runs for the new instance). `https`
//! `httpGet` probes and `grpc` probes are reported as failures ("not supported").

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, ContainerPort, HTTPGetAction, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::mpsc;

use super::expand::{MountMap, expand};
use super::images::ImageMapping;
use crate::process::ManagedProcess;

/// Which probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeKind {
    /// `startupProbe`.
    Startup,
    /// `readinessProbe`.
    Readiness,
    /// `livenessProbe`.
    Liveness,
}

/// A probe changed its verdict.
#[derive(Debug, Clone)]
pub struct ProbeEvent {
    /// Index of the container in the pod spec.
    pub container: usize,
    /// The container instance the probe ran against.
    pub generation: u64,
    /// Which probe.
    pub kind: ProbeKind,
    /// The new verdict.
    pub healthy: bool,
    /// The last probe's output (failure reason).
    pub message: String,
}

/// What `exec` probes run in: the container's image, environment and mounts.
#[derive(Debug, Clone)]
pub struct ExecContext {
    /// The container's image.
    pub mapping: ImageMapping,
    /// The container's environment (already mount-rewritten).
    pub env: Vec<(String, String)>,
    /// The container's mounts.
    pub mounts: MountMap,
    /// Working directory.
    pub cwd: PathBuf,
    /// Where the probe commands' output goes.
    pub log: PathBuf,
}

/// What probes talk to.
#[derive(Debug, Clone)]
pub struct ProbeTarget {
    /// The pod IP (default host of `httpGet`, host of `tcpSocket`).
    pub pod_ip: Ipv4Addr,
    /// The container's ports (for named probe ports).
    pub ports: Vec<ContainerPort>,
    /// For `exec` probes.
    pub exec: ExecContext,
}

#[derive(Debug, Clone, Copy)]
struct Params {
    initial_delay: Duration,
    period: Duration,
    timeout: Duration,
    success_threshold: u32,
    failure_threshold: u32,
}

fn seconds(value: Option<i32>, default: u64) -> Duration {
    Duration::from_secs(value.and_then(|v| u64::try_from(v).ok()).unwrap_or(default))
}

fn count(value: Option<i32>, default: u32) -> u32 {
    value
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

impl Params {
    fn of(probe: &Probe) -> Self {
        Self {
            initial_delay: seconds(probe.initial_delay_seconds, 0),
            period: seconds(probe.period_seconds, 10).max(Duration::from_millis(100)),
            timeout: seconds(probe.timeout_seconds, 1).max(Duration::from_millis(100)),
            success_threshold: count(probe.success_threshold, 1),
            failure_threshold: count(probe.failure_threshold, 3),
        }
    }
}

/// Starts the probes of `container` (if it has any) for the instance `generation`, started at
/// `started`. Returns `None` when the container has no probes.
pub fn spawn(
    container: &Container,
    index: usize,
    generation: u64,
    started: Instant,
    target: ProbeTarget,
    events: mpsc::UnboundedSender<ProbeEvent>,
) -> Option<tokio::task::JoinHandle<()>> {
    let startup = container.startup_probe.clone();
    let readiness = container.readiness_probe.clone();
    let liveness = container.liveness_probe.clone();
    if startup.is_none() && readiness.is_none() && liveness.is_none() {
        return None;
    }
    let runner = Runner {
        index,
        generation,
        started: tokio::time::Instant::from_std(started),
        target,
        events,
    };
    Some(tokio::spawn(async move {
        if let Some(probe) = startup
            && !runner.run(ProbeKind::Startup, &probe).await
        {
            return;
        }
        let readiness = async {
            if let Some(probe) = &readiness {
                runner.run(ProbeKind::Readiness, probe).await;
            }
        };
        let liveness = async {
            if let Some(probe) = &liveness {
                runner.run(ProbeKind::Liveness, probe).await;
            }
        };
        tokio::join!(readiness, liveness);
    }))
}

struct Runner {
    index: usize,
    generation: u64,
    started: tokio::time::Instant,
    target: ProbeTarget,
    events: mpsc::UnboundedSender<ProbeEvent>,
}

impl Runner {
    /// Runs one probe. A startup probe returns `true` once it succeeded; every probe returns
    /// `false` when it is done for good (liveness or startup failed, or the worker is gone).
    async fn run(&self, kind: ProbeKind, probe: &Probe) -> bool {
        let params = Params::of(probe);
        tokio::time::sleep_until(self.started + params.initial_delay).await;
        let mut healthy = kind == ProbeKind::Liveness;
        let (mut successes, mut failures) = (0u32, 0u32);
        let mut ticker = tokio::time::interval(params.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if self.events.is_closed() {
                return false;
            }
            let (ok, message) = match check(probe, &self.target, params.timeout).await {
                Ok(()) => (true, String::new()),
                Err(message) => (false, message),
            };
            if ok {
                successes += 1;
                failures = 0;
            } else {
                failures += 1;
                successes = 0;
            }
            let threshold = if kind == ProbeKind::Readiness {
                params.success_threshold
            } else {
                1
            };
            let transition = if ok && !healthy && successes >= threshold {
                Some(true)
            } else if !ok
                && failures >= params.failure_threshold
                && (healthy || kind == ProbeKind::Startup)
            {
                // Readiness starts failed: failures before its first success change nothing.
                // A startup probe fails from its initial state.
                Some(false)
            } else {
                None
            };
            if let Some(verdict) = transition {
                healthy = verdict;
                let event = ProbeEvent {
                    container: self.index,
                    generation: self.generation,
                    kind,
                    healthy,
                    message,
                };
                if self.events.send(event).is_err() {
                    return false;
                }
                match (kind, healthy) {
                    (ProbeKind::Startup, true) => return true,
                    (ProbeKind::Startup | ProbeKind::Liveness, false) => return false,
                    _ => {}
                }
            }
        }
    }
}

fn resolve_port(port: &IntOrString, ports: &[ContainerPort]) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match ports.iter().find(|p| p.name.as_deref() == Some(name)) {
            Some(p) => p.container_port,
            None => name
                .parse()
                .map_err(|_| format!("port {name:?} is not a named container port"))?,
        },
    };
    u16::try_from(number).map_err(|_| format!("invalid port {number}"))
}

/// Runs `probe` once against `target`, within `timeout`.
async fn check(probe: &Probe, target: &ProbeTarget, timeout: Duration) -> Result<(), String> {
    if let Some(http) = &probe.http_get {
        let port = resolve_port(&http.port, &target.ports)?;
        let host = http
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.pod_ip.to_string());
        return match tokio::time::timeout(timeout, http_get(&host, port, http)).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "Get \"http://{host}:{port}{}\": context deadline exceeded",
                http.path.as_deref().unwrap_or("/")
            )),
        };
    }
    if let Some(tcp) = &probe.tcp_socket {
        let port = resolve_port(&tcp.port, &target.ports)?;
        let host = tcp
            .host
            .clone()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| target.pod_ip.to_string());
        return match tokio::time::timeout(
            timeout,
            tokio::net::TcpStream::connect((host.as_str(), port)),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(exec) = &probe.exec {
        return exec_check(
            exec.command.as_deref().unwrap_or_default(),
            &target.exec,
            timeout,
        )
        .await;
    }
    if probe.grpc.is_some() {
        return Err("grpc probes are not supported by the etcd-tests kubelet".into());
    }
    Err("probe has no handler".into())
}

/// A minimal HTTP/1.1 GET: success is a status from 200 to 399, as in a kubelet.
async fn http_get(host: &str, port: u16, action: &HTTPGetAction) -> Result<(), String> {
    let path = action
        .path
        .as_deref()
        .filter(|p| !p.is_empty())
        .unwrap_or("/");
    let url = format!("http://{host}:{port}{path}");
    if action
        .scheme
        .as_deref()
        .is_some_and(|s| s.eq_ignore_ascii_case("https"))
    {
        return Err(format!(
            "{url}: https probes are not supported by the etcd-tests kubelet"
        ));
    }
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("Get \"{url}\": dial tcp {host}:{port}: {e}"))?;
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/etcd-tests\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for header in action.http_headers.iter().flatten() {
        request.push_str(&format!("{}: {}\r\n", header.name, header.value));
    }
    request.push_str("\r\n");
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("Get \"{url}\": {e}"))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 8192 {
        let n = stream
            .read(&mut buf)
            .await
            .map_err(|e| format!("Get \"{url}\": {e}"))?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let code: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| {
            format!(
                "Get \"{url}\": malformed HTTP response {:?}",
                line.lines().next().unwrap_or("")
            )
        })?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(format!("HTTP probe failed with statuscode: {code}"))
    }
}

/// Runs an `exec` probe command in the container's image and environment.
async fn exec_check(
    command: &[String],
    ctx: &ExecContext,
    timeout: Duration,
) -> Result<(), String> {
    let lookup = |name: &str| {
        ctx.env
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let argv: Vec<String> = command
        .iter()
        .map(|a| ctx.mounts.rewrite(&expand(a, lookup)))
        .collect();
    let Some(program) = argv.first() else {
        return Err("exec probe without a command".into());
    };
    let binary = ctx.mapping.resolve(program)?;
    let mut cmd = std::process::Command::new(binary);
    cmd.args(&argv[1..])
        .env_clear()
        .envs(ctx.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&ctx.cwd);
    let mut process = ManagedProcess::start_command("exec probe", cmd, ctx.log.clone(), true)
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = process.exit_status() {
            return if status.success() {
                Ok(())
            } else {
                Err(format!("command {argv:?} exited with {status}"))
            };
        }
        if Instant::now() >= deadline {
            process.kill();
            return Err(format!("command {argv:?} timed out after {timeout:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_default_like_kubernetes() {
        let p = Params::of(&Probe::default());
        assert_eq!(p.period, Duration::from_secs(10));
        assert_eq!(p.timeout, Duration::from_secs(1));
        assert_eq!((p.success_threshold, p.failure_threshold), (1, 3));
        let ports = [ContainerPort {
            name: Some("metrics".into()),
            container_port: 2381,
            ..ContainerPort::default()
        }];
        assert_eq!(
            resolve_port(&IntOrString::String("metrics".into()), &ports),
            Ok(2381)
        );
        assert_eq!(resolve_port(&IntOrString::Int(2379), &ports), Ok(2379));
        assert!(resolve_port(&IntOrString::String("nope".into()), &ports).is_err());
    }

    #[tokio::test]
    async fn http_probe_reads_the_status_line() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for answer in [
                "HTTP/1.1 200 OK\r\n\r\n",
                "HTTP/1.1 503 Service Unavailable\r\n\r\n",
            ] {
                let (mut s, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await.unwrap();
                s.write_all(answer.as_bytes()).await.unwrap();
            }
        });
        let action = HTTPGetAction {
            path: Some("/health".into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        };
        assert_eq!(http_get("127.0.0.1", port, &action).await, Ok(()));
        let err = http_get("127.0.0.1", port, &action).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
    }
}
