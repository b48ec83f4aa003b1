//! Why a request body gets an HTTP error instead of an AdmissionReview answer.

use kube::core::admission::{META_API_VERSION_V1, META_KIND};

use super::raw::TooManyValues;

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

    /// An answer that could not be built, from any error.
    pub(super) fn internal(e: impl std::fmt::Display) -> Self {
        ReviewError::Internal(e.to_string())
    }
}
