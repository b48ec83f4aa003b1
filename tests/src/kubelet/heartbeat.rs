//! The node's heartbeats, as a kubelet sends them: the Lease in `kube-node-lease` renewed every
//! [`HeartbeatOptions::lease_renew_interval`], and the node status (its conditions with fresh
//! heartbeat times) posted
//!
//! - at least every [`HeartbeatOptions::status_report_frequency`] (`nodeStatusReportFrequency`),
//! - within a second whenever the Node in the API differs from what the kubelet reports: its
//!   `Ready` condition set `Unknown` by the node lifecycle controller while the kubelet was
//!   silent, a condition missing (a real kubelet notices at its next `nodeStatusUpdateFrequency`
//!   tick, 10 s; this one watches its Node and reacts at once),
//! - at once when the kubelet resumes after a silence (see [`super::Kubelet::silence`]), with
//!   the Lease.
//!
//! While the kubelet is silenced nothing is sent: the node lifecycle controller sees neither
//! Lease renewals nor status and, after `--node-monitor-grace-period`, marks the Node `Unknown`.

use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher;
use tokio::sync::watch;
use tokio::time::Instant;

use super::log::KubeletLog;
use super::node::{self, NodeConfig};

/// Retry interval of a failed Lease renewal.
const LEASE_RETRY: Duration = Duration::from_secs(1);
/// Least time between two status posts prompted by a difference (a Node that keeps differing,
/// e.g. while the API server refuses the patch, is not hammered).
const MIN_REPOST: Duration = Duration::from_secs(1);
/// How long the loop sleeps when nothing is due (a silence change or a watch event wakes it).
const IDLE: Duration = Duration::from_secs(3600);

/// How often the node's heartbeats go out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeartbeatOptions {
    /// How often the Lease is renewed. Default [`node::LEASE_RENEW_INTERVAL`] (10 s). Keep it
    /// well below the controller manager's `--node-monitor-grace-period`.
    pub lease_renew_interval: Duration,
    /// The Lease's `leaseDurationSeconds` (whole seconds, at least 1). Default
    /// [`node::LEASE_DURATION_SECONDS`] (40 s).
    pub lease_duration: Duration,
    /// How often the status is posted when nothing changed. Default
    /// [`node::NODE_STATUS_REPORT_FREQUENCY`] (5 min).
    pub status_report_frequency: Duration,
}

impl Default for HeartbeatOptions {
    fn default() -> Self {
        Self {
            lease_renew_interval: node::LEASE_RENEW_INTERVAL,
            lease_duration: Duration::from_secs(node::LEASE_DURATION_SECONDS.unsigned_abs().into()),
            status_report_frequency: node::NODE_STATUS_REPORT_FREQUENCY,
        }
    }
}

impl HeartbeatOptions {
    /// `leaseDurationSeconds`.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs())
            .unwrap_or(i32::MAX)
            .max(1)
    }
}

/// The heartbeat task of one node.
pub(crate) struct Heartbeat {
    pub(crate) client: kube::Client,
    pub(crate) config: NodeConfig,
    /// The Node as registered (its UID owns the Lease).
    pub(crate) node: Node,
    pub(crate) options: HeartbeatOptions,
    /// True while the kubelet is silenced.
    pub(crate) silenced: watch::Receiver<bool>,
    pub(crate) log: KubeletLog,
}

/// When the next heartbeats are due.
struct Due {
    lease: Instant,
    report: Instant,
    /// Earliest post prompted by a difference.
    repost: Instant,
}

impl Heartbeat {
    /// Runs until the kubelet goes away (its silence channel closes).
    pub(crate) async fn run(mut self) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let selector = format!("metadata.name={}", self.config.name);
        let stream = watcher::watcher(nodes, watcher::Config::default().fields(&selector))
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        let mut observed = self.node.clone();
        let now = Instant::now();
        let mut due = Due {
            lease: now + self.options.lease_renew_interval,
            report: now + self.options.status_report_frequency,
            repost: now,
        };
        let mut was_silenced = false;
        loop {
            let wake = if *self.silenced.borrow_and_update() {
                if !was_silenced {
                    self.log.line(format_args!(
                        "node {}: silenced: no Lease renewals, no status",
                        self.config.name
                    ));
                }
                was_silenced = true;
                Instant::now() + IDLE
            } else {
                let resumed = std::mem::take(&mut was_silenced);
                self.beat(resumed, &mut observed, &mut due).await;
                let mut wake = due.lease.min(due.report);
                if node::status_differs(&observed) {
                    wake = wake.min(due.repost);
                }
                wake
            };
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                changed = self.silenced.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                item = stream.next() => match item {
                    Some(Ok(node)) => observed = node,
                    Some(Err(e)) => self.log.line(format_args!("node watch: {e}")),
                    None => return,
                },
            }
        }
    }

    /// Renews the Lease and posts the status where due.
    async fn beat(&self, resumed: bool, observed: &mut Node, due: &mut Due) {
        let now = Instant::now();
        if resumed {
            self.log.line(format_args!(
                "node {}: resumed: renewing the Lease and posting the status",
                self.config.name
            ));
        }
        if resumed || now >= due.lease {
            let renewed = node::renew_lease(
                &self.client,
                &self.node,
                self.options.lease_duration_seconds(),
            )
            .await;
            due.lease = match renewed {
                Ok(()) => now + self.options.lease_renew_interval,
                Err(e) => {
                    self.log.line(format_args!("renewing the node lease: {e}"));
                    now + LEASE_RETRY.min(self.options.lease_renew_interval)
                }
            };
        }
        let differs = node::status_differs(observed);
        if resumed || now >= due.report || (differs && now >= due.repost) {
            if differs {
                self.log.line(format_args!(
                    "node {}: Ready is {} in the API: posting the status",
                    self.config.name,
                    node::ready_status(observed).unwrap_or("missing")
                ));
            }
            let previous = observed
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            match node::post_status(&self.client, &self.config, &previous).await {
                Ok(node) => {
                    *observed = node;
                    due.report = now + self.options.status_report_frequency;
                }
                Err(e) => self.log.line(format_args!("posting the node status: {e}")),
            }
            due.repost = Instant::now() + MIN_REPOST;
        }
    }
}
