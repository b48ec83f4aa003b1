//! What the API says of the nodes member pods run on: read only for the pods whose liveness
//! matters (terminating pods, pods gone from the API), one GET per node and observation, so a
//! healthy cluster costs no node read at all and a large cluster's nodes are never listed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::planner::NodeState;
use crate::planner::liveness::OUT_OF_SERVICE_TAINT;

/// The state of a Node object as the planner weighs it (pure).
pub fn state_of(node: &Node) -> NodeState {
    let out_of_service = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|taints| taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
    if out_of_service {
        return NodeState::OutOfService;
    }
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    if ready {
        NodeState::Ready
    } else {
        NodeState::NotReady
    }
}

/// Reads each of `names` once: gone (404), its state, or unknown when it cannot be read (no
/// permission to read nodes, an API error): unknown is never taken for gone.
pub async fn states(client: &kube::Client, names: &[String]) -> BTreeMap<String, NodeState> {
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for name in names {
        if out.contains_key(name) {
            continue;
        }
        let state = match nodes.get_opt(name).await {
            Ok(Some(node)) => state_of(&node),
            Ok(None) => NodeState::Gone,
            Err(e) => {
                tracing::debug!(node = %name, error = %e, "cannot read node");
                NodeState::Unknown
            }
        };
        out.insert(name.clone(), state);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap_or_else(|e| panic!("fixture: {e}"))
    }

    #[test]
    fn node_states() {
        let ready =
            serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let unknown =
            serde_json::json!({"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        let tainted = serde_json::json!({
            "spec": {"taints": [{"key": OUT_OF_SERVICE_TAINT, "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}});
        assert_eq!(state_of(&node(ready)), NodeState::Ready);
        assert_eq!(state_of(&node(unknown)), NodeState::NotReady);
        assert_eq!(state_of(&node(serde_json::json!({}))), NodeState::NotReady);
        assert_eq!(state_of(&node(tainted)), NodeState::OutOfService);
    }
}
