//! The webhook's Prometheus metrics, in a registry of their own (not the process default), served
//! as text on `GET /metrics`.

use std::time::Duration;

use crate::connections::ConnectionMetrics;
use prometheus::core::Collector;
use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Upper bounds of the request duration histogram, in seconds: the webhook answers in tens of
/// microseconds, so the buckets start well below a millisecond.
pub const DURATION_BUCKETS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1,
    0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What became of one admission request, the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestResult {
    /// Answered `allowed: true`.
    Allowed,
    /// Answered `allowed: false`.
    Denied,
    /// Answered with an HTTP error (bad input, too large, timed out, internal error).
    Error,
}

impl RequestResult {
    /// The label value: `allowed`, `denied` or `error`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestResult::Allowed => "allowed",
            RequestResult::Denied => "denied",
            RequestResult::Error => "error",
        }
    }
}

/// Every metric of the webhook and the registry that holds them.
#[derive(Clone, Debug)]
pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    refusals: IntCounterVec,
    duration: HistogramVec,
    in_flight: IntGauge,
    certificate_expiry: Gauge,
    certificate_reloads: IntCounter,
    certificate_reload_failures: IntCounter,
    shed: IntCounter,
    reserved_bytes: IntGauge,
    connections: ConnectionMetrics,
}

impl Metrics {
    /// Creates the metrics in a new registry.
    pub fn new() -> Result<Self, prometheus::Error> {
        let metrics = Metrics {
            registry: Registry::new(),
            requests: IntCounterVec::new(
                Opts::new(
                    "etcd_webhook_requests_total",
                    "Admission requests answered, by endpoint (validate, mutate), operation (CREATE, UPDATE, DELETE, CONNECT; unknown when unreadable) and result (allowed, denied, error).",
                ),
                &["endpoint", "operation", "result"],
            )?,
            refusals: IntCounterVec::new(
                Opts::new(
                    "etcd_webhook_refusals_total",
                    "Violated admission rules, by rule name, one per violation of a refused object.",
                ),
                &["rule"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    "etcd_webhook_request_duration_seconds",
                    "Time from the request's arrival to its answer, by endpoint.",
                )
                .buckets(DURATION_BUCKETS.to_vec()),
                &["endpoint"],
            )?,
            in_flight: IntGauge::new(
                "etcd_webhook_requests_in_flight",
                "Admission requests being received or answered.",
            )?,
            certificate_expiry: Gauge::new(
                "etcd_webhook_certificate_expiry_timestamp_seconds",
                "notAfter of the serving certificate in use, as a Unix timestamp.",
            )?,
            certificate_reloads: IntCounter::new(
                "etcd_webhook_certificate_reloads_total",
                "Times a changed certificate and key pair was loaded and put in use.",
            )?,
            certificate_reload_failures: IntCounter::new(
                "etcd_webhook_certificate_reload_failures_total",
                "Times a changed certificate or key file could not be used (the previous pair stays in use).",
            )?,
            shed: IntCounter::new(
                "etcd_webhook_requests_shed_total",
                "Admission requests answered 429 because the memory budget of the requests in flight stayed exhausted (--max-in-flight-memory).",
            )?,
            reserved_bytes: IntGauge::new(
                "etcd_webhook_in_flight_reserved_bytes",
                "Bytes of the memory budget reserved by the admission requests in flight.",
            )?,
            connections: connection_metrics()?,
        };
        for collector in metrics.collectors() {
            metrics.registry.register(collector)?;
        }
        for endpoint in ["validate", "mutate"] {
            metrics.duration.with_label_values(&[endpoint]);
        }
        Ok(metrics)
    }

    /// Every metric, in the order they are registered.
    fn collectors(&self) -> [Box<dyn Collector>; 12] {
        [
            Box::new(self.shed.clone()),
            Box::new(self.reserved_bytes.clone()),
            Box::new(self.connections.open.clone()),
            Box::new(self.connections.rejected.clone()),
            Box::new(self.connections.idle_closed.clone()),
            Box::new(self.requests.clone()),
            Box::new(self.refusals.clone()),
            Box::new(self.duration.clone()),
            Box::new(self.in_flight.clone()),
            Box::new(self.certificate_expiry.clone()),
            Box::new(self.certificate_reloads.clone()),
            Box::new(self.certificate_reload_failures.clone()),
        ]
    }

    /// Counts a request answered 429 for want of memory budget.
    pub fn count_shed(&self) {
        self.shed.inc();
    }

    /// The gauge of reserved budget bytes.
    pub fn reserved_bytes(&self) -> &IntGauge {
        &self.reserved_bytes
    }

    /// The connection counters the listeners' guards update.
    pub fn connections(&self) -> &ConnectionMetrics {
        &self.connections
    }

    /// Counts one answered request and observes its duration.
    pub fn observe_request(
        &self,
        endpoint: &str,
        operation: &str,
        result: RequestResult,
        elapsed: Duration,
    ) {
        self.requests
            .with_label_values(&[endpoint, operation, result.as_str()])
            .inc();
        self.duration
            .with_label_values(&[endpoint])
            .observe(elapsed.as_secs_f64());
    }

    /// Counts one violation of `rule`.
    pub fn count_refusal(&self, rule: &str) {
        self.refusals.with_label_values(&[rule]).inc();
    }

    /// The gauge of requests in progress.
    pub fn in_flight(&self) -> &IntGauge {
        &self.in_flight
    }

    /// Records that a certificate expiring at `not_after` (Unix seconds) is now in use.
    pub fn certificate_in_use(&self, not_after: i64) {
        self.certificate_expiry.set(not_after as f64);
    }

    /// Counts a successful certificate reload.
    pub fn count_reload(&self) {
        self.certificate_reloads.inc();
    }

    /// Counts a failed certificate reload.
    pub fn count_reload_failure(&self) {
        self.certificate_reload_failures.inc();
    }

    /// Every metric in the Prometheus text exposition format (version 0.0.4).
    pub fn encode(&self) -> Result<String, prometheus::Error> {
        let mut buf = Vec::with_capacity(4096);
        TextEncoder::new().encode(&self.registry.gather(), &mut buf)?;
        String::from_utf8(buf).map_err(|e| prometheus::Error::Msg(e.to_string()))
    }
}

/// The counters of the connections on the webhook's listeners, which their guards update.
fn connection_metrics() -> Result<ConnectionMetrics, prometheus::Error> {
    Ok(ConnectionMetrics {
        open: IntGauge::new(
            "etcd_webhook_open_connections",
            "Connections open on the webhook's listeners (admission, metrics, probes).",
        )?,
        rejected: IntCounter::new(
            "etcd_webhook_connections_rejected_total",
            "Connections closed as soon as accepted because --max-connections were open on that listener.",
        )?,
        idle_closed: IntCounter::new(
            "etcd_webhook_connections_idle_closed_total",
            "Connections closed because no byte moved for --idle-timeout.",
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_metric() {
        let m = Metrics::new().unwrap();
        m.observe_request(
            "validate",
            "CREATE",
            RequestResult::Denied,
            Duration::from_micros(40),
        );
        m.count_refusal("size-range");
        m.certificate_in_use(1_900_000_000);
        m.count_reload();
        m.count_reload_failure();
        let text = m.encode().unwrap();
        for want in [
            r#"etcd_webhook_requests_total{endpoint="validate",operation="CREATE",result="denied"} 1"#,
            r#"etcd_webhook_refusals_total{rule="size-range"} 1"#,
            r#"etcd_webhook_request_duration_seconds_bucket{endpoint="validate",le="0.00005"} 1"#,
            "etcd_webhook_certificate_expiry_timestamp_seconds 1900000000",
            "etcd_webhook_certificate_reloads_total 1",
            "etcd_webhook_certificate_reload_failures_total 1",
            "etcd_webhook_requests_in_flight 0",
            "etcd_webhook_requests_shed_total 0",
            "etcd_webhook_in_flight_reserved_bytes 0",
            "etcd_webhook_open_connections 0",
            "etcd_webhook_connections_rejected_total 0",
            "etcd_webhook_connections_idle_closed_total 0",
        ] {
            assert!(text.contains(want), "missing {want}\n{text}");
        }
    }
}
