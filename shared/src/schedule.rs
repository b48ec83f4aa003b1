//! The cron schedule of an EtcdBackup (`spec.schedule` in `spec.timeZone`): parsed once here,
//! for the webhook's refusals and the controller's times alike.
//!
//! Why croner: it parses the five-field expressions of cron and Kubernetes' CronJob (ranges,
//! steps, names, `@daily` and the like), works on jiff's zoned times (jiff is already in the
//! workspace through k8s-openapi, so no chrono or chrono-tz), and follows vixie cron and the
//! Open Cron Pattern Specification on daylight saving changes: a fixed time in the skipped hour
//! runs at the first minute after it, a time in the repeated hour once.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::{Timestamp, ToSpan as _, Zoned, tz::TimeZone};

/// A backup schedule: a cron expression in a time zone.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
    zone: TimeZone,
}

/// Why a schedule or a time zone is refused; each message names what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// The expression does not parse (or never matches).
    #[error("{0}")]
    Expression(String),
    /// The time zone is unknown.
    #[error("{0}")]
    TimeZone(String),
}

/// The time zone named `name` (an IANA name such as `Europe/Berlin`); blank is UTC.
pub fn time_zone(name: &str) -> Result<TimeZone, ScheduleError> {
    if name.is_empty() {
        return Ok(TimeZone::UTC);
    }
    // jiff also takes POSIX TZ strings and file paths through other calls; names only here.
    TimeZone::get(name).map_err(|_| {
        ScheduleError::TimeZone(format!(
            "is not a time zone of the IANA database (such as \"Europe/Berlin\", \"America/New_York\" or \"UTC\"), got {name:?}"
        ))
    })
}

impl Schedule {
    /// Parses `expression` (five fields) in the zone `zone` (blank: UTC).
    pub fn parse(expression: &str, zone: &str) -> Result<Schedule, ScheduleError> {
        let zone = time_zone(zone)?;
        let fields = expression.split_whitespace().count();
        let nickname = expression.trim_start().starts_with('@');
        if !nickname && fields != 5 {
            return Err(ScheduleError::Expression(format!(
                "must be a cron expression of five fields (minute hour day-of-month month day-of-week, such as \"0 3 * * *\"), got {fields} field{} in {expression:?}",
                if fields == 1 { "" } else { "s" }
            )));
        }
        let parser = CronParser::builder()
            .seconds(Seconds::Disallowed)
            .year(Year::Disallowed)
            .build();
        let cron = parser.parse(expression).map_err(|e| {
            ScheduleError::Expression(format!(
                "is not a cron expression of five fields (minute hour day-of-month month day-of-week, such as \"0 3 * * *\"): {e} (in {expression:?})"
            ))
        })?;
        let schedule = Schedule { cron, zone };
        // An expression that names no real day (such as 30 February) never runs.
        let from: Timestamp = "2024-01-01T00:00:00Z".parse().expect("a fixed time");
        if schedule.next_after(from).is_none() {
            return Err(ScheduleError::Expression(format!(
                "never matches a time (no such day in any year?): {expression:?}"
            )));
        }
        Ok(schedule)
    }

    /// The zone the schedule is read in.
    pub fn zone(&self) -> &TimeZone {
        &self.zone
    }

    /// The first scheduled time strictly after `t`.
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let at = t.to_zoned(self.zone.clone());
        self.cron
            .find_next_occurrence(&at, false)
            .ok()
            .map(|z: Zoned| z.timestamp())
    }

    /// The latest scheduled time in `(after, until]`, if any: what is owed at `until` when the
    /// last backup was for `after` (one time however many were missed).
    pub fn latest_in(&self, after: Timestamp, until: Timestamp) -> Option<Timestamp> {
        if until <= after {
            return None;
        }
        let at = until.to_zoned(self.zone.clone());
        let latest = self
            .cron
            .find_previous_occurrence(&at, true)
            .ok()
            .map(|z: Zoned| z.timestamp())?;
        if latest > after {
            return Some(latest);
        }
        // croner's backward search may stop short of a far time; check forward from `after`.
        self.next_after(after).filter(|t| *t <= until)
    }

    /// The duration from `now` to the next scheduled time (at least a second).
    pub fn wait_from(&self, now: Timestamp) -> Option<std::time::Duration> {
        let next = self.next_after(now)?;
        let span = next.duration_since(now);
        let wait = std::time::Duration::try_from(span).unwrap_or_default();
        Some(wait.max(std::time::Duration::from_secs(1)))
    }
}

/// A zoned civil time `y-m-d h:m` in `zone`, the earlier of two when the hour repeats; for
/// tests.
pub fn civil(zone: &str, y: i16, m: i8, d: i8, h: i8, min: i8) -> Timestamp {
    let zone = TimeZone::get(zone).expect("a known zone");
    let dt = jiff::civil::date(y, m, d).at(h, min, 0, 0);
    zone.to_ambiguous_zoned(dt)
        .earlier()
        .expect("a valid time")
        .timestamp()
}

/// `t` plus `minutes`; for tests.
pub fn plus_minutes(t: Timestamp, minutes: i64) -> Timestamp {
    t.checked_add(minutes.minutes()).expect("in range")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn expressions_and_zones_are_checked() {
        assert!(Schedule::parse("0 3 * * *", "Europe/Berlin").is_ok());
        assert!(Schedule::parse("*/15 * * * MON-FRI", "").is_ok());
        assert!(Schedule::parse("@daily", "UTC").is_ok());
        let e = Schedule::parse("0 0 3 * * *", "").unwrap_err().to_string();
        assert!(
            e.contains("five fields") && e.contains("got 6 fields"),
            "{e}"
        );
        let e = Schedule::parse("61 * * * *", "").unwrap_err().to_string();
        assert!(e.contains("is not a cron expression"), "{e}");
        let e = Schedule::parse("0 0 30 2 *", "").unwrap_err().to_string();
        assert!(e.contains("never matches"), "{e}");
        let e = Schedule::parse("0 3 * * *", "Europe/Berlim")
            .unwrap_err()
            .to_string();
        assert!(e.contains("IANA") && e.contains("Europe/Berlim"), "{e}");
    }

    #[test]
    fn times_follow_the_zone() {
        let s = Schedule::parse("0 3 * * *", "Europe/Berlin").unwrap();
        // 03:00 in Berlin is 02:00 UTC in winter.
        assert_eq!(
            s.next_after(at("2026-01-10T12:00:00Z")),
            Some(at("2026-01-11T02:00:00Z"))
        );
        assert_eq!(
            s.latest_in(at("2026-01-08T02:00:00Z"), at("2026-01-10T12:00:00Z")),
            Some(at("2026-01-10T02:00:00Z")),
            "the latest of three missed times"
        );
        assert_eq!(
            s.latest_in(at("2026-01-10T02:00:00Z"), at("2026-01-10T12:00:00Z")),
            None
        );
        assert_eq!(
            civil("Europe/Berlin", 2026, 1, 10, 3, 0),
            at("2026-01-10T02:00:00Z")
        );
    }
}
