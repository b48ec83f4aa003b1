//! Pure decisions of the backup reconciler: whether a backup is due, the key of each periodic
//! snapshot (CoreOS' naming), which old snapshots retention deletes, and the status each outcome
//! writes. No I/O here; `backup::reconciler` carries them out.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use etcd_shared::schedule::{Schedule, ScheduleError};
use etcd_shared::types::{EtcdBackupSpec, EtcdBackupStatus};

use crate::conditions::{self, Stamp, bounded_message};
use crate::snapshot::DEFAULT_TIMEOUT;
use crate::snapshot::cluster::Success;
use crate::snapshot::keys::interval;

/// Condition type: the latest backup succeeded.
pub const SUCCEEDED: &str = "Succeeded";

/// Condition type: the latest verified snapshot checked (`spec.verify`).
pub const VERIFIED: &str = "Verified";

/// What to do with a backup now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next {
    /// Take a snapshot now.
    TakeNow,
    /// Take a snapshot now for this time of the `schedule` (the latest one due: times missed
    /// while the operator was down are made up once).
    TakeScheduled(Timestamp),
    /// Nothing until then (a periodic backup not yet due).
    WaitFor(Duration),
    /// Nothing until the spec changes (a one-shot backup that succeeded).
    Done,
    /// Nothing until the spec changes: the schedule does not parse (the webhook refuses it).
    BadSchedule(String),
}

/// The backup's cron schedule, if it has one.
pub fn cron(spec: &EtcdBackupSpec) -> Option<Result<Schedule, ScheduleError>> {
    (!spec.schedule.is_empty()).then(|| Schedule::parse(&spec.schedule, &spec.time_zone))
}

/// How long a periodic backup waits at most: its interval, or until its schedule's next time.
pub fn period(spec: &EtcdBackupSpec, now: Timestamp) -> Option<Duration> {
    match cron(spec) {
        Some(Ok(schedule)) => schedule.wait_from(now),
        Some(Err(_)) => None,
        None => interval(spec),
    }
}

/// The whole backup's time limit (`timeoutInSecond`, CoreOS' default 60 s).
pub fn timeout(spec: &EtcdBackupSpec) -> Duration {
    match spec.backup_policy.as_ref().map(|p| p.timeout_in_second) {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs()),
        _ => DEFAULT_TIMEOUT,
    }
}

/// Whether a backup is due: a one-shot backup until it has succeeded for the current spec; a
/// periodic one when its interval has passed since the last success (at once after a spec
/// change or when none succeeded yet). Failures are retried by the reconciler's backoff.
pub fn next(
    spec: &EtcdBackupSpec,
    status: Option<&EtcdBackupStatus>,
    generation: Option<i64>,
    created: Option<Timestamp>,
    now: Timestamp,
) -> Next {
    if let Some(schedule) = cron(spec) {
        return match schedule {
            Ok(schedule) => next_scheduled(&schedule, status, created, now),
            Err(e) => Next::BadSchedule(format!("spec.schedule: {e}")),
        };
    }
    let current =
        status.filter(|s| s.observed_generation.is_some() && s.observed_generation == generation);
    let Some(status) = current else {
        return Next::TakeNow;
    };
    match interval(spec) {
        None if status.succeeded => Next::Done,
        None => Next::TakeNow,
        Some(every) => {
            let Some(last) = status.last_success_date.as_ref() else {
                return Next::TakeNow;
            };
            let elapsed = now.duration_since(last.0);
            let elapsed = Duration::try_from(elapsed).unwrap_or(Duration::ZERO);
            if elapsed >= every {
                Next::TakeNow
            } else {
                Next::WaitFor(every - elapsed)
            }
        }
    }
}

/// A `schedule`'s decision, computed from the schedule alone (never from the last run plus a
/// period): the latest scheduled time after the one the last backup was for (else after the
/// last success, else after the EtcdBackup's creation) and not after `now` is due, once,
/// however many times were missed; otherwise wait for the next time. A failed run leaves the
/// time owed (retried with backoff until a newer time replaces it).
pub fn next_scheduled(
    schedule: &Schedule,
    status: Option<&EtcdBackupStatus>,
    created: Option<Timestamp>,
    now: Timestamp,
) -> Next {
    let since = status
        .and_then(|s| {
            s.last_schedule_time
                .as_ref()
                .or(s.last_success_date.as_ref())
        })
        .map(|t| t.0)
        .or(created)
        .unwrap_or(now);
    if let Some(due) = schedule.latest_in(since, now) {
        return Next::TakeScheduled(due);
    }
    match schedule.wait_from(now) {
        Some(wait) => Next::WaitFor(wait),
        None => Next::Done,
    }
}

/// A status with the times of a `schedule`: the time this backup was for and the next one.
pub fn with_schedule_times(
    mut status: EtcdBackupStatus,
    schedule: &Schedule,
    scheduled: Timestamp,
    now: Timestamp,
) -> EtcdBackupStatus {
    status.last_schedule_time = Some(Time(scheduled));
    status.next_schedule_time = schedule.next_after(now.max(scheduled)).map(Time);
    status
}

/// The status after a successful backup.
pub fn succeeded(
    old: Option<&EtcdBackupStatus>,
    success: &Success,
    generation: Option<i64>,
    now: Timestamp,
) -> EtcdBackupStatus {
    let at = Time(now);
    let message = format!(
        "snapshot of revision {} ({} bytes, etcd {}) written to {} in {:.1} s",
        success.revision,
        success.size,
        success.etcd_version,
        success.path,
        success.took.as_secs_f64()
    );
    EtcdBackupStatus {
        succeeded: true,
        reason: None,
        etcd_version: Some(success.etcd_version.clone()),
        etcd_revision: Some(success.revision),
        last_success_date: Some(at.clone()),
        last_backup_path: Some(success.path.clone()),
        last_backup_size: i64::try_from(success.size).ok(),
        last_backup_sha256: Some(success.sha256.clone()),
        conditions: with_condition(
            old,
            Stamp::new(generation, now).condition(SUCCEEDED, true, "BackupSucceeded", message),
        ),
        last_schedule_time: old.and_then(|o| o.last_schedule_time.clone()),
        next_schedule_time: old.and_then(|o| o.next_schedule_time.clone()),
        observed_generation: generation,
        backup_count: Some(
            old.and_then(|o| o.backup_count)
                .unwrap_or(0)
                .saturating_add(1),
        ),
        last_verification: old.and_then(|o| o.last_verification.clone()),
        continuous: old.and_then(|o| o.continuous.clone()),
    }
}

/// The status after a failed backup: what the last success recorded is kept, CoreOS' `Reason`
/// says why this one failed.
pub fn failed(
    old: Option<&EtcdBackupStatus>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> EtcdBackupStatus {
    let mut status = old.cloned().unwrap_or_default();
    status.succeeded = false;
    // One bounded line: a store's answer can be a multi-line XML document.
    let message = bounded_message(message.to_string());
    status.reason = Some(format!("{reason}: {message}"));
    let failed = Stamp::new(generation, now).condition(SUCCEEDED, false, reason, message);
    status.conditions = with_condition(old, failed);
    status.observed_generation = generation;
    status
}

fn with_condition(old: Option<&EtcdBackupStatus>, new: Condition) -> Vec<Condition> {
    let mut list = vec![new];
    // The latest verification's condition stays until the next verification replaces it.
    let verified = old.and_then(|o| o.conditions.iter().find(|c| c.type_ == VERIFIED));
    list.extend(verified.cloned());
    if let Some(old) = old {
        conditions::carry_transition_times(&mut list, &old.conditions);
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use etcd_shared::types::BackupPolicy;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    fn spec(interval: i64) -> EtcdBackupSpec {
        EtcdBackupSpec {
            backup_policy: (interval > 0).then(|| BackupPolicy {
                backup_interval_in_second: interval,
                ..BackupPolicy::default()
            }),
            ..EtcdBackupSpec::default()
        }
    }

    fn status(generation: i64, succeeded: bool, last: Option<&str>) -> EtcdBackupStatus {
        EtcdBackupStatus {
            succeeded,
            last_success_date: last.map(|t| Time(at(t))),
            observed_generation: Some(generation),
            ..EtcdBackupStatus::default()
        }
    }

    #[test]
    fn when_a_backup_is_due() {
        let now = at("2026-12-04T12:00:00Z");
        let cases: Vec<(&str, EtcdBackupSpec, Option<EtcdBackupStatus>, Next)> = vec![
            ("new one-shot", spec(0), None, Next::TakeNow),
            (
                "one-shot done",
                spec(0),
                Some(status(1, true, Some("2026-12-04T11:00:00Z"))),
                Next::Done,
            ),
            (
                "one-shot failed: retried",
                spec(0),
                Some(status(1, false, None)),
                Next::TakeNow,
            ),
            (
                "one-shot, spec changed",
                spec(0),
                Some(status(0, true, Some("2026-12-04T11:00:00Z"))),
                Next::TakeNow,
            ),
            (
                "periodic, none yet",
                spec(600),
                Some(status(1, false, None)),
                Next::TakeNow,
            ),
            (
                "periodic, not due",
                spec(600),
                Some(status(1, true, Some("2026-12-04T11:55:00Z"))),
                Next::WaitFor(Duration::from_secs(300)),
            ),
            (
                "periodic, due",
                spec(600),
                Some(status(1, true, Some("2026-12-04T11:50:00Z"))),
                Next::TakeNow,
            ),
            (
                "periodic, failed since its last success: waits out the interval",
                spec(600),
                Some(status(1, false, Some("2026-12-04T11:59:00Z"))),
                Next::WaitFor(Duration::from_secs(540)),
            ),
            (
                "periodic, last success in the future (clock moved back)",
                spec(600),
                Some(status(1, true, Some("2026-12-04T12:30:00Z"))),
                Next::WaitFor(Duration::from_secs(600)),
            ),
        ];
        for (name, spec, status, want) in cases {
            assert_eq!(
                next(&spec, status.as_ref(), Some(1), None, now),
                want,
                "{name}"
            );
        }
    }

    fn cron_spec(expression: &str, zone: &str) -> EtcdBackupSpec {
        EtcdBackupSpec {
            schedule: expression.into(),
            time_zone: zone.into(),
            ..EtcdBackupSpec::default()
        }
    }

    fn scheduled_status(last: &str) -> EtcdBackupStatus {
        EtcdBackupStatus {
            succeeded: true,
            last_schedule_time: Some(Time(at(last))),
            last_success_date: Some(Time(at(last))),
            observed_generation: Some(1),
            ..EtcdBackupStatus::default()
        }
    }

    /// Plays the reconciler: from `start` to `end`, a decision every `step` while the
    /// operator is up (`down` says when it is not); each backup is written at once and
    /// recorded. Returns the scheduled times taken and when.
    fn play(
        spec: &EtcdBackupSpec,
        created: &str,
        start: &str,
        end: &str,
        down: &dyn Fn(Timestamp) -> bool,
    ) -> Vec<(Timestamp, Timestamp)> {
        let (mut now, end) = (at(start), at(end));
        let mut status: Option<EtcdBackupStatus> = None;
        let mut taken = Vec::new();
        let schedule = cron(spec).expect("a schedule").expect("parses");
        while now <= end {
            if !down(now)
                && let Next::TakeScheduled(due) =
                    next(spec, status.as_ref(), Some(1), Some(at(created)), now)
            {
                taken.push((due, now));
                let mut s = status.clone().unwrap_or_default();
                s.succeeded = true;
                s.last_success_date = Some(Time(now));
                status = Some(with_schedule_times(s, &schedule, due, now));
            }
            now = etcd_shared::schedule::plus_minutes(now, 1);
        }
        taken
    }

    #[test]
    fn a_schedule_runs_on_its_times_and_makes_up_missed_ones_once() {
        let spec = cron_spec("*/10 * * * *", "");
        let now = at("2026-12-04T12:07:00Z");
        // Created at 12:03: nothing until 12:10 (as a CronJob: no run at creation).
        assert_eq!(
            next(&spec, None, Some(1), Some(at("2026-12-04T12:03:00Z")), now),
            Next::WaitFor(Duration::from_secs(180))
        );
        // Last taken for 12:00: 12:10 is next.
        let last = scheduled_status("2026-12-04T12:00:00Z");
        assert_eq!(
            next(&spec, Some(&last), Some(1), None, now),
            Next::WaitFor(Duration::from_secs(180))
        );
        // Down from 12:05 to 13:02: five times missed, the latest (13:00) taken once.
        let late = at("2026-12-04T13:02:30Z");
        let owed = next(&spec, Some(&last), Some(1), None, late);
        assert_eq!(owed, Next::TakeScheduled(at("2026-12-04T13:00:00Z")));
        let schedule = cron(&spec).unwrap().unwrap();
        let after = with_schedule_times(last.clone(), &schedule, at("2026-12-04T13:00:00Z"), late);
        assert_eq!(
            after.next_schedule_time,
            Some(Time(at("2026-12-04T13:10:00Z"))),
            "the next time comes from the schedule, not from the run plus ten minutes"
        );
        assert_eq!(
            next(&spec, Some(&after), Some(1), None, late),
            Next::WaitFor(Duration::from_secs(450)),
            "no burst: the other missed times are not taken"
        );
        // A failed run leaves its time owed: the status keeps the old schedule time.
        let failed = failed(Some(&last), "StoreFailed", "x", Some(1), late);
        assert_eq!(
            next(&spec, Some(&failed), Some(1), None, late),
            Next::TakeScheduled(at("2026-12-04T13:00:00Z"))
        );
        // A spec change does not take one at once (unlike an interval backup).
        assert!(matches!(
            next(&spec, Some(&after), Some(2), None, late),
            Next::WaitFor(_)
        ));
        // A bad schedule (past the webhook) waits for a change.
        assert!(matches!(
            next(&cron_spec("0 3 * *", ""), None, Some(1), None, now),
            Next::BadSchedule(m) if m.starts_with("spec.schedule: ")
        ));

        // A whole day every minute with the operator down 10:00-10:45: one run per time when
        // up, one for 10:45 on return, none for the 44 others.
        let taken = play(
            &cron_spec("0,15,30,45 * * * *", ""),
            "2026-12-03T23:59:00Z",
            "2026-12-04T00:00:00Z",
            "2026-12-04T23:59:00Z",
            &|t| t >= at("2026-12-04T10:00:00Z") && t < at("2026-12-04T10:46:00Z"),
        );
        assert_eq!(taken.len(), 96 - 3, "{taken:?}");
        assert!(taken.iter().all(|(due, when)| due <= when));
        let made_up: Vec<_> = taken.iter().filter(|(due, when)| due != when).collect();
        assert_eq!(
            made_up,
            [&(at("2026-12-04T10:45:00Z"), at("2026-12-04T10:46:00Z"))]
        );
    }

    #[test]
    fn daylight_saving_changes_in_the_zone() {
        // Europe/Berlin: 2026-03-29 02:00 CET -> 03:00 CEST; 2026-10-25 03:00 CEST -> 02:00 CET.
        let spec = cron_spec("30 2 * * *", "Europe/Berlin");
        let spring = play(
            &spec,
            "2026-03-27T00:00:00Z",
            "2026-03-27T00:00:00Z",
            "2026-03-31T00:00:00Z",
            &|_| false,
        );
        let dues: Vec<Timestamp> = spring.iter().map(|(d, _)| *d).collect();
        assert_eq!(
            dues,
            [
                at("2026-03-27T01:30:00Z"), // 02:30 CET
                at("2026-03-28T01:30:00Z"),
                at("2026-03-29T01:00:00Z"), // 02:30 does not exist: 03:00 CEST, once
                at("2026-03-30T00:30:00Z"), // 02:30 CEST
            ]
        );
        let autumn = play(
            &spec,
            "2026-10-24T00:00:00Z",
            "2026-10-24T00:00:00Z",
            "2026-10-27T00:00:00Z",
            &|_| false,
        );
        let dues: Vec<Timestamp> = autumn.iter().map(|(d, _)| *d).collect();
        assert_eq!(
            dues,
            [
                at("2026-10-24T00:30:00Z"), // 02:30 CEST
                at("2026-10-25T00:30:00Z"), // 02:30 happens twice: the first, once
                at("2026-10-26T01:30:00Z"), // 02:30 CET
            ]
        );
        // Down over the spring change, back on the 30th at 12:00: one run for the 30th only.
        let back = scheduled_status("2026-03-28T01:30:00Z");
        assert_eq!(
            next(
                &spec,
                Some(&back),
                Some(1),
                None,
                at("2026-03-30T10:00:00Z")
            ),
            Next::TakeScheduled(at("2026-03-30T00:30:00Z"))
        );
        // Hourly across the autumn change: 25 runs in the 25-hour day, an hour apart.
        let hourly = play(
            &cron_spec("0 * * * *", "Europe/Berlin"),
            "2026-10-24T21:59:00Z",
            "2026-10-24T22:00:00Z",
            "2026-10-25T22:59:00Z",
            &|_| false,
        );
        assert_eq!(hourly.len(), 25, "{hourly:?}");
        assert!(
            hourly
                .windows(2)
                .all(|w| w[1].0.duration_since(w[0].0).as_secs() == 3600)
        );
    }

    #[test]
    fn statuses_record_the_outcome() {
        let now = at("2026-12-04T12:00:00Z");
        let ok = Success {
            path: "b/k".into(),
            etcd_version: "3.6.16".into(),
            revision: 42,
            size: 1056,
            sha256: "ab".repeat(32),
            took: Duration::from_millis(1500),
            source: None,
        };
        let s = succeeded(None, &ok, Some(3), now);
        assert!(s.succeeded && s.reason.is_none());
        assert_eq!(s.etcd_revision, Some(42));
        assert_eq!(s.last_backup_size, Some(1056));
        assert_eq!(s.conditions[0].status, "True");
        assert_eq!(s.observed_generation, Some(3));

        let later = at("2026-12-04T12:10:00Z");
        let f = failed(
            Some(&s),
            "StoreFailed",
            "connection refused",
            Some(3),
            later,
        );
        assert!(!f.succeeded);
        assert_eq!(f.reason.as_deref(), Some("StoreFailed: connection refused"));
        assert_eq!(
            f.last_success_date, s.last_success_date,
            "the last success is kept"
        );
        assert_eq!(f.conditions[0].status, "False");
        assert_eq!(f.conditions[0].last_transition_time, Time(later));
        let f2 = failed(
            Some(&f),
            "StoreFailed",
            "again",
            Some(3),
            at("2026-12-04T12:20:00Z"),
        );
        assert_eq!(
            f2.conditions[0].last_transition_time,
            Time(later),
            "no transition"
        );
    }
}
