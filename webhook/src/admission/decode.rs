//! The AdmissionReview's raw objects as the typed [`EtcdCluster`]s the rules judge.
//!
//! Only `metadata` and `spec` are decoded. `status` is never judged: the API server drops it
//! from writes to the main resource anyway, and CoreOS' Go clients send one on every create and
//! update (`phase: ""`, `Failed`, conditions in CoreOS' shape). The one thing the rules read from
//! it, the version the members run (`status.currentVersion`, for the upgrade-in-progress rule),
//! is read leniently: anything but a non-empty string reads as unknown.

use etcd_shared::{EtcdCluster, EtcdClusterSpec, EtcdClusterStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why `metadata` or `spec` does not read as an EtcdCluster's.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", at(.field))]
pub(crate) struct DecodeError {
    field: String,
    #[source]
    source: serde_json::Error,
}

impl DecodeError {
    /// Path of the offending field, such as `spec.size` (empty when the object itself is not
    /// a JSON object).
    pub fn field(&self) -> &str {
        &self.field
    }

    /// What is wrong with it, without the path.
    pub fn reason(&self) -> String {
        self.source.to_string()
    }
}

fn at(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!("{field}: ")
    }
}

/// Reads `metadata` and `spec` of the raw object; a missing or null one reads as empty (an
/// empty spec is what defaulting fills). The status holds only the members' version.
pub(crate) fn decode(raw: &Value) -> Result<EtcdCluster, DecodeError> {
    let Some(fields) = raw.as_object() else {
        let source = <serde_json::Error as serde::de::Error>::invalid_type(
            unexpected(raw),
            &"an EtcdCluster object",
        );
        return Err(DecodeError {
            field: String::new(),
            source,
        });
    };
    let metadata: ObjectMeta = part(fields.get("metadata"), "metadata")?;
    let spec: EtcdClusterSpec = part(fields.get("spec"), "spec")?;
    let mut cluster = EtcdCluster::new("", spec);
    cluster.metadata = metadata;
    cluster.status = running_version(fields.get("status")).map(|v| EtcdClusterStatus {
        current_version: Some(v),
        ..EtcdClusterStatus::default()
    });
    Ok(cluster)
}

/// The version the members run, from a raw status of any shape: `status.currentVersion` when it
/// is a non-empty string, else unknown.
pub(crate) fn running_version(status: Option<&Value>) -> Option<String> {
    status?
        .get("currentVersion")?
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// Decodes one top-level field; on failure, again with the path tracker for the message.
fn part<T: DeserializeOwned + Default>(value: Option<&Value>, key: &str) -> Result<T, DecodeError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(T::default());
    };
    // serde reads a struct from an array too (`spec: []` would read as an empty spec, and the
    // defaulting patch could then not apply to the raw array): both parts must be objects.
    if !value.is_object() {
        return Err(DecodeError {
            field: key.to_string(),
            source: <serde_json::Error as serde::de::Error>::invalid_type(
                unexpected(value),
                &"an object",
            ),
        });
    }
    // The plain decoder first (the path tracker costs).
    if let Ok(v) = T::deserialize(value) {
        return Ok(v);
    }
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let field = match path.as_str() {
            "." => key.to_string(),
            p if p.starts_with('[') => format!("{key}{p}"),
            p => format!("{key}.{p}"),
        };
        DecodeError {
            field,
            source: e.into_inner(),
        }
    })
}

fn unexpected(value: &Value) -> serde::de::Unexpected<'_> {
    use serde::de::Unexpected;
    match value {
        Value::Null => Unexpected::Unit,
        Value::Bool(b) => Unexpected::Bool(*b),
        Value::Number(_) => Unexpected::Other("a number"),
        Value::String(s) => Unexpected::Str(s),
        Value::Array(_) => Unexpected::Seq,
        Value::Object(_) => Unexpected::Map,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(spec: Value, status: Value) -> Value {
        json!({
            "kind": "EtcdCluster",
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "metadata": {"name": "x", "namespace": "default", "creationTimestamp": null},
            "spec": spec,
            "status": status,
        })
    }

    #[test]
    fn status_of_any_shape_is_not_decoded() {
        let statuses = [
            // CoreOS' Go client on every create.
            json!({"phase": "", "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
            json!({"phase": "Failed", "reason": "boom", "conditions": [{"type": "Available", "status": "False", "lastUpdateTime": "2018-03-01T10:00:00Z"}], "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
            json!({"phase": 7, "size": "three", "members": [], "conditions": {"x": 1}}),
            json!("not an object"),
            Value::Null,
        ];
        for status in statuses {
            let c = decode(&object(json!({"size": 3}), status.clone()))
                .unwrap_or_else(|e| panic!("{status}: {e}"));
            assert_eq!(c.spec.size, Some(3));
            assert_eq!(c.status, None, "{status}");
        }
        let c = decode(&object(
            json!({}),
            json!({"phase": "Running", "currentVersion": "3.5.35"}),
        ))
        .expect("decodes");
        assert_eq!(
            c.status.and_then(|s| s.current_version).as_deref(),
            Some("3.5.35")
        );
    }

    #[test]
    fn the_running_version_is_read_leniently() {
        for (status, want) in [
            (json!({"currentVersion": "3.5.35"}), Some("3.5.35")),
            (json!({"currentVersion": ""}), None),
            (json!({"currentVersion": 3.5}), None),
            (json!({"currentVersion": null}), None),
            (json!({}), None),
            (json!(["3.5.35"]), None),
        ] {
            assert_eq!(running_version(Some(&status)).as_deref(), want, "{status}");
        }
        assert_eq!(running_version(None), None);
    }

    #[test]
    fn errors_name_the_field() {
        let e = decode(&object(
            json!({"pod": {"etcdEnv": [{"name": 1}]}}),
            Value::Null,
        ))
        .expect_err("a number is no name");
        assert_eq!(e.field(), "spec.pod.etcdEnv[0].name");
        assert!(
            e.to_string()
                .starts_with("spec.pod.etcdEnv[0].name: invalid type"),
            "{e}"
        );

        let mut bad_meta = object(json!({}), Value::Null);
        bad_meta["metadata"]["labels"] = json!("team=db");
        assert_eq!(
            decode(&bad_meta).expect_err("bad labels").field(),
            "metadata.labels"
        );

        let e = decode(&object(json!(3), Value::Null)).expect_err("spec is a number");
        assert_eq!(e.field(), "spec");

        let e = decode(&json!([1])).expect_err("not an object");
        assert_eq!(e.field(), "");
        assert_eq!(
            e.to_string(),
            "invalid type: sequence, expected an EtcdCluster object"
        );
    }

    #[test]
    fn a_coreos_pod_section_decodes() {
        let c = decode(&object(
            json!({"size": 3, "pod": {"antiAffinity": true, "resources": {}, "busyboxImage": "busybox:1.28.0-glibc", "DNSTimeoutInSecond": 10, "ClusterDomain": ""}}),
            Value::Null,
        ))
        .expect("decodes");
        let pod = c.spec.pod.expect("pod");
        assert_eq!(pod.dns_timeout_in_second, Some(10));
        assert_eq!(pod.cluster_domain.as_deref(), Some(""));
        assert_eq!(pod.resources, Some(Default::default()));
        assert_eq!(c.metadata.name.as_deref(), Some("x"));
    }
}
