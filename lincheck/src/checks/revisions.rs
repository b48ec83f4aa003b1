//! Revisions in real time, within an epoch (revisions may restart after a recovery):
//!
//! - a response's revision is never below the revision of anything observed before the
//!   operation was called: an ok response returned before, or a watch event received before
//!   (serializable reads are sources but not subjects: they may be stale);
//! - a change (a put, a cas that succeeded, a delete that deleted) takes a revision above
//!   everything observed before it was called, and no two changes share one;
//! - a get's `mod_revision` is not above its revision.

use crate::history::{Answer, History, OpResult};
use std::collections::HashMap;

/// Where a revision was observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// An ok response (index into the history's ops).
    Op(usize),
    /// A watch event (indices into the history's watches and that watch's events).
    Event {
        /// The watch.
        watch: usize,
        /// The event.
        event: usize,
    },
}

/// What is wrong with a revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RevisionProblem {
    /// A response's revision below one observed before its call (for a change: not above).
    Backwards {
        /// Where the higher revision was observed.
        source: Source,
        /// That revision.
        source_revision: i64,
    },
    /// Two changes with one revision.
    Shared {
        /// The other change (index into the history's ops).
        other: usize,
    },
    /// A get's mod revision above its revision.
    ModRevisionAbove {
        /// The mod revision.
        mod_revision: i64,
    },
}

/// One problem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevisionViolation {
    /// The operation (index into the history's ops).
    pub op: usize,
    /// Its revision.
    pub revision: i64,
    /// What is wrong.
    pub problem: RevisionProblem,
}

/// The revision check's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RevisionReport {
    /// Responses checked.
    pub checked: usize,
    /// Problems found.
    pub violations: Vec<RevisionViolation>,
}

/// Checks the revisions of `history`.
pub fn check_revisions(history: &History) -> RevisionReport {
    let mut report = RevisionReport::default();
    for epoch in 0..history.epoch_count() {
        check_epoch(history, epoch, &mut report);
    }
    report
}

fn check_epoch(history: &History, epoch: usize, report: &mut RevisionReport) {
    // (time observed, revision, source)
    let mut sources: Vec<(u64, i64, Source)> = Vec::new();
    // (call, revision, op, is a change)
    let mut subjects: Vec<(u64, i64, usize, bool)> = Vec::new();
    let mut changes: HashMap<i64, usize> = HashMap::new();
    for (i, op) in history.ops.iter().enumerate() {
        if history.epoch_of(op.call) != epoch {
            continue;
        }
        let (Some(ret), OpResult::Ok { revision, answer }) = (op.ret, &op.result) else {
            continue;
        };
        sources.push((ret, *revision, Source::Op(i)));
        if op.kind.is_serializable_read() {
            continue;
        }
        let change = op.change().is_some();
        subjects.push((op.call, *revision, i, change));
        if let Answer::Get {
            mod_revision: Some(m),
            ..
        } = answer
            && m > revision
        {
            report.violations.push(RevisionViolation {
                op: i,
                revision: *revision,
                problem: RevisionProblem::ModRevisionAbove { mod_revision: *m },
            });
        }
        if change {
            if let Some(&other) = changes.get(revision) {
                report.violations.push(RevisionViolation {
                    op: i,
                    revision: *revision,
                    problem: RevisionProblem::Shared { other },
                });
            } else {
                changes.insert(*revision, i);
            }
        }
    }
    for (wi, watch) in history.watches.iter().enumerate() {
        for (ei, e) in watch.events.iter().enumerate() {
            if history.epoch_of(e.time) == epoch {
                sources.push((
                    e.time,
                    e.revision,
                    Source::Event {
                        watch: wi,
                        event: ei,
                    },
                ));
            }
        }
    }
    sources.sort_by_key(|&(t, ..)| t);
    subjects.sort_by_key(|&(call, ..)| call);
    let mut next = 0;
    let mut highest: Option<(i64, Source)> = None;
    for &(call, revision, op, change) in &subjects {
        while let Some(&(t, r, s)) = sources.get(next) {
            if t >= call {
                break;
            }
            if highest.is_none_or(|(h, _)| r > h) {
                highest = Some((r, s));
            }
            next += 1;
        }
        report.checked += 1;
        if let Some((h, source)) = highest
            && (revision < h || (change && revision == h))
        {
            report.violations.push(RevisionViolation {
                op,
                revision,
                problem: RevisionProblem::Backwards {
                    source,
                    source_revision: h,
                },
            });
        }
    }
}
