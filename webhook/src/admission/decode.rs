//! The AdmissionReview's raw objects as the typed [`EtcdCluster`]s the rules judge.
//!
//! Only `metadata` and `spec` are decoded. `status` is never judged: the API server drops it
//! from writes to the main resource anyway, and CoreOS' Go clients send one on every create and
//! update (`phase: ""`, `Failed`, conditions in CoreOS' shape). The one thing the rules read from
//! it, the version the members run (`status.currentVersion`, for the upgrade-in-progress rule),
//! is read leniently: anything but a non-empty string reads as unknown.

use std::collections::BTreeMap;

use etcd_shared::admission::clipped;
use etcd_shared::types::{EtcdBackup, EtcdBackupSpec, EtcdRestore, EtcdRestoreSpec};
use etcd_shared::{EtcdCluster, EtcdClusterSpec, EtcdClusterStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_json::value::RawValue;

use super::raw::{MAX_VALUES, ObjectParts, TooManyValues, check_values, is_object, kind_of};

/// Why `metadata` or `spec` does not read as an EtcdCluster's.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", at(.field))]
pub(crate) struct DecodeError {
    field: String,
    #[source]
    source: Cause,
}

/// The longest field path a decode error names, bytes (a path holds the user's map keys).
const MAX_FIELD: usize = 256;
/// The longest reason a decode error gives, bytes (serde quotes the offending value whole).
/// With [`MAX_FIELD`], a refusal or warning from a decode error stays around 1 KiB whatever the
/// object holds, as the rules' own messages do (issue 14, item 6).
const MAX_REASON: usize = 700;

/// What is wrong with the field.
#[derive(Debug, thiserror::Error)]
enum Cause {
    #[error("{}", clipped(DecodeError::without_position(.0), MAX_REASON))]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    TooLarge(#[from] TooManyValues),
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

    /// The message of a JSON error without serde_json's position in the part's text (which
    /// names no line of anything the user wrote).
    fn without_position(e: &serde_json::Error) -> String {
        let text = e.to_string();
        match (e.line(), text.rfind(" at line ")) {
            (1.., Some(i)) => text[..i].to_string(),
            _ => text,
        }
    }

    fn json(field: impl Into<String>, source: serde_json::Error) -> Self {
        DecodeError {
            field: clipped(field.into(), MAX_FIELD),
            source: Cause::Json(source),
        }
    }

    fn not_an_object(field: &str, raw: &RawValue, expected: &'static str) -> Self {
        let source = <serde_json::Error as serde::de::Error>::invalid_type(kind_of(raw), &expected);
        DecodeError::json(field, source)
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
/// empty spec is what defaulting fills). `metadata.managedFields` is skipped unread, and each
/// part may hold at most [`MAX_VALUES`] JSON values. The status holds only the members' version.
pub(crate) fn decode(raw: &RawValue) -> Result<EtcdCluster, DecodeError> {
    decode_cluster(raw).map(|(cluster, _)| cluster)
}

/// [`decode`], and which top-level fields the raw object has (the defaulting patch adds a
/// missing one whole rather than into it).
pub(crate) fn decode_cluster(raw: &RawValue) -> Result<(EtcdCluster, Present), DecodeError> {
    let parts = decode_parts::<EtcdClusterSpec>(raw, "an EtcdCluster object")?;
    let mut cluster = EtcdCluster::new("", parts.spec);
    cluster.metadata = parts.metadata;
    let (version, tls) = (running_version(parts.status), tls_in_use(parts.status));
    cluster.status = (version.is_some() || tls.is_some()).then(|| EtcdClusterStatus {
        current_version: version,
        tls,
        ..EtcdClusterStatus::default()
    });
    Ok((cluster, parts.present))
}

/// Reads an EtcdBackup's `metadata` and `spec` as [`decode`] does a cluster's (its status is
/// never judged).
pub(crate) fn decode_backup(raw: &RawValue) -> Result<EtcdBackup, DecodeError> {
    let parts = decode_parts::<EtcdBackupSpec>(raw, "an EtcdBackup object")?;
    let mut backup = EtcdBackup::new("", parts.spec);
    backup.metadata = parts.metadata;
    Ok(backup)
}

/// Reads an EtcdRestore's `metadata` and `spec` as [`decode`] does a cluster's (its status is
/// never judged).
pub(crate) fn decode_restore(raw: &RawValue) -> Result<EtcdRestore, DecodeError> {
    let parts = decode_parts::<EtcdRestoreSpec>(raw, "an EtcdRestore object")?;
    let mut restore = EtcdRestore::new("", parts.spec);
    restore.metadata = parts.metadata;
    Ok(restore)
}

/// Reads the `spec.replicas` of an `autoscaling/v1` Scale (the scale subresource of an
/// EtcdCluster: its `spec.size`); absent, it is 0, as the API server reads it.
pub(crate) fn decode_scale(raw: &RawValue) -> Result<i32, DecodeError> {
    let parts = decode_parts::<k8s_openapi::api::autoscaling::v1::ScaleSpec>(
        raw,
        "an autoscaling/v1 Scale object",
    )?;
    Ok(parts.spec.replicas.unwrap_or(0))
}

/// Which top-level fields a raw object has (a null one counts as absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Present {
    /// `metadata`.
    pub metadata: bool,
    /// `spec`.
    pub spec: bool,
    /// `status`.
    pub status: bool,
}

/// An object's typed `metadata` and `spec`, its raw status, and which of the three it has.
struct Parts<'a, S> {
    metadata: ObjectMeta,
    spec: S,
    status: Option<&'a RawValue>,
    present: Present,
}

/// The typed `metadata` and `spec` of a raw object of any kind, and its raw status.
fn decode_parts<'a, S: DeserializeOwned + Default>(
    raw: &'a RawValue,
    expected: &'static str,
) -> Result<Parts<'a, S>, DecodeError> {
    if !is_object(raw) {
        return Err(DecodeError::not_an_object("", raw, expected));
    }
    let parts: ObjectParts<'_> =
        serde_json::from_str(raw.get()).map_err(|e| DecodeError::json("", e))?;
    let present = Present {
        metadata: parts.metadata.is_some(),
        spec: parts.spec.is_some(),
        status: parts.status.is_some(),
    };
    let metadata: ObjectMeta = match parts.metadata {
        Some(meta) => decode_metadata(meta)?,
        None => ObjectMeta::default(),
    };
    let spec: S = match parts.spec {
        Some(spec) => {
            if is_object(spec) {
                check_values(spec, &[], "spec", MAX_VALUES).map_err(|e| DecodeError {
                    field: "spec".into(),
                    source: e.into(),
                })?;
            }
            part(spec, "spec")?
        }
        None => S::default(),
    };
    Ok(Parts {
        metadata,
        spec,
        status: parts.status,
        present,
    })
}

/// `metadata` without `managedFields` (which no rule reads and which can be the largest part
/// of an object): the other fields' text is decoded as `ObjectMeta`.
fn decode_metadata(raw: &RawValue) -> Result<ObjectMeta, DecodeError> {
    if !is_object(raw) {
        return Err(DecodeError::not_an_object("metadata", raw, "an object"));
    }
    const SKIPPED: &[&str] = &["managedFields"];
    check_values(raw, SKIPPED, "metadata", MAX_VALUES).map_err(|e| DecodeError {
        field: "metadata".into(),
        source: e.into(),
    })?;
    let mut fields: BTreeMap<String, &RawValue> =
        serde_json::from_str(raw.get()).map_err(|e| DecodeError::json("metadata", e))?;
    if fields.remove("managedFields").is_none() {
        return part(raw, "metadata");
    }
    let mut text = String::with_capacity(raw.get().len());
    text.push('{');
    for (i, (key, value)) in fields.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        let key = serde_json::to_string(key).map_err(|e| DecodeError::json("metadata", e))?;
        text.push_str(&key);
        text.push(':');
        text.push_str(value.get());
    }
    text.push('}');
    let rest = RawValue::from_string(text).map_err(|e| DecodeError::json("metadata", e))?;
    part(&rest, "metadata")
}

/// The certificate Secrets the members use, as the controller recorded them (`status.tls`):
/// what a change of `spec.TLS`'s source is switched from. `None` when absent or unreadable.
pub(crate) fn tls_in_use(status: Option<&RawValue>) -> Option<etcd_shared::types::TlsInUse> {
    #[derive(Deserialize)]
    struct Tls<'a> {
        #[serde(borrow, default)]
        tls: Option<&'a RawValue>,
    }
    let status = status.filter(|s| is_object(s))?;
    let tls: Tls<'_> = serde_json::from_str(status.get()).ok()?;
    serde_json::from_str(tls.tls?.get()).ok()
}

/// The version the members run, from a raw status of any shape: `status.currentVersion` when it
/// is a non-empty string, else unknown. Of the rest of the status only `tls` is read.
pub(crate) fn running_version(status: Option<&RawValue>) -> Option<String> {
    #[derive(Deserialize)]
    struct Version<'a> {
        #[serde(rename = "currentVersion", borrow, default)]
        current_version: Option<&'a RawValue>,
    }
    let status = status.filter(|s| is_object(s))?;
    let version: Version<'_> = serde_json::from_str(status.get()).ok()?;
    serde_json::from_str::<String>(version.current_version?.get())
        .ok()
        .filter(|v| !v.is_empty())
}

/// Decodes one top-level field; on failure, again with the path tracker for the message.
fn part<T: DeserializeOwned>(raw: &RawValue, key: &str) -> Result<T, DecodeError> {
    // serde reads a struct from an array too (`spec: []` would read as an empty spec, and the
    // defaulting patch could then not apply to the raw array): both parts must be objects.
    if !is_object(raw) {
        return Err(DecodeError::not_an_object(key, raw, "an object"));
    }
    // A part with long strings is judged on a copy with them cut first: serde quotes the
    // whole value of a field of the wrong type in its message, twice here (the plain decoder,
    // then the path tracker), and quoting a 700 KB string takes 100 ms or more (`{:?}` looks
    // up every character; the fuzz run's slowest inputs, tests/fuzz.rs). A string cut to
    // LONG_STRING bytes is still a string, and no field that fails on it reads a string of
    // that length, so the copy fails where and as the part does; only when it decodes is the
    // part itself decoded.
    if raw.get().len() > LONG_STRING
        && let Ok(mut tree) = serde_json::from_str::<Value>(raw.get())
        && shorten(&mut tree)
        && T::deserialize(&tree).is_err()
    {
        return Err(match serde_path_to_error::deserialize::<_, T>(&tree) {
            Err(e) => DecodeError::json(path_of(key, &e.path().to_string()), e.into_inner()),
            Ok(_) => DecodeError::json(
                key,
                <serde_json::Error as serde::de::Error>::custom("cannot be decoded"),
            ),
        });
    }
    // The plain decoder first (the path tracker costs).
    if let Ok(v) = serde_json::from_str(raw.get()) {
        return Ok(v);
    }
    let mut de = serde_json::Deserializer::from_str(raw.get());
    serde_path_to_error::deserialize::<_, T>(&mut de)
        .map_err(|e| DecodeError::json(path_of(key, &e.path().to_string()), e.into_inner()))
}

/// Strings longer than this, bytes, are cut in the copy a failing part is judged on.
pub(crate) const LONG_STRING: usize = 4096;

/// Cuts every string of `tree` longer than [`LONG_STRING`] bytes (at a character boundary);
/// whether any was.
pub(crate) fn shorten(tree: &mut Value) -> bool {
    match tree {
        Value::String(s) if s.len() > LONG_STRING => {
            let mut end = LONG_STRING;
            while !s.is_char_boundary(end) {
                end -= 1;
            }
            s.truncate(end);
            true
        }
        Value::Array(a) => a.iter_mut().fold(false, |cut, v| shorten(v) | cut),
        Value::Object(m) => m.values_mut().fold(false, |cut, v| shorten(v) | cut),
        _ => false,
    }
}

/// The field path of a decode error in `key`, from serde_path_to_error's path.
fn path_of(key: &str, path: &str) -> String {
    match path {
        "." => key.to_string(),
        p if p.starts_with('[') => format!("{key}{p}"),
        p => format!("{key}.{p}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn to_raw(v: &Value) -> Box<RawValue> {
        serde_json::value::to_raw_value(v).expect("serializable")
    }

    // The tests speak in `Value`s; the module reads raw text.
    fn decode(v: &Value) -> Result<EtcdCluster, DecodeError> {
        super::decode(&to_raw(v))
    }

    fn running_version(v: Option<&Value>) -> Option<String> {
        super::running_version(v.map(to_raw).as_deref())
    }

    #[test]
    fn a_huge_value_of_the_wrong_type_is_quoted_short() {
        let e = decode(&object(json!({"size": "x".repeat(3 << 20)}), Value::Null))
            .expect_err("a string is no size");
        assert_eq!(e.field(), "spec.size");
        assert!(e.to_string().len() < 1024, "{}", e.to_string().len());
        assert!(
            e.reason().starts_with("invalid type: string \"xxx"),
            "{}",
            &e.reason()[..40]
        );
    }

    #[test]
    fn managed_fields_are_skipped_and_parts_are_bounded() {
        let mut o = object(json!({"size": 3}), Value::Null);
        o["metadata"]["labels"] = json!({"team": "db"});
        o["metadata"]["managedFields"] =
            json!([{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]);
        let c = decode(&o).expect("decodes");
        assert_eq!(c.metadata.managed_fields, None);
        assert_eq!(c.metadata.labels.expect("labels")["team"], "db");
        assert_eq!(c.metadata.name.as_deref(), Some("x"));

        // managedFields are not counted; the rest of metadata is.
        let many: Vec<Value> = (0..MAX_VALUES)
            .map(|i| json!({"manager": format!("m{i}")}))
            .collect();
        o["metadata"]["managedFields"] = json!(many);
        assert!(decode(&o).is_ok());
        let labels: serde_json::Map<String, Value> = (0..MAX_VALUES)
            .map(|i| (format!("l{i}"), json!("v")))
            .collect();
        o["metadata"]["labels"] = Value::Object(labels);
        let e = decode(&o).expect_err("too many labels");
        assert_eq!(e.field(), "metadata");
        assert_eq!(e.reason(), "metadata holds more than 10000 JSON values");

        let env: Vec<Value> = (0..MAX_VALUES)
            .map(|i| json!({"name": format!("E{i}")}))
            .collect();
        let e = decode(&object(json!({"pod": {"etcdEnv": env}}), Value::Null))
            .expect_err("too many env entries");
        assert_eq!(e.field(), "spec");
        assert_eq!(e.reason(), "spec holds more than 10000 JSON values");
    }

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
        let status = to_raw(&json!({"tls": {"source": "static", "peerSecret": "p"}}));
        let tls = super::tls_in_use(Some(&status)).expect("status.tls");
        assert_eq!(tls.peer_secret.as_deref(), Some("p"));
        let status = to_raw(&json!({"tls": "nonsense"}));
        assert_eq!(super::tls_in_use(Some(&status)), None);
    }

    /// A long string in a field of another type is refused as quickly as a short one, with
    /// the same field and a clipped quote (the fuzz run found 233,000 U+202E characters in
    /// `spec.pod.persistentVolumeClaimSpec.resources` taking 200-300 ms in a release build:
    /// serde formatted the whole string twice).
    #[test]
    fn a_long_string_of_the_wrong_type_is_refused_fast() {
        let long = "\u{202e}".repeat(233_000);
        for (spec, field) in [
            (json!({"size": long}), "spec.size"),
            (
                json!({"pod": {"persistentVolumeClaimSpec": {"resources": long}}}),
                "spec.pod.persistentVolumeClaimSpec.resources",
            ),
        ] {
            let started = std::time::Instant::now();
            let e = decode(&object(spec, Value::Null)).expect_err("a string is no number");
            let took = started.elapsed();
            assert_eq!(e.field(), field);
            let reason = e.reason();
            assert!(reason.starts_with("invalid type: string \""), "{reason}");
            assert!(reason.len() < 1024, "{} bytes", reason.len());
            // Formatting the whole string took 100 ms and more in a release build, seconds in
            // a debug one; the cut copy takes a few milliseconds (up to 0.5 s in a debug build
            // beside other builds on 2 CPUs, hence 1 s).
            assert!(took < std::time::Duration::from_secs(1), "{took:?}");
        }
        // A long string where a string belongs still decodes whole.
        let c = decode(&object(json!({"repository": long}), Value::Null)).expect("decodes");
        assert_eq!(c.spec.repository.as_deref(), Some(long.as_str()));
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
