//! Several process kubelets in one suite: N Nodes, each with its own Lease, status and pods,
//! all on the one pod network and hosts file, scheduled by the real kube-scheduler (so
//! affinity, anti-affinity, topology spread, taints and tolerations are honoured), with zone
//! labels, and node-fault timings short enough for tests.
//!
//! ```no_run
//! use etcd_tests::kubelet::nodes::NodesOptions;
//! # fn main() -> std::process::ExitCode {
//! # let tests = Vec::new();
//! etcd_tests::Suite::new()
//!     .with_nodes(NodesOptions { count: 3, ..NodesOptions::default() })
//!     .run(tests)
//! # }
//! ```
//!
//! The timings are real flags of the pinned Kubernetes: kube-controller-manager's
//! `--node-monitor-grace-period` (how long a silent node stays Ready) and
//! `--node-monitor-period` (how often the node lifecycle controller looks), kube-apiserver's
//! `--default-not-ready-toleration-seconds` and `--default-unreachable-toleration-seconds`
//! (the DefaultTolerationSeconds admission plugin gives every pod these tolerations of the
//! `NoExecute` taints the node lifecycle controller puts on a NotReady or unreachable node; when
//! they run out, the taint-eviction controller deletes the pod).

use std::collections::BTreeMap;
use std::time::Duration;

use super::heartbeat::HeartbeatOptions;
use super::{DEFAULT_NODE_NAME, KubeletOptions};
use crate::control_plane::ControlPlaneOptions;

/// The well-known zone label.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The well-known region label (every node of the suite is in [`REGION`]).
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
/// The region of every node.
pub const REGION: &str = "etcd-tests";

/// Several nodes and the timings of node faults.
#[derive(Debug, Clone)]
pub struct NodesOptions {
    /// How many nodes (at least 1). Default 3.
    pub count: usize,
    /// Node names are `{name_prefix}-{i}`, `i` from 1. Default `etcd-tests-node`.
    pub name_prefix: String,
    /// Zones, given round-robin: node `i` is in `zones[(i - 1) % len]` ([`ZONE_LABEL`]); none:
    /// no zone label. Default `zone-a`, `zone-b`, `zone-c`.
    pub zones: Vec<String>,
    /// Every node's options (images, capacity, back-off, ...); `node_name`, `bind_pods`,
    /// `allocate_node_ip` and `heartbeat.lease_*` are set per node from these options. Its
    /// image map is shared: a rule registered on any node applies to all.
    pub kubelet: KubeletOptions,
    /// Each kubelet's Lease renew interval. Default 2 s (a kubelet: 10 s).
    pub lease_renew_interval: Duration,
    /// Each kubelet's Lease duration. Default 8 s (a kubelet: 40 s).
    pub lease_duration: Duration,
    /// kube-controller-manager `--node-monitor-grace-period`: how long a node may stay silent
    /// before it is marked `Unknown`. Must be well above the renew interval (at least three
    /// times). Default 10 s (Kubernetes: 50 s).
    pub node_monitor_grace_period: Duration,
    /// kube-controller-manager `--node-monitor-period`. Default 1 s (Kubernetes: 5 s).
    pub node_monitor_period: Duration,
    /// kube-apiserver `--default-not-ready-toleration-seconds`. Default 10 s (Kubernetes:
    /// 300 s).
    pub not_ready_toleration: Duration,
    /// kube-apiserver `--default-unreachable-toleration-seconds`. Default 5 s (Kubernetes:
    /// 300 s).
    pub unreachable_toleration: Duration,
}

impl Default for NodesOptions {
    fn default() -> Self {
        Self {
            count: 3,
            name_prefix: DEFAULT_NODE_NAME.to_owned(),
            zones: ["zone-a", "zone-b", "zone-c"].map(str::to_owned).to_vec(),
            kubelet: KubeletOptions::default(),
            lease_renew_interval: Duration::from_secs(2),
            lease_duration: Duration::from_secs(8),
            node_monitor_grace_period: Duration::from_secs(10),
            node_monitor_period: Duration::from_secs(1),
            not_ready_toleration: Duration::from_secs(10),
            unreachable_toleration: Duration::from_secs(5),
        }
    }
}

/// Go duration text of `d` (`1500ms`).
fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

impl NodesOptions {
    /// `count` nodes with Kubernetes' own timings (renew 10 s, lease 40 s, grace 50 s,
    /// monitor 5 s, tolerations 300 s): node faults take minutes to show.
    pub fn kubernetes_defaults(count: usize) -> Self {
        Self {
            count,
            lease_renew_interval: Duration::from_secs(10),
            lease_duration: Duration::from_secs(40),
            node_monitor_grace_period: Duration::from_secs(50),
            node_monitor_period: Duration::from_secs(5),
            not_ready_toleration: Duration::from_secs(300),
            unreachable_toleration: Duration::from_secs(300),
            ..Self::default()
        }
    }

    /// The node names, in order.
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.count)
            .map(|i| format!("{}-{i}", self.name_prefix))
            .collect()
    }

    /// Refuses options the control plane would misread: no node, a grace period that a
    /// renewal or two late would already exceed, sub-second tolerations.
    pub fn validate(&self) -> Result<(), String> {
        if self.count == 0 {
            return Err("NodesOptions::count must be at least 1".into());
        }
        if self.lease_renew_interval.is_zero() {
            return Err("NodesOptions::lease_renew_interval must not be zero".into());
        }
        if self.node_monitor_grace_period < self.lease_renew_interval * 3 {
            return Err(format!(
                "NodesOptions::node_monitor_grace_period ({:?}) must be at least three lease \
                 renew intervals ({:?}): a renewal or two late would mark a healthy node Unknown",
                self.node_monitor_grace_period, self.lease_renew_interval
            ));
        }
        if self.not_ready_toleration.as_secs() == 0 || self.unreachable_toleration.as_secs() == 0 {
            return Err("NodesOptions tolerations are whole seconds, at least 1".into());
        }
        Ok(())
    }

    /// The options of each kubelet, in order: the first keeps the network's node IP and adds
    /// the etcd image rule to the shared image map; every node gets its zone and region
    /// labels, the Lease timings, and no binder (kube-scheduler binds).
    pub fn kubelet_options(&self) -> Vec<KubeletOptions> {
        self.node_names()
            .into_iter()
            .enumerate()
            .map(|(i, name)| {
                let mut options = self.kubelet.clone();
                options.node_name = name;
                options.bind_pods = false;
                options.allocate_node_ip = i > 0;
                options.etcd_images = self.kubelet.etcd_images && i == 0;
                options.heartbeat = HeartbeatOptions {
                    lease_renew_interval: self.lease_renew_interval,
                    lease_duration: self.lease_duration,
                    ..self.kubelet.heartbeat
                };
                let mut labels = BTreeMap::from([(REGION_LABEL.to_owned(), REGION.to_owned())]);
                if !self.zones.is_empty() {
                    labels.insert(
                        ZONE_LABEL.to_owned(),
                        self.zones[i % self.zones.len()].clone(),
                    );
                }
                labels.extend(self.kubelet.node_labels.clone());
                options.node_labels = labels;
                options
            })
            .collect()
    }

    /// Turns kube-scheduler on and adds the timing flags to the control plane's options.
    pub fn apply_to(&self, options: &mut ControlPlaneOptions) {
        options.scheduler = true;
        options.extra_controller_manager_args.extend([
            format!(
                "--node-monitor-grace-period={}",
                go_duration(self.node_monitor_grace_period)
            ),
            format!(
                "--node-monitor-period={}",
                go_duration(self.node_monitor_period)
            ),
        ]);
        options.extra_apiserver_args.extend([
            format!(
                "--default-not-ready-toleration-seconds={}",
                self.not_ready_toleration.as_secs()
            ),
            format!(
                "--default-unreachable-toleration-seconds={}",
                self.unreachable_toleration.as_secs()
            ),
        ]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_get_names_zones_and_no_binder() {
        let options = NodesOptions::default();
        let kubelets = options.kubelet_options();
        let names: Vec<&str> = kubelets.iter().map(|k| k.node_name.as_str()).collect();
        assert_eq!(
            names,
            [
                "etcd-tests-node-1",
                "etcd-tests-node-2",
                "etcd-tests-node-3"
            ]
        );
        let zones: Vec<&str> = kubelets
            .iter()
            .map(|k| k.node_labels[ZONE_LABEL].as_str())
            .collect();
        assert_eq!(zones, ["zone-a", "zone-b", "zone-c"]);
        assert!(kubelets.iter().all(|k| !k.bind_pods));
        assert!(kubelets[0].etcd_images && !kubelets[1].etcd_images);
        assert!(!kubelets[0].allocate_node_ip && kubelets[2].allocate_node_ip);
        assert_eq!(
            kubelets[1].heartbeat.lease_renew_interval,
            Duration::from_secs(2)
        );
    }

    #[test]
    fn flags_and_validation() {
        let options = NodesOptions::default();
        let mut cp = ControlPlaneOptions::default();
        options.apply_to(&mut cp);
        assert!(cp.scheduler);
        assert!(
            cp.extra_controller_manager_args
                .contains(&"--node-monitor-grace-period=10000ms".to_owned())
        );
        assert!(
            cp.extra_apiserver_args
                .contains(&"--default-unreachable-toleration-seconds=5".to_owned())
        );
        assert!(options.validate().is_ok());
        let too_short = NodesOptions {
            node_monitor_grace_period: Duration::from_secs(4),
            ..NodesOptions::default()
        };
        assert!(too_short.validate().is_err());
    }
}
