//! The backup and restore series, on the controller's registry (prefix `etcd_controller_`):
//!
//! | series | type | labels |
//! |---|---|---|
//! | `backups_total` | counter | `result` (`ok`, `error`) |
//! | `backup_failures_total` | counter | `reason` (the status reason: `StoreFailed`, `Timeout`, ...) |
//! | `backup_duration_seconds` | histogram | |
//! | `backup_last_success_timestamp_seconds` | gauge | `namespace`, `backup` (dropped with the backup) |
//! | `backup_last_size_bytes` | gauge | `namespace`, `backup` (dropped with the backup) |
//! | `restores_total` | counter | `result` (`ok`, `error`) |
//! | `backup_verifications_total` | counter | `result` (`verified`, `failed`) |
//! | `backup_last_verified_timestamp_seconds` | gauge | `namespace`, `backup` (the latest verification that passed; dropped with the backup) |
//! | `backup_last_verification_failed` | gauge | `namespace`, `backup` (1 when the latest verification failed; dropped with the backup) |
//! | `backup_continuous_last_segment_timestamp_seconds` | gauge | `namespace`, `backup` (`spec.continuous`: the latest segment written; dropped with the backup) |
//! | `backup_continuous_segments_total` | counter | |

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use prometheus::{Histogram, IntCounterVec, IntGaugeVec, Registry};

/// Buckets of `backup_duration_seconds`: 0.1 s to one hour.
pub const DURATION_BUCKETS: &[f64] = &[
    0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// The backup and restore series.
#[derive(Debug, Clone)]
pub struct BackupMetrics {
    backups_total: IntCounterVec,
    failures_total: IntCounterVec,
    duration_seconds: Histogram,
    last_success: IntGaugeVec,
    last_size: IntGaugeVec,
    restores_total: IntCounterVec,
    verifications_total: IntCounterVec,
    last_verified: IntGaugeVec,
    verification_failed: IntGaugeVec,
    last_segment: IntGaugeVec,
    segments_total: prometheus::IntCounter,
}

impl BackupMetrics {
    /// Creates the series and registers them on `registry`.
    pub fn register(registry: &Registry) -> Result<Self, prometheus::Error> {
        let r = super::Series(registry);
        let backups_total = r.counters(
            "backups_total",
            "Backups attempted, by result.",
            &["result"],
        )?;
        let failures_total = r.counters(
            "backup_failures_total",
            "Failed backups, by reason.",
            &["reason"],
        )?;
        let duration_seconds = r.histogram(
            "backup_duration_seconds",
            "Duration of a successful backup, from the member's status to the completed upload.",
            DURATION_BUCKETS,
        )?;
        let last_success = r.gauges(
            "backup_last_success_timestamp_seconds",
            "Unix time of the latest successful backup of an EtcdBackup.",
            &["namespace", "backup"],
        )?;
        let last_size = r.gauges(
            "backup_last_size_bytes",
            "Size of the latest snapshot an EtcdBackup wrote.",
            &["namespace", "backup"],
        )?;
        let restores_total = r.counters(
            "restores_total",
            "Restores carried out, by result.",
            &["result"],
        )?;
        let verifications_total = r.counters(
            "backup_verifications_total",
            "Verifications of snapshots (spec.verify), by result.",
            &["result"],
        )?;
        let last_verified = r.gauges(
            "backup_last_verified_timestamp_seconds",
            "Unix time of the latest verification of an EtcdBackup's snapshot that passed.",
            &["namespace", "backup"],
        )?;
        let verification_failed = r.gauges(
            "backup_last_verification_failed",
            "1 when the latest verification of an EtcdBackup's snapshot failed, else 0.",
            &["namespace", "backup"],
        )?;
        let last_segment = r.gauges(
            "backup_continuous_last_segment_timestamp_seconds",
            "Unix time of the latest segment a continuous backup (spec.continuous) wrote.",
            &["namespace", "backup"],
        )?;
        let segments_total = r
            .counters(
                "backup_continuous_segments_total",
                "Segments written by continuous backups.",
                &[],
            )?
            .with_label_values(&[] as &[&str]);
        for result in ["verified", "failed"] {
            verifications_total.with_label_values(&[result]);
        }
        for result in ["ok", "error"] {
            backups_total.with_label_values(&[result]);
            restores_total.with_label_values(&[result]);
        }
        Ok(BackupMetrics {
            backups_total,
            failures_total,
            duration_seconds,
            last_success,
            last_size,
            restores_total,
            verifications_total,
            last_verified,
            verification_failed,
            last_segment,
            segments_total,
        })
    }

    /// Records a successful backup.
    pub fn succeeded(
        &self,
        namespace: &str,
        backup: &str,
        took: Duration,
        size: u64,
        at: Option<Timestamp>,
    ) {
        self.backups_total.with_label_values(&["ok"]).inc();
        self.duration_seconds.observe(took.as_secs_f64());
        let labels = [namespace, backup];
        self.last_size
            .with_label_values(&labels)
            .set(i64::try_from(size).unwrap_or(i64::MAX));
        if let Some(at) = at {
            self.last_success
                .with_label_values(&labels)
                .set(at.as_second());
        }
    }

    /// Records a failed backup.
    pub fn failed(&self, reason: &'static str) {
        self.backups_total.with_label_values(&["error"]).inc();
        self.failures_total.with_label_values(&[reason]).inc();
    }

    /// Records a verification of a snapshot of `backup` at `at`.
    pub fn verified(&self, namespace: &str, backup: &str, passed: bool, at: Timestamp) {
        let result = if passed { "verified" } else { "failed" };
        self.verifications_total.with_label_values(&[result]).inc();
        let labels = [namespace, backup];
        self.verification_failed
            .with_label_values(&labels)
            .set(i64::from(!passed));
        if passed {
            self.last_verified
                .with_label_values(&labels)
                .set(at.as_second());
        }
    }

    /// Records a segment of the continuous backup `backup` written at `at`.
    pub fn segment_written(&self, namespace: &str, backup: &str, at: Timestamp) {
        self.segments_total.inc();
        self.last_segment
            .with_label_values(&[namespace, backup])
            .set(at.as_second());
    }

    /// Records a restore's outcome.
    pub fn restored(&self, ok: bool) {
        self.restores_total
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Drops the series of a deleted EtcdBackup.
    pub fn forget(&self, namespace: &str, backup: &str) {
        let labels = [namespace, backup];
        let _ = self.last_success.remove_label_values(&labels);
        let _ = self.last_size.remove_label_values(&labels);
        let _ = self.last_verified.remove_label_values(&labels);
        let _ = self.verification_failed.remove_label_values(&labels);
        let _ = self.last_segment.remove_label_values(&labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deleted_backup_leaves_no_series() {
        let registry = Registry::new();
        let m = BackupMetrics::register(&registry).expect("metrics");
        m.succeeded(
            "ns",
            "b",
            Duration::from_secs(2),
            1024,
            Some(Timestamp::from_second(1_700_000_000).expect("t")),
        );
        m.failed("Timeout");
        let at = Timestamp::from_second(1_700_000_100).expect("t");
        m.verified("ns", "b", true, at);
        m.verified("ns", "b", false, at);
        let encode = || {
            let families = registry.gather();
            prometheus::TextEncoder::new().encode_to_string(&families)
        };
        let text = encode().expect("text");
        assert!(text.contains("etcd_controller_backup_last_success_timestamp_seconds{backup=\"b\",namespace=\"ns\"} 1700000000"), "{text}");
        assert!(text.contains("etcd_controller_backup_failures_total{reason=\"Timeout\"} 1"));
        assert!(
            text.contains("etcd_controller_backup_verifications_total{result=\"failed\"} 1"),
            "{text}"
        );
        assert!(text.contains("etcd_controller_backup_last_verified_timestamp_seconds{backup=\"b\",namespace=\"ns\"} 1700000100"), "{text}");
        assert!(
            text.contains(
                "etcd_controller_backup_last_verification_failed{backup=\"b\",namespace=\"ns\"} 1"
            ),
            "{text}"
        );
        m.forget("ns", "b");
        let text = encode().expect("text");
        assert!(!text.contains("backup=\"b\""), "{text}");
    }
}
