//! A correction of the recorder's classification for runs that reach etcd's NOSPACE alarm.
//!
//! The recorder counts every `ResourceExhausted: etcdserver: mvcc: database space exceeded`
//! answer as `fail` (definitely not applied). etcd does not promise that: the write whose
//! apply crosses the quota is applied and answered NOSPACE all the same (etcd 3.6,
//! `server/etcdserver/apply/apply.go`: `quotaApplierV3.Put` and `.Txn` apply, then return
//! `ErrNoSpace` when the quota was not available), and the alarm is raised after it. Recorded
//! as `fail`, such a put makes the checker report a read of its value as a violation that is
//! not there.
//!
//! What etcd does promise: every NOSPACE answer is sent after the NOSPACE alarm entry was
//! applied by the member answering (the API-level check raises the alarm and waits before it
//! answers; the apply-level one answers once its alarm request returned), and every entry
//! after the alarm in the log goes through the capped applier, which refuses puts and
//! transactions. So a write *called* after some NOSPACE answer had *returned* was proposed
//! after the alarm was committed and is definitely not applied; only the NOSPACE-failed writes
//! called before the first NOSPACE answer returned may have been applied. Those are made
//! `unknown` here (a sound over-approximation) and the history is checked again.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_lincheck::checks::check_history;
use etcd_lincheck::history::parse_history;
use etcd_lincheck::report::render_history;
use etcd_lincheck::search::Limits;
use etcd_tests::recorder::Report;
use serde_json::{Value, json};

/// etcd's NOSPACE message, as the recorder writes it in the error.
const NO_SPACE: &str = "database space exceeded";

/// How long the second check may search.
const CHECK_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether `record` is a write (put or cas) recorded as failed with NOSPACE.
fn failed_with_no_space(record: &Value) -> bool {
    record["kind"] == "op"
        && matches!(record["op"]["type"].as_str(), Some("put" | "cas"))
        && record["result"]["status"] == "fail"
        && record["result"]["error"]
            .as_str()
            .is_some_and(|e| e.contains(NO_SPACE))
}

/// The history of `report` with the NOSPACE-failed writes called before the first NOSPACE
/// answer returned made `unknown`; returns the new lines and how many were changed.
fn reclassify(text: &str) -> anyhow::Result<(String, usize)> {
    let mut records: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("reading the history")?;
    let first_answer = records
        .iter()
        .filter(|r| failed_with_no_space(r))
        .filter_map(|r| r["return"].as_u64())
        .min();
    let mut changed = 0;
    if let Some(first_answer) = first_answer {
        for record in &mut records {
            let called = record["call"].as_u64().unwrap_or(u64::MAX);
            if failed_with_no_space(record) && called < first_answer {
                let error = record["result"]["error"].clone();
                record["result"] = json!({"status": "unknown", "error": error});
                record["return"] = Value::Null;
                changed += 1;
            }
        }
    }
    let mut out = String::new();
    for record in &records {
        out.push_str(&serde_json::to_string(record)?);
        out.push('\n');
    }
    Ok((out, changed))
}

/// `path` with `.history.jsonl` (or `.report.txt`) replaced by `.nospace` + that suffix.
fn beside(path: &std::path::Path, suffix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(suffix)
        .map_or(name.clone(), str::to_string);
    path.with_file_name(format!("{stem}.nospace{suffix}"))
}

/// Checks the history of `report` again with the writes NOSPACE may have applied made
/// `unknown` (see the module docs); the report of that check (the same figures and hashes),
/// its history and report written beside the original as `NAME.nospace.*`.
pub async fn recheck(report: &Report) -> anyhow::Result<(Report, usize)> {
    let original = report.clone();
    tokio::task::spawn_blocking(move || {
        let text = std::fs::read_to_string(&original.history)
            .with_context(|| format!("reading {}", original.history.display()))?;
        let (text, changed) = reclassify(&text)?;
        let history_path = beside(&original.history, ".history.jsonl");
        let report_path = beside(&original.report_file, ".report.txt");
        std::fs::write(&history_path, &text)?;
        let started = Instant::now();
        let file = history_path.display().to_string();
        let history = parse_history(&file, text.as_bytes())?;
        let limits = Limits {
            deadline: started.checked_add(CHECK_TIMEOUT),
            max_cache_bytes: 512 << 20,
        };
        let checked = check_history(&history, &limits);
        let rendered = render_history(
            &file,
            &history,
            &checked,
            started.elapsed().as_secs_f64() * 1e3,
        );
        std::fs::write(&report_path, &rendered)?;
        let mut rechecked = Report::new(
            &format!("{} (NOSPACE writes in flight: unknown)", original.name),
            &history_path,
            &report_path,
            original.duration,
            &history,
            &checked,
            original.hashes.clone(),
            rendered,
        );
        rechecked.end_error = original.end_error.clone();
        rechecked.capped = original.capped;
        anyhow::Ok((rechecked, changed))
    })
    .await?
}
