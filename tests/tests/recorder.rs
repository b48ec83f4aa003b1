//! The recorder (issue 33) on real etcd members on loopback, without Kubernetes: traffic and
//! watches recorded for a few seconds, then checked with `etcd_lincheck`.
//!
//! - nothing happens: linearizable, nothing failed, the members' hashes equal;
//! - a member is SIGKILLed and restarted: still linearizable (unknown outcomes allowed);
//! - errors classified in the wild: a closed port gives `fail`, a frozen member `unknown`;
//! - broken histories are caught: a recorded value rewritten to a stale one, and linearizable
//!   gets answered serializably by a frozen (SIGSTOP) member: not linearizable, and the report
//!   shows the slice;
//! - etcd 3.2 (no HashKV): the stores are compared by range digests; an epoch is recorded;
//! - over mutual TLS (members dialled by IP, their `*.recorder.test.svc` certificate checked
//!   against a domain name): linearizable, nothing failed, the hashes equal; and clients whose
//!   handshake is refused (their certificate untrusted, expired or missing; the member's
//!   untrusted or for another name) record every operation as `fail`, none as `unknown`.
//!
//! Needs the pinned etcd (`hack/build-tools.sh`). Histories and reports go to
//! `target/recorder/` (or `$ETCD_TESTS_ARTIFACTS_DIR`).
//! Run: `cargo test -p etcd-tests --test recorder`.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{Certificate, Identity, TlsOptions};
use etcd_lincheck::history::{OpResult, parse_history};
use etcd_tests::Tools;
use etcd_tests::pki::CertificateAuthority;
use etcd_tests::ports::free_ports;
use etcd_tests::recorder::{
    ClientSpec, ClusterTls, Fault, HashMethod, LoopbackCluster, Mix, Progress, Recorder,
    RecorderOptions, Report, Verdict, artifacts_dir,
};
use nix::sys::signal::Signal;
use tokio::sync::watch;

const READY: Duration = Duration::from_secs(30);
const WAIT: Duration = Duration::from_secs(20);

fn etcd(version: Option<&str>) -> PathBuf {
    let tools = Tools::from_env().expect("the tool cache");
    let version = version.map_or_else(|| tools.versions().apiserver_etcd.clone(), str::to_string);
    tools
        .etcd(&version)
        .expect("etcd is built (hack/build-tools.sh)")
}

async fn cluster(version: Option<&str>) -> (LoopbackCluster, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = LoopbackCluster::start(&etcd(version), dir.path(), 3).expect("start members");
    cluster.wait_ready(READY).await.expect("members ready");
    (cluster, dir)
}

/// Waits until `condition` holds for the recorder's figures.
async fn until(recorder: &Recorder, what: &str, condition: impl Fn(&Progress) -> bool) -> Progress {
    let mut progress = recorder.progress();
    let found = tokio::time::timeout(WAIT, progress.wait_for(|p| condition(p)))
        .await
        .ok()
        .and_then(Result::ok)
        .map(|p| *p);
    found.unwrap_or_else(|| panic!("timed out waiting for {what}: {:?}", *progress.borrow()))
}

/// Waits for `n` more ok writes than now.
async fn more_writes(recorder: &Recorder, n: u64) -> Progress {
    let from = recorder.progress().borrow().ok_writes;
    until(recorder, &format!("{n} more ok writes"), |p| {
        p.ok_writes >= from + n
    })
    .await
}

fn options(name: &str, endpoints: watch::Receiver<Vec<String>>) -> RecorderOptions {
    let mut options = RecorderOptions::new(name, artifacts_dir(), endpoints);
    options.rate = 150.0;
    options
}

fn summary(report: &Report) {
    println!("{report}");
    report
        .append_markdown_row(&artifacts_dir().join("recorder-tests.md"))
        .expect("the Markdown summary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_happens_linearizable_nothing_failed_hashes_equal() {
    let (cluster, _dir) = cluster(None).await;
    let (_tx, endpoints) = watch::channel(cluster.endpoints());
    let recorder = Recorder::start(options("idle", endpoints))
        .await
        .expect("start");
    more_writes(&recorder, 250).await;
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");
    assert_eq!(report.failed, 0, "{report}");
    assert_eq!(report.linearizability, Verdict::Ok);
    assert!(report.hashes_equal(), "{report}");
    assert_eq!(
        report.hashes.as_ref().map(|h| h.method),
        Some(HashMethod::HashKv)
    );
    assert!(
        report.watches.1 > 100,
        "the watches saw the writes: {report}"
    );
    // The rate is a target, not a floor, on a loaded machine: at least half of it.
    assert!(report.ops_per_sec() > 75.0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_and_restarted_stays_linearizable() {
    let (mut cluster, _dir) = cluster(None).await;
    let (_tx, endpoints) = watch::channel(cluster.endpoints());
    let recorder = Recorder::start(options("kill-restart", endpoints))
        .await
        .expect("start");
    more_writes(&recorder, 50).await;
    let before = *recorder.progress().borrow();
    cluster.kill(1).expect("kill");
    // Clients sticky on the member move on; the round-robin ones back off from it.
    until(&recorder, "an error from the killed member", |p| {
        p.failed + p.unknown > before.failed + before.unknown
    })
    .await;
    more_writes(&recorder, 100).await;
    cluster.restart(1).expect("restart");
    cluster
        .wait_member_ready(1, READY)
        .await
        .expect("the member back");
    more_writes(&recorder, 100).await;
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");
    assert!(
        report.failed + report.unknown > 0,
        "the kill was seen: {report}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_port_fails_and_a_frozen_member_is_unknown() {
    let (mut cluster, _dir) = cluster(None).await;
    let [closed] = free_ports().expect("a port");
    let closed = format!("http://127.0.0.1:{closed}");
    let frozen = cluster.endpoint(2).expect("member 2");
    let (_tx, healthy) = watch::channel(cluster.endpoints()[..2].to_vec());
    let mut options = options("closed-and-frozen", healthy.clone());
    options.clients = vec![
        ClientSpec::pinned(closed.clone()),
        ClientSpec::pinned(frozen.clone()),
        ClientSpec::round_robin(healthy.clone()),
        ClientSpec::round_robin(healthy),
    ];
    options.request_timeout = Duration::from_millis(500);
    let recorder = Recorder::start(options).await.expect("start");
    more_writes(&recorder, 30).await;
    cluster.signal(2, Signal::SIGSTOP).expect("SIGSTOP");
    let frozen_at = recorder.progress().borrow().unknown;
    until(&recorder, "two timeouts on the frozen member", |p| {
        p.unknown >= frozen_at + 2
    })
    .await;
    more_writes(&recorder, 50).await;
    cluster.signal(2, Signal::SIGCONT).expect("SIGCONT");
    more_writes(&recorder, 30).await;
    let path = recorder.history_path().to_path_buf();
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");

    let history = parse_history("h", &std::fs::read(&path).expect("history")).expect("parses");
    let on = |endpoint: &String| {
        let endpoint = endpoint.clone();
        history.ops.iter().filter(move |o| o.endpoint == endpoint)
    };
    assert!(on(&closed).count() > 0);
    for op in on(&closed) {
        match &op.result {
            OpResult::Fail { error } => assert!(
                error.contains("Connection refused") || error.contains("connect"),
                "{error}"
            ),
            other => panic!("an operation on a closed port is a fail: {other:?}"),
        }
    }
    let timeouts = on(&frozen)
        .filter(|o| matches!(&o.result, OpResult::Unknown { error } if error.contains("no answer within")))
        .count();
    assert!(timeouts >= 2, "{timeouts} timeouts on the frozen member");
    assert!(
        on(&frozen).all(|o| !matches!(o.result, OpResult::Fail { .. })),
        "nothing on the frozen member is a fail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_value_written_into_the_history_is_caught() {
    let (cluster, _dir) = cluster(None).await;
    let (_tx, endpoints) = watch::channel(cluster.endpoints());
    let mut options = options("rewritten-stale-read", endpoints);
    options.fault = Some(Fault::StaleRead { after_ops: 100 });
    let recorder = Recorder::start(options).await.expect("start");
    until(&recorder, "the rewritten read", |p| p.rewritten.is_some()).await;
    more_writes(&recorder, 20).await;
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(
        matches!(report.linearizability, Verdict::Violation(_)),
        "{report}"
    );
    assert!(!report.passed());
    let id = report.rewritten.expect("rewritten");
    let text = report.to_string();
    assert!(text.contains("not linearizable"), "{text}");
    assert!(
        text.contains(&format!("#{id} ")),
        "the slice shows operation #{id}: {text}"
    );
    // Only linearizability is broken: the watches and revisions agree with the writes.
    assert_eq!(report.watch_check, Verdict::Ok, "{report}");
    assert!(report.hashes_equal(), "{report}");
}

/// How many times the frozen-member test freezes and thaws its member.
const FREEZES: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn linearizable_gets_answered_by_a_frozen_member_are_caught() {
    let (mut cluster, _dir) = cluster(None).await;
    let frozen = cluster.endpoint(2).expect("member 2");
    let (_tx, healthy) = watch::channel(cluster.endpoints()[..2].to_vec());
    // The readers get the frozen member only once it is far behind.
    let (readers_tx, readers) = watch::channel(Vec::new());
    let gets = Mix {
        put: 0,
        delete: 0,
        cas: 0,
        get: 1,
        serializable_get: 0,
    };
    let mut options = options("frozen-member-reads", healthy.clone());
    options.clients = vec![
        ClientSpec::round_robin(healthy.clone()),
        ClientSpec::round_robin(healthy.clone()),
        ClientSpec::sticky(readers.clone(), 0).with_mix(gets),
        ClientSpec::sticky(readers.clone(), 0).with_mix(gets),
        ClientSpec::sticky(readers, 0).with_mix(gets),
    ];
    options.watches = vec![ClientSpec::sticky(healthy, 0)];
    options.fault = Some(Fault::SerializableAsLinearizable {
        endpoint: frozen.clone(),
    });
    let recorder = Recorder::start(options).await.expect("start");
    more_writes(&recorder, 30).await;
    // Whether a waiting get is answered before the thawed member catches up is the
    // scheduler's choice (on a loaded machine it may catch up first): three freezes.
    for _ in 0..FREEZES {
        cluster.signal(2, Signal::SIGSTOP).expect("SIGSTOP");
        // Every key changes several times while the member is frozen.
        more_writes(&recorder, 150).await;
        readers_tx.send(vec![frozen.clone()]).expect("readers");
        // A reader's get waits for the frozen member (the two writers make at most 2 in flight).
        until(&recorder, "a get waiting on the frozen member", |p| {
            p.in_flight >= 3
        })
        .await;
        cluster.signal(2, Signal::SIGCONT).expect("SIGCONT");
        more_writes(&recorder, 30).await;
        readers_tx.send(Vec::new()).expect("readers");
    }
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(
        matches!(report.linearizability, Verdict::Violation(_)),
        "{report}"
    );
    let text = report.to_string();
    assert!(text.contains("not linearizable"), "{text}");
    assert!(
        text.contains(&frozen),
        "the slice shows a read of the frozen member: {text}"
    );
    assert!(report.hashes_equal(), "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_3_2_has_no_hashkv_the_stores_are_compared_by_range_digests() {
    let (cluster, _dir) = cluster(Some("3.2.13")).await;
    let (_tx, endpoints) = watch::channel(cluster.endpoints());
    let recorder = Recorder::start(options("etcd-3.2", endpoints))
        .await
        .expect("start");
    more_writes(&recorder, 50).await;
    // An epoch (as around an announced recovery): the keys' values are unknown after it.
    recorder.epoch("recovery").await;
    more_writes(&recorder, 50).await;
    let report = recorder.finish(&cluster.endpoints()).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");
    assert_eq!(
        report.hashes.as_ref().map(|h| h.method),
        Some(HashMethod::RangeDigest),
        "{report}"
    );
    assert!(
        report.checker.contains(", 2 epoch(s)"),
        "{}",
        report.checker
    );
}

/// The members' certificate names `*.TLS_DOMAIN` (no IP): clients dial them by IP and check
/// the certificate against `TLS_SERVER_NAME`, as for the operator's members
/// (`member.NAME.NAMESPACE.svc` against `*.NAME.NAMESPACE.svc`).
const TLS_DOMAIN: &str = "recorder.test.svc";
const TLS_SERVER_NAME: &str = "member.recorder.test.svc";

/// A cluster's certificates: one CA for the members and the clients, and a second CA (trusted
/// by the members too) whose client certificate has expired.
struct Pki {
    ca: CertificateAuthority,
    client: TlsOptions,
    expired_cert_pem: String,
    expired_key_pem: String,
}

fn client_tls(ca_pem: &str, cert_pem: &str, key_pem: &str) -> TlsOptions {
    TlsOptions::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(Identity::from_pem(cert_pem, key_pem))
        .domain_name(TLS_SERVER_NAME)
}

/// A CA (PEM) and a client certificate and key it issued that expired a day ago.
fn expired_client_cert() -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose,
    };
    let now = time::OffsetDateTime::now_utc();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, "recorder expiring CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = now - time::Duration::days(3);
    ca.not_after = now + time::Duration::days(30);
    let ca_key = KeyPair::generate().expect("a key");
    let ca_pem = ca.self_signed(&ca_key).expect("the CA").pem();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::default();
    leaf.distinguished_name.push(DnType::CommonName, "expired");
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf.not_before = now - time::Duration::days(2);
    leaf.not_after = now - time::Duration::days(1);
    let key = KeyPair::generate().expect("a key");
    let cert = leaf
        .signed_by(&key, &issuer)
        .expect("the expired certificate");
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// Three members of the pinned etcd serving clients over mutual TLS on `https://` URLs.
async fn tls_cluster() -> (LoopbackCluster, tempfile::TempDir, Pki) {
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = CertificateAuthority::new("recorder test CA").expect("the CA");
    let serving = ca
        .issue_peer_cert(&[format!("*.{TLS_DOMAIN}")])
        .expect("the members' certificate");
    let (cert_file, key_file) = serving
        .write_to(dir.path(), "member")
        .expect("write the members' certificate");
    let (expiring_ca, expired_cert_pem, expired_key_pem) = expired_client_cert();
    let trusted_ca_file = dir.path().join("client-ca.crt");
    std::fs::write(&trusted_ca_file, format!("{}{expiring_ca}", ca.cert_pem()))
        .expect("write the client CA bundle");
    let client = ca
        .issue_client_cert("recorder", &[])
        .expect("the client certificate");
    let client = client_tls(ca.cert_pem(), &client.cert_pem, &client.key_pem);
    let tls = ClusterTls {
        cert_file,
        key_file,
        trusted_ca_file,
        client: client.clone(),
    };
    let cluster =
        LoopbackCluster::start_with_tls(&etcd(None), dir.path(), 3, tls).expect("start members");
    cluster.wait_ready(READY).await.expect("members ready");
    let pki = Pki {
        ca,
        client,
        expired_cert_pem,
        expired_key_pem,
    };
    (cluster, dir, pki)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_mutual_tls_linearizable_nothing_failed_hashes_equal() {
    let (cluster, _dir, pki) = tls_cluster().await;
    let endpoints = cluster.endpoints();
    assert!(
        endpoints
            .iter()
            .all(|e| e.starts_with("https://127.0.0.1:")),
        "{endpoints:?}"
    );
    let (_tx, rx) = watch::channel(endpoints.clone());
    let recorder = Recorder::start(options("tls", rx).with_tls(pki.client))
        .await
        .expect("start");
    more_writes(&recorder, 250).await;
    let path = recorder.history_path().to_path_buf();
    let report = recorder.finish(&endpoints).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");
    assert_eq!(report.linearizability, Verdict::Ok);
    assert_eq!(report.failed, 0, "{report}");
    assert!(report.ok >= 250, "acknowledged operations: {report}");
    assert!(report.hashes_equal(), "{report}");
    assert_eq!(
        report.hashes.as_ref().map(|h| h.method),
        Some(HashMethod::HashKv)
    );
    assert!(
        report.watches.1 > 100,
        "the watches saw the writes: {report}"
    );
    let history = parse_history("h", &std::fs::read(&path).expect("history")).expect("parses");
    for endpoint in &endpoints {
        assert!(
            history
                .ops
                .iter()
                .any(|o| &o.endpoint == endpoint && matches!(o.result, OpResult::Ok { .. })),
            "answers from {endpoint}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_tls_handshake_fails_and_is_never_unknown() {
    let (cluster, _dir, pki) = tls_cluster().await;
    let endpoints = cluster.endpoints();
    let member = cluster.endpoint(0).expect("member 0");
    let other = CertificateAuthority::new("another CA").expect("another CA");
    let stranger = other
        .issue_client_cert("stranger", &[])
        .expect("a certificate of another CA");
    let own = pki
        .ca
        .issue_client_cert("recorder-2", &[])
        .expect("a client certificate");
    // Refused by the member: (TLS 1.3) after the client's side of the handshake is over.
    let refused_by_member = [
        (
            "untrusted client certificate",
            client_tls(pki.ca.cert_pem(), &stranger.cert_pem, &stranger.key_pem),
        ),
        (
            "expired client certificate",
            client_tls(
                pki.ca.cert_pem(),
                &pki.expired_cert_pem,
                &pki.expired_key_pem,
            ),
        ),
        (
            "no client certificate",
            TlsOptions::new()
                .ca_certificate(Certificate::from_pem(pki.ca.cert_pem()))
                .domain_name(TLS_SERVER_NAME),
        ),
    ];
    // Refused by the client, in the handshake.
    let refused_by_client = [
        (
            "untrusted member certificate",
            client_tls(other.cert_pem(), &own.cert_pem, &own.key_pem),
        ),
        (
            "member certificate for another name",
            client_tls(pki.ca.cert_pem(), &own.cert_pem, &own.key_pem)
                .domain_name("member.elsewhere.svc"),
        ),
    ];
    let refused: Vec<(&str, TlsOptions)> = refused_by_member
        .into_iter()
        .chain(refused_by_client)
        .collect();
    let (_tx, healthy) = watch::channel(endpoints.clone());
    let mut options = options("tls-refused", healthy.clone()).with_tls(pki.client);
    options.clients = vec![
        ClientSpec::round_robin(healthy.clone()),
        ClientSpec::round_robin(healthy),
    ];
    options.clients.extend(
        refused
            .iter()
            .map(|(_, tls)| ClientSpec::pinned(member.clone()).with_tls(tls.clone())),
    );
    let recorder = Recorder::start(options).await.expect("start");
    more_writes(&recorder, 150).await;
    let path = recorder.history_path().to_path_buf();
    let report = recorder.finish(&endpoints).await.expect("finish");
    summary(&report);
    assert!(report.passed(), "{report}");
    assert!(report.hashes_equal(), "{report}");

    let history = parse_history("h", &std::fs::read(&path).expect("history")).expect("parses");
    for (i, (what, _)) in refused.iter().enumerate() {
        let client = 2 + i as u64;
        let ops: Vec<_> = history.ops.iter().filter(|o| o.client == client).collect();
        assert!(ops.len() >= 2, "{what}: {} operations", ops.len());
        for op in ops {
            match &op.result {
                OpResult::Fail { error } => assert!(
                    error.contains("not sent"),
                    "{what}: a fail for want of a connection: {error}"
                ),
                other => panic!("{what}: a refused handshake is a fail: {other:?}"),
            }
        }
    }
    // The good clients were answered by every member.
    assert_eq!(report.unknown, 0, "{report}");
}
