//! Recorded client traffic around one operator action, for the robustness suite (issue 33,
//! items 4 and 6): clients through the cluster's client Service and on its members' pod IPs,
//! two long watches, the history checked by `etcd_lincheck` when the action is over, the
//! members' stores compared, and a row added to `robustness.md` among the recorder's
//! artifacts. Also the node chores of a multi-node suite: every node healthy before a test,
//! a cordon, a drain's evictions.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{EvictParams, ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt as _};
use tokio::task::JoinHandle;

use etcd_shared::names;
use etcd_tests::poll_until;
use etcd_tests::recorder::{self, ClientSpec, Recorder, RecorderOptions, Report};
use etcd_tests::suite::TestContext;

use crate::support::{WAIT, client_service_urls, duration, member_list};

/// The variable that asks for the heavier forms of the suite (`full`).
pub const MODE_VARIABLE: &str = "ETCD_TESTS_ROBUSTNESS";

/// Whether `ETCD_TESTS_ROBUSTNESS=full` asks for the heavier forms (the whole upgrade
/// matrix, the recorder's full rate).
pub fn full() -> bool {
    std::env::var(MODE_VARIABLE).is_ok_and(|v| v == "full")
}

/// Operations per second over every client: 60 in CI (two cores shared with other runs), the
/// recorder's default 100 in the full run.
pub fn rate() -> f64 {
    if full() { 100.0 } else { 60.0 }
}

/// How often the endpoint feeds look again.
const FEED_INTERVAL: Duration = Duration::from_millis(500);

/// The pods of cluster `name`: the operator's members (by its instance label) and CoreOS'
/// (`etcd_cluster`), by name.
pub async fn cluster_pods(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<Vec<Pod>> {
    let mut found = Vec::new();
    let mut seen = BTreeSet::new();
    for selector in [
        format!("{}={cluster}", names::LABEL_INSTANCE),
        format!("etcd_cluster={cluster},etcd_node"),
    ] {
        for pod in pods
            .list(&ListParams::default().labels(&selector))
            .await?
            .items
        {
            if seen.insert(pod.name_any()) {
                found.push(pod);
            }
        }
    }
    found.sort_by_key(|p| p.name_any());
    Ok(found)
}

/// Whether `pod` has an IP and has not ended (Terminating pods count: their etcd may serve).
fn runs(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    let ended = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|p| p == "Succeeded" || p == "Failed");
    !ended && status.and_then(|s| s.pod_ip.as_ref()).is_some()
}

/// The client URL of a pod by its IP.
fn pod_url(pod: &Pod) -> Option<String> {
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?;
    Some(format!("http://{ip}:{}", names::CLIENT_PORT))
}

/// The client URLs of every pod of `cluster` that runs: what a client configured with the
/// members' addresses reaches.
pub async fn running_pod_urls(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<Vec<String>> {
    Ok(cluster_pods(pods, cluster)
        .await?
        .iter()
        .filter(|p| runs(p))
        .filter_map(pod_url)
        .collect())
}

/// The client URLs of every Ready pod of `cluster` not being deleted: what a client that
/// follows the members' ready addresses (a headless Service's DNS, say) reaches.
pub async fn ready_pod_urls(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<Vec<String>> {
    Ok(cluster_pods(pods, cluster)
        .await?
        .iter()
        .filter(|p| runs(p) && p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(pod_url)
        .collect())
}

/// The client URLs of the cluster's `size` members as etcd lists them: the pods not being
/// deleted whose name is in the member list (asked of each such pod until one answers).
/// Waits until there are exactly `size`.
pub async fn current_member_urls(
    pods: &Api<Pod>,
    cluster: &str,
    size: usize,
) -> anyhow::Result<Vec<String>> {
    let found = poll_until(
        &format!("the {size} members of {cluster}"),
        WAIT,
        || async {
            let live: Vec<(String, String)> = cluster_pods(pods, cluster)
                .await?
                .iter()
                .filter(|p| runs(p) && p.metadata.deletion_timestamp.is_none())
                .filter_map(|p| Some((p.name_any(), pod_url(p)?)))
                .collect();
            for (_, url) in &live {
                let Ok(list) = member_list(url).await else {
                    continue;
                };
                let listed: BTreeSet<&str> = list
                    .values()
                    .filter(|(_, learner)| !learner)
                    .map(|(name, _)| name.as_str())
                    .collect();
                let urls: Vec<String> = live
                    .iter()
                    .filter(|(name, _)| listed.contains(name.as_str()))
                    .map(|(_, url)| url.clone())
                    .collect();
                if list.len() == size && urls.len() == size {
                    return anyhow::Ok(Some(urls));
                }
            }
            Ok(None)
        },
    )
    .await?;
    Ok(found)
}

/// A recording in progress around an action on one cluster.
pub struct Recording {
    recorder: Recorder,
    feeds: Vec<JoinHandle<()>>,
    name: String,
    tls: bool,
    by_pod: bool,
}

/// Each `http://IP:PORT` URL of a member pod of `cluster` as `https://` when that pod serves
/// clients with TLS (its etcd flags say so), as it is otherwise.
async fn schemes_by_pod(
    pods: &Api<Pod>,
    cluster: &str,
    urls: Vec<String>,
) -> anyhow::Result<Vec<String>> {
    let tls_ips: BTreeSet<String> = cluster_pods(pods, cluster)
        .await?
        .iter()
        .filter(|p| serves_tls(p))
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    Ok(urls
        .into_iter()
        .map(|u| {
            let host = u
                .strip_prefix("http://")
                .and_then(|rest| rest.rsplit_once(':'))
                .map(|(host, _)| host.to_string());
            match host {
                Some(ip) if tls_ips.contains(&ip) => u.replacen("http://", "https://", 1),
                _ => u,
            }
        })
        .collect())
}

/// Whether a member pod's etcd serves clients with TLS (by its flags).
fn serves_tls(pod: &Pod) -> bool {
    etcd_controller::view::transport::MemberTransport::of_pod(pod).is_some_and(|t| t.serves_tls())
}

/// `http://` URLs as `https://` ones, for a cluster whose members serve clients over TLS.
fn secure(urls: Vec<String>, tls: bool) -> Vec<String> {
    if !tls {
        return urls;
    }
    urls.into_iter()
        .map(|u| u.replacen("http://", "https://", 1))
        .collect()
}

impl Recording {
    /// Starts run `name` on `cluster`: clients round-robin and sticky over the client
    /// Service's ready endpoints, round-robin and sticky over the pod IPs of its running
    /// members (both lists followed every 0.5 s), one client pinned to each member's pod IP
    /// of now, one long watch through the Service and one on a member; then waits for a few
    /// acknowledged writes, so the action starts under traffic.
    pub async fn start(ctx: &TestContext, cluster: &str, name: &str) -> anyhow::Result<Self> {
        Self::start_with(ctx, cluster, name, None, true).await
    }

    /// [`Self::start`] for a cluster whose members serve clients over mutual TLS: every
    /// connection uses `tls` (a CA, the client certificate, and the name member certificates
    /// are checked against, as members are dialled by IP).
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub async fn start_tls(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        tls: etcd_client::TlsOptions,
    ) -> anyhow::Result<Self> {
        Self::start_with(ctx, cluster, name, Some(tls), true).await
    }

    /// [`Self::start_tls`] without the clients pinned to each member of now: for an action
    /// that replaces every member (a pinned client then only counts requests to a member that
    /// is gone), clients follow the Service and the Ready member pods (not every running
    /// one), as a client that rediscovers the members' ready addresses does.
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub async fn start_tls_following(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        tls: etcd_client::TlsOptions,
    ) -> anyhow::Result<Self> {
        Self::start_with(ctx, cluster, name, Some(tls), false).await
    }

    /// [`Self::start_tls_following`] with TLS options that follow `feed` (a client that reads
    /// its certificate Secret again when it changes: a CA rotation's new trust bundle and
    /// client certificate); `feed_task` (what sends them) is stopped with the recording.
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub async fn start_tls_feed(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        feed: tokio::sync::watch::Receiver<etcd_client::TlsOptions>,
        feed_task: JoinHandle<()>,
    ) -> anyhow::Result<Self> {
        let tls = feed.borrow().clone();
        let mut recording =
            Self::start_inner(ctx, cluster, name, Some(tls), false, Some(feed), false).await?;
        recording.feeds.push(feed_task);
        Ok(recording)
    }

    /// [`Self::start_tls_feed`] for a cluster switching from plain HTTP to TLS: each member is
    /// dialled with TLS once its pod serves TLS (its `--listen-client-urls`), in plain before;
    /// the TLS options follow `feed` (the operator's certificate Secret, made during the
    /// switch).
    #[allow(dead_code, reason = "used by some of the suites sharing this module")]
    pub async fn start_switching_to_tls(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        feed: tokio::sync::watch::Receiver<etcd_client::TlsOptions>,
        feed_task: JoinHandle<()>,
    ) -> anyhow::Result<Self> {
        let tls = feed.borrow().clone();
        let mut recording =
            Self::start_inner(ctx, cluster, name, Some(tls), false, Some(feed), true).await?;
        recording.feeds.push(feed_task);
        Ok(recording)
    }

    async fn start_with(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        tls: Option<etcd_client::TlsOptions>,
        pin: bool,
    ) -> anyhow::Result<Self> {
        Self::start_inner(ctx, cluster, name, tls, pin, None, false).await
    }

    async fn start_inner(
        ctx: &TestContext,
        cluster: &str,
        name: &str,
        tls: Option<etcd_client::TlsOptions>,
        pin: bool,
        tls_feed: Option<tokio::sync::watch::Receiver<etcd_client::TlsOptions>>,
        by_pod: bool,
    ) -> anyhow::Result<Self> {
        let secured = tls.is_some() && !by_pod;
        let slices: Api<EndpointSlice> = ctx.api();
        let pods: Api<Pod> = ctx.api();
        let (service, service_feed) = {
            let (cluster, pods) = (cluster.to_string(), pods.clone());
            recorder::feed(FEED_INTERVAL, move || {
                let (slices, cluster, pods) = (slices.clone(), cluster.clone(), pods.clone());
                async move {
                    let urls = client_service_urls(&slices, &cluster).await?;
                    if by_pod {
                        schemes_by_pod(&pods, &cluster, urls).await
                    } else {
                        Ok(secure(urls, secured))
                    }
                }
            })
            .await
        };
        let (members, member_feed) = {
            let (pods, cluster) = (pods.clone(), cluster.to_string());
            recorder::feed(FEED_INTERVAL, move || {
                let (pods, cluster) = (pods.clone(), cluster.clone());
                async move {
                    let urls = if pin {
                        running_pod_urls(&pods, &cluster).await?
                    } else {
                        ready_pod_urls(&pods, &cluster).await?
                    };
                    if by_pod {
                        schemes_by_pod(&pods, &cluster, urls).await
                    } else {
                        Ok(secure(urls, secured))
                    }
                }
            })
            .await
        };
        let pinned: Vec<String> = if pin {
            members.borrow().clone()
        } else {
            Vec::new()
        };
        let mut options = RecorderOptions::new(name, recorder::artifacts_dir(), service.clone());
        options.clients = vec![
            ClientSpec::round_robin(service.clone()),
            ClientSpec::sticky(service.clone(), 0),
            ClientSpec::round_robin(members.clone()),
            ClientSpec::sticky(members.clone(), 1),
        ];
        options
            .clients
            .extend(pinned.iter().map(|url| ClientSpec::pinned(url.clone())));
        options.watches = vec![
            ClientSpec::sticky(service, 0),
            ClientSpec::sticky(members, 1),
        ];
        options.rate = rate();
        if let Some(tls) = tls {
            options = options.with_tls(tls);
        }
        if let Some(feed) = tls_feed {
            options = options.with_tls_feed(feed);
        }
        let recorder = Recorder::start(options)
            .await
            .with_context(|| format!("starting the recorder of {name}"))?;
        println!(
            "{name}: recording {} clients ({} pinned to {pinned:?}) at {} ops/s, prefix {}",
            4 + pinned.len(),
            pinned.len(),
            rate(),
            recorder.prefix()
        );
        let recording = Recording {
            recorder,
            feeds: vec![service_feed, member_feed],
            name: name.to_string(),
            tls: secured,
            by_pod,
        };
        recording.ok_writes(10).await?;
        Ok(recording)
    }

    /// Waits until `more` writes more than now were acknowledged.
    pub async fn ok_writes(&self, more: u64) -> anyhow::Result<()> {
        let mut progress = self.recorder.progress();
        let target = progress.borrow().ok_writes + more;
        tokio::time::timeout(WAIT, progress.wait_for(|p| p.ok_writes >= target))
            .await
            .with_context(|| format!("{}: {more} acknowledged writes", self.name))?
            .with_context(|| format!("{}: the traffic ended", self.name))?;
        Ok(())
    }

    /// Marks an announced recovery (or a restore): operations called after it are checked
    /// from an unknown state, revisions may restart.
    pub async fn epoch(&self, reason: &str) {
        let at = Instant::now();
        self.recorder.epoch(reason).await;
        duration(&format!("{}: epoch \"{reason}\" marked", self.name), at);
    }

    /// Ends the run against the `size` members of `cluster`: final reads, hashes, the
    /// checks; prints the report, adds its row to `robustness.md`, and fails with the report
    /// (which shows the history slice of any violation) unless every check passed.
    pub async fn finish(
        self,
        ctx: &TestContext,
        cluster: &str,
        size: usize,
    ) -> anyhow::Result<Report> {
        let name = self.name.clone();
        let report = self.end(ctx, cluster, size).await?;
        conclude(&name, report)
    }

    /// [`Self::finish`] for a run that reached NOSPACE: the recorder's report is printed, then
    /// the history is checked again with the NOSPACE-failed writes etcd may have applied made
    /// unknown ([`crate::nospace`]), and that check decides.
    pub async fn finish_after_no_space(
        self,
        ctx: &TestContext,
        cluster: &str,
        size: usize,
    ) -> anyhow::Result<Report> {
        let name = self.name.clone();
        let report = self.end(ctx, cluster, size).await?;
        println!("{name}: as the recorder classified it:\n{report}");
        let (rechecked, changed) = crate::nospace::recheck(&report).await?;
        println!(
            "{name}: {changed} NOSPACE-failed writes were called before the first NOSPACE answer returned (etcd may have applied them): checked again with them unknown"
        );
        conclude(&name, rechecked)
    }

    /// Stops the traffic and checks the history against the `size` members of `cluster`.
    async fn end(self, ctx: &TestContext, cluster: &str, size: usize) -> anyhow::Result<Report> {
        let pods: Api<Pod> = ctx.api();
        let members = if self.tls || self.by_pod {
            // Over TLS: the running member pods not being deleted (their count checked).
            let urls: Vec<String> = cluster_pods(&pods, cluster)
                .await?
                .iter()
                .filter(|p| runs(p) && p.metadata.deletion_timestamp.is_none())
                .filter_map(pod_url)
                .collect();
            ensure!(
                urls.len() == size,
                "{cluster}: {} running members, expected {size}",
                urls.len()
            );
            if self.by_pod {
                schemes_by_pod(&pods, cluster, urls).await?
            } else {
                secure(urls, true)
            }
        } else {
            current_member_urls(&pods, cluster, size).await?
        };
        let checked = Instant::now();
        let report = self.recorder.finish(&members).await?;
        for feed in self.feeds {
            feed.abort();
        }
        duration(
            &format!("{}: final reads, hashes and checks", self.name),
            checked,
        );
        Ok(report)
    }
}

/// Prints `report`, adds its row to `robustness.md`, and fails with it unless it passed.
fn conclude(name: &str, report: Report) -> anyhow::Result<Report> {
    println!("{report}");
    report.append_markdown_row(&recorder::artifacts_dir().join("robustness.md"))?;
    ensure!(
        report.passed(),
        "{name}: the recorded history fails its checks:\n{report}"
    );
    Ok(report)
}

/// Waits until every node is Ready and carries no taint (a resumed node's taints go a moment
/// after it is Ready): what each test of a multi-node suite starts from.
pub async fn nodes_healthy(ctx: &TestContext) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client());
    let names: Vec<String> = ctx
        .nodes()?
        .iter()
        .map(|k| k.node_name().to_owned())
        .collect();
    poll_until("every node Ready, schedulable, untainted", WAIT, || async {
        for name in &names {
            let node = nodes.get(name).await?;
            let spec = node.spec.clone().unwrap_or_default();
            let tainted = spec.taints.as_ref().is_some_and(|t| !t.is_empty());
            let ready = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.status == "True");
            if !ready || tainted || spec.unschedulable == Some(true) {
                return anyhow::Ok(None);
            }
        }
        Ok(Some(()))
    })
    .await?;
    Ok(())
}

/// Cordons (or uncordons) node `name`, as `kubectl cordon` does: `spec.unschedulable`.
pub async fn cordon(ctx: &TestContext, name: &str, unschedulable: bool) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(ctx.client());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .with_context(|| format!("cordon {name}: {unschedulable}"))?;
    Ok(())
}

/// Evicts `pod` through the Eviction API as `kubectl drain` does: a 429 (the disruption
/// budget allows none now) is asked again until it goes through; returns how many 429s.
pub async fn evict(ctx: &TestContext, pod: &str) -> anyhow::Result<usize> {
    // A client that shows the 429 instead of retrying it itself.
    let mut config = kube::Config::from_custom_kubeconfig(
        ctx.control_plane().kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await?;
    config.default_retry = false;
    let drainer: Api<Pod> = Api::namespaced(kube::Client::try_from(config)?, ctx.ns());
    let refused = std::sync::atomic::AtomicUsize::new(0);
    poll_until(&format!("the eviction of {pod}"), WAIT, || {
        let (drainer, refused) = (drainer.clone(), &refused);
        async move {
            match drainer.evict(pod, &EvictParams::default()).await {
                Ok(_) => anyhow::Ok(Some(())),
                Err(kube::Error::Api(e)) if e.code == 429 => {
                    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    Ok(None)
                }
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(Some(())),
                Err(e) => bail!("evicting {pod}: {e}"),
            }
        }
    })
    .await?;
    Ok(refused.into_inner())
}

/// The node each pod of `cluster` is bound to (pods not being deleted).
pub async fn placement(
    pods: &Api<Pod>,
    cluster: &str,
) -> anyhow::Result<std::collections::BTreeMap<String, String>> {
    Ok(cluster_pods(pods, cluster)
        .await?
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            Some((p.name_any(), node))
        })
        .collect())
}

/// Revisions around the first epoch of a checked history: the highest revision of an ok
/// response called before it, and the lowest of one called after it (what a client resuming
/// from the revision it saw meets on the new cluster); serializable reads left out.
pub fn revisions_across_epoch(report: &Report) -> anyhow::Result<(i64, Option<i64>)> {
    let text = std::fs::read_to_string(&report.history)
        .with_context(|| format!("reading {}", report.history.display()))?;
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let epoch = records
        .iter()
        .find(|r| r["kind"] == "epoch")
        .and_then(|r| r["time"].as_u64())
        .context("the history has no epoch")?;
    let ok = records
        .iter()
        .filter(|r| r["kind"] == "op" && r["result"]["status"] == "ok")
        // Serializable reads may come from a member of the cluster of before.
        .filter(|r| r["op"]["serializable"] != true)
        .filter_map(|r| Some((r["call"].as_u64()?, r["result"]["revision"].as_i64()?)));
    let (mut before, mut after) = (0, None::<i64>);
    for (call, revision) in ok {
        if call < epoch {
            before = before.max(revision);
        } else {
            after = Some(after.map_or(revision, |a| a.min(revision)));
        }
    }
    Ok((before, after))
}
