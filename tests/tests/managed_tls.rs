//! Member TLS the operator manages itself (issue 34): `spec.TLS.operatorManaged` on real
//! members of the newest line and of the users' 3.2.13, a renewal that reaches the members
//! without a restart, and certificates that expired while the operator was down; the client
//! traffic of the last two recorded over mutual TLS and its history checked.
//!
//! Run: `cargo test -p etcd-tests --test managed_tls` (needs `hack/build-tools.sh`).

#[allow(
    dead_code,
    reason = "the support module is shared with the lifecycle suite, which uses the rest"
)]
mod support;

#[allow(
    dead_code,
    reason = "shared with the robustness suite, which uses the rest"
)]
#[path = "support/recording.rs"]
mod recording;

#[allow(dead_code, reason = "the recording module's NOSPACE re-check")]
#[path = "support/nospace.rs"]
mod nospace;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams};
use x509_parser::pem::parse_x509_pem;

use etcd_controller::certificates::inspect::CA_GENERATION;
use etcd_controller::certificates::issue::{CaName, Pem, issue_leaf};
use etcd_controller::certificates::served::served_certificate;
use etcd_shared::names;
use etcd_shared::tls::CertKind;
use etcd_tests::poll_until;
use etcd_tests::suite::TestContext;

use etcd_controller::view::transport::MemberTransport;
use recording::Recording;
use support::operator::{Controller, create_cluster, install};
use support::{Access, WAIT, cluster_yaml, duration, member_pods, settled, wait_until};

/// How long a check's request is retried while the cluster may be electing a leader.
const ELECTION_WAIT: Duration = Duration::from_secs(30);

fn main() -> std::process::ExitCode {
    let long = Duration::from_secs(600);
    etcd_tests::run_suite_with_kubelet(vec![
        etcd_tests::Test::new(
            "operator_managed_tls_is_mutual_on_3_6",
            operator_managed_tls_is_mutual_on_3_6,
        ),
        etcd_tests::Test::new(
            "operator_managed_tls_is_mutual_on_the_users_3_2",
            operator_managed_tls_is_mutual_on_the_users_3_2,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_renewed_certificate_reaches_the_members_without_a_restart",
            a_renewed_certificate_reaches_the_members_without_a_restart,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "certificates_expired_while_the_operator_was_down_are_renewed",
            certificates_expired_while_the_operator_was_down_are_renewed,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_cert_manager_renewal_replaces_the_users_3_2_members",
            a_cert_manager_renewal_replaces_the_users_3_2_members,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_ca_rotation_reaches_every_member_with_no_outage_on_3_6",
            a_ca_rotation_reaches_every_member_with_no_outage_on_3_6,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_ca_rotation_reaches_every_member_with_no_outage_on_the_users_3_2",
            a_ca_rotation_reaches_every_member_with_no_outage_on_the_users_3_2,
        )
        .with_timeout(Duration::from_secs(900)),
        etcd_tests::Test::new(
            "cert_manager_tls_is_mutual_on_3_6_and_the_users_3_2",
            cert_manager_tls_is_mutual_on_3_6_and_the_users_3_2,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_cert_manager_renewal_reaches_the_members_without_a_restart",
            a_cert_manager_renewal_reaches_the_members_without_a_restart,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_plain_cluster_switches_to_tls_with_no_outage_on_3_6",
            a_plain_cluster_switches_to_tls_with_no_outage_on_3_6,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_plain_cluster_switches_to_cert_manager_tls_with_no_outage_on_3_6",
            a_plain_cluster_switches_to_cert_manager_tls_with_no_outage_on_3_6,
        )
        .with_timeout(long),
        etcd_tests::Test::new(
            "a_plain_cluster_switches_to_tls_with_no_outage_on_the_users_3_2",
            a_plain_cluster_switches_to_tls_with_no_outage_on_the_users_3_2,
        )
        .with_timeout(Duration::from_secs(900)),
        etcd_tests::Test::new(
            "static_certificates_switch_to_the_operators_with_no_outage_on_3_6",
            static_certificates_switch_to_the_operators_with_no_outage_on_3_6,
        )
        .with_timeout(Duration::from_secs(900)),
        etcd_tests::Test::new(
            "the_operators_certificates_switch_to_cert_manager_with_no_outage_on_3_6",
            the_operators_certificates_switch_to_cert_manager_with_no_outage_on_3_6,
        )
        .with_timeout(Duration::from_secs(900)),
        etcd_tests::Test::new(
            "a_cert_manager_ca_rotation_by_a_new_issuer_with_no_outage_on_3_6",
            a_cert_manager_ca_rotation_by_a_new_issuer_with_no_outage_on_3_6,
        )
        .with_timeout(Duration::from_secs(900)),
        etcd_tests::Test::new(
            "static_certificates_switch_to_the_operators_with_no_outage_on_the_users_3_2",
            static_certificates_switch_to_the_operators_with_no_outage_on_the_users_3_2,
        )
        .with_timeout(Duration::from_secs(1200)),
    ])
}

/// A cluster manifest with `TLS: operatorManaged` (and its settings, indented under it).
fn managed_yaml(name: &str, size: usize, version: &str, settings: &str) -> String {
    let body = if settings.is_empty() {
        " {}\n".to_string()
    } else {
        format!(
            "\n{}",
            settings
                .lines()
                .map(|l| format!("      {l}\n"))
                .collect::<String>()
        )
    };
    format!(
        "{}  TLS:\n    operatorManaged:{body}",
        cluster_yaml(name, size, Some(version))
    )
}

fn key_of(secret: &Secret, key: &str) -> anyhow::Result<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("{:?} has no {key}", secret.metadata.name))?;
    Ok(String::from_utf8(bytes.0.clone())?)
}

/// The keys of a certificate Secret of `kind`: `kubernetes.io/tls` (cert-manager's) when it has
/// `tls.crt`, else CoreOS' (the operator's own).
fn keys_of(secret: &Secret, kind: CertKind) -> [&'static str; 3] {
    let tls = secret
        .data
        .as_ref()
        .is_some_and(|d| d.contains_key("tls.crt"));
    if tls {
        etcd_shared::tls::KUBERNETES_TLS_KEYS
    } else {
        kind.coreos_keys()
    }
}

/// The DER of the first certificate of a PEM text.
fn der_of(pem: &str) -> anyhow::Result<Vec<u8>> {
    let (_, parsed) = parse_x509_pem(pem.as_bytes()).context("not PEM")?;
    Ok(parsed.contents)
}

/// The client access of the operator's own certificate (what the operator dials with).
async fn operator_access(ctx: &TestContext, name: &str) -> anyhow::Result<Access> {
    Ok(Access::Tls {
        tls: recorder_tls(ctx, name).await?,
    })
}

/// The recorder's TLS options: the operator's certificate, members checked as
/// `member.NAME.NAMESPACE.svc` (they are dialled by IP).
async fn recorder_tls(ctx: &TestContext, name: &str) -> anyhow::Result<etcd_client::TlsOptions> {
    let secrets: Api<Secret> = ctx.api();
    let operator = secrets
        .get(&CertKind::Operator.secret_name(name))
        .await
        .context("the operator's certificate Secret")?;
    tls_of(&operator, &format!("member.{name}.{}.svc", ctx.ns()))
}

/// TLS options from the operator's certificate Secret, members checked as `domain`.
fn tls_of(operator: &Secret, domain: &str) -> anyhow::Result<etcd_client::TlsOptions> {
    let [cert, key, ca] = keys_of(operator, CertKind::Operator);
    Ok(etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(key_of(operator, ca)?))
        .identity(etcd_client::Identity::from_pem(
            key_of(operator, cert)?,
            key_of(operator, key)?,
        ))
        .domain_name(domain.to_string()))
}

/// [`recorder_tls`], read again every 0.5 s and sent when the Secret changed: a client that
/// follows its mounted certificate Secret (a CA rotation's bundle, its renewed certificate).
async fn recorder_tls_feed(
    ctx: &TestContext,
    name: &str,
) -> anyhow::Result<(
    tokio::sync::watch::Receiver<etcd_client::TlsOptions>,
    tokio::task::JoinHandle<()>,
)> {
    let secrets: Api<Secret> = ctx.api();
    let secret_name = CertKind::Operator.secret_name(name);
    let domain = format!("member.{name}.{}.svc", ctx.ns());
    // A plain cluster has none yet (a switch to TLS makes it): no TLS until it is made.
    let first = secrets.get_opt(&secret_name).await?;
    let options = match &first {
        Some(secret) => tls_of(secret, &domain)?,
        None => etcd_client::TlsOptions::new(),
    };
    let (tx, rx) = tokio::sync::watch::channel(options);
    let mut last = first.and_then(|s| s.data);
    let task = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = tx.closed() => return,
            }
            let Ok(secret) = secrets.get(&secret_name).await else {
                continue;
            };
            if secret.data.is_none() || secret.data == last {
                continue;
            }
            if let Ok(tls) = tls_of(&secret, &domain) {
                tx.send_replace(tls);
                last = secret.data;
            }
        }
    });
    Ok((rx, task))
}

/// Each member pod's IP.
async fn member_ips(ctx: &TestContext, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = ctx.api();
    let mut ips = BTreeMap::new();
    for (member, pod) in member_pods(&pods, name).await? {
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("{member} has no IP"))?;
        ips.insert(member, ip);
    }
    Ok(ips)
}

/// The server certificate each member serves on its client port now (DER by member).
async fn served(ctx: &TestContext, name: &str) -> anyhow::Result<BTreeMap<String, Vec<u8>>> {
    let mut out = BTreeMap::new();
    for (member, ip) in member_ips(ctx, name).await? {
        let der = served_certificate(
            &format!("{ip}:{}", names::CLIENT_PORT),
            Duration::from_secs(3),
        )
        .await?;
        out.insert(member, der);
    }
    Ok(out)
}

/// The certificate a leaf Secret holds now (DER).
async fn held(ctx: &TestContext, name: &str, kind: CertKind) -> anyhow::Result<Vec<u8>> {
    let secrets: Api<Secret> = ctx.api();
    let secret = secrets.get(&kind.secret_name(name)).await?;
    der_of(&key_of(&secret, keys_of(&secret, kind)[0])?)
}

/// Waits until every member serves the server certificate its Secret holds.
async fn wait_served(ctx: &TestContext, name: &str, what: &str) -> anyhow::Result<()> {
    poll_until(what, WAIT * 2, || async {
        let want = held(ctx, name, CertKind::Server).await?;
        let now = served(ctx, name).await?;
        anyhow::Ok((now.len() >= 3 && now.values().all(|d| *d == want)).then_some(()))
    })
    .await?;
    Ok(())
}

/// Mutual TLS end to end: the members' peer URLs are https, the operator's certificate reads
/// and writes on every member, the served certificate is the Secret's and chains to the
/// cluster's CA, and a client without a certificate is refused.
async fn check_mutual_tls(ctx: &TestContext, name: &str) -> anyhow::Result<()> {
    let access = operator_access(ctx, name).await?;
    let ips = member_ips(ctx, name).await?;
    let urls: Vec<String> = ips
        .values()
        .map(|ip| format!("https://{ip}:{}", names::CLIENT_PORT))
        .collect();
    let client = support::connect_with(&urls, &access).await?;
    // Right after a member was replaced its cluster may still be electing a leader (3.2 has no
    // MoveLeader): each request is retried for a while. What is checked is TLS and the data;
    // availability is the recorder's.
    poll_until("tls/hello written over mutual TLS", ELECTION_WAIT, || {
        let mut client = client.clone();
        async move { client.put("tls/hello", "world", None).await.map(Some) }
    })
    .await?;
    let members = poll_until("the member list over mutual TLS", ELECTION_WAIT, || {
        let mut client = client.clone();
        async move { client.member_list().await.map(Some) }
    })
    .await?;
    let peer_urls: Vec<String> = members
        .members()
        .iter()
        .flat_map(|m| m.peer_urls().to_vec())
        .collect();
    ensure!(
        peer_urls.len() == 3 && peer_urls.iter().all(|u| u.starts_with("https://")),
        "peer URLs {peer_urls:?}"
    );
    for url in &urls {
        let one = support::connect_with(std::slice::from_ref(url), &access).await?;
        let got = poll_until(&format!("tls/hello read from {url}"), ELECTION_WAIT, || {
            let mut one = one.clone();
            async move { one.get("tls/hello", None).await.map(Some) }
        })
        .await?;
        ensure!(
            got.kvs().first().map(|kv| kv.value()) == Some(b"world".as_slice()),
            "{url} does not have tls/hello"
        );
    }
    // What the members serve is the Secret's certificate, issued by the cluster's CA.
    // The CA the operator's own Secret trusts (the operator's CA, or cert-manager's issuer's).
    let secrets: Api<Secret> = ctx.api();
    let operator = secrets.get(&CertKind::Operator.secret_name(name)).await?;
    let ca_pem = key_of(&operator, keys_of(&operator, CertKind::Operator)[2])?;
    let ca_der = der_of(&ca_pem)?;
    let (_, ca_x509) = x509_parser::parse_x509_certificate(&ca_der)?;
    let want = held(ctx, name, CertKind::Server).await?;
    for (member, der) in served(ctx, name).await? {
        ensure!(
            der == want,
            "{member} serves another certificate than its Secret's"
        );
        let (_, leaf) = x509_parser::parse_x509_certificate(&der)?;
        ensure!(
            leaf.issuer() == ca_x509.subject(),
            "{member}'s certificate was issued by {}, not the cluster's CA {}",
            leaf.issuer(),
            ca_x509.subject()
        );
    }
    // Without a client certificate nothing is written.
    let anonymous = etcd_client::ConnectOptions::new()
        .with_connect_timeout(support::ETCD_TIMEOUT)
        .with_timeout(support::ETCD_TIMEOUT)
        .with_tls(
            etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(ca_pem.clone()))
                .domain_name(format!("member.{name}.{}.svc", ctx.ns())),
        );
    let refused = match etcd_client::Client::connect(urls.clone(), Some(anonymous)).await {
        Err(e) => Some(e.to_string()),
        Ok(mut c) => c
            .put("tls/anonymous", "x", None)
            .await
            .err()
            .map(|e| e.to_string()),
    };
    ensure!(
        refused.is_some(),
        "a client without a certificate could write"
    );
    let anonymous_key = poll_until("tls/anonymous read back", ELECTION_WAIT, || {
        let mut client = client.clone();
        async move { client.get("tls/anonymous", None).await.map(Some) }
    })
    .await?;
    ensure!(
        anonymous_key.kvs().is_empty(),
        "a client without a certificate wrote tls/anonymous"
    );
    Ok(())
}

async fn create_managed(
    ctx: &TestContext,
    name: &str,
    yaml: &str,
    version: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    create_cluster(ctx, yaml).await?;
    wait_until(&ctx.api(), name, "3 healthy voters over mutual TLS", |c| {
        settled(c, 3, version)
    })
    .await?;
    duration(
        &format!("{name}: 3 members Available over mutual TLS"),
        started,
    );
    Ok(())
}

/// A 3-member 3.6 cluster with `operatorManaged: {}` runs with mutual TLS on peer and client
/// traffic from the operator's own CA, with the Events saying what was issued.
async fn operator_managed_tls_is_mutual_on_3_6(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "managed";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.6")?;
    create_managed(&ctx, NAME, &managed_yaml(NAME, 3, &version, ""), &version).await?;
    check_mutual_tls(&ctx, NAME).await?;
    let issued = support::event_count(&ctx, "CertificateIssued").await?;
    ensure!(issued >= 1, "no CertificateIssued Event");
    Ok(())
}

/// The users' etcd 3.2.13 with `operatorManaged: {}`: the operator's ECDSA certificates in
/// PKCS#8 are read by 3.2's Go TLS, peers and clients talk mutual TLS.
async fn operator_managed_tls_is_mutual_on_the_users_3_2(ctx: TestContext) -> anyhow::Result<()> {
    const NAME: &str = "managed32";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    create_managed(&ctx, NAME, &managed_yaml(NAME, 3, "3.2.13", ""), "3.2.13").await?;
    check_mutual_tls(&ctx, NAME).await
}

/// Pods' container IDs and restart counts, by member: a restart changes one of them.
async fn containers(ctx: &TestContext, name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let pods: Api<Pod> = ctx.api();
    Ok(member_pods(&pods, name)
        .await?
        .into_iter()
        .map(|(member, pod)| {
            let status = pod
                .status
                .and_then(|s| s.container_statuses)
                .and_then(|c| c.into_iter().next());
            let id = status
                .as_ref()
                .map(|s| format!("{:?}/{}", s.container_id, s.restart_count))
                .unwrap_or_default();
            (
                member,
                format!("{}/{id}", pod.metadata.uid.unwrap_or_default()),
            )
        })
        .collect())
}

/// A short-lived certificate (5m, renewed 30 s after it was issued) is renewed by the operator
/// and served by every member without a restart, under continuous writes that all land.
async fn a_renewed_certificate_reaches_the_members_without_a_restart(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "renewed";
    install(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.6")?;
    let yaml = managed_yaml(NAME, 3, &version, "duration: 5m\nrenewBefore: 4m30s");
    create_managed(&ctx, NAME, &yaml, &version).await?;
    renewal_reaches_every_member(&ctx, NAME, "tls-renewal").await
}

/// Under recorded traffic over mutual TLS: waits for the server certificate of cluster `name`
/// to be renewed and served by every member, then checks no member restarted and the history
/// (run `run`) holds no failed or unknown request.
async fn renewal_reaches_every_member(
    ctx: &TestContext,
    name: &str,
    run: &str,
) -> anyhow::Result<()> {
    wait_served(ctx, name, "every member serving its first certificate").await?;
    let first = held(ctx, name, CertKind::Server).await?;
    let before = containers(ctx, name).await?;
    let recording = Recording::start_tls(ctx, name, run, recorder_tls(ctx, name).await?).await?;
    let started = Instant::now();
    poll_until("the server certificate renewed", WAIT * 2, || async {
        let now = held(ctx, name, CertKind::Server).await?;
        anyhow::Ok((now != first).then_some(()))
    })
    .await?;
    duration(&format!("{run}: the server certificate renewed"), started);
    wait_served(ctx, name, "every member serving the renewed certificate").await?;
    duration(&format!("{run}: every member serves the renewal"), started);
    recording.ok_writes(20).await?;
    ensure!(
        containers(ctx, name).await? == before,
        "a member restarted for the renewal"
    );
    let report = recording.finish(ctx, name, 3).await?;
    println!(
        "{run}: {} operations, {} failed, {} unknown, longest without an ok write {:?} ms, no restart",
        report.ops, report.failed, report.unknown, report.longest_without_write_ms
    );
    ensure!(
        report.failed == 0 && report.unknown == 0,
        "requests failed during the renewal: {} failed, {} unknown",
        report.failed,
        report.unknown
    );
    Ok(())
}

/// Writes an expired certificate of `kind`, signed by the cluster's CA, into its Secret (what
/// a cluster holds when the operator was down past the end of its certificates).
async fn write_expired(ctx: &TestContext, name: &str, kind: CertKind) -> anyhow::Result<()> {
    let secrets: Api<Secret> = ctx.api();
    let ca_secret = secrets.get(&names::ca_secret_name(name)).await?;
    let generation: u64 = ca_secret
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CA_GENERATION))
        .context("no CA generation")?
        .parse()?;
    let ca_name = CaName {
        cluster: name.to_string(),
        namespace: ctx.ns().to_string(),
        generation,
    };
    let ca = Pem {
        cert: key_of(&ca_secret, "ca.crt")?,
        key: key_of(&ca_secret, "ca.key")?,
    };
    let two_hours_ago = time::OffsetDateTime::now_utc() - time::Duration::hours(2);
    let leaf = issue_leaf(
        kind,
        name,
        ctx.ns(),
        None,
        &ca_name,
        &ca,
        two_hours_ago,
        Duration::from_secs(3600),
    )?;
    let [cert, key, bundle] = kind.coreos_keys();
    let data = BTreeMap::from([
        (cert.to_string(), ByteString(leaf.cert.into_bytes())),
        (key.to_string(), ByteString(leaf.key.into_bytes())),
        (bundle.to_string(), ByteString(ca.cert.into_bytes())),
    ]);
    let patch = serde_json::json!({ "data": data });
    secrets
        .patch(
            &kind.secret_name(name),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// The operator is stopped and every certificate expires (written expired into the Secrets,
/// as a long outage leaves them); the members serve the expired certificates and clients that
/// verify refuse them. The operator comes back: it issues new certificates, the members serve
/// them without a restart, and the cluster's data is all there.
async fn certificates_expired_while_the_operator_was_down_are_renewed(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "expired";
    install(&ctx).await?;
    let controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.6")?;
    create_managed(
        &ctx,
        NAME,
        &managed_yaml(NAME, 3, &version, "duration: 10m"),
        &version,
    )
    .await?;
    // Recorded from before the outage to after the healing: the clients keep their own copy
    // of a (still valid) client certificate; the members' certificates expire under them.
    let recording =
        Recording::start_tls(&ctx, NAME, "tls-expiry", recorder_tls(&ctx, NAME).await?).await?;
    let before = containers(&ctx, NAME).await?;
    controller.stop().await?;

    for kind in CertKind::ALL {
        write_expired(&ctx, NAME, kind).await?;
    }
    wait_served(&ctx, NAME, "every member serving the expired certificate").await?;
    let stale = operator_access(&ctx, NAME).await?;
    let ips = member_ips(&ctx, NAME).await?;
    let urls: Vec<String> = ips
        .values()
        .map(|ip| format!("https://{ip}:{}", names::CLIENT_PORT))
        .collect();
    let refused = match support::connect_with(&urls, &stale).await {
        Err(e) => Some(format!("{e:#}")),
        Ok(mut c) => c.get("expiry/", None).await.err().map(|e| e.to_string()),
    };
    ensure!(refused.is_some(), "expired certificates were accepted");
    println!(
        "expired: clients refuse the members: {}",
        refused.unwrap_or_default()
    );

    let started = Instant::now();
    let _controller = Controller::start(&ctx)?;
    poll_until("the expired certificates reissued", WAIT, || async {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let mut fresh = 0;
        for kind in CertKind::ALL {
            let der = held(&ctx, NAME, kind).await?;
            let (_, cert) = x509_parser::parse_x509_certificate(&der)?;
            if cert.validity().not_after.timestamp() > now {
                fresh += 1;
            }
        }
        anyhow::Ok((fresh == CertKind::ALL.len()).then_some(()))
    })
    .await?;
    wait_served(&ctx, NAME, "every member serving a fresh certificate").await?;
    wait_until(&ctx.api(), NAME, "3 healthy voters again", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration("expired: healed after the operator's return", started);
    ensure!(
        containers(&ctx, NAME).await? == before,
        "a member restarted to heal the expiry"
    );
    recording.ok_writes(20).await?;
    let report = recording.finish(&ctx, NAME, 3).await?;
    println!(
        "expired: {} operations, {} failed (refused while the certificates were expired), {} unknown, longest without an ok write {:?} ms",
        report.ops, report.failed, report.unknown, report.longest_without_write_ms
    );
    Ok(())
}

/// Real cert-manager (the harness's, one per suite) with a CA Issuer `etcd-ca` in the test's
/// namespace: a SelfSigned Issuer, the CA Certificate it signs, the CA Issuer on it.
async fn ca_issuer(ctx: &TestContext) -> anyhow::Result<()> {
    let cm = etcd_tests::cert_manager::shared(ctx.control_plane()).await?;
    println!("cert-manager {} ready", cm.version());
    etcd_tests::cert_manager::ca_issuer(ctx.client(), ctx.ns(), "etcd-ca", WAIT).await
}

/// A cluster manifest with `TLS: certManager` from the Issuer `etcd-ca` (and `extra` lines).
fn cert_manager_yaml(name: &str, size: usize, version: &str, extra: &str) -> String {
    let extra: String = extra.lines().map(|l| format!("      {l}\n")).collect();
    format!(
        "{}  TLS:\n    certManager:\n      issuerRef:\n        name: etcd-ca\n{extra}",
        cluster_yaml(name, size, Some(version))
    )
}

/// `certManager` with a CA Issuer: 3 members of 3.6 and of the users' 3.2.13 run with mutual
/// TLS from cert-manager's certificates (Secrets in `kubernetes.io/tls` layout, mounted under
/// CoreOS' file names; the operator dials with its own from cert-manager).
async fn cert_manager_tls_is_mutual_on_3_6_and_the_users_3_2(
    ctx: TestContext,
) -> anyhow::Result<()> {
    install(&ctx).await?;
    ca_issuer(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.6")?;
    for (name, version) in [("cm36", version.as_str()), ("cm32", "3.2.13")] {
        create_managed(
            &ctx,
            name,
            &cert_manager_yaml(name, 3, version, ""),
            version,
        )
        .await?;
        check_mutual_tls(&ctx, name).await?;
    }
    Ok(())
}

/// A cert-manager certificate of 1h renewed 20 s after it was issued (`renewBefore: 59m40s`)
/// reaches every member without a restart, under recorded traffic over mutual TLS.
async fn a_cert_manager_renewal_reaches_the_members_without_a_restart(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "cmrenewed";
    install(&ctx).await?;
    ca_issuer(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.6")?;
    let yaml = cert_manager_yaml(NAME, 3, &version, "duration: 1h\nrenewBefore: 59m40s");
    create_managed(&ctx, NAME, &yaml, &version).await?;
    renewal_reaches_every_member(&ctx, NAME, "cert-manager-renewal").await
}

/// 3.2 serves the certificate it started with to clients that send no server name: after a
/// cert-manager renewal its members are replaced, one at a time, surge first, under recorded
/// traffic, until every member serves the renewed certificate.
async fn a_cert_manager_renewal_replaces_the_users_3_2_members(
    ctx: TestContext,
) -> anyhow::Result<()> {
    const NAME: &str = "cmrenewed32";
    install(&ctx).await?;
    ca_issuer(&ctx).await?;
    let _controller = Controller::start(&ctx)?;
    let version = support::pinned_etcd("3.2")?;
    // Created with certificates renewed only 30 minutes before their end: a 3.2 member is
    // replaced for each renewal, and renewals every 20 s from the start would keep a loaded
    // machine's cluster rolling before it ever settled.
    let yaml = cert_manager_yaml(NAME, 3, &version, "duration: 1h\nrenewBefore: 30m");
    create_managed(&ctx, NAME, &yaml, &version).await?;
    wait_served(&ctx, NAME, "every member serving its first certificate").await?;
    let first = held(&ctx, NAME, CertKind::Server).await?;
    let pods: Api<Pod> = ctx.api();
    let before: Vec<String> = member_pods(&pods, NAME).await?.into_keys().collect();
    let (feed, feed_task) = recorder_tls_feed(&ctx, NAME).await?;
    let run = "cert-manager-renewal-3-2";
    let recording = Recording::start_tls_feed(&ctx, NAME, run, feed, feed_task).await?;
    let started = Instant::now();
    // Under the recorder's load: cert-manager renews 20 s after issuing.
    let renew_before = |before: &'static str| {
        let clusters: Api<etcd_shared::EtcdCluster> = ctx.api();
        async move {
            let patch =
                serde_json::json!({"spec": {"TLS": {"certManager": {"renewBefore": before}}}});
            clusters
                .patch(NAME, &PatchParams::default(), &Patch::Merge(patch))
                .await
        }
    };
    renew_before("59m40s").await?;
    poll_until("the server certificate renewed", WAIT * 2, || async {
        let now = held(&ctx, NAME, CertKind::Server).await?;
        anyhow::Ok((now != first).then_some(()))
    })
    .await?;
    duration(&format!("{run}: renewed by cert-manager"), started);
    // One renewal is enough: renewed again only 30 minutes before the end.
    renew_before("30m").await?;
    // Bounded well inside the test's timeout, so that a stalled roll fails with the status.
    let after = poll_until(
        "3 new members serving the renewed certificate",
        WAIT * 2,
        || async {
            let want = held(&ctx, NAME, CertKind::Server).await?;
            let now = member_pods(&pods, NAME).await?;
            let replaced = now.len() == 3 && now.keys().all(|m| !before.contains(m));
            if !replaced {
                return anyhow::Ok(None);
            }
            let served = served(&ctx, NAME).await?;
            anyhow::Ok(
                (served.len() == 3 && served.values().all(|d| *d == want))
                    .then(|| now.keys().cloned().collect::<Vec<String>>()),
            )
        },
    )
    .await;
    let after = match after {
        Ok(after) => after,
        Err(e) => {
            let clusters: Api<etcd_shared::EtcdCluster> = ctx.api();
            let status = clusters
                .get_opt(NAME)
                .await
                .ok()
                .flatten()
                .map(|c| c.status);
            let pods_now = member_pods(&pods, NAME)
                .await
                .map(|p| p.into_keys().collect::<Vec<_>>());
            anyhow::bail!("{e}; member pods {pods_now:?}; last status: {status:#?}");
        }
    };
    wait_until(&ctx.api(), NAME, "3 healthy voters", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration(&format!("{run}: every member replaced"), started);
    recording.ok_writes(20).await?;
    let report = recording.finish(&ctx, NAME, 3).await?;
    let longest = report.longest_without_write_ms.unwrap_or(f64::MAX);
    println!(
        "{run}: members {before:?} -> {after:?}; {} operations, {} failed, {} unknown, longest without an ok write {longest:.0} ms",
        report.ops, report.failed, report.unknown
    );
    // 3.2 has no MoveLeader: the leader's removal costs an election (requests time out).
    election_bounded(&report, 1)?;
    Ok(())
}

/// A CA rotation asked for (`etcd.database.coreos.com/rotate-ca`) on a 3-member 3.6 cluster
/// of the operator's own CA completes under recorded traffic: every member is replaced to trust
/// both CAs, the new CA signs, the old one is retired and every member replaced again to trust
/// the new CA alone; a client certificate of the old CA is refused after it. The controller is
/// restarted once in the middle (after the first member was replaced).
async fn a_ca_rotation_reaches_every_member_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    ca_rotation(&ctx, "rotated", "3.6").await
}

/// The same on the users' 3.2.13, which also serves the certificates it started with until it
/// restarts (its members are replaced a third time, for the new CA's certificates).
async fn a_ca_rotation_reaches_every_member_with_no_outage_on_the_users_3_2(
    ctx: TestContext,
) -> anyhow::Result<()> {
    ca_rotation(&ctx, "rotated32", "3.2").await
}

fn annotation_of(secret: &Secret, key: &str) -> Option<String> {
    secret.metadata.annotations.as_ref()?.get(key).cloned()
}

fn has_key(secret: &Secret, key: &str) -> bool {
    secret.data.as_ref().is_some_and(|d| d.contains_key(key))
}

async fn ca_rotation(ctx: &TestContext, name: &str, line: &str) -> anyhow::Result<()> {
    use etcd_controller::certificates::rotation::fingerprint;
    install(ctx).await?;
    let mut controller = Controller::start(ctx)?;
    let version = support::pinned_etcd(line)?;
    create_managed(ctx, name, &managed_yaml(name, 3, &version, ""), &version).await?;
    let secrets: Api<Secret> = ctx.api();
    let ca_secret = names::ca_secret_name(name);
    let old = secrets.get(&ca_secret).await?;
    let old_ca = key_of(&old, "ca.crt")?;
    let old_key = key_of(&old, "ca.key")?;
    let old_generation: u64 = annotation_of(&old, CA_GENERATION)
        .context("no CA generation")?
        .parse()?;
    let pods: Api<Pod> = ctx.api();
    let before: Vec<String> = member_pods(&pods, name).await?.into_keys().collect();

    let (feed, feed_task) = recorder_tls_feed(ctx, name).await?;
    let run = format!("{name}-ca-rotation");
    let recording = Recording::start_tls_feed(ctx, name, &run, feed, feed_task).await?;
    let started = Instant::now();
    let clusters: Api<etcd_shared::EtcdCluster> = ctx.api();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({
                "metadata": {"annotations": {names::ANNOTATION_ROTATE_CA: "test-1"}}
            })),
        )
        .await?;
    poll_until("a next CA trusted beside the current one", WAIT, || async {
        let s = secrets.get(&ca_secret).await?;
        anyhow::Ok(has_key(&s, "next.crt").then_some(()))
    })
    .await?;
    duration(&format!("{run}: next CA made"), started);
    if line != "3.2" {
        // The controller fails in the middle of the rotation: what it did is in the CA Secret
        // and the pods' annotations, and a new one carries on from there.
        poll_until("a member replaced to trust both", WAIT, || async {
            let now = member_pods(&pods, name).await?;
            anyhow::Ok(now.keys().any(|m| !before.contains(m)).then_some(()))
        })
        .await?;
        controller.stop().await?;
        controller = Controller::start(ctx)?;
        duration(
            &format!("{run}: controller restarted mid-rotation"),
            started,
        );
    }
    poll_until("the new CA signing", WAIT * 6, || async {
        let s = secrets.get(&ca_secret).await?;
        let generation = annotation_of(&s, CA_GENERATION).and_then(|g| g.parse::<u64>().ok());
        anyhow::Ok((generation == Some(old_generation + 1)).then_some(()))
    })
    .await?;
    duration(
        &format!("{run}: every member trusts both, the new CA signs"),
        started,
    );
    poll_until("the old CA retired", WAIT * 6, || async {
        let s = secrets.get(&ca_secret).await?;
        anyhow::Ok((!has_key(&s, "previous.crt") && !has_key(&s, "next.crt")).then_some(()))
    })
    .await?;
    duration(&format!("{run}: the old CA retired"), started);
    let new = secrets.get(&ca_secret).await?;
    let new_ca = key_of(&new, "ca.crt")?;
    ensure!(new_ca != old_ca, "the CA did not change");
    let _controller = controller;
    let trust_new = fingerprint([new_ca.as_str()]);
    let after = poll_until(
        "3 members, each made to trust the new CA alone",
        WAIT * 6,
        || async {
            let now = member_pods(&pods, name).await?;
            let live: Vec<(&String, &Pod)> = now
                .iter()
                .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
                .collect();
            let all_new = live.len() == 3
                && now.len() == 3
                && live.iter().all(|(_, p)| {
                    p.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(names::ANNOTATION_TLS_TRUST))
                        == Some(&trust_new)
                });
            anyhow::Ok(all_new.then(|| now.keys().cloned().collect::<Vec<String>>()))
        },
    )
    .await?;
    wait_until(&ctx.api(), name, "3 healthy voters on the new CA", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration(&format!("{run}: rotation complete"), started);
    ensure!(
        after.iter().all(|m| !before.contains(m)),
        "members {before:?} -> {after:?}: not every member was replaced"
    );
    recording.ok_writes(20).await?;
    check_mutual_tls(ctx, name).await?;

    // A client certificate the old CA signed is refused now.
    let stale = issue_leaf(
        CertKind::Operator,
        name,
        ctx.ns(),
        None,
        &CaName {
            cluster: name.to_string(),
            namespace: ctx.ns().to_string(),
            generation: old_generation,
        },
        &Pem {
            cert: old_ca,
            key: old_key,
        },
        time::OffsetDateTime::now_utc(),
        Duration::from_secs(3600),
    )?;
    let urls: Vec<String> = member_ips(ctx, name)
        .await?
        .values()
        .map(|ip| format!("https://{ip}:{}", names::CLIENT_PORT))
        .collect();
    let old_client = Access::Tls {
        tls: etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(new_ca))
            .identity(etcd_client::Identity::from_pem(stale.cert, stale.key))
            .domain_name(format!("member.{name}.{}.svc", ctx.ns())),
    };
    let refused = match support::connect_with(&urls, &old_client).await {
        Err(e) => Some(format!("{e:#}")),
        Ok(mut c) => c
            .put("rotation/old-ca", "x", None)
            .await
            .err()
            .map(|e| e.to_string()),
    };
    ensure!(
        refused.is_some(),
        "a client certificate of the retired CA could still write"
    );
    for reason in [
        "CARotationStarted",
        "CARotationSigning",
        "CARotationRetired",
    ] {
        let n = support::event_count(ctx, reason).await?;
        ensure!(n == 1, "{n} {reason} Events, expected 1");
    }
    let report = recording.finish(ctx, name, 3).await?;
    println!(
        "{run}: members {before:?} -> {after:?}; {} operations, {} failed, {} unknown, longest without an ok write {:?} ms",
        report.ops, report.failed, report.unknown, report.longest_without_write_ms
    );
    if line == "3.2" {
        // 3.2 has no MoveLeader: each of the three passes removes the leader, which costs an
        // election; requests in flight then time out. Bounded per pass, never a long outage.
        election_bounded(&report, 3)?;
    } else {
        // Each of the two passes replaces the leader once, after a MoveLeader: the requests in
        // flight on the old leader's term (one per client at most) may be answered `leader
        // changed` or `raft proposal dropped`. None is refused outside a handover.
        ensure!(
            report.failed == 0 && report.unknown <= 4 * 2,
            "requests failed during the rotation: {} failed, {} unknown (at most one per client per leader handover, 8)",
            report.failed,
            report.unknown
        );
    }
    Ok(())
}

/// What a replacement pass costs on 3.2 (no MoveLeader: the leader's removal is an election):
/// at most 10 requests without an answer per pass (in flight on 4 clients while the members
/// elect), no ok write missing for 10 s or more; the history checked linearizable by `finish`.
fn election_bounded(report: &etcd_tests::recorder::Report, passes: usize) -> anyhow::Result<()> {
    let longest = report.longest_without_write_ms.unwrap_or(f64::MAX);
    ensure!(
        report.failed + report.unknown <= 10 * passes && longest < 10_000.0,
        "{} failed, {} unknown over {passes} passes (at most 10 each), longest without an ok write {longest} ms",
        report.failed,
        report.unknown
    );
    Ok(())
}

/// How each member pod speaks, by its flags (by member).
async fn transports(
    ctx: &TestContext,
    name: &str,
) -> anyhow::Result<BTreeMap<String, MemberTransport>> {
    let pods: Api<Pod> = ctx.api();
    let mut out = BTreeMap::new();
    for (member, pod) in member_pods(&pods, name).await? {
        if pod.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let transport = MemberTransport::of_pod(&pod)
            .with_context(|| format!("{member}'s etcd flags name no peer URL"))?;
        out.insert(member, transport);
    }
    Ok(out)
}

/// Issue 34: a running plain 3.6 cluster switched to `operatorManaged` TLS under recorded
/// traffic.
async fn a_plain_cluster_switches_to_tls_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    plain_to_tls(&ctx, "switch36", "3.6", Source::OperatorManaged).await
}

/// The same to certificates of a cert-manager CA Issuer (its Secrets are written after the
/// switch is asked for: the replacements wait for them).
async fn a_plain_cluster_switches_to_cert_manager_tls_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    ca_issuer(&ctx).await?;
    plain_to_tls(&ctx, "switchcm", "3.6", Source::CertManager).await
}

/// Where a switched cluster's certificates come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    OperatorManaged,
    CertManager,
}

/// The same on the users' 3.2.13 (no learners, no MoveLeader).
async fn a_plain_cluster_switches_to_tls_with_no_outage_on_the_users_3_2(
    ctx: TestContext,
) -> anyhow::Result<()> {
    plain_to_tls(&ctx, "switch32", "3.2", Source::OperatorManaged).await
}

/// A plain 3-member cluster, recorded clients following the Ready members (each dialled with
/// TLS once its pod serves it, with the operator's certificate once it is made), `spec.TLS`
/// set to `operatorManaged`: the members are replaced by bridges (peer port plain, TLS files
/// held, clients served both ways), then by TLS members; the cluster ends with mutual TLS on
/// both ports, every member replaced, and the history checked linearizable.
async fn plain_to_tls(
    ctx: &TestContext,
    name: &str,
    line: &str,
    source: Source,
) -> anyhow::Result<()> {
    install(ctx).await?;
    let mut controller = Controller::start(ctx)?;
    let version = if line == "3.2" {
        "3.2.13".to_string()
    } else {
        support::pinned_etcd(line)?
    };
    create_cluster(ctx, &cluster_yaml(name, 3, Some(&version))).await?;
    wait_until(&ctx.api(), name, "3 plain members", |c| {
        settled(c, 3, &version)
    })
    .await?;
    let pods: Api<Pod> = ctx.api();
    let before: Vec<String> = member_pods(&pods, name).await?.into_keys().collect();
    let (feed, feed_task) = recorder_tls_feed(ctx, name).await?;
    let run = format!("{name}-plain-to-tls");
    let recording = Recording::start_switching_to_tls(ctx, name, &run, feed, feed_task).await?;
    let started = Instant::now();
    let clusters: Api<etcd_shared::EtcdCluster> = ctx.api();
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"TLS": match source {
                Source::OperatorManaged => serde_json::json!({"operatorManaged": {}}),
                Source::CertManager => serde_json::json!({"certManager": {"issuerRef": {"name": "etcd-ca"}}}),
            }}})),
        )
        .await
        .context("the webhook takes a switch to TLS")?;
    if matches!(source, Source::OperatorManaged) && line != "3.2" {
        // The controller fails in the middle of the switch: what it did is in the pods' flags,
        // and a new one carries on from there.
        poll_until("a bridge member", WAIT * 2, || async {
            let now = transports(ctx, name).await?;
            anyhow::Ok(
                now.values()
                    .any(|t| t.peer_files && !t.peer_tls)
                    .then_some(()),
            )
        })
        .await?;
        controller.stop().await?;
        controller = Controller::start(ctx)?;
        duration(&format!("{run}: controller restarted mid-switch"), started);
    }
    let _controller = controller;
    let mut saw_bridge = false;
    poll_until("no member without the peer TLS files", WAIT * 6, || async {
        let now = transports(ctx, name).await?;
        anyhow::Ok(
            now.values()
                .all(|t| t.peer_files)
                .then(|| now.values().filter(|t| !t.peer_tls).count()),
        )
    })
    .await
    .map(|bridges| saw_bridge = bridges > 0)?;
    duration(
        &format!("{run}: every member holds the peer TLS files"),
        started,
    );
    poll_until("every member on TLS", WAIT * 6, || async {
        let now = transports(ctx, name).await?;
        anyhow::Ok(
            (now.len() == 3 && now.values().all(|t| t.peer_tls && !t.serves_plain())).then_some(()),
        )
    })
    .await?;
    wait_until(&ctx.api(), name, "3 healthy voters over TLS", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration(&format!("{run}: switch complete"), started);
    ensure!(
        saw_bridge,
        "no bridge member was seen once every member held the files"
    );
    let after: Vec<String> = member_pods(&pods, name).await?.into_keys().collect();
    ensure!(
        after.iter().all(|m| !before.contains(m)),
        "members {before:?} -> {after:?}: not every member was replaced"
    );
    recording.ok_writes(20).await?;
    check_mutual_tls(ctx, name).await?;
    let report = recording.finish(ctx, name, 3).await?;
    println!(
        "{run}: members {before:?} -> {after:?}; {} operations, {} failed, {} unknown, longest without an ok write {:?} ms",
        report.ops, report.failed, report.unknown, report.longest_without_write_ms
    );
    if line == "3.2" {
        election_bounded(&report, 2)?;
    } else {
        // Two passes, each hands leadership over once (MoveLeader): a request in flight per
        // client may be answered `leader changed` at each.
        ensure!(
            report.failed == 0 && report.unknown <= 4 * 2,
            "requests failed during the switch: {} failed, {} unknown (at most one per client per leader handover, 8)",
            report.failed,
            report.unknown
        );
    }
    Ok(())
}

/// Where a switched cluster's certificates come from, in the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// CoreOS' `static`, the test's own CA (`support::tls`).
    Static,
    /// The operator's own CA.
    OperatorManaged,
    /// cert-manager's CA Issuer `etcd-ca`.
    CertManager,
}

/// Static certificates (a CoreOS user's) to the operator's own on 3.6, the controller
/// restarted in the middle.
async fn static_certificates_switch_to_the_operators_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    source_switch(
        &ctx,
        "st2om",
        "3.6",
        Origin::Static,
        Source::OperatorManaged,
    )
    .await
}

/// The operator's own certificates to cert-manager's on 3.6: both write Secrets of the same
/// names, so the members move onto the switch Secret before cert-manager writes them.
async fn the_operators_certificates_switch_to_cert_manager_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    source_switch(
        &ctx,
        "om2cm",
        "3.6",
        Origin::OperatorManaged,
        Source::CertManager,
    )
    .await
}

/// cert-manager's CA rotated by pointing the cluster at another CA Issuer on 3.6 (cert-manager
/// writes the new CA's certificates into the same Secrets: the members move off them first).
async fn a_cert_manager_ca_rotation_by_a_new_issuer_with_no_outage_on_3_6(
    ctx: TestContext,
) -> anyhow::Result<()> {
    source_switch(
        &ctx,
        "cm2cm",
        "3.6",
        Origin::CertManager,
        Source::CertManager,
    )
    .await
}

/// Static certificates to the operator's own on the users' 3.2.13 (no certificate reload, no
/// MoveLeader: every phase replaces the members, each leader removal is an election).
async fn static_certificates_switch_to_the_operators_with_no_outage_on_the_users_3_2(
    ctx: TestContext,
) -> anyhow::Result<()> {
    source_switch(
        &ctx,
        "st2om32",
        "3.2",
        Origin::Static,
        Source::OperatorManaged,
    )
    .await
}

/// The recorder's TLS options during a switch of the certificates' source: the Secret the
/// operator dials with (the old source's operator Secret, then the switch Secret while it is
/// there, then the new source's), read again every 0.5 s and sent when it changed.
async fn switch_tls_feed(
    ctx: &TestContext,
    name: &str,
    from_secret: String,
    to_secret: String,
) -> anyhow::Result<(
    tokio::sync::watch::Receiver<etcd_client::TlsOptions>,
    tokio::task::JoinHandle<()>,
)> {
    let secrets: Api<Secret> = ctx.api();
    let switch_name = names::tls_switch_secret_name(name);
    let domain = format!("member.{name}.{}.svc", ctx.ns());
    let first = secrets.get(&from_secret).await?;
    let (tx, rx) = tokio::sync::watch::channel(tls_of(&first, &domain)?);
    let mut last = first.data;
    let task = tokio::spawn(async move {
        let mut seen_switch = false;
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = tx.closed() => return,
            }
            let switch = secrets.get_opt(&switch_name).await.ok().flatten();
            seen_switch |= switch.is_some();
            let secret = match switch {
                Some(s) => Some(s),
                None if seen_switch => secrets.get_opt(&to_secret).await.ok().flatten(),
                None => continue,
            };
            let Some(secret) = secret else { continue };
            if secret.data.is_none() || secret.data == last {
                continue;
            }
            if let Ok(tls) = tls_of(&secret, &domain) {
                tx.send_replace(tls);
                last = secret.data;
            }
        }
    });
    Ok((rx, task))
}

/// The Secrets each member pod's TLS volumes mount (by member).
async fn mounted_secrets(
    ctx: &TestContext,
    name: &str,
) -> anyhow::Result<BTreeMap<String, Vec<String>>> {
    let pods: Api<Pod> = ctx.api();
    Ok(member_pods(&pods, name)
        .await?
        .into_iter()
        .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
        .map(|(member, pod)| {
            let secrets = pod
                .spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .filter(|v| v.name == names::PEER_TLS_VOLUME || v.name == names::SERVER_TLS_VOLUME)
                .filter_map(|v| v.secret.as_ref()?.secret_name.clone())
                .collect();
            (member, secrets)
        })
        .collect())
}

/// A running 3-member TLS cluster moves from one source of certificates to another under
/// recorded traffic over mutual TLS (the clients following the Secret the operator dials
/// with): onto the switch Secret, trusting both CAs, the new leaves, then the new source's own
/// Secrets; every member replaced, the old CA's client certificate refused at the end, the
/// history checked.
async fn source_switch(
    ctx: &TestContext,
    name: &str,
    line: &str,
    from: Origin,
    to: Source,
) -> anyhow::Result<()> {
    install(ctx).await?;
    if to == Source::CertManager || from == Origin::CertManager {
        ca_issuer(ctx).await?;
    }
    if to == Source::CertManager && from == Origin::CertManager {
        etcd_tests::cert_manager::ca_issuer(ctx.client(), ctx.ns(), "etcd-ca-2", WAIT).await?;
    }
    let mut controller = Controller::start(ctx)?;
    let version = if line == "3.2" {
        "3.2.13".to_string()
    } else {
        support::pinned_etcd(line)?
    };
    let (from_operator, old_client) = match from {
        Origin::Static => {
            let (_, operator) = support::tls::coreos_tls_secrets(ctx, name).await?;
            let yaml = format!(
                "{}{}",
                cluster_yaml(name, 3, Some(&version)),
                support::tls::tls_section(name)
            );
            create_cluster(ctx, &yaml).await?;
            (format!("{name}-operator"), Some(operator))
        }
        Origin::OperatorManaged => {
            create_cluster(ctx, &managed_yaml(name, 3, &version, "")).await?;
            (CertKind::Operator.secret_name(name), None)
        }
        Origin::CertManager => {
            create_cluster(ctx, &cert_manager_yaml(name, 3, &version, "")).await?;
            (CertKind::Operator.secret_name(name), None)
        }
    };
    let clusters: Api<etcd_shared::EtcdCluster> = ctx.api();
    wait_until(
        &clusters,
        name,
        "3 TLS members, their Secrets recorded",
        |c| settled(c, 3, &version) && c.status.as_ref().is_some_and(|s| s.tls.is_some()),
    )
    .await?;
    let pods: Api<Pod> = ctx.api();
    let before: Vec<String> = member_pods(&pods, name).await?.into_keys().collect();
    let to_operator = CertKind::Operator.secret_name(name);
    let (feed, feed_task) = switch_tls_feed(ctx, name, from_operator, to_operator).await?;
    let run = format!("{name}-source-switch");
    let recording = Recording::start_tls_feed(ctx, name, &run, feed, feed_task).await?;
    let started = Instant::now();
    let (from_key, to_key, to_source) = match (from, to) {
        (Origin::Static, Source::OperatorManaged) => {
            ("static", "operatorManaged", serde_json::json!({}))
        }
        (Origin::OperatorManaged, Source::CertManager) => (
            "operatorManaged",
            "certManager",
            serde_json::json!({"issuerRef": {"name": "etcd-ca"}}),
        ),
        (Origin::Static, Source::CertManager) => (
            "static",
            "certManager",
            serde_json::json!({"issuerRef": {"name": "etcd-ca"}}),
        ),
        (Origin::CertManager, Source::CertManager) => (
            "certManager",
            "certManager",
            serde_json::json!({"issuerRef": {"name": "etcd-ca-2"}}),
        ),
        (Origin::CertManager, Source::OperatorManaged) => {
            ("certManager", "operatorManaged", serde_json::json!({}))
        }
        (Origin::OperatorManaged, Source::OperatorManaged) => anyhow::bail!("not a switch"),
    };
    clusters
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"TLS": {from_key: null, to_key: to_source}}}),
            ),
        )
        .await
        .context("the webhook takes a switch of the certificates' source")?;
    let switch_name = names::tls_switch_secret_name(name);
    if line != "3.2" {
        // The controller fails in the middle of the switch: what it did is in the switch
        // Secret, the pods' volumes and the status, and a new one carries on from there.
        poll_until("a member on the switch Secret", WAIT * 2, || async {
            let now = mounted_secrets(ctx, name).await?;
            anyhow::Ok(now.values().any(|s| s.contains(&switch_name)).then_some(()))
        })
        .await?;
        controller.stop().await?;
        controller = Controller::start(ctx)?;
        duration(&format!("{run}: controller restarted mid-switch"), started);
    }
    let _controller = controller;
    let secrets: Api<Secret> = ctx.api();
    let phases = std::sync::Mutex::new(Vec::<String>::new());
    let switching_said = std::sync::Mutex::new(None::<String>);
    let targets = [
        CertKind::Peer.secret_name(name),
        CertKind::Server.secret_name(name),
    ];
    poll_until(
        "every member on the new source's Secrets",
        WAIT * 12,
        || async {
            if let Some(s) = secrets.get_opt(&switch_name).await? {
                let phase =
                    annotation_of(&s, etcd_controller::certificates::switch::PHASE_ANNOTATION);
                if let Some(phase) = phase
                    && let Ok(mut seen) = phases.lock()
                    && !seen.contains(&phase)
                {
                    duration(&format!("{run}: switch phase {phase}"), started);
                    seen.push(phase);
                }
            }
            let now = mounted_secrets(ctx, name).await?;
            let c = clusters.get(name).await?;
            let recorded = c.status.as_ref().and_then(|s| s.tls.clone());
            let wanted = c.spec.tls.as_ref().and_then(|t| t.in_use(name));
            let progressing = c.status.as_ref().and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == "Progressing" && c.reason == "SwitchingCertificates")
                    .map(|c| c.message.clone())
            });
            if let Some(message) = progressing
                && let Ok(mut seen) = switching_said.lock()
                && seen.is_none()
            {
                println!("{run}: Progressing SwitchingCertificates: {message}");
                *seen = Some(message);
            }
            let settled_seen = phases.lock().is_ok_and(|p| p.iter().any(|p| p == "settle"));
            anyhow::Ok(
                (settled_seen
                    && now.len() == 3
                    && now
                        .values()
                        .all(|s| !s.is_empty() && s.iter().all(|n| targets.contains(n)))
                    && recorded.is_some()
                    && recorded == wanted
                    && recorded.as_ref().map(|r| r.source.as_str()) == Some(to_key)
                    && secrets.get_opt(&switch_name).await?.is_none())
                .then_some(()),
            )
        },
    )
    .await?;
    wait_until(&clusters, name, "3 healthy voters on the new source", |c| {
        settled(c, 3, &version)
    })
    .await?;
    duration(&format!("{run}: switch complete"), started);
    let after: Vec<String> = member_pods(&pods, name).await?.into_keys().collect();
    ensure!(
        after.iter().all(|m| !before.contains(m)),
        "members {before:?} -> {after:?}: not every member was replaced"
    );
    recording.ok_writes(20).await?;
    check_mutual_tls(ctx, name).await?;
    if let Some(old) = old_client {
        // The old source's client certificate is refused now.
        let operator = secrets.get(&CertKind::Operator.secret_name(name)).await?;
        let ca = key_of(&operator, keys_of(&operator, CertKind::Operator)[2])?;
        let urls: Vec<String> = member_ips(ctx, name)
            .await?
            .values()
            .map(|ip| format!("https://{ip}:{}", names::CLIENT_PORT))
            .collect();
        let stale = Access::Tls {
            tls: etcd_client::TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(ca))
                .identity(etcd_client::Identity::from_pem(old.cert_pem, old.key_pem))
                .domain_name(format!("member.{name}.{}.svc", ctx.ns())),
        };
        let refused = match support::connect_with(&urls, &stale).await {
            Err(e) => Some(format!("{e:#}")),
            Ok(mut c) => c
                .put("switch/old-ca", "x", None)
                .await
                .err()
                .map(|e| e.to_string()),
        };
        ensure!(
            refused.is_some(),
            "a client certificate of the old source could still write"
        );
    }
    if to == Source::CertManager {
        // What the members serve (checked above: the Secret's certificate) is the new issuer's.
        let wanted = if from == Origin::CertManager {
            "etcd-ca-2"
        } else {
            "etcd-ca"
        };
        let server = secrets.get(&CertKind::Server.secret_name(name)).await?;
        let issuer = annotation_of(&server, "cert-manager.io/issuer-name");
        ensure!(
            issuer.as_deref() == Some(wanted),
            "the server certificate was issued by {issuer:?}, not {wanted}"
        );
    }
    let said = switching_said.into_inner().unwrap_or_default();
    ensure!(
        said.as_deref()
            .is_some_and(|m| m.contains("certificates moving from")),
        "the Progressing condition never said SwitchingCertificates ({said:?})"
    );
    let switched = support::event_count(ctx, "CertificateSwitched").await?;
    ensure!(
        switched == 1,
        "{switched} CertificateSwitched Events, expected 1"
    );
    let report = recording.finish(ctx, name, 3).await?;
    let phases = phases.into_inner().unwrap_or_default();
    println!(
        "{run}: members {before:?} -> {after:?}; phases seen {phases:?}; {} operations, {} failed, {} unknown, longest without an ok write {:?} ms",
        report.ops, report.failed, report.unknown, report.longest_without_write_ms
    );
    if line == "3.2" {
        // Four passes on 3.2 (onto the switch Secret, trusting both, the new leaves, the new
        // source's Secrets), each leader removal an election.
        election_bounded(&report, 4)?;
    } else {
        // Three passes (the new leaves are reloaded without a restart), each hands leadership
        // over once (MoveLeader): a request in flight per client may be answered `leader
        // changed` at each.
        ensure!(
            report.failed == 0 && report.unknown <= 4 * 3,
            "requests failed during the switch: {} failed, {} unknown (at most one per client per leader handover, 12)",
            report.failed,
            report.unknown
        );
    }
    Ok(())
}
