//! Continuous backup between snapshots (EtcdBackup `spec.continuous`) and restores to a point
//! in time (EtcdRestore `spec.toRevision`): the objects, their format and the choice of what
//! a restore replays. Pure functions; the streaming is [`crate::backup::continuous`]'s, the
//! replay [`crate::backup::restore`]'s.
//!
//! Beside a backup's periodic snapshots (`KEY_v<revision>_<time>`) a continuous backup writes:
//!
//! - **segments** `KEY_segments/<first>-<last>` (revisions, 20 digits each): every change of
//!   the revisions `first..=last`, as the cluster's watch delivered them, in JSON lines, one
//!   [`Record`] per revision. etcd gives every change of the key space a revision of its own
//!   and a change that writes nothing takes none, so revisions are dense: a chain of segments
//!   is whole when each starts right after the one before ends.
//! - **base markers** `KEY_segments/base-<revision>` (20 digits), one per snapshot taken while
//!   the backup is continuous: the snapshot's key names the member's revision just before it
//!   was taken, but the snapshot can hold a few revisions more (writes between that status and
//!   the snapshot); the marker holds a revision the snapshot holds at most (the cluster's,
//!   asked once the snapshot is written). A restore to a revision uses only a snapshot whose
//!   marker is at or before the target, so it never starts from data newer than the target.
//!
//! A restore to revision `T` restores the newest such snapshot (key revision `R`) and replays
//! every record of `R+1..=T` in order. Records the snapshot may hold already (`R+1..=R'`) are
//! written again: a put or a delete sets a key's state whatever it was, so the keys end as
//! they were at `T` either way.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// Digits of a revision in a segment's or a marker's key.
const DIGITS: usize = 20;

/// The folder of a backup's segments and markers: beside its snapshots, under `KEY_segments/`
/// (not `KEY/`: a one-shot snapshot `KEY` and a folder `KEY/` cannot both be in a store kept in
/// a file system).
pub fn segments_dir(prefix: &str) -> String {
    format!("{prefix}_segments/")
}

/// The key of the segment holding the revisions `first..=last`.
pub fn segment_key(prefix: &str, first: i64, last: i64) -> String {
    format!("{}{first:0DIGITS$}-{last:0DIGITS$}", segments_dir(prefix))
}

/// The revisions `(first, last)` of a segment key of `prefix`; `None` for any other key.
pub fn parse_segment(prefix: &str, key: &str) -> Option<(i64, i64)> {
    let name = key.strip_prefix(&segments_dir(prefix))?;
    let (first, last) = name.split_once('-')?;
    let number = |s: &str| {
        (s.len() == DIGITS && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
    };
    let (first, last) = (number(first)?, number(last)?);
    (first >= 1 && first <= last).then_some((first, last))
}

/// The key of the marker of the snapshot of key revision `revision`.
pub fn base_key(prefix: &str, revision: i64) -> String {
    format!("{}base-{revision:0DIGITS$}", segments_dir(prefix))
}

/// The key revision of a marker key of `prefix`; `None` for any other key.
pub fn parse_base(prefix: &str, key: &str) -> Option<i64> {
    let digits = key
        .strip_prefix(&segments_dir(prefix))?
        .strip_prefix("base-")?;
    (digits.len() == DIGITS && digits.bytes().all(|b| b.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A marker's body: the revision the snapshot holds at most, in decimal.
pub fn base_body(upper: i64) -> String {
    format!("{upper}\n")
}

/// Reads a marker's body.
pub fn parse_base_body(body: &[u8]) -> Option<i64> {
    std::str::from_utf8(body).ok()?.trim().parse().ok()
}

/// One change of a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Op {
    /// The key, base64.
    pub k: String,
    /// The value, base64; absent for a delete.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub v: Option<String>,
}

impl Op {
    /// A put of `value` to `key`.
    pub fn put(key: &[u8], value: &[u8]) -> Self {
        Op {
            k: STANDARD.encode(key),
            v: Some(STANDARD.encode(value)),
        }
    }

    /// A delete of `key`.
    pub fn delete(key: &[u8]) -> Self {
        Op {
            k: STANDARD.encode(key),
            v: None,
        }
    }

    /// The key's bytes.
    pub fn key(&self) -> Result<Vec<u8>, SegmentError> {
        STANDARD
            .decode(&self.k)
            .map_err(|e| SegmentError::Format(format!("key {:?}: {e}", self.k)))
    }

    /// The value's bytes; `None` for a delete.
    pub fn value(&self) -> Result<Option<Vec<u8>>, SegmentError> {
        self.v
            .as_ref()
            .map(|v| STANDARD.decode(v))
            .transpose()
            .map_err(|e| SegmentError::Format(format!("value of {:?}: {e}", self.k)))
    }
}

/// The changes of one revision: one line of a segment. A transaction that changed several
/// keys is one record, and is replayed as one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// The revision.
    pub rev: i64,
    /// When the controller received it from the watch, milliseconds since the Unix epoch (the
    /// precision of a restore to a time: the watch's delivery, not etcd's commit).
    pub ms: i64,
    /// Its changes, in the order of the watch.
    pub ops: Vec<Op>,
}

/// Why segments do not make a restore.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SegmentError {
    /// A segment's content is not what this module writes.
    #[error("segment not readable: {0}")]
    Format(String),
    /// No snapshot of the backup is old enough.
    #[error(
        "no snapshot of {prefix} with a continuous-backup marker at or before revision {target} (the oldest usable one holds up to revision {oldest}); snapshots taken before spec.continuous was set have no marker"
    )]
    NoBase {
        prefix: String,
        target: i64,
        oldest: String,
    },
    /// The segments after the snapshot skip revisions.
    #[error(
        "the continuous backup has a gap after the snapshot of revision {base}: revisions {from} to {to} are not in any segment (the watch restarted from a newer snapshot); revisions in a gap can be restored only to a snapshot"
    )]
    Gap { base: i64, from: i64, to: i64 },
    /// `toTime` is not a time.
    #[error("spec.toTime {0:?} is not an RFC 3339 time")]
    BadTime(String),
    /// No change received after `toTime` is in the store yet.
    #[error(
        "no change received after {0} is in the continuous backup yet: the revision at that time is known once a later change is streamed (or ask for spec.toRevision)"
    )]
    TimeNotStreamed(String),
    /// The segments end before the target.
    #[error(
        "the continuous backup reaches revision {reached} only, not {target} (after the snapshot of revision {base}); a revision not yet streamed can be asked for again later, one the cluster never reached never"
    )]
    Short {
        base: i64,
        reached: i64,
        target: i64,
    },
}

/// Encodes records as a segment's body: JSON lines.
pub fn encode(records: &[Record]) -> Vec<u8> {
    let mut body = Vec::new();
    for record in records {
        // Strings and numbers only: serializing cannot fail.
        if let Ok(line) = serde_json::to_vec(record) {
            body.extend_from_slice(&line);
            body.push(b'\n');
        }
    }
    body
}

/// Reads a segment's body, checking that its records are the revisions `first..=last` of its
/// name, in order, none missing.
pub fn decode(body: &[u8], first: i64, last: i64) -> Result<Vec<Record>, SegmentError> {
    let mut records = Vec::new();
    let mut next = first;
    for (n, line) in body.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let record: Record = serde_json::from_slice(line)
            .map_err(|e| SegmentError::Format(format!("line {}: {e}", n + 1)))?;
        if record.rev != next {
            return Err(SegmentError::Format(format!(
                "line {}: revision {}, expected {next}",
                n + 1,
                record.rev
            )));
        }
        next += 1;
        records.push(record);
    }
    if next != last + 1 {
        return Err(SegmentError::Format(format!(
            "revisions {first} to {} found, the name says {first} to {last}",
            next - 1
        )));
    }
    Ok(records)
}

/// Groups watch events `(revision, op)`, in the watch's order, into one record per revision,
/// stamped `ms`; records already open (the last one of `records`) are extended.
pub fn push_events(records: &mut Vec<Record>, events: Vec<(i64, Op)>, ms: i64) {
    for (rev, op) in events {
        match records.last_mut() {
            Some(last) if last.rev == rev => last.ops.push(op),
            _ => records.push(Record {
                rev,
                ms,
                ops: vec![op],
            }),
        }
    }
}

/// What a restore to a revision restores and replays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The snapshot's key.
    pub snapshot: String,
    /// Its key revision: records after it are replayed.
    pub base: i64,
    /// The segments to read, in order: `(key, first, last)`.
    pub segments: Vec<(String, i64, i64)>,
    /// The target revision.
    pub target: i64,
}

/// Chooses what a restore of `prefix` to `target` restores: the newest snapshot
/// `(key revision, key)` among `snapshots` whose marker (`markers`: key revision to the
/// revision it holds at most) is at or before `target`, then the segments `(key, first,
/// last)` of `segments` that cover its revisions after it up to `target` without a gap.
pub fn plan(
    prefix: &str,
    snapshots: &[(i64, String)],
    markers: &BTreeMap<i64, i64>,
    segments: &[(String, i64, i64)],
    target: i64,
) -> Result<Plan, SegmentError> {
    let mut usable: Vec<(i64, &String)> = snapshots
        .iter()
        .filter(|(rev, _)| markers.get(rev).is_some_and(|upper| *upper <= target))
        .map(|(rev, key)| (*rev, key))
        .collect();
    usable.sort();
    let Some((base, snapshot)) = usable.last().copied() else {
        let oldest = markers
            .values()
            .min()
            .map_or("(none)".to_string(), |u| u.to_string());
        return Err(SegmentError::NoBase {
            prefix: prefix.to_string(),
            target,
            oldest,
        });
    };
    let mut sorted: Vec<&(String, i64, i64)> = segments.iter().collect();
    sorted.sort_by_key(|(_, first, last)| (*first, *last));
    let mut chosen = Vec::new();
    // The next revision the chain must hold.
    let mut next = base + 1;
    while next <= target {
        // Of the segments holding `next`, the one reaching furthest.
        let Some(found) = sorted
            .iter()
            .filter(|(_, first, last)| *first <= next && next <= *last)
            .max_by_key(|(_, _, last)| *last)
        else {
            let reached = next - 1;
            return Err(match sorted.iter().find(|(_, first, _)| *first > next) {
                Some((_, first, _)) if *first <= target => SegmentError::Gap {
                    base,
                    from: next,
                    to: first - 1,
                },
                _ => SegmentError::Short {
                    base,
                    reached,
                    target,
                },
            });
        };
        chosen.push((found.0.clone(), found.1, found.2));
        next = found.2 + 1;
    }
    Ok(Plan {
        snapshot: snapshot.clone(),
        base,
        segments: chosen,
        target,
    })
}

/// Where a continuous backup resumes: after the last revision in the store, or after the
/// newest snapshot when that is newer (the chain then starts again there).
pub fn resume_after(segments: &[(String, i64, i64)], newest_snapshot: Option<i64>) -> Option<i64> {
    let streamed = segments.iter().map(|(_, _, last)| *last).max();
    match (streamed, newest_snapshot) {
        (Some(s), Some(n)) => Some(s.max(n)),
        (s, n) => s.or(n),
    }
}

/// The segments retention deletes once the oldest snapshot kept holds `oldest` (its key
/// revision): those whose revisions are all at or before it.
pub fn expired_segments(segments: &[(String, i64, i64)], oldest: i64) -> Vec<String> {
    segments
        .iter()
        .filter(|(_, _, last)| *last <= oldest)
        .map(|(key, _, _)| key.clone())
        .collect()
}

/// Where `toTime` (`at_ms`, milliseconds since the Unix epoch) falls in `records` (in revision
/// order, as received): the revision before the first record received after it, `None` when
/// every record was received at or before it (the stream has not shown it passed that time).
/// Records are received in revision order, so their times do not go back.
pub fn revision_at(records: &[Record], at_ms: i64) -> Option<i64> {
    records.iter().find(|r| r.ms > at_ms).map(|r| r.rev - 1)
}

/// The records of `records` a restore to `plan.target` replays: after the base, at or before
/// the target.
pub fn replayed<'a>(plan: &Plan, records: &'a [Record]) -> impl Iterator<Item = &'a Record> {
    let (base, target) = (plan.base, plan.target);
    records
        .iter()
        .filter(move |r| r.rev > base && r.rev <= target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_others_are_not_segments() {
        let key = segment_key("b/snap.db", 7, 1234);
        assert_eq!(
            key,
            "b/snap.db_segments/00000000000000000007-00000000000000001234"
        );
        assert_eq!(parse_segment("b/snap.db", &key), Some((7, 1234)));
        assert_eq!(parse_segment("b/other", &key), None);
        for bad in [
            "b/snap.db_segments/7-1234",
            "b/snap.db_segments/00000000000000000009-00000000000000000008",
            "b/snap.db_segments/00000000000000000000-00000000000000000008",
            "b/snap.db_v12_2026-01-01-00:00:00",
            "b/snap.db_segments/base-00000000000000000012",
        ] {
            assert_eq!(parse_segment("b/snap.db", bad), None, "{bad}");
        }
        let base = base_key("b/snap.db", 12);
        assert_eq!(parse_base("b/snap.db", &base), Some(12));
        assert_eq!(parse_base("b/snap.db", &key), None);
        assert_eq!(parse_base_body(base_body(15).as_bytes()), Some(15));
        // Snapshot retention never sees segments as snapshots.
        assert!(!super::super::keys::is_periodic_of("b/snap.db", &key));
    }

    fn rec(rev: i64, ops: Vec<Op>) -> Record {
        Record { rev, ms: 1, ops }
    }

    #[test]
    fn events_group_by_revision_and_segments_round_trip() {
        let mut records = Vec::new();
        push_events(
            &mut records,
            vec![(5, Op::put(b"a", b"1")), (6, Op::put(b"b", b"2"))],
            1,
        );
        // A transaction's changes come in one watch answer; an answer may follow another
        // of the same revision too.
        push_events(
            &mut records,
            vec![(6, Op::delete(b"a")), (7, Op::put(b"\xff", b""))],
            1,
        );
        assert_eq!(
            records,
            vec![
                rec(5, vec![Op::put(b"a", b"1")]),
                rec(6, vec![Op::put(b"b", b"2"), Op::delete(b"a")]),
                rec(7, vec![Op::put(b"\xff", b"")]),
            ]
        );
        let body = encode(&records);
        assert_eq!(decode(&body, 5, 7), Ok(records.clone()));
        assert_eq!(records[2].ops[0].key(), Ok(vec![0xff]));
        assert_eq!(records[2].ops[0].value(), Ok(Some(vec![])));
        assert_eq!(records[1].ops[1].value(), Ok(None));
        // A name that does not match the content, a hole, garbage: refused.
        assert!(decode(&body, 5, 8).is_err());
        assert!(decode(&body, 4, 7).is_err());
        let holed = encode(&[records[0].clone(), records[2].clone()]);
        assert!(decode(&holed, 5, 7).is_err());
        assert!(decode(b"{not json\n", 1, 1).is_err());
    }

    fn seg(first: i64, last: i64) -> (String, i64, i64) {
        (segment_key("p", first, last), first, last)
    }

    fn snaps(revs: &[i64]) -> Vec<(i64, String)> {
        revs.iter().map(|r| (*r, format!("p_v{r}_t"))).collect()
    }

    #[test]
    fn a_plan_takes_the_newest_usable_snapshot_and_a_whole_chain() {
        let markers: BTreeMap<i64, i64> = [(10, 12), (50, 53), (90, 90)].into();
        let segments = vec![seg(11, 30), seg(31, 49), seg(50, 70), seg(71, 100)];
        let snapshots = snaps(&[10, 50, 90]);
        // Between two snapshots: the older one, and the segments up to the target.
        let p = plan("p", &snapshots, &markers, &segments, 60).unwrap();
        assert_eq!((p.snapshot.as_str(), p.base), ("p_v50_t", 50));
        assert_eq!(p.segments, vec![seg(50, 70)]);
        // A target the snapshot of revision 50 may hold more than: the one before.
        let p = plan("p", &snapshots, &markers, &segments, 52).unwrap();
        assert_eq!(p.base, 10);
        assert_eq!(p.segments, vec![seg(11, 30), seg(31, 49), seg(50, 70)]);
        // Exactly a snapshot's revision: nothing to replay.
        let p = plan("p", &snapshots, &markers, &segments, 90).unwrap();
        assert_eq!((p.base, p.segments.len()), (90, 0));
        // Before every marker, and snapshots without a marker: refused.
        assert!(matches!(
            plan("p", &snapshots, &markers, &segments, 11),
            Err(SegmentError::NoBase { .. })
        ));
        assert!(matches!(
            plan("p", &snaps(&[5]), &markers, &segments, 60),
            Err(SegmentError::NoBase { .. })
        ));
        // Beyond the last segment: short.
        assert_eq!(
            plan("p", &snapshots, &markers, &segments, 101),
            Err(SegmentError::Short {
                base: 90,
                reached: 100,
                target: 101
            })
        );
        // A gap in the chain.
        let holed = vec![seg(11, 30), seg(40, 70)];
        assert_eq!(
            plan("p", &snapshots, &markers, &holed, 45),
            Err(SegmentError::Gap {
                base: 10,
                from: 31,
                to: 39
            })
        );
        // A snapshot newer than the gap makes the target restorable again.
        let p = plan("p", &snapshots, &markers, &holed, 60).unwrap();
        assert_eq!((p.base, p.segments), (50, vec![seg(40, 70)]));
    }

    #[test]
    fn only_records_after_the_base_up_to_the_target_are_replayed() {
        let records: Vec<Record> = (48..=55).map(|r| rec(r, vec![])).collect();
        let p = Plan {
            snapshot: String::new(),
            base: 50,
            segments: vec![],
            target: 53,
        };
        let revs: Vec<i64> = replayed(&p, &records).map(|r| r.rev).collect();
        assert_eq!(revs, vec![51, 52, 53]);
    }

    #[test]
    fn a_time_falls_before_the_first_record_received_after_it() {
        let at = |rev: i64, ms: i64| Record {
            rev,
            ms,
            ops: vec![],
        };
        let records = vec![at(10, 1000), at(11, 1000), at(12, 2500), at(13, 4000)];
        assert_eq!(revision_at(&records, 999), Some(9));
        assert_eq!(revision_at(&records, 1000), Some(11));
        assert_eq!(revision_at(&records, 2499), Some(11));
        assert_eq!(revision_at(&records, 3999), Some(12));
        assert_eq!(revision_at(&records, 4000), None);
    }

    #[test]
    fn resuming_and_pruning() {
        assert_eq!(resume_after(&[], None), None);
        assert_eq!(resume_after(&[], Some(10)), Some(10));
        assert_eq!(resume_after(&[seg(11, 30)], Some(10)), Some(30));
        // A snapshot newer than the last segment (a watch that fell behind a compaction):
        // the chain starts again after it.
        assert_eq!(resume_after(&[seg(11, 30)], Some(40)), Some(40));
        assert_eq!(
            expired_segments(&[seg(11, 30), seg(31, 49), seg(50, 70)], 49),
            vec![segment_key("p", 11, 30), segment_key("p", 31, 49)]
        );
    }
}
