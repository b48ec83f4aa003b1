//! Integration tests of the process kubelet: pods of the local control plane run as real
//! local etcd processes on the pod network (see `etcd_tests::kubelet`).
//!
//! Run: `cargo test -p etcd-tests --test kubelet` (needs `hack/build-tools.sh` first, and root
//! or unprivileged user namespaces for the private network namespace).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, ContainerStatus, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodSpec, Probe, Service, ServicePort, ServiceSpec,
    Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::conditions;
use kube::{Api, ResourceExt as _};

use etcd_tests::kubelet::ImageMapping;
use etcd_tests::suite::{TestContext, run_suite_with_kubelet};
use etcd_tests::{await_condition, poll_until};

/// Deadline of each wait.
const WAIT: Duration = Duration::from_secs(60);
const V36: &str = "3.6.16";
const V37: &str = "3.7.3";
const DATA: &str = "/var/lib/etcd";

fn main() -> std::process::ExitCode {
    run_suite_with_kubelet(etcd_tests::tests![
        bare_pod_runs_etcd_and_serves_clients,
        single_member_pod_is_ready_in_time,
        three_members_form_one_cluster_through_dns_names,
        killed_container_restarts_with_its_data,
        deleted_pod_is_stopped_and_only_its_claim_survives,
        image_patch_restarts_the_member_on_the_new_binary,
        unmappable_image_stays_pending_until_mapped,
        endpoint_slices_list_the_pod_ips,
        service_account_pod_runs_to_completion_against_the_apiserver,
        probes_exec_readiness_and_failing_liveness,
    ])
}

/// How a test member pod is built (as the operator builds them, see
/// `controller/src/builders/pod.rs`).
struct Member<'a> {
    name: &'a str,
    image: String,
    /// (hostname, subdomain): then the pod has the DNS name `H.S.NS.svc.cluster.local`.
    dns: Option<(&'a str, &'a str)>,
    /// `--initial-cluster`; `None`: this member alone, on its peer URL.
    initial_cluster: Option<String>,
    /// Claim for the data volume; `None`: an emptyDir.
    claim: Option<&'a str>,
    labels: Vec<(&'a str, &'a str)>,
}

impl<'a> Member<'a> {
    fn new(name: &'a str, version: &str) -> Self {
        Self {
            name,
            image: format!("quay.io/coreos/etcd:v{version}"),
            dns: None,
            initial_cluster: None,
            claim: None,
            labels: vec![("app", "etcd")],
        }
    }

    fn pod(&self, ns: &str) -> Pod {
        let member = self.dns.map_or(self.name, |(h, _)| h);
        let peer_host = match self.dns {
            Some((h, s)) => format!("{h}.{s}.{ns}.svc.cluster.local"),
            None => "$(POD_IP)".to_owned(),
        };
        let peer_url = format!("http://{peer_host}:2380");
        let initial_cluster = self
            .initial_cluster
            .clone()
            .unwrap_or_else(|| format!("{member}={peer_url}"));
        let args = vec![
            format!("--name={member}"),
            format!("--data-dir={DATA}/data"),
            "--listen-peer-urls=http://$(POD_IP):2380".to_owned(),
            "--listen-client-urls=http://$(POD_IP):2379".to_owned(),
            format!("--advertise-client-urls=http://{peer_host}:2379"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={initial_cluster}"),
            "--initial-cluster-state=new".to_owned(),
            format!("--initial-cluster-token=token-{member}"),
            "--listen-metrics-urls=http://$(POD_IP):2381".to_owned(),
            "--logger=zap".to_owned(),
        ];
        let field = |name: &str, path: &str| EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
            value: None,
        };
        let data = match self.claim {
            Some(claim) => Volume {
                name: "data".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.into(),
                    read_only: None,
                }),
                ..Volume::default()
            },
            None => Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            },
        };
        let port = |name: &str, port: i32| ContainerPort {
            name: Some(name.into()),
            container_port: port,
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        };
        Pod {
            metadata: ObjectMeta {
                name: Some(self.name.into()),
                labels: Some(
                    self.labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                hostname: self.dns.map(|(h, _)| h.to_owned()),
                subdomain: self.dns.map(|(_, s)| s.to_owned()),
                containers: vec![Container {
                    name: "etcd".into(),
                    image: Some(self.image.clone()),
                    command: Some(vec!["/usr/local/bin/etcd".into()]),
                    args: Some(args),
                    env: Some(vec![
                        field("POD_NAME", "metadata.name"),
                        field("POD_NAMESPACE", "metadata.namespace"),
                        field("POD_IP", "status.podIP"),
                    ]),
                    ports: Some(vec![
                        port("client", 2379),
                        port("peer", 2380),
                        port("metrics", 2381),
                    ]),
                    volume_mounts: Some(vec![
                        VolumeMount {
                            name: "data".into(),
                            mount_path: DATA.into(),
                            ..VolumeMount::default()
                        },
                        VolumeMount {
                            name: "scratch".into(),
                            mount_path: "/scratch".into(),
                            ..VolumeMount::default()
                        },
                    ]),
                    readiness_probe: Some(Probe {
                        http_get: Some(HTTPGetAction {
                            path: Some("/health".into()),
                            port: IntOrString::Int(2381),
                            scheme: Some("HTTP".into()),
                            ..HTTPGetAction::default()
                        }),
                        initial_delay_seconds: Some(1),
                        period_seconds: Some(5),
                        timeout_seconds: Some(5),
                        failure_threshold: Some(3),
                        ..Probe::default()
                    }),
                    ..Container::default()
                }],
                volumes: Some(vec![
                    data,
                    Volume {
                        name: "scratch".into(),
                        empty_dir: Some(EmptyDirVolumeSource::default()),
                        ..Volume::default()
                    },
                ]),
                restart_policy: Some("Always".into()),
                automount_service_account_token: Some(false),
                enable_service_links: Some(false),
                termination_grace_period_seconds: Some(30),
                ..PodSpec::default()
            }),
            status: None,
        }
    }
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn container_status(pod: &Pod) -> Option<&ContainerStatus> {
    pod.status.as_ref()?.container_statuses.as_ref()?.first()
}

fn pod_ip(pod: &Pod) -> anyhow::Result<Ipv4Addr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("no podIP")?
        .parse()
        .context("podIP")
}

/// Waits until `name` is Ready and `extra` holds; returns the pod.
async fn wait_pod(
    api: &Api<Pod>,
    name: &str,
    what: &str,
    extra: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Pod> {
    let pod = await_condition(
        api.clone(),
        name,
        move |p: Option<&Pod>| p.is_some_and(|p| is_ready(p) && extra(p)),
        WAIT,
    )
    .await
    .with_context(|| format!("waiting for pod {name}: {what}"))?;
    pod.context("pod vanished")
}

async fn wait_ready(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_pod(api, name, "Ready", |_| true).await
}

/// `etcdctl --endpoints http://IP:2379 ARGS` of `version`; returns stdout.
async fn etcdctl(
    ctx: &TestContext,
    version: &str,
    ip: Ipv4Addr,
    args: &[&str],
) -> anyhow::Result<String> {
    let bin = ctx.control_plane().tools().etcdctl(version)?;
    let output = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(bin)
            .arg(format!("--endpoints=http://{ip}:2379"))
            .arg("--command-timeout=10s")
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .context("etcdctl timed out")??;
    ensure!(
        output.status.success(),
        "etcdctl {args:?} against {ip}: {}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

async fn get_key(
    ctx: &TestContext,
    version: &str,
    ip: Ipv4Addr,
    key: &str,
) -> anyhow::Result<String> {
    let out = etcdctl(ctx, version, ip, &["get", key, "--print-value-only"]).await?;
    Ok(out.trim().to_owned())
}

/// `endpoint status -w json` of one endpoint: (cluster id, version).
async fn endpoint_status(ctx: &TestContext, ip: Ipv4Addr) -> anyhow::Result<(u64, String)> {
    let out = etcdctl(ctx, V36, ip, &["endpoint", "status", "-w", "json"]).await?;
    let json: serde_json::Value = serde_json::from_str(&out).context("endpoint status json")?;
    let status = &json[0]["Status"];
    let cluster = status["header"]["cluster_id"]
        .as_u64()
        .context("cluster_id")?;
    let version = status["version"].as_str().context("version")?.to_owned();
    Ok((cluster, version))
}

fn logs_on_failure(ctx: &TestContext, pod: &str) -> String {
    match ctx.kubelet() {
        Ok(k) => k
            .container_log(ctx.ns(), pod)
            .unwrap_or_else(|e| e.to_string()),
        Err(e) => e.to_string(),
    }
}

/// (1) A bare pod built like a member pod becomes Running and Ready with an IP; clients work.
async fn bare_pod_runs_etcd_and_serves_clients(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let api: Api<Pod> = ctx.api();
    let started = Instant::now();
    api.create(
        &PostParams::default(),
        &Member::new("solo", V36).pod(ctx.ns()),
    )
    .await?;
    let pod = wait_ready(&api, "solo")
        .await
        .with_context(|| logs_on_failure(&ctx, "solo"))?;
    eprintln!("bare pod Ready after {:?}", started.elapsed());

    let status = pod.status.as_ref().context("status")?;
    ensure!(status.phase.as_deref() == Some("Running"), "{status:?}");
    let ip = pod_ip(&pod)?;
    ensure!(
        Some(ip) == kubelet.pod_ip(ctx.ns(), "solo"),
        "podIP {ip} vs the kubelet's"
    );
    ensure!(!ip.is_loopback());
    ensure!(status.host_ip.as_deref() == Some(kubelet.node_ip().to_string().as_str()));
    ensure!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(kubelet.node_name()));
    let c = container_status(&pod).context("container status")?;
    ensure!(
        c.ready && c.started == Some(true) && c.restart_count == 0,
        "{c:?}"
    );
    ensure!(
        c.state.as_ref().is_some_and(|s| s.running.is_some()),
        "{c:?}"
    );
    ensure!(
        c.image == "quay.io/coreos/etcd:v3.6.16" && c.image_id.contains("v3.6.16"),
        "{c:?}"
    );

    etcdctl(&ctx, V36, ip, &["put", "greeting", "hello"]).await?;
    ensure!(get_key(&ctx, V36, ip, "greeting").await? == "hello");
    // $(POD_IP) was expanded and /var/lib/etcd rewritten to the pod's volume directory.
    let data = kubelet.volume_dir(ctx.ns(), "solo", "data")?;
    ensure!(
        data.join("data/member").is_dir(),
        "no etcd data in {}",
        data.display()
    );
    Ok(())
}

/// How long a single-member etcd pod may take from creation to Ready on the process kubelet
/// (measured: about a second on an idle 2-core machine; the budget leaves room for a busy one).
const SINGLE_MEMBER_READY_BUDGET: Duration = Duration::from_secs(15);

/// Creation → Ready of single-member pods, one after the other: each within
/// [`SINGLE_MEMBER_READY_BUDGET`], and each deleted pod gone before the next is timed.
async fn single_member_pod_is_ready_in_time(ctx: TestContext) -> anyhow::Result<()> {
    let api: Api<Pod> = ctx.api();
    let mut times = Vec::new();
    for i in 0..3 {
        let name = format!("timed-{i}");
        let started = Instant::now();
        api.create(
            &PostParams::default(),
            &Member::new(&name, V36).pod(ctx.ns()),
        )
        .await?;
        let pod = wait_ready(&api, &name).await?;
        let elapsed = started.elapsed();
        times.push(elapsed);
        ensure!(
            elapsed <= SINGLE_MEMBER_READY_BUDGET,
            "pod {name}: creation -> Ready took {elapsed:?}, over the budget of \
             {SINGLE_MEMBER_READY_BUDGET:?} (all so far: {times:?})"
        );
        api.delete(&name, &DeleteParams::default()).await?;
        let uid = pod.metadata.uid.unwrap_or_default();
        await_condition(api.clone(), &name, conditions::is_deleted(&uid), WAIT).await?;
    }
    let mut sorted = times.clone();
    sorted.sort();
    eprintln!(
        "single-member pod creation -> Ready: {times:?}, median {:?}",
        sorted[sorted.len() / 2]
    );
    Ok(())
}

/// (2) Three pods with hostname/subdomain and a headless Service form one cluster through
/// their DNS names (the shared hosts file).
async fn three_members_form_one_cluster_through_dns_names(ctx: TestContext) -> anyhow::Result<()> {
    let ns = ctx.ns().to_owned();
    let services: Api<Service> = ctx.api();
    services
        .create(
            &PostParams::default(),
            &Service {
                metadata: ObjectMeta {
                    name: Some("peers".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(ServiceSpec {
                    cluster_ip: Some("None".into()),
                    publish_not_ready_addresses: Some(true),
                    selector: Some([("cluster".to_owned(), "trio".to_owned())].into()),
                    ports: Some(vec![ServicePort {
                        name: Some("peer".into()),
                        port: 2380,
                        ..ServicePort::default()
                    }]),
                    ..ServiceSpec::default()
                }),
                status: None,
            },
        )
        .await?;
    let names = ["m0", "m1", "m2"];
    let initial_cluster = names
        .iter()
        .map(|n| format!("{n}=http://{n}.peers.{ns}.svc.cluster.local:2380"))
        .collect::<Vec<_>>()
        .join(",");
    let api: Api<Pod> = ctx.api();
    let started = Instant::now();
    for name in names {
        let mut member = Member::new(name, V36);
        member.dns = Some((name, "peers"));
        member.initial_cluster = Some(initial_cluster.clone());
        member.labels.push(("cluster", "trio"));
        let mut pod = member.pod(&ns);
        // One token for the whole cluster.
        if let Some(args) = pod
            .spec
            .as_mut()
            .and_then(|s| s.containers[0].args.as_mut())
        {
            for a in args
                .iter_mut()
                .filter(|a| a.starts_with("--initial-cluster-token="))
            {
                *a = "--initial-cluster-token=trio".into();
            }
        }
        api.create(&PostParams::default(), &pod).await?;
    }
    // Cluster formation (a leader, every member healthy) is usually quicker than readiness,
    // which waits for the next probe (period 5 s) when the first (at 1 s) came too early.
    let kubelet = ctx.kubelet()?;
    let member_ips = poll_until("member IPs", WAIT, || async {
        let ips: Option<Vec<Ipv4Addr>> = names.iter().map(|n| kubelet.pod_ip(&ns, n)).collect();
        Ok::<_, std::convert::Infallible>(ips)
    })
    .await?;
    poll_until("every member healthy", WAIT, || async {
        for ip in &member_ips {
            if etcdctl(
                &ctx,
                V36,
                *ip,
                &["endpoint", "health", "--command-timeout=1s"],
            )
            .await
            .is_err()
            {
                return Ok::<_, std::convert::Infallible>(None);
            }
        }
        Ok(Some(()))
    })
    .await
    .with_context(|| logs_on_failure(&ctx, "m0"))?;
    let formed = started.elapsed();
    let mut ips = Vec::new();
    for name in names {
        let pod = wait_ready(&api, name)
            .await
            .with_context(|| logs_on_failure(&ctx, name))?;
        ips.push(pod_ip(&pod)?);
    }
    ensure!(
        ips == member_ips,
        "pod IPs {ips:?} vs the kubelet's {member_ips:?}"
    );
    eprintln!(
        "3-member cluster: healthy {formed:?}, all pods Ready {:?} after creation",
        started.elapsed()
    );

    // The names resolve in the test binary too (glibc reads the same /etc/hosts).
    for (name, ip) in names.iter().zip(&ips) {
        let resolved: Vec<_> =
            tokio::net::lookup_host(format!("{name}.peers.{ns}.svc.cluster.local:2379"))
                .await?
                .collect();
        ensure!(
            resolved.iter().any(|a| a.ip() == *ip),
            "{name} resolved to {resolved:?}, pod IP {ip}"
        );
    }
    let mut clusters = BTreeSet::new();
    for ip in &ips {
        clusters.insert(endpoint_status(&ctx, *ip).await?.0);
        let members = etcdctl(&ctx, V36, *ip, &["member", "list", "-w", "json"]).await?;
        let json: serde_json::Value = serde_json::from_str(&members)?;
        let listed: BTreeSet<String> = json["members"]
            .as_array()
            .context("members")?
            .iter()
            .filter_map(|m| m["name"].as_str().map(str::to_owned))
            .collect();
        ensure!(
            listed == names.iter().map(|n| (*n).to_owned()).collect(),
            "{ip} lists {listed:?}"
        );
    }
    ensure!(
        clusters.len() == 1,
        "members report different cluster IDs: {clusters:?}"
    );
    etcdctl(&ctx, V36, ips[0], &["put", "shared", "yes"]).await?;
    ensure!(get_key(&ctx, V36, ips[2], "shared").await? == "yes");
    Ok(())
}

/// (3) SIGKILL → restartCount 1, Ready again, data still there.
async fn killed_container_restarts_with_its_data(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let api: Api<Pod> = ctx.api();
    api.create(
        &PostParams::default(),
        &Member::new("crashy", V36).pod(ctx.ns()),
    )
    .await?;
    let pod = wait_ready(&api, "crashy").await?;
    let ip = pod_ip(&pod)?;
    etcdctl(&ctx, V36, ip, &["put", "survivor", "still-here"]).await?;
    let killed = kubelet.kill_container(ctx.ns(), "crashy")?;
    let pod = wait_pod(&api, "crashy", "restartCount 1", |p| {
        container_status(p).is_some_and(|c| c.restart_count == 1)
    })
    .await?;
    let c = container_status(&pod).context("container status")?;
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .context("no lastState.terminated")?;
    ensure!(last.exit_code == 137 && last.signal == Some(9), "{last:?}");
    ensure!(kubelet.container_pid(ctx.ns(), "crashy") != Some(killed));
    ensure!(pod_ip(&pod)? == ip, "the IP changed");
    ensure!(get_key(&ctx, V36, ip, "survivor").await? == "still-here");

    // A lost disk: wipe the data volume, then kill; the member restarts empty.
    let data = kubelet.wipe_data(ctx.ns(), "crashy", "data")?;
    kubelet.kill_container(ctx.ns(), "crashy")?;
    wait_pod(&api, "crashy", "restartCount 2", |p| {
        container_status(p).is_some_and(|c| c.restart_count == 2)
    })
    .await?;
    ensure!(
        data.join("data/member").is_dir(),
        "etcd did not recreate its data"
    );
    ensure!(
        get_key(&ctx, V36, ip, "survivor").await?.is_empty(),
        "the key survived the wipe"
    );
    Ok(())
}

/// Probes: an `exec` readiness probe runs the image's etcdctl with `$(POD_IP)` expanded; a
/// failing `tcpSocket` liveness probe gets the container restarted.
async fn probes_exec_readiness_and_failing_liveness(ctx: TestContext) -> anyhow::Result<()> {
    let api: Api<Pod> = ctx.api();
    let mut pod = Member::new("probed", V36).pod(ctx.ns());
    let container = pod
        .spec
        .as_mut()
        .map(|s| &mut s.containers[0])
        .context("container")?;
    container.readiness_probe = Some(Probe {
        exec: Some(k8s_openapi::api::core::v1::ExecAction {
            command: Some(vec![
                "etcdctl".into(),
                "--endpoints=http://$(POD_IP):2379".into(),
                "endpoint".into(),
                "health".into(),
            ]),
        }),
        period_seconds: Some(1),
        timeout_seconds: Some(5),
        ..Probe::default()
    });
    container.liveness_probe = Some(Probe {
        tcp_socket: Some(k8s_openapi::api::core::v1::TCPSocketAction {
            port: IntOrString::Int(2399),
            host: None,
        }),
        initial_delay_seconds: Some(3),
        period_seconds: Some(1),
        failure_threshold: Some(2),
        ..Probe::default()
    });
    api.create(&PostParams::default(), &pod).await?;
    wait_ready(&api, "probed")
        .await
        .with_context(|| logs_on_failure(&ctx, "probed"))?;
    await_condition(
        api.clone(),
        "probed",
        |p: Option<&Pod>| {
            p.and_then(container_status)
                .is_some_and(|c| c.restart_count >= 1)
        },
        WAIT,
    )
    .await
    .context("the liveness probe did not restart the container")?;
    Ok(())
}

/// (4) Deletion: SIGTERM first, process gone, pod gone, emptyDir removed; the claim's
/// directory stays (Bound) and a new pod mounting the claim finds the data.
async fn deleted_pod_is_stopped_and_only_its_claim_survives(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    let claims: Api<PersistentVolumeClaim> = ctx.api();
    claims
        .create(
            &PostParams::default(),
            &PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some("keep".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    resources: Some(VolumeResourceRequirements {
                        requests: Some([("storage".to_owned(), Quantity("1Gi".into()))].into()),
                        ..VolumeResourceRequirements::default()
                    }),
                    ..PersistentVolumeClaimSpec::default()
                }),
                status: None,
            },
        )
        .await?;
    let api: Api<Pod> = ctx.api();
    let mut first = Member::new("first", V36);
    first.claim = Some("keep");
    first.dns = Some(("keeper", "disk"));
    api.create(&PostParams::default(), &first.pod(&ns)).await?;
    let pod = wait_ready(&api, "first")
        .await
        .with_context(|| logs_on_failure(&ctx, "first"))?;
    etcdctl(&ctx, V36, pod_ip(&pod)?, &["put", "durable", "kept"]).await?;

    let claim = await_condition(
        claims.clone(),
        "keep",
        |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        },
        WAIT,
    )
    .await
    .context("the claim is not Bound")?;
    ensure!(claim.is_some());
    let scratch = kubelet.volume_dir(&ns, "first", "scratch")?;
    let claim_dir = kubelet.volume_dir(&ns, "first", "data")?;
    ensure!(
        claim_dir == kubelet.claim_dir(&ns, "keep"),
        "{}",
        claim_dir.display()
    );
    let pid = kubelet.container_pid(&ns, "first").context("no pid")?;

    let uid = pod.uid().context("uid")?;
    api.delete("first", &DeleteParams::default()).await?;
    await_condition(api.clone(), "first", conditions::is_deleted(&uid), WAIT)
        .await
        .context("the pod was not removed")?;
    ensure!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "process {pid} still exists"
    );
    let log = std::fs::read_to_string(kubelet.container_log_path(&ns, "first", None)?)?;
    ensure!(
        log.contains("received signal; shutting down"),
        "etcd did not log a SIGTERM shutdown:\n{log}"
    );
    ensure!(
        !scratch.exists(),
        "emptyDir {} survived the pod",
        scratch.display()
    );
    ensure!(
        claim_dir.join("data/member").is_dir(),
        "the claim's data is gone"
    );

    let mut second = Member::new("second", V36);
    second.claim = Some("keep");
    second.dns = Some(("keeper", "disk"));
    api.create(&PostParams::default(), &second.pod(&ns)).await?;
    let pod = wait_ready(&api, "second")
        .await
        .with_context(|| logs_on_failure(&ctx, "second"))?;
    ensure!(get_key(&ctx, V36, pod_ip(&pod)?, "durable").await? == "kept");

    // Deleting the claim (after its pod) removes its volume.
    api.delete("second", &DeleteParams::default()).await?;
    claims.delete("keep", &DeleteParams::default()).await?;
    poll_until("the claim directory to be removed", WAIT, || async {
        Ok::<_, std::convert::Infallible>((!claim_dir.exists()).then_some(()))
    })
    .await?;
    Ok(())
}

/// (5) Patching the image from 3.6 to 3.7 restarts the member on the 3.7 binary, same IP
/// and data.
async fn image_patch_restarts_the_member_on_the_new_binary(ctx: TestContext) -> anyhow::Result<()> {
    let api: Api<Pod> = ctx.api();
    api.create(
        &PostParams::default(),
        &Member::new("upgrade", V36).pod(ctx.ns()),
    )
    .await?;
    let pod = wait_ready(&api, "upgrade").await?;
    let ip = pod_ip(&pod)?;
    etcdctl(&ctx, V36, ip, &["put", "before", "upgrade"]).await?;
    ensure!(endpoint_status(&ctx, ip).await?.1 == V36);

    let image = format!("gcr.io/etcd-development/etcd:v{V37}");
    let patch =
        serde_json::json!({ "spec": { "containers": [{ "name": "etcd", "image": image }] } });
    let started = Instant::now();
    api.patch(
        "upgrade",
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await?;
    let pod = wait_pod(&api, "upgrade", "running the new image", |p| {
        container_status(p).is_some_and(|c| c.image == image && c.restart_count == 1 && c.ready)
    })
    .await
    .with_context(|| logs_on_failure(&ctx, "upgrade"))?;
    eprintln!(
        "in-place upgrade: Ready on {V37} {:?} after the patch",
        started.elapsed()
    );
    ensure!(pod_ip(&pod)? == ip, "the IP changed");
    let c = container_status(&pod).context("status")?;
    ensure!(c.image_id.contains(V37), "{c:?}");
    ensure!(endpoint_status(&ctx, ip).await?.1 == V37);
    ensure!(get_key(&ctx, V37, ip, "before").await? == "upgrade");
    Ok(())
}

/// (6) An image without a mapping: Pending, ErrImagePull/ImagePullBackOff naming the image;
/// registering a mapping at run time lets it start.
async fn unmappable_image_stays_pending_until_mapped(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let api: Api<Pod> = ctx.api();
    let repository = format!("registry.example/{}/unknown", ctx.ns());
    let image = format!("{repository}:1.0");
    let mut member = Member::new("unpullable", V36);
    member.image = image.clone();
    api.create(&PostParams::default(), &member.pod(ctx.ns()))
        .await?;
    let pod = await_condition(
        api.clone(),
        "unpullable",
        |p: Option<&Pod>| {
            p.and_then(container_status)
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
                .is_some_and(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
        },
        WAIT,
    )
    .await?
    .context("pod vanished")?;
    let status = pod.status.as_ref().context("status")?;
    ensure!(status.phase.as_deref() == Some("Pending"), "{status:?}");
    let waiting = container_status(&pod)
        .and_then(|c| c.state.as_ref()?.waiting.clone())
        .context("waiting")?;
    let message = waiting.message.unwrap_or_default();
    ensure!(
        message.contains(&format!("{image:?}")),
        "message does not name the image: {message}"
    );

    let etcd = ctx.control_plane().tools().etcd(V36)?;
    kubelet.images().register_repository(
        format!("/{}/unknown", ctx.ns()),
        ImageMapping::new("/usr/local/bin/etcd", etcd),
    );
    wait_ready(&api, "unpullable").await?;
    Ok(())
}

/// (7) The control plane's EndpointSlice controller lists the Ready pods' IPs.
async fn endpoint_slices_list_the_pod_ips(ctx: TestContext) -> anyhow::Result<()> {
    let services: Api<Service> = ctx.api();
    services
        .create(
            &PostParams::default(),
            &Service {
                metadata: ObjectMeta {
                    name: Some("clients".into()),
                    ..ObjectMeta::default()
                },
                spec: Some(ServiceSpec {
                    selector: Some([("app".to_owned(), "sliced".to_owned())].into()),
                    ports: Some(vec![ServicePort {
                        name: Some("client".into()),
                        port: 2379,
                        target_port: Some(IntOrString::String("client".into())),
                        ..ServicePort::default()
                    }]),
                    ..ServiceSpec::default()
                }),
                status: None,
            },
        )
        .await?;
    let api: Api<Pod> = ctx.api();
    let mut ips = BTreeSet::new();
    for name in ["sliced-a", "sliced-b"] {
        let mut member = Member::new(name, V36);
        member.labels = vec![("app", "sliced")];
        api.create(&PostParams::default(), &member.pod(ctx.ns()))
            .await?;
    }
    for name in ["sliced-a", "sliced-b"] {
        ips.insert(pod_ip(&wait_ready(&api, name).await?)?.to_string());
    }
    let slices: Api<EndpointSlice> = ctx.api();
    let listed = poll_until(
        "EndpointSlices of clients to list both pods",
        WAIT,
        || async {
            let list = slices
                .list(&ListParams::default().labels("kubernetes.io/service-name=clients"))
                .await?;
            let ready: BTreeSet<String> = list
                .items
                .iter()
                .flat_map(|s| s.endpoints.iter().flatten())
                .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                .flat_map(|e| e.addresses.clone())
                .collect();
            Ok::<_, kube::Error>((ready == ips).then_some(list))
        },
    )
    .await?;
    let endpoint = listed
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flatten())
        .next()
        .context("no endpoint")?;
    ensure!(
        endpoint.node_name.as_deref() == Some(ctx.kubelet()?.node_name()),
        "{endpoint:?}"
    );
    if listed.items.iter().any(|s| s.address_type != "IPv4") {
        bail!("unexpected address type: {listed:?}");
    }
    Ok(())
}

/// A `restartPolicy: Never` pod with the default service-account token (projected volume from
/// the ServiceAccount admission plugin) runs kubectl against the API server as that account
/// and Succeeds.
async fn service_account_pod_runs_to_completion_against_the_apiserver(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let kubectl = ctx.control_plane().tools().kubectl()?;
    kubelet
        .images()
        .register_repository("/kubectl", ImageMapping::new("/bin/kubectl", kubectl));
    let api: Api<Pod> = ctx.api();
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("whoami".into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "kubectl".into(),
                image: Some("registry.k8s.io/kubectl:v1.36.3".into()),
                command: Some(vec!["kubectl".into()]),
                args: Some(vec![
                    "auth".into(),
                    "whoami".into(),
                    "-o".into(),
                    "jsonpath={.status.userInfo.username}".into(),
                ]),
                ..Container::default()
            }],
            restart_policy: Some("Never".into()),
            ..PodSpec::default()
        }),
        status: None,
    };
    api.create(&PostParams::default(), &pod).await?;
    let done = await_condition(
        api.clone(),
        "whoami",
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref()?.phase.as_deref())
                .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
        },
        WAIT,
    )
    .await?
    .context("pod vanished")?;
    let log = kubelet.container_log(ctx.ns(), "whoami")?;
    let phase = done.status.as_ref().and_then(|s| s.phase.clone());
    ensure!(
        phase.as_deref() == Some("Succeeded"),
        "phase {phase:?}, log:\n{log}"
    );
    ensure!(
        log.trim() == format!("system:serviceaccount:{}:default", ctx.ns()),
        "log: {log}"
    );
    let c = container_status(&done).context("status")?;
    let terminated = c
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .context("not terminated")?;
    ensure!(
        terminated.exit_code == 0 && terminated.reason.as_deref() == Some("Completed"),
        "{c:?}"
    );
    ensure!(!c.ready && c.restart_count == 0, "{c:?}");
    Ok(())
}
