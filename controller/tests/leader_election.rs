//! Leader election against a real kube-apiserver (the `etcd-tests` harness): one leader at a
//! time, takeover after a leader dies, immediate handover on graceful release, and the work
//! stopped when the Lease is lost; then the same with two `etcd-controller` processes (probes,
//! metrics, SIGTERM, the missing-CRD error).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use etcd_controller::leader::{LeaderElectionParams, LeaderElector, WallClock};
use etcd_controller::metrics::Metrics;
use etcd_tests::{TestContext, poll_until, run_suite};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "etcd-operator-controller";

/// Who is running the leader's work right now, and the most that ever ran at once.
#[derive(Default)]
struct Leaders {
    current: Mutex<(Vec<String>, usize)>,
}

impl Leaders {
    fn current(&self) -> Vec<String> {
        self.current.lock().unwrap().0.clone()
    }

    fn max_concurrent(&self) -> usize {
        self.current.lock().unwrap().1
    }
}

/// Removes its candidate from [`Leaders`] when the work ends, however it ends (a dropped
/// future included).
struct Leading {
    leaders: Arc<Leaders>,
    name: String,
}

impl Leading {
    fn enter(leaders: Arc<Leaders>, name: &str) -> Self {
        {
            let mut guard = leaders.current.lock().unwrap();
            guard.0.push(name.to_string());
            guard.1 = guard.1.max(guard.0.len());
        }
        Self {
            leaders,
            name: name.to_string(),
        }
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        self.leaders
            .current
            .lock()
            .unwrap()
            .0
            .retain(|n| n != &self.name);
    }
}

struct Candidate {
    name: String,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

fn params(
    ctx: &TestContext,
    identity: &str,
    lease: Duration,
    renew: Duration,
) -> LeaderElectionParams {
    LeaderElectionParams {
        namespace: ctx.ns().to_string(),
        lease_name: LEASE.to_string(),
        identity: identity.to_string(),
        lease_duration: lease,
        renew_deadline: renew,
        retry_period: Duration::from_millis(200),
    }
}

fn spawn(
    ctx: &TestContext,
    identity: &str,
    lease: Duration,
    renew: Duration,
    leaders: &Arc<Leaders>,
    metrics: Option<Arc<Metrics>>,
) -> Candidate {
    spawn_with_clock(
        ctx,
        identity,
        (lease, renew),
        leaders,
        metrics,
        WallClock::system(),
    )
}

fn spawn_with_clock(
    ctx: &TestContext,
    identity: &str,
    (lease, renew): (Duration, Duration),
    leaders: &Arc<Leaders>,
    metrics: Option<Arc<Metrics>>,
    clock: WallClock,
) -> Candidate {
    let mut elector = LeaderElector::new(ctx.client(), params(ctx, identity, lease, renew))
        .with_wall_clock(clock);
    if let Some(metrics) = metrics {
        elector = elector.with_metrics(metrics);
    }
    let shutdown = CancellationToken::new();
    let leaders = leaders.clone();
    let name = identity.to_string();
    let task = tokio::spawn({
        let shutdown = shutdown.clone();
        let name = name.clone();
        async move {
            elector
                .run(shutdown, |stop| {
                    let leaders = leaders.clone();
                    let name = name.clone();
                    async move {
                        let _leading = Leading::enter(leaders, &name);
                        stop.cancelled().await;
                    }
                })
                .await?;
            Ok(())
        }
    });
    Candidate {
        name,
        shutdown,
        task,
    }
}

/// Waits until exactly one candidate leads, and returns it.
async fn single_leader(leaders: &Leaders, timeout: Duration) -> anyhow::Result<String> {
    Ok(poll_until("a single leader", timeout, || async {
        let current = leaders.current();
        Ok::<_, String>((current.len() == 1).then(|| current[0].clone()))
    })
    .await?)
}

async fn holder(api: &Api<Lease>) -> anyhow::Result<(Option<String>, i32)> {
    let lease = api.get(LEASE).await?;
    let spec = lease.spec.unwrap_or_default();
    Ok((spec.holder_identity, spec.lease_transitions.unwrap_or(0)))
}

/// Two candidates: only one leads, the Lease names it, and it stays leader while it renews;
/// when its process dies (no release), the other takes over after the lease duration.
async fn one_leader_and_takeover_after_a_crash(ctx: TestContext) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lease = Duration::from_secs(3);
    let renew = Duration::from_secs(2);
    let leaders = Arc::new(Leaders::default());
    let a = spawn(&ctx, "candidate-a", lease, renew, &leaders, None);
    let b = spawn(&ctx, "candidate-b", lease, renew, &leaders, None);
    let api: Api<Lease> = ctx.api();

    let first = single_leader(&leaders, Duration::from_secs(30)).await?;
    let (held_by, transitions) = holder(&api).await?;
    ensure!(
        held_by.as_deref() == Some(first.as_str()),
        "lease holder {held_by:?}, leader {first}"
    );
    ensure!(
        transitions == 0,
        "a new Lease has 0 transitions, got {transitions}"
    );

    // Several lease durations later the same candidate still leads: renewals work.
    tokio::time::sleep(lease * 2).await;
    ensure!(
        leaders.current() == vec![first.clone()],
        "leaders {:?}",
        leaders.current()
    );
    ensure!(holder(&api).await?.0.as_deref() == Some(first.as_str()));

    let (dead, survivor) = if first == a.name { (a, b) } else { (b, a) };
    dead.task.abort();
    let _ = dead.task.await;
    let killed = Instant::now();
    let next = single_leader(&leaders, lease * 4).await?;
    let took = killed.elapsed();
    ensure!(
        next == survivor.name,
        "{next} leads, expected {}",
        survivor.name
    );
    // Not before the dead leader's Lease expired (renewed at most a retry period before the
    // kill), and not much after.
    ensure!(
        took >= lease - Duration::from_millis(500),
        "took over after {took:?}, before the lease expired"
    );
    ensure!(
        took <= lease + Duration::from_secs(2),
        "took over only after {took:?}"
    );
    let (held_by, transitions) = holder(&api).await?;
    ensure!(
        held_by.as_deref() == Some(next.as_str()),
        "lease holder {held_by:?}"
    );
    ensure!(
        transitions == 1,
        "a takeover is one transition, got {transitions}"
    );
    ensure!(leaders.max_concurrent() == 1, "two leaders at once");

    survivor.shutdown.cancel();
    survivor.task.await??;
    Ok(())
}

/// Issue 15, item 4: a standby whose wall clock runs an hour fast sees the leader's renewTime
/// as an hour old. Expiry is judged by how long the standby has seen the record unchanged, so
/// it waits while the leader renews, and takes over only a lease duration after the leader
/// stopped renewing.
async fn a_standby_with_a_fast_clock_never_takes_a_live_lease(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lease = Duration::from_secs(3);
    let renew = Duration::from_secs(2);
    let leaders = Arc::new(Leaders::default());
    let a = spawn(&ctx, "on-time", lease, renew, &leaders, None);
    ensure!(single_leader(&leaders, Duration::from_secs(30)).await? == "on-time");
    let b = spawn_with_clock(
        &ctx,
        "fast-clock",
        (lease, renew),
        &leaders,
        None,
        WallClock::skewed(3600),
    );
    // Three lease durations: the fast standby never leads, nobody leads twice.
    tokio::time::sleep(lease * 3).await;
    ensure!(
        leaders.current() == vec!["on-time".to_string()],
        "leaders {:?}",
        leaders.current()
    );
    ensure!(leaders.max_concurrent() == 1, "two leaders at once");
    let api: Api<Lease> = ctx.api();
    ensure!(holder(&api).await?.0.as_deref() == Some("on-time"));

    // Once the leader stops renewing, the standby takes over after a lease duration.
    a.task.abort();
    let _ = a.task.await;
    let stopped = Instant::now();
    ensure!(single_leader(&leaders, lease * 4).await? == "fast-clock");
    let took = stopped.elapsed();
    ensure!(
        took >= lease - Duration::from_millis(500) && took <= lease + Duration::from_secs(2),
        "took over after {took:?} (lease {lease:?})"
    );
    b.shutdown.cancel();
    b.task.await??;
    Ok(())
}

/// A leader shutting down releases the Lease: the standby takes over at once, well before the
/// (long) lease duration, and only after the old leader's work has stopped.
async fn graceful_release_hands_over_at_once(ctx: TestContext) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lease = Duration::from_secs(20);
    let renew = Duration::from_secs(10);
    let leaders = Arc::new(Leaders::default());
    let metrics_a = Arc::new(Metrics::new()?);
    let metrics_b = Arc::new(Metrics::new()?);
    let a = spawn(
        &ctx,
        "candidate-a",
        lease,
        renew,
        &leaders,
        Some(metrics_a.clone()),
    );
    let b = spawn(
        &ctx,
        "candidate-b",
        lease,
        renew,
        &leaders,
        Some(metrics_b.clone()),
    );
    let api: Api<Lease> = ctx.api();

    let first = single_leader(&leaders, Duration::from_secs(30)).await?;
    let ((leader, leader_metrics), (standby, standby_metrics)) = if first == a.name {
        ((a, metrics_a), (b, metrics_b))
    } else {
        ((b, metrics_b), (a, metrics_a))
    };
    ensure!(leader_metrics.encode().contains("etcd_controller_leader 1"));
    ensure!(
        standby_metrics
            .encode()
            .contains("etcd_controller_leader 0")
    );

    let released = Instant::now();
    leader.shutdown.cancel();
    leader.task.await.context("joining the old leader")??;
    ensure!(leader_metrics.encode().contains("etcd_controller_leader 0"));
    let next = single_leader(&leaders, Duration::from_secs(5)).await?;
    let took = released.elapsed();
    ensure!(next == standby.name, "{next} leads");
    ensure!(took < Duration::from_secs(3), "handover took {took:?}");
    ensure!(
        standby_metrics
            .encode()
            .contains("etcd_controller_leader 1")
    );
    ensure!(holder(&api).await?.0.as_deref() == Some(next.as_str()));
    ensure!(leaders.max_concurrent() == 1, "two leaders at once");

    standby.shutdown.cancel();
    standby.task.await??;
    let (held_by, _) = holder(&api).await?;
    ensure!(
        held_by.is_none(),
        "released lease still held by {held_by:?}"
    );
    Ok(())
}

/// When another identity takes the Lease (as a candidate would after a network partition),
/// the leader notices at its next renewal, stops its work and stands by; it leads again once
/// the intruder's Lease expires.
async fn a_lost_lease_stops_the_work(ctx: TestContext) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let lease = Duration::from_secs(3);
    let renew = Duration::from_secs(2);
    let leaders = Arc::new(Leaders::default());
    let a = spawn(&ctx, "candidate-a", lease, renew, &leaders, None);
    let api: Api<Lease> = ctx.api();
    single_leader(&leaders, Duration::from_secs(30)).await?;

    // Steal it the way a candidate would: read, then replace at that resourceVersion (retried
    // when the leader's renewal wins the race).
    poll_until("stealing the lease", Duration::from_secs(10), || async {
        let mut stolen = api.get(LEASE).await.map_err(|e| e.to_string())?;
        let Some(spec) = stolen.spec.as_mut() else {
            return Err("the Lease has no spec".to_string());
        };
        spec.holder_identity = Some("intruder".into());
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match api.replace(LEASE, &PostParams::default(), &stolen).await {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(s)) if s.is_conflict() => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    let stolen_at = Instant::now();

    poll_until(
        "the leader to stop its work",
        Duration::from_secs(5),
        || async { Ok::<_, String>(leaders.current().is_empty().then_some(())) },
    )
    .await?;
    ensure!(
        stolen_at.elapsed() < lease,
        "noticed the loss only after {:?}",
        stolen_at.elapsed()
    );
    ensure!(holder(&api).await?.0.as_deref() == Some("intruder"));

    // The intruder never renews: after its lease duration the candidate takes it back.
    let back = single_leader(&leaders, lease * 4).await?;
    ensure!(back == a.name);
    ensure!(holder(&api).await?.0.as_deref() == Some(a.name.as_str()));
    a.shutdown.cancel();
    a.task.await??;
    Ok(())
}

/// An `etcd-controller` process, killed if still running when dropped; its output goes to a
/// log file shown on failure.
struct Process {
    child: Child,
    name: String,
    log: PathBuf,
    health: u16,
    metrics: u16,
}

impl Process {
    fn start(ctx: &TestContext, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let [health, metrics] = etcd_tests::ports::free_ports::<2>()?;
        let log = std::env::temp_dir().join(format!("etcd-controller-{}-{name}.log", ctx.ns()));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(env!("CARGO_BIN_EXE_etcd-controller"))
            .arg("--kubeconfig")
            .arg(ctx.control_plane().kubeconfig_path())
            .args(["--namespace", ctx.ns()])
            .arg(format!("--health-probe-bind-address=127.0.0.1:{health}"))
            .arg(format!("--metrics-bind-address=127.0.0.1:{metrics}"))
            .args(extra)
            .env("POD_NAME", name)
            .env("RUST_LOG", "info,etcd_controller=debug,kube_runtime=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .spawn()
            .context("starting etcd-controller")?;
        Ok(Self {
            child,
            name: name.to_string(),
            log,
            health,
            metrics,
        })
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn context(&self) -> String {
        format!("{} log:\n{}", self.name, self.log())
    }

    /// Waits for the process to exit by itself.
    async fn wait(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        let begin = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(
                begin.elapsed() < timeout,
                "{} still running after {timeout:?}\n{}",
                self.name,
                self.context()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn sigterm(&self) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM failed");
        Ok(())
    }

    /// Status and body of `GET path` on the probes (`health`) or the metrics port.
    async fn get(&self, health: bool, path: &str) -> anyhow::Result<(u16, String)> {
        let port = if health { self.health } else { self.metrics };
        http_get(port, path).await
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A minimal HTTP/1.0 GET on loopback.
async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no HTTP status")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn crd_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../charts/etcd-operator/crds/etcdclusters.etcd.database.coreos.com.yaml")
}

fn kubectl(ctx: &TestContext, args: &[&str]) -> anyhow::Result<()> {
    let out = ctx.control_plane().kubectl().args(args).output()?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The binary end to end: it refuses to start without the CRD, then two replicas with
/// `--leader-elect` are both Ready (the standby too), exactly one leads, SIGTERM makes the
/// leader exit 0 and hand over at once, and the last one releases the Lease.
async fn process_leader_election_and_probes(ctx: TestContext) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut no_crd = Process::start(&ctx, "no-crd", &[])?;
    let status = no_crd.wait(Duration::from_secs(30)).await?;
    ensure!(
        status.code() == Some(1),
        "exit {status:?}\n{}",
        no_crd.context()
    );
    ensure!(
        no_crd.log().contains(
            "is the EtcdCluster CRD installed? kubectl apply -f charts/etcd-operator/crds/"
        ),
        "{}",
        no_crd.context()
    );

    let crd = crd_path();
    kubectl(
        &ctx,
        &["apply", "--server-side", "-f", &crd.to_string_lossy()],
    )?;
    kubectl(
        &ctx,
        &[
            "wait",
            "--for=condition=Established",
            "crd/etcdclusters.etcd.database.coreos.com",
            "--timeout=30s",
        ],
    )?;

    let election = [
        "--leader-elect",
        "--leader-election-namespace",
        ctx.ns(),
        "--leader-elect-lease-duration=10s",
        "--leader-elect-renew-deadline=6s",
        "--leader-elect-retry-period=250ms",
        "--graceful-shutdown-timeout=2s",
    ];
    let mut a = Process::start(&ctx, "proc-a", &election)?;
    // With the EtcdCluster CRD alone, the controller reconciles nothing and /readyz says
    // which CRDs are missing and how to install them (issue 28, item 6).
    let said = poll_until(
        "proc-a to name the missing CRDs",
        Duration::from_secs(30),
        || async {
            let (status, body) = a.get(true, "/readyz").await.map_err(|e| e.to_string())?;
            Ok::<_, String>((status == 503 && body.contains("not installed")).then_some(body))
        },
    )
    .await
    .with_context(|| a.context())?;
    ensure!(
        said.contains(
            "CRDs not installed: etcdbackups.etcd.database.coreos.com, etcdrestores.etcd.database.coreos.com; install them with: kubectl apply --server-side --force-conflicts -f charts/etcd-operator/crds-replace/"
        ),
        "{said}"
    );
    let crds = crd_path()
        .parent()
        .map(Path::to_path_buf)
        .context("the CRD directory")?;
    kubectl(
        &ctx,
        &["apply", "--server-side", "-f", &crds.to_string_lossy()],
    )?;
    kubectl(
        &ctx,
        &[
            "wait",
            "--for=condition=Established",
            "crd/etcdbackups.etcd.database.coreos.com",
            "crd/etcdrestores.etcd.database.coreos.com",
            "--timeout=30s",
        ],
    )?;
    let mut b = Process::start(&ctx, "proc-b", &election)?;
    let api: Api<Lease> = ctx.api();

    for p in [&a, &b] {
        poll_until(
            &format!("{} ready", p.name),
            Duration::from_secs(30),
            || async {
                let healthz = p.get(true, "/healthz").await.map_err(|e| e.to_string())?;
                let readyz = p.get(true, "/readyz").await.map_err(|e| e.to_string())?;
                Ok::<_, String>((healthz == (200, "ok\n".into()) && readyz.0 == 200).then_some(()))
            },
        )
        .await
        .with_context(|| p.context())?;
    }
    let leader = poll_until("a lease holder", Duration::from_secs(30), || async {
        Ok::<_, kube::Error>(
            api.get_opt(LEASE)
                .await?
                .and_then(|l| l.spec?.holder_identity),
        )
    })
    .await?;
    let leading_gauge = |body: &str| {
        body.lines()
            .find_map(|l| l.strip_prefix("etcd_controller_leader "))
            .map(str::to_string)
    };
    for p in [&a, &b] {
        let want = if p.name == leader { "1" } else { "0" };
        let (status, body) = p.get(false, "/metrics").await?;
        ensure!(status == 200, "{}", p.context());
        ensure!(
            leading_gauge(&body).as_deref() == Some(want),
            "{} leader gauge:\n{body}",
            p.name
        );
    }

    let (old, new) = if a.name == leader {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    old.sigterm()?;
    let stopped = Instant::now();
    let status = old.wait(Duration::from_secs(15)).await?;
    ensure!(status.success(), "exit {status:?}\n{}", old.context());
    let next = poll_until(
        "the standby to take over",
        Duration::from_secs(10),
        || async {
            Ok::<_, kube::Error>(
                api.get_opt(LEASE)
                    .await?
                    .and_then(|l| l.spec?.holder_identity)
                    .filter(|h| h == &new.name),
            )
        },
    )
    .await
    .with_context(|| new.context())?;
    ensure!(next == new.name);
    ensure!(
        stopped.elapsed() < Duration::from_secs(5),
        "handover took {:?}",
        stopped.elapsed()
    );
    poll_until("the new leader's gauge", Duration::from_secs(5), || async {
        let (_, body) = new
            .get(false, "/metrics")
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>((leading_gauge(&body).as_deref() == Some("1")).then_some(()))
    })
    .await?;

    new.sigterm()?;
    let status = new.wait(Duration::from_secs(15)).await?;
    ensure!(status.success(), "exit {status:?}\n{}", new.context());
    let (held_by, _) = holder(&api).await?;
    ensure!(held_by.is_none(), "lease still held by {held_by:?}");
    Ok(())
}

fn main() -> std::process::ExitCode {
    run_suite(etcd_tests::tests![
        one_leader_and_takeover_after_a_crash,
        a_standby_with_a_fast_clock_never_takes_a_live_lease,
        graceful_release_hands_over_at_once,
        a_lost_lease_stops_the_work,
        process_leader_election_and_probes,
    ])
}
