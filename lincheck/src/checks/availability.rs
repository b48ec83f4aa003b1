//! Availability figures: operations by outcome, and the longest time without a successful
//! write (between the calls of consecutive ok writes, and from the first operation's call
//! to the first ok write's). Ok writes: puts, deletes and cas answered ok (a cas whose
//! comparison failed was still committed).

use crate::history::History;

/// An interval without an ok write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    /// Its start (ns): an ok write's call, or the first operation's.
    pub from: u64,
    /// Its end (ns): the next ok write's call.
    pub to: u64,
    /// The ok write that ends it (index into the history's ops).
    pub until: usize,
}

/// Availability figures of a history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Availability {
    /// Operations.
    pub ops: usize,
    /// Answered ok.
    pub ok: usize,
    /// Failed (not applied).
    pub failed: usize,
    /// Outcome unknown.
    pub unknown: usize,
    /// Writes answered ok.
    pub ok_writes: usize,
    /// The longest interval without an ok write, if there is an ok write.
    pub longest_gap: Option<Gap>,
    /// From the last ok write's call to the last time of the history (ns), if any.
    pub since_last_write: Option<u64>,
}

/// Measures `history`.
pub fn measure(history: &History) -> Availability {
    let mut a = Availability {
        ops: history.ops.len(),
        ..Availability::default()
    };
    let mut writes: Vec<(u64, usize)> = Vec::new();
    for (i, op) in history.ops.iter().enumerate() {
        if op.is_ok() {
            a.ok += 1;
            if op.kind.is_write() {
                writes.push((op.call, i));
            }
        } else if op.is_unknown() {
            a.unknown += 1;
        } else {
            a.failed += 1;
        }
    }
    a.ok_writes = writes.len();
    writes.sort_unstable();
    let Some(first_call) = history.ops.iter().map(|o| o.call).min() else {
        return a;
    };
    let mut from = first_call;
    for &(call, i) in &writes {
        let gap = Gap {
            from,
            to: call,
            until: i,
        };
        if a.longest_gap
            .is_none_or(|g| gap.to - gap.from > g.to - g.from)
        {
            a.longest_gap = Some(gap);
        }
        from = call;
    }
    let end = history
        .ops
        .iter()
        .map(|o| o.ret.unwrap_or(o.call).max(o.call))
        .max()
        .unwrap_or(first_call);
    a.since_last_write = writes.last().map(|&(call, _)| end.saturating_sub(call));
    a
}
