//! AdmissionReview in, AdmissionReview out: the two webhook endpoints as functions of the
//! request body, without HTTP or I/O.
//!
//! The request's `object` and `oldObject` are kept as slices of the body the API server sent
//! (see the `raw` module: no JSON tree of the body is ever built). Typed [`EtcdCluster`] copies of
//! their metadata and spec are made from them for the rules (never of their status: see the
//! `decode` module). The defaulting patch is the diff of the typed object and its defaulted
//! copy, so fields this crate does not know and fields that are absent never turn into spurious
//! patch operations.

mod decode;
mod raw;

use base64::Engine as _;
use etcd_shared::EtcdCluster;
use etcd_shared::EtcdClusterSpec;
use etcd_shared::admission::{AdmissionPolicy, Refusal};
use etcd_shared::types::{EtcdBackup, EtcdRestore};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::admission::{
    AdmissionRequest, AdmissionResponse, META_API_VERSION_V1, META_KIND, Operation,
};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use kube::core::{Status, TypeMeta};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use decode::{decode, decode_backup, decode_restore, decode_scale};
use etcd_shared::admission::clipped;

/// The longest part of the request an error or refusal of the envelope quotes, bytes
/// (`apiVersion`, `kind`, a decoder's message with the offending value): an answer never
/// echoes a large value (issue 14, item 6).
const MAX_QUOTED: usize = 256;
/// The longest decoder message about the envelope, bytes.
const MAX_ERROR: usize = 700;
use raw::{Envelope, ObjectParts, Objects, check_values, is_object};
pub use raw::{MAX_VALUES, TooManyValues, count_values};

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
    /// The request envelope holds more JSON values than the webhook reads.
    #[error("the AdmissionReview's {0}")]
    TooLarge(TooManyValues),
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
            ReviewError::TooLarge(_) => 413,
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

/// A request's parts: the typed envelope and the raw objects (slices of the body).
struct Parsed<'a> {
    request: AdmissionRequest<Unread>,
    object: Option<&'a RawValue>,
    old_object: Option<&'a RawValue>,
}

/// The request's objects as the envelope's decoding sees them: skipped without allocating
/// (their text is read by `decode`).
#[derive(Clone, Debug, Default)]
struct Unread {
    metadata: ObjectMeta,
}

impl<'de> Deserialize<'de> for Unread {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Unread::default())
    }
}

impl kube::Resource for Unread {
    type DynamicType = ();
    type Scope = kube::core::NamespaceResourceScope;

    fn kind(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::kind(&())
    }

    fn group(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::group(&())
    }

    fn version(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::version(&())
    }

    fn plural(_: &()) -> std::borrow::Cow<'_, str> {
        EtcdCluster::plural(&())
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
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
        // The verdict is what the logs and metrics see: the request's identifiers are clipped
        // as every quoted value is (real ones are far shorter; a caller's 3 MiB name is not).
        let mut verdict = Verdict {
            uid: clipped(request.uid.clone(), MAX_QUOTED),
            operation: operation_name(&request.operation),
            namespace: request.namespace.clone().map(|n| clipped(n, MAX_QUOTED)),
            name: clipped(request.name.clone(), MAX_QUOTED),
            dry_run: request.dry_run,
            ..Verdict::default()
        };
        let response = AdmissionResponse::from(&request);
        let response = match self.decide(endpoint, &request, object, old_object, &mut verdict) {
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
        request: &AdmissionRequest<Unread>,
        object: Option<&RawValue>,
        old_object: Option<&RawValue>,
        verdict: &mut Verdict,
    ) -> Result<Decision, ReviewError> {
        match request.operation {
            Operation::Create | Operation::Update => {}
            // Nothing to check or default: deleting and connecting are always allowed.
            Operation::Delete | Operation::Connect => return Ok(Decision::allow()),
        }
        let Some(kind) = Reviewed::of(request) else {
            let got = &request.kind;
            let got = if got.group.is_empty() {
                format!("{} {}", got.version, got.kind)
            } else {
                format!("{}/{} {}", got.group, got.version, got.kind)
            };
            let got = clipped(got, MAX_QUOTED);
            let message = format!(
                "this webhook only handles {}/{} {}, {} and {} (and the Scale of {}), got {got}",
                EtcdCluster::group(&()),
                EtcdCluster::version(&()),
                EtcdCluster::kind(&()),
                EtcdBackup::kind(&()),
                EtcdRestore::kind(&()),
                EtcdCluster::plural(&()),
            );
            return Ok(Decision::Deny(Box::new(failure(
                message,
                "BadRequest",
                400,
                None,
            ))));
        };
        let Some(object) = object else {
            return Err(ReviewError::MissingObject {
                operation: verdict.operation,
            });
        };
        let old_object = old_object.filter(|_| request.operation == Operation::Update);
        match kind {
            Reviewed::Cluster => {
                self.decide_cluster(endpoint, request, object, old_object, verdict)
            }
            Reviewed::Backup => {
                let namespace = request.namespace.clone().unwrap_or_default();
                judge(
                    request,
                    object,
                    old_object,
                    verdict,
                    decode_backup,
                    |new, old| self.policy.validate_backup(new, &namespace, old),
                )
            }
            Reviewed::Restore => judge(
                request,
                object,
                old_object,
                verdict,
                decode_restore,
                |new, old| self.policy.validate_restore(new, old),
            ),
            // `kubectl scale etcdcluster/NAME`: the size rules, never a patch.
            Reviewed::Scale => judge(
                request,
                object,
                old_object,
                verdict,
                decode_scale,
                |new, old| self.policy.validate_scale(*new, old.copied()),
            ),
        }
    }

    /// The decision on an EtcdCluster: the rules on `/validate`, the defaulting patch on
    /// `/mutate`. `old_object` is the stored object of an UPDATE.
    fn decide_cluster(
        &self,
        endpoint: Endpoint,
        request: &AdmissionRequest<Unread>,
        object: &RawValue,
        old_object: Option<&RawValue>,
        verdict: &mut Verdict,
    ) -> Result<Decision, ReviewError> {
        match endpoint {
            Endpoint::Validate => {
                judge(request, object, old_object, verdict, decode, |new, old| {
                    self.policy.validate(new, old)
                })
            }
            Endpoint::Mutate => {
                let new = match decode(object) {
                    Ok(new) => new,
                    Err(e) => return Ok(Decision::Deny(Box::new(undecodable(request, &e)))),
                };
                // On UPDATE, a dropped field keeps the stored value (decode errors of the
                // stored object fall back to the operator's defaults).
                let old = old_object.and_then(|o| decode(o).ok());
                let patch = self.defaulting_patch(object, &new, old.as_ref())?;
                Ok(Decision::Allow {
                    warnings: Vec::new(),
                    patch: Some(patch),
                })
            }
        }
    }

    /// The JSONPatch that turns the raw `object` into its defaulted form: the diff of the typed
    /// object and its defaulted copy, so only the defaulted fields appear in it, plus an empty
    /// object first where the raw object lacks a top-level field the diff writes into. Only the
    /// top-level fields that defaulting changed are serialized and compared, and of the spec
    /// not its pod policy while defaulting leaves that alone (it is the part that can be large),
    /// so a patch costs little whatever the object's size.
    pub fn defaulting_patch(
        &self,
        object: &RawValue,
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
        let parts: ObjectParts<'_> =
            serde_json::from_str(object.get()).map_err(|e| internal(&e))?;
        let mut operations = Vec::new();
        for (key, value) in &after {
            let present = match key.as_str() {
                "metadata" => parts.metadata.is_some(),
                "spec" => parts.spec.is_some(),
                _ => parts.status.is_some(),
            };
            if !present {
                before.remove(key);
                let add =
                    serde_json::json!({"op": "add", "path": format!("/{key}"), "value": value});
                operations.push(serde_json::from_value(add).map_err(|e| internal(&e))?);
            }
        }
        let present_after: Map<String, Value> = after
            .into_iter()
            .filter(|(k, _)| before.contains_key(k))
            .collect();
        operations
            .extend(json_patch::diff(&Value::Object(before), &Value::Object(present_after)).0);
        Ok(json_patch::Patch(operations))
    }
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

fn parse(body: &[u8]) -> Result<Parsed<'_>, ReviewError> {
    // serde reads a struct from an array too: the review must be a JSON object.
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') {
        let e = serde_json::from_slice::<serde::de::IgnoredAny>(body).err();
        return Err(match e {
            Some(e) => ReviewError::NotJson(e),
            None => ReviewError::NotAdmissionReview("expected a JSON object".into()),
        });
    }
    let envelope: Envelope<'_> = match serde_json::from_slice(body) {
        Ok(envelope) => envelope,
        Err(e) if e.is_data() => {
            return Err(ReviewError::NotAdmissionReview(clipped(
                e.to_string(),
                MAX_ERROR,
            )));
        }
        Err(e) => return Err(ReviewError::NotJson(e)),
    };
    if envelope.api_version != META_API_VERSION_V1 || envelope.kind != META_KIND {
        return Err(ReviewError::UnsupportedVersion {
            api_version: clipped(envelope.api_version, MAX_QUOTED),
            kind: clipped(envelope.kind, MAX_QUOTED),
        });
    }
    let Some(raw_request) = envelope.request.filter(|r| r.get() != "null") else {
        return Err(ReviewError::MissingRequest);
    };
    if is_object(raw_request) {
        check_values(raw_request, &["object", "oldObject"], "request", MAX_VALUES)
            .map_err(ReviewError::TooLarge)?;
    }
    let mut request = decode_request(raw_request)?;
    request.types = TypeMeta {
        api_version: envelope.api_version,
        kind: envelope.kind,
    };
    let objects: Objects<'_> = serde_json::from_str(raw_request.get()).map_err(|e| {
        ReviewError::NotAdmissionReview(clipped(format!("request: {e}"), MAX_ERROR))
    })?;
    let not_null = |o: &&RawValue| o.get() != "null";
    Ok(Parsed {
        request,
        object: objects.object.filter(not_null),
        old_object: objects.old_object.filter(not_null),
    })
}

/// The request envelope (its objects left unread). A request with long strings is judged on a
/// copy of the envelope with them cut first, as `decode` does for the objects' parts: serde
/// quotes the whole value of a field of the wrong type in its message, and quoting a 700 KB
/// string takes 100 ms or more (the fuzz run's slowest inputs).
fn decode_request(raw: &RawValue) -> Result<AdmissionRequest<Unread>, ReviewError> {
    const OBJECTS: &[&str] = &["object", "oldObject"];
    let failed = |message: String| ReviewError::NotAdmissionReview(clipped(message, MAX_ERROR));
    // A request that is no object is refused by its type alone: serde would quote a string
    // whole (a 700 KB one of U+202E took 85-140 ms, the 1,000,000-input fuzz run).
    if !is_object(raw) {
        let e = <serde_json::Error as serde::de::Error>::invalid_type(
            raw::kind_of(raw),
            &"an AdmissionRequest object",
        );
        return Err(failed(format!("request: {e}")));
    }
    if raw::longest_string(raw, OBJECTS) > decode::LONG_STRING {
        let fields: std::collections::BTreeMap<String, &RawValue> =
            serde_json::from_str(raw.get()).map_err(|e| failed(format!("request: {e}")))?;
        let mut envelope = Map::new();
        for (key, value) in fields {
            if !OBJECTS.contains(&key.as_str()) {
                let value: Value = serde_json::from_str(value.get())
                    .map_err(|e| failed(format!("request.{key}: {e}")))?;
                envelope.insert(key, value);
            }
        }
        let mut envelope = Value::Object(envelope);
        decode::shorten(&mut envelope);
        if AdmissionRequest::<Unread>::deserialize(&envelope).is_err() {
            let message =
                match serde_path_to_error::deserialize::<_, AdmissionRequest<Unread>>(&envelope) {
                    Err(e) => format!("request.{e}"),
                    Ok(_) => "request: cannot be decoded".to_string(),
                };
            return Err(failed(message));
        }
    }
    // The plain decoder first; on failure, again with the path tracker for the message.
    match serde_json::from_str(raw.get()) {
        Ok(request) => Ok(request),
        Err(plain) => {
            let mut de = serde_json::Deserializer::from_str(raw.get());
            let message =
                match serde_path_to_error::deserialize::<_, AdmissionRequest<Unread>>(&mut de) {
                    Err(e) => format!("request.{e}"),
                    Ok(_) => plain.to_string(),
                };
            Err(failed(message))
        }
    }
}

/// The kinds this webhook reviews.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reviewed {
    Cluster,
    Backup,
    Restore,
    /// The `autoscaling/v1` Scale of an EtcdCluster (its scale subresource).
    Scale,
}

impl Reviewed {
    /// The kind of the request's object, when it is one of ours (group and version included).
    fn of(request: &AdmissionRequest<Unread>) -> Option<Self> {
        let kind = &request.kind;
        let resource = &request.resource;
        if kind.group == "autoscaling"
            && kind.version == "v1"
            && kind.kind == "Scale"
            && resource.group == EtcdCluster::group(&())
            && resource.resource == EtcdCluster::plural(&())
            && request.sub_resource.as_deref() == Some("scale")
        {
            return Some(Reviewed::Scale);
        }
        if kind.group != EtcdCluster::group(&()) || kind.version != EtcdCluster::version(&()) {
            return None;
        }
        match kind.kind.as_str() {
            k if k == EtcdCluster::kind(&()) => Some(Reviewed::Cluster),
            k if k == EtcdBackup::kind(&()) => Some(Reviewed::Backup),
            k if k == EtcdRestore::kind(&()) => Some(Reviewed::Restore),
            _ => None,
        }
    }
}

/// The decision on an object that is validated and never defaulted (EtcdBackup, EtcdRestore):
/// on either endpoint, an object that does not decode is refused with the field at fault; on
/// both, `validate` judges it (a `/mutate` call gets the same verdict and never a patch).
fn judge<T>(
    request: &AdmissionRequest<Unread>,
    object: &RawValue,
    old_object: Option<&RawValue>,
    verdict: &mut Verdict,
    decode: fn(&RawValue) -> Result<T, decode::DecodeError>,
    validate: impl FnOnce(&T, Option<&T>) -> Result<Vec<String>, Refusal>,
) -> Result<Decision, ReviewError> {
    let new = match decode(object) {
        Ok(new) => new,
        Err(e) => return Ok(Decision::Deny(Box::new(undecodable(request, &e)))),
    };
    let mut warnings = Vec::new();
    let old = match old_object.map(decode) {
        Some(Ok(old)) => Some(old),
        Some(Err(e)) => {
            warnings.push(format!(
                "the stored object could not be read ({e}); the update rules were not checked"
            ));
            None
        }
        None => None,
    };
    match validate(&new, old.as_ref()) {
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

/// The refusal of an object that does not decode as its kind: 422 Invalid, with the field.
fn undecodable(request: &AdmissionRequest<Unread>, e: &decode::DecodeError) -> Status {
    let message = format!(
        "the object is not a valid {}: {e}",
        clipped(request.kind.kind.clone(), MAX_QUOTED)
    );
    let cause = StatusCause {
        reason: "FieldValueInvalid".into(),
        message: e.reason(),
        field: e.field().to_string(),
    };
    failure(message, "Invalid", 422, Some(details(request, vec![cause])))
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

fn details(request: &AdmissionRequest<Unread>, causes: Vec<StatusCause>) -> StatusDetails {
    StatusDetails {
        // Informational only (the API server names the object itself): clipped, so a caller's
        // huge name is not echoed whole.
        name: clipped(request.name.clone(), MAX_QUOTED),
        group: clipped(request.kind.group.clone(), MAX_QUOTED),
        kind: clipped(request.kind.kind.clone(), MAX_QUOTED),
        uid: String::new(),
        causes,
        retry_after_seconds: 0,
    }
}

/// A refusal by the rules: 422 Invalid, the violations joined in the message (the API server
/// shows `admission webhook "NAME" denied the request: MESSAGE`) and one cause per violation.
fn refused(request: &AdmissionRequest<Unread>, refusal: &Refusal) -> Status {
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

    /// Values of any size in the request are quoted clipped in refusals, warnings and errors,
    /// never whole (found by the fuzz run, tests/fuzz.rs: a 100 KB `spec.size` string came
    /// back twice in the refusal, a huge `apiVersion` or unknown `operation` whole in the 400).
    #[test]
    fn large_values_are_never_echoed() {
        let r = Reviewer::default();
        let big = "a".repeat(100_000);
        let short = |text: &str, what: &str| {
            assert!(text.len() < 1024, "{what}: {} bytes", text.len());
            // Cut, with the length of what was cut (a string of the wrong type is quoted from
            // the copy with long strings cut, so that length can be the copy's).
            assert!(text.contains(" bytes)"), "{what}: {text}");
        };
        let texts = |answer: &Answer| -> Vec<String> {
            let resp = response(answer);
            let mut texts = vec![resp["status"]["message"].as_str().unwrap_or("").to_string()];
            for c in resp["status"]["details"]["causes"]
                .as_array()
                .into_iter()
                .flatten()
            {
                texts.push(c["message"].as_str().unwrap_or("").to_string());
                texts.push(c["field"].as_str().unwrap_or("").to_string());
            }
            for w in resp["warnings"].as_array().into_iter().flatten() {
                texts.push(w.as_str().unwrap_or("").to_string());
            }
            texts
        };
        // A value of the wrong type, and a map key in the field path.
        let mut labels = cluster(json!({"size": 3}));
        labels["metadata"]["labels"] = json!({ big.clone(): 1 });
        for object in [cluster(json!({"size": big.clone()})), labels] {
            for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                let a = r
                    .review(
                        endpoint,
                        &review_body("CREATE", object.clone(), Value::Null),
                    )
                    .expect("answered");
                assert!(a.body.len() < 4096, "{endpoint:?}: {} bytes", a.body.len());
                let texts = texts(&a);
                short(&texts[0], "message");
            }
        }
        // The stored object's decode error, as a warning.
        let a = r
            .review(
                Endpoint::Validate,
                &review_body(
                    "UPDATE",
                    cluster(json!({"size": 3})),
                    cluster(json!({"size": big.clone()})),
                ),
            )
            .expect("answered");
        let warning = texts(&a)
            .into_iter()
            .find(|w| w.starts_with("the stored object could not be read"))
            .expect("the warning");
        short(&warning, "warning");
        // Another kind.
        let mut body: Value =
            serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null))
                .unwrap();
        body["request"]["kind"]["kind"] = json!(big.clone());
        let a = r
            .review(Endpoint::Validate, &serde_json::to_vec(&body).unwrap())
            .expect("answered");
        short(&texts(&a)[0], "another kind");
        // Envelope errors: the HTTP layer answers their text.
        let envelope = |path: &str| {
            let mut body: Value =
                serde_json::from_slice(&review_body("CREATE", cluster(json!({})), Value::Null))
                    .unwrap();
            *body.pointer_mut(path).unwrap() = json!(big.clone());
            serde_json::to_vec(&body).unwrap()
        };
        for path in [
            "/apiVersion",
            "/kind",
            "/request/operation",
            "/request/dryRun",
        ] {
            let e = r
                .review(Endpoint::Mutate, &envelope(path))
                .expect_err("not a usable review");
            short(&e.to_string(), path);
        }
    }

    /// What the logs see of a review (its [`Verdict`]) quotes at most a bounded prefix of the
    /// request's identifiers, and the answer's `details.name` too (issue 14, item 6: a 3 MiB
    /// value made a 3 MiB log line): a caller's huge name or namespace, or a huge label.
    #[test]
    fn verdicts_and_details_quote_huge_identifiers_clipped() {
        let r = Reviewer::default();
        let big = |c: char| c.to_string().repeat(1 << 20);
        let mut object = cluster(json!({"size": 3, "pod": {"labels": {"team": big('v')}}}));
        object["metadata"]["name"] = json!(big('n'));
        let mut body: Value =
            serde_json::from_slice(&review_body("CREATE", object, Value::Null)).unwrap();
        body["request"]["name"] = json!(big('n'));
        body["request"]["namespace"] = json!(big('s'));
        let body = serde_json::to_vec(&body).unwrap();
        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let a = r.review(endpoint, &body).expect("answered");
            let v = &a.verdict;
            assert!(
                v.name.len() < 300,
                "{endpoint:?} name: {} bytes",
                v.name.len()
            );
            let namespace = v.namespace.as_deref().unwrap_or("");
            assert!(
                namespace.len() < 300,
                "{endpoint:?} namespace: {} bytes",
                namespace.len()
            );
            assert!(
                v.name.ends_with(" bytes)"),
                "{}",
                &v.name[v.name.len() - 30..]
            );
            let logged = v.message.as_deref().unwrap_or("").len()
                + v.warnings.iter().map(String::len).sum::<usize>();
            assert!(
                logged < 8192,
                "{endpoint:?}: {logged} bytes of message and warnings"
            );
            assert!(
                a.body.len() < 8192,
                "{endpoint:?}: an answer of {} bytes",
                a.body.len()
            );
        }
        let refused = r.review(Endpoint::Validate, &body).expect("answered");
        assert!(!refused.verdict.allowed);
        let details_name = response(&refused)["status"]["details"]["name"].clone();
        assert!(
            details_name.as_str().is_some_and(|n| n.len() < 300),
            "{details_name:.100}"
        );
        // A huge uid is echoed (the API server matches answers by it) but not logged whole.
        let mut body: Value = serde_json::from_slice(&body).unwrap();
        body["request"]["uid"] = json!(big('u'));
        let a = r
            .review(Endpoint::Validate, &serde_json::to_vec(&body).unwrap())
            .expect("answered");
        assert!(
            a.verdict.uid.len() < 300,
            "uid: {} bytes",
            a.verdict.uid.len()
        );
        assert_eq!(response(&a)["uid"].as_str().map(str::len), Some(1 << 20));
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

    /// A review of an object of `kind` (`resource`) in namespace `prod`.
    fn review_of(
        kind: &str,
        resource: &str,
        operation: &str,
        object: Value,
        old: Value,
    ) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-2",
                "kind": {"group": "etcd.database.coreos.com", "version": "v1beta2", "kind": kind},
                "resource": {"group": "etcd.database.coreos.com", "version": "v1beta2", "resource": resource},
                "name": "x",
                "namespace": "prod",
                "operation": operation,
                "userInfo": {"username": "admin"},
                "object": object,
                "oldObject": old
            }
        }))
        .unwrap()
    }

    fn backup(spec: Value) -> Value {
        json!({"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdBackup",
               "metadata": {"name": "x", "namespace": "prod"}, "spec": spec})
    }

    fn restore(spec: Value) -> Value {
        json!({"apiVersion": "etcd.database.coreos.com/v1beta2", "kind": "EtcdRestore",
               "metadata": {"name": "x", "namespace": "prod"}, "spec": spec})
    }

    fn good_backup_spec() -> Value {
        json!({"etcdEndpoints": ["http://demo-client:2379"], "storageType": "S3",
               "s3": {"path": "etcd-backups/demo/snapshot.db", "awsSecret": "aws"}})
    }

    fn good_restore_spec() -> Value {
        json!({"etcdCluster": {"name": "demo"}, "backupStorageType": "S3",
               "s3": {"path": "etcd-backups/demo/snapshot.db", "awsSecret": "aws"}})
    }

    /// EtcdBackups and EtcdRestores are judged by their own rules (shared::admission), with
    /// the field at fault in the refusal and its cause; nothing is ever patched.
    #[test]
    fn backups_and_restores_are_judged_by_their_rules() {
        let r = Reviewer::default();
        let judge =
            |endpoint, body: Vec<u8>| response(&r.review(endpoint, &body).expect("answered"));

        for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
            let ok = judge(
                endpoint,
                review_of(
                    "EtcdBackup",
                    "etcdbackups",
                    "CREATE",
                    backup(good_backup_spec()),
                    Value::Null,
                ),
            );
            assert_eq!(ok["allowed"], json!(true), "{ok}");
            assert!(ok.get("patch").is_none(), "{ok}");
            let ok = judge(
                endpoint,
                review_of(
                    "EtcdRestore",
                    "etcdrestores",
                    "CREATE",
                    restore(good_restore_spec()),
                    Value::Null,
                ),
            );
            assert_eq!(ok["allowed"], json!(true), "{ok}");
        }

        // Endpoints of two clusters; an unsupported storage type; a key object_store rewrites.
        let mut spec = good_backup_spec();
        spec["etcdEndpoints"] = json!(["http://a-client:2379", "http://b-client:2379"]);
        let no = judge(
            Endpoint::Validate,
            review_of(
                "EtcdBackup",
                "etcdbackups",
                "CREATE",
                backup(spec),
                Value::Null,
            ),
        );
        assert_eq!(no["allowed"], json!(false), "{no}");
        assert_eq!(no["status"]["code"], json!(422), "{no}");
        assert_eq!(no["status"]["details"]["kind"], json!("EtcdBackup"), "{no}");
        assert!(
            no["status"]["message"]
                .as_str()
                .unwrap()
                .contains("spec.etcdEndpoints"),
            "{no}"
        );

        let mut spec = good_backup_spec();
        spec["storageType"] = json!("OSS");
        let no = judge(
            Endpoint::Validate,
            review_of(
                "EtcdBackup",
                "etcdbackups",
                "CREATE",
                backup(spec),
                Value::Null,
            ),
        );
        assert_eq!(no["allowed"], json!(false), "{no}");
        assert!(
            no["status"]["message"].as_str().unwrap().contains("OSS"),
            "{no}"
        );

        let mut spec = good_restore_spec();
        spec["s3"]["path"] = json!("bucket//snapshot.db");
        let no = judge(
            Endpoint::Validate,
            review_of(
                "EtcdRestore",
                "etcdrestores",
                "CREATE",
                restore(spec),
                Value::Null,
            ),
        );
        assert_eq!(no["allowed"], json!(false), "{no}");
        assert!(
            no["status"]["message"]
                .as_str()
                .unwrap()
                .contains("spec.s3.path"),
            "{no}"
        );

        // A restore's spec is immutable; its labels are not.
        let mut moved = good_restore_spec();
        moved["etcdCluster"]["name"] = json!("other");
        let no = judge(
            Endpoint::Validate,
            review_of(
                "EtcdRestore",
                "etcdrestores",
                "UPDATE",
                restore(moved),
                restore(good_restore_spec()),
            ),
        );
        assert_eq!(no["allowed"], json!(false), "{no}");
        let mut labelled = restore(good_restore_spec());
        labelled["metadata"]["labels"] = json!({"team": "db"});
        let ok = judge(
            Endpoint::Validate,
            review_of(
                "EtcdRestore",
                "etcdrestores",
                "UPDATE",
                labelled,
                restore(good_restore_spec()),
            ),
        );
        assert_eq!(ok["allowed"], json!(true), "{ok}");

        // A spec of the wrong shape is a 422 naming the field, never an HTTP error.
        for (kind, resource, object) in [
            (
                "EtcdBackup",
                "etcdbackups",
                backup(json!({"etcdEndpoints": "http://demo-client:2379"})),
            ),
            ("EtcdRestore", "etcdrestores", restore(json!([]))),
        ] {
            for endpoint in [Endpoint::Validate, Endpoint::Mutate] {
                let no = judge(
                    endpoint,
                    review_of(kind, resource, "CREATE", object.clone(), Value::Null),
                );
                assert_eq!(no["allowed"], json!(false), "{kind}: {no}");
                assert_eq!(no["status"]["code"], json!(422), "{kind}: {no}");
                assert!(
                    no["status"]["message"]
                        .as_str()
                        .unwrap()
                        .contains(&format!("not a valid {kind}")),
                    "{no}"
                );
            }
        }

        // Another kind of the group is refused as a bad request.
        let no = judge(
            Endpoint::Validate,
            review_of(
                "EtcdThing",
                "etcdthings",
                "CREATE",
                backup(good_backup_spec()),
                Value::Null,
            ),
        );
        assert_eq!(no["status"]["code"], json!(400), "{no}");
        assert!(
            no["status"]["message"]
                .as_str()
                .unwrap()
                .contains("EtcdBackup"),
            "{no}"
        );
    }

    #[test]
    fn decode_tolerates_a_missing_spec() {
        let mut c = cluster(json!(null));
        c.as_object_mut().unwrap().remove("spec");
        let decode = |v: &Value| decode(&serde_json::value::to_raw_value(v).unwrap());
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

    /// A request that is a long string is refused by its type without quoting it (the
    /// 1,000,000-input fuzz run: 233,000 U+202E characters took 85-140 ms to quote).
    #[test]
    fn a_request_that_is_no_object_is_refused_by_its_type() {
        let r = Reviewer::default();
        let long = "\u{202e}".repeat(233_000);
        for (request, kind) in [
            (json!(long), "a string"),
            (json!([1, 2]), "sequence"),
            (json!(7), "a number"),
            (json!(true), "boolean `true`"),
        ] {
            let body = serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": request,
            }))
            .unwrap();
            let started = std::time::Instant::now();
            let got = r.review(Endpoint::Mutate, &body);
            let took = started.elapsed();
            match got {
                Err(ReviewError::NotAdmissionReview(m)) => assert_eq!(
                    m,
                    format!("request: invalid type: {kind}, expected an AdmissionRequest object")
                ),
                other => panic!("{kind}: {other:?}"),
            }
            // Quoting took 85-140 ms in a release build, seconds in a debug one.
            assert!(
                took < std::time::Duration::from_millis(500),
                "{kind}: {took:?}"
            );
        }
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
