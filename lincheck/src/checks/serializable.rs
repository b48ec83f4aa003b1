//! Serializable reads are served by one member from its own state, so they may be stale, but
//! a member's state never goes back: per endpoint (and epoch), a serializable read called
//! after another one returned has a revision at or above it.

use crate::history::{History, OpResult};
use std::collections::BTreeMap;

/// A serializable read: (call, return, revision, index into the history's ops).
type Read = (u64, u64, i64, usize);

/// A serializable read whose revision went back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SerializableViolation {
    /// The read (index into the history's ops).
    pub op: usize,
    /// Its revision.
    pub revision: i64,
    /// The earlier read of the same endpoint with a higher revision.
    pub earlier: usize,
    /// Its revision.
    pub earlier_revision: i64,
}

/// The serializable-read check's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SerializableReport {
    /// Ok serializable reads checked.
    pub reads: usize,
    /// Endpoints they were served by.
    pub endpoints: usize,
    /// Problems found.
    pub violations: Vec<SerializableViolation>,
}

/// Checks the serializable reads of `history`.
pub fn check_serializable(history: &History) -> SerializableReport {
    let mut report = SerializableReport::default();
    let mut groups: BTreeMap<(usize, &str), Vec<Read>> = BTreeMap::new();
    for (i, op) in history.ops.iter().enumerate() {
        if let (true, Some(ret), OpResult::Ok { revision, .. }) =
            (op.kind.is_serializable_read(), op.ret, &op.result)
        {
            groups
                .entry((history.epoch_of(op.call), op.endpoint.as_str()))
                .or_default()
                .push((op.call, ret, *revision, i));
        }
    }
    let mut endpoints: Vec<&str> = groups.keys().map(|&(_, e)| e).collect();
    endpoints.sort_unstable();
    endpoints.dedup();
    report.endpoints = endpoints.len();
    for reads in groups.values() {
        report.reads += reads.len();
        let mut by_return = reads.clone();
        by_return.sort_by_key(|&(_, ret, ..)| ret);
        let mut by_call = reads.clone();
        by_call.sort_by_key(|&(call, ..)| call);
        let mut next = 0;
        let mut highest: Option<(i64, usize)> = None;
        for &(call, _, revision, op) in &by_call {
            while let Some(&(_, ret, r, o)) = by_return.get(next) {
                if ret >= call {
                    break;
                }
                if highest.is_none_or(|(h, _)| r > h) {
                    highest = Some((r, o));
                }
                next += 1;
            }
            if let Some((h, earlier)) = highest.filter(|&(h, _)| revision < h) {
                report.violations.push(SerializableViolation {
                    op,
                    revision,
                    earlier,
                    earlier_revision: h,
                });
            }
        }
    }
    report
}
