//! The Prometheus Operator's objects, as far as the chart uses them: ServiceMonitors and
//! PodMonitors turned into Prometheus scrape jobs the way the operator's config generator
//! renders them (`pkg/prometheus/promcfg.go`: job name, `kubernetes_sd_configs` of the
//! monitor's namespaces, the selector as `keep` rules on `__meta_kubernetes_*_label_*` and
//! `*_labelpresent_*`, the port filter, `namespace`/`pod`/`service`/`container`/`job`/
//! `endpoint` labels, target labels, the monitor's own relabelings, one shard), and
//! PrometheusRules turned into rule files (their `spec`, as the operator writes them).
//!
//! Fields of the monitors outside what is implemented here are refused (`deny_unknown_fields`)
//! rather than ignored, so a chart change this does not render fails its test instead of
//! passing untested. [`crds`] are minimal CRDs of the three kinds, so the API server serves
//! `monitoring.coreos.com/v1` and `helm install` accepts the objects (their schema does not
//! check fields; parsing here does).

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Deserialize;
use serde_json::{Value, json};

/// The API group and version of the Prometheus Operator's objects.
pub const API_VERSION: &str = "monitoring.coreos.com/v1";

/// How ServiceMonitor targets are discovered: the operator's `serviceDiscoveryRole` of the
/// Prometheus object (`Endpoints`, its default, or `EndpointSlice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceDiscoveryRole {
    /// `role: endpoints`, labels `__meta_kubernetes_endpoint_*`.
    Endpoints,
    /// `role: endpointslice`, labels `__meta_kubernetes_endpointslice_*`.
    EndpointSlice,
}

/// A ServiceMonitor or PodMonitor that is not rendered here.
#[derive(Debug, thiserror::Error)]
#[error("{kind} {namespace}/{name}: {message}")]
pub struct MonitorError {
    /// `ServiceMonitor`, `PodMonitor` or `PrometheusRule`.
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

/// `spec.namespaceSelector`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceSelector {
    /// Every namespace.
    #[serde(default)]
    pub any: bool,
    /// These namespaces (else the monitor's own).
    #[serde(default)]
    pub match_names: Vec<String>,
}

/// A relabelling of a monitor endpoint (`relabelings`, `metricRelabelings`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelabelConfig {
    /// `sourceLabels`.
    #[serde(default)]
    pub source_labels: Vec<String>,
    /// `separator`.
    #[serde(default)]
    pub separator: Option<String>,
    /// `targetLabel`.
    #[serde(default)]
    pub target_label: Option<String>,
    /// `regex`.
    #[serde(default)]
    pub regex: Option<String>,
    /// `modulus`.
    #[serde(default)]
    pub modulus: Option<u64>,
    /// `replacement`.
    #[serde(default)]
    pub replacement: Option<String>,
    /// `action` (either case, as the CRD allows).
    #[serde(default)]
    pub action: Option<String>,
}

/// One endpoint of a ServiceMonitor (`spec.endpoints[]`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Endpoint {
    /// The Service port's name.
    #[serde(default)]
    pub port: Option<String>,
    /// `path`.
    #[serde(default)]
    pub path: Option<String>,
    /// `scheme`.
    #[serde(default)]
    pub scheme: Option<String>,
    /// `interval`.
    #[serde(default)]
    pub interval: Option<String>,
    /// `scrapeTimeout`.
    #[serde(default)]
    pub scrape_timeout: Option<String>,
    /// `honorLabels`.
    #[serde(default)]
    pub honor_labels: bool,
    /// `honorTimestamps`.
    #[serde(default)]
    pub honor_timestamps: Option<bool>,
    /// `filterRunning` (default true: targets of Failed and Succeeded pods are dropped).
    #[serde(default)]
    pub filter_running: Option<bool>,
    /// `relabelings`.
    #[serde(default)]
    pub relabelings: Vec<RelabelConfig>,
    /// `metricRelabelings`.
    #[serde(default)]
    pub metric_relabelings: Vec<RelabelConfig>,
}

/// The spec of a ServiceMonitor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ServiceMonitorSpec {
    /// `jobLabel`: a Service label whose value becomes `job`.
    #[serde(default)]
    pub job_label: Option<String>,
    /// `targetLabels`: Service labels copied onto the targets.
    #[serde(default)]
    pub target_labels: Vec<String>,
    /// `podTargetLabels`: pod labels copied onto the targets.
    #[serde(default)]
    pub pod_target_labels: Vec<String>,
    /// `endpoints`.
    pub endpoints: Vec<Endpoint>,
    /// `selector` (of Services).
    pub selector: LabelSelector,
    /// `namespaceSelector`.
    #[serde(default)]
    pub namespace_selector: NamespaceSelector,
}

/// One endpoint of a PodMonitor (`spec.podMetricsEndpoints[]`).
pub type PodMetricsEndpoint = Endpoint;

/// The spec of a PodMonitor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodMonitorSpec {
    /// `jobLabel`: a pod label whose value becomes `job`.
    #[serde(default)]
    pub job_label: Option<String>,
    /// `podTargetLabels`: pod labels copied onto the targets.
    #[serde(default)]
    pub pod_target_labels: Vec<String>,
    /// `podMetricsEndpoints`.
    pub pod_metrics_endpoints: Vec<PodMetricsEndpoint>,
    /// `selector` (of pods).
    pub selector: LabelSelector,
    /// `namespaceSelector`.
    #[serde(default)]
    pub namespace_selector: NamespaceSelector,
}

/// A monitor as read from the API server or a rendered manifest: namespace, name, spec.
#[derive(Debug, Clone)]
pub struct Monitor<S> {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec`.
    pub spec: S,
}

fn parse<S: serde::de::DeserializeOwned>(
    kind: &'static str,
    object: &Value,
) -> Result<Monitor<S>, MonitorError> {
    let namespace = object["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let spec = serde_json::from_value(object["spec"].clone()).map_err(|e| MonitorError {
        kind,
        namespace: namespace.clone(),
        name: name.clone(),
        message: format!("spec: {e}"),
    })?;
    Ok(Monitor {
        namespace,
        name,
        spec,
    })
}

/// A ServiceMonitor object (JSON as the API server or `helm template` gives it).
pub fn service_monitor(object: &Value) -> Result<Monitor<ServiceMonitorSpec>, MonitorError> {
    parse("ServiceMonitor", object)
}

/// A PodMonitor object (JSON as the API server or `helm template` gives it).
pub fn pod_monitor(object: &Value) -> Result<Monitor<PodMonitorSpec>, MonitorError> {
    parse("PodMonitor", object)
}

/// Prometheus' label name for a Kubernetes label key (`[^a-zA-Z0-9_]` -> `_`).
pub fn sanitize_label_name(key: &str) -> String {
    key.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

fn namespaces(selector: &NamespaceSelector, own: &str) -> Vec<String> {
    if selector.any {
        Vec::new()
    } else if selector.match_names.is_empty() {
        vec![own.to_string()]
    } else {
        selector.match_names.clone()
    }
}

fn sd_config(role: &str, namespaces: &[String], kubeconfig: &Path) -> Value {
    let mut sd = json!({"role": role, "kubeconfig_file": kubeconfig.display().to_string()});
    if !namespaces.is_empty() {
        sd["namespaces"] = json!({"names": namespaces});
    }
    json!([sd])
}

/// `keep`/`drop` rules selecting the objects of `selector` by their labels (`prefix` is
/// `__meta_kubernetes_service` or `__meta_kubernetes_pod`).
fn selector_rules(
    selector: &LabelSelector,
    prefix: &str,
    kind: &'static str,
    monitor: (&str, &str),
) -> Result<Vec<Value>, MonitorError> {
    let mut rules = Vec::new();
    let label = |k: &str| format!("{prefix}_label_{}", sanitize_label_name(k));
    let present = |k: &str| format!("{prefix}_labelpresent_{}", sanitize_label_name(k));
    // BTreeMap: the operator sorts the keys too.
    for (k, v) in selector.match_labels.iter().flatten() {
        rules.push(json!({"action": "keep", "source_labels": [label(k), present(k)], "regex": format!("({v});true")}));
    }
    for e in selector.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join("|");
        let rule = match e.operator.as_str() {
            "In" => {
                json!({"action": "keep", "source_labels": [label(&e.key), present(&e.key)], "regex": format!("({values});true")})
            }
            "NotIn" => {
                json!({"action": "drop", "source_labels": [label(&e.key), present(&e.key)], "regex": format!("({values});true")})
            }
            "Exists" => {
                json!({"action": "keep", "source_labels": [present(&e.key)], "regex": "true"})
            }
            "DoesNotExist" => {
                json!({"action": "drop", "source_labels": [present(&e.key)], "regex": "true"})
            }
            other => {
                return Err(MonitorError {
                    kind,
                    namespace: monitor.0.to_string(),
                    name: monitor.1.to_string(),
                    message: format!("selector operator {other:?}"),
                });
            }
        };
        rules.push(rule);
    }
    Ok(rules)
}

fn relabel_configs(rules: &[RelabelConfig]) -> Vec<Value> {
    rules
        .iter()
        .map(|r| {
            let mut out = serde_json::Map::new();
            if !r.source_labels.is_empty() {
                out.insert("source_labels".into(), json!(r.source_labels));
            }
            if let Some(v) = &r.separator {
                out.insert("separator".into(), json!(v));
            }
            if let Some(v) = &r.target_label {
                out.insert("target_label".into(), json!(v));
            }
            if let Some(v) = &r.regex {
                out.insert("regex".into(), json!(v));
            }
            if let Some(v) = r.modulus {
                out.insert("modulus".into(), json!(v));
            }
            if let Some(v) = &r.replacement {
                out.insert("replacement".into(), json!(v));
            }
            if let Some(v) = &r.action {
                out.insert("action".into(), json!(v.to_lowercase()));
            }
            Value::Object(out)
        })
        .collect()
}

/// The job's options from the endpoint: interval, timeout, path, scheme, honour flags.
fn endpoint_options(job: &mut serde_json::Map<String, Value>, ep: &Endpoint) {
    if let Some(v) = &ep.interval {
        job.insert("scrape_interval".into(), json!(v));
    }
    if let Some(v) = &ep.scrape_timeout {
        job.insert("scrape_timeout".into(), json!(v));
    }
    if let Some(v) = &ep.path {
        job.insert("metrics_path".into(), json!(v));
    }
    if let Some(v) = &ep.scheme {
        job.insert("scheme".into(), json!(v));
    }
}

fn target_label_rules(prefix: &str, labels: &[String]) -> Vec<Value> {
    labels
        .iter()
        .map(|l| {
            json!({
                "source_labels": [format!("{prefix}_label_{}", sanitize_label_name(l))],
                "target_label": sanitize_label_name(l),
                "regex": "(.+)",
                "replacement": "${1}",
            })
        })
        .collect()
}

/// The single-shard rules the operator ends every job's relabelling with.
fn shard_rules() -> [Value; 2] {
    [
        json!({"source_labels": ["__address__"], "target_label": "__tmp_hash", "modulus": 1, "action": "hashmod"}),
        json!({"source_labels": ["__tmp_hash"], "regex": "0", "action": "keep"}),
    ]
}

fn phase_filter(ep: &Endpoint) -> Option<Value> {
    ep.filter_running.unwrap_or(true).then(|| {
        json!({"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"})
    })
}

/// The scrape jobs of a ServiceMonitor, one per endpoint (`serviceMonitor/NS/NAME/I`),
/// discovering through `kubeconfig` with `role`.
pub fn service_monitor_jobs(
    m: &Monitor<ServiceMonitorSpec>,
    role: ServiceDiscoveryRole,
    kubeconfig: &Path,
) -> Result<Vec<Value>, MonitorError> {
    let (sd_role, meta) = match role {
        ServiceDiscoveryRole::Endpoints => ("endpoints", "__meta_kubernetes_endpoint"),
        ServiceDiscoveryRole::EndpointSlice => ("endpointslice", "__meta_kubernetes_endpointslice"),
    };
    let mut jobs = Vec::new();
    for (i, ep) in m.spec.endpoints.iter().enumerate() {
        let mut job = serde_json::Map::new();
        job.insert(
            "job_name".into(),
            json!(format!("serviceMonitor/{}/{}/{i}", m.namespace, m.name)),
        );
        job.insert("honor_labels".into(), json!(ep.honor_labels));
        if let Some(v) = ep.honor_timestamps {
            job.insert("honor_timestamps".into(), json!(v));
        }
        job.insert(
            "kubernetes_sd_configs".into(),
            sd_config(
                sd_role,
                &namespaces(&m.spec.namespace_selector, &m.namespace),
                kubeconfig,
            ),
        );
        endpoint_options(&mut job, ep);

        let mut rules =
            vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
        rules.extend(selector_rules(
            &m.spec.selector,
            "__meta_kubernetes_service",
            "ServiceMonitor",
            (&m.namespace, &m.name),
        )?);
        let Some(port) = &ep.port else {
            return Err(MonitorError {
                kind: "ServiceMonitor",
                namespace: m.namespace.clone(),
                name: m.name.clone(),
                message: format!("endpoint {i} names no port (targetPort is not rendered here)"),
            });
        };
        rules.push(json!({"action": "keep", "source_labels": [format!("{meta}_port_name")], "regex": port}));
        let kind_name = [
            format!("{meta}_address_target_kind"),
            format!("{meta}_address_target_name"),
        ];
        rules.extend([
            json!({"source_labels": kind_name, "separator": ";", "regex": "Node;(.*)", "replacement": "${1}", "target_label": "node"}),
            json!({"source_labels": kind_name, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
        ]);
        rules.extend(phase_filter(ep));
        rules.extend(target_label_rules(
            "__meta_kubernetes_service",
            &m.spec.target_labels,
        ));
        rules.extend(target_label_rules(
            "__meta_kubernetes_pod",
            &m.spec.pod_target_labels,
        ));
        rules.push(json!({"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"}));
        if let Some(label) = &m.spec.job_label {
            rules.push(json!({
                "source_labels": [format!("__meta_kubernetes_service_label_{}", sanitize_label_name(label))],
                "target_label": "job", "regex": "(.+)", "replacement": "${1}",
            }));
        }
        rules.push(json!({"target_label": "endpoint", "replacement": port}));
        rules.extend(relabel_configs(&ep.relabelings));
        rules.extend(shard_rules());
        job.insert("relabel_configs".into(), Value::Array(rules));
        job.insert(
            "metric_relabel_configs".into(),
            Value::Array(relabel_configs(&ep.metric_relabelings)),
        );
        jobs.push(Value::Object(job));
    }
    Ok(jobs)
}

/// The scrape jobs of a PodMonitor, one per endpoint (`podMonitor/NS/NAME/I`), discovering
/// pods through `kubeconfig`.
pub fn pod_monitor_jobs(
    m: &Monitor<PodMonitorSpec>,
    kubeconfig: &Path,
) -> Result<Vec<Value>, MonitorError> {
    let mut jobs = Vec::new();
    for (i, ep) in m.spec.pod_metrics_endpoints.iter().enumerate() {
        let mut job = serde_json::Map::new();
        job.insert(
            "job_name".into(),
            json!(format!("podMonitor/{}/{}/{i}", m.namespace, m.name)),
        );
        job.insert("honor_labels".into(), json!(ep.honor_labels));
        if let Some(v) = ep.honor_timestamps {
            job.insert("honor_timestamps".into(), json!(v));
        }
        job.insert(
            "kubernetes_sd_configs".into(),
            sd_config(
                "pod",
                &namespaces(&m.spec.namespace_selector, &m.namespace),
                kubeconfig,
            ),
        );
        endpoint_options(&mut job, ep);

        let mut rules =
            vec![json!({"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"})];
        rules.extend(phase_filter(ep));
        rules.extend(selector_rules(
            &m.spec.selector,
            "__meta_kubernetes_pod",
            "PodMonitor",
            (&m.namespace, &m.name),
        )?);
        let Some(port) = &ep.port else {
            return Err(MonitorError {
                kind: "PodMonitor",
                namespace: m.namespace.clone(),
                name: m.name.clone(),
                message: format!("endpoint {i} names no port (targetPort is not rendered here)"),
            });
        };
        rules.push(json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port}));
        rules.extend([
            json!({"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"}),
            json!({"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"}),
            json!({"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}),
        ]);
        rules.extend(target_label_rules(
            "__meta_kubernetes_pod",
            &m.spec.pod_target_labels,
        ));
        rules.push(
            json!({"target_label": "job", "replacement": format!("{}/{}", m.namespace, m.name)}),
        );
        if let Some(label) = &m.spec.job_label {
            rules.push(json!({
                "source_labels": [format!("__meta_kubernetes_pod_label_{}", sanitize_label_name(label))],
                "target_label": "job", "regex": "(.+)", "replacement": "${1}",
            }));
        }
        rules.push(json!({"target_label": "endpoint", "replacement": port}));
        rules.extend(relabel_configs(&ep.relabelings));
        rules.extend(shard_rules());
        job.insert("relabel_configs".into(), Value::Array(rules));
        job.insert(
            "metric_relabel_configs".into(),
            Value::Array(relabel_configs(&ep.metric_relabelings)),
        );
        jobs.push(Value::Object(job));
    }
    Ok(jobs)
}

/// The rule file of a PrometheusRule (its `spec`, which holds `groups`), named as the
/// operator names it (`NAMESPACE-NAME.yaml`, without its uid).
pub fn rule_file(object: &Value) -> Result<(String, String), MonitorError> {
    let namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    let fail = |message: String| MonitorError {
        kind: "PrometheusRule",
        namespace: namespace.to_string(),
        name: name.to_string(),
        message,
    };
    let spec = &object["spec"];
    if !spec["groups"].is_array() {
        return Err(fail("spec.groups is not a list".into()));
    }
    let text = serde_yaml::to_string(spec).map_err(|e| fail(e.to_string()))?;
    Ok((format!("{namespace}-{name}.yaml"), text))
}

/// Minimal CRDs of ServiceMonitor, PodMonitor and PrometheusRule (`monitoring.coreos.com/v1`,
/// namespaced, any spec): what makes the API server serve the kinds, so the chart's
/// capability checks pass and its objects can be created and read back.
pub fn crds() -> Vec<CustomResourceDefinition> {
    [
        ("ServiceMonitor", "servicemonitors", "smon"),
        ("PodMonitor", "podmonitors", "pmon"),
        ("PrometheusRule", "prometheusrules", "promrule"),
    ]
    .into_iter()
    .filter_map(|(kind, plural, short)| {
        serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
            "spec": {
                "group": "monitoring.coreos.com",
                "scope": "Namespaced",
                "names": {
                    "kind": kind,
                    "listKind": format!("{kind}List"),
                    "plural": plural,
                    "singular": kind.to_lowercase(),
                    "shortNames": [short],
                },
                "versions": [{
                    "name": "v1",
                    "served": true,
                    "storage": true,
                    "schema": {"openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        },
                    }},
                }],
            },
        }))
        .ok()
    })
    .collect()
}

/// The scrape jobs of every monitor in `objects` (ServiceMonitors and PodMonitors, in the
/// operator's order: ServiceMonitors, then PodMonitors, each sorted by namespace/name).
pub fn jobs_of(
    objects: &[Value],
    role: ServiceDiscoveryRole,
    kubeconfig: &Path,
) -> Result<Vec<Value>, MonitorError> {
    let mut by_kind: BTreeMap<(u8, String, String), &Value> = BTreeMap::new();
    for o in objects {
        let order = match o["kind"].as_str() {
            Some("ServiceMonitor") => 0,
            Some("PodMonitor") => 1,
            _ => continue,
        };
        let ns = o["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = o["metadata"]["name"].as_str().unwrap_or_default();
        by_kind.insert((order, ns.to_string(), name.to_string()), o);
    }
    let mut jobs = Vec::new();
    for ((order, _, _), o) in by_kind {
        if order == 0 {
            jobs.extend(service_monitor_jobs(
                &service_monitor(o)?,
                role,
                kubeconfig,
            )?);
        } else {
            jobs.extend(pod_monitor_jobs(&pod_monitor(o)?, kubeconfig)?);
        }
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smon() -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": "ServiceMonitor",
            "metadata": {"name": "op-controller", "namespace": "ops"},
            "spec": {
                "namespaceSelector": {"matchNames": ["ops"]},
                "selector": {"matchLabels": {"app.kubernetes.io/name": "etcd-operator", "app.kubernetes.io/component": "controller"}},
                "endpoints": [{"port": "metrics", "path": "/metrics", "interval": "2s", "honorLabels": true,
                    "relabelings": [{"targetLabel": "job", "replacement": "etcd-operator-controller"}]}],
            },
        })
    }

    /// The rules a ServiceMonitor becomes, in the operator's order.
    #[test]
    fn a_service_monitor_renders_as_the_operator_renders_it() {
        let jobs = jobs_of(
            &[smon()],
            ServiceDiscoveryRole::EndpointSlice,
            Path::new("/k"),
        )
        .expect("jobs");
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(job["job_name"], "serviceMonitor/ops/op-controller/0");
        assert_eq!(job["honor_labels"], true);
        assert_eq!(job["scrape_interval"], "2s");
        assert_eq!(job["metrics_path"], "/metrics");
        assert_eq!(
            job["kubernetes_sd_configs"],
            json!([{"role": "endpointslice", "kubeconfig_file": "/k", "namespaces": {"names": ["ops"]}}])
        );
        let rules = job["relabel_configs"].as_array().expect("rules");
        // Sorted label keys, each with its *_labelpresent_* twin.
        assert_eq!(
            rules[1],
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_service_label_app_kubernetes_io_component", "__meta_kubernetes_service_labelpresent_app_kubernetes_io_component"], "regex": "(controller);true"})
        );
        assert_eq!(
            rules[3],
            json!({"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": "metrics"})
        );
        let job_rules: Vec<&Value> = rules
            .iter()
            .filter(|r| r["target_label"] == "job")
            .collect();
        assert_eq!(
            job_rules.last().map(|r| &r["replacement"]),
            Some(&json!("etcd-operator-controller")),
            "the monitor's own relabeling comes after the default job"
        );
        assert_eq!(rules[rules.len() - 1]["action"], "keep");
    }

    #[test]
    fn a_pod_monitor_keeps_its_port_and_job_label() {
        let pmon = json!({
            "kind": "PodMonitor", "metadata": {"name": "members", "namespace": "ops"},
            "spec": {
                "jobLabel": "app.kubernetes.io/name", "podTargetLabels": ["etcd_cluster"],
                "namespaceSelector": {"any": true},
                "selector": {"matchLabels": {"app.kubernetes.io/component": "member"}},
                "podMetricsEndpoints": [{"port": "metrics"}, {"port": "client",
                    "relabelings": [{"action": "keep", "sourceLabels": ["__meta_kubernetes_pod_annotation_x"], "regex": "true"}]}],
            },
        });
        let jobs =
            jobs_of(&[pmon], ServiceDiscoveryRole::Endpoints, Path::new("/k")).expect("jobs");
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[1]["job_name"], "podMonitor/ops/members/1");
        assert!(
            jobs[0]["kubernetes_sd_configs"][0]
                .get("namespaces")
                .is_none(),
            "any namespace"
        );
        let rules = jobs[1]["relabel_configs"].as_array().expect("rules");
        assert!(rules.contains(&json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": "client"})));
        assert!(rules.contains(&json!({"source_labels": ["__meta_kubernetes_pod_label_etcd_cluster"], "target_label": "etcd_cluster", "regex": "(.+)", "replacement": "${1}"})));
        assert!(rules.contains(&json!({"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"], "target_label": "job", "regex": "(.+)", "replacement": "${1}"})));
        assert!(rules.contains(&json!({"action": "keep", "source_labels": ["__meta_kubernetes_pod_annotation_x"], "regex": "true"})));
    }

    /// A field this does not render is refused, not ignored.
    #[test]
    fn unknown_fields_are_refused() {
        let mut object = smon();
        object["spec"]["endpoints"][0]["bearerTokenFile"] = json!("/t");
        let err = jobs_of(&[object], ServiceDiscoveryRole::Endpoints, Path::new("/k"))
            .expect_err("refused");
        assert!(err.to_string().contains("bearerTokenFile"), "{err}");
    }

    #[test]
    fn crds_parse() {
        assert_eq!(crds().len(), 3);
    }
}
