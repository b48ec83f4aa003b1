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
    ConfigMap, ConfigMapProjection, Container, ContainerPort, ContainerStatus,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PersistentVolumeClaimVolumeSource, Pod,
    PodSpec, Probe, ProjectedVolumeSource, Secret, SecretProjection, SecretVolumeSource, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount, VolumeProjection, VolumeResourceRequirements,
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
        init_containers_run_in_order_before_the_containers,
        failing_init_container_is_retried_with_back_off,
        failed_init_container_fails_a_never_pod,
        etcd_image_tools_run_as_init_containers,
        seed_member_starts_on_data_restored_by_init_containers,
        a_graceful_node_shutdown_fails_the_pods_and_keeps_their_claims,
        a_slow_image_pull_keeps_the_pod_pending,
        secret_and_config_map_volumes_are_refreshed_while_the_pod_runs,
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
        .create(&PostParams::default(), &claim("keep"))
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

// ---------------------------------------------------------------------------------------------
// Init containers.

/// The image of the init-container tests, per namespace: `/bin/sh` of this machine.
fn shell_image(ns: &str) -> String {
    format!("registry.example/{ns}/shell:1")
}

/// Maps [`shell_image`] to the local `/bin/sh`.
fn map_shell_image(ctx: &TestContext) -> anyhow::Result<()> {
    ctx.kubelet()?.images().register_repository(
        format!("/{}/shell", ctx.ns()),
        ImageMapping::new("/bin/sh", "/bin/sh"),
    );
    Ok(())
}

/// A container of [`shell_image`] running `sh -c SCRIPT`, the pod's emptyDir `work` mounted
/// at `/work` (rewritten to the volume directory in the script).
fn shell_container(ns: &str, name: &str, script: &str) -> Container {
    Container {
        name: name.into(),
        image: Some(shell_image(ns)),
        command: Some(vec!["/bin/sh".into(), "-c".into(), script.into()]),
        volume_mounts: Some(vec![VolumeMount {
            name: "work".into(),
            mount_path: "/work".into(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    }
}

/// A pod with `init` init containers, `containers`, an emptyDir `work` and `restart_policy`.
fn pod_with_init_containers(
    name: &str,
    init: Vec<Container>,
    containers: Vec<Container>,
    restart_policy: &str,
) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            init_containers: Some(init),
            containers,
            volumes: Some(vec![Volume {
                name: "work".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            restart_policy: Some(restart_policy.into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            termination_grace_period_seconds: Some(5),
            ..PodSpec::default()
        }),
        status: None,
    }
}

/// The resourceVersion to watch a pod from, taken before it is created: the watch then
/// delivers every version of it (see [`pod_history`]).
async fn watch_start(api: &Api<Pod>) -> anyhow::Result<String> {
    let list = api.list(&ListParams::default().limit(1)).await?;
    list.metadata
        .resource_version
        .context("the pod list has no resourceVersion")
}

/// Every version of pod `name` after resourceVersion `since` (see [`watch_start`]), as a
/// watch delivers them, up to the first one for which `done` holds (included).
async fn pod_history(
    api: &Api<Pod>,
    name: &str,
    since: &str,
    done: impl Fn(&Pod) -> bool,
) -> anyhow::Result<Vec<Pod>> {
    use futures::TryStreamExt as _;
    let params = kube::api::WatchParams::default()
        .fields(&format!("metadata.name={name}"))
        .timeout(u32::try_from(WAIT.as_secs()).unwrap_or(60) + 10);
    let stream = api.watch(&params, since).await?;
    futures::pin_mut!(stream);
    let mut history = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let event = tokio::time::timeout_at(deadline, stream.try_next())
            .await
            .map_err(|_| anyhow::anyhow!("timed out; last version: {:?}", history.last()))??;
        match event {
            Some(kube::api::WatchEvent::Added(pod) | kube::api::WatchEvent::Modified(pod)) => {
                let finished = done(&pod);
                history.push(pod);
                if finished {
                    return Ok(history);
                }
            }
            Some(kube::api::WatchEvent::Deleted(_)) => bail!("pod {name} was deleted"),
            Some(kube::api::WatchEvent::Bookmark(_)) => {}
            Some(kube::api::WatchEvent::Error(e)) => bail!("watching pod {name}: {e}"),
            None => bail!(
                "the watch of pod {name} ended; last version: {:?}",
                history.last()
            ),
        }
    }
}

fn init_statuses(pod: &Pod) -> &[ContainerStatus] {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_deref())
        .unwrap_or_default()
}

fn init_status<'a>(pod: &'a Pod, name: &str) -> Option<&'a ContainerStatus> {
    init_statuses(pod).iter().find(|c| c.name == name)
}

fn terminated(
    c: &ContainerStatus,
) -> Option<&k8s_openapi::api::core::v1::ContainerStateTerminated> {
    c.state.as_ref()?.terminated.as_ref()
}

fn is_running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn completed(c: &ContainerStatus) -> bool {
    terminated(c).is_some_and(|t| t.exit_code == 0 && t.reason.as_deref() == Some("Completed"))
}

/// The pod condition `type_`: (status, reason).
fn pod_condition(pod: &Pod, type_: &str) -> Option<(String, Option<String>)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn phase_of(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// Every version in which not all init containers completed: Pending (once it has a
/// status), not Initialized, and the containers waiting with PodInitializing, never started.
fn ensure_containers_waited(history: &[Pod], inits: usize) -> anyhow::Result<()> {
    let mut initializing = 0;
    for pod in history {
        if pod.status.is_none() || init_statuses(pod).is_empty() {
            continue;
        }
        if init_statuses(pod).len() == inits && init_statuses(pod).iter().all(completed) {
            continue;
        }
        initializing += 1;
        ensure!(
            phase_of(pod) == Some("Pending"),
            "not Pending: {:?}",
            pod.status
        );
        ensure!(
            pod_condition(pod, "Initialized")
                == Some(("False".into(), Some("ContainersNotInitialized".into()))),
            "Initialized: {:?}",
            pod.status
        );
        let c = container_status(pod).context("no container status")?;
        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
        ensure!(
            waiting.and_then(|w| w.reason.as_deref()) == Some("PodInitializing")
                && c.restart_count == 0
                && c.last_state.as_ref().is_none_or(|s| s.terminated.is_none()),
            "a container started before the init containers completed: {c:?}"
        );
    }
    ensure!(
        initializing > 0,
        "no status while the init containers ran: {history:?}"
    );
    Ok(())
}

/// Reads `path` until `check` holds for its contents (a process writes it).
async fn wait_file(path: &Path, check: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let what = format!("{} to be as expected", path.display());
    let text = poll_until(&what, WAIT, || async {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        Ok::<_, std::convert::Infallible>(check(&text).then_some(text))
    })
    .await?;
    Ok(text)
}

/// Two init containers run one after the other, to completion, before the container, with
/// their env expanded and the pod's emptyDir shared; the status reports them; a crash of the
/// container later restarts only the container.
async fn init_containers_run_in_order_before_the_containers(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    map_shell_image(&ctx)?;
    let mut first = shell_container(
        &ns,
        "init-a",
        "echo \"first $(POD_NAME)\" >> /work/order && echo init-a ran",
    );
    first.env = Some(vec![EnvVar {
        name: "POD_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        value: None,
    }]);
    // command + args; fails (the pod would not start) if init-a has not run before it.
    let mut second = shell_container(&ns, "init-b", "");
    second.command = Some(vec!["/bin/sh".into()]);
    second.args = Some(vec![
        "-c".into(),
        "test -s /work/order && echo second >> /work/order".into(),
    ]);
    let app = shell_container(&ns, "app", "cat /work/order; exec sleep 600");
    let api: Api<Pod> = ctx.api();
    let since = watch_start(&api).await?;
    api.create(
        &PostParams::default(),
        &pod_with_init_containers("ordered", vec![first, second], vec![app], "Always"),
    )
    .await?;
    let history = pod_history(&api, "ordered", &since, |p| {
        container_status(p).is_some_and(is_running)
    })
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 40))?;
    ensure_containers_waited(&history, 2)?;
    // init-b never ran before init-a completed.
    for pod in &history {
        if init_status(pod, "init-b").is_some_and(|c| is_running(c) || terminated(c).is_some()) {
            ensure!(
                init_status(pod, "init-a").is_some_and(completed),
                "init-b ran before init-a completed: {:?}",
                init_statuses(pod)
            );
        }
    }
    ensure!(
        history
            .iter()
            .any(|p| init_status(p, "init-a").is_some_and(is_running)),
        "init-a was never reported running"
    );

    let pod = history.last().context("no versions")?;
    ensure!(phase_of(pod) == Some("Running"), "{:?}", pod.status);
    ensure!(
        pod_condition(pod, "Initialized").map(|c| c.0).as_deref() == Some("True"),
        "{:?}",
        pod.status
    );
    let inits = init_statuses(pod);
    ensure!(
        inits.iter().map(|c| c.name.as_str()).collect::<Vec<_>>() == ["init-a", "init-b"],
        "{inits:?}"
    );
    for c in inits {
        ensure!(
            completed(c) && c.restart_count == 0 && c.ready && c.image == shell_image(&ns),
            "{c:?}"
        );
    }

    let expected = "first ordered\nsecond\n";
    let order = kubelet.volume_dir(&ns, "ordered", "work")?.join("order");
    ensure!(std::fs::read_to_string(&order)? == expected);
    let app_log = kubelet.container_log_path(&ns, "ordered", None)?;
    wait_file(&app_log, |log| log == expected).await?;
    let init_log = kubelet.container_log_path(&ns, "ordered", Some("init-a"))?;
    ensure!(
        std::fs::read_to_string(&init_log)? == "init-a ran\n",
        "{}",
        init_log.display()
    );

    // A crash of the container restarts it alone: the init containers do not run again.
    kubelet.kill_container(&ns, "ordered")?;
    let pod = wait_pod_status(&api, "ordered", "the container restarted", |p| {
        container_status(p).is_some_and(|c| c.restart_count == 1 && is_running(c))
    })
    .await?;
    wait_file(&app_log, |log| log == expected.repeat(2)).await?;
    ensure!(
        std::fs::read_to_string(&order)? == expected,
        "init ran again"
    );
    ensure!(
        init_statuses(&pod)
            .iter()
            .all(|c| completed(c) && c.restart_count == 0),
        "{:?}",
        init_statuses(&pod)
    );
    Ok(())
}

/// Waits until pod `name` exists and `check` holds (ready or not).
async fn wait_pod_status(
    api: &Api<Pod>,
    name: &str,
    what: &str,
    check: impl Fn(&Pod) -> bool + Send + 'static,
) -> anyhow::Result<Pod> {
    await_condition(
        api.clone(),
        name,
        move |p: Option<&Pod>| p.is_some_and(&check),
        WAIT,
    )
    .await
    .with_context(|| format!("waiting for pod {name}: {what}"))?
    .context("pod vanished")
}

/// An init container that fails twice is restarted with the containers' back-off (0.2 s, then
/// 0.4 s) and the container starts only once it succeeded.
async fn failing_init_container_is_retried_with_back_off(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    map_shell_image(&ctx)?;
    // `$$` is a literal `$` after the kubelet's `$(VAR)` expansion.
    let flaky = shell_container(
        &ns,
        "flaky",
        "n=$$(cat /work/attempts 2>/dev/null || echo 0); n=$$((n + 1)); \
         echo $n > /work/attempts; date +%s%N >> /work/starts; echo \"attempt $n\"; \
         [ $n -ge 3 ]",
    );
    let app = shell_container(&ns, "app", "cat /work/attempts; exec sleep 600");
    let api: Api<Pod> = ctx.api();
    let since = watch_start(&api).await?;
    api.create(
        &PostParams::default(),
        &pod_with_init_containers("flaky", vec![flaky], vec![app], "Always"),
    )
    .await?;
    let history = pod_history(&api, "flaky", &since, |p| {
        container_status(p).is_some_and(is_running)
    })
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 40))?;
    ensure_containers_waited(&history, 1)?;
    ensure!(
        history.iter().any(|p| {
            init_status(p, "flaky")
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.as_deref())
                == Some("CrashLoopBackOff")
        }),
        "the init container was never in CrashLoopBackOff"
    );

    let pod = history.last().context("no versions")?;
    let c = init_status(pod, "flaky").context("no init container status")?;
    ensure!(completed(c) && c.restart_count == 2 && c.ready, "{c:?}");
    let last = c
        .last_state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .context("no lastState.terminated")?;
    ensure!(
        last.exit_code == 1 && last.reason.as_deref() == Some("Error"),
        "{last:?}"
    );
    ensure!(
        pod_condition(pod, "Initialized").map(|c| c.0).as_deref() == Some("True"),
        "{:?}",
        pod.status
    );

    let work = kubelet.volume_dir(&ns, "flaky", "work")?;
    let starts: Vec<u128> = std::fs::read_to_string(work.join("starts"))?
        .lines()
        .map(|l| l.trim().parse::<u128>())
        .collect::<Result<_, _>>()?;
    ensure!(starts.len() == 3, "{starts:?}");
    let gaps: Vec<Duration> = starts
        .windows(2)
        .map(|w| Duration::from_nanos(u64::try_from(w[1].saturating_sub(w[0])).unwrap_or(0)))
        .collect();
    ensure!(
        gaps[0] >= Duration::from_millis(200) && gaps[1] >= Duration::from_millis(400),
        "restarts not spaced by the back-off (0.2 s, 0.4 s): {gaps:?}"
    );
    let init_log = kubelet.container_log_path(&ns, "flaky", Some("flaky"))?;
    ensure!(
        std::fs::read_to_string(init_log)? == "attempt 1\nattempt 2\nattempt 3\n",
        "init container log"
    );
    let app_log = kubelet.container_log_path(&ns, "flaky", None)?;
    wait_file(&app_log, |log| log == "3\n").await?;
    Ok(())
}

/// With `restartPolicy: Never` a failed init container fails the pod: the init containers
/// after it and the container never start.
async fn failed_init_container_fails_a_never_pod(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    map_shell_image(&ctx)?;
    let failing = shell_container(&ns, "failing", "echo giving up; exit 3");
    let next = shell_container(&ns, "next", "echo ran > /work/next");
    let app = shell_container(&ns, "app", "echo ran > /work/app");
    let api: Api<Pod> = ctx.api();
    let since = watch_start(&api).await?;
    api.create(
        &PostParams::default(),
        &pod_with_init_containers("doomed", vec![failing, next], vec![app], "Never"),
    )
    .await?;
    let history = pod_history(&api, "doomed", &since, |p| {
        phase_of(p).is_some_and(|phase| phase != "Pending")
    })
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 40))?;
    let pod = history.last().context("no versions")?;
    ensure!(phase_of(pod) == Some("Failed"), "{:?}", pod.status);
    for version in &history {
        ensure!(
            init_status(version, "next").is_none_or(|c| !is_running(c) && terminated(c).is_none()),
            "the second init container ran: {:?}",
            init_statuses(version)
        );
        ensure!(
            container_status(version).is_none_or(|c| !is_running(c) && terminated(c).is_none()),
            "the container ran: {:?}",
            version.status
        );
    }
    let c = init_status(pod, "failing").context("no init container status")?;
    let t = terminated(c).context("not terminated")?;
    ensure!(
        t.exit_code == 3
            && t.reason.as_deref() == Some("Error")
            && c.restart_count == 0
            && !c.ready,
        "{c:?}"
    );
    let waiting = |c: Option<&ContainerStatus>| {
        c.and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
    };
    ensure!(waiting(init_status(pod, "next")).as_deref() == Some("PodInitializing"));
    ensure!(waiting(container_status(pod)).as_deref() == Some("PodInitializing"));
    ensure!(
        pod_condition(pod, "Initialized")
            == Some(("False".into(), Some("ContainersNotInitialized".into()))),
        "{:?}",
        pod.status
    );
    ensure!(pod_condition(pod, "Ready").map(|c| c.0).as_deref() == Some("False"));

    let work = kubelet.volume_dir(&ns, "doomed", "work")?;
    ensure!(!work.join("next").exists() && !work.join("app").exists());
    ensure!(kubelet.container_pid(&ns, "doomed").is_none());
    ensure!(!kubelet.container_log_path(&ns, "doomed", None)?.exists());
    let log =
        std::fs::read_to_string(kubelet.container_log_path(&ns, "doomed", Some("failing"))?)?;
    ensure!(log == "giving up\n", "{log}");
    Ok(())
}

/// The etcd images' tools run as init containers: `/usr/local/bin/etcdutl` of etcd 3.6, and
/// the `etcdctl` (API v3) of etcd 3.2, which has no etcdutl.
async fn etcd_image_tools_run_as_init_containers(ctx: TestContext) -> anyhow::Result<()> {
    const V32: &str = "3.2.13";
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    let tool = |name: &str, version: &str, command: &[&str]| Container {
        name: name.into(),
        image: Some(format!("quay.io/coreos/etcd:v{version}")),
        command: Some(command.iter().map(|s| (*s).to_owned()).collect()),
        env: Some(vec![EnvVar {
            name: "ETCDCTL_API".into(),
            value: Some("3".into()),
            value_from: None,
        }]),
        ..Container::default()
    };
    let api: Api<Pod> = ctx.api();
    api.create(
        &PostParams::default(),
        &pod_with_init_containers(
            "tools",
            vec![
                tool("etcdutl", V36, &["/usr/local/bin/etcdutl", "version"]),
                tool("etcdctl-32", V32, &["/usr/local/bin/etcdctl", "version"]),
            ],
            vec![tool("etcdctl", V36, &["etcdctl", "version"])],
            "Never",
        ),
    )
    .await?;
    let pod = wait_pod_status(&api, "tools", "finished", |p| {
        matches!(phase_of(p), Some("Succeeded" | "Failed"))
    })
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 40))?;
    let log = |container: &str| -> anyhow::Result<String> {
        let path = kubelet.container_log_path(&ns, "tools", Some(container))?;
        Ok(std::fs::read_to_string(path)?)
    };
    ensure!(
        phase_of(&pod) == Some("Succeeded"),
        "{:?}\n{}",
        pod.status,
        kubelet.log_tails(Some(&ns), 40)
    );
    let etcdutl = log("etcdutl")?;
    ensure!(
        etcdutl.contains(&format!("etcdutl version: {V36}")),
        "{etcdutl}"
    );
    let etcdctl = log("etcdctl-32")?;
    ensure!(
        etcdctl.contains(&format!("etcdctl version: {V32}")) && etcdctl.contains("API version: 3"),
        "{etcdctl}"
    );
    for c in init_statuses(&pod) {
        ensure!(completed(c), "{c:?}");
        ensure!(c.image_id.contains("etcd"), "{c:?}");
    }
    ensure!(init_status(&pod, "etcdctl-32").is_some_and(|c| c.image_id.contains(V32)));
    Ok(())
}

/// A seed member restored from a snapshot as the operator's restore does it: one init container
/// puts the snapshot into the data volume, one runs the etcd image's `etcdutl snapshot restore`
/// into it, then the member starts on the restored data.
async fn seed_member_starts_on_data_restored_by_init_containers(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    map_shell_image(&ctx)?;
    let api: Api<Pod> = ctx.api();
    api.create(&PostParams::default(), &Member::new("origin", V36).pod(&ns))
        .await?;
    let origin = wait_ready(&api, "origin")
        .await
        .with_context(|| logs_on_failure(&ctx, "origin"))?;
    let origin_ip = pod_ip(&origin)?;
    etcdctl(&ctx, V36, origin_ip, &["put", "restored", "from-snapshot"]).await?;
    let dir = tempfile::tempdir()?;
    let snapshot = dir.path().join("snapshot.db");
    let snapshot_arg = snapshot.to_string_lossy().into_owned();
    etcdctl(&ctx, V36, origin_ip, &["snapshot", "save", &snapshot_arg]).await?;

    let mut pod = Member::new("seed", V36).pod(&ns);
    let spec = pod.spec.as_mut().context("spec")?;
    let data_mount = VolumeMount {
        name: "data".into(),
        mount_path: DATA.into(),
        ..VolumeMount::default()
    };
    // The "download": a copy from the test's directory (the process kubelet shares the host's
    // file system), into the data volume.
    let fetch = Container {
        name: "fetch-snapshot".into(),
        image: Some(shell_image(&ns)),
        command: Some(vec![
            "/bin/sh".into(),
            "-c".into(),
            format!("cp {snapshot_arg} {DATA}/snapshot.db"),
        ]),
        volume_mounts: Some(vec![data_mount.clone()]),
        ..Container::default()
    };
    let restore = Container {
        name: "restore".into(),
        image: Some(format!("quay.io/coreos/etcd:v{V36}")),
        command: Some(vec!["/usr/local/bin/etcdutl".into()]),
        args: Some(vec![
            "snapshot".into(),
            "restore".into(),
            format!("{DATA}/snapshot.db"),
            format!("--data-dir={DATA}/data"),
            "--name=seed".into(),
            "--initial-cluster=seed=http://$(POD_IP):2380".into(),
            "--initial-advertise-peer-urls=http://$(POD_IP):2380".into(),
            "--initial-cluster-token=token-seed".into(),
        ]),
        env: Some(vec![EnvVar {
            name: "POD_IP".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "status.podIP".into(),
                    api_version: None,
                }),
                ..EnvVarSource::default()
            }),
            value: None,
        }]),
        volume_mounts: Some(vec![data_mount]),
        ..Container::default()
    };
    spec.init_containers = Some(vec![fetch, restore]);
    api.create(&PostParams::default(), &pod).await?;
    let seed = wait_ready(&api, "seed").await.with_context(|| {
        format!(
            "{}\n{}",
            logs_on_failure(&ctx, "seed"),
            kubelet.log_tails(Some(&ns), 40)
        )
    })?;
    ensure!(
        init_statuses(&seed).iter().all(completed),
        "{:?}",
        init_statuses(&seed)
    );
    ensure!(get_key(&ctx, V36, pod_ip(&seed)?, "restored").await? == "from-snapshot");
    let data = kubelet.volume_dir(&ns, "seed", "data")?;
    ensure!(data.join("snapshot.db").is_file() && data.join("data/member").is_dir());
    Ok(())
}

fn claim(name: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
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
    }
}

/// Issue 23, item 3: a graceful node shutdown as a kubelet carries it out: every pod of the
/// node gets SIGTERM, ends `Failed` with reason `Terminated` and the kubelet's message, is not
/// restarted (bare pods never are), loses its emptyDir and keeps its claim; the node comes back
/// and a new pod on the claim finds the data.
async fn a_graceful_node_shutdown_fails_the_pods_and_keeps_their_claims(
    ctx: TestContext,
) -> anyhow::Result<()> {
    use etcd_tests::kubelet::{NODE_SHUTDOWN_MESSAGE, NODE_SHUTDOWN_REASON};
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    let claims: Api<PersistentVolumeClaim> = ctx.api();
    claims
        .create(&PostParams::default(), &claim("disk"))
        .await?;
    let api: Api<Pod> = ctx.api();
    let mut durable = Member::new("durable", V36);
    durable.claim = Some("disk");
    durable.dns = Some(("durable", "shutdown"));
    api.create(&PostParams::default(), &durable.pod(&ns))
        .await?;
    api.create(
        &PostParams::default(),
        &Member::new("ephemeral", V36).pod(&ns),
    )
    .await?;
    let pod = wait_ready(&api, "durable")
        .await
        .with_context(|| logs_on_failure(&ctx, "durable"))?;
    wait_ready(&api, "ephemeral")
        .await
        .with_context(|| logs_on_failure(&ctx, "ephemeral"))?;
    etcdctl(&ctx, V36, pod_ip(&pod)?, &["put", "before", "shutdown"]).await?;
    let scratch = kubelet.volume_dir(&ns, "ephemeral", "data")?;
    let pids: Vec<u32> = ["durable", "ephemeral"]
        .iter()
        .filter_map(|p| kubelet.container_pid(&ns, p))
        .collect();
    ensure!(pids.len() == 2, "{pids:?}");

    let ended = kubelet.shut_down_gracefully(&ns).await?;
    ensure!(ended.len() == 2, "{ended:?}");
    for name in ["durable", "ephemeral"] {
        let pod = await_condition(
            api.clone(),
            name,
            |p: Option<&Pod>| phase_of_opt(p) == Some("Failed"),
            WAIT,
        )
        .await?
        .context("pod gone")?;
        let status = pod.status.clone().context("status")?;
        ensure!(
            status.reason.as_deref() == Some(NODE_SHUTDOWN_REASON)
                && status.message.as_deref() == Some(NODE_SHUTDOWN_MESSAGE),
            "{name}: {:?} {:?}",
            status.reason,
            status.message
        );
        ensure!(!is_ready(&pod), "{name} still Ready");
    }
    for pid in &pids {
        ensure!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} still runs"
        );
    }
    let log = std::fs::read_to_string(kubelet.container_log_path(&ns, "durable", None)?)?;
    ensure!(
        log.contains("received signal; shutting down"),
        "etcd did not get SIGTERM:\n{log}"
    );
    ensure!(!scratch.exists(), "the emptyDir survived the shutdown");
    ensure!(
        kubelet.claim_dir(&ns, "disk").join("data/member").is_dir(),
        "the claim's data is gone"
    );
    // Ended for good: no restart, whatever the restart policy.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = api.get("durable").await?;
    ensure!(
        phase_of(&still) == Some("Failed") && kubelet.container_pid(&ns, "durable").is_none(),
        "the ended pod came back"
    );
    // The node is back: a new pod on the claim runs, with the data.
    api.delete("durable", &DeleteParams::default()).await?;
    await_condition(
        api.clone(),
        "durable",
        conditions::is_deleted(&still.uid().context("uid")?),
        WAIT,
    )
    .await?;
    api.create(&PostParams::default(), &durable.pod(&ns))
        .await?;
    let back = wait_ready(&api, "durable")
        .await
        .with_context(|| logs_on_failure(&ctx, "durable"))?;
    ensure!(get_key(&ctx, V36, pod_ip(&back)?, "before").await? == "shutdown");
    Ok(())
}

fn phase_of_opt(pod: Option<&Pod>) -> Option<&str> {
    pod.and_then(phase_of)
}

/// Issue 23, item 5: a slow image pull (a large image, a slow registry) keeps the pod
/// `Pending` with its container waiting in `ContainerCreating` ("Pulling image"), then it runs.
async fn a_slow_image_pull_keeps_the_pod_pending(ctx: TestContext) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    let api: Api<Pod> = ctx.api();
    // Only this test's image pulls are slowed: its own repository.
    let mut member = Member::new("slow", V36);
    member.image = format!("slow.example/{ns}/etcd:v{V36}");
    let prefix = format!("slow.example/{ns}/");
    kubelet.set_image_pull_delay(&prefix, Duration::from_secs(4));
    let created = Instant::now();
    api.create(&PostParams::default(), &member.pod(&ns)).await?;
    let pulling = await_condition(
        api.clone(),
        "slow",
        |p: Option<&Pod>| {
            p.and_then(container_status)
                .and_then(|c| c.state.as_ref()?.waiting.as_ref()?.message.clone())
                .is_some_and(|m| m.starts_with("Pulling image"))
        },
        WAIT,
    )
    .await?
    .context("pod gone")?;
    kubelet.set_image_pull_delay(&prefix, Duration::ZERO);
    ensure!(
        phase_of(&pulling) == Some("Pending"),
        "{:?}",
        phase_of(&pulling)
    );
    let waiting =
        container_status(&pulling).and_then(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
    ensure!(
        waiting.as_deref() == Some("ContainerCreating"),
        "{waiting:?}"
    );
    wait_ready(&api, "slow")
        .await
        .with_context(|| logs_on_failure(&ctx, "slow"))?;
    ensure!(
        created.elapsed() >= Duration::from_secs(4),
        "ready after {:?}, before the pull ended",
        created.elapsed()
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Secret and ConfigMap volumes refreshed while the pod runs.

/// The content of `dir/name` (through the volume's symlinks), or empty.
fn read_volume_file(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// The version directory `..data` of atomic-writer volume `dir` points to.
fn data_version(dir: &Path) -> anyhow::Result<String> {
    let target = std::fs::read_link(dir.join("..data"))
        .with_context(|| format!("{}/..data is not a symlink", dir.display()))?;
    let name = target.to_string_lossy().into_owned();
    ensure!(
        name.starts_with("..") && name != "..data" && !name.contains('/'),
        "..data -> {name}"
    );
    Ok(name)
}

/// As a kubelet does (what certificate rotation relies on), Secret and ConfigMap files of a
/// running pod's `secret` and `projected` volumes are refreshed: they are laid out as
/// `KEY -> ..data/KEY`, `..data -> ..<timestamp>`; an update of the Secret swaps `..data` to a
/// new version directory (the old one removed) within a few resync periods, and the running
/// container (not restarted) reads the new content through the same path. A `subPath` mount
/// keeps the content of the container's start; a deleted ConfigMap leaves its files as they
/// were (logged).
async fn secret_and_config_map_volumes_are_refreshed_while_the_pod_runs(
    ctx: TestContext,
) -> anyhow::Result<()> {
    let kubelet = ctx.kubelet()?;
    let ns = ctx.ns().to_owned();
    map_shell_image(&ctx)?;
    let secrets: Api<Secret> = ctx.api();
    let maps: Api<ConfigMap> = ctx.api();
    let secret = Secret {
        metadata: ObjectMeta {
            name: Some("tls".into()),
            ..ObjectMeta::default()
        },
        string_data: Some(
            [
                ("tls.crt".to_owned(), "v1".to_owned()),
                ("tls.key".to_owned(), "v1".to_owned()),
            ]
            .into(),
        ),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &secret).await?;
    let map = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            ..ObjectMeta::default()
        },
        data: Some([("level".to_owned(), "a".to_owned())].into()),
        ..ConfigMap::default()
    };
    maps.create(&PostParams::default(), &map).await?;

    // Copies what it reads through the mount paths (rewritten to the volumes) to /work.
    let mut reader = shell_container(
        &ns,
        "reader",
        "while true; do \
           cat /etc/tls/tls.crt > /work/seen.tmp && mv /work/seen.tmp /work/seen; \
           cat /etc/pinned.crt > /work/pinned.tmp && mv /work/pinned.tmp /work/pinned; \
           sleep 0.2; \
         done",
    );
    let mount = |name: &str, path: &str, sub: Option<&str>| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        sub_path: sub.map(Into::into),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    reader.volume_mounts.get_or_insert_default().extend([
        mount("tls", "/etc/tls", None),
        mount("tls", "/etc/pinned.crt", Some("tls.crt")),
        mount("bundle", "/etc/bundle", None),
    ]);
    let mut pod = pod_with_init_containers("reader", Vec::new(), vec![reader], "Always");
    let spec = pod.spec.as_mut().context("spec")?;
    spec.init_containers = None;
    spec.volumes.get_or_insert_default().extend([
        Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some("tls".into()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "bundle".into(),
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![
                    VolumeProjection {
                        secret: Some(SecretProjection {
                            name: "tls".into(),
                            items: Some(vec![KeyToPath {
                                key: "tls.crt".into(),
                                path: "certs/tls.crt".into(),
                                mode: None,
                            }]),
                            optional: None,
                        }),
                        ..VolumeProjection::default()
                    },
                    VolumeProjection {
                        config_map: Some(ConfigMapProjection {
                            name: "settings".into(),
                            items: None,
                            optional: None,
                        }),
                        ..VolumeProjection::default()
                    },
                ]),
                default_mode: None,
            }),
            ..Volume::default()
        },
    ]);
    let api: Api<Pod> = ctx.api();
    api.create(&PostParams::default(), &pod).await?;
    wait_ready(&api, "reader")
        .await
        .with_context(|| logs_on_failure(&ctx, "reader"))?;
    let work = kubelet.volume_dir(&ns, "reader", "work")?;
    wait_file(&work.join("seen"), |t| t == "v1").await?;
    wait_file(&work.join("pinned"), |t| t == "v1").await?;
    let pid = kubelet.container_pid(&ns, "reader").context("no pid")?;

    // The atomic-writer layout.
    let tls = kubelet.volume_dir(&ns, "reader", "tls")?;
    let bundle = kubelet.volume_dir(&ns, "reader", "bundle")?;
    let first = data_version(&tls)?;
    for key in ["tls.crt", "tls.key"] {
        ensure!(
            std::fs::read_link(tls.join(key))? == Path::new(&format!("..data/{key}")),
            "{key} is not a symlink into ..data"
        );
        let file = tls.join(&first).join(key);
        ensure!(
            file.symlink_metadata()?.is_file() && std::fs::read_to_string(&file)? == "v1",
            "{}",
            file.display()
        );
    }
    data_version(&bundle)?;
    ensure!(std::fs::read_link(bundle.join("certs"))? == Path::new("..data/certs"));
    ensure!(read_volume_file(&bundle, "certs/tls.crt") == "v1");
    ensure!(read_volume_file(&bundle, "level") == "a");

    // Update both; the volumes follow within a few periods (the deadline has room for a busy
    // machine).
    let updated = Instant::now();
    secrets
        .patch(
            "tls",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "stringData": { "tls.crt": "v2", "tls.key": "v2" }
            })),
        )
        .await?;
    maps.patch(
        "settings",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "data": { "level": "b" } })),
    )
    .await?;
    let period = kubelet.volume_resync();
    let deadline = period * 3 + Duration::from_secs(10);
    poll_until("the secret volume to hold v2", deadline, || async {
        Ok::<_, std::convert::Infallible>(
            (read_volume_file(&tls, "tls.crt") == "v2"
                && read_volume_file(&tls, "tls.key") == "v2")
                .then_some(()),
        )
    })
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 30))?;
    eprintln!(
        "secret volume refreshed {:?} after the update (resync period {period:?})",
        updated.elapsed()
    );
    poll_until(
        "the projected volume to hold v2 and b",
        deadline,
        || async {
            Ok::<_, std::convert::Infallible>(
                (read_volume_file(&bundle, "certs/tls.crt") == "v2"
                    && read_volume_file(&bundle, "level") == "b")
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 30))?;
    // A swap of ..data to a new version; the old one is gone, the user-visible links stay.
    let second = data_version(&tls)?;
    ensure!(second != first, "..data still points to {first}");
    ensure!(!tls.join(&first).exists(), "{first} was not removed");
    ensure!(std::fs::read_link(tls.join("tls.crt"))? == Path::new("..data/tls.crt"));
    let version = std::fs::canonicalize(tls.join("..data"))?;
    ensure!(
        std::fs::read_to_string(version.join("tls.crt"))? == "v2"
            && std::fs::read_to_string(version.join("tls.key"))? == "v2"
    );

    // The running container reads the new files through the same path; its subPath copy does
    // not change.
    wait_file(&work.join("seen"), |t| t == "v2").await?;
    ensure!(
        kubelet.container_pid(&ns, "reader") == Some(pid),
        "the container was restarted"
    );
    let pinned = std::fs::read_to_string(work.join("pinned"))?;
    ensure!(pinned == "v1", "the subPath mount changed: {pinned:?}");

    // A deleted ConfigMap: the volume keeps its files (and the kubelet says so).
    maps.delete("settings", &DeleteParams::default()).await?;
    poll_until(
        "the kubelet to log the missing configmap",
        deadline,
        || async {
            Ok::<_, std::convert::Infallible>(
                kubelet
                    .log_tails(Some(&ns), 200)
                    .contains("volume bundle not refreshed: configmap \"settings\" not found")
                    .then_some(()),
            )
        },
    )
    .await
    .with_context(|| kubelet.log_tails(Some(&ns), 30))?;
    ensure!(read_volume_file(&bundle, "level") == "b");
    ensure!(read_volume_file(&bundle, "certs/tls.crt") == "v2");
    Ok(())
}
