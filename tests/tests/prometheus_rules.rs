//! What Prometheus' own tools say about the chart's monitoring files and the operator's
//! metrics, without a control plane (needs `promtool`: `ONLY=prometheus hack/build-tools.sh`):
//!
//! - `charts/etcd-operator/files/alerts.yaml` passes `promtool check rules` and its unit tests
//!   (`tests/prometheus/alerts_test.yaml`) pass `promtool test rules`, with every alert of the
//!   file shown firing by at least one test and staying silent in at least one other;
//! - every PromQL expression of `charts/etcd-operator/files/dashboard.json` parses with
//!   promtool (the `installed`-style `prometheus` suite runs each on a real Prometheus);
//! - the controller's and the webhook's `/metrics` texts pass `promtool check metrics`.
//!
//! Run: `cargo test -p etcd-tests --test prometheus_rules`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use etcd_tests::Tools;
use etcd_tests::prometheus::Promtool;
use etcd_tests::prometheus::dashboard::{
    label_values, panel_queries, substitute, variable_queries,
};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn promtool() -> Promtool {
    let tools = Tools::from_env().expect("the tool cache");
    Promtool::new(&tools).expect("promtool is built (ONLY=prometheus hack/build-tools.sh)")
}

const ALERTS: &str = "charts/etcd-operator/files/alerts.yaml";
const ALERT_TESTS: &str = "tests/prometheus/alerts_test.yaml";
const DASHBOARD: &str = "charts/etcd-operator/files/dashboard.json";

fn yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(repo(path)).expect(path);
    serde_yaml::from_str(&text).expect(path)
}

/// The alert names of the chart's rule file.
fn alert_names() -> BTreeSet<String> {
    yaml(ALERTS)["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn alert_rules_pass_promtool_check_and_their_unit_tests() {
    let promtool = promtool();
    let report = promtool
        .check_rules(&[&repo(ALERTS)])
        .await
        .expect("promtool check rules");
    println!("{report}");
    let report = promtool
        .test_rules(&[&repo(ALERT_TESTS)])
        .await
        .expect("promtool test rules");
    println!("{report}");
    assert!(report.contains("SUCCESS"), "{report}");
}

/// Each alert has a test case where it fires (non-empty `exp_alerts`) and one where it does
/// not (empty `exp_alerts`), and no test names an alert the file does not have.
#[test]
fn every_alert_is_unit_tested_firing_and_silent() {
    let alerts = alert_names();
    assert!(alerts.len() >= 10, "{alerts:?}");
    let tests = yaml(ALERT_TESTS);
    let mut fired: BTreeMap<String, usize> = BTreeMap::new();
    let mut silent: BTreeMap<String, usize> = BTreeMap::new();
    for test in tests["tests"].as_array().expect("tests") {
        for case in test["alert_rule_test"].as_array().into_iter().flatten() {
            let name = case["alertname"].as_str().expect("alertname").to_string();
            assert!(
                alerts.contains(&name),
                "{ALERT_TESTS} tests unknown alert {name}"
            );
            let expected = case["exp_alerts"].as_array().map_or(0, Vec::len);
            *if expected > 0 {
                fired.entry(name)
            } else {
                silent.entry(name)
            }
            .or_default() += 1;
        }
    }
    for alert in &alerts {
        assert!(
            fired.contains_key(alert),
            "{alert} is never shown firing in {ALERT_TESTS}"
        );
        assert!(
            silent.contains_key(alert),
            "{alert} is never shown silent in {ALERT_TESTS}"
        );
    }
    println!("alerts: {alerts:?}\nfiring cases: {fired:?}\nsilent cases: {silent:?}");
}

/// Every panel query and query variable of the dashboard parses with Prometheus' parser
/// (`promtool promql format`), once Grafana's variables are replaced.
#[tokio::test]
async fn dashboard_queries_parse() {
    let promtool = promtool();
    let text = std::fs::read_to_string(repo(DASHBOARD)).expect(DASHBOARD);
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let values = [
        ("namespace", "apps"),
        ("cluster", "example"),
        ("__rate_interval", "1m"),
        ("__interval", "30s"),
        ("__range", "1h"),
    ];
    let queries = panel_queries(&dashboard);
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let mut ids = BTreeSet::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(panel["id"].as_i64().expect("id")),
            "panel ids are unique"
        );
        if panel["type"] != "row" {
            assert_eq!(
                panel["datasource"]["uid"], "${datasource}",
                "{} uses the datasource variable",
                panel["title"]
            );
        }
    }
    for q in &queries {
        let expr = substitute(&q.expr, &values);
        assert!(
            !expr.contains('$'),
            "{}: a variable is left in {expr}",
            q.panel
        );
        promtool
            .parse_promql(&expr)
            .await
            .unwrap_or_else(|e| panic!("{} ({}): {e}", q.panel, q.ref_id));
    }
    let variables = variable_queries(&dashboard);
    assert_eq!(
        variables
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>(),
        ["namespace", "cluster"]
    );
    for (name, query) in &variables {
        let (selector, _) = label_values(query).unwrap_or_else(|| panic!("{name}: {query}"));
        promtool
            .parse_promql(&substitute(&selector, &values))
            .await
            .unwrap_or_else(|e| panic!("variable {name}: {e}"));
    }
    println!(
        "{} panel queries and {} variables parse",
        queries.len(),
        variables.len()
    );
}

/// The controller's `/metrics` text, every series family present (as after a cluster's life
/// and a backup), passes `promtool check metrics`.
#[tokio::test]
async fn controller_metrics_pass_promtool_check_metrics() {
    let metrics = etcd_controller::metrics::Metrics::new().expect("metrics");
    etcd_webhook::connections::ConnectionMetrics::register(
        metrics.registry(),
        etcd_controller::metrics::NAMESPACE,
    )
    .expect("connection metrics");
    metrics.reconcile_ok();
    metrics.reconcile_error("etcd_not_ready");
    metrics.reconcile_timer().observe();
    metrics.observe_cluster("apps", "example", "Running", 3);
    metrics.undecodable("apps", "broken");
    metrics.health_check_failed("apps", "example");
    metrics.member_change("add");
    metrics.applied("Service");
    metrics.set_leader(true);
    metrics.backups.succeeded(
        "apps",
        "nightly",
        Duration::from_secs(3),
        1024,
        k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).ok(),
    );
    metrics.backups.failed("Timeout");
    metrics.backups.restored(true);
    let text = metrics.encode();
    let problems = promtool().check_metrics(&text).await.expect("promtool");
    assert!(
        problems.is_empty(),
        "promtool check metrics:\n{}\n\n{text}",
        problems.join("\n")
    );
}

/// The webhook's `/metrics` text passes `promtool check metrics`.
#[tokio::test]
async fn webhook_metrics_pass_promtool_check_metrics() {
    use etcd_webhook::metrics::{Metrics, RequestResult};
    let metrics = Metrics::new().expect("metrics");
    metrics.observe_request(
        "validate",
        "CREATE",
        RequestResult::Denied,
        Duration::from_micros(40),
    );
    metrics.count_refusal("size-range");
    metrics.certificate_in_use(1_900_000_000);
    metrics.count_reload();
    metrics.count_reload_failure();
    metrics.count_shed();
    let text = metrics.encode().expect("encode");
    let problems = promtool().check_metrics(&text).await.expect("promtool");
    assert!(
        problems.is_empty(),
        "promtool check metrics:\n{}\n\n{text}",
        problems.join("\n")
    );
}
