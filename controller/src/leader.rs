//! Leader election on a `coordination.k8s.io/v1` Lease, the way client-go does it, so only one
//! replica reconciles at a time.
//!
//! - A candidate takes the Lease when it is absent, released (no holder), expired or already
//!   its own; every write is a create
//!   or a replace carrying the `resourceVersion` it read, so when two candidates race the API
//!   server accepts one and answers the other 409 Conflict. A takeover increments
//!   `leaseTransitions`.
//! - The leader renews every retry period. When it could not renew for the renew deadline, or
//!   finds another holder, it has lost: the work is stopped (its token cancelled, and dropped if
//!   it has not finished by the time another candidate may take the Lease over) and the elector
//!   becomes a candidate again.
//! - On shutdown the work is stopped first, then the Lease is released (holder cleared,
//!   duration 1 s), so a standby takes over within one retry period instead of a lease
//!   duration.
//!
//! The decision is a pure function, [`decide`]; [`next_spec`] computes the Lease to write.
//! Expiry is judged as client-go judges it: by how long *this candidate* has seen the Lease's
//! record unchanged, on its own monotonic clock, never by comparing the holder's `renewTime`
//! with the local wall clock. A standby whose clock runs fast (or slow) therefore never takes
//! a Lease that is still being renewed; a record first seen counts as just renewed, so a new
//! candidate waits one lease duration before taking over a stale Lease.

use std::collections::hash_map::RandomState;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Environment variable holding the pod's name (the holder identity when set).
pub const POD_NAME_ENV: &str = "POD_NAME";

/// What the elector needs to know.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElectionParams {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub lease_name: String,
    /// This candidate's identity, unique among the candidates (see [`default_identity`]).
    pub identity: String,
    /// How long a Lease stays valid after its last renewal (written as whole seconds,
    /// rounded up).
    pub lease_duration: Duration,
    /// How long the leader keeps failing to renew before it gives up leadership.
    pub renew_deadline: Duration,
    /// How often candidates try to acquire and the leader renews.
    pub retry_period: Duration,
}

impl LeaderElectionParams {
    /// Checks `0 < retry period < renew deadline < lease duration` and non-empty names.
    pub fn validate(&self) -> Result<(), LeaderElectionError> {
        let invalid = |m: String| Err(LeaderElectionError::InvalidParams(m));
        if self.namespace.is_empty() || self.lease_name.is_empty() || self.identity.is_empty() {
            return invalid("the namespace, the lease name and the identity must be set".into());
        }
        if self.retry_period.is_zero() {
            return invalid("the retry period must be positive".into());
        }
        if self.renew_deadline <= self.retry_period {
            return invalid(format!(
                "the renew deadline ({:?}) must be longer than the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.lease_duration <= self.renew_deadline {
            return invalid(format!(
                "the lease duration ({:?}) must be longer than the renew deadline ({:?})",
                self.lease_duration, self.renew_deadline
            ));
        }
        Ok(())
    }

    /// The lease duration in whole seconds, rounded up, at least 1.
    pub fn lease_duration_seconds(&self) -> i32 {
        let d = self.lease_duration;
        let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
        i32::try_from(secs).unwrap_or(i32::MAX).max(1)
    }
}

/// Why leader election could not run.
#[derive(Debug, thiserror::Error)]
pub enum LeaderElectionError {
    /// The parameters are inconsistent.
    #[error("invalid leader election parameters: {0}")]
    InvalidParams(String),
}

/// The holder identity of this process: `$POD_NAME` when set, else the hostname with a random
/// suffix (so two processes on one host never share an identity).
pub fn default_identity() -> String {
    identity_from(
        std::env::var(POD_NAME_ENV).ok().as_deref(),
        &hostname(),
        RandomState::new().build_hasher().finish(),
    )
}

fn identity_from(pod_name: Option<&str>, hostname: &str, random: u64) -> String {
    match pod_name.map(str::trim) {
        Some(pod) if !pod.is_empty() => pod.to_string(),
        _ => format!("{hostname}_{:08x}", random & 0xffff_ffff),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "etcd-controller".to_string())
}

/// What a candidate or leader should do about the Lease it read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, holding it.
    Create,
    /// The Lease is ours: renew it.
    Renew,
    /// The Lease is released or expired: take it over.
    TakeOver {
        /// The previous holder, if any.
        previous: Option<String>,
    },
    /// Another candidate holds a valid Lease: wait.
    Wait {
        /// The holder.
        holder: String,
        /// How long until it expires, unless renewed, as this candidate sees it.
        remaining: Duration,
    },
}

/// Decides what `me` should do about `lease` (`None`: it doesn't exist), which this candidate
/// has seen unchanged for `unchanged_for` (by its own monotonic clock; zero for a record it
/// sees for the first time).
///
/// A Lease with no holder (or an empty one) is released. A Lease held by another is valid
/// until its record has stayed unchanged for `leaseDurationSeconds`; one without a duration
/// counts as expired.
pub fn decide(lease: Option<&Lease>, me: &str, unchanged_for: Duration) -> Decision {
    let Some(lease) = lease else {
        return Decision::Create;
    };
    let spec = lease.spec.as_ref();
    let holder = spec
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty());
    let Some(holder) = holder else {
        return Decision::TakeOver { previous: None };
    };
    if holder == me {
        return Decision::Renew;
    }
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|d| u64::try_from(d).ok())
        .map(Duration::from_secs);
    match duration {
        Some(duration) if unchanged_for < duration => Decision::Wait {
            holder: holder.to_string(),
            remaining: duration - unchanged_for,
        },
        _ => Decision::TakeOver {
            previous: Some(holder.to_string()),
        },
    }
}

/// The wall clock the elector writes `acquireTime` and `renewTime` with (injectable, so a
/// skewed candidate can be tested).
#[derive(Clone)]
pub struct WallClock(Arc<dyn Fn() -> Timestamp + Send + Sync>);

impl WallClock {
    /// The system clock.
    pub fn system() -> Self {
        WallClock(Arc::new(Timestamp::now))
    }

    /// A clock `offset_seconds` ahead of the system clock (behind when negative).
    pub fn skewed(offset_seconds: i64) -> Self {
        WallClock(Arc::new(move || {
            Timestamp::now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(offset_seconds))
                .unwrap_or(Timestamp::MAX)
        }))
    }

    fn now(&self) -> Timestamp {
        (self.0)()
    }
}

impl std::fmt::Debug for WallClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WallClock")
    }
}

/// The Lease record this candidate saw last, and when it first saw it (monotonic clock).
#[derive(Debug, Default)]
struct Observed {
    record: Option<LeaseSpec>,
    since: Option<Instant>,
}

impl Observed {
    /// Notes the record read now; returns how long it has been unchanged.
    fn see(&mut self, record: Option<&LeaseSpec>, now: Instant) -> Duration {
        match self.since {
            Some(since) if self.record.as_ref() == record => now.saturating_duration_since(since),
            _ => {
                self.record = record.cloned();
                self.since = Some(now);
                Duration::ZERO
            }
        }
    }
}

/// The Lease spec `me` writes to carry out `decision` (`None` for [`Decision::Wait`]).
/// Renewing keeps the acquire time and the transition count; creating starts the count at 0;
/// taking over increments it.
pub fn next_spec(
    decision: &Decision,
    current: Option<&LeaseSpec>,
    me: &str,
    lease_duration_seconds: i32,
    now: Timestamp,
) -> Option<LeaseSpec> {
    let transitions = current.and_then(|s| s.lease_transitions).unwrap_or(0);
    let base = LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(lease_duration_seconds),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    match decision {
        Decision::Wait { .. } => None,
        Decision::Create => Some(LeaseSpec {
            lease_transitions: Some(0),
            ..base
        }),
        Decision::Renew => Some(LeaseSpec {
            acquire_time: current
                .and_then(|s| s.acquire_time.clone())
                .or(base.acquire_time.clone()),
            ..base
        }),
        Decision::TakeOver { .. } => Some(LeaseSpec {
            lease_transitions: Some(transitions.saturating_add(1)),
            ..base
        }),
    }
}

/// The spec that releases a Lease: no holder, a 1 s duration from now, the transition count
/// kept (client-go writes the same).
pub fn released_spec(current: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: current.and_then(|s| s.lease_transitions),
        ..LeaseSpec::default()
    }
}

/// The result of one acquire-or-renew attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Attempt {
    /// We hold the Lease now.
    Holding,
    /// The Lease is not ours: held by this holder, or released (`None`) by someone else.
    NotOurs(Option<String>),
    /// A concurrent write won (409): the outcome is known at the next read.
    Conflict,
}

/// Why leading ended.
enum LeadOutcome {
    /// The work finished (after shutdown, or on its own).
    Finished,
    /// Leadership was lost; the reason is logged.
    Lost(String),
}

/// Runs leader election and the work of the leader. See the module documentation.
#[derive(Debug, Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    params: LeaderElectionParams,
    metrics: Option<Arc<Metrics>>,
    clock: WallClock,
    observed: Arc<Mutex<Observed>>,
}

impl LeaderElector {
    /// An elector for `params.lease_name` in `params.namespace`.
    pub fn new(client: Client, params: LeaderElectionParams) -> Self {
        Self {
            api: Api::namespaced(client, &params.namespace),
            params,
            metrics: None,
            clock: WallClock::system(),
            observed: Arc::default(),
        }
    }

    /// Writes the Lease's timestamps with `clock` instead of the system clock.
    pub fn with_wall_clock(mut self, clock: WallClock) -> Self {
        self.clock = clock;
        self
    }

    /// How long the record just read has stayed unchanged, by this candidate's clock.
    fn unchanged_for(&self, record: Option<&LeaseSpec>) -> Duration {
        let mut observed = self
            .observed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        observed.see(record, Instant::now())
    }

    /// Reports leadership in the `leader` gauge of `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The parameters.
    pub fn params(&self) -> &LeaderElectionParams {
        &self.params
    }

    /// Campaigns until `shutdown` is cancelled. Each time this candidate becomes leader it
    /// calls `on_leading(stop)` and drives the returned future; `stop` is cancelled when
    /// leadership is lost or on shutdown, and the future should then finish promptly.
    ///
    /// Returns after shutdown (with the Lease released), or when the leader's work finished on
    /// its own (also releasing the Lease): the caller tells the two apart by its token.
    pub async fn run<F, Fut>(
        &self,
        shutdown: CancellationToken,
        mut on_leading: F,
    ) -> Result<(), LeaderElectionError>
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()>,
    {
        self.params.validate()?;
        let p = &self.params;
        self.set_leader(false);
        tracing::info!(
            lease = %format!("{}/{}", p.namespace, p.lease_name),
            identity = %p.identity,
            "leader election: campaigning"
        );
        loop {
            if !self.acquire(&shutdown).await {
                return Ok(());
            }
            tracing::info!(identity = %p.identity, "leader election: became leader");
            self.set_leader(true);
            let stop = shutdown.child_token();
            let outcome = self.lead(on_leading(stop.clone()), &stop).await;
            self.set_leader(false);
            match outcome {
                LeadOutcome::Lost(reason) => {
                    tracing::warn!(%reason, "leader election: lost leadership; standing by");
                    if shutdown.is_cancelled() {
                        return Ok(());
                    }
                }
                LeadOutcome::Finished => {
                    if !shutdown.is_cancelled() {
                        tracing::warn!("leader election: the leader's work ended on its own");
                    }
                    self.release().await;
                    return Ok(());
                }
            }
        }
    }

    fn set_leader(&self, leading: bool) {
        if let Some(m) = &self.metrics {
            m.set_leader(leading);
        }
    }

    /// Tries every retry period until this candidate holds the Lease (`true`) or `shutdown` is
    /// cancelled (`false`).
    async fn acquire(&self, shutdown: &CancellationToken) -> bool {
        let mut last_holder: Option<Option<String>> = None;
        loop {
            if shutdown.is_cancelled() {
                return false;
            }
            let attempt = tokio::select! {
                () = shutdown.cancelled() => return false,
                r = tokio::time::timeout(self.params.renew_deadline, self.try_acquire_or_renew(false)) => r,
            };
            match attempt {
                Ok(Ok(Attempt::Holding)) => return true,
                Ok(Ok(Attempt::Conflict)) => {
                    tracing::debug!("leader election: another candidate won the race");
                }
                Ok(Ok(Attempt::NotOurs(holder))) => {
                    if last_holder.as_ref() != Some(&holder) {
                        tracing::info!(holder = ?holder, "leader election: the lease is held; standing by");
                        last_holder = Some(holder);
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leader election: cannot acquire the lease")
                }
                Err(_) => tracing::warn!("leader election: acquiring the lease timed out"),
            }
            tokio::select! {
                () = shutdown.cancelled() => return false,
                () = tokio::time::sleep(self.params.retry_period) => {}
            }
        }
    }

    /// Drives `work` while renewing the Lease. On loss, cancels `stop` and gives `work` until
    /// another candidate may take over to finish, else drops it.
    async fn lead<Fut: Future<Output = ()>>(
        &self,
        work: Fut,
        stop: &CancellationToken,
    ) -> LeadOutcome {
        let mut work = std::pin::pin!(work);
        let reason = tokio::select! {
            () = &mut work => return LeadOutcome::Finished,
            reason = self.keep_renewing() => reason,
        };
        stop.cancel();
        let grace = self
            .params
            .lease_duration
            .saturating_sub(self.params.renew_deadline);
        if tokio::time::timeout(grace, work).await.is_err() {
            tracing::error!(
                "leader election: the leader's work did not stop within {grace:?} of losing the lease; abandoned it"
            );
        }
        LeadOutcome::Lost(reason)
    }

    /// Renews every retry period; returns why leadership was lost. Runs until then.
    async fn keep_renewing(&self) -> String {
        let p = &self.params;
        let too_late = format!(
            "could not renew the lease within the renew deadline ({:?})",
            p.renew_deadline
        );
        let mut last_renewal = Instant::now();
        loop {
            tokio::time::sleep(p.retry_period).await;
            let deadline = last_renewal + p.renew_deadline;
            let result = tokio::time::timeout_at(deadline, self.try_acquire_or_renew(true)).await;
            match result {
                Ok(Ok(Attempt::Holding)) => last_renewal = Instant::now(),
                Ok(Ok(Attempt::NotOurs(holder))) => {
                    return match holder {
                        Some(holder) => format!("the lease is now held by {holder:?}"),
                        None => "the lease was released by someone else".to_string(),
                    };
                }
                Ok(Ok(Attempt::Conflict)) => {
                    // A concurrent write (409): read again next period; a new holder shows
                    // then.
                    tracing::debug!("leader election: renewal conflicted; retrying");
                    if Instant::now() >= deadline {
                        return too_late;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leader election: cannot renew the lease");
                    if Instant::now() >= deadline {
                        return format!("{too_late}: {e}");
                    }
                }
                Err(_) => return too_late,
            }
        }
    }

    /// One read-decide-write round. While leading only a renewal (or re-creating a deleted
    /// Lease) keeps leadership; a Lease found released or held by another means it was lost.
    async fn try_acquire_or_renew(&self, leading: bool) -> Result<Attempt, kube::Error> {
        let p = &self.params;
        let current = self.api.get_opt(&p.lease_name).await?;
        let now = self.clock.now();
        let unchanged_for = self.unchanged_for(current.as_ref().and_then(|l| l.spec.as_ref()));
        let decision = decide(current.as_ref(), &p.identity, unchanged_for);
        let spec = next_spec(
            &decision,
            current.as_ref().and_then(|l| l.spec.as_ref()),
            &p.identity,
            p.lease_duration_seconds(),
            now,
        );
        let holder_of = |l: &Option<Lease>| {
            l.as_ref()
                .and_then(|l| l.spec.as_ref())
                .and_then(|s| s.holder_identity.clone())
                .filter(|h| !h.is_empty())
        };
        let result = match (&decision, current, spec) {
            (Decision::Wait { holder, .. }, _, _) => {
                return Ok(Attempt::NotOurs(Some(holder.clone())));
            }
            (Decision::TakeOver { .. }, current, _) if leading => {
                return Ok(Attempt::NotOurs(holder_of(&current)));
            }
            (_, _, None) => return Ok(Attempt::Conflict),
            (Decision::Create, _, Some(spec)) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(p.lease_name.clone()),
                        namespace: Some(p.namespace.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Decision::Renew | Decision::TakeOver { .. }, Some(mut lease), Some(spec)) => {
                // The resourceVersion read above stays in the metadata: a concurrent write
                // makes this replace fail with 409 Conflict.
                lease.spec = Some(spec);
                self.api
                    .replace(&p.lease_name, &PostParams::default(), &lease)
                    .await
            }
            (Decision::Renew | Decision::TakeOver { .. }, None, Some(_)) => {
                return Ok(Attempt::Conflict);
            }
        };
        match result {
            Ok(_) => {
                if let Decision::TakeOver { previous } = &decision {
                    tracing::info!(previous = ?previous, "leader election: took the lease over");
                }
                Ok(Attempt::Holding)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
                tracing::debug!("leader election: a concurrent write of the lease won");
                Ok(Attempt::Conflict)
            }
            Err(e) => Err(e),
        }
    }

    /// Releases the Lease if we still hold it, so a standby takes over at once. Best effort:
    /// on failure the Lease simply expires.
    async fn release(&self) {
        let p = &self.params;
        let release = async {
            let Some(mut lease) = self.api.get_opt(&p.lease_name).await? else {
                return Ok::<bool, kube::Error>(false);
            };
            let holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder != Some(p.identity.as_str()) {
                return Ok(false);
            }
            lease.spec = Some(released_spec(lease.spec.as_ref(), self.clock.now()));
            self.api
                .replace(&p.lease_name, &PostParams::default(), &lease)
                .await?;
            Ok(true)
        };
        match tokio::time::timeout(p.renew_deadline, release).await {
            Ok(Ok(true)) => tracing::info!("leader election: released the lease"),
            Ok(Ok(false)) => tracing::info!("leader election: the lease was no longer ours"),
            Ok(Err(e)) => tracing::warn!(error = %e, "leader election: cannot release the lease"),
            Err(_) => tracing::warn!("leader election: releasing the lease timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ME: &str = "me";
    const OTHER: &str = "other";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + secs).unwrap()
    }

    fn lease(holder: Option<&str>, renewed: Option<i64>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some("lock".into()),
                resource_version: Some("42".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                renew_time: renewed.map(|s| MicroTime(t(s))),
                acquire_time: Some(MicroTime(t(-100))),
                lease_duration_seconds: duration,
                lease_transitions: Some(3),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn decide_table() {
        let secs = Duration::from_secs;
        let wait = |remaining: u64| Decision::Wait {
            holder: OTHER.into(),
            remaining: secs(remaining),
        };
        let take = |previous: Option<&str>| Decision::TakeOver {
            previous: previous.map(str::to_string),
        };
        let no_spec = Lease {
            spec: None,
            ..lease(None, None, None)
        };
        // (case, lease, seen unchanged for, decision). The holder's renewTime never matters:
        // only how long this candidate has seen the record unchanged.
        let cases: Vec<(&str, Option<Lease>, u64, Decision)> = vec![
            ("absent", None, 0, Decision::Create),
            (
                "ours, fresh",
                Some(lease(Some(ME), Some(0), Some(15))),
                1,
                Decision::Renew,
            ),
            (
                "ours, unchanged for long",
                Some(lease(Some(ME), Some(0), Some(15))),
                100,
                Decision::Renew,
            ),
            (
                "other, first seen",
                Some(lease(Some(OTHER), Some(0), Some(15))),
                0,
                wait(15),
            ),
            (
                "other, unchanged 14 s",
                Some(lease(Some(OTHER), Some(0), Some(15))),
                14,
                wait(1),
            ),
            (
                "other, unchanged for the lease duration",
                Some(lease(Some(OTHER), Some(0), Some(15))),
                15,
                take(Some(OTHER)),
            ),
            (
                "other, renewTime an hour old by our clock, but just renewed (clock skew)",
                Some(lease(Some(OTHER), Some(-3600), Some(15))),
                2,
                wait(13),
            ),
            (
                "other, renewTime in the future (clock skew), unchanged too long",
                Some(lease(Some(OTHER), Some(3600), Some(15))),
                20,
                take(Some(OTHER)),
            ),
            (
                "released (no holder)",
                Some(lease(None, Some(0), Some(1))),
                0,
                take(None),
            ),
            (
                "released (empty holder)",
                Some(lease(Some(""), Some(0), Some(15))),
                0,
                take(None),
            ),
            ("no spec", Some(no_spec), 0, take(None)),
            (
                "other, no renew time, first seen",
                Some(lease(Some(OTHER), None, Some(15))),
                0,
                wait(15),
            ),
            (
                "other, no duration",
                Some(lease(Some(OTHER), Some(0), None)),
                0,
                take(Some(OTHER)),
            ),
            (
                "other, negative duration",
                Some(lease(Some(OTHER), Some(0), Some(-5))),
                0,
                take(Some(OTHER)),
            ),
            (
                "other, huge duration",
                Some(lease(Some(OTHER), Some(0), Some(i32::MAX))),
                1_000_000,
                wait(u64::from(i32::MAX.unsigned_abs()) - 1_000_000),
            ),
        ];
        for (name, lease, unchanged, want) in cases {
            assert_eq!(decide(lease.as_ref(), ME, secs(unchanged)), want, "{name}");
        }
    }

    /// The observed record's age: a changed record (a renewal) restarts it.
    #[test]
    fn a_renewal_restarts_the_observed_age() {
        let start = Instant::now();
        let mut observed = Observed::default();
        let first = lease(Some(OTHER), Some(0), Some(15)).spec;
        let renewed = lease(Some(OTHER), Some(2), Some(15)).spec;
        assert_eq!(observed.see(first.as_ref(), start), Duration::ZERO);
        assert_eq!(
            observed.see(first.as_ref(), start + Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(
            observed.see(renewed.as_ref(), start + Duration::from_secs(6)),
            Duration::ZERO
        );
        assert_eq!(
            observed.see(renewed.as_ref(), start + Duration::from_secs(9)),
            Duration::from_secs(3)
        );
        assert_eq!(
            observed.see(None, start + Duration::from_secs(10)),
            Duration::ZERO
        );
    }

    #[test]
    fn next_spec_table() {
        let current = lease(Some(OTHER), Some(0), Some(15)).spec;
        let now = t(50);
        let created = next_spec(&Decision::Create, None, ME, 15, now).unwrap();
        assert_eq!(created.holder_identity.as_deref(), Some(ME));
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.lease_duration_seconds, Some(15));
        assert_eq!(created.acquire_time, Some(MicroTime(now)));
        assert_eq!(created.renew_time, Some(MicroTime(now)));

        let renewed = next_spec(&Decision::Renew, current.as_ref(), ME, 20, now).unwrap();
        assert_eq!(
            renewed.lease_transitions,
            Some(3),
            "renewing is no transition"
        );
        assert_eq!(
            renewed.acquire_time,
            Some(MicroTime(t(-100))),
            "acquire time kept"
        );
        assert_eq!(renewed.renew_time, Some(MicroTime(now)));
        assert_eq!(renewed.lease_duration_seconds, Some(20));

        let taken = next_spec(
            &Decision::TakeOver {
                previous: Some(OTHER.into()),
            },
            current.as_ref(),
            ME,
            15,
            now,
        )
        .unwrap();
        assert_eq!(taken.holder_identity.as_deref(), Some(ME));
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.acquire_time, Some(MicroTime(now)));

        let wait = Decision::Wait {
            holder: OTHER.into(),
            remaining: Duration::from_secs(1),
        };
        assert_eq!(next_spec(&wait, current.as_ref(), ME, 15, now), None);

        let released = released_spec(current.as_ref(), now);
        assert_eq!(released.holder_identity, None);
        assert_eq!(released.lease_transitions, Some(3));
        assert_eq!(released.lease_duration_seconds, Some(1));
        // A released Lease is free for anyone at once.
        let released = Lease {
            spec: Some(released),
            ..Lease::default()
        };
        assert_eq!(
            decide(Some(&released), OTHER, Duration::ZERO),
            Decision::TakeOver { previous: None }
        );
    }

    #[test]
    fn params_validation_and_rounding() {
        let p = LeaderElectionParams {
            namespace: "ns".into(),
            lease_name: "lock".into(),
            identity: ME.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        };
        p.validate().unwrap();
        assert_eq!(p.lease_duration_seconds(), 15);
        let with = |f: fn(&mut LeaderElectionParams)| {
            let mut q = p.clone();
            f(&mut q);
            q
        };
        assert_eq!(
            with(|q| q.lease_duration = Duration::from_millis(1500)).lease_duration_seconds(),
            2
        );
        assert_eq!(
            with(|q| q.lease_duration = Duration::from_millis(10)).lease_duration_seconds(),
            1
        );
        for bad in [
            with(|q| q.renew_deadline = Duration::from_secs(15)),
            with(|q| q.retry_period = Duration::from_secs(10)),
            with(|q| q.retry_period = Duration::ZERO),
            with(|q| q.identity.clear()),
            with(|q| q.lease_name.clear()),
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn identities() {
        assert_eq!(identity_from(Some("pod-1"), "host", 7), "pod-1");
        assert_eq!(identity_from(Some(" pod-1\n"), "host", 7), "pod-1");
        assert_eq!(identity_from(Some(" "), "host", 0xabc), "host_00000abc");
        assert_eq!(identity_from(None, "host", u64::MAX), "host_ffffffff");
    }

    /// Set by [`two_processes_on_one_host_campaign_as_two`] for the processes it starts.
    const PRINT_IDENTITY: &str = "ETCD_CONTROLLER_TEST_PRINT_IDENTITY";

    /// In a process started by [`two_processes_on_one_host_campaign_as_two`]: prints the
    /// process' identity. Otherwise nothing.
    #[test]
    fn print_identity_when_asked() {
        if std::env::var_os(PRINT_IDENTITY).is_some() {
            println!("identity={}", default_identity());
        }
    }

    /// [`default_identity`] as two processes of this test binary on this host see it: two
    /// different identities of the form `HOSTNAME_xxxxxxxx` without `$POD_NAME`, the pod's
    /// name with it.
    #[test]
    fn two_processes_on_one_host_campaign_as_two() {
        let identity_of_a_process = |pod_name: Option<&str>| -> String {
            let exe = std::env::current_exe().unwrap_or_else(|e| panic!("the test binary: {e}"));
            let mut command = std::process::Command::new(exe);
            command
                .args(["--exact", "leader::tests::print_identity_when_asked"])
                .args(["--nocapture", "--test-threads=1"])
                .env(PRINT_IDENTITY, "1");
            match pod_name {
                Some(pod) => command.env(POD_NAME_ENV, pod),
                None => command.env_remove(POD_NAME_ENV),
            };
            let out = command
                .output()
                .unwrap_or_else(|e| panic!("running the test binary: {e}"));
            assert!(out.status.success(), "{out:?}");
            // libtest writes "test NAME ... " on the same line before the test's own output.
            let stdout = String::from_utf8_lossy(&out.stdout);
            stdout
                .split_once("identity=")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .unwrap_or_else(|| panic!("no identity printed: {out:?}"))
                .to_string()
        };
        let (first, second) = (identity_of_a_process(None), identity_of_a_process(None));
        assert_ne!(first, second, "two processes on one host share an identity");
        for identity in [&first, &second] {
            let (host, suffix) = identity
                .rsplit_once('_')
                .unwrap_or_else(|| panic!("{identity} is not HOST_SUFFIX"));
            assert_eq!(host, hostname());
            assert!(
                suffix.len() == 8 && suffix.chars().all(|c| c.is_ascii_hexdigit()),
                "{identity}"
            );
        }
        assert_eq!(identity_of_a_process(Some(" pod-7 ")), "pod-7");
    }
}
