//! The text reports: a Jepsen register history's verdict with its witness, and every check of
//! a recorded history with figures and, for each violation, the slice of history showing it.

use crate::checks::HistoryReport;
use crate::checks::linearizability::LinViolation;
use crate::checks::revisions::{RevisionProblem, Source};
use crate::checks::watches::WatchProblem;
use crate::history::{Answer, History, Op, OpKind, OpResult, Watch, WatchEvent};
use crate::jepsen::JepsenOp;
use crate::model::register::RegisterModel;
use crate::search::{Model, Outcome, Stats, Undecided, Witness};
use std::fmt::Write;

/// Violations listed per check; the rest are counted.
pub const MAX_LISTED: usize = 10;
/// Operations of the prefix shown before the conflict.
pub const PREFIX_SHOWN: usize = 8;
/// Lines of a history slice shown.
pub const SLICE_LINES: usize = 40;

/// Nanoseconds as milliseconds, `12.345`.
pub fn ms(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000_000, (ns / 1_000) % 1_000)
}

fn undecided_text(reason: &Undecided) -> String {
    match reason {
        Undecided::Deadline => "the timeout passed".to_string(),
        Undecided::CacheFull { entries, bytes } => format!(
            "the search cache reached its cap ({entries} configurations, about {} MiB)",
            bytes >> 20
        ),
    }
}

// ---- Jepsen ----

fn jepsen_op_line(op: &JepsenOp) -> String {
    let lines = match op.ret {
        Some(r) => format!("lines {}-{}", op.call, r),
        None => format!("lines {}-?", op.call),
    };
    format!(
        "process {:<3} {:<16} {}",
        op.client,
        lines,
        RegisterModel.describe_operation(&op.input, &op.output)
    )
}

/// The report of a Jepsen register history's check.
pub fn render_jepsen(
    file: &str,
    ops: &[JepsenOp],
    outcome: &Outcome<Option<i64>>,
    stats: &Stats,
    elapsed_ms: f64,
) -> String {
    let mut out = String::new();
    let unknown = ops.iter().filter(|o| o.ret.is_none()).count();
    let _ = writeln!(
        out,
        "{file}: Jepsen etcd register history: {} operations ({unknown} with unknown outcome), one partition",
        ops.len()
    );
    match outcome {
        Outcome::Linearizable { .. } => {
            let _ = writeln!(out, "linearizability: ok");
        }
        Outcome::Undecided(reason) => {
            let _ = writeln!(
                out,
                "linearizability: UNDECIDED ({})",
                undecided_text(reason)
            );
        }
        Outcome::Violation(w) => {
            let _ = writeln!(out, "linearizability: VIOLATION");
            render_witness(&mut out, ops, w);
        }
    }
    let _ = writeln!(
        out,
        "checked in {elapsed_ms:.1} ms ({} search steps, {} cached configurations)",
        stats.steps, stats.cache_entries
    );
    out
}

fn render_witness(out: &mut String, ops: &[JepsenOp], w: &Witness<Option<i64>>) {
    let _ = writeln!(
        out,
        "  linearizable prefix reaching furthest: {} of {} operations{}",
        w.prefix.len(),
        ops.len(),
        if w.prefix.len() > PREFIX_SHOWN {
            format!(", the last {PREFIX_SHOWN}:")
        } else {
            ":".to_string()
        }
    );
    for &i in w
        .prefix
        .iter()
        .skip(w.prefix.len().saturating_sub(PREFIX_SHOWN))
    {
        if let Some(op) = ops.get(i) {
            let _ = writeln!(out, "    {}", jepsen_op_line(op));
        }
    }
    let _ = writeln!(
        out,
        "  register after it: {}",
        RegisterModel.describe_state(&w.state)
    );
    if let Some(b) = ops.get(w.blocking) {
        let _ = writeln!(
            out,
            "  this operation must take effect by its return and cannot:"
        );
        let _ = writeln!(out, "    {}", jepsen_op_line(b));
    }
    let _ = writeln!(
        out,
        "  operations called before that return and not in the prefix (one must come next):"
    );
    for c in &w.candidates {
        if let Some(op) = ops.get(c.op) {
            let why = if c.allowed {
                "possible here, but every way on from it fails"
            } else {
                "impossible from this state"
            };
            let _ = writeln!(out, "    {}   <- {why}", jepsen_op_line(op));
        }
    }
    // The slice of history around the conflict: every operation overlapping it (from the
    // earliest call of the candidates that returned to the blocking operation's return).
    let from = w
        .candidates
        .iter()
        .filter_map(|c| ops.get(c.op).filter(|o| o.ret.is_some()).map(|o| o.call))
        .chain(ops.get(w.blocking).map(|b| b.call))
        .min()
        .unwrap_or(0);
    let to = ops.get(w.blocking).and_then(|b| b.ret).unwrap_or(u64::MAX);
    let overlapping: Vec<&JepsenOp> = ops
        .iter()
        .filter(|o| o.call <= to && o.ret.unwrap_or(u64::MAX) >= from)
        .collect();
    let until = if to == u64::MAX {
        "end".to_string()
    } else {
        to.to_string()
    };
    let _ = writeln!(
        out,
        "  every operation overlapping the conflict (lines {from}-{until}), ? = no return:"
    );
    for op in overlapping.iter().take(SLICE_LINES) {
        let _ = writeln!(out, "    {}", jepsen_op_line(op));
    }
    if overlapping.len() > SLICE_LINES {
        let _ = writeln!(out, "    ... and {} more", overlapping.len() - SLICE_LINES);
    }
}

// ---- Our history ----

fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// One operation, one line: id, client, endpoint, times in ms, request and answer.
pub fn op_line(op: &Op) -> String {
    let request = match &op.kind {
        OpKind::Put { key, value } => format!("put {} = {}", quoted(key), quoted(value)),
        OpKind::Delete { key } => format!("delete {}", quoted(key)),
        OpKind::Get { key, serializable } => {
            format!(
                "get {}{}",
                quoted(key),
                if *serializable { " (serializable)" } else { "" }
            )
        }
        OpKind::Cas { key, expect, value } => format!(
            "cas {} if {} then {}",
            quoted(key),
            expect
                .as_deref()
                .map_or_else(|| "absent".to_string(), quoted),
            quoted(value)
        ),
    };
    let answer = match &op.result {
        OpResult::Ok { revision, answer } => {
            let what = match answer {
                Answer::Put => "ok".to_string(),
                Answer::Delete { deleted } => format!("deleted {deleted}"),
                Answer::Get { value: None, .. } => "absent".to_string(),
                Answer::Get {
                    value: Some(v),
                    mod_revision,
                } => match mod_revision {
                    Some(m) => format!("{} (mod revision {m})", quoted(v)),
                    None => quoted(v),
                },
                Answer::Cas { succeeded: true } => "succeeded".to_string(),
                Answer::Cas { succeeded: false } => "not succeeded".to_string(),
            };
            format!("{what}, revision {revision}")
        }
        OpResult::Fail { error } => format!("FAILED ({error})"),
        OpResult::Unknown { error } => format!("UNKNOWN ({error})"),
    };
    let ret = op.ret.map_or_else(|| "?".to_string(), ms);
    format!(
        "#{:<5} client {:<3} {:>10} .. {:>10} ms  {request} -> {answer}  [{}, line {}]",
        op.id,
        op.client,
        ms(op.call),
        ret,
        op.endpoint,
        op.line
    )
}

fn watch_line(w: &Watch) -> String {
    format!(
        "watch {} (client {}, {}, prefix {}, start revision {}, opened at {} ms, line {})",
        w.id,
        w.client,
        w.endpoint,
        quoted(&w.prefix),
        w.start_revision
            .map_or_else(|| "now".to_string(), |r| r.to_string()),
        ms(w.time),
        w.line
    )
}

fn event_line(e: &WatchEvent) -> String {
    let change = match &e.value {
        Some(v) => format!("put {} = {}", quoted(&e.key), quoted(v)),
        None => format!("delete {}", quoted(&e.key)),
    };
    format!(
        "event revision {} {change}, received at {} ms  [line {}]",
        e.revision,
        ms(e.time),
        e.line
    )
}

fn verdict(violations: usize) -> String {
    if violations == 0 {
        "ok".to_string()
    } else {
        format!("VIOLATION ({violations})")
    }
}

fn more(out: &mut String, total: usize) {
    if total > MAX_LISTED {
        let _ = writeln!(out, "  ... and {} more", total - MAX_LISTED);
    }
}

/// The report of every check of a recorded history.
pub fn render_history(
    file: &str,
    history: &History,
    report: &HistoryReport,
    elapsed_ms: f64,
) -> String {
    let mut out = String::new();
    let events: usize = history.watches.iter().map(|w| w.events.len()).sum();
    let _ = writeln!(
        out,
        "{file}: history of {} operations, {} watches ({events} events), {} epoch(s)",
        history.ops.len(),
        history.watches.len(),
        history.epoch_count()
    );
    render_linearizability(&mut out, history, report);
    render_serializable(&mut out, history, report);
    render_revisions(&mut out, history, report);
    render_watches(&mut out, history, report);
    render_availability(&mut out, history, report);
    let v = report.violations();
    let summary = if v > 0 {
        format!("NOT OK: {v} violation(s)")
    } else if report.undecided() {
        "UNDECIDED: no violation found, but linearizability was not decided".to_string()
    } else {
        "ok".to_string()
    };
    let _ = writeln!(out, "\nverdict: {summary} (checked in {elapsed_ms:.1} ms)");
    out
}

fn render_linearizability(out: &mut String, history: &History, report: &HistoryReport) {
    let l = &report.linearizability;
    let state = if !l.violations.is_empty() {
        verdict(l.violations.len())
    } else if !l.undecided.is_empty() {
        format!("UNDECIDED ({} partition(s))", l.undecided.len())
    } else {
        "ok".to_string()
    };
    let _ = writeln!(out, "\nlinearizability: {state}");
    let _ = writeln!(
        out,
        "  {} operations in {} partitions (epoch, key), the largest {}; left out: {} serializable reads, {} failed operations or unknown gets; {} unknown writes known applied from watches; {} search steps",
        l.ops,
        l.partitions,
        l.largest_partition,
        l.serializable_reads,
        l.left_out,
        l.resolved,
        l.steps
    );
    for u in l.undecided.iter().take(MAX_LISTED) {
        let _ = writeln!(
            out,
            "  undecided: epoch {}, key {} ({} operations): {}",
            u.epoch,
            quoted(&u.key),
            u.ops,
            undecided_text(&u.reason)
        );
    }
    more(out, l.undecided.len());
    for v in l.violations.iter().take(MAX_LISTED) {
        render_lin_violation(out, history, v);
    }
    more(out, l.violations.len());
}

fn render_lin_violation(out: &mut String, history: &History, v: &LinViolation) {
    let op = |i: usize| {
        history
            .ops
            .get(i)
            .map_or_else(|| format!("#? ({i})"), op_line)
    };
    let _ = writeln!(
        out,
        "  key {} (epoch {}): not linearizable; linearizable prefix reaching furthest: {} of {} operations{}",
        quoted(&v.key),
        v.epoch,
        v.prefix.len(),
        v.partition.len(),
        if v.prefix.len() > PREFIX_SHOWN {
            format!(", the last {PREFIX_SHOWN}:")
        } else {
            ":".to_string()
        }
    );
    for &i in v
        .prefix
        .iter()
        .skip(v.prefix.len().saturating_sub(PREFIX_SHOWN))
    {
        let _ = writeln!(out, "    {}", op(i));
    }
    let _ = writeln!(out, "    key after it: {}", v.state);
    let _ = writeln!(
        out,
        "    this operation must take effect by its return and cannot:"
    );
    let _ = writeln!(out, "      {}", op(v.blocking));
    let _ = writeln!(
        out,
        "    operations called before that return and not in the prefix (one must come next):"
    );
    for &(i, allowed) in &v.candidates {
        let why = if allowed {
            "possible here, but every way on from it fails"
        } else {
            "impossible from this state"
        };
        let _ = writeln!(out, "      {}   <- {why}", op(i));
    }
    let (from, to) = v.window;
    let overlapping: Vec<usize> = v
        .partition
        .iter()
        .copied()
        .filter(|&i| {
            history.ops.get(i).is_some_and(|o| {
                o.call <= to.unwrap_or(u64::MAX) && o.ret.unwrap_or(u64::MAX) >= from
            })
        })
        .collect();
    let _ = writeln!(
        out,
        "    the operations of {} overlapping the conflict ({} .. {} ms):",
        quoted(&v.key),
        ms(from),
        to.map_or_else(|| "?".to_string(), ms)
    );
    for &i in overlapping.iter().take(SLICE_LINES) {
        let _ = writeln!(out, "      {}", op(i));
    }
    if overlapping.len() > SLICE_LINES {
        let _ = writeln!(
            out,
            "      ... and {} more",
            overlapping.len() - SLICE_LINES
        );
    }
}

fn render_serializable(out: &mut String, history: &History, report: &HistoryReport) {
    let s = &report.serializable;
    let _ = writeln!(
        out,
        "\nserializable reads (monotonic per endpoint): {} ({} reads on {} endpoints)",
        verdict(s.violations.len()),
        s.reads,
        s.endpoints
    );
    for v in s.violations.iter().take(MAX_LISTED) {
        let _ = writeln!(
            out,
            "  revision {} after revision {} on the same endpoint:",
            v.revision, v.earlier_revision
        );
        for i in [v.earlier, v.op] {
            if let Some(op) = history.ops.get(i) {
                let _ = writeln!(out, "    {}", op_line(op));
            }
        }
    }
    more(out, s.violations.len());
}

fn render_revisions(out: &mut String, history: &History, report: &HistoryReport) {
    let r = &report.revisions;
    let _ = writeln!(
        out,
        "\nrevisions (never back in real time): {} ({} responses)",
        verdict(r.violations.len()),
        r.checked
    );
    for v in r.violations.iter().take(MAX_LISTED) {
        let Some(op) = history.ops.get(v.op) else {
            continue;
        };
        match &v.problem {
            RevisionProblem::Backwards {
                source,
                source_revision,
            } => {
                let _ = writeln!(
                    out,
                    "  revision {} {} revision {source_revision}, observed before its call:",
                    v.revision,
                    if v.revision < *source_revision {
                        "is below"
                    } else {
                        "of a change is not above"
                    }
                );
                match source {
                    Source::Op(i) => {
                        if let Some(s) = history.ops.get(*i) {
                            let _ = writeln!(out, "    {}", op_line(s));
                        }
                    }
                    Source::Event { watch, event } => {
                        if let Some(e) = history
                            .watches
                            .get(*watch)
                            .and_then(|w| w.events.get(*event))
                        {
                            let _ = writeln!(
                                out,
                                "    watch {}: {}",
                                history.watches.get(*watch).map_or(0, |w| w.id),
                                event_line(e)
                            );
                        }
                    }
                }
                let _ = writeln!(out, "    {}", op_line(op));
            }
            RevisionProblem::Shared { other } => {
                let _ = writeln!(out, "  two changes share revision {}:", v.revision);
                if let Some(o) = history.ops.get(*other) {
                    let _ = writeln!(out, "    {}", op_line(o));
                }
                let _ = writeln!(out, "    {}", op_line(op));
            }
            RevisionProblem::ModRevisionAbove { mod_revision } => {
                let _ = writeln!(
                    out,
                    "  a get's mod revision {mod_revision} is above its revision {}:",
                    v.revision
                );
                let _ = writeln!(out, "    {}", op_line(op));
            }
        }
    }
    more(out, r.violations.len());
}

fn render_watches(out: &mut String, history: &History, report: &HistoryReport) {
    let w = &report.watches;
    let _ = writeln!(
        out,
        "\nwatches (ordered, no duplicate, no gap, agreeing with the writes): {} ({} watches, {} events; {} unknown writes seen applied)",
        verdict(w.violations.len()),
        w.watches,
        w.events,
        w.resolved.len()
    );
    for v in w.violations.iter().take(MAX_LISTED) {
        let Some(watch) = history.watches.get(v.watch) else {
            continue;
        };
        let event = v.event.and_then(|e| watch.events.get(e));
        let op = |i: &usize| history.ops.get(*i).map_or_else(String::new, op_line);
        let what = match &v.problem {
            WatchProblem::Reordered { previous } => {
                format!("an event below revision {previous} received before it")
            }
            WatchProblem::Duplicate { first_line } => {
                format!("a duplicate of the event on line {first_line}")
            }
            WatchProblem::BeforeStart => "an event below the start revision".to_string(),
            WatchProblem::OutsidePrefix => "an event of a key outside the prefix".to_string(),
            WatchProblem::Gap { .. } => "a gap: this change is missing".to_string(),
            WatchProblem::Mismatch { .. } => {
                "the event disagrees with the write of that revision and key".to_string()
            }
            WatchProblem::NoWrite { similar: None } => {
                "no write of the history explains the event".to_string()
            }
            WatchProblem::NoWrite { similar: Some(_) } => {
                "no write of the history explains the event (a similar write: below)".to_string()
            }
            WatchProblem::TwoRevisions { first, .. } => {
                format!("an unknown write seen at two revisions (first {first})")
            }
            WatchProblem::WronglyCompacted {
                needed,
                compact_revision,
            } => format!(
                "ended compacted at compact revision {}, but it needed revision {needed} next",
                compact_revision.map_or_else(|| "(none reported)".to_string(), |c| c.to_string())
            ),
        };
        let _ = writeln!(out, "  {}: {what}", watch_line(watch));
        if let Some(e) = event {
            let _ = writeln!(out, "    {}", event_line(e));
        }
        match &v.problem {
            WatchProblem::Gap { op: i } => {
                let _ = writeln!(out, "    {}", op(i));
                // The events around the missing revision.
                if let Some(rev) = history.ops.get(*i).and_then(|o| o.result.revision()) {
                    let before = watch.events.iter().rfind(|e| e.revision < rev);
                    let after = watch.events.iter().find(|e| e.revision > rev);
                    for e in [before, after].into_iter().flatten() {
                        let _ = writeln!(out, "    {}", event_line(e));
                    }
                }
            }
            WatchProblem::Mismatch { op: i }
            | WatchProblem::TwoRevisions { op: i, .. }
            | WatchProblem::NoWrite { similar: Some(i) } => {
                let _ = writeln!(out, "    {}", op(i));
            }
            WatchProblem::WronglyCompacted { .. } => {
                if let Some(end) = &watch.end {
                    let _ = writeln!(
                        out,
                        "    last event revision {}, ended at {} ms [line {}]",
                        watch
                            .events
                            .iter()
                            .map(|e| e.revision)
                            .max()
                            .map_or_else(|| "(none)".to_string(), |r| r.to_string()),
                        ms(end.time),
                        end.line
                    );
                }
            }
            _ => {}
        }
    }
    more(out, w.violations.len());
}

fn render_availability(out: &mut String, history: &History, report: &HistoryReport) {
    let a = &report.availability;
    let _ = writeln!(
        out,
        "\navailability: {} operations: {} ok, {} failed, {} unknown; {} ok writes",
        a.ops, a.ok, a.failed, a.unknown, a.ok_writes
    );
    match a.longest_gap {
        Some(g) => {
            let _ = writeln!(
                out,
                "  longest without an ok write: {} ms (from {} ms to {} ms, the call of #{})",
                ms(g.to - g.from),
                ms(g.from),
                ms(g.to),
                history.ops.get(g.until).map_or(0, |o| o.id)
            );
        }
        None => {
            let _ = writeln!(out, "  no ok write at all");
        }
    }
    if let Some(since) = a.since_last_write {
        let _ = writeln!(
            out,
            "  from the last ok write's call to the end of the history: {} ms",
            ms(since)
        );
    }
}
