//! The defaulting JSONPatch: the diff of the typed object and its defaulted copy, so fields
//! this crate does not know and fields that are absent never turn into spurious operations.

use etcd_shared::admission::AdmissionPolicy;
use etcd_shared::{EtcdCluster, EtcdClusterSpec};
use serde_json::{Map, Value};

use super::decode::Present;
use super::error::ReviewError;

/// The JSONPatch that turns the raw object (whose top-level fields are `present`) into its
/// defaulted form: the diff of the typed object and its defaulted copy, so only the defaulted
/// fields appear in it, plus an add of the whole field where the raw object lacks a top-level
/// field the diff writes into. Only the top-level fields that defaulting changed are serialized
/// and compared, and of the spec not its pod policy while defaulting leaves that alone (it is
/// the part that can be large), so a patch costs little whatever the object's size.
pub(super) fn defaulting_patch(
    policy: &AdmissionPolicy,
    present: Present,
    typed: &EtcdCluster,
    old: Option<&EtcdCluster>,
) -> Result<json_patch::Patch, ReviewError> {
    let defaulted = policy.defaulted_update(typed, old);
    let mut before = Map::new();
    let mut after = Map::new();
    let mut compare = |key: &str, old: Value, new: Value| {
        before.insert(key.to_string(), old);
        after.insert(key.to_string(), new);
    };
    if typed.metadata != defaulted.metadata {
        compare(
            "metadata",
            to_json(&typed.metadata)?,
            to_json(&defaulted.metadata)?,
        );
    }
    if typed.spec != defaulted.spec {
        if typed.spec.pod == defaulted.spec.pod {
            compare(
                "spec",
                to_json(&without_pod(&typed.spec))?,
                to_json(&without_pod(&defaulted.spec))?,
            );
        } else {
            compare("spec", to_json(&typed.spec)?, to_json(&defaulted.spec)?);
        }
    }
    if typed.status != defaulted.status {
        compare(
            "status",
            to_json(&typed.status)?,
            to_json(&defaulted.status)?,
        );
    }
    if before == after {
        return Ok(json_patch::Patch(Vec::new()));
    }
    // A top-level field the raw object lacks (or has as null) is added whole; the others
    // get the diff's operations inside them.
    let mut operations = Vec::new();
    for (key, value) in &after {
        let here = match key.as_str() {
            "metadata" => present.metadata,
            "spec" => present.spec,
            _ => present.status,
        };
        if !here {
            before.remove(key);
            let add = serde_json::json!({"op": "add", "path": format!("/{key}"), "value": value});
            operations.push(serde_json::from_value(add).map_err(ReviewError::internal)?);
        }
    }
    let present_after: Map<String, Value> = after
        .into_iter()
        .filter(|(k, _)| before.contains_key(k))
        .collect();
    operations.extend(json_patch::diff(&Value::Object(before), &Value::Object(present_after)).0);
    Ok(json_patch::Patch(operations))
}

/// The spec without its pod policy. Every field is named, so a new field of the spec cannot be
/// forgotten here.
fn without_pod(spec: &EtcdClusterSpec) -> EtcdClusterSpec {
    let EtcdClusterSpec {
        size,
        version,
        repository,
        paused,
        pod: _,
        tls,
        safety_backup,
        recovery,
        network,
    } = spec;
    EtcdClusterSpec {
        size: *size,
        version: version.clone(),
        repository: repository.clone(),
        paused: *paused,
        pod: None,
        tls: tls.clone(),
        safety_backup: safety_backup.clone(),
        recovery: recovery.clone(),
        network: network.clone(),
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Value, ReviewError> {
    serde_json::to_value(value).map_err(ReviewError::internal)
}
