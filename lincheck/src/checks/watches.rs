//! Watches: per watch, events strictly ordered by revision (several keys may share one
//! revision, a key may not appear twice at one), none before the start revision or outside
//! the prefix, none missing (every ok change of a key under the prefix with a revision in
//! (start revision, last event's revision] is there, with the same value), each the change of
//! a write of the history, and a `compacted` end only when the revision the watch needed next
//! was at or below the compact revision.
//!
//! An event no ok write explains but exactly one unknown-outcome write can (same key, same
//! value or a delete, called before the event was received) resolves that write: it was
//! applied, at that revision, before that time. The linearizability check uses it.
//!
//! The history must hold every write to the watched keys (an event no write explains is a
//! violation). Ops and watches belong to the epoch of their call or start.

use crate::history::{EndReason, History, Op, OpKind};
use std::collections::{BTreeMap, HashMap};

/// An unknown-outcome write a watch saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The earliest time a watch received its event (it was applied before).
    pub time: u64,
    /// The revision of its event.
    pub revision: i64,
}

/// What is wrong with a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchProblem {
    /// An event's revision is below an earlier event's.
    Reordered {
        /// The highest revision received before.
        previous: i64,
    },
    /// The same (revision, key) received twice.
    Duplicate {
        /// The line of the first.
        first_line: usize,
    },
    /// An event below the watch's start revision.
    BeforeStart,
    /// An event of a key outside the prefix.
    OutsidePrefix,
    /// An ok change the watch should have received and did not.
    Gap {
        /// The operation (index into the history's ops).
        op: usize,
    },
    /// The event at an ok write's revision and key is not that write's change.
    Mismatch {
        /// The write (index into the history's ops).
        op: usize,
    },
    /// No write of the history explains the event.
    NoWrite {
        /// A write of the same change on the key at another revision, or that failed.
        similar: Option<usize>,
    },
    /// The same unknown write resolved at two revisions.
    TwoRevisions {
        /// The write (index into the history's ops).
        op: usize,
        /// The revision it was resolved at first.
        first: i64,
    },
    /// Ended `compacted` though the revision it needed next was above the compact revision.
    WronglyCompacted {
        /// The revision it needed next (its start revision, or the one after its last event).
        needed: i64,
        /// The compact revision reported.
        compact_revision: Option<i64>,
    },
}

/// One problem, where it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchViolation {
    /// The watch (index into the history's watches).
    pub watch: usize,
    /// The event (index into the watch's events), if the problem is one event's.
    pub event: Option<usize>,
    /// What is wrong.
    pub problem: WatchProblem,
}

/// The watch check's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchReport {
    /// Watches checked.
    pub watches: usize,
    /// Events checked.
    pub events: usize,
    /// Problems found.
    pub violations: Vec<WatchViolation>,
    /// Unknown-outcome writes seen by a watch (index into the history's ops).
    pub resolved: BTreeMap<usize, Resolved>,
}

/// The change an event shows: `Some(value)` for a put, `None` for a delete.
type Change<'a> = Option<&'a str>;

/// The change an unknown-outcome write would make if applied.
fn unknown_change(op: &Op) -> Option<Change<'_>> {
    match &op.kind {
        OpKind::Put { value, .. } | OpKind::Cas { value, .. } => Some(Some(value)),
        OpKind::Delete { .. } => Some(None),
        OpKind::Get { .. } => None,
    }
}

/// The writes of one epoch, indexed for the events.
struct Writes<'h> {
    /// Ok changes by (revision, key).
    ok: HashMap<(i64, &'h str), usize>,
    /// Ok changes, in history order.
    ok_list: Vec<usize>,
    /// Unknown-outcome writes by key.
    unknown: HashMap<&'h str, Vec<usize>>,
    /// Every write by key (for hints).
    all: HashMap<&'h str, Vec<usize>>,
}

fn writes_of_epoch(history: &History, epoch: usize) -> Writes<'_> {
    let mut w = Writes {
        ok: HashMap::new(),
        ok_list: Vec::new(),
        unknown: HashMap::new(),
        all: HashMap::new(),
    };
    for (i, op) in history.ops.iter().enumerate() {
        if !op.kind.is_write() || history.epoch_of(op.call) != epoch {
            continue;
        }
        let key = op.kind.key();
        w.all.entry(key).or_default().push(i);
        if let (Some(_), Some(revision)) = (op.change(), op.result.revision()) {
            w.ok.entry((revision, key)).or_insert(i);
            w.ok_list.push(i);
        } else if op.is_unknown() {
            w.unknown.entry(key).or_default().push(i);
        }
    }
    w
}

/// Checks every watch of `history`.
pub fn check_watches(history: &History) -> WatchReport {
    let mut report = WatchReport {
        watches: history.watches.len(),
        ..WatchReport::default()
    };
    let mut epochs: HashMap<usize, Writes<'_>> = HashMap::new();
    for (wi, watch) in history.watches.iter().enumerate() {
        let epoch = history.epoch_of(watch.time);
        let writes = epochs
            .entry(epoch)
            .or_insert_with(|| writes_of_epoch(history, epoch));
        let mut found = Vec::new();
        let mut problem = |event: Option<usize>, problem| {
            found.push(WatchViolation {
                watch: wi,
                event,
                problem,
            })
        };
        let mut seen: HashMap<(i64, &str), usize> = HashMap::new();
        let mut highest: Option<i64> = None;
        for (ei, e) in watch.events.iter().enumerate() {
            report.events += 1;
            if !e.key.starts_with(&watch.prefix) {
                problem(Some(ei), WatchProblem::OutsidePrefix);
            }
            if watch.start_revision.is_some_and(|s| e.revision < s) {
                problem(Some(ei), WatchProblem::BeforeStart);
            }
            if let Some(previous) = highest.filter(|&h| e.revision < h) {
                problem(Some(ei), WatchProblem::Reordered { previous });
            }
            highest = Some(highest.map_or(e.revision, |h| h.max(e.revision)));
            if let Some(&first) = seen.get(&(e.revision, e.key.as_str())) {
                let first_line = watch.events.get(first).map_or(0, |f| f.line);
                problem(Some(ei), WatchProblem::Duplicate { first_line });
                continue;
            }
            seen.insert((e.revision, e.key.as_str()), ei);
            let change = e.value.as_deref();
            if let Some(&op) = writes.ok.get(&(e.revision, e.key.as_str())) {
                let matches = history.ops.get(op).and_then(Op::change) == Some(change);
                if !matches {
                    problem(Some(ei), WatchProblem::Mismatch { op });
                }
                continue;
            }
            let candidates: Vec<usize> = writes
                .unknown
                .get(e.key.as_str())
                .into_iter()
                .flatten()
                .copied()
                .filter(|&i| {
                    history
                        .ops
                        .get(i)
                        .is_some_and(|op| op.call <= e.time && unknown_change(op) == Some(change))
                })
                .collect();
            match candidates.as_slice() {
                [] => {
                    let similar = writes
                        .all
                        .get(e.key.as_str())
                        .into_iter()
                        .flatten()
                        .copied()
                        .find(|&i| history.ops.get(i).and_then(unknown_change) == Some(change));
                    problem(Some(ei), WatchProblem::NoWrite { similar });
                }
                [op] => {
                    let entry = report.resolved.entry(*op).or_insert(Resolved {
                        time: e.time,
                        revision: e.revision,
                    });
                    if entry.revision != e.revision {
                        let first = entry.revision;
                        problem(Some(ei), WatchProblem::TwoRevisions { op: *op, first });
                    }
                    entry.time = entry.time.min(e.time);
                }
                _ => {} // several unknown writes could explain it: nothing learnt
            }
        }
        // Gaps: every ok change under the prefix in (start, last] must be there.
        if let (Some(first), Some(last)) = (watch.events.first(), highest) {
            let lower = watch
                .start_revision
                .unwrap_or(first.revision.saturating_sub(1));
            for &op in &writes.ok_list {
                let Some(o) = history.ops.get(op) else {
                    continue;
                };
                let (key, Some(revision)) = (o.kind.key(), o.result.revision()) else {
                    continue;
                };
                if key.starts_with(&watch.prefix)
                    && revision > lower
                    && revision <= last
                    && !seen.contains_key(&(revision, key))
                {
                    problem(None, WatchProblem::Gap { op });
                }
            }
        }
        if let Some(end) = watch
            .end
            .as_ref()
            .filter(|e| e.reason == EndReason::Compacted)
        {
            let needed = match (watch.start_revision, highest) {
                (Some(s), Some(h)) => Some(s.max(h.saturating_add(1))),
                (s, h) => s.or(h.map(|h| h.saturating_add(1))),
            };
            let wrong = match (needed, end.compact_revision) {
                (_, None) => true,
                (Some(needed), Some(c)) => needed > c,
                (None, Some(_)) => false,
            };
            if wrong {
                problem(
                    None,
                    WatchProblem::WronglyCompacted {
                        needed: needed.unwrap_or(0),
                        compact_revision: end.compact_revision,
                    },
                );
            }
        }
        report.violations.append(&mut found);
    }
    report
}
