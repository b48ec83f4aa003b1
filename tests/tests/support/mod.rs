//! Shared pieces of the lifecycle suite: the in-process operator, waiting on a cluster's
//! status, a client that keeps writing, and checks against every member's data.

#[allow(dead_code, reason = "used by the backup suites only")]
pub mod backups;
#[allow(dead_code, reason = "used by the take-over suite only")]
pub mod coreos;
pub mod operator;
#[allow(dead_code, reason = "used by some of the suites sharing this module")]
pub mod phases;
#[allow(dead_code, reason = "used by some of the suites sharing this module")]
pub mod proxy;
pub mod tls;
pub mod writer;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use etcd_client::{Client, ConnectOptions, GetOptions};
use etcd_tests::endpoints::ready_addresses;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use etcd_shared::types::ClusterPhase;
use etcd_shared::{EtcdCluster, names};
use etcd_tests::await_condition;
use etcd_tests::suite::TestContext;

use self::operator::create_cluster;

/// The etcd version pinned in `hack/versions.env` for release line `line` (`"3.2"`).
pub fn pinned_etcd(line: &str) -> anyhow::Result<String> {
    let versions = etcd_tests::Versions::pinned()?;
    versions
        .every_etcd()
        .into_iter()
        .find(|v| v.rsplit_once('.').is_some_and(|(l, _)| l == line))
        .with_context(|| format!("hack/versions.env pins no etcd {line}.x"))
}

/// The longest any single step of a test may take.
pub const WAIT: Duration = Duration::from_secs(150);

/// How long one etcd request may take before the test counts it as failed.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(3);

/// Watches `name` until `done` holds for it; on timeout the error carries its last status.
pub async fn wait_until(
    api: &Api<EtcdCluster>,
    name: &str,
    what: &str,
    done: impl Fn(&EtcdCluster) -> bool,
) -> anyhow::Result<EtcdCluster> {
    let condition = move |c: Option<&EtcdCluster>| c.is_some_and(&done);
    match await_condition(api.clone(), name, condition, WAIT).await {
        Ok(Some(c)) => Ok(c),
        Ok(None) => bail!("{name} vanished while waiting for {what}"),
        Err(e) => {
            let last = api.get_opt(name).await.ok().flatten().map(|c| c.status);
            bail!("waiting for {name}: {what}: {e}; last status: {last:#?}")
        }
    }
}

/// The cluster has acted on its current spec and runs `size` healthy voters: phase Running,
/// Available, no learners, every member on `version`.
pub fn settled(c: &EtcdCluster, size: usize, version: &str) -> bool {
    let Some(s) = c.status.as_ref() else {
        return false;
    };
    let available = s
        .conditions
        .iter()
        .any(|c| c.type_ == "Available" && c.status == "True");
    let members = s.members.as_ref();
    s.observed_generation == c.metadata.generation
        && s.phase == Some(ClusterPhase::Running)
        && available
        && members.is_some_and(|m| m.learners.is_empty() && m.unready.is_empty())
        && s.ready_members == i32::try_from(size).ok()
        && s.size == i32::try_from(size).ok()
        && s.current_version.as_deref() == Some(version)
}

/// The cluster's member pods, by name.
pub async fn member_pods(pods: &Api<Pod>, cluster: &str) -> anyhow::Result<BTreeMap<String, Pod>> {
    let selector = format!("{}={cluster}", names::LABEL_INSTANCE);
    Ok(pods
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .into_iter()
        .map(|p| (p.name_any(), p))
        .collect())
}

/// The client URL of every member pod that has an IP.
pub async fn member_urls(
    pods: &Api<Pod>,
    cluster: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(member_pods(pods, cluster)
        .await?
        .into_iter()
        .filter_map(|(name, p)| {
            let ip = p.status?.pod_ip?;
            Some((name, format!("http://{ip}:{}", names::CLIENT_PORT)))
        })
        .collect())
}

/// The ready endpoints of the cluster's client Service, as etcd client URLs: what a client
/// inside the cluster reaches through the Service.
pub async fn client_service_urls(
    slices: &Api<EndpointSlice>,
    cluster: &str,
) -> anyhow::Result<Vec<String>> {
    client_service_urls_with(slices, cluster, &Access::Plain).await
}

/// How a test client reaches a cluster's members: plain, or with a client certificate over TLS
/// (members are dialled by IP and their certificates checked against `domain`).
#[derive(Clone)]
pub enum Access {
    /// `http://`.
    Plain,
    /// `https://` with the client certificate of `tls`.
    Tls {
        /// CA, client certificate and the name the member certificates are checked against.
        tls: etcd_client::TlsOptions,
    },
}

impl Access {
    /// The URL scheme.
    pub fn scheme(&self) -> &'static str {
        match self {
            Access::Plain => "http",
            Access::Tls { .. } => "https",
        }
    }

    /// Client access with `client`'s certificate, trusting `ca`, checking member certificates
    /// against `domain`.
    #[allow(dead_code, reason = "used by the suites with TLS clusters")]
    pub fn tls(ca: &str, client: &etcd_tests::IssuedCert, domain: &str) -> Self {
        use etcd_client::{Certificate, Identity, TlsOptions};
        Access::Tls {
            tls: TlsOptions::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name(domain)
                .identity(Identity::from_pem(&client.cert_pem, &client.key_pem)),
        }
    }
}

/// [`client_service_urls`] with the scheme of `access`.
pub async fn client_service_urls_with(
    slices: &Api<EndpointSlice>,
    cluster: &str,
    access: &Access,
) -> anyhow::Result<Vec<String>> {
    Ok(
        ready_addresses(slices, &names::client_service_name(cluster))
            .await?
            .iter()
            .map(|a| format!("{}://{a}:{}", access.scheme(), names::CLIENT_PORT))
            .collect(),
    )
}

/// An etcd client for `endpoints`, with short timeouts.
pub async fn connect(endpoints: &[String]) -> anyhow::Result<Client> {
    connect_with(endpoints, &Access::Plain).await
}

/// [`connect`] with `access`.
pub async fn connect_with(endpoints: &[String], access: &Access) -> anyhow::Result<Client> {
    let mut options = ConnectOptions::new()
        .with_connect_timeout(ETCD_TIMEOUT)
        .with_timeout(ETCD_TIMEOUT);
    if let Access::Tls { tls } = access {
        options = options.with_tls(tls.clone());
    }
    Client::connect(endpoints, Some(options))
        .await
        .with_context(|| format!("connecting to {endpoints:?}"))
}

/// Every key under `prefix` with its value, read (linearizably) from `url` alone.
pub async fn read_all(url: &str, prefix: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut client = connect(&[url.to_string()]).await?;
    let got = client
        .get(prefix, Some(GetOptions::new().with_prefix()))
        .await
        .with_context(|| format!("reading {prefix}* from {url}"))?;
    got.kvs()
        .iter()
        .map(|kv| Ok((kv.key_str()?.to_string(), kv.value_str()?.to_string())))
        .collect()
}

/// Checks that every member of `cluster` holds every key of `expected` with its value, and
/// that all members report the same member list of `size`.
pub async fn check_every_member(
    pods: &Api<Pod>,
    cluster: &str,
    prefix: &str,
    expected: &BTreeMap<String, String>,
    size: usize,
) -> anyhow::Result<()> {
    let urls = member_urls(pods, cluster).await?;
    if urls.len() != size {
        bail!("expected {size} member pods with IPs, found {urls:?}");
    }
    for (member, url) in &urls {
        let data = read_all(url, prefix).await?;
        let missing: Vec<&String> = expected
            .iter()
            .filter(|(k, v)| data.get(*k) != Some(*v))
            .map(|(k, _)| k)
            .collect();
        if !missing.is_empty() {
            bail!(
                "member {member} lacks {} of {} acknowledged writes (first: {:?})",
                missing.len(),
                expected.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            );
        }
        let mut client = connect(std::slice::from_ref(url)).await?;
        let list = client.member_list().await?;
        let listed: Vec<&str> = list.members().iter().map(|m| m.name()).collect();
        if listed.len() != size || list.members().iter().any(|m| m.is_learner()) {
            bail!("member {member} lists {listed:?}, expected {size} voters");
        }
    }
    Ok(())
}

/// The member list as `url` reports it: name (empty while unstarted) by member ID, with
/// whether the member is a learner.
pub async fn member_list(url: &str) -> anyhow::Result<BTreeMap<u64, (String, bool)>> {
    let mut client = connect(&[url.to_string()]).await?;
    let list = client
        .member_list()
        .await
        .with_context(|| format!("listing members at {url}"))?;
    Ok(list
        .members()
        .iter()
        .map(|m| (m.id(), (m.name().to_string(), m.is_learner())))
        .collect())
}

/// The version each member's etcd server reports.
pub async fn reported_versions(
    pods: &Api<Pod>,
    cluster: &str,
) -> anyhow::Result<BTreeMap<String, String>> {
    let mut versions = BTreeMap::new();
    for (member, url) in member_urls(pods, cluster).await? {
        let mut client = connect(&[url]).await?;
        let status = client.status().await?;
        versions.insert(member, status.version().to_string());
    }
    Ok(versions)
}

/// Writes `count` keys `PREFIX<n>` through the cluster's client Service endpoints, `parallel`
/// at a time, and returns the acknowledged ones: a burst of raft entries.
pub async fn bulk_put(
    slices: &Api<EndpointSlice>,
    cluster: &str,
    prefix: &str,
    count: usize,
    parallel: usize,
) -> anyhow::Result<BTreeMap<String, String>> {
    use futures::StreamExt as _;
    let urls = client_service_urls(slices, cluster).await?;
    let client = connect(&urls).await?;
    let acked: Vec<Option<(String, String)>> = futures::stream::iter(0..count)
        .map(|n| {
            let mut client = client.clone();
            let (key, value) = (format!("{prefix}{n:08}"), format!("bulk-{n}"));
            async move {
                let put = client.put(key.clone(), value.clone(), None);
                match tokio::time::timeout(ETCD_TIMEOUT, put).await {
                    Ok(Ok(_)) => Some((key, value)),
                    _ => None,
                }
            }
        })
        .buffer_unordered(parallel)
        .collect()
        .await;
    Ok(acked.into_iter().flatten().collect())
}

/// An EtcdCluster manifest of `size` members (and `version`, when given).
pub fn cluster_yaml(name: &str, size: usize, version: Option<&str>) -> String {
    let version = version.map_or(String::new(), |v| format!("  version: {v}\n"));
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n  size: {size}\n{version}"
    )
}

/// Prints a `duration:` line for `what` and returns the seconds since `since`.
pub fn duration(what: &str, since: Instant) -> f64 {
    let secs = since.elapsed().as_secs_f64();
    println!("duration: {what}: {secs:.1} s");
    secs
}

/// Creates a cluster of `size` and waits until it is settled; returns its version.
pub async fn create_settled(
    ctx: &TestContext,
    name: &str,
    size: usize,
    version: Option<&str>,
) -> anyhow::Result<String> {
    let started = Instant::now();
    let created = create_cluster(ctx, &cluster_yaml(name, size, version)).await?;
    let version = created
        .spec
        .version
        .clone()
        .context("the webhook did not default the version")?;
    wait_until(&ctx.api(), name, &format!("{size} healthy voters"), |c| {
        settled(c, size, &version)
    })
    .await?;
    let secs = duration(&format!("{name}: {size}-member cluster Available"), started);
    if secs > 20.0 {
        println!("note: {name} took longer than the 20 s aim");
    }
    Ok(version)
}

#[allow(dead_code, reason = "used by some of the suites sharing this module")]
/// A manifest of EtcdCluster `name` with the spec lines `spec` (indented by two).
pub fn manifest(name: &str, spec: &str) -> String {
    let indented: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    format!(
        "apiVersion: etcd.database.coreos.com/v1beta2\nkind: EtcdCluster\nmetadata:\n  name: {name}\nspec:\n{indented}"
    )
}

#[allow(dead_code, reason = "used by some of the suites sharing this module")]
/// The Events of the test's namespace with `reason`.
pub async fn events(
    ctx: &TestContext,
    reason: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Event>> {
    let api: Api<k8s_openapi::api::core::v1::Event> = ctx.api();
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect())
}

#[allow(dead_code, reason = "used by some of the suites sharing this module")]
/// How many times Events of `reason` were reported (a series counts each).
pub async fn event_count(ctx: &TestContext, reason: &str) -> anyhow::Result<usize> {
    Ok(events(ctx, reason)
        .await?
        .iter()
        .map(|e| usize::try_from(e.count.unwrap_or(1)).unwrap_or(1))
        .sum())
}

/// Waits until the cluster's status gives `reason`; returns the Degraded condition's message.
#[allow(dead_code, reason = "used by some of the suites sharing this module")]
pub async fn degraded_for(
    api: &Api<EtcdCluster>,
    name: &str,
    reason: &str,
) -> anyhow::Result<String> {
    let said = wait_until(api, name, reason, |c| {
        c.status
            .as_ref()
            .is_some_and(|s| s.reason.as_deref() == Some(reason))
    })
    .await?;
    Ok(said
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Degraded"))
        .map(|c| c.message.clone())
        .unwrap_or_default())
}
