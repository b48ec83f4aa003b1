//! The keys (file names) of snapshots in a bucket or a claim, as CoreOS' operator wrote them,
//! and retention: pure functions, shared by the backup controller, the pods that write PVC
//! backups and the search for a recovery's newest backup.

use std::time::Duration;

use k8s_openapi::jiff::{Timestamp, tz::TimeZone};

use etcd_shared::types::EtcdBackupSpec;

/// The interval of a periodic backup; `None` for a one-shot one.
pub fn interval(spec: &EtcdBackupSpec) -> Option<Duration> {
    let seconds = spec.backup_policy.as_ref()?.backup_interval_in_second;
    (seconds > 0).then(|| Duration::from_secs(seconds.unsigned_abs()))
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
}
