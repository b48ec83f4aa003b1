//! Whether a member's etcd process is known to have stopped (pure decisions; issue 32).
//!
//! **Unknown is not gone.** A pod the API shows Terminating, or no longer shows at all, may
//! still run: when its node's kubelet is silent (paused, partitioned, its machine frozen) the
//! node controller evicts the pod and the API says it is being deleted, while its etcd goes on
//! serving and may hold the quorum with others on the same node. Automation that destroys or
//! replaces data acts only on what is known, so a member's process counts as stopped only when:
//! - its pod ended (`Failed`/`Succeeded`: the kubelet, or the pod garbage collector for a node
//!   that is gone, reported it);
//! - its node is gone (the Node object was deleted) or carries
//!   `node.kubernetes.io/out-of-service` (an administrator's word that it is down);
//! - its node is Ready and its kubelet reported the etcd container terminated, or removed the
//!   pod (a Ready kubelet stops the containers of pods no longer in the API).
//!
//! Anything else (a Terminating pod on a NotReady node, a pod gone while its node is silent, a
//! node that cannot be read, a pod gone with no record of where it ran) is *unknown*: the member
//! may still run.

use super::model::{NodeState, Observed, PodPhase, PodState};

/// The taint an administrator puts on a node that is down for good (non-graceful node
/// shutdown), so the operator may count the pods on it as stopped.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// What is known of a member's etcd process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Liveness {
    /// It runs, or may: its pod is not being deleted (the usual case), nothing to decide.
    Present,
    /// It is known to have stopped; why.
    Stopped(String),
    /// Its pod is being deleted or is gone, but nothing says the process stopped.
    Unconfirmed(Unconfirmed),
}

/// A member whose pod is being deleted or is gone while its process may still run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconfirmed {
    /// The member.
    pub member: String,
    /// Why its process is not known to have stopped.
    pub why: String,
    /// The node it runs (or ran) on, when known: what an administrator declares down.
    pub node: Option<String>,
}

impl Liveness {
    /// Whether the process is known to have stopped.
    pub fn is_stopped(&self) -> bool {
        matches!(self, Liveness::Stopped(_))
    }
}

/// What is known of member `name`'s etcd process, from its pod (or the record of the node its
/// pod last ran on) and that node's state.
pub fn liveness(obs: &Observed, name: &str) -> Liveness {
    match obs.pod(name) {
        Some(pod) => of_pod(pod),
        None => of_absent(obs, name),
    }
}

/// What is known of the process of a pod that is in the API.
pub fn of_pod(pod: &PodState) -> Liveness {
    if pod.phase == PodPhase::Ended {
        return Liveness::Stopped("its pod ended".into());
    }
    // A pod not being deleted may run (or still start: a Pending pod is never taken for a
    // failed member).
    if !pod.terminating {
        return Liveness::Present;
    }
    let Some(node) = &pod.node else {
        return Liveness::Stopped("its pod was deleted before it was ever scheduled".into());
    };
    let unconfirmed = |why: String| {
        Liveness::Unconfirmed(Unconfirmed {
            member: pod.name.clone(),
            why,
            node: Some(node.clone()),
        })
    };
    match pod.node_state {
        NodeState::Gone => Liveness::Stopped(format!("its node {node} is gone")),
        NodeState::OutOfService => Liveness::Stopped(format!(
            "its node {node} is out of service ({OUT_OF_SERVICE_TAINT})"
        )),
        NodeState::Ready if pod.container_stopped => Liveness::Stopped(format!(
            "the kubelet of node {node} (Ready) reported its etcd container terminated"
        )),
        NodeState::Ready => unconfirmed(format!(
            "its pod is terminating on node {node}, whose kubelet has not reported etcd stopped"
        )),
        NodeState::NotReady => unconfirmed(format!(
            "its pod is terminating on node {node}, which is not Ready: the kubelet there is silent, so etcd may still run and serve"
        )),
        NodeState::Unknown => unconfirmed(format!(
            "its pod is terminating on node {node}, which the operator cannot read"
        )),
    }
}

/// What is known of the process of a member whose pod is gone from the API.
fn of_absent(obs: &Observed, name: &str) -> Liveness {
    let Some(absent) = obs.absent(name) else {
        return Liveness::Unconfirmed(Unconfirmed {
            member: name.to_string(),
            why: "its pod is gone and no node is recorded for it".into(),
            node: None,
        });
    };
    let node = &absent.node;
    match absent.node_state {
        NodeState::Gone => Liveness::Stopped(format!("its pod and its node {node} are gone")),
        NodeState::OutOfService => Liveness::Stopped(format!(
            "its pod is gone and its node {node} is out of service ({OUT_OF_SERVICE_TAINT})"
        )),
        NodeState::Ready => Liveness::Stopped(format!(
            "its pod is gone and the kubelet of its node {node} (Ready) stops what the API no longer has"
        )),
        NodeState::NotReady => Liveness::Unconfirmed(Unconfirmed {
            member: name.to_string(),
            why: format!(
                "its pod was deleted while its node {node} is not Ready: etcd may still run there"
            ),
            node: Some(node.clone()),
        }),
        NodeState::Unknown => Liveness::Unconfirmed(Unconfirmed {
            member: name.to_string(),
            why: format!("its pod is gone and its node {node} cannot be read"),
            node: Some(node.clone()),
        }),
    }
}

/// The command that tells the operator (and Kubernetes) that `nodes` are down for good.
pub fn out_of_service_command(nodes: &[&str]) -> String {
    nodes
        .iter()
        .map(|n| format!("kubectl taint node {n} {OUT_OF_SERVICE_TAINT}=nodeshutdown:NoExecute"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::ready_pod;
    use crate::planner::model::AbsentPod;

    fn terminating(state: NodeState, stopped: bool) -> PodState {
        let mut p = ready_pod(1, "3.6.16");
        p.terminating = true;
        p.node = Some("node-b".into());
        p.node_state = state;
        p.container_stopped = stopped;
        p
    }

    /// Issue 32, item 1: a terminating pod is a stopped process only when that is known.
    #[test]
    fn a_terminating_pod_is_stopped_only_when_known() {
        for (what, pod, stopped) in [
            ("node gone", terminating(NodeState::Gone, false), true),
            (
                "node out of service",
                terminating(NodeState::OutOfService, false),
                true,
            ),
            (
                "Ready kubelet reported it terminated",
                terminating(NodeState::Ready, true),
                true,
            ),
            (
                "Ready kubelet, container still running (graceful stop, finalizer)",
                terminating(NodeState::Ready, false),
                false,
            ),
            (
                "silent node, even if its last report said terminated",
                terminating(NodeState::NotReady, true),
                false,
            ),
            (
                "node unreadable",
                terminating(NodeState::Unknown, false),
                false,
            ),
        ] {
            assert_eq!(
                of_pod(&pod).is_stopped(),
                stopped,
                "{what}: {:?}",
                of_pod(&pod)
            );
        }
        let mut ended = terminating(NodeState::NotReady, false);
        ended.phase = PodPhase::Ended;
        assert!(of_pod(&ended).is_stopped(), "an ended pod");
        let mut unscheduled = ready_pod(1, "3.6.16");
        unscheduled.node = None;
        assert_eq!(
            of_pod(&unscheduled),
            Liveness::Present,
            "Pending: may still start"
        );
        unscheduled.terminating = true;
        assert!(
            of_pod(&unscheduled).is_stopped(),
            "deleted before it was ever scheduled"
        );
        let mut running = ready_pod(1, "3.6.16");
        running.node = Some("node-a".into());
        assert_eq!(of_pod(&running), Liveness::Present);
    }

    /// A pod gone from the API is a stopped process only when its recorded node says so.
    #[test]
    fn an_absent_pod_is_stopped_only_when_its_node_says_so() {
        let obs = |state: Option<NodeState>| Observed {
            absent: state
                .map(|node_state| AbsentPod {
                    member: "demo-1".into(),
                    node: "node-b".into(),
                    node_state,
                })
                .into_iter()
                .collect(),
            ..Observed::default()
        };
        for (state, stopped) in [
            (Some(NodeState::Gone), true),
            (Some(NodeState::OutOfService), true),
            (Some(NodeState::Ready), true),
            (Some(NodeState::NotReady), false),
            (Some(NodeState::Unknown), false),
            (None, false),
        ] {
            assert_eq!(
                liveness(&obs(state), "demo-1").is_stopped(),
                stopped,
                "{state:?}"
            );
        }
    }
}
