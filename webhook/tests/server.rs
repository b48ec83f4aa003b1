//! The webhook end to end: the real server in-process on 127.0.0.1 ports, certificates made by
//! rcgen in a temporary directory, and a real HTTPS client that trusts the test CA and dials
//! the IP (no SNI, as the API server does).

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use base64::Engine as _;
use clap::Parser;
use etcd_webhook::{Args, RunningServer, Shutdown};
use hyper::StatusCode;
use serde_json::{Value, json};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A running webhook and what a test needs to talk to it.
struct Harness {
    server: RunningServer,
    ca: Ca,
    dir: tempfile::TempDir,
    cert: PathBuf,
    serial: String,
    client: Arc<rustls::ClientConfig>,
}

impl Harness {
    async fn start(extra: &[&str]) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::new();
        let pair = ca.issue(1);
        let (cert, key) = write_pair(dir.path(), &pair);
        Self::start_with(dir, ca, cert, key, pair.serial, extra).await
    }

    async fn start_with(
        dir: tempfile::TempDir,
        ca: Ca,
        cert: PathBuf,
        key: PathBuf,
        serial: String,
        extra: &[&str],
    ) -> Harness {
        // Logs show with a failing test's output.
        let _ = tracing_subscriber::fmt()
            .with_env_filter("etcd_webhook=debug")
            .with_test_writer()
            .try_init();
        let args = args(&cert, &key, extra);
        let server = etcd_webhook::server::start(&args, Shutdown::new())
            .await
            .expect("webhook starts");
        let client = client_config(
            &ca.cert_pem,
            &[b"http/1.1"],
            &[&rustls::version::TLS13, &rustls::version::TLS12],
        );
        Harness {
            server,
            ca,
            dir,
            cert,
            serial,
            client,
        }
    }

    async fn conn(&self) -> Conn {
        Conn::connect(self.server.tls_addr(), self.client.clone())
            .await
            .expect("TLS connection")
    }

    async fn metrics(&self) -> Vec<Sample> {
        let addr = self.server.metrics_addr().expect("metrics on");
        let reply = http_get(addr, "/metrics").await.unwrap();
        assert_eq!(reply.status, StatusCode::OK);
        assert!(reply.content_type.starts_with("text/plain; version=0.0.4"));
        parse_prometheus(&reply.text()).unwrap_or_else(|e| panic!("{e}\n{}", reply.text()))
    }

    /// A raw TLS stream, for requests the HTTP client would not send.
    async fn raw(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let tcp = tokio::net::TcpStream::connect(self.server.tls_addr())
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::IpAddress(self.server.tls_addr().ip().into());
        tokio_rustls::TlsConnector::from(self.client.clone())
            .connect(name, tcp)
            .await
            .unwrap()
    }
}

fn args(cert: &std::path::Path, key: &std::path::Path, extra: &[&str]) -> Args {
    let mut argv: Vec<String> = [
        "etcd-webhook",
        "--bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
        "--health-probe-bind-address",
        "127.0.0.1:0",
        "--cert-reload-interval",
        "50ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.push(format!("--tls-cert-file={}", cert.display()));
    argv.push(format!("--tls-private-key-file={}", key.display()));
    argv.extend(extra.iter().map(|s| s.to_string()));
    Args::try_parse_from(argv).expect("flags parse")
}

/// A durable spec that draws no warnings, plus `extra` fields.
fn quiet(extra: Value) -> Value {
    let mut spec = json!({
        "pod": {"persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "1Gi"}}}}
    });
    merge(&mut spec, extra);
    spec
}

fn merge(into: &mut Value, from: Value) {
    match (into, from) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

fn with_current_version(mut object: Value, v: &str) -> Value {
    object["status"] = json!({"currentVersion": v});
    object
}

/// How a case must be answered.
enum Want {
    /// Allowed with exactly these warnings (substrings, in order; empty: none).
    Allowed(&'static [&'static str]),
    /// Refused by `rule` with a message containing the text.
    Refused(&'static str, &'static str),
}

struct Case {
    what: &'static str,
    name: &'static str,
    spec: Value,
    old: Option<Value>,
    want: Want,
}

fn case(what: &'static str, spec: Value, want: Want) -> Case {
    Case {
        what,
        name: "demo",
        spec,
        old: None,
        want,
    }
}

fn update(what: &'static str, old: Value, new: Value, want: Want) -> Case {
    Case {
        what,
        name: "demo",
        spec: new,
        old: Some(old),
        want,
    }
}

fn claim(class: &str, size: &str) -> Value {
    json!({"pod": {"persistentVolumeClaimSpec": {"storageClassName": class, "resources": {"requests": {"storage": size}}}}})
}

fn rule_cases() -> Vec<Case> {
    let long_name: &'static str = Box::leak("a".repeat(57).into_boxed_str());
    let v = |version: &str| quiet(json!({ "version": version }));
    vec![
        // size
        case("size 3", quiet(json!({"size": 3})), Want::Allowed(&[])),
        case(
            "size 0",
            quiet(json!({"size": 0})),
            Want::Refused("size-range", "spec.size: must be between 1 and 7, got 0"),
        ),
        case(
            "size 8",
            quiet(json!({"size": 8})),
            Want::Refused("size-range", "spec.size: must be between 1 and 7, got 8"),
        ),
        case(
            "size 4",
            quiet(json!({"size": 4})),
            Want::Allowed(&["spec.size: 4 members tolerate no more failures than 3"]),
        ),
        case(
            "size 1",
            quiet(json!({"size": 1})),
            Want::Allowed(&["spec.size: 1 member has no fault tolerance"]),
        ),
        // version syntax, range, end of life
        case("version 3.6.16", v("3.6.16"), Want::Allowed(&[])),
        case("version v3.6.16", v("v3.6.16"), Want::Allowed(&[])),
        case(
            "version 3.6",
            v("3.6"),
            Want::Refused(
                "version-syntax",
                "spec.version: must be a released etcd version MAJOR.MINOR.PATCH",
            ),
        ),
        case(
            "version latest",
            v("latest"),
            Want::Refused("version-syntax", "got \"latest\""),
        ),
        case(
            "version 3.8.0",
            v("3.8.0"),
            Want::Refused(
                "version-unsupported",
                "spec.version: 3.8.0 is a line the operator does not know; supported versions are 3.2.0 to 3.7.x",
            ),
        ),
        case(
            "version 3.1.20",
            v("3.1.20"),
            Want::Refused("version-unsupported", "is older than the operator supports"),
        ),
        case(
            "version 3.2.13 (end of life)",
            v("3.2.13"),
            Want::Allowed(&["spec.version: etcd 3.2 is end of life and gets no fixes"]),
        ),
        // upgrades
        update(
            "upgrade 3.5.35 -> 3.6.16",
            v("3.5.35"),
            v("3.6.16"),
            Want::Allowed(&[]),
        ),
        update(
            "patch downgrade 3.6.16 -> 3.6.14",
            v("3.6.16"),
            v("3.6.14"),
            Want::Allowed(&[]),
        ),
        update(
            "patch downgrade 3.6.16 -> 3.6.12, below the security minimum",
            v("3.6.16"),
            v("3.6.12"),
            Want::Allowed(&["spec.version: etcd 3.6.12 has known security vulnerabilities"]),
        ),
        update(
            "upgrade skipping a line",
            v("3.5.35"),
            v("3.7.3"),
            Want::Refused(
                "version-skip",
                "spec.version: cannot move from 3.5.35 to 3.7.3: etcd upgrades one minor line at a time; move to 3.6.x first",
            ),
        ),
        update(
            "minor downgrade",
            v("3.6.16"),
            v("3.5.35"),
            Want::Refused(
                "version-downgrade",
                "spec.version: cannot move from 3.6.16 back to 3.5.35",
            ),
        ),
        update(
            "upgrade below the prerequisite patch",
            v("3.5.20"),
            v("3.6.16"),
            Want::Refused(
                "version-prerequisite",
                "requires every 3.5 member to run 3.5.26 or later first",
            ),
        ),
        Case {
            what: "second minor move while an upgrade runs",
            name: "demo",
            spec: v("3.7.3"),
            old: Some(with_current_version(cluster("demo", v("3.6.16")), "3.5.35")),
            want: Want::Refused(
                "version-upgrade-in-progress",
                "cannot move to 3.7.3 while the members still run 3.5.35",
            ),
        },
        update(
            "major change",
            v("3.6.16"),
            v("4.0.0"),
            Want::Refused("version-unsupported", "4.0.0"),
        ),
        // immutable storage
        update(
            "claim grows",
            claim("fast", "1Gi"),
            claim("fast", "2Gi"),
            Want::Allowed(&[]),
        ),
        update(
            "storage class change",
            claim("fast", "1Gi"),
            claim("slow", "1Gi"),
            Want::Refused(
                "immutable-storage-class",
                "spec.pod.persistentVolumeClaimSpec.storageClassName: cannot change from \"fast\" to \"slow\"",
            ),
        ),
        update(
            "claim shrinks",
            claim("fast", "1Gi"),
            claim("fast", "512Mi"),
            Want::Refused("immutable-claim-shrink", "cannot shrink from 1Gi to 512Mi"),
        ),
        update(
            "emptyDir to claim",
            json!({"size": 3}),
            claim("fast", "1Gi"),
            Want::Refused(
                "immutable-storage-kind",
                "cannot change from an emptyDir to a persistent claim",
            ),
        ),
        update(
            "emptyDir medium change",
            json!({"size": 3}),
            json!({"pod": {"storageMedium": "Memory"}}),
            Want::Refused(
                "immutable-storage-medium",
                "spec.pod.storageMedium: cannot change from \"\" to \"Memory\"",
            ),
        ),
        // immutable TLS and domain
        // Plain to TLS is a rolling switch; TLS back to plain is refused.
        update(
            "peer TLS turned on",
            quiet(json!({})),
            quiet(json!({"TLS": {"static": {"member": {"peerSecret": "peer"}}}})),
            Want::Allowed(&[]),
        ),
        update(
            "peer TLS turned off",
            quiet(json!({"TLS": {"static": {"member": {"peerSecret": "peer"}}}})),
            quiet(json!({})),
            Want::Refused(
                "immutable-tls-mode",
                "spec.TLS.static.member.peerSecret: peer traffic cannot switch from TLS to plain HTTP",
            ),
        ),
        // Other Secrets are a switch of the certificates' source: taken once the operator
        // recorded what the members use (status.tls; these stored objects have no status).
        update(
            "peer secret rotated",
            quiet(json!({"TLS": {"static": {"member": {"peerSecret": "peer"}}}})),
            quiet(json!({"TLS": {"static": {"member": {"peerSecret": "peer-2"}}}})),
            Want::Refused(
                "tls-switch-in-progress",
                "spec.TLS: the operator has not recorded yet which certificate Secrets the members use (status.tls)",
            ),
        ),
        update(
            "cluster domain change",
            quiet(json!({})),
            quiet(json!({"pod": {"ClusterDomain": "corp.local"}})),
            Want::Refused(
                "immutable-cluster-domain",
                "spec.pod.ClusterDomain: cannot change on a running cluster",
            ),
        ),
        // name
        Case {
            what: "name of 57 characters",
            name: long_name,
            spec: quiet(json!({})),
            old: None,
            want: Want::Refused(
                "name-length",
                "metadata.name: must be at most 56 characters",
            ),
        },
        Case {
            what: "name not a DNS-1035 label",
            name: "1etcd",
            spec: quiet(json!({})),
            old: None,
            want: Want::Refused("name-syntax", "metadata.name: must be a DNS-1035 label"),
        },
        // environment
        case(
            "tuning env",
            quiet(
                json!({"pod": {"etcdEnv": [{"name": "ETCD_QUOTA_BACKEND_BYTES", "value": "4294967296"}]}}),
            ),
            Want::Allowed(&[]),
        ),
        case(
            "reserved env",
            quiet(json!({"pod": {"etcdEnv": [{"name": "ETCD_NAME", "value": "x"}]}})),
            Want::Refused(
                "env-reserved",
                "spec.pod.etcdEnv[0].name: ETCD_NAME is set by the operator",
            ),
        ),
        case(
            "v2 variable on 3.6: etcd ignores it",
            quiet(json!({"pod": {"etcdEnv": [{"name": "ETCD_ENABLE_V2", "value": "true"}]}})),
            Want::Allowed(&["spec.pod.etcdEnv[0].name: ETCD_ENABLE_V2 is ignored by etcd 3.6"]),
        ),
        // resources
        case(
            "requests within limits",
            quiet(
                json!({"pod": {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}}}),
            ),
            Want::Allowed(&[]),
        ),
        case(
            "request above limit",
            quiet(
                json!({"pod": {"resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}}}),
            ),
            Want::Refused(
                "request-above-limit",
                "spec.pod.resources.requests.cpu: request 2 is above the limit 1500m",
            ),
        ),
        case(
            "quantity syntax",
            quiet(json!({"pod": {"resources": {"requests": {"memory": "lots"}}}})),
            Want::Refused("resource-syntax", "spec.pod.resources.requests.memory"),
        ),
        // labels
        case(
            "own labels",
            quiet(json!({"pod": {"labels": {"team": "storage"}}})),
            Want::Allowed(&[]),
        ),
        case(
            "reserved label",
            quiet(json!({"pod": {"labels": {"app": "x"}}})),
            Want::Refused(
                "reserved-label",
                "spec.pod.labels[app]: is reserved for the operator",
            ),
        ),
        case(
            "label value syntax",
            quiet(json!({"pod": {"labels": {"team": "not ok"}}})),
            Want::Refused(
                "label-syntax",
                "spec.pod.labels[team]: value \"not ok\" is not a valid label value",
            ),
        ),
        // TLS sets
        case(
            "complete TLS",
            quiet(
                json!({"TLS": {"static": {"member": {"peerSecret": "peer", "serverSecret": "server"}, "operatorSecret": "op"}}}),
            ),
            Want::Allowed(&[]),
        ),
        case(
            "server secret without operator secret",
            quiet(json!({"TLS": {"static": {"member": {"serverSecret": "server"}}}})),
            Want::Refused(
                "tls-incomplete",
                "spec.TLS.static.operatorSecret: operatorSecret is required",
            ),
        ),
        case(
            "TLS secret name",
            quiet(json!({"TLS": {"static": {"member": {"peerSecret": "Bad_Name"}}}})),
            Want::Refused("tls-secret-name", "\"Bad_Name\" is not a valid Secret name"),
        ),
        // repository and storage
        case(
            "repository with a tag",
            quiet(json!({"repository": "quay.io/coreos/etcd:v3.5.0"})),
            Want::Refused(
                "repository-tag",
                "spec.repository: must be an image repository without a tag",
            ),
        ),
        case(
            "ephemeral members",
            json!({"size": 3}),
            Want::Allowed(&["spec.pod.persistentVolumeClaimSpec: is not set"]),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rule_family_is_applied_through_the_http_api() {
    let h = Harness::start(&[]).await;
    let mut conn = h.conn().await;
    let mut refused_rules: Vec<&str> = Vec::new();
    for (i, c) in rule_cases().into_iter().enumerate() {
        let object = cluster(c.name, c.spec);
        let (operation, old) = match c.old {
            None => ("CREATE", Value::Null),
            Some(old) if old.get("apiVersion").is_some() => ("UPDATE", old),
            Some(old_spec) => ("UPDATE", cluster(c.name, old_spec)),
        };
        let uid = format!("uid-{i}");
        let resp = conn
            .review("/validate", &review(&uid, operation, object, old))
            .await;
        match c.want {
            Want::Allowed(warnings) => {
                assert_eq!(resp["allowed"], true, "{}: {resp:#}", c.what);
                let got: Vec<String> = resp["warnings"]
                    .as_array()
                    .map(|w| w.iter().map(|s| s.as_str().unwrap().to_string()).collect())
                    .unwrap_or_default();
                assert_eq!(got.len(), warnings.len(), "{}: warnings {got:#?}", c.what);
                for (g, w) in got.iter().zip(warnings) {
                    assert!(g.contains(w), "{}: warning {g:?} lacks {w:?}", c.what);
                }
            }
            Want::Refused(rule, text) => {
                assert_eq!(resp["allowed"], false, "{}: {resp:#}", c.what);
                let status = &resp["status"];
                let message = status["message"].as_str().unwrap();
                assert!(
                    message.contains(text),
                    "{}: message {message:?} lacks {text:?}",
                    c.what
                );
                assert_eq!(status["status"], "Failure", "{}", c.what);
                assert_eq!(status["code"], 422, "{}", c.what);
                assert_eq!(status["reason"], "Invalid", "{}", c.what);
                let field = message.split(": ").next().unwrap();
                let causes = status["details"]["causes"].as_array().unwrap();
                assert!(
                    causes.iter().any(|c| c["field"] == field),
                    "{}: no cause for {field}: {causes:#?}",
                    c.what
                );
                refused_rules.push(rule);
            }
        }
    }
    // Every refusal was counted under its rule.
    let samples = h.metrics().await;
    for rule in &refused_rules {
        let want = refused_rules.iter().filter(|r| *r == rule).count() as f64;
        assert_eq!(
            metric(&samples, "etcd_webhook_refusals_total", &[("rule", rule)]),
            want,
            "rule {rule}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_violation_is_reported_in_one_message() {
    let h = Harness::start(&[]).await;
    let mut conn = h.conn().await;
    let object = cluster(
        "demo",
        json!({"size": 9, "version": "latest", "repository": "etcd:v3"}),
    );
    let resp = conn
        .review("/validate", &review("u", "CREATE", object, Value::Null))
        .await;
    let message = resp["status"]["message"].as_str().unwrap();
    assert_eq!(message.split("; ").count(), 3, "{message}");
    assert!(message.starts_with("spec.size: must be between 1 and 7, got 9; spec.version:"));
    assert_eq!(
        resp["status"]["details"]["causes"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

/// Decodes the answer's patch, checks it is a JSONPatch, applies it to `object` and returns
/// the result and the patch.
fn apply(resp: &Value, object: &Value) -> (Value, Value) {
    assert_eq!(resp["allowed"], true, "{resp:#}");
    assert_eq!(resp["patchType"], "JSONPatch");
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(resp["patch"].as_str().expect("patch is a base64 string"))
        .unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let mut patched = object.clone();
    json_patch::patch(&mut patched, &patch).unwrap();
    (patched, serde_json::from_slice(&bytes).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutate_patches_only_what_is_missing() {
    let h = Harness::start(&[]).await;
    let mut conn = h.conn().await;
    let defaults = json!({"size": 3, "version": "3.6.16", "repository": "quay.io/coreos/etcd"});
    let no_spec = cluster("demo", Value::Null);
    let mut null_spec = cluster("demo", Value::Null);
    null_spec["spec"] = Value::Null;
    let future_field = json!({"size": 5, "x-future": {"nested": [1, 2]}, "paused": false});
    // (what, object, expected object)
    let cases: Vec<(&str, Value, Value)> = vec![
        (
            "everything missing",
            cluster("demo", json!({"paused": true})),
            cluster(
                "demo",
                json!({"paused": true, "size": 3, "version": "3.6.16", "repository": "quay.io/coreos/etcd"}),
            ),
        ),
        (
            "size missing",
            cluster(
                "demo",
                json!({"version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"}),
            ),
            cluster(
                "demo",
                json!({"size": 3, "version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"}),
            ),
        ),
        (
            "leading v removed",
            cluster(
                "demo",
                json!({"size": 1, "version": "v3.5.35", "repository": "r.example/etcd"}),
            ),
            cluster(
                "demo",
                json!({"size": 1, "version": "3.5.35", "repository": "r.example/etcd"}),
            ),
        ),
        (
            "empty repository",
            cluster(
                "demo",
                json!({"size": 1, "version": "3.5.35", "repository": ""}),
            ),
            cluster(
                "demo",
                json!({"size": 1, "version": "3.5.35", "repository": "quay.io/coreos/etcd"}),
            ),
        ),
        (
            "no spec",
            no_spec.clone(),
            cluster("demo", defaults.clone()),
        ),
        ("spec: null", null_spec, cluster("demo", defaults.clone())),
        (
            "unknown fields and explicit defaults kept",
            cluster("demo", future_field.clone()),
            cluster("demo", {
                let mut s = future_field.clone();
                merge(
                    &mut s,
                    json!({"version": "3.6.16", "repository": "quay.io/coreos/etcd"}),
                );
                s
            }),
        ),
    ];
    for (i, (what, object, expected)) in cases.into_iter().enumerate() {
        for operation in ["CREATE", "UPDATE"] {
            let old = if operation == "UPDATE" {
                cluster("demo", json!({"size": 3}))
            } else {
                Value::Null
            };
            let resp = conn
                .review(
                    "/mutate",
                    &review(&format!("m-{i}"), operation, object.clone(), old),
                )
                .await;
            let (patched, patch) = apply(&resp, &object);
            assert_eq!(patched, expected, "{what} ({operation}): patch {patch:#}");
            for op in patch.as_array().unwrap() {
                let path = op["path"].as_str().unwrap();
                assert!(
                    path.starts_with("/spec"),
                    "{what}: {op} touches more than spec"
                );
            }
            assert!(resp.get("warnings").is_none());
        }
    }
    // On UPDATE a dropped field keeps the stored value: removing the version starts no upgrade.
    let stored = cluster(
        "demo",
        json!({"size": 5, "version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"}),
    );
    let dropped = cluster("demo", json!({"paused": true}));
    let resp = conn
        .review(
            "/mutate",
            &review("keep", "UPDATE", dropped.clone(), stored),
        )
        .await;
    let (patched, _) = apply(&resp, &dropped);
    assert_eq!(
        patched,
        cluster(
            "demo",
            json!({"paused": true, "size": 5, "version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"})
        )
    );

    // The missing spec is added whole, not field by field.
    let resp = conn
        .review(
            "/mutate",
            &review("whole", "CREATE", no_spec.clone(), Value::Null),
        )
        .await;
    let (_, patch) = apply(&resp, &no_spec);
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec", "value": defaults}])
    );

    // Nothing missing: no patch at all.
    let complete = cluster(
        "demo",
        json!({"size": 3, "version": "3.6.16", "repository": "quay.io/coreos/etcd", "x-future": 1}),
    );
    let resp = conn
        .review("/mutate", &review("none", "CREATE", complete, Value::Null))
        .await;
    assert_eq!(resp["allowed"], true);
    assert!(resp.get("patch").is_none(), "{resp:#}");
    assert!(resp.get("patchType").is_none(), "{resp:#}");

    // Defaulting then validating the result never refuses what defaulting filled in.
    let object = cluster("demo", quiet(json!({})));
    let resp = conn
        .review(
            "/mutate",
            &review("d", "CREATE", object.clone(), Value::Null),
        )
        .await;
    let (patched, _) = apply(&resp, &object);
    let resp = conn
        .review("/validate", &review("v", "CREATE", patched, Value::Null))
        .await;
    assert_eq!(resp["allowed"], true, "{resp:#}");
    assert!(resp.get("warnings").is_none(), "{resp:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn defaults_come_from_the_flags() {
    let h = Harness::start(&[
        "--default-version=v3.5.35",
        "--default-repository=gcr.io/etcd-development/etcd",
    ])
    .await;
    let mut conn = h.conn().await;
    let object = cluster("demo", json!({"size": 1}));
    let resp = conn
        .review(
            "/mutate",
            &review("f", "CREATE", object.clone(), Value::Null),
        )
        .await;
    let (patched, _) = apply(&resp, &object);
    assert_eq!(
        patched["spec"],
        json!({"size": 1, "version": "3.5.35", "repository": "gcr.io/etcd-development/etcd"})
    );

    // Defaults that break the rules are refused at startup.
    let dir = tempfile::tempdir().unwrap();
    let pair = Ca::new().issue(7);
    let (cert, key) = write_pair(dir.path(), &pair);
    for (flag, want) in [
        ("--default-version=3.9.0", "invalid --default-version"),
        ("--default-version=latest", "invalid --default-version"),
        (
            "--default-repository=quay.io/coreos/etcd:v3",
            "invalid --default-repository",
        ),
    ] {
        let e = etcd_webhook::server::start(&args(&cert, &key, &[flag]), Shutdown::new())
            .await
            .expect_err(flag);
        assert!(e.to_string().starts_with(want), "{flag}: {e}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_requests_get_clear_answers() {
    let h = Harness::start(&[]).await;
    let mut conn = h.conn().await;

    // DELETE and CONNECT are allowed without looking at the object.
    for operation in ["DELETE", "CONNECT"] {
        let r = review(
            "del",
            operation,
            Value::Null,
            cluster("demo", json!({"size": 0})),
        );
        for path in ["/validate", "/mutate"] {
            let resp = conn.review(path, &r).await;
            assert_eq!(resp["allowed"], true, "{operation} {path}");
            assert!(resp.get("patch").is_none());
        }
    }

    // A dry run is answered exactly like the real request.
    let object = cluster("demo", json!({"size": 0}));
    let real = review("dry", "CREATE", object.clone(), Value::Null);
    let mut dry = real.clone();
    dry["request"]["dryRun"] = json!(true);
    assert_eq!(
        conn.review("/validate", &real).await,
        conn.review("/validate", &dry).await
    );
    assert_eq!(
        conn.review("/mutate", &real).await,
        conn.review("/mutate", &dry).await
    );

    // Another kind is refused, naming what this webhook handles.
    let mut pod = review(
        "pod",
        "CREATE",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}),
        Value::Null,
    );
    pod["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Pod"});
    for path in ["/validate", "/mutate"] {
        let resp = conn.review(path, &pod).await;
        assert_eq!(resp["allowed"], false);
        assert_eq!(
            resp["status"]["message"],
            "this webhook only handles etcd.database.coreos.com/v1beta2 EtcdCluster, EtcdBackup and EtcdRestore (and the Scale of etcdclusters), got v1 Pod"
        );
        assert_eq!(resp["status"]["code"], 400);
    }
    let mut deploy = pod.clone();
    deploy["request"]["kind"] = json!({"group": "apps", "version": "v1", "kind": "Deployment"});
    let resp = conn.review("/validate", &deploy).await;
    assert!(
        resp["status"]["message"]
            .as_str()
            .unwrap()
            .ends_with("got apps/v1 Deployment")
    );

    // An object that is not an EtcdCluster is refused with the decoder's words and path.
    for path in ["/validate", "/mutate"] {
        let bad = cluster("demo", json!({"size": "three"}));
        let resp = conn
            .review(path, &review("three", "CREATE", bad, Value::Null))
            .await;
        assert_eq!(resp["allowed"], false);
        assert_eq!(
            resp["status"]["message"],
            "the object is not a valid EtcdCluster: spec.size: invalid type: string \"three\", expected i32"
        );
        assert_eq!(resp["status"]["details"]["causes"][0]["field"], "spec.size");
    }

    // An unreadable stored object does not block updates: the update rules are skipped, with
    // a warning.
    let resp = conn
        .review(
            "/validate",
            &review(
                "old",
                "UPDATE",
                cluster("demo", quiet(json!({}))),
                cluster("demo", json!({"size": "three"})),
            ),
        )
        .await;
    assert_eq!(resp["allowed"], true);
    assert!(
        resp["warnings"][0]
            .as_str()
            .unwrap()
            .contains("the update rules were not checked")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_http_errors() {
    let h = Harness::start(&["--max-request-body-size=64Ki", "--request-timeout=300ms"]).await;
    let mut conn = h.conn().await;
    let good = serde_json::to_vec(&review(
        "g",
        "CREATE",
        cluster("demo", json!({})),
        Value::Null,
    ))
    .unwrap();

    // (what, path, content type, body, status, text of the answer)
    type BadCase<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Vec<u8>,
        StatusCode,
        &'a str,
    );
    let cases: Vec<BadCase> = vec![
        (
            "not JSON",
            "/validate",
            Some("application/json"),
            b"{nope".to_vec(),
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
        ),
        (
            "empty body",
            "/mutate",
            Some("application/json"),
            Vec::new(),
            StatusCode::BAD_REQUEST,
            "request body is not JSON",
        ),
        (
            "JSON but no review",
            "/validate",
            Some("application/json"),
            b"{\"hello\": 1}".to_vec(),
            StatusCode::BAD_REQUEST,
            "request body is not an AdmissionReview",
        ),
        (
            "array",
            "/validate",
            Some("application/json"),
            b"[1,2]".to_vec(),
            StatusCode::BAD_REQUEST,
            "request body is not an AdmissionReview",
        ),
        (
            "no request",
            "/validate",
            Some("application/json"),
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            StatusCode::BAD_REQUEST,
            "the AdmissionReview has no request",
        ),
        (
            "v1beta1",
            "/validate",
            Some("application/json"),
            br#"{"apiVersion":"admission.k8s.io/v1beta1","kind":"AdmissionReview","request":{}}"#
                .to_vec(),
            StatusCode::BAD_REQUEST,
            "only admission.k8s.io/v1 AdmissionReview is supported",
        ),
        (
            "text/plain",
            "/validate",
            Some("text/plain"),
            good.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content type must be application/json, got \"text/plain\"",
        ),
        (
            "no content type",
            "/mutate",
            None,
            good.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "content type must be application/json",
        ),
        (
            "unknown path",
            "/admit",
            Some("application/json"),
            good.clone(),
            StatusCode::NOT_FOUND,
            "not found",
        ),
    ];
    for (what, path, ct, body, status, text) in cases {
        let reply = conn.post_raw(path, ct, body).await.unwrap();
        assert_eq!(reply.status, status, "{what}: {}", reply.text());
        assert!(reply.text().contains(text), "{what}: {:?}", reply.text());
    }
    // A parameter on the media type is fine.
    let reply = conn
        .post_raw(
            "/validate",
            Some("application/json; charset=utf-8"),
            good.clone(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);
    // A v1beta1 review with a usable request is refused for its version.
    let mut beta: Value = serde_json::from_slice(&good).unwrap();
    beta["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let reply = conn
        .post_raw(
            "/validate",
            Some("application/json"),
            serde_json::to_vec(&beta).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply
            .text()
            .contains("only admission.k8s.io/v1 AdmissionReview is supported"),
        "{}",
        reply.text()
    );
    // GET on an endpoint is 405.
    let reply = conn
        .send(
            hyper::Request::get(format!("https://{}/validate", h.server.tls_addr()))
                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::METHOD_NOT_ALLOWED);

    // A declared length over the limit is refused before the body is read (the server then
    // closes the connection, as the body is not drained).
    let mut raw = h.raw().await;
    raw.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 102400\r\n\r\n").await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(
        answer.contains("request body is larger than the limit of 65536 bytes"),
        "{answer}"
    );

    // A chunked body without a length is cut off at the limit too.
    let mut raw = h.raw().await;
    let chunk = vec![b' '; 16 * 1024];
    raw.write_all(b"POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n").await.unwrap();
    for _ in 0..6 {
        raw.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await
            .unwrap();
        raw.write_all(&chunk).await.unwrap();
        raw.write_all(b"\r\n").await.unwrap();
    }
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");

    // A body that never completes gets 408 once the request timeout passes.
    let mut raw = h.raw().await;
    raw.write_all(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\nConnection: close\r\n\r\n{\"apiVersion\"").await.unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer)).await;
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // The connection used above still works: errors do not break keep-alive.
    let reply = conn
        .post_raw("/validate", Some("application/json"), good)
        .await
        .unwrap();
    assert_eq!(reply.status, StatusCode::OK);

    // Every error was counted as one.
    let samples = h.metrics().await;
    let errors = metric(
        &samples,
        "etcd_webhook_requests_total",
        &[("result", "error")],
    );
    assert_eq!(
        errors, 12.0,
        "9 bad bodies, the v1beta1 review, the chunked 413 and the 408 (404 and 405 are not admission requests)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_offers_h2_and_http1_on_tls12_and_tls13_without_sni() {
    let h = Harness::start(&[]).await;
    let object = cluster("demo", json!({"size": 0}));
    for (alpn, versions, want_alpn, want_version) in [
        (
            &[&b"h2"[..], b"http/1.1"][..],
            &[&rustls::version::TLS13][..],
            Some(&b"h2"[..]),
            rustls::ProtocolVersion::TLSv1_3,
        ),
        (
            &[&b"http/1.1"[..]][..],
            &[&rustls::version::TLS12][..],
            Some(&b"http/1.1"[..]),
            rustls::ProtocolVersion::TLSv1_2,
        ),
        (
            &[][..],
            &[&rustls::version::TLS13][..],
            None,
            rustls::ProtocolVersion::TLSv1_3,
        ),
    ] {
        let config = client_config(&h.ca.cert_pem, alpn, versions);
        let mut conn = Conn::connect(h.server.tls_addr(), config).await.unwrap();
        assert_eq!(conn.alpn.as_deref(), want_alpn);
        assert_eq!(conn.version, Some(want_version));
        assert_eq!(conn.peer_serial, h.serial);
        let resp = conn
            .review(
                "/validate",
                &review("t", "CREATE", object.clone(), Value::Null),
            )
            .await;
        assert_eq!(resp["allowed"], false);
    }
    // A client that does send a server name gets the same certificate.
    let config = client_config(&h.ca.cert_pem, &[b"http/1.1"], &[&rustls::version::TLS13]);
    let tcp = tokio::net::TcpStream::connect(h.server.tls_addr())
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    assert!(tls.get_ref().1.peer_certificates().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_answer() {
    let h = Harness::start(&[]).await;
    let probes = h.server.probe_addr().unwrap();
    assert!(h.server.is_ready());
    let reply = http_get(probes, "/readyz").await.unwrap();
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (StatusCode::OK, "ok\n")
    );
    let reply = http_get(probes, "/healthz").await.unwrap();
    assert_eq!(
        (reply.status, reply.text().as_str()),
        (StatusCode::OK, "ok\n")
    );
    assert_eq!(
        http_get(probes, "/metrics").await.unwrap().status,
        StatusCode::NOT_FOUND
    );
    let metrics = h.server.metrics_addr().unwrap();
    assert_eq!(
        http_get(metrics, "/readyz").await.unwrap().status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_happened() {
    let h = Harness::start(&[]).await;
    let mut conn = h.conn().await;
    let refused = cluster("demo", json!({"size": 0, "version": "latest"}));
    let allowed = cluster("demo", quiet(json!({})));
    for _ in 0..3 {
        conn.review(
            "/validate",
            &review("a", "CREATE", allowed.clone(), Value::Null),
        )
        .await;
    }
    for _ in 0..2 {
        conn.review(
            "/validate",
            &review("r", "UPDATE", refused.clone(), allowed.clone()),
        )
        .await;
    }
    conn.review(
        "/mutate",
        &review("m", "CREATE", allowed.clone(), Value::Null),
    )
    .await;
    let mut del = review("d", "DELETE", Value::Null, Value::Null);
    del["request"]["oldObject"] = allowed.clone();
    conn.review("/mutate", &del).await;
    conn.post_raw("/validate", Some("application/json"), "nope")
        .await
        .unwrap();

    let samples = h.metrics().await;
    let count = |endpoint: &str, operation: &str, result: &str| {
        metric(
            &samples,
            "etcd_webhook_requests_total",
            &[
                ("endpoint", endpoint),
                ("operation", operation),
                ("result", result),
            ],
        )
    };
    assert_eq!(count("validate", "CREATE", "allowed"), 3.0);
    assert_eq!(count("validate", "UPDATE", "denied"), 2.0);
    assert_eq!(count("mutate", "CREATE", "allowed"), 1.0);
    assert_eq!(count("mutate", "DELETE", "allowed"), 1.0);
    assert_eq!(count("validate", "unknown", "error"), 1.0);
    assert_eq!(
        metric(
            &samples,
            "etcd_webhook_refusals_total",
            &[("rule", "size-range")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &samples,
            "etcd_webhook_refusals_total",
            &[("rule", "version-syntax")]
        ),
        2.0
    );
    assert_eq!(
        metric(
            &samples,
            "etcd_webhook_request_duration_seconds_count",
            &[("endpoint", "validate")]
        ),
        6.0
    );
    assert_eq!(
        metric(
            &samples,
            "etcd_webhook_request_duration_seconds_count",
            &[("endpoint", "mutate")]
        ),
        2.0
    );
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == "etcd_webhook_request_duration_seconds_bucket"
                && s.labels["endpoint"] == "validate"
        })
        .collect();
    assert!(
        buckets.iter().any(|b| b.labels["le"] == "0.0001"),
        "sub-millisecond buckets"
    );
    assert_eq!(buckets.last().unwrap().labels["le"], "+Inf");
    assert_eq!(buckets.last().unwrap().value, 6.0);
    assert_eq!(
        metric(&samples, "etcd_webhook_requests_in_flight", &[]),
        0.0
    );
    assert_eq!(
        metric(&samples, "etcd_webhook_certificate_reloads_total", &[]),
        0.0
    );
    assert_eq!(
        metric(
            &samples,
            "etcd_webhook_certificate_reload_failures_total",
            &[]
        ),
        0.0
    );
    let expiry = metric(
        &samples,
        "etcd_webhook_certificate_expiry_timestamp_seconds",
        &[],
    );
    let pem = std::fs::read(&h.cert).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    assert_eq!(expiry, cert.validity().not_after.timestamp() as f64);
}

/// Requests on keep-alive connections (and on new ones) until `stop`, counting failures.
fn load_loop(
    addr: std::net::SocketAddr,
    client: Arc<rustls::ClientConfig>,
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    fresh_connections: bool,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let body = review(
            "loop",
            "CREATE",
            cluster("demo", quiet(json!({}))),
            Value::Null,
        );
        let body = serde_json::to_vec(&body).unwrap();
        let mut conn = Conn::connect(addr, client.clone()).await.unwrap();
        while !stop.load(Ordering::Relaxed) {
            if fresh_connections {
                match Conn::connect(addr, client.clone()).await {
                    Ok(c) => conn = c,
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                }
            }
            match conn
                .post_raw("/validate", Some("application/json"), body.clone())
                .await
            {
                Ok(r) if r.status == StatusCode::OK => ok.fetch_add(1, Ordering::Relaxed),
                _ => failed.fetch_add(1, Ordering::Relaxed),
            };
        }
    })
}

async fn wait_for_serial(h: &Harness, serial: &str) -> Duration {
    let started = Instant::now();
    loop {
        let conn = h.conn().await;
        if conn.peer_serial == serial {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "certificate {serial} never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn reload_counts(h: &Harness) -> (f64, f64) {
    let s = h.metrics().await;
    (
        metric(&s, "etcd_webhook_certificate_reloads_total", &[]),
        metric(&s, "etcd_webhook_certificate_reload_failures_total", &[]),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_rotate_without_failing_requests() {
    // Kubelet layout: tls.crt -> ..data/tls.crt, ..data -> ..v1.
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let first = ca.issue(100);
    let (cert, key) = kubelet_swap(dir.path(), 1, &first);
    let h = Harness::start_with(dir, ca, cert, key, first.serial.clone(), &[]).await;
    assert_eq!(h.conn().await.peer_serial, first.serial);

    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let loops: Vec<_> = [false, false, true]
        .into_iter()
        .map(|fresh| {
            load_loop(
                h.server.tls_addr(),
                h.client.clone(),
                stop.clone(),
                ok.clone(),
                failed.clone(),
                fresh,
            )
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;

    // 1. The kubelet swaps ..data to a new version directory.
    let second = h.ca.issue(200);
    kubelet_swap(h.dir.path(), 2, &second);
    wait_for_serial(&h, &second.serial).await;
    assert_eq!(reload_counts(&h).await, (1.0, 0.0));

    // 2. Plain files replaced in place (rename over, as most tools write).
    let plain = tempfile::tempdir_in(h.dir.path()).unwrap();
    let third = h.ca.issue(300);
    let (c3, k3) = write_pair(plain.path(), &third);
    std::fs::rename(&k3, h.dir.path().join("tls.key")).unwrap();
    std::fs::rename(&c3, h.dir.path().join("tls.crt")).unwrap();
    wait_for_serial(&h, &third.serial).await;
    let (reloads, _) = reload_counts(&h).await;
    assert_eq!(reloads, 2.0);

    // 3. A broken pair (a key of another certificate) is counted and the old pair kept.
    let (_, failures_before) = reload_counts(&h).await;
    let fourth = h.ca.issue(400);
    let other = h.ca.issue(401);
    let tmp = h.dir.path().join("tmp");
    std::fs::write(&tmp, &other.key_pem).unwrap();
    std::fs::rename(&tmp, h.dir.path().join("tls.key")).unwrap();
    let started = Instant::now();
    while reload_counts(&h).await.1 < failures_before + 1.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "failure never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        reload_counts(&h).await,
        (2.0, failures_before + 1.0),
        "counted once, not at every poll"
    );
    assert_eq!(h.conn().await.peer_serial, third.serial, "old pair kept");

    // 4. Garbage in the certificate file: also refused.
    std::fs::write(&tmp, "not a certificate").unwrap();
    std::fs::rename(&tmp, h.dir.path().join("tls.crt")).unwrap();
    let started = Instant::now();
    while reload_counts(&h).await.1 < failures_before + 2.0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "failure never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(h.conn().await.peer_serial, third.serial);

    // 5. Fixed: the matching key arrives and the pair is used.
    std::fs::write(&tmp, &fourth.key_pem).unwrap();
    std::fs::rename(&tmp, h.dir.path().join("tls.key")).unwrap();
    std::fs::write(&tmp, &fourth.cert_pem).unwrap();
    std::fs::rename(&tmp, h.dir.path().join("tls.crt")).unwrap();
    wait_for_serial(&h, &fourth.serial).await;

    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert_eq!(
        failed, 0,
        "{failed} requests failed during rotation ({ok} succeeded)"
    );
    assert!(ok > 10, "only {ok} requests ran");

    // The expiry gauge follows the certificate in use.
    let s = h.metrics().await;
    let pem = fourth.cert_pem.as_bytes();
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).unwrap();
    let not_after = pem.parse_x509().unwrap().validity().not_after.timestamp() as f64;
    assert_eq!(
        metric(&s, "etcd_webhook_certificate_expiry_timestamp_seconds", &[]),
        not_after
    );
}

/// `pem` (one certificate) with its second base64 line left out: the base64 still decodes (a
/// line is 48 bytes), to a certificate cut short.
fn drop_a_line(pem: &str) -> String {
    let mut lines: Vec<&str> = pem.lines().collect();
    assert!(lines.len() > 4, "{pem}");
    lines.remove(2);
    lines.join("\n") + "\n"
}

/// Waits until the reload-failure counter reaches `want`.
async fn wait_for_failures(h: &Harness, want: f64) {
    let started = Instant::now();
    while reload_counts(h).await.1 < want {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "reload failure {want} never counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_with_a_corrupt_block_is_not_hot_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let first = ca.issue(1);
    let (cert, key) = kubelet_swap(dir.path(), 1, &first);
    let h = Harness::start_with(dir, ca, cert, key, first.serial.clone(), &[]).await;
    assert_eq!(h.conn().await.peer_serial, first.serial);
    assert_eq!(reload_counts(&h).await, (0.0, 0.0));

    // A new leaf with its key, followed by its issuer's certificate cut inside (then by base64
    // of garbage): the leaf parses and the key fits it, only the second block is bad. Both
    // files change in one ..data swap, so no poll sees a half-written pair.
    let second = h.ca.issue(2);
    let chain = |tail: &str| Pair {
        cert_pem: format!("{}{tail}", second.cert_pem),
        ..second.clone()
    };
    let garbage = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::engine::general_purpose::STANDARD.encode("not a certificate")
    );
    for (version, tail) in [(2, drop_a_line(&h.ca.cert_pem)), (3, garbage)] {
        kubelet_swap(h.dir.path(), version, &chain(&tail));
        let failures = f64::from(version - 1);
        wait_for_failures(&h, failures).await;
        assert_eq!(
            reload_counts(&h).await,
            (0.0, failures),
            "refused, not loaded"
        );
        // New handshakes still succeed, with the old certificate, and requests are answered.
        for i in 0..3 {
            let mut conn = h.conn().await;
            assert_eq!(conn.peer_serial, first.serial, "old pair kept");
            let object = cluster("demo", quiet(json!({})));
            let resp = conn
                .review(
                    "/validate",
                    &review(&format!("c{version}-{i}"), "CREATE", object, Value::Null),
                )
                .await;
            assert_eq!(resp["allowed"], true, "{resp}");
        }
    }

    // The same chain with its second block intact is used.
    kubelet_swap(h.dir.path(), 4, &chain(&h.ca.cert_pem));
    wait_for_serial(&h, &second.serial).await;
    assert_eq!(reload_counts(&h).await, (1.0, 2.0));
    let tls = h.raw().await;
    let presented = tls.get_ref().1.peer_certificates().unwrap();
    assert_eq!(presented.len(), 2, "leaf and issuer served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_fails_clearly_without_a_usable_pair() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let a = ca.issue(1);
    let b = ca.issue(2);
    let write = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let cert = write("a.crt", &a.cert_pem);
    let key = write("a.key", &a.key_pem);
    let other_key = write("b.key", &b.key_pem);
    let garbage = write("garbage", "hello");
    let missing = dir.path().join("missing");
    for (cert, key, want) in [
        (&missing, &key, "TLS: cannot read"),
        (&cert, &missing, "TLS: cannot read"),
        (&garbage, &key, "holds no valid PEM certificate"),
        (&cert, &garbage, "holds no valid PEM private key"),
        (&key, &key, "holds no valid PEM certificate"),
        (&cert, &other_key, "does not fit"),
    ] {
        let e = etcd_webhook::server::start(&args(cert, key, &[]), Shutdown::new())
            .await
            .expect_err(want);
        assert!(e.to_string().contains(want), "{e}");
    }
    // The binary exits non-zero with the reason.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_etcd-webhook"))
        .args([
            "--tls-cert-file",
            cert.to_str().unwrap(),
            "--tls-private-key-file",
            other_key.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("does not fit"), "{stderr}");
    // A listener that cannot be bound is reported too.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut a = args(&cert, &key, &[]);
    a.bind_address = addr.parse().unwrap();
    let e = etcd_webhook::server::start(&a, Shutdown::new())
        .await
        .expect_err("port in use");
    assert!(e.to_string().contains("(--bind-address)"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_the_request_in_flight() {
    let h = Harness::start(&[]).await;
    let body = serde_json::to_vec(&review(
        "inflight",
        "CREATE",
        cluster("demo", json!({"size": 0})),
        Value::Null,
    ))
    .unwrap();
    let (head, tail) = body.split_at(body.len() / 2);
    let mut raw = h.raw().await;
    raw.write_all(
        format!(
            "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    raw.write_all(head).await.unwrap();
    raw.flush().await.unwrap();
    // An idle keep-alive connection does not hold the shutdown up.
    let _idle = h.conn().await;
    let started = Instant::now();
    while h.server.metrics().in_flight().get() != 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "request never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    h.server.shutdown();
    let started = Instant::now();
    while tokio::net::TcpStream::connect(h.server.tls_addr())
        .await
        .is_ok()
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "listener still open"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!h.server.is_ready());

    // The request in flight completes.
    raw.write_all(tail).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"uid\":\"inflight\""), "{answer}");
    assert!(answer.contains("spec.size: must be between 1 and 7, got 0"));

    tokio::time::timeout(Duration::from_secs(5), h.server.wait())
        .await
        .expect("stops")
        .expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_logs_json_and_exits_zero_on_sigterm() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let pair = ca.issue(9);
    let (cert, key) = write_pair(dir.path(), &pair);
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_etcd-webhook"))
        .env("ETCD_WEBHOOK_TLS_CERT_FILE", &cert)
        .env("ETCD_WEBHOOK_TLS_PRIVATE_KEY_FILE", &key)
        .env("ETCD_WEBHOOK_LOG_FORMAT", "json")
        .env("ETCD_WEBHOOK_LOG_LEVEL", "info,etcd_webhook=debug")
        .args([
            "--bind-address",
            "127.0.0.1:0",
            "--metrics-bind-address",
            "127.0.0.1:0",
            "--health-probe-bind-address",
            "127.0.0.1:0",
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let serving = loop {
        let line = lines.next().expect("a log line").unwrap();
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        if v["message"] == "etcd-webhook serving" {
            break v;
        }
    };
    let addr: std::net::SocketAddr = serving["admission"].as_str().unwrap().parse().unwrap();
    // The rest of the log is read as it comes (a line larger than the pipe must not block the
    // server before it answers).
    let rest = std::thread::spawn(move || lines.map(|l| l.unwrap()).collect::<Vec<String>>());
    let client = client_config(
        &ca.cert_pem,
        &[b"h2", b"http/1.1"],
        &[&rustls::version::TLS13],
    );
    let mut conn = Conn::connect(addr, client).await.unwrap();
    let resp = conn
        .review(
            "/validate",
            &review(
                "bin",
                "CREATE",
                cluster("demo", json!({"size": 0})),
                Value::Null,
            ),
        )
        .await;
    assert_eq!(resp["allowed"], false);
    // Huge identifiers and a huge label (issue 14, item 6: a 3 MiB label made a 3 MiB log
    // line): refused and logged, every log line short.
    let big = |c: char| c.to_string().repeat(1 << 20);
    let mut huge = review(
        "huge",
        "CREATE",
        cluster(
            "demo",
            json!({"size": 3, "pod": {"labels": {"team": big('v')}}}),
        ),
        Value::Null,
    );
    huge["request"]["name"] = json!(big('n'));
    huge["request"]["namespace"] = json!(big('s'));
    let resp = conn.review("/validate", &huge).await;
    assert_eq!(resp["allowed"], false);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let raw: Vec<String> = rest.join().expect("the log reader");
    for line in &raw {
        assert!(
            line.len() < 8192,
            "a log line of {} bytes: {}",
            line.len(),
            &line[..300]
        );
    }
    let rest: Vec<Value> = raw
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    let messages: Vec<&str> = rest.iter().filter_map(|v| v["message"].as_str()).collect();
    for want in [
        "refused",
        "admission request",
        "shutdown signal received: draining",
        "etcd-webhook stopped",
    ] {
        assert!(messages.contains(&want), "no {want:?} in {messages:?}");
    }
    let refused = rest
        .iter()
        .find(|v| v["message"] == "refused" && v["uid"] == "bin")
        .unwrap();
    assert_eq!(refused["level"], "INFO");
    assert_eq!(refused["uid"], "bin");
    assert_eq!(
        refused["refusal"],
        "spec.size: must be between 1 and 7, got 0"
    );
    let request = rest
        .iter()
        .find(|v| v["message"] == "admission request")
        .unwrap();
    assert_eq!(request["level"], "DEBUG");
}

/// Reads until the server closes the stream (EOF or an error); the time it took.
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
    limit: Duration,
) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return started.elapsed(),
            Ok(Ok(_)) => {}
            Err(_) => panic!("still open after {limit:?}"),
        }
    }
}

/// Waits until a gauge or counter of the server (read in-process: a scrape would open a
/// connection of its own) has the value.
async fn wait_for_metric(h: &Harness, name: &str, want: f64) {
    let started = Instant::now();
    loop {
        let text = h.server.metrics().encode().unwrap();
        let got = metric(&parse_prometheus(&text).unwrap(), name, &[]);
        if got == want {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name} is {got}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_and_busy_ones_kept() {
    let h = Harness::start(&["--idle-timeout=1s", "--request-timeout=500ms"]).await;
    // TLS done, no request ever sent.
    let mut silent = h.raw().await;
    // HTTP/2: the preface and an empty SETTINGS frame, then nothing.
    let tcp = tokio::net::TcpStream::connect(h.server.tls_addr())
        .await
        .unwrap();
    let h2 = client_config(&h.ca.cert_pem, &[b"h2"], &[&rustls::version::TLS13]);
    let name = rustls::pki_types::ServerName::IpAddress(h.server.tls_addr().ip().into());
    let mut h2 = tokio_rustls::TlsConnector::from(h2)
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    // HTTP/1 keep-alive after one answered request.
    let mut kept = h.raw().await;
    let body = serde_json::to_vec(&review(
        "idle",
        "CREATE",
        cluster("demo", json!({})),
        Value::Null,
    ))
    .unwrap();
    let request = format!(
        "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    kept.write_all(request.as_bytes()).await.unwrap();
    kept.write_all(&body).await.unwrap();
    // A busy connection: a request every 300 ms for 2.5 s stays open throughout.
    let mut busy = h.conn().await;
    let busy_task = tokio::spawn(async move {
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(2500) {
            let answer = busy
                .review(
                    "/validate",
                    &review("busy", "CREATE", cluster("demo", json!({})), Value::Null),
                )
                .await;
            assert_eq!(answer["allowed"], true);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });

    for (what, elapsed) in [
        (
            "TLS without a request",
            closed_within(&mut silent, Duration::from_secs(5)).await,
        ),
        (
            "HTTP/2 after the preface",
            closed_within(&mut h2, Duration::from_secs(5)).await,
        ),
        (
            "HTTP/1 keep-alive",
            closed_within(&mut kept, Duration::from_secs(5)).await,
        ),
    ] {
        assert!(
            elapsed < Duration::from_secs(3),
            "{what}: closed after {elapsed:?}"
        );
    }
    busy_task
        .await
        .expect("the busy connection kept working past the idle timeout");
    let samples = h.metrics().await;
    assert!(metric(&samples, "etcd_webhook_connections_idle_closed_total", &[]) >= 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_cap_are_closed_at_once() {
    let h = Harness::start(&["--max-connections=3"]).await;
    let open = vec![h.raw().await, h.raw().await, h.raw().await];
    wait_for_metric(&h, "etcd_webhook_open_connections", 3.0).await;
    // The fourth is accepted by the kernel and closed by the webhook: no handshake.
    let tcp = tokio::net::TcpStream::connect(h.server.tls_addr())
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::IpAddress(h.server.tls_addr().ip().into());
    let refused = tokio::time::timeout(
        Duration::from_secs(5),
        tokio_rustls::TlsConnector::from(h.client.clone()).connect(name, tcp),
    )
    .await
    .expect("closed at once, not left hanging");
    assert!(refused.is_err(), "the fourth connection got a handshake");
    let samples = h.metrics().await;
    assert_eq!(
        metric(&samples, "etcd_webhook_connections_rejected_total", &[]),
        1.0
    );
    // The metrics listener has its own cap: the scrape above worked.
    drop(open);
    wait_for_metric(&h, "etcd_webhook_open_connections", 0.0).await;
    let mut conn = h.conn().await;
    let answer = conn
        .review(
            "/validate",
            &review("after", "CREATE", cluster("demo", json!({})), Value::Null),
        )
        .await;
    assert_eq!(answer["allowed"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_over_the_memory_budget_is_answered_429() {
    let h = Harness::start(&["--max-in-flight-memory=2Mi", "--max-request-body-size=2Mi"]).await;
    let big = 1024 * 1024;
    let head = |len: usize| {
        format!(
            "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // 2 MiB: 0.5 for small bodies, 1.5 for large ones. A 1 MiB body announced and not yet
    // sent holds 1 MiB + 64 KiB of the large pool while it is received.
    let mut holder = h.raw().await;
    holder.write_all(head(big).as_bytes()).await.unwrap();
    holder.flush().await.unwrap();
    let started = Instant::now();
    while h.server.metrics().reserved_bytes().get() == 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "never reserved");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // A second one cannot get its share: 429 after the wait, with Retry-After.
    let mut second = h.raw().await;
    second.write_all(head(big).as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), second.read(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("retry shortly"), "{answer}");
    // A small request still fits beside the held share.
    let mut conn = h.conn().await;
    let small = conn
        .review(
            "/validate",
            &review("small", "CREATE", cluster("demo", json!({})), Value::Null),
        )
        .await;
    assert_eq!(small["allowed"], true);
    // The held one is answered once its body arrives, and its share is returned.
    let mut object = cluster("demo", json!({}));
    object["metadata"]["annotations"] = json!({"pad": ""});
    let mut body = serde_json::to_vec(&review("held", "CREATE", object, Value::Null)).unwrap();
    let pad = big - body.len();
    let at = body.windows(9).position(|w| w == b"\"pad\":\"\"}").unwrap() + 7;
    body.splice(at..at, std::iter::repeat_n(b'x', pad));
    assert_eq!(body.len(), big);
    holder.write_all(&body).await.unwrap();
    let mut answer = vec![0u8; 8192];
    let n = tokio::time::timeout(Duration::from_secs(5), holder.read(&mut answer))
        .await
        .expect("answered")
        .unwrap();
    assert!(String::from_utf8_lossy(&answer[..n]).starts_with("HTTP/1.1 200"));
    wait_for_metric(&h, "etcd_webhook_in_flight_reserved_bytes", 0.0).await;
    assert_eq!(
        metric(&h.metrics().await, "etcd_webhook_requests_shed_total", &[]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_connections_are_served_through_the_shutdown_delay() {
    let h = Harness::start(&["--shutdown-delay=1500ms"]).await;
    let probe = h.server.probe_addr().expect("probes on");
    assert_eq!(
        http_get(probe, "/readyz").await.unwrap().status,
        StatusCode::OK
    );
    h.server.shutdown();
    let triggered = Instant::now();
    // Not ready at once, so the endpoint is taken out of the Service...
    let started = Instant::now();
    while http_get(probe, "/readyz").await.map(|r| r.status).ok()
        != Some(StatusCode::SERVICE_UNAVAILABLE)
    {
        assert!(started.elapsed() < Duration::from_secs(1), "still ready");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // ...while API servers that still pick it get answers on new connections.
    let mut answered = 0;
    while triggered.elapsed() < Duration::from_millis(1200) {
        let mut conn = h.conn().await;
        let answer = conn
            .review(
                "/validate",
                &review("late", "CREATE", cluster("demo", json!({})), Value::Null),
            )
            .await;
        assert_eq!(answer["allowed"], true);
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered >= 5, "{answered}");
    let addr = h.server.tls_addr();
    tokio::time::timeout(Duration::from_secs(5), h.server.wait())
        .await
        .expect("stops after the delay")
        .expect("clean stop");
    assert!(triggered.elapsed() >= Duration::from_millis(1500));
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

/// Reads HTTP/2 frames until the server's first SETTINGS and a connection WINDOW_UPDATE (or
/// 2 s): the settings it advertised, by id, and the connection window it grants.
async fn h2_server_settings<S: tokio::io::AsyncRead + Unpin>(
    stream: &mut S,
) -> (std::collections::BTreeMap<u16, u32>, u32) {
    let mut settings = std::collections::BTreeMap::new();
    let mut window = 65_535u32; // RFC 9113's initial connection window
    let mut seen_settings = false;
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(Duration::from_millis(500), stream.read_exact(&mut head));
        let Ok(Ok(_)) = read.await else {
            break;
        };
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let (kind, flags) = (head[3], head[4]);
        let stream_id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0u8; len];
        stream.read_exact(&mut payload).await.unwrap();
        match kind {
            0x4 if flags & 0x1 == 0 => {
                for entry in payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([entry[0], entry[1]]);
                    let value = u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]);
                    settings.insert(id, value);
                }
                seen_settings = true;
            }
            0x8 if stream_id == 0 => {
                let increment =
                    u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                window += increment & 0x7fff_ffff;
                if seen_settings {
                    break;
                }
            }
            _ => {}
        }
    }
    assert!(seen_settings, "no SETTINGS from the server");
    (settings, window)
}

/// What one connection can make the webhook buffer outside the memory budget is bounded
/// (issue 14, item 1; hyper's defaults let an HTTP/1 head grow to 408 KiB, and an HTTP/2
/// connection hold 200 streams and 1 MiB of unread bodies): an HTTP/1 head over 64 KiB is
/// answered 431, and HTTP/2 clients are told 8 streams, 8 KiB of headers and 64 KiB windows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_buffers_are_bounded() {
    use etcd_webhook::server::{
        HTTP1_MAX_BUF_BYTES, HTTP2_MAX_CONCURRENT_STREAMS, HTTP2_MAX_HEADER_LIST_BYTES,
        HTTP2_WINDOW_BYTES,
    };
    let h = Harness::start(&[]).await;
    let body = serde_json::to_vec(&review(
        "head",
        "CREATE",
        cluster("demo", json!({})),
        Value::Null,
    ))
    .unwrap();
    let h = &h;
    let send = |pad: usize| {
        let body = body.clone();
        async move {
            let mut raw = h.raw().await;
            let head = format!(
                "POST /validate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-Pad: {}\r\nContent-Length: {}\r\n\r\n",
                "p".repeat(pad),
                body.len()
            );
            // The server may answer (and close) before it has read all of a head too large.
            let _ = raw.write_all(head.as_bytes()).await;
            let _ = raw.write_all(&body).await;
            let mut answer = vec![0u8; 64];
            let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut answer))
                .await
                .expect("answered")
                .unwrap_or(0);
            String::from_utf8_lossy(&answer[..n]).to_string()
        }
    };
    // A head of 32 KiB is served; one of 100 KiB (hyper's default allowed 408 KiB) is not.
    assert!(send(32 * 1024).await.starts_with("HTTP/1.1 200"));
    let answer = send(100 * 1024).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    const { assert!(100 * 1024 > HTTP1_MAX_BUF_BYTES) };

    let tcp = tokio::net::TcpStream::connect(h.server.tls_addr())
        .await
        .unwrap();
    let config = client_config(&h.ca.cert_pem, &[b"h2"], &[&rustls::version::TLS13]);
    let name = rustls::pki_types::ServerName::IpAddress(h.server.tls_addr().ip().into());
    let mut h2 = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    assert_eq!(h2.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    h2.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let (settings, window) = h2_server_settings(&mut h2).await;
    // SETTINGS_MAX_CONCURRENT_STREAMS, SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_HEADER_LIST_SIZE.
    assert_eq!(
        settings.get(&0x3),
        Some(&HTTP2_MAX_CONCURRENT_STREAMS),
        "{settings:?}"
    );
    assert_eq!(
        settings.get(&0x4),
        Some(&HTTP2_WINDOW_BYTES),
        "{settings:?}"
    );
    assert_eq!(
        settings.get(&0x6),
        Some(&HTTP2_MAX_HEADER_LIST_BYTES),
        "{settings:?}"
    );
    // The connection window: hyper's default was 1 MiB. (h2 grants the last 1 byte of
    // 64 KiB over the protocol's initial 65,535 only once data has flowed.)
    assert!(
        (65_535..=HTTP2_WINDOW_BYTES).contains(&window),
        "the connection window is {window}"
    );
    assert_eq!(
        (
            HTTP2_MAX_CONCURRENT_STREAMS,
            HTTP2_MAX_HEADER_LIST_BYTES,
            HTTP2_WINDOW_BYTES
        ),
        (8, 8 * 1024, 64 * 1024)
    );
    // And a request over HTTP/2 is still answered.
    let config = client_config(&h.ca.cert_pem, &[b"h2"], &[&rustls::version::TLS13]);
    let mut conn = Conn::connect(h.server.tls_addr(), config).await.unwrap();
    let answer = conn
        .review(
            "/validate",
            &review("h2", "CREATE", cluster("demo", json!({})), Value::Null),
        )
        .await;
    assert_eq!(answer["allowed"], true);
}
