//! The keys (file names) of snapshots in a bucket or a claim, as CoreOS' operator wrote them,
//! and retention: pure functions, shared by the backup controller, the pods that write PVC
//! backups and the search for a recovery's newest backup.

use std::time::Duration;

use k8s_openapi::jiff::{Timestamp, civil::DateTime, tz::TimeZone};

use etcd_shared::types::{EtcdBackupSpec, Retention};

/// The interval of a periodic backup; `None` for a one-shot one.
pub fn interval(spec: &EtcdBackupSpec) -> Option<Duration> {
    let seconds = spec.backup_policy.as_ref()?.backup_interval_in_second;
    (seconds > 0).then(|| Duration::from_secs(seconds.unsigned_abs()))
}

/// Whether a backup is periodic: CoreOS' `backupIntervalInSecond` or this operator's cron
/// `schedule`. Periodic snapshots get [`snapshot_key`]'s dated keys and are pruned.
pub fn is_periodic(spec: &EtcdBackupSpec) -> bool {
    interval(spec).is_some() || !spec.schedule.is_empty()
}

/// CoreOS' time layout in periodic keys, Go's `2006-01-02-15:04:05`, in UTC.
fn key_time(at: Timestamp) -> String {
    at.to_zoned(TimeZone::UTC)
        .strftime("%Y-%m-%d-%H:%M:%S")
        .to_string()
}

/// The key of a snapshot: the path's key for a one-shot backup; for a periodic one, CoreOS'
/// `KEY_v<revision>_<2006-01-02-15:04:05>`.
pub fn snapshot_key(key: &str, periodic: bool, revision: i64, at: Timestamp) -> String {
    if periodic {
        format!("{key}_v{revision}_{}", key_time(at))
    } else {
        key.to_string()
    }
}

/// A periodic snapshot found in the bucket.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Periodic {
    time: String,
    revision: i64,
    key: String,
}

/// Reads a key written by [`snapshot_key`] for `prefix`; `None` for any other object.
fn parse_periodic(prefix: &str, key: &str) -> Option<Periodic> {
    let rest = key.strip_prefix(prefix)?.strip_prefix("_v")?;
    let (revision, time) = rest.split_once('_')?;
    let revision: i64 = revision.parse().ok()?;
    // 2006-01-02-15:04:05: digits where Go's layout has digits, its separators elsewhere.
    let layout = "0000-00-00-00:00:00";
    let ok = time.len() == layout.len()
        && time.bytes().zip(layout.bytes()).all(|(c, l)| {
            if l == b'0' {
                c.is_ascii_digit()
            } else {
                c == l
            }
        });
    ok.then(|| Periodic {
        time: time.to_string(),
        revision,
        key: key.to_string(),
    })
}

/// The periodic snapshots of `prefix` among `keys`, newest first: `(time, key)`, the time as
/// the key writes it (`2006-01-02-15:04:05`, UTC), which sorts as time does.
pub fn periodic_snapshots(prefix: &str, keys: &[String]) -> Vec<(String, String)> {
    let mut found: Vec<Periodic> = keys
        .iter()
        .filter_map(|k| parse_periodic(prefix, k))
        .collect();
    found.sort_by(|a, b| b.cmp(a));
    found.into_iter().map(|p| (p.time, p.key)).collect()
}

/// The periodic snapshots of `prefix` among `keys`: `(revision, key)` (the revision the key
/// names), in no particular order.
pub fn periodic_revisions(prefix: &str, keys: &[String]) -> Vec<(i64, String)> {
    keys.iter()
        .filter_map(|k| parse_periodic(prefix, k))
        .map(|p| (p.revision, p.key))
        .collect()
}

/// A time as periodic snapshot keys and [`periodic_snapshots`] write it.
pub fn sortable_time(at: Timestamp) -> String {
    key_time(at)
}

/// Whether `key` is a periodic snapshot of `prefix` (as [`snapshot_key`] names them).
pub fn is_periodic_of(prefix: &str, key: &str) -> bool {
    parse_periodic(prefix, key).is_some()
}

/// The keys retention deletes: of the periodic snapshots of `prefix` among `keys` (other
/// objects are never touched), all but the newest `max_backups`, oldest first; `keep` (the
/// snapshot just written) is never one of them. `max_backups` 0 keeps all.
pub fn expired(prefix: &str, keys: &[String], max_backups: i64, keep: &str) -> Vec<String> {
    if max_backups <= 0 {
        return Vec::new();
    }
    let mut found: Vec<Periodic> = keys
        .iter()
        .filter_map(|k| parse_periodic(prefix, k))
        .collect();
    // Newest first: by time, then revision.
    found.sort_by(|a, b| b.cmp(a));
    let max = usize::try_from(max_backups).unwrap_or(usize::MAX);
    let mut kept = 0usize;
    let mut doomed = Vec::new();
    // The one just written counts first, whatever its place.
    if found.iter().any(|p| p.key == keep) {
        kept += 1;
    }
    for p in found {
        if p.key == keep {
            continue;
        }
        if kept < max {
            kept += 1;
        } else {
            doomed.push(p.key);
        }
    }
    doomed.reverse();
    doomed
}

/// Which old periodic snapshots go after a backup: the object stores' and the claim pod's
/// retention alike.
#[derive(Debug, Clone)]
pub enum Pruning {
    /// CoreOS' `maxBackups`: all but the newest N (0 keeps all), [`expired`].
    MaxBackups(i64),
    /// `spec.retention`, grandfather-father-son in the backup's time zone,
    /// [`expired_by_retention`].
    Retention(Retention, TimeZone),
}

impl Pruning {
    /// The rule of a periodic backup's spec: `retention` (in `timeZone`) if set, else
    /// `maxBackups`; an unknown zone (past the webhook) is an error.
    pub fn of(spec: &EtcdBackupSpec) -> Result<Pruning, etcd_shared::schedule::ScheduleError> {
        match &spec.retention {
            Some(policy) => Ok(Pruning::Retention(
                policy.clone(),
                etcd_shared::schedule::time_zone(&spec.time_zone)?,
            )),
            None => Ok(Pruning::MaxBackups(
                spec.backup_policy.as_ref().map_or(0, |p| p.max_backups),
            )),
        }
    }

    /// Whether the rule deletes nothing whatever the keys.
    pub fn keeps_all(&self) -> bool {
        match self {
            Pruning::MaxBackups(max) => *max <= 0,
            Pruning::Retention(policy, _) => policy.is_empty(),
        }
    }

    /// The keys the rule deletes, oldest first (never `keep`, never another prefix's).
    pub fn expired(&self, prefix: &str, keys: &[String], keep: &str) -> Vec<String> {
        match self {
            Pruning::MaxBackups(max) => expired(prefix, keys, *max, keep),
            Pruning::Retention(policy, zone) => {
                expired_by_retention(prefix, keys, policy, zone, keep)
            }
        }
    }

    /// The spec field that decides, for logs and messages.
    pub fn field(&self) -> &'static str {
        match self {
            Pruning::MaxBackups(_) => "maxBackups",
            Pruning::Retention(..) => "retention",
        }
    }
}

/// The time a periodic key carries (UTC, to the second).
fn key_timestamp(time: &str) -> Option<Timestamp> {
    let civil = DateTime::strptime("%Y-%m-%d-%H:%M:%S", time).ok()?;
    civil.to_zoned(TimeZone::UTC).ok().map(|z| z.timestamp())
}

/// Grandfather-father-son retention (`spec.retention`): the keys it deletes among the periodic
/// snapshots of `prefix` in `keys` (other objects are never touched), oldest first. The
/// snapshots are taken newest first (by time, then revision); `keepLast` keeps the first N,
/// and each of `keepHourly`, `keepDaily`, `keepWeekly` (ISO weeks) and `keepMonthly` keeps the
/// newest snapshot of each of the N newest distinct hours, days, weeks or months in `zone`
/// that have one (restic's `--keep-*`). A snapshot kept by any rule is kept; `keep` (the one
/// just written) always is. A policy that keeps nothing deletes nothing.
pub fn expired_by_retention(
    prefix: &str,
    keys: &[String],
    policy: &Retention,
    zone: &TimeZone,
    keep: &str,
) -> Vec<String> {
    if policy.is_empty() {
        return Vec::new();
    }
    let mut found: Vec<(Periodic, Timestamp)> = keys
        .iter()
        .filter_map(|k| parse_periodic(prefix, k))
        .filter_map(|p| key_timestamp(&p.time).map(|t| (p, t)))
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    let times: Vec<Timestamp> = found.iter().map(|(_, t)| *t).collect();
    let kept = gfs_kept(&times, policy, zone);
    let mut doomed: Vec<String> = found
        .into_iter()
        .enumerate()
        .filter(|(i, (p, _))| !kept[*i] && p.key != keep)
        .map(|(_, (p, _))| p.key)
        .collect();
    doomed.reverse();
    doomed
}

/// Which of `times` (newest first) grandfather-father-son retention keeps.
pub fn gfs_kept(times: &[Timestamp], policy: &Retention, zone: &TimeZone) -> Vec<bool> {
    let mut kept = vec![false; times.len()];
    let count = |n: i64| usize::try_from(n).unwrap_or(0);
    for k in kept.iter_mut().take(count(policy.keep_last)) {
        *k = true;
    }
    let zoned: Vec<_> = times.iter().map(|t| t.to_zoned(zone.clone())).collect();
    let bucket = |unit: u8, i: usize| -> (i32, i32, i32, i32) {
        let z = &zoned[i];
        let (y, m, d, h) = (
            i32::from(z.year()),
            i32::from(z.month()),
            i32::from(z.day()),
            i32::from(z.hour()),
        );
        match unit {
            0 => (y, m, d, h),
            1 => (y, m, d, 0),
            2 => {
                let week = z.date().iso_week_date();
                (i32::from(week.year()), i32::from(week.week()), 0, 0)
            }
            _ => (y, m, 0, 0),
        }
    };
    for (unit, n) in [
        (0u8, policy.keep_hourly),
        (1, policy.keep_daily),
        (2, policy.keep_weekly),
        (3, policy.keep_monthly),
    ] {
        let n = count(n);
        let mut last = None;
        let mut taken = 0usize;
        for (i, k) in kept.iter_mut().enumerate() {
            if taken >= n {
                break;
            }
            let b = bucket(unit, i);
            if last != Some(b) {
                *k = true;
                last = Some(b);
                taken += 1;
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("a timestamp")
    }

    #[test]
    fn periodic_keys_follow_coreos_and_retention_deletes_the_oldest() {
        let t = at("2026-01-02T15:04:05Z");
        assert_eq!(snapshot_key("c/snap.db", false, 7, t), "c/snap.db");
        assert_eq!(
            snapshot_key("c/snap.db", true, 7, t),
            "c/snap.db_v7_2026-01-02-15:04:05"
        );
        let keys: Vec<String> = [
            "c/snap.db_v10_2026-01-02-15:00:00",
            "c/snap.db_v30_2026-01-02-15:02:00",
            "c/snap.db_v20_2026-01-02-15:01:00",
            "c/snap.db_v40_2026-01-02-15:03:00",
            "c/snap.db",                         // the one-shot object: never touched
            "c/snap.db_v5_yesterday",            // not ours
            "c/snap.dbx_v1_2026-01-02-14:00:00", // another prefix
            "c/snap.db_vX_2026-01-02-14:00:00",  // not a revision
        ]
        .map(String::from)
        .to_vec();
        let keep = "c/snap.db_v40_2026-01-02-15:03:00";
        assert_eq!(
            expired("c/snap.db", &keys, 2, keep),
            vec![
                "c/snap.db_v10_2026-01-02-15:00:00".to_string(),
                "c/snap.db_v20_2026-01-02-15:01:00".to_string()
            ]
        );
        assert!(
            expired("c/snap.db", &keys, 0, keep).is_empty(),
            "0 keeps all"
        );
        assert!(expired("c/snap.db", &keys, 10, keep).is_empty());
        // The snapshot just written is kept even when the clock makes it look oldest.
        let old_keep = "c/snap.db_v10_2026-01-02-15:00:00";
        let doomed = expired("c/snap.db", &keys, 1, old_keep);
        assert!(!doomed.contains(&old_keep.to_string()));
        assert_eq!(doomed.len(), 3);
    }

    /// Keys of `prefix` for the given UTC times (`YYYY-MM-DDTHH:MM`), revisions rising.
    fn keys_at(times: &[&str]) -> Vec<String> {
        times
            .iter()
            .enumerate()
            .map(|(i, t)| snapshot_key("c/s.db", true, 10 + i as i64, at(&format!("{t}:00Z"))))
            .collect()
    }

    fn policy(last: i64, hourly: i64, daily: i64, weekly: i64, monthly: i64) -> Retention {
        Retention {
            keep_last: last,
            keep_hourly: hourly,
            keep_daily: daily,
            keep_weekly: weekly,
            keep_monthly: monthly,
        }
    }

    /// The times (of `keys_at`'s keys) that survive.
    fn survivors(times: &[&str], p: &Retention, zone: &str) -> Vec<String> {
        let keys = keys_at(times);
        let keep = keys.last().cloned().unwrap_or_default();
        let zone = TimeZone::get(zone).expect("zone");
        let doomed = expired_by_retention("c/s.db", &keys, p, &zone, &keep);
        keys.iter()
            .zip(times)
            .filter(|(k, _)| !doomed.contains(k))
            .map(|(_, t)| t.to_string())
            .collect()
    }

    #[test]
    fn grandfather_father_son_keeps_the_newest_of_each_period() {
        // Hourly backups over three days, the last one at 2026-03-04T10:00Z (a Wednesday).
        let mut times: Vec<String> = Vec::new();
        for day in 2..=4 {
            for hour in 0..24 {
                if day == 4 && hour > 10 {
                    break;
                }
                times.push(format!("2026-03-{day:02}T{hour:02}:00"));
            }
        }
        let times: Vec<&str> = times.iter().map(String::as_str).collect();
        // keepLast 2 + keepHourly 3: the last three hours (two of them also the last two).
        assert_eq!(
            survivors(&times, &policy(2, 3, 0, 0, 0), "UTC"),
            ["2026-03-04T08:00", "2026-03-04T09:00", "2026-03-04T10:00"]
        );
        // keepDaily 3: the newest of each day.
        assert_eq!(
            survivors(&times, &policy(0, 0, 3, 0, 0), "UTC"),
            ["2026-03-02T23:00", "2026-03-03T23:00", "2026-03-04T10:00"]
        );
        // Days in Berlin (UTC+1 in March): a day ends at 23:00 UTC.
        assert_eq!(
            survivors(&times, &policy(0, 0, 3, 0, 0), "Europe/Berlin"),
            ["2026-03-02T22:00", "2026-03-03T22:00", "2026-03-04T10:00"]
        );
        // One rule's pick counts once: keepLast 1 and keepDaily 1 keep the same snapshot.
        assert_eq!(
            survivors(&times, &policy(1, 0, 1, 0, 0), "UTC"),
            ["2026-03-04T10:00"]
        );
    }

    #[test]
    fn weeks_and_months_reach_back() {
        // Daily backups at 03:00 UTC from 2026-01-01 to 2026-03-10.
        let mut times: Vec<String> = Vec::new();
        for (month, days) in [(1, 31), (2, 28), (3, 10)] {
            for day in 1..=days {
                times.push(format!("2026-{month:02}-{day:02}T03:00"));
            }
        }
        let times: Vec<&str> = times.iter().map(String::as_str).collect();
        // 2026-03-10 is a Tuesday: weeks start 03-09, 03-02, 02-23 (Mondays).
        assert_eq!(
            survivors(&times, &policy(0, 0, 0, 3, 0), "UTC"),
            ["2026-03-01T03:00", "2026-03-08T03:00", "2026-03-10T03:00"]
        );
        assert_eq!(
            survivors(&times, &policy(0, 0, 0, 0, 3), "UTC"),
            ["2026-01-31T03:00", "2026-02-28T03:00", "2026-03-10T03:00"]
        );
        // Fewer periods than asked: every period's newest, nothing more.
        assert_eq!(survivors(&times, &policy(0, 0, 0, 0, 12), "UTC").len(), 3);
        // All rules together: the union.
        let all = survivors(&times, &policy(2, 0, 3, 2, 2), "UTC");
        assert_eq!(
            all,
            [
                "2026-02-28T03:00",
                "2026-03-08T03:00",
                "2026-03-09T03:00",
                "2026-03-10T03:00"
            ]
        );
        // The snapshot just written survives whatever its key says; others' keys untouched.
        let mut keys = keys_at(&times);
        keys.push("c/s.db".into());
        keys.push("c/s.db_v1_not-a-time".into());
        let zone = TimeZone::UTC;
        let doomed = expired_by_retention("c/s.db", &keys, &policy(1, 0, 0, 0, 0), &zone, &keys[0]);
        assert_eq!(doomed.len(), times.len() - 2);
        assert!(!doomed.contains(&keys[0]) && !doomed.iter().any(|k| k == "c/s.db"));
        assert_eq!(doomed[0], keys[1], "oldest first");
        assert!(
            expired_by_retention("c/s.db", &keys, &Retention::default(), &zone, "").is_empty(),
            "a policy that keeps nothing deletes nothing"
        );
    }
}
