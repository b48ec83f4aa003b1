//! One container of a pod as the worker tracks it: the running instance (process, probes,
//! readiness), restarts and back-off, the waiting reason, terminations, and its status view.
//! Init containers and app containers are tracked alike; only their status views differ
//! ([`ContainerRt::view`], [`ContainerRt::init_view`]).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::status::ContainerView;

/// A running container instance.
pub(crate) struct Instance {
    pub(crate) generation: u64,
    pub(crate) image: String,
    pub(crate) image_id: String,
    pub(crate) container_id: String,
    pub(crate) started_at: Timestamp,
    pub(crate) started_instant: Instant,
    /// Startup probe passed (or there is none).
    pub(crate) started: bool,
    /// Readiness probe passed (or there is none).
    pub(crate) ready_probe: bool,
    pub(crate) probes: Option<tokio::task::JoinHandle<()>>,
}

impl Drop for Instance {
    fn drop(&mut self) {
        // A dropped JoinHandle does not stop its task: stop the probes with the instance.
        if let Some(probes) = &self.probes {
            probes.abort();
        }
    }
}

/// One container of the pod spec, across its instances.
pub(crate) struct ContainerRt {
    pub(crate) spec: Container,
    pub(crate) restart_count: i32,
    pub(crate) instances: u32,
    pub(crate) running: Option<Instance>,
    pub(crate) waiting: (String, Option<String>),
    /// The termination of the previous instance (not the final one of a finished container).
    pub(crate) last_terminated: Option<ContainerStateTerminated>,
    /// Terminated for good (no restart, or an init container that completed): its final state.
    pub(crate) finished: Option<ContainerStateTerminated>,
    pub(crate) next_attempt: Instant,
    pub(crate) backoff: Duration,
    pub(crate) pull_failures: u32,
    pub(crate) image_id: String,
    /// The image this container has pulled, once it has.
    pub(crate) pulled: Option<String>,
    /// A pull in progress: the image and when it completes.
    pub(crate) pulling: Option<(String, Instant)>,
}

impl ContainerRt {
    /// A container not started yet, waiting with `reason` (`ContainerCreating`, or
    /// `PodInitializing` in a pod with init containers, as a kubelet reports them).
    pub(crate) fn new(spec: Container, backoff: Duration, reason: &str) -> Self {
        Self {
            spec,
            restart_count: 0,
            instances: 0,
            running: None,
            waiting: (reason.to_owned(), None),
            last_terminated: None,
            finished: None,
            next_attempt: Instant::now(),
            backoff,
            pull_failures: 0,
            image_id: String::new(),
            pulled: None,
            pulling: None,
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.spec.name
    }

    pub(crate) fn image(&self) -> String {
        self.spec.image.clone().unwrap_or_default()
    }

    pub(crate) fn view(&self) -> ContainerView {
        let terminated = |t: &ContainerStateTerminated| ContainerState {
            terminated: Some(t.clone()),
            ..ContainerState::default()
        };
        let (state, running) = match (&self.running, &self.finished) {
            (Some(i), _) => (
                ContainerState {
                    running: Some(ContainerStateRunning {
                        started_at: Some(Time(i.started_at)),
                    }),
                    ..ContainerState::default()
                },
                true,
            ),
            (None, Some(done)) => (terminated(done), false),
            (None, None) => (
                ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some(self.waiting.0.clone()),
                        message: self.waiting.1.clone(),
                    }),
                    ..ContainerState::default()
                },
                false,
            ),
        };
        // A finished container shows its end as its state; its last state is the instance
        // before (e.g. the failed attempts of an init container that then completed).
        let last_state = self.last_terminated.as_ref().map(terminated);
        let has_readiness = self.spec.readiness_probe.is_some();
        ContainerView {
            name: self.spec.name.clone(),
            image: self
                .running
                .as_ref()
                .map_or_else(|| self.image(), |i| i.image.clone()),
            image_id: self
                .running
                .as_ref()
                .map_or_else(|| self.image_id.clone(), |i| i.image_id.clone()),
            container_id: self
                .running
                .as_ref()
                .map(|i| i.container_id.clone())
                .or_else(|| {
                    self.finished
                        .as_ref()
                        .or(self.last_terminated.as_ref())
                        .and_then(|t| t.container_id.clone())
                }),
            ready: self
                .running
                .as_ref()
                .is_some_and(|i| i.started && (i.ready_probe || !has_readiness)),
            started: self.running.as_ref().is_some_and(|i| i.started),
            restart_count: self.restart_count,
            state,
            last_state,
            running,
            ever_started: self.instances > 0,
            finished: self.finished.as_ref().map(|t| t.exit_code),
        }
    }

    /// The status view of an init container: ready once it completed (exit 0), as a kubelet
    /// reports init containers.
    pub(crate) fn init_view(&self) -> ContainerView {
        let mut view = self.view();
        view.ready = self.finished.as_ref().is_some_and(|t| t.exit_code == 0);
        view
    }

    /// An init container that completed (exited 0): it is not run again for this pod.
    pub(crate) fn completed(&self) -> bool {
        self.finished.as_ref().is_some_and(|t| t.exit_code == 0)
    }
}

/// Exit code and signal of a status, as Kubernetes reports them (128 + signal when killed).
pub(crate) fn exit_code(status: std::process::ExitStatus) -> (i32, Option<i32>) {
    use std::os::unix::process::ExitStatusExt as _;
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, None),
        (None, Some(signal)) => (128 + signal, Some(signal)),
        (None, None) => (-1, None),
    }
}
