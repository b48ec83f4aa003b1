//! The recorder of issue 33: client traffic and watches against an etcd cluster while the
//! operator acts on it, every operation recorded in a history (`etcd_lincheck::history`'s
//! JSON Lines), then checked with `etcd_lincheck` (linearizability per key, watches,
//! revisions, serializable reads, availability), plus the members' stores compared.
//!
//! ```ignore
//! use etcd_tests::recorder::{Recorder, RecorderOptions};
//!
//! // The client Service's ready endpoints, followed while the operator acts.
//! let (endpoints, _feed) = recorder::feed(Duration::from_millis(500), list_endpoints).await;
//! let recorder = Recorder::start(RecorderOptions::new("scale-3-5", recorder::artifacts_dir(), endpoints)).await?;
//! scale_to(5).await?;            // the operator acts; the traffic goes on
//! recorder.epoch("recovery").await; // only around an announced recovery from quorum loss
//! let report = recorder.finish(&member_urls).await?;
//! println!("{report}");
//! report.append_markdown_row(&recorder::artifacts_dir().join("runs.md"))?;
//! anyhow::ensure!(report.passed(), "{report}");
//! ```
//!
//! Over mutual TLS the endpoints are `https://IP:2379` and every connection (the clients, the
//! watches, the first read, the final reads and hashes) uses [`RecorderOptions::tls`]. Members
//! are dialled by IP, so the options name the domain their certificate is checked against:
//!
//! ```ignore
//! use etcd_client::{Certificate, Identity, TlsOptions};
//!
//! let tls = TlsOptions::new()
//!     .ca_certificate(Certificate::from_pem(ca_pem))
//!     .identity(Identity::from_pem(client_cert_pem, client_key_pem))
//!     // Matches the members' `*.example.default.svc` certificate.
//!     .domain_name("member.example.default.svc");
//! let options = RecorderOptions::new("tls", recorder::artifacts_dir(), endpoints).with_tls(tls);
//! ```
//!
//! Modules, one job each: [`classify`] (an error's effect: fail or unknown), [`endpoints`]
//! (where each request goes), [`traffic`] (the clients), [`watch`] (the long watches),
//! [`log`] (the history file), [`finish`] (final reads and hashes), [`report`], and
//! [`cluster`] (a loopback cluster without Kubernetes, for the recorder's own tests).

pub mod classify;
pub mod cluster;
pub mod endpoints;
pub mod finish;
pub mod log;
pub mod report;
pub mod traffic;
pub mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_lincheck::checks::check_history;
use etcd_lincheck::history::parse_history;
use etcd_lincheck::report::render_history;
use etcd_lincheck::search::Limits;
use tokio::sync::watch as channel;
use tokio::task::JoinHandle;

use crate::wait::poll_until;

/// How long the watches may take to close at an epoch.
const EPOCH_CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the first read may take (every endpoint tried in turn).
const FIRST_READ_TIMEOUT: Duration = Duration::from_secs(10);

pub use cluster::{ClusterTls, LoopbackCluster};
pub use endpoints::{ClientSpec, NoConnection, Pick, default_clients, feed};
pub use finish::{HashCheck, HashMethod, MemberHash};
pub use log::HistoryLog;
pub use report::{Report, Verdict};
pub use traffic::{Fault, Mix, Progress};
pub use watch::{EpochSignal, WatchProgress};

/// Where histories and reports go unless a test says otherwise:
/// `$ETCD_TESTS_ARTIFACTS_DIR`, else `recorder/` in the Cargo target directory.
pub fn artifacts_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ETCD_TESTS_ARTIFACTS_DIR") {
        return PathBuf::from(dir);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target")),
        PathBuf::from,
    );
    target.join("recorder")
}

/// What a recorder does.
#[derive(Clone, Debug)]
pub struct RecorderOptions {
    /// The run's name: the history is `DIR/NAME.history.jsonl`, the checker's report
    /// `DIR/NAME.report.txt`.
    pub name: String,
    /// The directory of the history and the report (kept as a CI artifact).
    pub dir: PathBuf,
    /// The key prefix (must hold no key at the start); `None`: `/recorder/NAME-MILLIS/`.
    pub prefix: Option<String>,
    /// How many keys (`k0` ...).
    pub keys: usize,
    /// The clients.
    pub clients: Vec<ClientSpec>,
    /// The long watches.
    pub watches: Vec<ClientSpec>,
    /// The operation mix.
    pub mix: Mix,
    /// The target rate, operations per second over every client.
    pub rate: f64,
    /// The per-request timeout.
    pub request_timeout: Duration,
    /// At most this many operations are recorded (then the traffic stops).
    pub max_ops: u64,
    /// At most this many watch events are recorded (then the watches stop).
    pub max_events: u64,
    /// How long the checker may search.
    pub check_timeout: Duration,
    /// A deliberate break of the history (tests of the checks only).
    pub fault: Option<Fault>,
    /// TLS for every connection to `https://` endpoints: the clients' (unless a
    /// [`ClientSpec::tls`] says otherwise), the watches', the first read's and the end's
    /// (final reads and the stores' hashes). `None`: no TLS options (fine for `http://`; for
    /// `https://` etcd-client's empty default trusts no CA and sends no certificate).
    pub tls: Option<etcd_client::TlsOptions>,
    /// TLS options that change while the run goes on (see [`ClientSpec::tls_feed`]): every
    /// client and watch without options of its own takes each new value for its new
    /// connections, and the end's connections the latest. Overrides [`Self::tls`].
    pub tls_feed: Option<channel::Receiver<etcd_client::TlsOptions>>,
}

impl RecorderOptions {
    /// The defaults over `endpoints`: 4 clients (round-robin and sticky, alternately), 2
    /// sticky watches on different members, 10 keys, 100 operations/s, 2 s per request.
    pub fn new(
        name: impl Into<String>,
        dir: impl Into<PathBuf>,
        endpoints: channel::Receiver<Vec<String>>,
    ) -> Self {
        RecorderOptions {
            name: name.into(),
            dir: dir.into(),
            prefix: None,
            keys: 10,
            clients: default_clients(&endpoints, 4),
            watches: vec![
                ClientSpec::sticky(endpoints.clone(), 0),
                ClientSpec::sticky(endpoints, 1),
            ],
            mix: Mix::default(),
            rate: 100.0,
            request_timeout: Duration::from_secs(2),
            max_ops: 100_000,
            max_events: 400_000,
            check_timeout: Duration::from_secs(60),
            fault: None,
            tls: None,
            tls_feed: None,
        }
    }

    /// The same options with `tls` for every connection (see [`RecorderOptions::tls`]).
    /// Members dialled by IP need the options' `domain_name` to match their certificate.
    pub fn with_tls(mut self, tls: etcd_client::TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// The same options with TLS that follows `feed` (see [`RecorderOptions::tls_feed`]).
    pub fn with_tls_feed(mut self, feed: channel::Receiver<etcd_client::TlsOptions>) -> Self {
        self.tls = Some(feed.borrow().clone());
        self.tls_feed = Some(feed);
        self
    }
}

/// Errors of a recorder.
#[derive(Debug, thiserror::Error)]
pub enum RecorderError {
    /// The history file.
    #[error(transparent)]
    Log(#[from] log::LogError),
    /// No endpoint answered the first read.
    #[error("no endpoint answered the first read of {prefix}: {last}")]
    NoEndpoint {
        /// The prefix.
        prefix: String,
        /// The last error.
        last: String,
    },
    /// The prefix already holds keys.
    #[error("the prefix {prefix} holds {count} keys: a history must start from an empty prefix")]
    PrefixNotEmpty {
        /// The prefix.
        prefix: String,
        /// Its keys.
        count: i64,
    },
    /// Options that cannot work.
    #[error("bad recorder options: {0}")]
    Options(String),
    /// The history did not parse (a recorder bug).
    #[error("the history does not parse: {0}")]
    History(#[from] etcd_lincheck::InputError),
    /// The checker's task failed.
    #[error("the checker failed: {0}")]
    Checker(String),
    /// Writing the report failed.
    #[error("writing the report {path}: {source}")]
    Report {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

/// A recording in progress: traffic and watches run until [`Recorder::finish`].
pub struct Recorder {
    name: String,
    prefix: String,
    log: Arc<HistoryLog>,
    traffic: Arc<traffic::Traffic>,
    stop_traffic: channel::Sender<bool>,
    stop_watches: channel::Sender<bool>,
    epochs: channel::Sender<watch::EpochSignal>,
    pause: channel::Sender<bool>,
    request_timeout: Duration,
    clients: Vec<JoinHandle<()>>,
    /// Clients are 0..N and watches N..N+W in the history; the final reads are the next.
    final_client: u64,
    watches: Vec<(JoinHandle<()>, channel::Receiver<WatchProgress>)>,
    report_file: PathBuf,
    check_timeout: Duration,
    started: Instant,
    tls: Option<etcd_client::TlsOptions>,
    tls_feed: Option<channel::Receiver<etcd_client::TlsOptions>>,
}

/// The first read: the prefix is empty, and the revision the watches start after.
async fn first_revision(
    specs: &[ClientSpec],
    prefix: &str,
    tls: Option<&etcd_client::TlsOptions>,
) -> Result<i64, RecorderError> {
    let mut endpoints: Vec<String> = specs
        .iter()
        .flat_map(|s| s.endpoints.borrow().clone())
        .collect();
    endpoints.sort();
    endpoints.dedup();
    let endpoints = &endpoints;
    let read = || async move {
        let mut last = "no endpoint".to_string();
        for endpoint in endpoints {
            let answer = async {
                let mut client = finish::connect(endpoint, tls).await?;
                client
                    .get(
                        prefix,
                        Some(
                            etcd_client::GetOptions::new()
                                .with_prefix()
                                .with_count_only(),
                        ),
                    )
                    .await
                    .map_err(|e| classify::describe(&e))
            };
            match answer.await {
                Ok(r) if r.count() > 0 => {
                    return Ok(Some(Err(RecorderError::PrefixNotEmpty {
                        prefix: prefix.to_string(),
                        count: r.count(),
                    })));
                }
                Ok(r) => {
                    let revision = r.header().map_or(0, etcd_client::ResponseHeader::revision);
                    return Ok(Some(Ok(revision)));
                }
                Err(e) => last = format!("{endpoint}: {e}"),
            }
        }
        Err(last)
    };
    poll_until(
        &format!("a first read of {prefix}"),
        FIRST_READ_TIMEOUT,
        read,
    )
    .await
    .map_err(|e| RecorderError::NoEndpoint {
        prefix: prefix.to_string(),
        last: e.to_string(),
    })?
}

impl Recorder {
    /// Creates the history file, reads the (empty) prefix once, opens the watches from the
    /// next revision and starts the clients.
    pub async fn start(options: RecorderOptions) -> Result<Self, RecorderError> {
        if options.clients.is_empty() || options.keys == 0 || options.rate <= 0.0 {
            return Err(RecorderError::Options(
                "at least one client, one key and a positive rate".into(),
            ));
        }
        let prefix = options.prefix.clone().unwrap_or_else(|| {
            let millis = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            format!("/recorder/{}-{millis}/", options.name)
        });
        let history = options.dir.join(format!("{}.history.jsonl", options.name));
        let report_file = options.dir.join(format!("{}.report.txt", options.name));
        let log = Arc::new(HistoryLog::create(
            &history,
            options.max_ops,
            options.max_events,
        )?);
        // Each client and watch speaks TLS with its own options, else the recorder's.
        let with_tls = |specs: &[ClientSpec]| -> Vec<ClientSpec> {
            specs
                .iter()
                .map(|spec| {
                    let mut spec = spec.clone();
                    if spec.tls.is_none() {
                        spec.tls.clone_from(&options.tls);
                        spec.tls_feed.clone_from(&options.tls_feed);
                    }
                    spec
                })
                .collect()
        };
        let client_specs = with_tls(&options.clients);
        let watch_specs = with_tls(&options.watches);
        let all_specs: Vec<ClientSpec> = client_specs.iter().chain(&watch_specs).cloned().collect();
        let revision = first_revision(&all_specs, &prefix, options.tls.as_ref()).await?;
        let keys: Vec<String> = (0..options.keys).map(|i| format!("{prefix}k{i}")).collect();
        let traffic = Arc::new(traffic::Traffic::new(
            log.clone(),
            keys,
            options.mix,
            options.request_timeout,
            options.fault.clone(),
        ));
        let (stop_traffic, traffic_stopped) = channel::channel(false);
        let (stop_watches, watches_stopped) = channel::channel(false);
        let (epochs, epochs_rx) = channel::channel(watch::EpochSignal::default());
        let (pause, paused) = channel::channel(false);
        let shared_watches = Arc::new(watch::Watches::new(log.clone(), prefix.clone()));
        let n = options.clients.len() as u64;
        let watches = watch_specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                let (progress, progress_rx) = channel::channel(WatchProgress::default());
                let task = tokio::spawn(watch::run_watch(
                    n + i as u64,
                    spec.clone(),
                    shared_watches.clone(),
                    revision + 1,
                    progress,
                    watch::Signals {
                        stop: watches_stopped.clone(),
                        epochs: epochs_rx.clone(),
                    },
                ));
                (task, progress_rx)
            })
            .collect();
        let interval = Duration::from_secs_f64(options.clients.len() as f64 / options.rate);
        let clients = client_specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                tokio::spawn(traffic::run_client(
                    i as u64,
                    spec.clone(),
                    traffic.clone(),
                    interval,
                    traffic_stopped.clone(),
                    paused.clone(),
                ))
            })
            .collect();
        Ok(Recorder {
            name: options.name,
            prefix,
            log,
            traffic,
            stop_traffic,
            stop_watches,
            epochs,
            pause,
            request_timeout: options.request_timeout,
            clients,
            final_client: n + options.watches.len() as u64,
            watches,
            report_file,
            check_timeout: options.check_timeout,
            started: Instant::now(),
            tls: options.tls,
            tls_feed: options.tls_feed,
        })
    }

    /// Marks an announced recovery from permanent quorum loss: an `epoch` record. Operations
    /// called after it are checked from an unknown state.
    ///
    /// Each operation belongs to the epoch of its call and each watch to the epoch of its
    /// start, so the boundary is made clean: the traffic pauses until no request is in flight
    /// (at most the request timeout), the watches close, the record is written, then the
    /// watches open again from the current revision and the traffic resumes.
    pub async fn epoch(&self, reason: &str) {
        let _ = self.pause.send(true);
        let mut progress = self.traffic.progress();
        let _ = tokio::time::timeout(
            self.request_timeout + EPOCH_CLOSE_TIMEOUT,
            progress.wait_for(|p| p.in_flight == 0),
        )
        .await;
        let n = self.epochs.borrow().closing + 1;
        self.epochs.send_modify(|e| e.closing = n);
        for (_, progress) in &self.watches {
            let mut progress = progress.clone();
            // A watch being opened (at most 2 s) sees the signal once open.
            let _ = tokio::time::timeout(
                EPOCH_CLOSE_TIMEOUT,
                progress.wait_for(|p| p.done || p.epoch_closed >= n),
            )
            .await;
        }
        self.log.write(&log::Record::Epoch {
            time: self.log.now(),
            reason: reason.to_string(),
        });
        self.epochs.send_modify(|e| e.written = n);
        let _ = self.pause.send(false);
    }

    /// The live figures (e.g. to await some ok writes before a fault).
    pub fn progress(&self) -> channel::Receiver<Progress> {
        self.traffic.progress()
    }

    /// The key prefix of the run.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The history file.
    pub fn history_path(&self) -> &Path {
        self.log.path()
    }

    /// Ends the run: stops the traffic, reads every key once more through the first of
    /// `members` that answers, lets the watches catch up and closes them, compares the
    /// members' stores, closes the history and checks it. The end's connections use
    /// [`RecorderOptions::tls`].
    pub async fn finish(mut self, members: &[String]) -> Result<Report, RecorderError> {
        let _ = self.stop_traffic.send(true);
        for task in self.clients.drain(..) {
            let _ = task.await;
        }
        let duration = self.started.elapsed();
        if let Some(feed) = &self.tls_feed {
            self.tls = Some(feed.borrow().clone());
        }
        let tls = self.tls.as_ref();
        let end = finish::final_reads(&self.traffic, self.final_client, members, tls).await;
        let target = self.traffic.progress().borrow().max_change_revision;
        // The watches get up to the last change (or end), then close.
        let caught_up = Duration::from_secs(5);
        for (_, progress) in &mut self.watches {
            let _ = tokio::time::timeout(
                caught_up,
                progress.wait_for(|p| p.done || p.last_revision >= target),
            )
            .await;
        }
        let _ = self.stop_watches.send(true);
        for (task, _) in self.watches.drain(..) {
            let _ = task.await;
        }
        let (hashes, end_error) = match &end {
            Ok((_, revision)) => (Some(finish::hashes(members, *revision, tls).await), None),
            Err(e) => (None, Some(e.clone())),
        };
        self.log.close()?;
        let progress = *self.traffic.progress().borrow();
        let path = self.log.path().to_path_buf();
        let name = self.name.clone();
        let check_timeout = self.check_timeout;
        let checked = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let bytes = std::fs::read(&path).map_err(|e| {
                RecorderError::Log(log::LogError::Io {
                    path: path.clone(),
                    source: e,
                })
            })?;
            let file = path.display().to_string();
            let history = parse_history(&file, &bytes)?;
            let limits = Limits {
                deadline: started.checked_add(check_timeout),
                max_cache_bytes: 512 << 20,
            };
            let checked = check_history(&history, &limits);
            let text = render_history(
                &file,
                &history,
                &checked,
                started.elapsed().as_secs_f64() * 1e3,
            );
            Ok::<_, RecorderError>((history, checked, text))
        })
        .await
        .map_err(|e| RecorderError::Checker(e.to_string()))??;
        let (history, checked, text) = checked;
        std::fs::write(&self.report_file, &text).map_err(|source| RecorderError::Report {
            path: self.report_file.clone(),
            source,
        })?;
        let mut report = Report::new(
            &name,
            self.log.path(),
            &self.report_file,
            duration,
            &history,
            &checked,
            hashes,
            text,
        );
        report.end_error = end_error;
        report.capped = progress.capped;
        report.rewritten = progress.rewritten;
        Ok(report)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        // Tasks end on their own once stopped.
        let _ = self.stop_traffic.send(true);
        let _ = self.stop_watches.send(true);
    }
}
