//! The lifecycle of a one-shot claim pod (a PVC backup's `NAME-backup`, an EtcdRestore's
//! `NAME-verify`), the same for both: created when missing, left alone while it is deleted or
//! runs, timed out, its report read once it finished, and deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::DeleteParams;

use super::error::BackupError;
use crate::error::Error;
use crate::idempotent;
use crate::in_pod::pod_report::{PodOutcome, PodReport};
use crate::snapshot::error::SnapshotError;

/// Time a claim pod gets beyond its timeout to be scheduled and started.
pub const START_GRACE: Duration = Duration::from_secs(60);

/// Whether a pod created at `created` has run out of time at `now`.
pub fn timed_out(created: Option<Timestamp>, limit: Duration, now: Timestamp) -> bool {
    let Some(created) = created else {
        return false;
    };
    let age = Duration::try_from(now.duration_since(created)).unwrap_or(Duration::ZERO);
    age > limit + START_GRACE
}

/// One look at the claim pod `name` (of a backup, or of a restore's check): `None` while it
/// is created (by `create`, when there is none), deleted or running; once it finished, or ran
/// longer than `limit` plus [`START_GRACE`], it is deleted and its report (or why it failed)
/// is the outcome.
pub(crate) async fn look(
    pods: &Api<Pod>,
    name: &str,
    limit: Duration,
    now: Timestamp,
    create: impl Future<Output = Result<(), BackupError>>,
) -> Result<Option<Result<(Pod, PodReport), BackupError>>, BackupError> {
    let Some(pod) = pods
        .get_opt(name)
        .await
        .map_err(Error::kube(format!("get pod {name}")))?
    else {
        create.await?;
        return Ok(None);
    };
    if pod.metadata.deletion_timestamp.is_some() {
        return Ok(None);
    }
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0);
    let outcome = match PodOutcome::of(&pod) {
        PodOutcome::Running if timed_out(created, limit, now) => {
            Err(SnapshotError::Timeout(limit).into())
        }
        PodOutcome::Running => return Ok(None),
        PodOutcome::Failed(reason, message) => Err(BackupError::Pod(reason, message)),
        PodOutcome::Succeeded(report) => Ok((pod, report)),
    };
    // Deleted once read (gone already is fine).
    let background = DeleteParams::background();
    idempotent::delete(pods, name, &background, format!("pod {name}")).await?;
    Ok(Some(outcome))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_times_out_after_the_backup_timeout_and_the_start_grace() {
        let created: Timestamp = "2026-01-01T00:00:00Z".parse().expect("time");
        let at = |s: i64| created + k8s_openapi::jiff::SignedDuration::from_secs(s);
        let limit = Duration::from_secs(60);
        assert!(!timed_out(Some(created), limit, at(119)));
        assert!(!timed_out(Some(created), limit, at(120)));
        assert!(timed_out(Some(created), limit, at(121)));
        assert!(!timed_out(None, limit, at(10_000)));
    }
}
