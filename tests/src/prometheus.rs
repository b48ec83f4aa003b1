//! A real Prometheus for the tests: `prometheus` and `promtool` (built by
//! `hack/build-tools.sh` from the Go module proxy at `PROMETHEUS_VERSION`), a server started
//! like the control plane's components (a free loopback port, a temporary directory, stopped on
//! drop, dies with the test binary), and a small client for its HTTP API.
//!
//! Targets are discovered the way a cluster's Prometheus finds them: `kubernetes_sd_configs`
//! against the local API server (the harness's admin kubeconfig), each job relabelled as the
//! Prometheus Operator renders the ServiceMonitor or PodMonitor it comes from
//! ([`monitors`]). A Prometheus started in the test process shares its network namespace, so
//! it reaches the process kubelet's pod IPs.
//!
//! ```no_run
//! # async fn demo(cp: &etcd_tests::ControlPlane) -> Result<(), etcd_tests::prometheus::PrometheusError> {
//! use etcd_tests::prometheus::{Prometheus, PrometheusConfig};
//! let config = PrometheusConfig::default();
//! let prometheus = Prometheus::start(cp.tools(), &config).await?;
//! let up = prometheus.query("up == 1").await?;
//! # let _ = up;
//! # Ok(())
//! # }
//! ```

pub mod dashboard;
pub mod monitors;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Deserialize;
use serde_json::Value;

use crate::ports::free_ports;
use crate::process::{ManagedProcess, ProcessError};
use crate::tools::{Tools, ToolsError};

/// Errors while starting, configuring or asking Prometheus, or running promtool.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    /// `prometheus` or `promtool` is not built.
    #[error(transparent)]
    Tool(#[from] ToolsError),
    /// A file or port could not be had.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The process did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// The configuration could not be written as YAML.
    #[error("writing the configuration: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// The server did not become ready or exited.
    #[error("prometheus did not start: {reason}\n{log}")]
    NotReady {
        /// What was seen last.
        reason: String,
        /// The end of its log.
        log: String,
    },
    /// An HTTP exchange failed.
    #[error("{path}: {message}")]
    Http {
        /// The request path.
        path: String,
        /// What went wrong.
        message: String,
    },
    /// The API answered an error.
    #[error("{path}: {error_type}: {error}")]
    Api {
        /// The request path.
        path: String,
        /// Prometheus' `errorType`.
        error_type: String,
        /// Prometheus' `error`.
        error: String,
    },
    /// promtool failed or reported problems.
    #[error("promtool {args}: {output}")]
    Promtool {
        /// Its arguments.
        args: String,
        /// Its stdout and stderr.
        output: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PrometheusError {
    let what = what.into();
    move |source| PrometheusError::Io { what, source }
}

/// What Prometheus scrapes and evaluates: `prometheus.yml` in YAML, built from values.
#[derive(Debug, Clone)]
pub struct PrometheusConfig {
    /// `global.scrape_interval` (default 2 s: tests wait for few scrapes).
    pub scrape_interval: Duration,
    /// `global.evaluation_interval` (default 1 s).
    pub evaluation_interval: Duration,
    /// `scrape_configs`, each a job as the Prometheus Operator renders it (see [`monitors`]).
    pub scrape_configs: Vec<Value>,
    /// Rule files: name (without directory) and contents, written to the server's rules
    /// directory and loaded with `rule_files: [rules/*.yaml]`.
    pub rule_files: BTreeMap<String, String>,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        Self {
            scrape_interval: Duration::from_secs(2),
            evaluation_interval: Duration::from_secs(1),
            scrape_configs: Vec::new(),
            rule_files: BTreeMap::new(),
        }
    }
}

fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

impl PrometheusConfig {
    /// The `prometheus.yml` text, with rule files in `rules_dir`.
    pub fn to_yaml(&self, rules_dir: &Path) -> Result<String, PrometheusError> {
        let config = serde_json::json!({
            "global": {
                "scrape_interval": go_duration(self.scrape_interval),
                "scrape_timeout": go_duration(self.scrape_interval.min(Duration::from_secs(10))),
                "evaluation_interval": go_duration(self.evaluation_interval),
            },
            "rule_files": [rules_dir.join("*.yaml").display().to_string()],
            "scrape_configs": self.scrape_configs,
        });
        Ok(serde_yaml::to_string(&config)?)
    }
}

/// One sample of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series' labels (with `__name__` when the expression keeps it).
    pub metric: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, or `""`.
    pub fn label(&self, name: &str) -> &str {
        self.metric.get(name).map_or("", String::as_str)
    }
}

/// An active scrape target, as `/api/v1/targets` reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Target {
    /// The labels the target's series get (after relabelling).
    pub labels: BTreeMap<String, String>,
    /// The labels discovery gave, before relabelling.
    pub discovered_labels: BTreeMap<String, String>,
    /// The job's name in the configuration (`scrape_configs[].job_name`).
    pub scrape_pool: String,
    /// The URL scraped.
    pub scrape_url: String,
    /// `up`, `down` or `unknown`.
    pub health: String,
    /// The last scrape's error, if any.
    #[serde(default)]
    pub last_error: String,
}

/// An alert, as `/api/v1/alerts` reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    /// Its labels (`alertname`, `severity`, the series' labels).
    pub labels: BTreeMap<String, String>,
    /// Its annotations, templates expanded.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// `pending` or `firing`.
    pub state: String,
    /// When it became active (RFC 3339), if it is.
    #[serde(default)]
    pub active_at: Option<String>,
}

impl Alert {
    /// Its `alertname`.
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }
}

/// A rule as `/api/v1/rules` reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// The alert's or the recorded series' name.
    pub name: String,
    /// `alerting` or `recording`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The expression, as Prometheus formats it.
    pub query: String,
    /// `ok`, `err` or `unknown`.
    pub health: String,
    /// The last evaluation's error, if any.
    #[serde(default)]
    pub last_error: String,
    /// Alerting rules: `inactive`, `pending` or `firing`.
    #[serde(default)]
    pub state: String,
    /// Alerting rules: the `for:` duration, in seconds.
    #[serde(default)]
    pub duration: f64,
}

/// A rule group as `/api/v1/rules` reports it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleGroup {
    /// The group's name.
    pub name: String,
    /// The file it was loaded from.
    pub file: String,
    /// Its rules.
    pub rules: Vec<Rule>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Value,
    #[serde(default)]
    error_type: String,
    #[serde(default)]
    error: String,
}

/// A client for a Prometheus server's HTTP API (plain HTTP, one keep-alive pool).
#[derive(Clone, Debug)]
pub struct PrometheusClient {
    base: String,
    http: Client<HttpConnector, Full<Bytes>>,
}

impl PrometheusClient {
    /// A client of the server at `base` (`http://HOST:PORT`).
    pub fn new(base: impl Into<String>) -> Self {
        Self {
            base: base.into(),
            http: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `method path` with `body` (form-encoded when given): the status and the body's text.
    pub async fn request(
        &self,
        method: http::Method,
        path: &str,
        form: Option<&[(&str, &str)]>,
    ) -> Result<(http::StatusCode, String), PrometheusError> {
        let fail = |message: String| PrometheusError::Http {
            path: path.to_string(),
            message,
        };
        let mut request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        let body = match form {
            Some(pairs) => {
                request = request.header("content-type", "application/x-www-form-urlencoded");
                Bytes::from(form_encode(pairs))
            }
            None => Bytes::new(),
        };
        let request = request
            .body(Full::new(body))
            .map_err(|e| fail(e.to_string()))?;
        let response = tokio::time::timeout(Duration::from_secs(30), self.http.request(request))
            .await
            .map_err(|_| fail("no answer in 30 s".into()))?
            .map_err(|e| fail(e.to_string()))?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| fail(e.to_string()))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    }

    /// An API call: the `data` of a `status: success` answer, else [`PrometheusError::Api`].
    async fn api(
        &self,
        path: &str,
        form: Option<&[(&str, &str)]>,
    ) -> Result<Value, PrometheusError> {
        let method = if form.is_some() {
            http::Method::POST
        } else {
            http::Method::GET
        };
        let (status, text) = self.request(method, path, form).await?;
        let envelope: Envelope =
            serde_json::from_str(&text).map_err(|e| PrometheusError::Http {
                path: path.to_string(),
                message: format!("HTTP {status}, not an API answer ({e}): {text:.300}"),
            })?;
        if envelope.status == "success" {
            Ok(envelope.data)
        } else {
            Err(PrometheusError::Api {
                path: path.to_string(),
                error_type: envelope.error_type,
                error: envelope.error,
            })
        }
    }

    fn decode<T: serde::de::DeserializeOwned>(
        path: &str,
        value: Value,
    ) -> Result<T, PrometheusError> {
        serde_json::from_value(value).map_err(|e| PrometheusError::Http {
            path: path.to_string(),
            message: format!("unexpected answer: {e}"),
        })
    }

    /// `POST /api/v1/query`: the instant vector (or scalar, as one sample without labels)
    /// `expr` evaluates to now.
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>, PrometheusError> {
        let data = self.api("/api/v1/query", Some(&[("query", expr)])).await?;
        parse_query_result(&data).map_err(|message| PrometheusError::Http {
            path: format!("/api/v1/query {expr}"),
            message,
        })
    }

    /// `GET /api/v1/targets?state=active`: every active target.
    pub async fn targets(&self) -> Result<Vec<Target>, PrometheusError> {
        let path = "/api/v1/targets?state=active";
        let mut data = self.api(path, None).await?;
        Self::decode(path, data["activeTargets"].take())
    }

    /// `GET /api/v1/alerts`: every pending or firing alert.
    pub async fn alerts(&self) -> Result<Vec<Alert>, PrometheusError> {
        let path = "/api/v1/alerts";
        let mut data = self.api(path, None).await?;
        Self::decode(path, data["alerts"].take())
    }

    /// `GET /api/v1/rules`: every rule group loaded.
    pub async fn rules(&self) -> Result<Vec<RuleGroup>, PrometheusError> {
        let path = "/api/v1/rules";
        let mut data = self.api(path, None).await?;
        Self::decode(path, data["groups"].take())
    }

    /// `GET /-/ready` answered 200.
    pub async fn ready(&self) -> bool {
        matches!(
            self.request(http::Method::GET, "/-/ready", None).await,
            Ok((status, _)) if status.is_success()
        )
    }
}

fn form_encode(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", percent_encode(k), percent_encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The samples of a `/api/v1/query` answer's `data`.
fn parse_query_result(data: &Value) -> Result<Vec<Sample>, String> {
    let value_of = |pair: &Value| -> Result<f64, String> {
        let text = pair
            .get(1)
            .and_then(Value::as_str)
            .ok_or_else(|| format!("not a [time, \"value\"] pair: {pair}"))?;
        match text {
            "NaN" => Ok(f64::NAN),
            "+Inf" => Ok(f64::INFINITY),
            "-Inf" => Ok(f64::NEG_INFINITY),
            _ => text.parse().map_err(|e| format!("value {text:?}: {e}")),
        }
    };
    match data["resultType"].as_str() {
        Some("vector") => data["result"]
            .as_array()
            .ok_or("a vector without a result")?
            .iter()
            .map(|item| {
                let metric = serde_json::from_value(item["metric"].clone())
                    .map_err(|e| format!("labels: {e}"))?;
                Ok(Sample {
                    metric,
                    value: value_of(&item["value"])?,
                })
            })
            .collect(),
        Some("scalar") => Ok(vec![Sample {
            metric: BTreeMap::new(),
            value: value_of(&data["result"])?,
        }]),
        other => Err(format!("result type {other:?}: {data}")),
    }
}

/// A running Prometheus. Dropping it stops the process and removes its directory.
pub struct Prometheus {
    process: ManagedProcess,
    client: PrometheusClient,
    config_path: PathBuf,
    rules_dir: PathBuf,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Prometheus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prometheus")
            .field("url", &self.client.base)
            .field("config", &self.config_path)
            .finish_non_exhaustive()
    }
}

impl Prometheus {
    /// Writes `config`, starts `prometheus` on a free loopback port (TSDB in a temporary
    /// directory, `--web.enable-lifecycle` for [`Self::reload`]) and waits up to 60 s for
    /// `/-/ready`.
    pub async fn start(tools: &Tools, config: &PrometheusConfig) -> Result<Self, PrometheusError> {
        let binary = tools.prometheus()?;
        let dir = tempfile::Builder::new()
            .prefix("etcd-operator-prometheus-")
            .tempdir()
            .map_err(io("creating Prometheus' directory"))?;
        let rules_dir = dir.path().join("rules");
        std::fs::create_dir_all(&rules_dir).map_err(io("creating the rules directory"))?;
        let config_path = dir.path().join("prometheus.yml");
        write_config(config, &config_path, &rules_dir)?;
        let [port] = free_ports::<1>().map_err(io("finding a free port"))?;
        let args = vec![
            format!("--config.file={}", config_path.display()),
            format!("--storage.tsdb.path={}", dir.path().join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--web.enable-lifecycle".to_string(),
            "--log.level=info".to_string(),
        ];
        let process = ManagedProcess::start(
            "prometheus",
            &binary,
            &args,
            dir.path().join("prometheus.log"),
        )?;
        let mut server = Self {
            process,
            client: PrometheusClient::new(format!("http://127.0.0.1:{port}")),
            config_path,
            rules_dir,
            _dir: dir,
        };
        server.wait_ready().await?;
        Ok(server)
    }

    async fn wait_ready(&mut self) -> Result<(), PrometheusError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.process.exit_status() {
                return Err(PrometheusError::NotReady {
                    reason: format!("prometheus exited: {status}"),
                    log: self.process.log_tail(30),
                });
            }
            if self.client.ready().await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(PrometheusError::NotReady {
                    reason: "/-/ready not 200 after 60 s".into(),
                    log: self.process.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Writes `config` (replacing every rule file) and asks the server to load it
    /// (`POST /-/reload`); an error when it refuses the new configuration.
    pub async fn reload(&self, config: &PrometheusConfig) -> Result<(), PrometheusError> {
        for entry in std::fs::read_dir(&self.rules_dir).map_err(io("listing the rules"))? {
            let path = entry.map_err(io("listing the rules"))?.path();
            std::fs::remove_file(&path).map_err(io(format!("removing {}", path.display())))?;
        }
        write_config(config, &self.config_path, &self.rules_dir)?;
        let (status, text) = self
            .client
            .request(http::Method::POST, "/-/reload", None)
            .await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(PrometheusError::Http {
                path: "/-/reload".into(),
                message: format!("HTTP {status}: {text}"),
            })
        }
    }

    /// The API client.
    pub fn client(&self) -> &PrometheusClient {
        &self.client
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.client.base
    }

    /// See [`PrometheusClient::query`].
    pub async fn query(&self, expr: &str) -> Result<Vec<Sample>, PrometheusError> {
        self.client.query(expr).await
    }

    /// See [`PrometheusClient::targets`].
    pub async fn targets(&self) -> Result<Vec<Target>, PrometheusError> {
        self.client.targets().await
    }

    /// See [`PrometheusClient::alerts`].
    pub async fn alerts(&self) -> Result<Vec<Alert>, PrometheusError> {
        self.client.alerts().await
    }

    /// See [`PrometheusClient::rules`].
    pub async fn rules(&self) -> Result<Vec<RuleGroup>, PrometheusError> {
        self.client.rules().await
    }

    /// The configuration file in use.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }
}

fn write_config(
    config: &PrometheusConfig,
    config_path: &Path,
    rules_dir: &Path,
) -> Result<(), PrometheusError> {
    for (name, text) in &config.rule_files {
        let path = rules_dir.join(name);
        std::fs::write(&path, text).map_err(io(format!("writing {}", path.display())))?;
    }
    std::fs::write(config_path, config.to_yaml(rules_dir)?)
        .map_err(io(format!("writing {}", config_path.display())))
}

/// `promtool` at the pinned version.
#[derive(Debug, Clone)]
pub struct Promtool {
    binary: PathBuf,
}

impl Promtool {
    /// The pinned `promtool` of `tools`.
    pub fn new(tools: &Tools) -> Result<Self, PrometheusError> {
        Ok(Self {
            binary: tools.promtool()?,
        })
    }

    /// Runs `promtool args...` with `stdin`: its exit success and its stdout and stderr.
    pub async fn run(
        &self,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<(bool, String), PrometheusError> {
        use tokio::io::AsyncWriteExt as _;
        let mut child = tokio::process::Command::new(&self.binary)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io(format!("starting {}", self.binary.display())))?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .await
                .map_err(io("writing promtool's stdin"))?;
        }
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .map_err(|_| PrometheusError::Promtool {
                args: args.join(" "),
                output: "did not finish in 120 s".into(),
            })?
            .map_err(io("running promtool"))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text))
    }

    async fn run_ok(&self, args: &[&str], stdin: Option<&str>) -> Result<String, PrometheusError> {
        match self.run(args, stdin).await? {
            (true, output) => Ok(output),
            (false, output) => Err(PrometheusError::Promtool {
                args: args.join(" "),
                output,
            }),
        }
    }

    /// `promtool check metrics` of an exposition text: the linter's complaints, one per
    /// line (empty when clean). Fails only when promtool cannot parse the text at all.
    pub async fn check_metrics(&self, exposition: &str) -> Result<Vec<String>, PrometheusError> {
        let (ok, output) = self.run(&["check", "metrics"], Some(exposition)).await?;
        let problems: Vec<String> = output
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        if !ok && problems.iter().any(|p| p.contains("error while linting")) {
            return Err(PrometheusError::Promtool {
                args: "check metrics".into(),
                output,
            });
        }
        Ok(problems)
    }

    /// `promtool check rules FILE...`: its report, or the error with its output.
    pub async fn check_rules(&self, files: &[&Path]) -> Result<String, PrometheusError> {
        let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let mut args = vec!["check", "rules"];
        args.extend(files.iter().map(String::as_str));
        self.run_ok(&args, None).await
    }

    /// `promtool test rules FILE...`: its report, or the error with its output.
    pub async fn test_rules(&self, files: &[&Path]) -> Result<String, PrometheusError> {
        let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
        let mut args = vec!["test", "rules"];
        args.extend(files.iter().map(String::as_str));
        self.run_ok(&args, None).await
    }

    /// `promtool promql format EXPR` (an experimental command, `--experimental`): the
    /// expression as Prometheus' own parser reads it, or the parse error.
    pub async fn parse_promql(&self, expr: &str) -> Result<String, PrometheusError> {
        self.run_ok(&["--experimental", "promql", "format", expr], None)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_results_parse() {
        let vector = serde_json::json!({"resultType": "vector", "result": [
            {"metric": {"__name__": "up", "job": "etcd"}, "value": [1.5, "1"]},
            {"metric": {}, "value": [1.5, "NaN"]},
        ]});
        let samples = parse_query_result(&vector).expect("vector");
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[0].label("job"), "etcd");
        assert_eq!(samples[0].value, 1.0);
        assert!(samples[1].value.is_nan());
        let scalar = serde_json::json!({"resultType": "scalar", "result": [1.5, "42"]});
        assert_eq!(parse_query_result(&scalar).expect("scalar")[0].value, 42.0);
        assert!(parse_query_result(&serde_json::json!({"resultType": "matrix"})).is_err());
    }

    #[test]
    fn forms_are_percent_encoded() {
        assert_eq!(
            form_encode(&[("query", "up{job=\"etcd\"} == 1")]),
            "query=up%7Bjob%3D%22etcd%22%7D%20%3D%3D%201"
        );
    }

    #[test]
    fn config_names_rules_and_intervals() {
        let config = PrometheusConfig {
            scrape_configs: vec![serde_json::json!({"job_name": "a"})],
            ..PrometheusConfig::default()
        };
        let yaml = config.to_yaml(Path::new("/r")).expect("yaml");
        let parsed: Value = serde_yaml::from_str(&yaml).expect("parse");
        assert_eq!(parsed["global"]["scrape_interval"], "2s");
        assert_eq!(parsed["global"]["evaluation_interval"], "1s");
        assert_eq!(parsed["rule_files"][0], "/r/*.yaml");
        assert_eq!(parsed["scrape_configs"][0]["job_name"], "a");
    }
}
