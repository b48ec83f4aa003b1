//! A real Prometheus watching what the chart installs (issue 17): the operator installed by
//! `helm install` with its ServiceMonitors, PodMonitor, PrometheusRule and dashboard on, its
//! pods and two EtcdClusters' members run by the process kubelet (the chart's controller and
//! webhook from the binaries built in this workspace), and Prometheus 3 (built from the Go
//! module proxy) configured from the objects the chart created, as the Prometheus Operator
//! renders them: `kubernetes_sd_configs` against the local API server and each monitor's
//! relabelling. A wrong Service label, port name or pod label in the chart leaves a target
//! out and fails the test.
//!
//! Run: `cargo test -p etcd-tests --test prometheus` (needs `hack/build-tools.sh`, which
//! builds prometheus and promtool, and the operator binaries:
//! `cargo build -p etcd-controller -p etcd-webhook`).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::runtime::conditions;
use kube::{Api, ResourceExt};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use etcd_shared::EtcdCluster;
use etcd_tests::namespace::Namespace;
use etcd_tests::operator::{
    OperatorBinaries, Release, control_plane_options, is_settled, kubectl_apply,
};
use etcd_tests::prometheus::dashboard::{
    label_values, panel_queries, substitute, variable_queries,
};
use etcd_tests::prometheus::monitors::{self, ServiceDiscoveryRole};
use etcd_tests::prometheus::{Prometheus, PrometheusClient, PrometheusConfig, Promtool, Target};
use etcd_tests::suite::{Suite, TestContext};
use etcd_tests::{KubeletOptions, await_condition, poll_until};

const WAIT: Duration = Duration::from_secs(150);
const RELEASE: &str = "op";
/// The 3-member cluster on the default etcd line.
const CLUSTER: &str = "example";
/// A 1-member cluster on etcd 3.2, whose metrics are on its client port.
const OLD_CLUSTER: &str = "old";
const OLD_VERSION: &str = "3.2.13";
/// The scrape interval the test sets on the chart's monitors.
const SCRAPE: &str = "2s";
/// EtcdMemberDown's `for:` in the test's copy of the rules (the chart's is 3m).
const MEMBER_DOWN_FOR: &str = "10s";

fn main() -> ExitCode {
    Suite::new()
        .options(control_plane_options())
        .with_kubelet(KubeletOptions::default())
        .test_timeout(Duration::from_secs(600))
        .run(etcd_tests::tests![
            prometheus_scrapes_the_operator_and_every_member
        ])
}

fn duration(what: &str, since: Instant) {
    println!("duration: {what}: {:.1} s", since.elapsed().as_secs_f64());
}

fn cluster_yaml(name: &str, size: i32, version: Option<&str>) -> String {
    let version = version.map_or(String::new(), |v| format!("  version: \"{v}\"\n"));
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n  size: {size}\n{version}"
    )
}

/// The Prometheus Operator's CRDs (minimal, see `monitors::crds`), Established.
async fn install_monitoring_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in monitors::crds() {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("etcd-tests").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("applying CRD {name}"))?;
        await_condition(api.clone(), &name, conditions::is_crd_established(), WAIT).await?;
    }
    Ok(())
}

/// Every object of `kind` (monitoring.coreos.com/v1) in `namespace`, as JSON with its kind.
async fn monitoring_objects(
    client: &kube::Client,
    namespace: &str,
    kind: &str,
) -> anyhow::Result<Vec<Value>> {
    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    let mut out = Vec::new();
    for object in api.list(&ListParams::default()).await?.items {
        let mut value = serde_json::to_value(&object)?;
        value["kind"] = Value::from(kind);
        out.push(value);
    }
    Ok(out)
}

/// The rule files of the PrometheusRules in `objects`, with EtcdMemberDown's `for:` set to
/// [`MEMBER_DOWN_FOR`] so the end-to-end alert fires within the test; every other rule as
/// the chart has it.
fn rule_files(objects: &[Value]) -> anyhow::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for object in objects {
        let mut object = object.clone();
        let mut shortened = 0;
        for group in object["spec"]["groups"]
            .as_array_mut()
            .into_iter()
            .flatten()
        {
            for rule in group["rules"].as_array_mut().into_iter().flatten() {
                if rule["alert"] == "EtcdMemberDown" {
                    rule["for"] = Value::from(MEMBER_DOWN_FOR);
                    shortened += 1;
                }
            }
        }
        ensure!(shortened == 1, "EtcdMemberDown found {shortened} times");
        let (name, text) = monitors::rule_file(&object)?;
        files.insert(name, text);
    }
    Ok(files)
}

/// The pods of `cluster` in `namespace`, by name.
async fn member_pods(
    client: &kube::Client,
    namespace: &str,
    cluster: &str,
) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let selector =
        format!("app.kubernetes.io/instance={cluster},app.kubernetes.io/component=member");
    Ok(api
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

fn describe(targets: &[Target]) -> String {
    targets
        .iter()
        .map(|t| {
            format!(
                "{} {} {} {:?} {}",
                t.scrape_pool, t.scrape_url, t.health, t.labels, t.last_error
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Issue 17, items 1-5 on a real Prometheus: every target of the chart's monitors up with
/// the labels the alerts and the dashboard select on, the members' series labelled with
/// their cluster and namespace, both operator `/metrics` clean under `promtool check
/// metrics`, every alert rule loaded and healthy, every dashboard query answered, and a
/// stopped member raising EtcdMemberDown, pending then firing, resolved once it runs again.
async fn prometheus_scrapes_the_operator_and_every_member(ctx: TestContext) -> anyhow::Result<()> {
    let binaries = OperatorBinaries::locate()?;
    binaries.register(ctx.kubelet()?);
    let cp = ctx.control_plane();
    let client = ctx.client();
    let operator_ns = ctx.ns().to_string();
    // The clusters live in a namespace of their own: their series must name it, not the
    // operator's (the controller's ServiceMonitor honours its series' labels).
    let apps = Namespace::create(client.clone(), "apps").await?;
    apps.wait_for_default_service_account(WAIT).await?;
    let apps_ns = apps.name().to_string();

    install_monitoring_crds(&client).await?;
    let started = Instant::now();
    let interval = format!("metrics.serviceMonitor.interval={SCRAPE}");
    let pod_interval = format!("metrics.podMonitor.interval={SCRAPE}");
    Release::new(RELEASE, &operator_ns)
        .install(
            cp,
            &[
                "metrics.serviceMonitor.enabled=true",
                &interval,
                "metrics.podMonitor.enabled=true",
                &pod_interval,
                "metrics.prometheusRule.enabled=true",
                "metrics.grafanaDashboard.enabled=true",
            ],
        )
        .await?;
    duration("helm install --wait, monitors on", started);

    let applied = Instant::now();
    for (name, size, version) in [(CLUSTER, 3, None), (OLD_CLUSTER, 1, Some(OLD_VERSION))] {
        let mut kubectl = ctx.kubectl();
        kubectl.args(["-n", &apps_ns]);
        let out = kubectl_apply(kubectl, &cluster_yaml(name, size, version)).await?;
        ensure!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let clusters: Api<EtcdCluster> = Api::namespaced(client.clone(), &apps_ns);
    for name in [CLUSTER, OLD_CLUSTER] {
        await_condition(
            clusters.clone(),
            name,
            |c: Option<&EtcdCluster>| c.is_some_and(is_settled),
            WAIT,
        )
        .await?;
    }
    duration("both clusters Available and Running", applied);

    // Prometheus configured from what the chart created, as the Prometheus Operator would.
    let mut objects = monitoring_objects(&client, &operator_ns, "ServiceMonitor").await?;
    objects.extend(monitoring_objects(&client, &operator_ns, "PodMonitor").await?);
    ensure!(
        objects.len() == 3,
        "expected 2 ServiceMonitors and 1 PodMonitor: {objects:#?}"
    );
    let rules = monitoring_objects(&client, &operator_ns, "PrometheusRule").await?;
    ensure!(
        rules.len() == 1,
        "expected 1 PrometheusRule, found {}",
        rules.len()
    );
    let config = PrometheusConfig {
        scrape_configs: monitors::jobs_of(
            &objects,
            ServiceDiscoveryRole::EndpointSlice,
            cp.kubeconfig_path(),
        )?,
        rule_files: rule_files(&rules)?,
        ..PrometheusConfig::default()
    };
    let prometheus_started = Instant::now();
    let prometheus = Prometheus::start(cp.tools(), &config).await?;
    duration("prometheus ready", prometheus_started);
    println!(
        "prometheus at {}, config {}",
        prometheus.url(),
        prometheus.config_path().display()
    );

    // Every target up: 3 + 1 members, 1 controller, 2 webhook replicas.
    let example_pods: BTreeSet<String> = member_pods(&client, &apps_ns, CLUSTER)
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    let old_pods: BTreeSet<String> = member_pods(&client, &apps_ns, OLD_CLUSTER)
        .await?
        .iter()
        .map(|p| p.name_any())
        .collect();
    ensure!(
        example_pods.len() == 3 && old_pods.len() == 1,
        "{example_pods:?} {old_pods:?}"
    );
    let discovering = Instant::now();
    let targets = poll_until("7 targets up", WAIT, || {
        let prometheus = &prometheus;
        async move {
            let targets = prometheus.targets().await?;
            let up = targets.iter().filter(|t| t.health == "up").count();
            anyhow::Ok((targets.len() == 7 && up == 7).then_some(targets))
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\nlog:\n{}", prometheus.log_tail(20)))?;
    duration("every target discovered and scraped", discovering);
    println!("targets:\n{}", describe(&targets));
    let mut by_job: BTreeMap<&str, Vec<&Target>> = BTreeMap::new();
    for t in &targets {
        by_job.entry(t.labels["job"].as_str()).or_default().push(t);
    }
    let members = &by_job.get("etcd").map(Vec::as_slice).unwrap_or_default();
    ensure!(
        members.len() == 4,
        "member targets:\n{}",
        describe(&targets)
    );
    for t in members.iter() {
        let pod = t.labels.get("pod").map(String::as_str).unwrap_or_default();
        let (cluster, endpoint, port) = if old_pods.contains(pod) {
            (OLD_CLUSTER, "client", ":2379/")
        } else if example_pods.contains(pod) {
            (CLUSTER, "metrics", ":2381/")
        } else {
            bail!("a member target of no cluster: {t:?}");
        };
        ensure!(
            t.labels.get("namespace") == Some(&apps_ns)
                && t.labels.get("etcd_cluster").map(String::as_str) == Some(cluster)
                && t.labels.get("endpoint").map(String::as_str) == Some(endpoint)
                && t.labels.get("container").map(String::as_str) == Some("etcd")
                && t.scrape_url.contains(port),
            "member target {t:?}"
        );
    }
    for (job, replicas) in [
        ("etcd-operator-controller", 1),
        ("etcd-operator-webhook", 2),
    ] {
        let found = by_job.get(job).map(Vec::as_slice).unwrap_or_default();
        ensure!(
            found.len() == replicas
                && found.iter().all(|t| {
                    t.labels.get("namespace") == Some(&operator_ns)
                        && t.labels.get("endpoint").map(String::as_str) == Some("metrics")
                        && t.labels
                            .get("service")
                            .is_some_and(|s| s.ends_with("-metrics"))
                }),
            "{job} targets:\n{}",
            describe(&targets)
        );
    }

    // The members' own series, one per member, labelled with cluster and namespace.
    for metric in [
        "etcd_server_has_leader",
        "etcd_mvcc_db_total_size_in_bytes",
        "etcd_server_quota_backend_bytes",
    ] {
        let expr = format!(
            "{metric}{{job=\"etcd\", namespace=\"{apps_ns}\", etcd_cluster=\"{CLUSTER}\"}}"
        );
        let samples = prometheus.query(&expr).await?;
        let pods: BTreeSet<String> = samples.iter().map(|s| s.label("pod").to_string()).collect();
        ensure!(pods == example_pods, "{expr}: {samples:?}");
        ensure!(samples.iter().all(|s| s.value > 0.0), "{expr}: {samples:?}");
        println!(
            "{metric}: {}",
            samples
                .iter()
                .map(|s| format!("{}={}", s.label("pod"), s.value))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    let old = prometheus
        .query(&format!(
            "etcd_server_has_leader{{etcd_cluster=\"{OLD_CLUSTER}\", namespace=\"{apps_ns}\"}} == 1"
        ))
        .await?;
    ensure!(
        old.len() == 1,
        "etcd {OLD_VERSION}'s has_leader from its client port: {old:?}"
    );
    // The operator's jobs, and the controller's per-cluster series under the cluster's
    // namespace (honorLabels).
    for (expr, want) in [
        ("up{job=\"etcd-operator-controller\"} == 1".to_string(), 1),
        ("up{job=\"etcd-operator-webhook\"} == 1".to_string(), 2),
        (
            format!(
                "etcd_controller_ready_members{{job=\"etcd-operator-controller\", namespace=\"{apps_ns}\", cluster=\"{CLUSTER}\"}} == 3"
            ),
            1,
        ),
    ] {
        let samples = prometheus.query(&expr).await?;
        ensure!(samples.len() == want, "{expr}: {samples:?}");
    }

    // promtool check metrics on what the operator's pods serve.
    let promtool = Promtool::new(cp.tools())?;
    for t in by_job["etcd-operator-controller"]
        .iter()
        .chain(&by_job["etcd-operator-webhook"])
    {
        let (base, path) = t
            .scrape_url
            .split_once("/metrics")
            .map(|(b, _)| (b.to_string(), "/metrics"))
            .context("scrape URL")?;
        let (status, text) = PrometheusClient::new(base)
            .request(http::Method::GET, path, None)
            .await?;
        ensure!(status.is_success(), "{}: {status}", t.scrape_url);
        let problems = promtool.check_metrics(&text).await?;
        ensure!(
            problems.is_empty(),
            "promtool check metrics {}:\n{}",
            t.scrape_url,
            problems.join("\n")
        );
        println!(
            "promtool check metrics {}: clean ({} lines)",
            t.scrape_url,
            text.lines().count()
        );
    }

    // Every alert of the chart loaded and evaluated without error; none active.
    let chart_alerts: BTreeSet<String> = rules[0]["spec"]["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    let loaded = poll_until("every rule evaluated", WAIT, || {
        let prometheus = &prometheus;
        async move {
            let groups = prometheus.rules().await?;
            let rules: Vec<_> = groups.into_iter().flat_map(|g| g.rules).collect();
            anyhow::Ok(rules.iter().all(|r| r.health == "ok").then_some(rules))
        }
    })
    .await?;
    let names: BTreeSet<String> = loaded.iter().map(|r| r.name.clone()).collect();
    ensure!(
        names == chart_alerts,
        "loaded {names:?}, chart has {chart_alerts:?}"
    );
    let active = prometheus.alerts().await?;
    ensure!(
        active.is_empty(),
        "alerts active on a healthy installation: {active:?}"
    );
    println!("{} alert rules loaded and healthy: {names:?}", names.len());

    // The dashboard the chart ships: every query parses and answers with a series.
    let dashboards: Api<ConfigMap> = Api::namespaced(client.clone(), &operator_ns);
    let dashboard = dashboards
        .list(&ListParams::default().labels("grafana_dashboard=1"))
        .await?
        .items
        .into_iter()
        .next()
        .context("no ConfigMap labelled grafana_dashboard=1")?;
    let json = dashboard
        .data
        .as_ref()
        .and_then(|d| d.values().next())
        .context("the dashboard ConfigMap is empty")?;
    let dashboard: Value = serde_json::from_str(json)?;
    let values = [
        ("namespace", apps_ns.as_str()),
        ("cluster", CLUSTER),
        ("__rate_interval", "1m"),
        ("__interval", "30s"),
        ("__range", "1h"),
    ];
    let queries = panel_queries(&dashboard);
    let answering = Instant::now();
    for q in &queries {
        let expr = substitute(&q.expr, &values);
        promtool
            .parse_promql(&expr)
            .await
            .with_context(|| format!("panel {}", q.panel))?;
        poll_until(
            &format!("panel {} ({}): {expr}", q.panel, q.ref_id),
            WAIT,
            || {
                let (prometheus, expr) = (&prometheus, &expr);
                async move {
                    let samples = prometheus.query(expr).await?;
                    anyhow::Ok((!samples.is_empty()).then_some(()))
                }
            },
        )
        .await?;
    }
    for (name, query) in variable_queries(&dashboard) {
        let (selector, label) = label_values(&query).context("a label_values variable")?;
        let samples = prometheus.query(&substitute(&selector, &values)).await?;
        let found: BTreeSet<&str> = samples.iter().map(|s| s.label(&label)).collect();
        let want = if name == "namespace" {
            apps_ns.as_str()
        } else {
            CLUSTER
        };
        ensure!(found.contains(want), "variable {name}: {found:?}");
    }
    duration(
        &format!("{} dashboard queries answered with series", queries.len()),
        answering,
    );

    // A stopped member (SIGSTOP: alive but unresponsive, so the kubelet does not restart
    // it): EtcdMemberDown pending, then firing after its `for:`, resolved once it runs again.
    let followers = prometheus
        .query(&format!(
            "etcd_server_is_leader{{namespace=\"{apps_ns}\", etcd_cluster=\"{CLUSTER}\"}} == 0"
        ))
        .await?;
    let victim = followers
        .first()
        .map(|s| s.label("pod").to_string())
        .context("no follower")?;
    let pid = ctx
        .kubelet()?
        .container_pid(&apps_ns, &victim)
        .context("the member's process")?;
    let pid = Pid::from_raw(i32::try_from(pid)?);
    let stopped = Instant::now();
    kill(pid, Signal::SIGSTOP)?;
    let outcome = async {
        let pending_after = std::sync::Mutex::new(None);
        let firing_after = poll_until("EtcdMemberDown firing", WAIT, || {
            let (prometheus, victim, pending_after) = (&prometheus, &victim, &pending_after);
            async move {
                let alerts = prometheus.alerts().await?;
                let state = alerts
                    .iter()
                    .find(|a| a.name() == "EtcdMemberDown" && a.labels.get("pod") == Some(victim))
                    .map(|a| a.state.clone());
                match state.as_deref() {
                    Some("pending") => {
                        let mut first = pending_after.lock().map_err(|e| anyhow::anyhow!("{e}"))?;
                        first.get_or_insert(stopped.elapsed());
                        anyhow::Ok(None)
                    }
                    Some("firing") => anyhow::Ok(Some((stopped.elapsed(), alerts))),
                    _ => anyhow::Ok(None),
                }
            }
        })
        .await?;
        let pending_after = pending_after
            .into_inner()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        anyhow::Ok((pending_after, firing_after))
    }
    .await;
    kill(pid, Signal::SIGCONT)?;
    let (pending_after, (firing_after, alerts)) = outcome?;
    let pending_after = pending_after.context("EtcdMemberDown was never seen pending")?;
    println!(
        "EtcdMemberDown for {victim}: pending {:.1} s and firing {:.1} s after SIGSTOP (for: {MEMBER_DOWN_FOR}, scrape every {SCRAPE}, rules every 1 s)",
        pending_after.as_secs_f64(),
        firing_after.as_secs_f64()
    );
    let fired = alerts
        .iter()
        .find(|a| a.name() == "EtcdMemberDown")
        .context("the alert")?;
    // Firing no sooner than its `for:` after it became active (pending), by Prometheus' clock.
    let active_at: k8s_openapi::jiff::Timestamp =
        fired.active_at.as_deref().context("activeAt")?.parse()?;
    let active_for = k8s_openapi::jiff::Timestamp::now().duration_since(active_at);
    ensure!(
        active_for >= k8s_openapi::jiff::SignedDuration::from_secs(10),
        "firing {active_for:?} after it became active, less than its for: {MEMBER_DOWN_FOR}"
    );
    ensure!(
        fired.labels.get("etcd_cluster").map(String::as_str) == Some(CLUSTER)
            && fired.labels.get("namespace") == Some(&apps_ns)
            && fired.labels.get("severity").map(String::as_str) == Some("warning")
            && fired
                .annotations
                .get("summary")
                .is_some_and(|s| s == &format!("etcd member {apps_ns}/{victim} is down")),
        "{fired:?}"
    );
    let quorum = alerts
        .iter()
        .find(|a| a.name() == "EtcdClusterQuorumAtRisk")
        .map(|a| a.state.clone());
    println!("EtcdClusterQuorumAtRisk (for: 2m, as the chart has it): {quorum:?}");
    ensure!(
        quorum.is_some(),
        "one of three members down puts the quorum at risk: {alerts:?}"
    );
    let resumed = Instant::now();
    poll_until("EtcdMemberDown resolved", WAIT, || {
        let (prometheus, victim) = (&prometheus, &victim);
        async move {
            let alerts = prometheus.alerts().await?;
            anyhow::Ok(
                (!alerts
                    .iter()
                    .any(|a| a.name() == "EtcdMemberDown" && a.labels.get("pod") == Some(victim)))
                .then_some(()),
            )
        }
    })
    .await?;
    duration("EtcdMemberDown resolved after SIGCONT", resumed);

    apps.delete().await?;
    Ok(())
}
