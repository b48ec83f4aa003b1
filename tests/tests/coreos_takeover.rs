//! Taking over clusters CoreOS' operator left running (issue 28): on the real control plane, a
//! cluster made exactly as CoreOS' operator made its pods and Services (see
//! `support/coreos.rs` for the few deviations the process kubelet needs), holding keys and
//! under continuous writes through its client Service, is adopted by the helm-installed
//! operator: its members replaced by the operator's one at a time, no acknowledged write lost,
//! every key readable throughout, the client Service never without a ready endpoint. Also from
//! CoreOS' own CRD (no schema, no status subresource), with CoreOS-layout TLS, on 3.3 through a
//! controller restart and a CoreOS member dying mid-way, and on 3.4 (learners) after a pause.
//!
//! Run: `cargo test -p etcd-tests --test coreos_takeover` (needs `hack/build-tools.sh` and the
//! operator binaries: `cargo build -p etcd-controller -p etcd-webhook`).

#[allow(dead_code, reason = "shared with the other suites")]
mod support;

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use etcd_client::GetOptions;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio::sync::RwLock;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use etcd_shared::types::ClusterPhase;
use etcd_shared::{EtcdCluster, names};
use etcd_tests::endpoints::ready_addresses;
use etcd_tests::operator::{OperatorBinaries, Release, chart_dir, control_plane_options, helm};
use etcd_tests::suite::{Suite, TestContext};
use etcd_tests::{HelmMajor, KubeletOptions, poll_until};

use support::coreos::{self, CoreosCluster, SAMPLE_INTERVAL};
use support::writer::Writer;
use support::{Access, WAIT, client_service_urls_with, connect_with, event_count, wait_until};

/// CoreOS' CRD replaces ours for one test: no other test of the suite runs meanwhile.
static CRDS: RwLock<()> = RwLock::const_new(());

/// Keys written before the take-over, read back throughout.
const SEEDED: usize = 200;

/// The longest a whole take-over may take.
const ADOPTION: Duration = Duration::from_secs(300);

fn main() -> ExitCode {
    Suite::new()
        .options(control_plane_options())
        .with_kubelet(KubeletOptions::default())
        .test_timeout(Duration::from_secs(720))
        .run(etcd_tests::tests![
            a_3_2_cluster_under_coreos_crd_is_adopted_without_downtime,
            a_3_2_cluster_with_coreos_tls_is_adopted,
            a_3_3_cluster_is_adopted_through_a_controller_restart_and_a_member_lost,
            a_paused_3_4_cluster_is_left_alone_then_adopted_with_learners,
        ])
}

/// What a take-over test varies.
struct Case {
    /// Helm release (one per test: the webhook configurations are cluster-wide).
    release: &'static str,
    /// The EtcdCluster's name.
    cluster: &'static str,
    /// etcd version CoreOS' members run.
    version: String,
    /// CoreOS-layout TLS for peers and clients.
    tls: bool,
    /// CoreOS' CRD is installed, not ours.
    coreos_crd: bool,
    /// Created with `spec.paused: true`, unpaused once the operator has left it alone.
    paused_first: bool,
    /// Restart the controller and lose a CoreOS member mid-way.
    faults: bool,
}

/// CoreOS' CRD for EtcdClusters as its operator registered it (apiextensions v1beta1, no
/// schema, no subresources, `preserveUnknownFields: true`), written into the control plane's
/// etcd the way an old cluster holds it: the API server no longer creates such a CRD.
async fn install_coreos_crd(ctx: &TestContext) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(ctx.client());
    // Whatever CRDs an earlier test installed go first (no other test runs meanwhile).
    for generated in etcd_shared::crd::all_crds() {
        let name = generated.crd.name_any();
        if crds.get_opt(&name).await?.is_some() {
            crds.delete(&name, &DeleteParams::default()).await?;
            poll_until(&format!("CRD {name} gone"), WAIT, || async {
                anyhow::Ok(crds.get_opt(&name).await?.is_none().then_some(()))
            })
            .await?;
        }
    }
    let name = "etcdclusters.etcd.database.coreos.com";
    let stored = json!({
        "kind": "CustomResourceDefinition",
        "apiVersion": "apiextensions.k8s.io/v1",
        "metadata": {
            "name": name,
            "uid": "9b3c2f43-7d1e-4f0a-9a57-1c3c0e2f6a10",
            "creationTimestamp": "2018-06-01T09:00:00Z",
            "generation": 1,
        },
        "spec": {
            "group": "etcd.database.coreos.com",
            "names": {"plural": "etcdclusters", "singular": "etcdcluster",
                "shortNames": ["etcd"], "kind": "EtcdCluster", "listKind": "EtcdClusterList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1beta2", "served": true, "storage": true}],
            "conversion": {"strategy": "None"},
            "preserveUnknownFields": true,
        },
        "status": {
            "conditions": [],
            "acceptedNames": {"plural": "", "kind": ""},
            "storedVersions": ["v1beta2"],
        },
    });
    let mut etcd = etcd_client::Client::connect([ctx.control_plane().etcd_url()], None).await?;
    etcd.put(
        format!("/registry/apiextensions.k8s.io/customresourcedefinitions/{name}"),
        serde_json::to_vec(&stored)?,
        None,
    )
    .await
    .context("writing CoreOS' CRD into the control plane's etcd")?;
    etcd_tests::await_condition(
        crds,
        name,
        kube::runtime::conditions::is_crd_established(),
        WAIT,
    )
    .await?;
    // Served: a list answers (the discovery of the new version takes a moment).
    let clusters: Api<EtcdCluster> = ctx.api();
    poll_until("EtcdClusters served under CoreOS' CRD", WAIT, || async {
        anyhow::Ok(clusters.list(&ListParams::default()).await.ok().map(|_| ()))
    })
    .await?;
    Ok(())
}

/// `kubectl apply -f -` of `yaml` in the test's namespace with `flags`.
async fn kubectl(ctx: &TestContext, flags: &[&str], yaml: Option<&str>) -> anyhow::Result<String> {
    use tokio::io::AsyncWriteExt as _;
    let mut command = tokio::process::Command::from(ctx.kubectl());
    command
        .args(["-n", ctx.ns()])
        .args(flags)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn()?;
    if let (Some(yaml), Some(mut stdin)) = (yaml, child.stdin.take()) {
        stdin.write_all(yaml.as_bytes()).await?;
    }
    let out = child.wait_with_output().await?;
    ensure!(
        out.status.success(),
        "kubectl {flags:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The EtcdCluster manifest of `case`: the users' example, as shipped, for their 3.2.13
/// cluster; otherwise the same with the case's name, version, TLS and pause.
fn manifest(case: &Case) -> anyhow::Result<String> {
    if case.cluster == "example-etcd-cluster" {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/example-etcd-cluster.yaml");
        return std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()));
    }
    let mut yaml = format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {}\nspec:\n  size: 3\n  version: \"{}\"\n",
        case.cluster, case.version
    );
    if case.paused_first {
        yaml.push_str("  paused: true\n");
    }
    if case.tls {
        yaml.push_str(&support::tls::tls_section(case.cluster));
    }
    Ok(yaml)
}

/// What the samplers saw while the operator took over.
#[derive(Debug, Default)]
struct Seen {
    /// Reads of every seeded key through the client Service: succeeded, failed (a request
    /// error; the client reconnects), and answered with other data (must never happen).
    reads_ok: usize,
    reads_failed: usize,
    reads_wrong: usize,
    /// Samples of the client Service's ready endpoints, and those with none.
    endpoint_samples: usize,
    endpoint_empty: usize,
    fewest_endpoints: usize,
    /// The most members joining at once (not started yet, or learners), and the most members.
    most_joining: usize,
    most_members: usize,
}

/// Samplers of a cluster under take-over: reads of the seeded keys and member lists through
/// the client Service, and the Service's ready endpoints.
struct Samplers {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<anyhow::Result<Seen>>>,
}

impl Samplers {
    fn start(
        slices: Api<EndpointSlice>,
        cluster: &str,
        access: &Access,
        seeded: BTreeMap<String, String>,
    ) -> Self {
        let stop = CancellationToken::new();
        let seeded = Arc::new(seeded);
        let reader = {
            let (stop, slices, cluster, access, seeded) = (
                stop.clone(),
                slices.clone(),
                cluster.to_string(),
                access.clone(),
                seeded.clone(),
            );
            tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut client = None;
                while !stop.is_cancelled() {
                    tokio::time::sleep(SAMPLE_INTERVAL).await;
                    if client.is_none() {
                        let urls = client_service_urls_with(&slices, &cluster, &access).await?;
                        client = connect_with(&urls, &access).await.ok();
                    }
                    let Some(c) = client.as_mut() else {
                        seen.reads_failed += 1;
                        continue;
                    };
                    match c.get("/seed/", Some(GetOptions::new().with_prefix())).await {
                        Ok(got) => {
                            let read: BTreeMap<String, String> = got
                                .kvs()
                                .iter()
                                .map(|kv| {
                                    (
                                        kv.key_str().unwrap_or_default().to_string(),
                                        kv.value_str().unwrap_or_default().to_string(),
                                    )
                                })
                                .collect();
                            if read == *seeded {
                                seen.reads_ok += 1;
                            } else {
                                seen.reads_wrong += 1;
                            }
                        }
                        Err(_) => {
                            seen.reads_failed += 1;
                            client = None;
                        }
                    }
                }
                Ok(seen)
            })
        };
        let endpoints = {
            let (stop, slices, service) = (
                stop.clone(),
                slices.clone(),
                names::client_service_name(cluster),
            );
            tokio::spawn(async move {
                let mut seen = Seen {
                    fewest_endpoints: usize::MAX,
                    ..Seen::default()
                };
                while !stop.is_cancelled() {
                    tokio::time::sleep(SAMPLE_INTERVAL).await;
                    let Ok(ready) = ready_addresses(&slices, &service).await else {
                        continue;
                    };
                    seen.endpoint_samples += 1;
                    seen.fewest_endpoints = seen.fewest_endpoints.min(ready.len());
                    if ready.is_empty() {
                        seen.endpoint_empty += 1;
                    }
                }
                Ok(seen)
            })
        };
        let members = {
            let (stop, slices, cluster, access) =
                (stop.clone(), slices, cluster.to_string(), access.clone());
            tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut client = None;
                while !stop.is_cancelled() {
                    tokio::time::sleep(SAMPLE_INTERVAL * 3).await;
                    if client.is_none() {
                        let urls = client_service_urls_with(&slices, &cluster, &access).await?;
                        client = connect_with(&urls, &access).await.ok();
                    }
                    let Some(c) = client.as_mut() else { continue };
                    match c.member_list().await {
                        Ok(list) => {
                            let members = list.members();
                            let joining = members
                                .iter()
                                .filter(|m| m.name().is_empty() || m.is_learner())
                                .count();
                            seen.most_joining = seen.most_joining.max(joining);
                            seen.most_members = seen.most_members.max(members.len());
                        }
                        Err(_) => client = None,
                    }
                }
                Ok(seen)
            })
        };
        Self {
            stop,
            tasks: vec![reader, endpoints, members],
        }
    }

    async fn stop(self) -> anyhow::Result<Seen> {
        self.stop.cancel();
        let mut all = Seen::default();
        for task in self.tasks {
            let seen = task.await??;
            all.reads_ok += seen.reads_ok;
            all.reads_failed += seen.reads_failed;
            all.reads_wrong += seen.reads_wrong;
            all.endpoint_samples += seen.endpoint_samples;
            all.endpoint_empty += seen.endpoint_empty;
            if seen.endpoint_samples > 0 {
                all.fewest_endpoints = seen.fewest_endpoints;
            }
            all.most_joining = all.most_joining.max(seen.most_joining);
            all.most_members = all.most_members.max(seen.most_members);
        }
        Ok(all)
    }
}

/// The controller pod of the release.
async fn controller_pod(ctx: &TestContext) -> anyhow::Result<Option<Pod>> {
    let pods: Api<Pod> = ctx.api();
    let listed = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=controller"))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .find(|p| p.metadata.deletion_timestamp.is_none()))
}

/// What the controller pod's `/readyz` answers: its status code and body, read from the pod
/// IP as the kubelet's probe reads it (the test shares the pods' network).
async fn readyz(ctx: &TestContext) -> anyhow::Result<String> {
    use http_body_util::BodyExt as _;
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let Some(ip) = controller_pod(ctx).await?.and_then(|p| p.status?.pod_ip) else {
        bail!("no controller pod with an IP yet");
    };
    let client: Client<_, http_body_util::Empty<hyper::body::Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = format!("http://{ip}:8081/readyz").parse()?;
    let answer = tokio::time::timeout(Duration::from_secs(5), async {
        let response = client.get(uri).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok(format!(
            "{} {}",
            status.as_u16(),
            String::from_utf8_lossy(&body)
        ))
    })
    .await;
    match answer {
        Ok(result) => result,
        Err(_) => Ok("no answer within 5 s".into()),
    }
}

/// The tail of the controller pod's log, for failure messages.
fn controller_log(ctx: &TestContext, pod: Option<&Pod>) -> String {
    let Some(pod) = pod else {
        return "(no controller pod)".into();
    };
    let log = ctx
        .kubelet()
        .ok()
        .and_then(|k| k.container_log(ctx.ns(), &pod.name_any()).ok())
        .unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Member pods of this operator (not CoreOS').
async fn our_members(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<Vec<String>> {
    Ok(support::member_pods(pods, cluster)
        .await?
        .into_keys()
        .collect())
}

/// Member pods CoreOS' operator made that are still there.
async fn coreos_pods(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<Vec<Pod>> {
    let selector = format!("etcd_cluster={cluster},etcd_node");
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

async fn take_over(ctx: TestContext, case: Case) -> anyhow::Result<()> {
    // CoreOS' CRD replaces ours only while no other test of the suite runs.
    let _crds = if case.coreos_crd {
        let guard = CRDS.write().await;
        install_coreos_crd(&ctx).await?;
        Guard::Write(guard)
    } else {
        let guard = CRDS.read().await;
        etcd_tests::crds::install_all(&ctx.client(), WAIT).await?;
        Guard::Read(guard)
    };
    let ns = ctx.ns().to_string();
    let access = if case.tls {
        let (ca, operator) = support::tls::coreos_tls_secrets(&ctx, case.cluster).await?;
        Access::tls(
            ca.cert_pem(),
            &operator,
            &format!("member.{}.{ns}.svc", case.cluster),
        )
    } else {
        Access::Plain
    };

    // The cluster as CoreOS' operator left it: the EtcdCluster (applied as the user did), its
    // members, Services and status.
    kubectl(&ctx, &["apply", "-f", "-"], Some(&manifest(&case)?)).await?;
    let clusters: Api<EtcdCluster> = ctx.api();
    let cluster = clusters.get(case.cluster).await?;
    let made = Instant::now();
    let coreos = coreos::make(&ctx, &cluster, 3, &case.version, access.clone()).await?;
    support::duration(
        &format!("{}: CoreOS-made cluster Ready", case.cluster),
        made,
    );
    coreos::write_status(
        &clusters,
        case.cluster,
        &coreos.members,
        &case.version,
        !case.coreos_crd,
    )
    .await?;
    let seeded = seed(&ctx, &coreos).await?;
    let slices: Api<EndpointSlice> = ctx.api();
    let writer = Writer::start_with(slices.clone(), case.cluster, "/written/", access.clone());
    writer.wait_for_writes(20).await?;
    let samplers = Samplers::start(slices.clone(), case.cluster, &access, seeded.clone());

    // The operator, from its chart, watching this namespace.
    OperatorBinaries::locate()?.register(ctx.kubelet()?);
    let watch = format!("controller.watchNamespace={ns}");
    let installed = Instant::now();
    let pods: Api<Pod> = ctx.api();
    if case.coreos_crd {
        // `helm install` keeps CoreOS' CRD (it skips crds/ for an existing CRD): the controller
        // says so in /readyz and touches nothing; the Deployment never gets Ready.
        let args: Vec<String> = [
            "install",
            case.release,
            &chart_dir().display().to_string(),
            "--namespace",
            &ns,
            "--set",
            "bindPodIP=true",
            "--set",
            &watch,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        helm(ctx.control_plane(), HelmMajor::V3, &args).await?;
        let last = std::sync::Mutex::new(String::new());
        let said = poll_until("/readyz to name CoreOS' CRD", WAIT, || async {
            let body = readyz(&ctx).await.unwrap_or_else(|e| e.to_string());
            if let Ok(mut last) = last.lock() {
                last.clone_from(&body);
            }
            anyhow::Ok(body.contains("not this operator's").then_some(body))
        })
        .await;
        let said = match said {
            Ok(said) => said,
            Err(e) => {
                let pod = controller_pod(&ctx).await?;
                let last = last.lock().map(|l| l.clone()).unwrap_or_default();
                bail!(
                    "{e}\nlast /readyz: {last}\ncontroller log:\n{}",
                    controller_log(&ctx, pod.as_ref())
                )
            }
        };
        println!("controller /readyz under CoreOS' CRD: {}", said.trim());
        ensure!(
            said.contains("etcdclusters.etcd.database.coreos.com")
                && said.contains("kubectl apply --server-side --force-conflicts"),
            "{said}"
        );
        ensure!(
            our_members(&pods, case.cluster).await?.is_empty()
                && coreos_pods(&pods, case.cluster).await?.len() == 3,
            "the controller acted under CoreOS' CRD"
        );
        // The documented upgrade: our CRDs applied server-side over CoreOS', objects kept.
        let crds = chart_dir().join("crds-replace");
        let out = kubectl(
            &ctx,
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                &crds.display().to_string(),
            ],
            None,
        )
        .await?;
        println!("{}", out.trim());
        let kept = clusters.get(case.cluster).await?;
        ensure!(
            kept.spec.size == Some(3) && kept.spec.version.as_deref() == Some("3.2.13"),
            "the stored EtcdCluster changed: {:?}",
            kept.spec
        );
        poll_until("/readyz once the CRD is ours", WAIT, || async {
            anyhow::Ok(
                readyz(&ctx)
                    .await
                    .unwrap_or_default()
                    .starts_with("200 ")
                    .then_some(()),
            )
        })
        .await?;
    } else {
        Release::new(case.release, &ns)
            .install(ctx.control_plane(), &[watch.as_str()])
            .await?;
    }
    support::duration(&format!("{}: operator installed", case.cluster), installed);

    if case.paused_first {
        // Paused: the operator reports, adopts nothing.
        wait_until(&clusters, case.cluster, "Paused", |c| {
            c.status.as_ref().is_some_and(|s| {
                s.phase == Some(ClusterPhase::Paused)
                    && s.observed_generation == c.metadata.generation
                    && s.coreos_members.len() == 3
            })
        })
        .await?;
        ensure!(
            our_members(&pods, case.cluster).await?.is_empty(),
            "members added while paused"
        );
        clusters
            .patch(
                case.cluster,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"paused": false}})),
            )
            .await?;
    }
    let adopting = Instant::now();

    if case.faults {
        // The controller restarts once the first member of its own runs...
        poll_until("a member of the operator's", ADOPTION, || async {
            anyhow::Ok((!our_members(&pods, case.cluster).await?.is_empty()).then_some(()))
        })
        .await?;
        let old = controller_pod(&ctx).await?.context("no controller pod")?;
        pods.delete(&old.name_any(), &DeleteParams::default())
            .await?;
        println!("deleted controller pod {}", old.name_any());
        // ... and goes on from there; then a CoreOS member's etcd dies (restartPolicy Never:
        // its pod fails, its data gone with it).
        poll_until("a second member of the operator's", ADOPTION, || async {
            anyhow::Ok((our_members(&pods, case.cluster).await?.len() >= 2).then_some(()))
        })
        .await?;
        let victim = coreos_pods(&pods, case.cluster)
            .await?
            .into_iter()
            .map(|p| p.name_any())
            .next()
            .context("no CoreOS member left to lose")?;
        ctx.kubelet()?.kill_container(&ns, &victim)?;
        println!("killed CoreOS member {victim}");
    }

    let done = wait_until_adopted(&clusters, case.cluster, &pods).await?;
    let took = adopting.elapsed();
    support::duration(&format!("{}: adopted", case.cluster), adopting);
    let seen = samplers.stop().await?;
    let report = writer.stop().await?;

    // Nothing lost: every seeded key and every acknowledged write is there (read through the
    // Service again until a read answers: its endpoints may still name a pod just deleted).
    let read = |prefix: &'static str| {
        let (slices, access) = (slices.clone(), access.clone());
        async move {
            poll_until(
                &format!("a read of {prefix} through the Service"),
                WAIT,
                || {
                    let (slices, access) = (slices.clone(), access.clone());
                    async move {
                        let urls = client_service_urls_with(&slices, case.cluster, &access).await?;
                        let Ok(mut client) = connect_with(&urls, &access).await else {
                            return anyhow::Ok(None);
                        };
                        let Ok(got) = client
                            .get(prefix, Some(GetOptions::new().with_prefix()))
                            .await
                        else {
                            return Ok(None);
                        };
                        Ok(Some(
                            got.kvs()
                                .iter()
                                .map(|kv| {
                                    (
                                        kv.key_str().unwrap_or_default().to_string(),
                                        kv.value_str().unwrap_or_default().to_string(),
                                    )
                                })
                                .collect::<BTreeMap<String, String>>(),
                        ))
                    }
                },
            )
            .await
        }
    };
    ensure!(read("/seed/").await? == seeded, "seeded keys differ");
    let written = read("/written/").await?;
    let lost: Vec<&String> = report
        .acked
        .iter()
        .filter(|(k, v)| written.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    ensure!(
        lost.is_empty(),
        "{} acknowledged writes lost: {lost:?}",
        lost.len()
    );
    println!(
        "figures: {}: adopted in {:.1} s; writes {} acknowledged, {} failed; reads of all {SEEDED} seeded keys through the Service {} ok, {} failed, {} wrong; client Service ready endpoints: {} samples, fewest {}, {} empty; most members {}, most joining at once {}",
        case.cluster,
        took.as_secs_f64(),
        report.acked.len(),
        report.failed,
        seen.reads_ok,
        seen.reads_failed,
        seen.reads_wrong,
        seen.endpoint_samples,
        seen.fewest_endpoints,
        seen.endpoint_empty,
        seen.most_members,
        seen.most_joining,
    );
    ensure!(seen.reads_wrong == 0, "reads answered with other data");
    ensure!(
        seen.reads_ok > 0 && seen.endpoint_samples > 0,
        "the samplers saw nothing"
    );
    ensure!(
        seen.endpoint_empty == 0,
        "the client Service had no ready endpoint in {} of {} samples",
        seen.endpoint_empty,
        seen.endpoint_samples
    );
    ensure!(
        seen.most_joining <= 1,
        "{} members joined at once",
        seen.most_joining
    );

    // Reported: the adoption's start and end, each CoreOS member's removal.
    ensure!(event_count(&ctx, "AdoptingCoreOSMembers").await? == 1);
    ensure!(event_count(&ctx, "CoreOSMembersAdopted").await? == 1);
    let removed = event_count(&ctx, "CoreOSMemberRemoved").await?;
    let replaced = event_count(&ctx, "MemberReplaced").await?;
    ensure!(
        removed + replaced == 3 && (case.faults || replaced == 0),
        "{removed} CoreOS members removed, {replaced} replaced"
    );
    // The Services select the operator's members by its own labels now.
    let services: Api<Service> = ctx.api();
    for name in [
        case.cluster.to_string(),
        names::client_service_name(case.cluster),
    ] {
        let selector = services
            .get(&name)
            .await?
            .spec
            .and_then(|s| s.selector)
            .unwrap_or_default();
        ensure!(
            selector.get(names::LABEL_COMPONENT).map(String::as_str) == Some("member"),
            "{name} selects {selector:?}"
        );
    }
    if case.version.starts_with("3.4") {
        // The CoreOS leader, last, handed leadership to a member of the operator's.
        ensure!(event_count(&ctx, "LeadershipTransferred").await? >= 1);
    }
    ensure!(done.status.as_ref().and_then(|s| s.ready_members) == Some(3));
    Ok(())
}

/// Waits until the cluster runs on the operator's members alone, at its size: `Running`, no
/// CoreOS member listed or left, every member pod the operator's.
async fn wait_until_adopted(
    clusters: &Api<EtcdCluster>,
    cluster: &str,
    pods: &Api<Pod>,
) -> anyhow::Result<EtcdCluster> {
    let done = poll_until(
        "the cluster running on the operator's members",
        ADOPTION,
        || async {
            let c = clusters.get(cluster).await?;
            let settled = c.status.as_ref().is_some_and(|s| {
                s.phase == Some(ClusterPhase::Running)
                    && s.coreos_members.is_empty()
                    && s.ready_members == Some(3)
                    && s.observed_generation == c.metadata.generation
            });
            let coreos_left = coreos_pods(pods, cluster).await?.len();
            let ours = our_members(pods, cluster).await?.len();
            anyhow::Ok((settled && coreos_left == 0 && ours == 3).then_some(c))
        },
    )
    .await;
    match done {
        Ok(c) => Ok(c),
        Err(e) => {
            let status = clusters
                .get(cluster)
                .await
                .ok()
                .and_then(|c| c.status)
                .map(|s| format!("{s:?}"))
                .unwrap_or_default();
            bail!("{e}; last status: {status}")
        }
    }
}

/// Writes [`SEEDED`] keys through the members.
async fn seed(
    ctx: &TestContext,
    coreos: &CoreosCluster,
) -> anyhow::Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = ctx.api();
    let mut client = connect_with(&coreos.endpoints(&pods).await?, &coreos.access).await?;
    let mut seeded = BTreeMap::new();
    for i in 0..SEEDED {
        let (key, value) = (format!("/seed/{i:04}"), format!("coreos-{i}"));
        client.put(key.clone(), value.clone(), None).await?;
        seeded.insert(key, value);
    }
    Ok(seeded)
}

/// Holds the suite's CRD lock for a test (released when dropped).
#[allow(dead_code, reason = "held for its Drop")]
enum Guard<'a> {
    Read(tokio::sync::RwLockReadGuard<'a, ()>),
    Write(tokio::sync::RwLockWriteGuard<'a, ()>),
}

/// Issue 28, "done when" and item 6: the users' example (etcd 3.2.13) as CoreOS' operator
/// ran it, under CoreOS' own CRD: the helm-installed controller says in /readyz that the CRD
/// is not its own and touches nothing; once the chart's CRDs are applied server-side over it
/// (the stored object kept), the cluster is adopted with no acknowledged write lost, every key
/// readable and the client Service never empty.
async fn a_3_2_cluster_under_coreos_crd_is_adopted_without_downtime(
    ctx: TestContext,
) -> anyhow::Result<()> {
    take_over(
        ctx,
        Case {
            release: "takeover-crd",
            cluster: "example-etcd-cluster",
            version: "3.2.13".into(),
            tls: false,
            coreos_crd: true,
            paused_first: false,
            faults: false,
        },
    )
    .await
}

/// The same with CoreOS-layout TLS (peer, server and operator Secrets of one CA): the
/// operator reads the member list through CoreOS' members with the operator Secret.
async fn a_3_2_cluster_with_coreos_tls_is_adopted(ctx: TestContext) -> anyhow::Result<()> {
    take_over(
        ctx,
        Case {
            release: "takeover-tls",
            cluster: "secure",
            version: "3.2.13".into(),
            tls: true,
            coreos_crd: false,
            paused_first: false,
            faults: false,
        },
    )
    .await
}

/// A 3.3 cluster: the controller is restarted once its first member runs, and a CoreOS
/// member's etcd dies after its second (its pod fails for good, restartPolicy Never): the
/// adoption goes on from where it stopped and the lost member is replaced.
async fn a_3_3_cluster_is_adopted_through_a_controller_restart_and_a_member_lost(
    ctx: TestContext,
) -> anyhow::Result<()> {
    take_over(
        ctx,
        Case {
            release: "takeover-faults",
            cluster: "faulty",
            version: support::pinned_etcd("3.3")?,
            tls: false,
            coreos_crd: false,
            paused_first: false,
            faults: true,
        },
    )
    .await
}

/// A 3.4 cluster created paused: nothing is adopted while `spec.paused` is set; unpaused,
/// the operator's members join as learners, promoted one at a time, and the CoreOS leader
/// hands leadership over before it leaves.
async fn a_paused_3_4_cluster_is_left_alone_then_adopted_with_learners(
    ctx: TestContext,
) -> anyhow::Result<()> {
    take_over(
        ctx,
        Case {
            release: "takeover-paused",
            cluster: "learners",
            version: support::pinned_etcd("3.4")?,
            tls: false,
            coreos_crd: false,
            paused_first: true,
            faults: false,
        },
    )
    .await
}
