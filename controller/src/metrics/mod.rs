//! The controller's Prometheus metrics, on a registry of their own (not the process-global
//! one), served as text by [`crate::admin`] on `/metrics`.
//!
//! Every series is prefixed `etcd_controller_`:
//!
//! | series | type | labels |
//! |---|---|---|
//! | `reconcile_total` | counter | `result` (`ok`, `error`) |
//! | `reconcile_errors_total` | counter | `error` (the error's static label) |
//! | `reconcile_duration_seconds` | histogram | |
//! | `clusters` | gauge | `phase` |
//! | `ready_members` | gauge | `namespace`, `cluster` |
//! | `etcd_health_check_failures_total` | counter | `namespace`, `cluster` |
//! | `member_changes_total` | counter | `kind` (`bootstrap`, `add`, `promote`, `remove`, ...) |
//! | `applies_total` | counter | `kind` (`Service`, `PodDisruptionBudget`): server-side applies sent |
//! | `leader` | gauge | (1 while this replica leads, else 0) |
//! | `undecodable_clusters` | gauge | `namespace`, `cluster` (1 while the stored object does not decode; removed when it does or is deleted) |
//! | `alarm_heals_total` | counter | `alarm` (`NOSPACE`): alarms the controller healed and disarmed |
//! | `defragmentations_total` | counter | `reason` (`nospace`, `fragmented`): members defragmented |
//! | `recoveries_total` | counter | `source` (`member`, `backup`): recoveries from permanent quorum loss finished |

pub mod backup;

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use etcd_shared::types::ClusterPhase;
use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramTimer, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Prefix of every series.
pub const NAMESPACE: &str = "etcd_controller";

/// Buckets of `reconcile_duration_seconds`, 1 ms to 60 s.
pub const RECONCILE_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// What [`Metrics::observe_cluster`] remembers of one cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Tracked {
    phase: &'static str,
}

/// The controller's metrics. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconcile_total: IntCounterVec,
    reconcile_errors_total: IntCounterVec,
    reconcile_duration_seconds: Histogram,
    clusters: IntGaugeVec,
    ready_members: IntGaugeVec,
    health_check_failures_total: IntCounterVec,
    member_changes_total: IntCounterVec,
    applies_total: IntCounterVec,
    leader: IntGauge,
    undecodable_clusters: IntGaugeVec,
    alarm_heals_total: IntCounterVec,
    defragmentations_total: IntCounterVec,
    recoveries_total: IntCounterVec,
    certificate_expiry: IntGaugeVec,
    certificate_renewal: IntGaugeVec,
    certificates_issued_total: IntCounterVec,
    /// The backup and restore series (same registry).
    pub backups: backup::BackupMetrics,
    /// Clusters seen by [`Metrics::observe_cluster`], keyed by (namespace, name).
    tracked: Mutex<BTreeMap<(String, String), Tracked>>,
}

/// Measures one reconcile: records its duration in `reconcile_duration_seconds` when dropped.
#[derive(Debug)]
#[must_use = "the duration is recorded when the timer is dropped"]
pub struct ReconcileTimer(Option<HistogramTimer>);

impl ReconcileTimer {
    /// Records the duration now instead of at drop.
    pub fn observe(mut self) {
        if let Some(timer) = self.0.take() {
            timer.observe_duration();
        }
    }
}

impl Drop for ReconcileTimer {
    fn drop(&mut self) {
        if let Some(timer) = self.0.take() {
            timer.observe_duration();
        }
    }
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace(NAMESPACE)
}

type Made<T> = Result<T, prometheus::Error>;

/// Creates series named `etcd_controller_NAME` and registers them on its registry.
#[derive(Clone, Copy)]
struct Series<'a>(&'a Registry);

impl Series<'_> {
    /// Registers `series` and hands it back.
    fn register<C: Collector + Clone + 'static>(self, series: C) -> Made<C> {
        self.0.register(Box::new(series.clone()))?;
        Ok(series)
    }

    /// Counters by `labels`.
    fn counters(self, name: &str, help: &str, labels: &[&str]) -> Made<IntCounterVec> {
        self.register(IntCounterVec::new(opts(name, help), labels)?)
    }

    /// Gauges by `labels`.
    fn gauges(self, name: &str, help: &str, labels: &[&str]) -> Made<IntGaugeVec> {
        self.register(IntGaugeVec::new(opts(name, help), labels)?)
    }

    /// A histogram with `buckets`.
    fn histogram(self, name: &str, help: &str, buckets: &[f64]) -> Made<Histogram> {
        let opts = HistogramOpts::new(name, help).namespace(NAMESPACE);
        self.register(Histogram::with_opts(opts.buckets(buckets.to_vec()))?)
    }
}

impl Metrics {
    /// Creates every series and registers it on a new registry. `clusters{phase}` starts at 0
    /// for every known phase, so dashboards see each phase from the first scrape.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let r = Series(&registry);
        let reconcile_total = r.counters(
            "reconcile_total",
            "Reconciles of EtcdClusters, by result.",
            &["result"],
        )?;
        let reconcile_errors_total = r.counters(
            "reconcile_errors_total",
            "Failed reconciles of EtcdClusters, by error kind.",
            &["error"],
        )?;
        let reconcile_duration_seconds = r.histogram(
            "reconcile_duration_seconds",
            "Duration of one reconcile of an EtcdCluster.",
            RECONCILE_BUCKETS,
        )?;
        let clusters = r.gauges(
            "clusters",
            "EtcdClusters managed by the controller, by phase.",
            &["phase"],
        )?;
        let ready_members = r.gauges(
            "ready_members",
            "Ready etcd members of a cluster.",
            &["namespace", "cluster"],
        )?;
        let health_check_failures_total = r.counters(
            "etcd_health_check_failures_total",
            "Failed health checks of a cluster's etcd members.",
            &["namespace", "cluster"],
        )?;
        let member_changes_total = r.counters(
            "member_changes_total",
            "Changes of etcd membership made by the controller, by kind.",
            &["kind"],
        )?;
        let applies_total = r.counters(
            "applies_total",
            "Server-side applies of derived objects sent (unchanged objects are not re-applied).",
            &["kind"],
        )?;
        let leader = r.register(IntGauge::with_opts(opts(
            "leader",
            "1 while this replica holds the leader election lease, else 0.",
        ))?)?;
        let undecodable_clusters = r.gauges(
            "undecodable_clusters",
            "1 for each stored EtcdCluster whose spec the controller cannot decode (it is skipped).",
            &["namespace", "cluster"],
        )?;
        let alarm_heals_total = r.counters(
            "alarm_heals_total",
            "etcd alarms the controller healed and disarmed, by alarm.",
            &["alarm"],
        )?;
        let defragmentations_total = r.counters(
            "defragmentations_total",
            "Members defragmented by the controller, by reason (nospace, fragmented).",
            &["reason"],
        )?;
        let recoveries_total = r.counters(
            "recoveries_total",
            "Recoveries from permanent quorum loss the controller finished, by source (member, backup).",
            &["source"],
        )?;
        for source in ["member", "backup"] {
            recoveries_total.with_label_values(&[source]);
        }
        let certificate_expiry = r.gauges(
            "certificate_expiry_timestamp_seconds",
            "End of validity (Unix seconds) of each certificate of a cluster with operator-managed TLS (ca, peer, server, operator).",
            &["namespace", "cluster", "certificate"],
        )?;
        let certificate_renewal = r.gauges(
            "certificate_renewal_timestamp_seconds",
            "When each certificate of a cluster with operator-managed TLS is due for renewal (Unix seconds): renewBefore ahead of its end, a third of its life for the CA.",
            &["namespace", "cluster", "certificate"],
        )?;
        let certificates_issued_total = r.counters(
            "certificates_issued_total",
            "Certificates the controller issued, by certificate (ca, peer, server, operator) and reason (missing, unreadable, expired, due, other-ca, names).",
            &["certificate", "reason"],
        )?;
        alarm_heals_total.with_label_values(&["NOSPACE"]);
        for reason in ["nospace", "fragmented"] {
            defragmentations_total.with_label_values(&[reason]);
        }

        for phase in ClusterPhase::ALL {
            clusters.with_label_values(&[phase.as_str()]).set(0);
        }
        for result in ["ok", "error"] {
            reconcile_total.with_label_values(&[result]);
        }
        let backups = backup::BackupMetrics::register(&registry)?;

        Ok(Self {
            registry,
            reconcile_total,
            reconcile_errors_total,
            reconcile_duration_seconds,
            clusters,
            ready_members,
            health_check_failures_total,
            member_changes_total,
            applies_total,
            leader,
            undecodable_clusters,
            alarm_heals_total,
            defragmentations_total,
            recoveries_total,
            certificate_expiry,
            certificate_renewal,
            certificates_issued_total,
            backups,
            tracked: Mutex::new(BTreeMap::new()),
        })
    }

    /// Records the end of validity of a cluster's `certificate` and when it is due for
    /// renewal (Unix seconds).
    pub fn certificate_expires(
        &self,
        namespace: &str,
        name: &str,
        certificate: &str,
        not_after: i64,
        renew_at: i64,
    ) {
        self.certificate_expiry
            .with_label_values(&[namespace, name, certificate])
            .set(not_after);
        self.certificate_renewal
            .with_label_values(&[namespace, name, certificate])
            .set(renew_at);
    }

    /// Counts a certificate issued, by certificate and reason.
    pub fn certificate_issued(&self, certificate: &str, reason: &str) {
        self.certificates_issued_total
            .with_label_values(&[certificate, reason])
            .inc();
    }

    /// Counts a recovery from permanent quorum loss finished, by source label.
    pub fn recovered(&self, source: &str) {
        self.recoveries_total.with_label_values(&[source]).inc();
    }

    /// Counts an alarm healed and disarmed.
    pub fn alarm_healed(&self, alarm: &str) {
        self.alarm_heals_total.with_label_values(&[alarm]).inc();
    }

    /// Counts a member defragmented, by reason label.
    pub fn defragmented(&self, reason: &str) {
        self.defragmentations_total
            .with_label_values(&[reason])
            .inc();
    }

    /// The registry every series is registered on.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every series in the Prometheus text exposition format (version 0.0.4).
    pub fn encode(&self) -> String {
        let families = self.registry.gather();
        let mut buf = String::new();
        if let Err(e) = TextEncoder::new().encode_utf8(&families, &mut buf) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        buf
    }

    /// Starts timing a reconcile; the duration is recorded when the timer is dropped.
    pub fn reconcile_timer(&self) -> ReconcileTimer {
        ReconcileTimer(Some(self.reconcile_duration_seconds.start_timer()))
    }

    /// Counts a successful reconcile.
    pub fn reconcile_ok(&self) {
        self.reconcile_total.with_label_values(&["ok"]).inc();
    }

    /// Counts a failed reconcile and its error kind.
    pub fn reconcile_error(&self, label: &'static str) {
        self.reconcile_total.with_label_values(&["error"]).inc();
        self.reconcile_errors_total
            .with_label_values(&[label])
            .inc();
    }

    /// Sets `clusters{phase}` from counts computed by the caller. Phases not listed are set to
    /// 0. Use either this or [`Metrics::observe_cluster`], not both: each overwrites the other.
    pub fn set_clusters_by_phase(&self, counts: &[(&'static str, i64)]) {
        self.clusters.reset();
        for phase in ClusterPhase::ALL {
            self.clusters.with_label_values(&[phase.as_str()]).set(0);
        }
        for (phase, count) in counts {
            self.clusters.with_label_values(&[phase]).add(*count);
        }
    }

    /// Records a cluster's current phase and ready member count: updates `clusters{phase}`
    /// (each cluster counted once, in its latest phase) and `ready_members`.
    pub fn observe_cluster(
        &self,
        namespace: &str,
        name: &str,
        phase: &'static str,
        ready_members: i64,
    ) {
        let mut tracked = self.tracked();
        let key = (namespace.to_string(), name.to_string());
        match tracked.insert(key, Tracked { phase }) {
            Some(previous) if previous.phase == phase => {}
            Some(previous) => {
                self.clusters.with_label_values(&[previous.phase]).dec();
                self.clusters.with_label_values(&[phase]).inc();
            }
            None => self.clusters.with_label_values(&[phase]).inc(),
        }
        self.ready_members
            .with_label_values(&[namespace, name])
            .set(ready_members);
    }

    /// Forgets a deleted cluster: removes its per-cluster series and its count in
    /// `clusters{phase}`.
    pub fn forget_cluster(&self, namespace: &str, name: &str) {
        let mut tracked = self.tracked();
        if let Some(previous) = tracked.remove(&(namespace.to_string(), name.to_string())) {
            self.clusters.with_label_values(&[previous.phase]).dec();
        }
        // Absent series are not an error: the cluster may never have had one.
        let _ = self.ready_members.remove_label_values(&[namespace, name]);
        for certificate in ["ca", "peer", "server", "operator"] {
            let _ = self
                .certificate_expiry
                .remove_label_values(&[namespace, name, certificate]);
            let _ = self
                .certificate_renewal
                .remove_label_values(&[namespace, name, certificate]);
        }
        let _ = self
            .health_check_failures_total
            .remove_label_values(&[namespace, name]);
        self.decodable(namespace, name);
    }

    /// Records that the stored cluster does not decode (it is not reconciled).
    pub fn undecodable(&self, namespace: &str, name: &str) {
        self.undecodable_clusters
            .with_label_values(&[namespace, name])
            .set(1);
    }

    /// Records that the stored cluster decodes (again): drops its `undecodable_clusters` series.
    pub fn decodable(&self, namespace: &str, name: &str) {
        let _ = self
            .undecodable_clusters
            .remove_label_values(&[namespace, name]);
    }

    /// Counts a failed health check of one of a cluster's members.
    pub fn health_check_failed(&self, namespace: &str, name: &str) {
        self.health_check_failures_total
            .with_label_values(&[namespace, name])
            .inc();
    }

    /// Counts a membership change (`bootstrap`, `add`, `promote`, `remove`, `replace`,
    /// `upgrade`, ...).
    pub fn member_change(&self, kind: &'static str) {
        self.member_changes_total.with_label_values(&[kind]).inc();
    }

    /// Counts a server-side apply of a derived object of `kind`.
    pub fn applied(&self, kind: &str) {
        self.applies_total.with_label_values(&[kind]).inc();
    }

    /// Sets `leader` to 1 (leading) or 0.
    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    fn tracked(&self) -> MutexGuard<'_, BTreeMap<(String, String), Tracked>> {
        // The map is always left consistent, so a panic elsewhere doesn't invalidate it.
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of the sample `series` (name with its labels as encoded, e.g.
    /// `etcd_controller_clusters{phase="Running"}`), if present.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok()).flatten()
        })
    }

    /// Asserts the value of each sample `etcd_controller_SERIES` in `text`.
    fn assert_samples(text: &str, expected: &[(&str, f64)]) {
        for (series, value) in expected {
            let series = format!("{NAMESPACE}_{series}");
            assert_eq!(sample(text, &series), Some(*value), "{series}");
        }
    }

    #[test]
    fn every_series_has_help_and_type() {
        let m = Metrics::new().unwrap();
        m.set_leader(false);
        m.member_change("add");
        m.health_check_failed("ns", "a");
        m.observe_cluster("ns", "a", "Running", 3);
        m.reconcile_error("kube");
        let text = m.encode();
        for (name, kind) in [
            ("reconcile_total", "counter"),
            ("reconcile_errors_total", "counter"),
            ("reconcile_duration_seconds", "histogram"),
            ("clusters", "gauge"),
            ("ready_members", "gauge"),
            ("etcd_health_check_failures_total", "counter"),
            ("member_changes_total", "counter"),
            ("leader", "gauge"),
        ] {
            let full = format!("etcd_controller_{name}");
            assert!(
                text.contains(&format!("# HELP {full} ")),
                "no HELP for {full}:\n{text}"
            );
            assert!(
                text.contains(&format!("# TYPE {full} {kind}\n")),
                "no TYPE for {full}:\n{text}"
            );
        }
    }

    #[test]
    fn reconcile_counts_and_duration() {
        let m = Metrics::new().unwrap();
        m.reconcile_ok();
        m.reconcile_ok();
        m.reconcile_error("etcd");
        m.reconcile_error("etcd");
        m.reconcile_error("kube");
        {
            let _timer = m.reconcile_timer();
        }
        m.reconcile_timer().observe();
        let text = m.encode();
        assert_samples(
            &text,
            &[
                (r#"reconcile_total{result="ok"}"#, 2.0),
                (r#"reconcile_total{result="error"}"#, 3.0),
                (r#"reconcile_errors_total{error="etcd"}"#, 2.0),
                (r#"reconcile_errors_total{error="kube"}"#, 1.0),
                ("reconcile_duration_seconds_count", 2.0),
                (r#"reconcile_duration_seconds_bucket{le="60"}"#, 2.0),
            ],
        );
        assert_eq!(
            sample(
                &text,
                r#"etcd_controller_reconcile_duration_seconds_bucket{le="0.001"}"#
            ),
            Some(2.0),
            "an empty scope takes well under 1 ms"
        );
    }

    #[test]
    fn phases_start_at_zero_and_follow_observed_clusters() {
        let m = Metrics::new().unwrap();
        let text = m.encode();
        for phase in ClusterPhase::ALL {
            let series = format!(r#"etcd_controller_clusters{{phase="{}"}}"#, phase.as_str());
            assert_eq!(sample(&text, &series), Some(0.0), "{series}");
        }

        m.observe_cluster("ns", "a", "Creating", 0);
        m.observe_cluster("ns", "b", "Creating", 1);
        m.observe_cluster("other", "a", "Running", 3);
        m.observe_cluster("ns", "a", "Running", 3);
        m.observe_cluster("ns", "a", "Running", 3);
        let text = m.encode();
        assert_samples(
            &text,
            &[
                (r#"clusters{phase="Creating"}"#, 1.0),
                (r#"clusters{phase="Running"}"#, 2.0),
                (r#"ready_members{cluster="b",namespace="ns"}"#, 1.0),
                (r#"ready_members{cluster="a",namespace="other"}"#, 3.0),
            ],
        );
    }

    #[test]
    fn forget_cluster_removes_its_series() {
        let m = Metrics::new().unwrap();
        m.observe_cluster("ns", "a", "Running", 3);
        m.observe_cluster("ns", "b", "Running", 3);
        m.health_check_failed("ns", "a");
        m.health_check_failed("ns", "a");
        m.health_check_failed("ns", "b");
        let text = m.encode();
        assert_samples(
            &text,
            &[(
                r#"etcd_health_check_failures_total{cluster="a",namespace="ns"}"#,
                2.0,
            )],
        );

        m.forget_cluster("ns", "a");
        // Forgetting twice, or a cluster never seen, is harmless.
        m.forget_cluster("ns", "a");
        m.forget_cluster("ns", "never");
        let text = m.encode();
        assert!(!text.contains(r#"cluster="a""#), "{text}");
        assert_samples(
            &text,
            &[
                (r#"clusters{phase="Running"}"#, 1.0),
                (r#"ready_members{cluster="b",namespace="ns"}"#, 3.0),
                (
                    r#"etcd_health_check_failures_total{cluster="b",namespace="ns"}"#,
                    1.0,
                ),
            ],
        );
    }

    #[test]
    fn set_clusters_by_phase_overwrites() {
        let m = Metrics::new().unwrap();
        m.set_clusters_by_phase(&[("Running", 4), ("Degraded", 1)]);
        m.set_clusters_by_phase(&[("Running", 2)]);
        let text = m.encode();
        assert_samples(
            &text,
            &[
                (r#"clusters{phase="Running"}"#, 2.0),
                (r#"clusters{phase="Degraded"}"#, 0.0),
            ],
        );
    }

    #[test]
    fn member_changes_and_leader() {
        let m = Metrics::new().unwrap();
        m.member_change("add");
        m.member_change("add");
        m.member_change("promote");
        m.set_leader(true);
        let text = m.encode();
        assert_samples(
            &text,
            &[
                (r#"member_changes_total{kind="add"}"#, 2.0),
                (r#"member_changes_total{kind="promote"}"#, 1.0),
                ("leader", 1.0),
            ],
        );
        m.set_leader(false);
        assert_eq!(sample(&m.encode(), "etcd_controller_leader"), Some(0.0));
    }

    #[test]
    fn undecodable_clusters_are_counted_until_fixed_or_forgotten() {
        let m = Metrics::new().unwrap();
        let series = |name: &str| {
            format!(r#"etcd_controller_undecodable_clusters{{cluster="{name}",namespace="ns"}}"#)
        };
        m.undecodable("ns", "a");
        m.undecodable("ns", "a");
        m.undecodable("ns", "b");
        let text = m.encode();
        assert_eq!(sample(&text, &series("a")), Some(1.0));
        assert_eq!(sample(&text, &series("b")), Some(1.0));
        m.decodable("ns", "a");
        m.forget_cluster("ns", "b");
        let text = m.encode();
        assert_eq!(sample(&text, &series("a")), None);
        assert_eq!(sample(&text, &series("b")), None);
    }

    #[test]
    fn two_instances_do_not_collide() {
        let a = Metrics::new().unwrap();
        let b = Metrics::new().unwrap();
        a.member_change("add");
        assert!(!b.encode().contains(r#"kind="add""#));
    }
}
