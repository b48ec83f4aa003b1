//! Pod status as a kubelet reports it: phase, IPs, conditions and (init) container statuses, built
//! from the worker's view of its containers (pure functions), and the merge patch that writes
//! it through `pods/status`.

use std::net::Ipv4Addr;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// One container, as the worker sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerView {
    /// Container name.
    pub name: String,
    /// The image it runs (or will run).
    pub image: String,
    /// `imageID` once pulled.
    pub image_id: String,
    /// `containerID` of the current or last instance.
    pub container_id: Option<String>,
    /// Readiness.
    pub ready: bool,
    /// Startup probe passed (or none) and running.
    pub started: bool,
    /// Restarts so far.
    pub restart_count: i32,
    /// Current state.
    pub state: ContainerState,
    /// The previous instance's termination, if any.
    pub last_state: Option<ContainerState>,
    /// A process is running.
    pub running: bool,
    /// Some instance has been started.
    pub ever_started: bool,
    /// Terminated and will not be restarted: its exit code.
    pub finished: Option<i32>,
}

/// Everything a status is built from.
#[derive(Debug, Clone)]
pub struct PodView<'a> {
    /// The pod as last observed (spec, generation, conditions owned by others).
    pub pod: &'a Pod,
    /// The pod IP, once allocated.
    pub pod_ip: Option<Ipv4Addr>,
    /// The node IP.
    pub host_ip: Ipv4Addr,
    /// When the kubelet accepted the pod.
    pub start_time: Timestamp,
    /// Volumes are set up and the IP assigned (the "sandbox").
    pub sandbox_ready: bool,
    /// Init containers in spec order (run one at a time before the containers).
    pub init_containers: Vec<ContainerView>,
    /// Containers in spec order.
    pub containers: Vec<ContainerView>,
    /// Pod-level message (e.g. a volume that cannot be set up yet).
    pub message: Option<String>,
    /// The kubelet ended the pod for good (a graceful node shutdown, an eviction): phase
    /// `Failed` with this `(reason, message)`, whatever the containers' exit codes.
    pub ended: Option<(String, String)>,
}

/// Condition types this kubelet owns (others, e.g. readiness gates, are kept as they are).
pub const OWN_CONDITIONS: &[&str] = &[
    "PodScheduled",
    "PodReadyToStartContainers",
    "Initialized",
    "ContainersReady",
    "Ready",
];

/// The pod phase: Running while any container runs or will run again after starting once;
/// Succeeded/Failed when all are finished for good; Pending before.
pub fn phase(containers: &[ContainerView]) -> &'static str {
    if containers.iter().any(|c| c.running) {
        return "Running";
    }
    if !containers.is_empty() && containers.iter().all(|c| c.finished.is_some()) {
        return if containers.iter().all(|c| c.finished == Some(0)) {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    if containers.iter().any(|c| c.ever_started) {
        "Running"
    } else {
        "Pending"
    }
}

/// The pod phase with init containers: Failed when one failed for good (restartPolicy
/// Never), Pending until all completed, then as [`phase`] says of the containers.
pub fn pod_phase(init_containers: &[ContainerView], containers: &[ContainerView]) -> &'static str {
    if init_containers
        .iter()
        .any(|c| c.finished.is_some_and(|code| code != 0))
    {
        return "Failed";
    }
    if init_containers.iter().any(|c| c.finished != Some(0)) {
        return "Pending";
    }
    phase(containers)
}

fn condition(
    type_: &str,
    ok: bool,
    reason: Option<&str>,
    message: Option<String>,
    previous: &[PodCondition],
    now: &Timestamp,
    generation: Option<i64>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let transition = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(*now));
    PodCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: reason.map(str::to_owned),
        message,
        last_transition_time: Some(transition),
        last_probe_time: None,
        observed_generation: generation,
    }
}

/// The status for `view`. `previous` are the conditions last written (their transition times
/// are kept while the status does not change).
pub fn build(view: &PodView<'_>, previous: &[PodCondition], now: Timestamp) -> PodStatus {
    let pod = view.pod;
    let generation = pod.metadata.generation;
    let phase = if view.ended.is_some() {
        "Failed"
    } else {
        pod_phase(&view.init_containers, &view.containers)
    };
    let terminal = matches!(phase, "Succeeded" | "Failed");
    let unready: Vec<&str> = view
        .containers
        .iter()
        .filter(|c| !c.ready)
        .map(|c| c.name.as_str())
        .collect();
    let containers_ready = unready.is_empty() && !view.containers.is_empty();
    let observed = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let gates: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.readiness_gates.iter().flatten())
        .map(|g| g.condition_type.as_str())
        .collect();
    let missing_gates: Vec<&str> = gates
        .iter()
        .copied()
        .filter(|g| !observed.iter().any(|c| c.type_ == *g && c.status == "True"))
        .collect();

    let uninitialized: Vec<&str> = view
        .init_containers
        .iter()
        .filter(|c| c.finished != Some(0))
        .map(|c| c.name.as_str())
        .collect();
    let initialized = uninitialized.is_empty();
    let unready_message = (!unready.is_empty())
        .then(|| format!("containers with unready status: [{}]", unready.join(" ")));
    let mut conditions = vec![
        condition("PodScheduled", true, None, None, previous, &now, generation),
        condition(
            "PodReadyToStartContainers",
            view.sandbox_ready,
            None,
            None,
            previous,
            &now,
            generation,
        ),
        condition(
            "Initialized",
            initialized,
            (!initialized).then_some("ContainersNotInitialized"),
            (!initialized).then(|| {
                format!(
                    "containers with incomplete status: [{}]",
                    uninitialized.join(" ")
                )
            }),
            previous,
            &now,
            generation,
        ),
        condition(
            "ContainersReady",
            containers_ready && !terminal,
            (!containers_ready || terminal).then_some(if terminal {
                "PodCompleted"
            } else {
                "ContainersNotReady"
            }),
            if terminal {
                None
            } else {
                unready_message.clone()
            },
            previous,
            &now,
            generation,
        ),
    ];
    let ready = containers_ready && !terminal && missing_gates.is_empty();
    let (reason, message) = if terminal {
        (Some("PodCompleted"), None)
    } else if !containers_ready {
        (Some("ContainersNotReady"), unready_message)
    } else if !missing_gates.is_empty() {
        (
            Some("ReadinessGatesNotReady"),
            Some(format!(
                "corresponding condition of pod readiness gate \"{}\" does not exist.",
                missing_gates.join("\", \"")
            )),
        )
    } else {
        (None, None)
    };
    conditions.push(condition(
        "Ready", ready, reason, message, previous, &now, generation,
    ));
    conditions.extend(
        observed
            .into_iter()
            .filter(|c| !OWN_CONDITIONS.contains(&c.type_.as_str())),
    );

    let statuses = |views: &[ContainerView]| -> Vec<ContainerStatus> {
        views
            .iter()
            .map(|c| ContainerStatus {
                name: c.name.clone(),
                image: c.image.clone(),
                image_id: c.image_id.clone(),
                container_id: c.container_id.clone(),
                ready: c.ready,
                started: Some(c.started),
                restart_count: c.restart_count,
                state: Some(c.state.clone()),
                last_state: Some(c.last_state.clone().unwrap_or_default()),
                ..ContainerStatus::default()
            })
            .collect()
    };

    PodStatus {
        phase: Some(phase.to_owned()),
        conditions: Some(conditions),
        container_statuses: Some(statuses(&view.containers)),
        init_container_statuses: (!view.init_containers.is_empty())
            .then(|| statuses(&view.init_containers)),
        host_ip: Some(view.host_ip.to_string()),
        host_ips: Some(vec![HostIP {
            ip: view.host_ip.to_string(),
        }]),
        pod_ip: view.pod_ip.map(|ip| ip.to_string()),
        pod_ips: view.pod_ip.map(|ip| vec![PodIP { ip: ip.to_string() }]),
        start_time: Some(Time(view.start_time)),
        message: view
            .ended
            .as_ref()
            .map(|(_, m)| m.clone())
            .or_else(|| view.message.clone()),
        reason: view.ended.as_ref().map(|(r, _)| r.clone()),
        observed_generation: generation,
        ..PodStatus::default()
    }
}

/// The JSON merge patch writing `status`: lists are replaced as a whole, and the optional
/// fields this kubelet owns are set to `null` when absent so stale values go away.
pub fn merge_patch(status: &PodStatus) -> serde_json::Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    if let Some(map) = value.as_object_mut() {
        for key in ["message", "reason", "podIP", "podIPs"] {
            map.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    serde_json::json!({ "status": value })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerStateRunning, ContainerStateWaiting, PodSpec};

    fn container(running: bool, ready: bool) -> ContainerView {
        ContainerView {
            name: "etcd".into(),
            image: "quay.io/coreos/etcd:v3.6.16".into(),
            image_id: "local:///etcd".into(),
            container_id: None,
            ready,
            started: running,
            restart_count: 0,
            state: if running {
                ContainerState {
                    running: Some(ContainerStateRunning::default()),
                    ..ContainerState::default()
                }
            } else {
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".into()),
                        message: None,
                    }),
                    ..ContainerState::default()
                }
            },
            last_state: None,
            running,
            ever_started: running,
            finished: None,
        }
    }

    /// A pod the kubelet ended (a graceful node shutdown) is Failed with the kubelet's reason
    /// and message, not Ready, even when its containers exited 0 on SIGTERM.
    #[test]
    fn an_ended_pod_is_failed_with_the_kubelets_reason() {
        let pod = Pod::default();
        let mut stopped = container(false, false);
        stopped.finished = Some(0);
        let view = PodView {
            pod: &pod,
            pod_ip: None,
            host_ip: Ipv4Addr::new(10, 0, 0, 1),
            start_time: Timestamp::UNIX_EPOCH,
            sandbox_ready: false,
            init_containers: vec![],
            containers: vec![stopped],
            message: None,
            ended: Some((
                "Terminated".into(),
                "Pod was terminated in response to imminent node shutdown.".into(),
            )),
        };
        let status = build(&view, &[], Timestamp::UNIX_EPOCH);
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Terminated"));
        assert!(status.message.unwrap_or_default().contains("node shutdown"));
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status);
        assert_eq!(ready.as_deref(), Some("False"));
    }

    #[test]
    fn phases() {
        assert_eq!(phase(&[container(false, false)]), "Pending");
        assert_eq!(phase(&[container(true, false)]), "Running");
        let mut done = container(false, false);
        done.finished = Some(0);
        assert_eq!(phase(std::slice::from_ref(&done)), "Succeeded");
        let mut failed = done.clone();
        failed.finished = Some(1);
        assert_eq!(phase(&[done, failed]), "Failed");
        let mut backoff = container(false, false);
        backoff.ever_started = true;
        assert_eq!(phase(&[backoff]), "Running");
    }

    #[test]
    fn conditions_keep_transition_times_and_foreign_types() {
        let pod = Pod {
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                conditions: Some(vec![PodCondition {
                    type_: "DisruptionTarget".into(),
                    status: "True".into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        };
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let mut view = PodView {
            pod: &pod,
            pod_ip: Some(Ipv4Addr::new(10, 244, 0, 2)),
            host_ip: Ipv4Addr::new(10, 244, 0, 1),
            start_time: t0,
            sandbox_ready: true,
            init_containers: Vec::new(),
            containers: vec![container(true, false)],
            message: None,
            ended: None,
        };
        let first = build(&view, &[], t0);
        let ready = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
                .unwrap()
        };
        assert_eq!(ready(&first).status, "False");
        assert_eq!(
            ready(&first).message.as_deref(),
            Some("containers with unready status: [etcd]")
        );
        assert!(
            first
                .conditions
                .as_ref()
                .unwrap()
                .iter()
                .any(|c| c.type_ == "DisruptionTarget")
        );
        view.containers[0].ready = true;
        let second = build(&view, first.conditions.as_deref().unwrap(), t1);
        assert_eq!(ready(&second).status, "True");
        assert_eq!(ready(&second).last_transition_time, Some(Time(t1)));
        let scheduled = |s: &PodStatus| {
            s.conditions.as_ref().unwrap()[0]
                .last_transition_time
                .clone()
        };
        assert_eq!(scheduled(&second), Some(Time(t0)));
        assert_eq!(second.pod_ip.as_deref(), Some("10.244.0.2"));
        let patch = merge_patch(&second);
        assert!(patch["status"]["message"].is_null());
        assert_eq!(patch["status"]["phase"], "Running");
    }

    #[test]
    fn init_containers_gate_the_phase_and_the_initialized_condition() {
        let init = |name: &str, finished: Option<i32>| {
            let mut c = container(false, false);
            c.name = name.into();
            c.finished = finished;
            c.ever_started = finished.is_some();
            c
        };
        let app = [container(false, false)];
        assert_eq!(
            pod_phase(&[init("a", Some(0)), init("b", None)], &app),
            "Pending"
        );
        assert_eq!(pod_phase(&[init("a", Some(1))], &app), "Failed");
        assert_eq!(
            pod_phase(&[init("a", Some(0))], &[container(true, false)]),
            "Running"
        );
        assert_eq!(pod_phase(&[], &app), "Pending");

        let pod = Pod {
            spec: Some(PodSpec::default()),
            ..Pod::default()
        };
        let t0 = Timestamp::from_second(1_000).unwrap();
        let mut view = PodView {
            pod: &pod,
            pod_ip: None,
            host_ip: Ipv4Addr::new(10, 244, 0, 1),
            start_time: t0,
            sandbox_ready: true,
            init_containers: vec![init("a", Some(0)), init("b", None)],
            containers: app.to_vec(),
            message: None,
            ended: None,
        };
        let initialized = |s: &PodStatus| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == "Initialized")
                .cloned()
                .unwrap()
        };
        let pending = build(&view, &[], t0);
        let condition = initialized(&pending);
        assert_eq!(condition.status, "False");
        assert_eq!(
            condition.reason.as_deref(),
            Some("ContainersNotInitialized")
        );
        assert_eq!(
            condition.message.as_deref(),
            Some("containers with incomplete status: [b]")
        );
        let statuses = pending.init_container_statuses.as_ref().unwrap();
        assert_eq!(statuses.len(), 2);
        assert_eq!(statuses[1].name, "b");
        assert_eq!(pending.phase.as_deref(), Some("Pending"));

        view.init_containers[1].finished = Some(0);
        let done = build(&view, pending.conditions.as_deref().unwrap(), t0);
        assert_eq!(initialized(&done).status, "True");
        assert_eq!(initialized(&done).reason, None);

        view.init_containers.clear();
        assert!(build(&view, &[], t0).init_container_statuses.is_none());
    }
}
