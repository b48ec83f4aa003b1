//! AdmissionReview in, AdmissionReview out: the two webhook endpoints as functions of the
//! request body, without HTTP or I/O.
//!
//! The request's `object` and `oldObject` are kept as the raw JSON the API server sent. Typed
//! [`EtcdCluster`] copies of their metadata and spec are made from them for the rules (never of
//! their status: see the `decode` module), but the defaulting patch is a diff against the raw object, so
//! fields this crate does not know and fields that are absent never turn into spurious patch
//! operations.

mod decode;

use base64::Engine as _;
use etcd_shared::EtcdCluster;
use etcd_shared::admission::{AdmissionPolicy, Refusal};
use kube::Resource;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, AdmissionReview, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use kube::core::{DynamicObject, Status};
use serde::Deserialize;
use serde_json::{Map, Value};

use decode::decode;

/// The two admission endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /validate`: the rules; refusals and warnings.
    Validate,
    /// `POST /mutate`: defaulting; a JSONPatch of what is missing.
    Mutate,
}

impl Endpoint {
    /// The metric label and log name: `validate` or `mutate`.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Validate => "validate",
            Endpoint::Mutate => "mutate",
        }
    }
}

/// Why a request body cannot be answered with an AdmissionReview: the HTTP layer turns these
/// into HTTP errors.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The body is not JSON.
    #[error("request body is not JSON: {0}")]
    NotJson(serde_json::Error),
    /// The body is JSON but not an AdmissionReview.
    #[error("request body is not an AdmissionReview: {0}")]
    NotAdmissionReview(String),
    /// An AdmissionReview of another version than admission.k8s.io/v1.
    #[error(
        "only {META_API_VERSION_V1} {META_KIND} is supported (set admissionReviewVersions: [v1]), got {api_version:?} {kind:?}"
    )]
    UnsupportedVersion {
        /// The `apiVersion` sent.
        api_version: String,
        /// The `kind` sent.
        kind: String,
    },
    /// The AdmissionReview has no `request`.
    #[error("the AdmissionReview has no request")]
    MissingRequest,
    /// A CREATE or UPDATE without `request.object`.
    #[error("the AdmissionReview's {operation} request has no object")]
    MissingObject {
        /// The operation.
        operation: &'static str,
    },
    /// The answer could not be built (a bug, not bad input).
    #[error("internal error: {0}")]
    Internal(String),
}

impl ReviewError {
    /// The HTTP status this error is answered with: 400 for bad input, 500 for a bug.
    pub fn http_status(&self) -> u16 {
        match self {
            ReviewError::Internal(_) => 500,
            _ => 400,
        }
    }
}

/// What became of one review, for metrics and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// The request's `uid`.
    pub uid: String,
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: &'static str,
    /// The object's namespace, if any.
    pub namespace: Option<String>,
    /// The object's name (empty with generateName).
    pub name: String,
    /// Whether the request is a dry run (nothing here differs: the webhook has no side effects).
    pub dry_run: bool,
    /// The answer's `allowed`.
    pub allowed: bool,
    /// The rule of each violation, when refused by the rules.
    pub rules: Vec<&'static str>,
    /// The refusal message, when refused.
    pub message: Option<String>,
    /// The warnings sent back.
    pub warnings: Vec<String>,
    /// Operations in the JSONPatch sent back (mutate only).
    pub patch_operations: usize,
}

/// A serialized AdmissionReview answer and what it says.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The `admission.k8s.io/v1` AdmissionReview with the response, as JSON.
    pub body: Vec<u8>,
    /// What it says.
    pub verdict: Verdict,
}

/// Answers AdmissionReviews with an [`AdmissionPolicy`].
#[derive(Debug, Clone, Default)]
pub struct Reviewer {
    policy: AdmissionPolicy,
}

/// A request's parts: the typed envelope and the raw objects.
struct Parsed {
    request: AdmissionRequest<DynamicObject>,
    object: Value,
    old_object: Value,
}

impl Reviewer {
    /// A reviewer applying `policy`.
    pub fn new(policy: AdmissionPolicy) -> Self {
        Reviewer { policy }
    }

    /// The policy applied.
    pub fn policy(&self) -> &AdmissionPolicy {
        &self.policy
    }

    /// Answers the AdmissionReview in `body` for `endpoint`. Refusals are answers
    /// (`allowed: false`); only a body that is not a usable AdmissionReview is an error.
    pub fn review(&self, endpoint: Endpoint, body: &[u8]) -> Result<Answer, ReviewError> {
        let Parsed {
            request,
            object,
            old_object,
        } = parse(body)?;
        let mut verdict = Verdict {
            uid: request.uid.clone(),
            operation: operation_name(&request.operation),
            namespace: request.namespace.clone(),
            name: request.name.clone(),
            dry_run: request.dry_run,
            ..Verdict::default()
        };
        let response = AdmissionResponse::from(&request);
        let response = match self.decide(endpoint, &request, &object, &old_object, &mut verdict) {
            Ok(Decision::Allow { warnings, patch }) => {
                verdict.allowed = true;
                let mut response = response;
                if !warnings.is_empty() {
                    verdict.warnings = warnings.clone();
                    response.warnings = Some(warnings);
                }
                if let Some(patch) = patch.filter(|p| !p.0.is_empty()) {
                    verdict.patch_operations = patch.0.len();
                    response = response
                        .with_patch(patch)
                        .map_err(|e| ReviewError::Internal(e.to_string()))?;
                }
                response
            }
            Ok(Decision::Deny(status)) => {
                verdict.allowed = false;
                verdict.message = Some(status.message.clone());
                let mut response = response;
                response.allowed = false;
                response.result = *status;
                response
            }
            Err(e) => return Err(e),
        };
        Ok(Answer {
            body: encode(response)?,
            verdict,
        })
    }

    fn decide(
        &self,
        endpoint: Endpoint,
        request: &AdmissionRequest<DynamicObject>,
        object: &Value,
        old_object: &Value,
        verdict: &mut Verdict,
    ) -> Result<Decision, ReviewError> {
        match request.operation {
            Operation::Create | Operation::Update => {}
            // Nothing to check or default: deleting and connecting are always allowed.
            Operation::Delete | Operation::Connect => return Ok(Decision::allow()),
        }
        if !is_etcd_cluster(request) {
            let got = &request.kind;
            let got = if got.group.is_empty() {
                format!("{} {}", got.version, got.kind)
            } else {
                format!("{}/{} {}", got.group, got.version, got.kind)
            };
            let message = format!(
                "this webhook only handles {}/{} {}, got {got}",
                EtcdCluster::group(&()),
                EtcdCluster::version(&()),
                EtcdCluster::kind(&())
            );
            return Ok(Decision::Deny(Box::new(failure(
                message,
                "BadRequest",
                400,
                None,
            ))));
        }
        if object.is_null() {
            return Err(ReviewError::MissingObject {
                operation: verdict.operation,
            });
        }
        let new = match decode(object) {
            Ok(new) => new,
            Err(e) => {
                let message = format!("the object is not a valid EtcdCluster: {e}");
                let cause = StatusCause {
                    reason: "FieldValueInvalid".into(),
                    message: e.reason(),
                    field: e.field().to_string(),
                };
                let details = details(request, vec![cause]);
                return Ok(Decision::Deny(Box::new(failure(
                    message,
                    "Invalid",
                    422,
                    Some(details),
                ))));
            }
        };
        match endpoint {
            Endpoint::Validate => {
                let mut warnings = Vec::new();
                let old = if request.operation == Operation::Update && !old_object.is_null() {
                    match decode(old_object) {
                        Ok(old) => Some(old),
                        Err(e) => {
                            // Refusing would block every update of the object, the removal
                            // of its finalizer included; judge it as a new object instead.
                            warnings.push(format!(
                                "the stored object could not be read ({e}); the update rules were not checked"
                            ));
                            None
                        }
                    }
                } else {
                    None
                };
                match self.policy.validate(&new, old.as_ref()) {
                    Ok(mut rule_warnings) => {
                        warnings.append(&mut rule_warnings);
                        Ok(Decision::Allow {
                            warnings,
                            patch: None,
                        })
                    }
                    Err(refusal) => {
                        verdict.rules = refusal.0.iter().map(|v| v.rule).collect();
                        Ok(Decision::Deny(Box::new(refused(request, &refusal))))
                    }
                }
            }
            Endpoint::Mutate => {
                // On UPDATE, a dropped field keeps the stored value (decode errors of the
                // stored object fall back to the operator's defaults).
                let old = (request.operation == Operation::Update && !old_object.is_null())
                    .then(|| decode(old_object).ok())
                    .flatten();
                let patch = self.defaulting_patch(object, &new, old.as_ref())?;
                Ok(Decision::Allow {
                    warnings: Vec::new(),
                    patch: Some(patch),
                })
            }
        }
    }

    /// The JSONPatch that turns the raw `object` into its defaulted form. What defaulting
    /// changes is found on typed copies, applied to the raw object, and the patch is the diff
    /// of the raw object and that result: only the defaulted fields appear in it. Only the
    /// top-level fields that defaulting changed (in practice `spec`) are serialized, copied
    /// and compared, so large `metadata.managedFields` cost nothing.
    pub fn defaulting_patch(
        &self,
        object: &Value,
        typed: &EtcdCluster,
        old: Option<&EtcdCluster>,
    ) -> Result<json_patch::Patch, ReviewError> {
        let internal = |e: &dyn std::fmt::Display| ReviewError::Internal(e.to_string());
        let defaulted = self.policy.defaulted_update(typed, old);
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
            compare("spec", to_json(&typed.spec)?, to_json(&defaulted.spec)?);
        }
        if typed.status != defaulted.status {
            compare(
                "status",
                to_json(&typed.status)?,
                to_json(&defaulted.status)?,
            );
        }
        let changes = json_patch::diff(&Value::Object(before.clone()), &Value::Object(after));
        if changes.0.is_empty() {
            return Ok(changes);
        }
        let Some(fields) = object.as_object() else {
            return Err(internal(&"the object is not a JSON object"));
        };
        // The same top-level fields, raw; a missing (or null) one starts as an empty object.
        let original: Map<String, Value> = before
            .keys()
            .filter_map(|k| fields.get(k).map(|v| (k.clone(), v.clone())))
            .collect();
        let mut target = original.clone();
        for key in before.keys() {
            if target.get(key).is_none_or(Value::is_null) {
                target.insert(key.clone(), Value::Object(Map::new()));
            }
        }
        let mut target = Value::Object(target);
        json_patch::patch(&mut target, &changes).map_err(|e| internal(&e))?;
        Ok(json_patch::diff(&Value::Object(original), &target))
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Value, ReviewError> {
    serde_json::to_value(value).map_err(|e| ReviewError::Internal(e.to_string()))
}

/// What the rules decided.
enum Decision {
    Allow {
        warnings: Vec<String>,
        patch: Option<json_patch::Patch>,
    },
    Deny(Box<Status>),
}

impl Decision {
    fn allow() -> Self {
        Decision::Allow {
            warnings: Vec::new(),
            patch: None,
        }
    }
}

fn parse(body: &[u8]) -> Result<Parsed, ReviewError> {
    let mut value: Value = serde_json::from_slice(body).map_err(ReviewError::NotJson)?;
    // Take the objects out raw, before the envelope is deserialized.
    let (object, old_object) = match value.get_mut("request").and_then(Value::as_object_mut) {
        Some(request) => (
            request
                .get_mut("object")
                .map(Value::take)
                .unwrap_or_default(),
            request
                .get_mut("oldObject")
                .map(Value::take)
                .unwrap_or_default(),
        ),
        None => (Value::Null, Value::Null),
    };
    // The plain decoder first; on failure, again with the path tracker for the message.
    let review: AdmissionReview<DynamicObject> = match AdmissionReview::deserialize(&value) {
        Ok(review) => review,
        Err(plain) => {
            let message =
                match serde_path_to_error::deserialize::<_, AdmissionReview<DynamicObject>>(&value)
                {
                    Err(e) => e.to_string(),
                    Ok(_) => plain.to_string(),
                };
            return Err(ReviewError::NotAdmissionReview(message));
        }
    };
    if review.types.api_version != META_API_VERSION_V1 || review.types.kind != META_KIND {
        return Err(ReviewError::UnsupportedVersion {
            api_version: review.types.api_version,
            kind: review.types.kind,
        });
    }
    let request = review.try_into().map_err(|_| ReviewError::MissingRequest)?;
    Ok(Parsed {
        request,
        object,
        old_object,
    })
}

fn is_etcd_cluster(request: &AdmissionRequest<DynamicObject>) -> bool {
    request.kind.group == EtcdCluster::group(&())
        && request.kind.version == EtcdCluster::version(&())
        && request.kind.kind == EtcdCluster::kind(&())
}

fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

fn failure(message: String, reason: &str, code: u16, details: Option<StatusDetails>) -> Status {
    Status {
        status: Some(StatusSummary::Failure),
        code,
        message,
        metadata: None,
        reason: reason.to_string(),
        details,
    }
}

fn details(request: &AdmissionRequest<DynamicObject>, causes: Vec<StatusCause>) -> StatusDetails {
    StatusDetails {
        name: request.name.clone(),
        group: EtcdCluster::group(&()).into_owned(),
        kind: EtcdCluster::kind(&()).into_owned(),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    }
}

/// A refusal by the rules: 422 Invalid, the violations joined in the message (the API server
/// shows `admission webhook "NAME" denied the request: MESSAGE`) and one cause per violation.
fn refused(request: &AdmissionRequest<DynamicObject>, refusal: &Refusal) -> Status {
    let causes = refusal
        .0
        .iter()
        .map(|v| StatusCause {
            reason: "FieldValueInvalid".into(),
            message: v.message.clone(),
            field: v.field.clone(),
        })
        .collect();
    failure(
        refusal.to_string(),
        "Invalid",
        422,
        Some(details(request, causes)),
    )
}

/// Serializes the answer. `patch` is written base64-encoded, as the API server's `[]byte`
/// field expects in JSON (kube-core writes it as an array of numbers, kube-rs issue 1781).
fn encode(mut response: AdmissionResponse) -> Result<Vec<u8>, ReviewError> {
    let internal = |e: serde_json::Error| ReviewError::Internal(e.to_string());
    let patch = response.patch.take();
    let mut review = serde_json::to_value(response.into_review()).map_err(internal)?;
    if let Some(patch) = patch
        && let Some(fields) = review.get_mut("response").and_then(Value::as_object_mut)
    {
        let encoded = base64::engine::general_purpose::STANDARD.encode(patch);
        fields.insert("patch".into(), Value::String(encoded));
    }
    serde_json::to_vec(&review).map_err(internal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn review_body(operation: &str, object: Value, old: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": "EtcdCluster"},
                "resource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": "etcdclusters"},
                "name": "demo",
                "namespace": "default",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "oldObject": old,
                "dryRun": false
            }
        }))
        .unwrap()
    }

    /// A malformed object is refused with a message on both endpoints, never answered 500
    /// (issue 14, item 4: `spec: []` on /mutate was a 500).
    #[test]
    fn malformed_specs_are_refused_not_internal_errors() {
        let r = Reviewer::default();
        for spec in [json!([]), json!("x"), json!(3), json!({"size": "three"})] {
            for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                let body = review_body("CREATE", cluster(spec.clone()), Value::Null);
                let answer = r.review(endpoint, &body).unwrap_or_else(|e| {
                    panic!("{spec} on {endpoint:?}: HTTP {}: {e}", e.http_status())
                });
                let response = response(&answer);
                assert_eq!(
                    response["allowed"],
                    json!(false),
                    "{spec} on {endpoint:?}: {response}"
                );
                let message = response["status"]["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains("spec"),
                    "{spec} on {endpoint:?}: {message}"
                );
            }
        }
    }

    fn cluster(spec: Value) -> Value {
        json!({
            "apiVersion": "etcd.database.coreos.com/v1beta2",
            "kind": "EtcdCluster",
            "metadata": {"name": "demo", "namespace": "default"},
            "spec": spec
        })
    }

    fn response(answer: &Answer) -> Value {
        let v: Value = serde_json::from_slice(&answer.body).unwrap();
        v["response"].clone()
    }

    #[test]
    fn decode_tolerates_a_missing_spec() {
        let mut c = cluster(json!(null));
        c.as_object_mut().unwrap().remove("spec");
        assert_eq!(decode(&c).unwrap().spec, Default::default());
        assert_eq!(
            decode(&cluster(json!(null))).unwrap().spec,
            Default::default()
        );
        let e = decode(&cluster(json!({"size": "three"}))).unwrap_err();
        assert_eq!(e.field(), "spec.size");
    }

    #[test]
    fn mutate_patches_only_what_is_missing() {
        let r = Reviewer::default();
        let a = r
            .review(
                Endpoint::Mutate,
                &review_body(
                    "CREATE",
                    cluster(json!({"size": 5, "x-unknown": 1})),
                    Value::Null,
                ),
            )
            .unwrap();
        let resp = response(&a);
        assert_eq!(resp["allowed"], true);
        assert_eq!(resp["uid"], "u-1");
        assert_eq!(resp["patchType"], "JSONPatch");
        let patch = base64::engine::general_purpose::STANDARD
            .decode(resp["patch"].as_str().unwrap())
            .unwrap();
        let patch: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(
            patch,
            json!([
                {"op": "add", "path": "/spec/repository", "value": "quay.io/coreos/etcd"},
                {"op": "add", "path": "/spec/version", "value": "3.6.16"}
            ])
        );
        assert_eq!(a.verdict.patch_operations, 2);
    }

    #[test]
    fn validate_refuses_with_field_and_rule() {
        let r = Reviewer::default();
        let a = r
            .review(
                Endpoint::Validate,
                &review_body("CREATE", cluster(json!({"size": 0})), Value::Null),
            )
            .unwrap();
        let resp = response(&a);
        assert_eq!(resp["allowed"], false);
        assert_eq!(resp["status"]["code"], 422);
        assert_eq!(resp["status"]["reason"], "Invalid");
        assert_eq!(
            resp["status"]["message"],
            "spec.size: must be between 1 and 7, got 0"
        );
        assert_eq!(resp["status"]["details"]["causes"][0]["field"], "spec.size");
        assert_eq!(a.verdict.rules, vec!["size-range"]);
    }

    #[test]
    fn bad_envelopes_are_errors() {
        let r = Reviewer::default();
        assert!(matches!(
            r.review(Endpoint::Validate, b"{"),
            Err(ReviewError::NotJson(_))
        ));
        assert!(matches!(
            r.review(
                Endpoint::Validate,
                b"{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\"}"
            ),
            Err(ReviewError::MissingRequest)
        ));
        assert!(matches!(
            r.review(Endpoint::Validate, b"[]"),
            Err(ReviewError::NotAdmissionReview(_))
        ));
        let mut v1beta1: Value =
            serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null))
                .unwrap();
        v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(matches!(
            r.review(Endpoint::Validate, &serde_json::to_vec(&v1beta1).unwrap()),
            Err(ReviewError::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            r.review(
                Endpoint::Validate,
                &review_body("CREATE", Value::Null, Value::Null)
            ),
            Err(ReviewError::MissingObject { .. })
        ));
    }

    /// A CoreOS-client object: its Go structs always write `status`, and `resources: {}` and
    /// `ClusterDomain: ""` whenever `pod` is set.
    fn coreos(spec: Value, status: Value) -> Value {
        let mut c = cluster(spec);
        c["metadata"]["creationTimestamp"] = Value::Null;
        c["status"] = status;
        c
    }

    fn allowed(r: &Reviewer, endpoint: Endpoint, op: &str, object: Value, old: Value) -> Value {
        let a = r
            .review(endpoint, &review_body(op, object, old))
            .expect("answered");
        let resp = response(&a);
        assert_eq!(resp["allowed"], true, "{resp}");
        resp
    }

    #[test]
    fn coreos_statuses_are_never_judged() {
        let r = Reviewer::default();
        let spec = json!({"size": 3, "version": "3.6.16", "pod": {"resources": {}, "ClusterDomain": "", "persistentVolumeClaimSpec": {"resources": {"requests": {"storage": "1Gi"}}}}});
        for status in [
            json!({"phase": "", "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
            json!({"phase": "Failed", "reason": "boom", "conditions": [{"type": "Recovering", "status": "True", "lastUpdateTime": "2018-03-01T10:00:00Z", "reason": "Disaster recovery"}], "size": 0, "members": {}, "currentVersion": "", "targetVersion": ""}),
            json!({"phase": 1, "conditions": "garbage"}),
        ] {
            let object = coreos(spec.clone(), status.clone());
            let resp = allowed(
                &r,
                Endpoint::Validate,
                "CREATE",
                object.clone(),
                Value::Null,
            );
            assert!(resp.get("warnings").is_none(), "{status}: {resp}");
            let resp = allowed(&r, Endpoint::Mutate, "CREATE", object.clone(), Value::Null);
            let patch = base64::engine::general_purpose::STANDARD
                .decode(resp["patch"].as_str().expect("a patch"))
                .expect("base64");
            let patch: Value = serde_json::from_slice(&patch).expect("JSON");
            assert_eq!(
                patch,
                json!([{"op": "add", "path": "/spec/repository", "value": "quay.io/coreos/etcd"}]),
                "only the missing repository, nothing in status: {status}"
            );
            // An update as CoreOS' client makes it: the whole object, status included, on both
            // sides.
            let mut paused = object.clone();
            paused["spec"]["paused"] = json!(true);
            let resp = allowed(
                &r,
                Endpoint::Validate,
                "UPDATE",
                paused.clone(),
                object.clone(),
            );
            assert!(resp.get("warnings").is_none(), "{status}: {resp}");
            allowed(&r, Endpoint::Mutate, "UPDATE", paused, object);
        }
    }

    #[test]
    fn a_stored_status_of_any_shape_leaves_the_update_rules_on() {
        let r = Reviewer::default();
        let at = |v: &str, status: Value| coreos(json!({"size": 3, "version": v}), status);
        for status in [
            json!({"phase": "", "currentVersion": ""}),
            json!({"phase": 1, "currentVersion": ["3.5.35"], "conditions": "garbage"}),
            json!("garbage"),
        ] {
            let a = r
                .review(
                    Endpoint::Validate,
                    &review_body(
                        "UPDATE",
                        at("3.7.3", json!({})),
                        at("3.5.35", status.clone()),
                    ),
                )
                .expect("answered");
            let resp = response(&a);
            assert_eq!(resp["allowed"], false, "{status}: {resp}");
            assert_eq!(a.verdict.rules, vec!["version-skip"], "{status}");
        }
        // A readable currentVersion still guards an upgrade in progress.
        let mid = at(
            "3.6.16",
            json!({"phase": "Running", "reason": "", "currentVersion": "3.5.35", "targetVersion": ""}),
        );
        let a = r
            .review(
                Endpoint::Validate,
                &review_body("UPDATE", at("3.7.3", json!({})), mid),
            )
            .expect("answered");
        assert_eq!(a.verdict.rules, vec!["version-upgrade-in-progress"]);
    }
}
