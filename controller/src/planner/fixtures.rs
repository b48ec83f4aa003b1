//! Test fixtures: pods as the planner sees them.

/// A running, ready, hour-old pod of member `demo-i` created at `version`, as the planner sees it.
pub(crate) fn ready_pod(i: u32, version: &str) -> super::PodState {
    let parsed = version.parse().ok();
    super::PodState {
        name: format!("demo-{i}"),
        version: parsed,
        image: format!("quay.io/coreos/etcd:v{version}"),
        restarts: 0,
        restarts_at_upgrade: None,
        phase: super::PodPhase::Running,
        ready: true,
        ip: Some(format!("10.0.0.{i}")),
        terminating: false,
        age: std::time::Duration::from_secs(3600),
        created_on: parsed,
        data_created_on: parsed,
        snapshot_barrier: None,
        overdue: std::time::Duration::ZERO,
        running_for: Some(std::time::Duration::from_secs(3600)),
        reason: None,
        coreos: false,
    }
}
