//! etcd's own Go client as a load generator and history recorder: `hack/clientv3-load`, a small
//! program on `go.etcd.io/etcd/client/v3` ("clientv3", as kube-apiserver and most etcd users
//! talk to etcd) with its default options, so its retry interceptor, `WaitForReady` and
//! round-robin balancing. [`crate::recorder`] uses the Rust `etcd-client`, which retries
//! nothing; this shows what a clientv3 user sees while the operator acts on a cluster.
//!
//! ```ignore
//! use etcd_tests::clientv3::{Clientv3Load, Clientv3Options};
//!
//! let mut options = Clientv3Options::new("scale", recorder::artifacts_dir(), endpoints);
//! options.rate = 100.0;
//! let mut load = Clientv3Load::start(options)?;
//! load.wait_for("100 ok ops", WAIT, |h| ok_ops(h) >= 100).await?;
//! let applied_at = load.set_endpoints(&fewer).await?; // the client follows a member list
//! let report = load.stop().await?;                       // SIGTERM, then the JSON report
//! assert_eq!(report.failed, 0, "{report}");
//! assert!(report.check(CHECK_TIMEOUT)?.passed());       // etcd_lincheck on the history
//! ```
//!
//! The binary is built by `hack/build-tools.sh` (`ONLY=clientv3`) into
//! `TOOLS/clientv3-load/KEY/bin/clientv3-load`, KEY the first 16 hex digits of the SHA-256 of
//! its sources (`go.mod`, `go.sum`, then `*.go` by name), so an edit of the program is a new
//! build. Each run writes `NAME.history.jsonl` (etcd-lincheck's history format),
//! `NAME.report.json`, `NAME.log` (the program's and clientv3's log) and `NAME.endpoints` (the
//! endpoint list it follows) into [`Clientv3Options::dir`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use etcd_lincheck::checks::{HistoryReport, check_history};
use etcd_lincheck::history::{History, parse_history};
use etcd_lincheck::report::render_history;
use etcd_lincheck::search::Limits;
use nix::sys::signal::Signal;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::process::{ManagedProcess, ProcessError};
use crate::recorder::Verdict;
use crate::tools::{Tools, ToolsError};
use crate::wait::{WaitError, poll_until};

/// The program's name, in the tool cache and on disk.
pub const BINARY: &str = "clientv3-load";

/// The program's sources, as this crate was compiled beside them.
pub const SOURCE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../hack/clientv3-load");

/// How long the program may take to apply a new endpoint list (it reads the file every 500 ms).
const ENDPOINTS_APPLIED: Duration = Duration::from_secs(5);

/// The line the program logs on each endpoint list it applies: `... at NS ns: A,B,C`.
const APPLIED_MARK: &str = "endpoints applied at ";

/// Lines of the program's log shown with an error.
const LOG_LINES: usize = 30;

/// Errors of a clientv3 load run.
#[derive(Debug, thiserror::Error)]
pub enum Clientv3Error {
    /// The binary is not built, or the tool cache cannot be found.
    #[error(transparent)]
    Tools(#[from] ToolsError),
    /// A file could not be read or written.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The program did not start.
    #[error(transparent)]
    Process(#[from] ProcessError),
    /// Options that cannot work.
    #[error("bad clientv3 load options: {0}")]
    Options(String),
    /// The program exited before it was stopped, or stopped with a failure.
    #[error("clientv3-load exited ({status}); log {log_path}:\n{log}")]
    Exited {
        /// Its exit status.
        status: String,
        /// Its log file.
        log_path: PathBuf,
        /// Its log tail.
        log: String,
    },
    /// A wait ran out.
    #[error("{wait}\nclientv3-load log {log_path}:\n{log}")]
    Wait {
        /// The wait.
        wait: Box<WaitError>,
        /// Its log file.
        log_path: PathBuf,
        /// Its log tail.
        log: String,
    },
    /// The JSON report does not parse.
    #[error("the report {path} does not parse: {source}")]
    Report {
        /// The file.
        path: PathBuf,
        /// The error.
        source: serde_json::Error,
    },
    /// The history does not parse (a bug of the program).
    #[error("the history does not parse: {0}")]
    History(#[from] etcd_lincheck::InputError),
    /// The run was started without a history.
    #[error("the run wrote no history")]
    NoHistory,
}

/// What a run does; the program's flags.
#[derive(Clone, Debug)]
pub struct Clientv3Options {
    /// The run's name: its files are `DIR/NAME.*`.
    pub name: String,
    /// Where the history, report, log and endpoints file go (kept as CI artifacts).
    pub dir: PathBuf,
    /// The client URLs at the start (see [`Clientv3Load::set_endpoints`] for later).
    pub endpoints: Vec<String>,
    /// Operations per second over every client (`--rate`).
    pub rate: f64,
    /// Clients, each its own `clientv3.Client` sending one request at a time (`--clients`).
    pub clients: usize,
    /// Keys (`--keys`).
    pub keys: usize,
    /// The key prefix, empty at the start; `None`: the program's `/clientv3-load/UNIXNANO/`.
    pub prefix: Option<String>,
    /// The per-request timeout (`--timeout`): a request timing out has an unknown outcome.
    pub request_timeout: Duration,
    /// Whether to write the history (`--history`).
    pub history: bool,
    /// The binary; `None`: the one `hack/build-tools.sh` built ([`binary`]).
    pub binary: Option<PathBuf>,
}

impl Clientv3Options {
    /// The program's defaults (2 clients, 50 operations/s, 10 keys, 5 s per request) over
    /// `endpoints`, with a history.
    pub fn new(name: impl Into<String>, dir: impl Into<PathBuf>, endpoints: Vec<String>) -> Self {
        Clientv3Options {
            name: name.into(),
            dir: dir.into(),
            endpoints,
            rate: 50.0,
            clients: 2,
            keys: 10,
            prefix: None,
            request_timeout: Duration::from_secs(5),
            history: true,
            binary: None,
        }
    }
}

/// The first 16 hex digits of the SHA-256 of the program's sources in `dir`: `go.mod`,
/// `go.sum`, then every `*.go` by name (as `hack/build-tools.sh` computes it).
pub fn source_key(dir: &Path) -> Result<String, Clientv3Error> {
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| Clientv3Error::Io { what, path, source }
    };
    let mut go_files: Vec<String> = std::fs::read_dir(dir)
        .map_err(io("listing", dir))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.ends_with(".go") && !n.starts_with('.'))
        .collect();
    go_files.sort();
    let mut hash = Sha256::new();
    for name in ["go.mod", "go.sum"]
        .into_iter()
        .map(str::to_string)
        .chain(go_files)
    {
        let path = dir.join(name);
        hash.update(std::fs::read(&path).map_err(io("reading", &path))?);
    }
    let digest = hash.finalize();
    Ok(digest.iter().take(8).map(|b| format!("{b:02x}")).collect())
}

/// The built program: `TOOLS/clientv3-load/KEY/bin/clientv3-load` with its `.complete` marker.
pub fn binary(tools: &Tools) -> Result<PathBuf, Clientv3Error> {
    let dir = tools
        .root()
        .join(BINARY)
        .join(source_key(Path::new(SOURCE_DIR))?);
    let path = dir.join("bin").join(BINARY);
    if dir.join(".complete").is_file() && path.is_file() {
        Ok(path)
    } else {
        Err(ToolsError::Missing {
            tool: BINARY.to_string(),
            path,
            root: tools.root().to_path_buf(),
        }
        .into())
    }
}

/// A running load: the program, killed with the test binary.
#[derive(Debug)]
pub struct Clientv3Load {
    name: String,
    process: ManagedProcess,
    endpoints_file: PathBuf,
    history: Option<PathBuf>,
    report: PathBuf,
    stop_grace: Duration,
}

impl Clientv3Load {
    /// Writes the endpoints file and starts the program on it (it runs until [`Self::stop`]).
    pub fn start(options: Clientv3Options) -> Result<Self, Clientv3Error> {
        if options.endpoints.is_empty()
            || options.clients == 0
            || options.keys == 0
            || options.rate <= 0.0
            || options.request_timeout.is_zero()
        {
            return Err(Clientv3Error::Options(
                "an endpoint, a client, a key, a positive rate and timeout".into(),
            ));
        }
        let program = match &options.binary {
            Some(path) => path.clone(),
            None => binary(&Tools::from_env()?)?,
        };
        let file = |suffix: &str| options.dir.join(format!("{}.{suffix}", options.name));
        std::fs::create_dir_all(&options.dir).map_err(|source| Clientv3Error::Io {
            what: "creating",
            path: options.dir.clone(),
            source,
        })?;
        let endpoints_file = file("endpoints");
        let history = options.history.then(|| file("history.jsonl"));
        let report = file("report.json");
        for stale in [Some(&report), history.as_ref()].into_iter().flatten() {
            let _ = std::fs::remove_file(stale);
        }
        write_endpoints(&endpoints_file, &options.endpoints)?;
        let mut command = Command::new(&program);
        command
            .arg(format!("--endpoints-file={}", endpoints_file.display()))
            .arg(format!("--rate={}", options.rate))
            .arg(format!("--clients={}", options.clients))
            .arg(format!("--keys={}", options.keys))
            .arg(format!(
                "--timeout={}ms",
                options.request_timeout.as_millis()
            ))
            .arg(format!("--report={}", report.display()));
        if let Some(prefix) = &options.prefix {
            command.arg(format!("--prefix={prefix}"));
        }
        if let Some(history) = &history {
            command.arg(format!("--history={}", history.display()));
        }
        let process = ManagedProcess::start_command(
            &format!("{BINARY} {}", options.name),
            command,
            file("log"),
            false,
        )?;
        Ok(Clientv3Load {
            name: options.name,
            process,
            endpoints_file,
            history,
            report,
            stop_grace: options.request_timeout + Duration::from_secs(5),
        })
    }

    /// The run's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The program's log (its own lines and clientv3's warnings).
    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The history file, if the run writes one.
    pub fn history_path(&self) -> Option<&Path> {
        self.history.as_deref()
    }

    /// An error if the program has exited (it runs until stopped).
    fn ensure_running(&mut self) -> Result<(), Clientv3Error> {
        match self.process.exit_status() {
            Some(status) => Err(self.exited(status.to_string())),
            None => Ok(()),
        }
    }

    fn exited(&self, status: String) -> Clientv3Error {
        Clientv3Error::Exited {
            status,
            log_path: self.log_path().to_path_buf(),
            log: self.process.log_tail(LOG_LINES),
        }
    }

    fn wait_error(&self, wait: WaitError) -> Clientv3Error {
        Clientv3Error::Wait {
            wait: Box::new(wait),
            log_path: self.log_path().to_path_buf(),
            log: self.process.log_tail(LOG_LINES),
        }
    }

    /// Changes the endpoint list the clients use, as a client following the member list does:
    /// rewrites the endpoints file and waits until the program has applied it (each client's
    /// `SetEndpoints`). Returns when that was, on the history's clock.
    pub async fn set_endpoints(&mut self, endpoints: &[String]) -> Result<Duration, Clientv3Error> {
        if endpoints.is_empty() {
            return Err(Clientv3Error::Options("an empty endpoint list".into()));
        }
        write_endpoints(&self.endpoints_file, endpoints)?;
        let wanted = endpoints.join(",");
        let log = self.log_path().to_path_buf();
        let what = format!("clientv3-load to apply the endpoints {wanted}");
        let applied = poll_until(&what, ENDPOINTS_APPLIED, || {
            let running = self.process.exit_status().is_none();
            let last = last_applied(&log);
            let wanted = &wanted;
            async move {
                match last {
                    Some((at, list)) if &list == wanted => Ok(Some(at)),
                    _ if !running => Err("clientv3-load exited".to_string()),
                    Some((_, list)) => Err(format!("still on {list}")),
                    None => Ok(None),
                }
            }
        })
        .await;
        applied.map_err(|wait| self.wait_error(wait))
    }

    /// The history so far (its complete lines; empty before the first operation).
    pub fn history(&self) -> Result<History, Clientv3Error> {
        let path = self.history.as_ref().ok_or(Clientv3Error::NoHistory)?;
        read_history(path, true)
    }

    /// Waits until `condition` holds for the history so far and returns that history; fails
    /// at once if the program exits.
    pub async fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        condition: impl Fn(&History) -> bool,
    ) -> Result<History, Clientv3Error> {
        let path = self.history.clone().ok_or(Clientv3Error::NoHistory)?;
        let condition = &condition;
        let path = &path;
        let found = poll_until(what, timeout, || {
            let running = self.ensure_running();
            async move {
                running?;
                let history = read_history(path, true)?;
                Ok::<_, Clientv3Error>(condition(&history).then_some(history))
            }
        })
        .await;
        match found {
            Ok(history) => Ok(history),
            Err(wait) => {
                self.ensure_running()?;
                Err(self.wait_error(wait))
            }
        }
    }

    /// Stops the run: SIGTERM (no new request; those in flight get their answer or their
    /// timeout), waits for a clean exit, and reads the report.
    pub async fn stop(mut self) -> Result<Clientv3Report, Clientv3Error> {
        self.process.signal(Signal::SIGTERM);
        let process = &mut self.process;
        let exited = poll_until("clientv3-load to exit", self.stop_grace, || {
            let status = process.exit_status();
            async move { Ok::<_, String>(status) }
        })
        .await;
        let status = match exited {
            Ok(status) => status,
            Err(wait) => {
                self.process.kill();
                return Err(self.wait_error(wait));
            }
        };
        if !status.success() {
            return Err(self.exited(status.to_string()));
        }
        let data = std::fs::read(&self.report).map_err(|source| Clientv3Error::Io {
            what: "reading",
            path: self.report.clone(),
            source,
        })?;
        let mut report: Clientv3Report =
            serde_json::from_slice(&data).map_err(|source| Clientv3Error::Report {
                path: self.report.clone(),
                source,
            })?;
        report.name = self.name.clone();
        report.history = self.history.clone();
        report.log = self.log_path().to_path_buf();
        report.report_file = self.report.clone();
        Ok(report)
    }
}

/// Writes the endpoints file whole (the program never reads half of it).
fn write_endpoints(path: &Path, endpoints: &[String]) -> Result<(), Clientv3Error> {
    let tmp = path.with_extension("endpoints.tmp");
    std::fs::write(&tmp, format!("{}\n", endpoints.join(",")))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Clientv3Error::Io {
            what: "writing",
            path: path.to_path_buf(),
            source,
        })
}

/// The last endpoint list the program logged as applied, with its history time.
fn last_applied(log: &Path) -> Option<(Duration, String)> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines().rev().find_map(|line| {
        let rest = &line[line.find(APPLIED_MARK)? + APPLIED_MARK.len()..];
        let (ns, list) = rest.split_once(" ns: ")?;
        Some((Duration::from_nanos(ns.parse().ok()?), list.to_string()))
    })
}

/// Reads a history; `partial`: only its complete lines (the program may be writing one), and
/// no line at all is an empty history.
fn read_history(path: &Path, partial: bool) -> Result<History, Clientv3Error> {
    let bytes = std::fs::read(path).map_err(|source| Clientv3Error::Io {
        what: "reading",
        path: path.to_path_buf(),
        source,
    })?;
    let complete = match bytes.iter().rposition(|&b| b == b'\n') {
        Some(end) if partial => &bytes[..=end],
        None if partial => return Ok(History::default()),
        _ => &bytes[..],
    };
    Ok(parse_history(&path.display().to_string(), complete)?)
}

/// An endpoint list the program applied.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct EndpointChange {
    /// When, on the history's clock (ns).
    pub at_ns: u64,
    /// The list.
    pub endpoints: Vec<String>,
}

/// The program's JSON report, read at [`Clientv3Load::stop`].
#[derive(Clone, Debug, Deserialize)]
pub struct Clientv3Report {
    /// The run's name.
    #[serde(skip)]
    pub name: String,
    /// Operations sent.
    pub ops: u64,
    /// Answered ok.
    pub ok: u64,
    /// Answered with an error after clientv3's own retries (a timeout too): what a caller of
    /// clientv3 would have seen fail.
    pub failed: u64,
    /// Of the failed, definitely not applied.
    pub not_applied: u64,
    /// Of the failed, maybe applied (unknown outcome; the timeouts are here).
    pub unknown: u64,
    /// Writes answered ok.
    pub ok_writes: u64,
    /// From the start to the stop of the traffic (ms).
    pub duration_ms: f64,
    /// Operations per second over that time.
    pub ops_per_sec: f64,
    /// The longest time between the calls of consecutive ok writes, from the start and to the
    /// stop of the traffic (ms).
    pub longest_without_write_ms: f64,
    /// The failed requests per error message.
    pub errors: BTreeMap<String, u64>,
    /// The first failure's return, on the history's clock (ms).
    pub first_error_ms: Option<f64>,
    /// The last failure's return (ms).
    pub last_error_ms: Option<f64>,
    /// The first failure's wall-clock time (RFC 3339, UTC).
    pub first_error_at: Option<String>,
    /// The last failure's wall-clock time.
    pub last_error_at: Option<String>,
    /// Ok answers per endpoint (the peer of the last attempt; `""`: none reached).
    pub ok_by_endpoint: BTreeMap<String, u64>,
    /// The endpoint lists applied, the first at the start.
    pub endpoint_changes: Vec<EndpointChange>,
    /// The key prefix of the run.
    pub prefix: String,
    /// When the program started (RFC 3339, UTC): the history's time 0, near enough.
    pub started_at: String,
    /// Its clients.
    pub clients: usize,
    /// Its target rate (operations per second).
    pub rate: f64,
    /// The history file.
    #[serde(skip)]
    pub history: Option<PathBuf>,
    /// The program's log.
    #[serde(skip)]
    pub log: PathBuf,
    /// The JSON report.
    #[serde(skip)]
    pub report_file: PathBuf,
}

/// The checks of a run's history by `etcd_lincheck`.
#[derive(Clone, Debug)]
pub struct HistoryCheck {
    /// Linearizability per key.
    pub linearizability: Verdict,
    /// Violations of every check (linearizability, revisions, ...).
    pub violations: usize,
    /// Every check's figures.
    pub report: HistoryReport,
    /// The checker's text (for a violation, the slice of history showing it).
    pub text: String,
}

impl HistoryCheck {
    /// Whether every check passed and linearizability was decided.
    pub fn passed(&self) -> bool {
        self.linearizability == Verdict::Ok && self.violations == 0
    }
}

impl Clientv3Report {
    /// The run's whole history.
    pub fn history(&self) -> Result<History, Clientv3Error> {
        let path = self.history.as_ref().ok_or(Clientv3Error::NoHistory)?;
        read_history(path, false)
    }

    /// Checks the history with `etcd_lincheck` (linearizability per key, revisions, ...),
    /// the search bounded by `timeout`; the checker's text is also written beside the history
    /// (`NAME.check.txt`). CPU-bound: from async code on a large history, call it in
    /// `spawn_blocking`.
    pub fn check(&self, timeout: Duration) -> Result<HistoryCheck, Clientv3Error> {
        let started = std::time::Instant::now();
        let history = self.history()?;
        let limits = Limits {
            deadline: started.checked_add(timeout),
            max_cache_bytes: 512 << 20,
        };
        let report = check_history(&history, &limits);
        let file = self
            .history
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let text = render_history(
            &file,
            &history,
            &report,
            started.elapsed().as_secs_f64() * 1e3,
        );
        if let Some(path) = &self.history {
            let out = path.with_extension("").with_extension("check.txt");
            std::fs::write(&out, &text).map_err(|source| Clientv3Error::Io {
                what: "writing",
                path: out,
                source,
            })?;
        }
        let linearizability = if !report.linearizability.violations.is_empty() {
            Verdict::Violation(report.linearizability.violations.len())
        } else if report.undecided() {
            Verdict::Undecided
        } else {
            Verdict::Ok
        };
        Ok(HistoryCheck {
            linearizability,
            violations: report.violations(),
            report,
            text,
        })
    }
}

impl fmt::Display for Clientv3Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "clientv3 run {}: {} operations in {:.1} s ({:.0}/s): {} ok, {} failed ({} not applied, {} unknown); longest without an ok write {:.0} ms",
            self.name,
            self.ops,
            self.duration_ms / 1e3,
            self.ops_per_sec,
            self.ok,
            self.failed,
            self.not_applied,
            self.unknown,
            self.longest_without_write_ms,
        )?;
        if let (Some(first), Some(last)) = (self.first_error_ms, self.last_error_ms) {
            write!(
                f,
                "; errors from {first:.0} ms to {last:.0} ms: {:?}",
                self.errors
            )?;
        }
        write!(f, "; ok by endpoint {:?}", self.ok_by_endpoint)?;
        if let Some(history) = &self.history {
            write!(f, "; history {}", history.display())?;
        }
        write!(f, "; log {}", self.log.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_applied_line_is_found() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("log");
        std::fs::write(
            &log,
            "clientv3-load 2026/12/06 17:02:17.023904 endpoints applied at 2719272 ns: http://a:1,http://b:2\n\
             {\"level\":\"warn\"}\n\
             clientv3-load 2026/12/06 17:02:19.023904 endpoints applied at 4000000000 ns: http://a:1\n",
        )
        .expect("write");
        assert_eq!(
            last_applied(&log),
            Some((Duration::from_secs(4), "http://a:1".to_string()))
        );
    }

    #[test]
    fn a_partial_history_is_read_to_its_last_complete_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("h.jsonl");
        let line = r#"{"kind":"op","id":1,"client":0,"endpoint":"e","call":1,"return":2,"op":{"type":"put","key":"k","value":"v"},"result":{"status":"ok","revision":2}}"#;
        std::fs::write(&path, "").expect("write");
        assert!(read_history(&path, true).expect("empty").ops.is_empty());
        std::fs::write(&path, format!("{line}\n{{\"kind\":\"op\",\"id\"")).expect("write");
        assert_eq!(read_history(&path, true).expect("partial").ops.len(), 1);
        assert!(read_history(&path, false).is_err());
    }

    #[test]
    fn the_source_key_is_stable_and_hex() {
        let a = source_key(Path::new(SOURCE_DIR)).expect("the sources");
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_eq!(source_key(Path::new(SOURCE_DIR)).expect("again"), a);
    }
}
