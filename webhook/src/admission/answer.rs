//! The answer: what the rules decided, shaped as the API server reads it (a `Status` with
//! one cause per violation, warnings, the JSONPatch base64-encoded) and as logs and metrics
//! see it ([`Verdict`]).

use base64::Engine as _;
use etcd_shared::admission::{Refusal, clipped};
use kube::core::Status;
use kube::core::admission::{AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails, StatusSummary};
use serde_json::Value;

use super::MAX_QUOTED;
use super::decode::DecodeError;
use super::error::ReviewError;
use super::request::Request;

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

impl Verdict {
    /// The request's identifiers, clipped as every quoted value is (real ones are far
    /// shorter; a caller's 3 MiB name is not); the rest is filled by the decision.
    pub(super) fn of(request: &Request<'_>) -> Self {
        Verdict {
            uid: clipped(request.uid.clone(), MAX_QUOTED),
            operation: operation_name(&request.operation),
            namespace: request.namespace.clone().map(|n| clipped(n, MAX_QUOTED)),
            name: clipped(request.name.clone(), MAX_QUOTED),
            dry_run: request.dry_run,
            ..Verdict::default()
        }
    }
}

/// A serialized AdmissionReview answer and what it says.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The `admission.k8s.io/v1` AdmissionReview with the response, as JSON.
    pub body: Vec<u8>,
    /// What it says.
    pub verdict: Verdict,
}

/// What the rules decided.
pub(super) enum Decision {
    /// Allowed, with the rules' warnings and, on `/mutate`, the defaulting patch.
    Allow {
        warnings: Vec<String>,
        patch: Option<json_patch::Patch>,
    },
    /// Refused with this status.
    Deny(Box<Status>),
}

impl Decision {
    /// Allowed with nothing to say.
    pub(super) fn allow() -> Self {
        Decision::Allow {
            warnings: Vec::new(),
            patch: None,
        }
    }
}

/// The AdmissionReview answering `request` with `decision`; `verdict` is completed with it.
pub(super) fn respond(
    request: &Request<'_>,
    decision: Decision,
    mut verdict: Verdict,
) -> Result<Answer, ReviewError> {
    let mut response = AdmissionResponse::from(request);
    match decision {
        Decision::Allow { warnings, patch } => {
            verdict.allowed = true;
            if !warnings.is_empty() {
                verdict.warnings = warnings.clone();
                response.warnings = Some(warnings);
            }
            if let Some(patch) = patch.filter(|p| !p.0.is_empty()) {
                verdict.patch_operations = patch.0.len();
                response = response.with_patch(patch).map_err(ReviewError::internal)?;
            }
        }
        Decision::Deny(status) => {
            verdict.allowed = false;
            verdict.message = Some(status.message.clone());
            response.allowed = false;
            response.result = *status;
        }
    }
    Ok(Answer {
        body: encode(response)?,
        verdict,
    })
}

fn operation_name(op: &Operation) -> &'static str {
    match op {
        Operation::Create => "CREATE",
        Operation::Update => "UPDATE",
        Operation::Delete => "DELETE",
        Operation::Connect => "CONNECT",
    }
}

/// A refusal that is no rule's: `reason` and `code` as the API server's own errors.
pub(super) fn failure(
    message: String,
    reason: &str,
    code: u16,
    details: Option<StatusDetails>,
) -> Status {
    Status {
        status: Some(StatusSummary::Failure),
        code,
        message,
        metadata: None,
        reason: reason.to_string(),
        details,
    }
}

fn details(request: &Request<'_>, causes: Vec<StatusCause>) -> StatusDetails {
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

/// The refusal of an object that does not decode as its kind: 422 Invalid, with the field.
pub(super) fn undecodable(request: &Request<'_>, e: &DecodeError) -> Status {
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

/// A refusal by the rules: 422 Invalid, the violations joined in the message (the API server
/// shows `admission webhook "NAME" denied the request: MESSAGE`) and one cause per violation.
pub(super) fn refused(request: &Request<'_>, refusal: &Refusal) -> Status {
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
    let patch = response.patch.take();
    let mut review = serde_json::to_value(response.into_review()).map_err(ReviewError::internal)?;
    if let Some(patch) = patch
        && let Some(fields) = review.get_mut("response").and_then(Value::as_object_mut)
    {
        let encoded = base64::engine::general_purpose::STANDARD.encode(patch);
        fields.insert("patch".into(), Value::String(encoded));
    }
    serde_json::to_vec(&review).map_err(ReviewError::internal)
}
