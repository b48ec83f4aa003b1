//! The HTTP side of the admission server: `POST /validate` and `POST /mutate` (the metrics and
//! probe routers are the process shell's, [`etcd_process::admin`]).
//!
//! Bad input gets a plain-text HTTP error and is counted with `result="error"`: 415 for a
//! content type other than `application/json`, 413 for a body over the limit (or an
//! envelope of more JSON values than the webhook reads), 400 for a body that is not an
//! AdmissionReview, 408 for a request not received and answered in time, 429 (with
//! `Retry-After`) when the memory budget of the requests in flight stays exhausted, 404 for
//! an unknown path and 405 for another method. Bodies over [`BLOCKING_BODY_BYTES`] are
//! reviewed on the blocking pool, so small requests never wait behind them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http_body_util::BodyExt;
use tracing::{debug, info, warn};

use crate::admission::{Answer, Endpoint, ReviewError, Reviewer};
use crate::inflight::InflightBudget;
use crate::metrics::{Metrics, RequestResult};

/// Bodies larger than this are reviewed on tokio's blocking pool (a review takes about a
/// millisecond per 100 KiB), so the runtime's threads stay free for small requests.
pub const BLOCKING_BODY_BYTES: usize = 64 * 1024;

/// What the admission handlers share.
#[derive(Debug)]
pub struct WebhookState {
    /// Answers the reviews.
    pub reviewer: Reviewer,
    /// Where requests are counted.
    pub metrics: Metrics,
    /// Largest body accepted, bytes.
    pub max_body_bytes: usize,
    /// Time allowed to receive and answer one request.
    pub request_timeout: Duration,
    /// The memory budget of the requests in flight.
    pub budget: InflightBudget,
}

/// An HTTP error answer.
#[derive(Debug)]
struct HttpError {
    status: StatusCode,
    message: String,
    retry_after_seconds: Option<u32>,
}

impl HttpError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        HttpError {
            status,
            message: message.into(),
            retry_after_seconds: None,
        }
    }
}

impl From<ReviewError> for HttpError {
    fn from(e: ReviewError) -> Self {
        let status =
            StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        HttpError::new(status, e.to_string())
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut message = self.message;
        message.push('\n');
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            message,
        )
            .into_response();
        if let Some(seconds) = self.retry_after_seconds {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The admission router.
pub fn webhook_router(state: Arc<WebhookState>) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .route("/mutate", post(mutate))
        .fallback(not_found)
        .with_state(state)
}

async fn validate(State(state): State<Arc<WebhookState>>, request: Request) -> Response {
    handle(state, Endpoint::Validate, request).await
}

async fn mutate(State(state): State<Arc<WebhookState>>, request: Request) -> Response {
    handle(state, Endpoint::Mutate, request).await
}

async fn not_found() -> Response {
    HttpError::new(StatusCode::NOT_FOUND, "not found").into_response()
}

/// Counts a request in flight for as long as it lives.
struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    fn enter(metrics: &'a Metrics) -> Self {
        metrics.in_flight().inc();
        InFlight(metrics)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().dec();
    }
}

/// Answers one admission request within the request timeout, counts it and logs it.
async fn handle(state: Arc<WebhookState>, endpoint: Endpoint, request: Request) -> Response {
    let started = Instant::now();
    let _in_flight = InFlight::enter(&state.metrics);
    let answered = tokio::time::timeout(
        state.request_timeout,
        answer(state.clone(), endpoint, request),
    )
    .await
    .unwrap_or_else(|_| {
        Err(HttpError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!(
                "the request was not received and answered within {:?}",
                state.request_timeout
            ),
        ))
    });
    let elapsed = started.elapsed();
    match answered {
        Ok(answer) => reviewed(&state.metrics, endpoint, answer, elapsed),
        Err(e) => failed(&state.metrics, endpoint, e, elapsed),
    }
}

/// The answer of a request reviewed: counted by its result and each rule it broke, logged
/// (at info when refused), sent as JSON.
fn reviewed(metrics: &Metrics, endpoint: Endpoint, answer: Answer, elapsed: Duration) -> Response {
    let Answer { body, verdict } = answer;
    let result = if verdict.allowed {
        RequestResult::Allowed
    } else {
        RequestResult::Denied
    };
    metrics.observe_request(endpoint.as_str(), verdict.operation, result, elapsed);
    for rule in &verdict.rules {
        metrics.count_refusal(rule);
    }
    let namespace = verdict.namespace.as_deref().unwrap_or("");
    if let Some(message) = verdict.message.as_deref() {
        info!(
            endpoint = endpoint.as_str(),
            uid = %verdict.uid,
            operation = verdict.operation,
            namespace,
            name = %verdict.name,
            dry_run = verdict.dry_run,
            rules = ?verdict.rules,
            refusal = message,
            "refused"
        );
    }
    debug!(
        endpoint = endpoint.as_str(),
        uid = %verdict.uid,
        operation = verdict.operation,
        namespace,
        name = %verdict.name,
        dry_run = verdict.dry_run,
        allowed = verdict.allowed,
        warnings = verdict.warnings.len(),
        patch_operations = verdict.patch_operations,
        micros = elapsed.as_micros() as u64,
        "admission request"
    );
    let mut response = Response::new(Body::from(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The HTTP error of a request not reviewed: counted as `result="error"` of an unknown
/// operation, logged (a warning when the webhook is at fault).
fn failed(metrics: &Metrics, endpoint: Endpoint, e: HttpError, elapsed: Duration) -> Response {
    metrics.observe_request(endpoint.as_str(), "unknown", RequestResult::Error, elapsed);
    if e.status.is_server_error() {
        warn!(endpoint = endpoint.as_str(), status = e.status.as_u16(), error = %e.message, "admission request failed");
    } else {
        debug!(endpoint = endpoint.as_str(), status = e.status.as_u16(), error = %e.message, "bad admission request");
    }
    e.into_response()
}

async fn answer(
    state: Arc<WebhookState>,
    endpoint: Endpoint,
    request: Request,
) -> Result<Answer, HttpError> {
    check_content_type(request.headers())?;
    let limit = state.max_body_bytes;
    let too_large = || {
        HttpError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is larger than the limit of {limit} bytes"),
        )
    };
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    // Reserve before reading: a body without a declared length may use up to the limit.
    let expected = declared.map_or(limit, |n| n as usize);
    let shed = |e: crate::inflight::Exhausted| {
        state.metrics.count_shed();
        HttpError {
            retry_after_seconds: Some(1),
            ..HttpError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
        }
    };
    let mut reservation = state.budget.reserve(expected).await.map_err(shed)?;
    let body = read_body(request.into_body(), limit, declared.map(|n| n as usize))
        .await?
        .ok_or_else(too_large)?;
    // Then only what answering it costs, from its size and its JSON values.
    let values = crate::admission::count_values(&body, crate::inflight::MAX_DECODED_VALUES);
    state.budget.shrink(&mut reservation, body.len(), values);
    let reserved = reservation;
    if body.len() <= BLOCKING_BODY_BYTES {
        let answer = state.reviewer.review(endpoint, &body);
        drop(reserved);
        return Ok(answer?);
    }
    // The reservation moves with the work: a request that timed out keeps its share until the
    // review it started has finished.
    let work = tokio::task::spawn_blocking(move || {
        let answer = state.reviewer.review(endpoint, &body);
        drop(body);
        drop(reserved);
        answer
    });
    match work.await {
        Ok(answer) => Ok(answer?),
        Err(e) => Err(HttpError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the review failed: {e}"),
        )),
    }
}

/// The body, copied frame by frame into one buffer of the declared length (so the chunks are
/// freed as they arrive, and the body is never held twice, as collecting the chunks and then
/// joining them does); `None` when it is over `limit` bytes.
async fn read_body(
    mut body: Body,
    limit: usize,
    declared: Option<usize>,
) -> Result<Option<Vec<u8>>, HttpError> {
    let mut buf = Vec::with_capacity(declared.unwrap_or(0).min(limit));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            HttpError::new(
                StatusCode::BAD_REQUEST,
                format!("cannot read the request body: {e}"),
            )
        })?;
        if let Ok(data) = frame.into_data() {
            if data.len() > limit - buf.len() {
                return Ok(None);
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Some(buf))
}

fn check_content_type(headers: &HeaderMap) -> Result<(), HttpError> {
    let value = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = value.split(';').next().unwrap_or("").trim();
    if media_type.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(HttpError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("content type must be application/json, got {value:?}"),
        ))
    }
}
