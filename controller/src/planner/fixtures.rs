//! Test fixtures: pods and members as the planner sees them.

/// A running, ready, hour-old pod of member `demo-i` created at `version`, as the planner sees it.
pub(crate) fn ready_pod(i: u32, version: &str) -> super::PodState {
    let parsed = version.parse().ok();
    super::PodState {
        name: format!("demo-{i}"),
        uid: Some(format!("uid-demo-{i}")),
        version: parsed,
        image: format!("quay.io/coreos/etcd:v{version}"),
        restarts: 0,
        restarts_at_upgrade: None,
        phase: super::PodPhase::Running,
        ready: true,
        in_service: true,
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
        node: Some(format!("node-{i}")),
        node_state: super::NodeState::Unknown,
        container_stopped: false,
        serving: None,
        serving_changed: None,
        tls: super::TlsStamp::default(),
        transport: None,
        tls_secrets: Vec::new(),
    }
}

/// A started, healthy voter `name` with `id` at `version` (the leader when `leader`) that
/// answered, as the planner sees it.
pub(crate) fn healthy_member(
    name: &str,
    id: u64,
    version: Option<etcd_shared::version::EtcdVersion>,
    leader: bool,
) -> super::MemberState {
    super::MemberState {
        id,
        name: name.into(),
        learner: false,
        started: true,
        health: super::Health::Healthy { version, leader },
        applied_index: 0,
        db: super::DbSize::default(),
        revision: 0,
        answered: true,
        raft_index: 0,
        peer_url: None,
    }
}

/// The plan of member `name` of a new 3.6.16 cluster, peers unlisted.
pub(crate) fn new_member_plan(name: &str) -> super::MemberPlan {
    super::MemberPlan {
        name: name.into(),
        initial_cluster: vec![],
        state: super::InitialState::New,
        version: "3.6.16".parse().unwrap_or_else(|e| panic!("{e}")),
        token: "demo-uid-1".into(),
        seed: None,
    }
}

/// The removal of member `demo-i` (id 100 + i) for `reason`.
pub(crate) fn remove_member(i: u32, reason: super::RemovalReason) -> super::Step {
    super::Step::RemoveMember {
        id: 100 + u64::from(i),
        name: format!("demo-{i}"),
        reason,
    }
}

/// The addition of member `demo-i` with its in-cluster peer URL.
pub(crate) fn add_member(i: u32, learner: bool) -> super::Step {
    super::Step::AddMember {
        name: format!("demo-{i}"),
        peer_url: format!("http://demo-{i}.demo.ns1.svc:2380"),
        learner,
    }
}

/// The upgrade of member `demo-i` to `version` on the stock image.
pub(crate) fn upgrade_member(i: u32, version: &str) -> super::Step {
    super::Step::UpgradeMember {
        name: format!("demo-{i}"),
        image: format!("quay.io/coreos/etcd:v{version}"),
        version: version.parse().unwrap_or_else(|e| panic!("{e}")),
    }
}
