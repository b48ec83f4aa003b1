//! AdmissionReview in, AdmissionReview out: the two webhook endpoints as functions of the
//! request body, without HTTP or I/O. One module a step, each reading what the one before
//! produced, the body read once:
//!
//! - `request`: the envelope; the typed request with its `object` and `oldObject` kept as
//!   slices of the body (no JSON tree of the body is ever built; counting and skipping in `raw`).
//! - `dispatch`: the request's kind and operation choose the rules; `decode` reads typed
//!   copies of the objects' metadata and spec for them (never their status), `patch` writes
//!   the defaulting JSONPatch (the diff of the typed object and its defaulted copy).
//! - `answer`: the decision shaped as the AdmissionReview the API server reads, and the
//!   [`Verdict`] logs and metrics see.
//! - `error`: [`ReviewError`], a body that gets an HTTP error rather than an answer.

mod answer;
mod decode;
mod dispatch;
mod error;
mod patch;
mod raw;
mod request;

use etcd_shared::admission::AdmissionPolicy;

pub use answer::{Answer, Verdict};
pub use error::ReviewError;
pub use raw::{MAX_VALUES, TooManyValues, count_values};

/// The longest part of the request an error or refusal quotes, bytes (`apiVersion`, `kind`,
/// identifiers, a decoder's message with the offending value): an answer never echoes a large
/// value (issue 14, item 6).
const MAX_QUOTED: usize = 256;

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

/// Answers AdmissionReviews with an [`AdmissionPolicy`].
#[derive(Debug, Clone, Default)]
pub struct Reviewer {
    policy: AdmissionPolicy,
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
        let request = request::parse(body)?;
        let mut verdict = Verdict::of(&request);
        let decision = dispatch::decide(&self.policy, endpoint, &request, &mut verdict)?;
        answer::respond(&request, decision, verdict)
    }
}

#[cfg(test)]
mod tests;
