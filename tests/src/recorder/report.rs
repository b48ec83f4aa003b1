//! A run's report: figures, the checks' verdicts, the members' hashes and, on a violation,
//! the checker's text with the history slice showing it. A few lines as `Display`, one row of
//! a Markdown table for a summary of runs.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use etcd_lincheck::checks::HistoryReport;

use super::finish::HashCheck;

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Passed.
    Ok,
    /// This many violations.
    Violation(usize),
    /// Not decided within the limits.
    Undecided,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Ok => f.write_str("ok"),
            Verdict::Violation(n) => write!(f, "VIOLATION ({n})"),
            Verdict::Undecided => f.write_str("UNDECIDED"),
        }
    }
}

fn verdict(violations: usize) -> Verdict {
    if violations == 0 {
        Verdict::Ok
    } else {
        Verdict::Violation(violations)
    }
}

/// A recorded run, checked.
#[derive(Clone, Debug)]
pub struct Report {
    /// The run's name.
    pub name: String,
    /// The history file.
    pub history: PathBuf,
    /// The checker's text report (beside the history, `.report.txt`).
    pub report_file: PathBuf,
    /// How long the traffic ran.
    pub duration: Duration,
    /// Operations recorded (the final reads included).
    pub ops: usize,
    /// Answered ok.
    pub ok: usize,
    /// Definitely not applied.
    pub failed: usize,
    /// Outcome unknown.
    pub unknown: usize,
    /// Watches opened (each resumption counts), and events received.
    pub watches: (usize, usize),
    /// The longest time without an ok write (ms), if there was one.
    pub longest_without_write_ms: Option<f64>,
    /// Linearizability per key.
    pub linearizability: Verdict,
    /// Watches: ordered, complete, agreeing with the writes.
    pub watch_check: Verdict,
    /// Revisions never back in real time.
    pub revisions: Verdict,
    /// Serializable reads monotonic per endpoint.
    pub serializable: Verdict,
    /// The members' stores compared, if the final read succeeded.
    pub hashes: Option<HashCheck>,
    /// What went wrong at the end of the run (a final read or the hashes), if anything.
    pub end_error: Option<String>,
    /// Whether a cap on operations or events cut the history short.
    pub capped: bool,
    /// The operation the stale-read fault rewrote.
    pub rewritten: Option<u64>,
    /// The checker's text: every check, and for each violation the slice of history.
    pub checker: String,
}

impl Report {
    /// The report of `history`'s checks (`checked`), with the run's figures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        history: &Path,
        report_file: &Path,
        duration: Duration,
        history_data: &etcd_lincheck::history::History,
        checked: &HistoryReport,
        hashes: Option<HashCheck>,
        checker: String,
    ) -> Self {
        let a = &checked.availability;
        let linearizability = if !checked.linearizability.violations.is_empty() {
            Verdict::Violation(checked.linearizability.violations.len())
        } else if checked.undecided() {
            Verdict::Undecided
        } else {
            Verdict::Ok
        };
        Report {
            name: name.to_string(),
            history: history.to_path_buf(),
            report_file: report_file.to_path_buf(),
            duration,
            ops: a.ops,
            ok: a.ok,
            failed: a.failed,
            unknown: a.unknown,
            watches: (
                history_data.watches.len(),
                history_data.watches.iter().map(|w| w.events.len()).sum(),
            ),
            longest_without_write_ms: a.longest_gap.map(|g| (g.to - g.from) as f64 / 1e6),
            linearizability,
            watch_check: verdict(checked.watches.violations.len()),
            revisions: verdict(checked.revisions.violations.len()),
            serializable: verdict(checked.serializable.violations.len()),
            hashes,
            end_error: None,
            capped: false,
            rewritten: None,
            checker,
        }
    }

    /// Operations per second over the traffic's duration.
    pub fn ops_per_sec(&self) -> f64 {
        let secs = self.duration.as_secs_f64();
        if secs > 0.0 {
            self.ops as f64 / secs
        } else {
            0.0
        }
    }

    /// Whether the history passed every check and the members' stores are equal.
    pub fn passed(&self) -> bool {
        self.linearizability == Verdict::Ok
            && self.watch_check == Verdict::Ok
            && self.revisions == Verdict::Ok
            && self.serializable == Verdict::Ok
            && self.hashes.as_ref().is_some_and(HashCheck::equal)
            && self.end_error.is_none()
    }

    /// Whether the stores were compared and found equal.
    pub fn hashes_equal(&self) -> bool {
        self.hashes.as_ref().is_some_and(HashCheck::equal)
    }

    /// The header of the Markdown table [`Self::markdown_row`] is a row of.
    pub const MARKDOWN_HEADER: &str = "| run | ops | ops/s | ok | failed | unknown | longest without an ok write (ms) | linearizable | watches | revisions | serializable reads | hashes |\n|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|\n";

    /// This run as one row of that table.
    pub fn markdown_row(&self) -> String {
        let hashes = match &self.hashes {
            Some(h) if h.equal() => "equal".to_string(),
            Some(_) => "**NOT EQUAL**".to_string(),
            None => "not compared".to_string(),
        };
        let bold = |v: Verdict| match v {
            Verdict::Ok => "ok".to_string(),
            other => format!("**{other}**"),
        };
        format!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            self.name,
            self.ops,
            self.ops_per_sec(),
            self.ok,
            self.failed,
            self.unknown,
            self.longest_without_write_ms
                .map_or_else(|| "-".to_string(), |ms| format!("{ms:.0}")),
            bold(self.linearizability),
            bold(self.watch_check),
            bold(self.revisions),
            bold(self.serializable),
            hashes
        )
    }

    /// Appends [`Self::markdown_row`] to the Markdown file at `path`, writing the header first
    /// when the file is new or empty.
    pub fn append_markdown_row(&self, path: &Path) -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        if file.metadata()?.len() == 0 {
            file.write_all(Self::MARKDOWN_HEADER.as_bytes())?;
        }
        file.write_all(self.markdown_row().as_bytes())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "recorder run {}: {} operations in {:.1} s ({:.0}/s): {} ok, {} failed, {} unknown; longest without an ok write: {}{}",
            self.name,
            self.ops,
            self.duration.as_secs_f64(),
            self.ops_per_sec(),
            self.ok,
            self.failed,
            self.unknown,
            self.longest_without_write_ms
                .map_or_else(|| "no ok write".to_string(), |ms| format!("{ms:.0} ms")),
            if self.capped { " (CAPPED)" } else { "" }
        )?;
        writeln!(
            f,
            "  linearizability: {}; watches: {} ({} opened, {} events); revisions: {}; serializable reads: {}",
            self.linearizability,
            self.watch_check,
            self.watches.0,
            self.watches.1,
            self.revisions,
            self.serializable
        )?;
        match &self.hashes {
            Some(h) => writeln!(f, "  hashes: {h}")?,
            None => writeln!(f, "  hashes: not compared")?,
        }
        if let Some(e) = &self.end_error {
            writeln!(f, "  end of run: {e}")?;
        }
        if let Some(id) = self.rewritten {
            writeln!(
                f,
                "  fault: operation #{id} was recorded with a stale value"
            )?;
        }
        writeln!(
            f,
            "  history: {} (report: {})",
            self.history.display(),
            self.report_file.display()
        )?;
        if self.linearizability != Verdict::Ok
            || self.watch_check != Verdict::Ok
            || self.revisions != Verdict::Ok
            || self.serializable != Verdict::Ok
        {
            writeln!(f, "{}", self.checker)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recorder::finish::{HashMethod, MemberHash};

    fn report() -> Report {
        Report {
            name: "idle".into(),
            history: PathBuf::from("/a/idle.history.jsonl"),
            report_file: PathBuf::from("/a/idle.report.txt"),
            duration: Duration::from_secs(4),
            ops: 400,
            ok: 398,
            failed: 0,
            unknown: 2,
            watches: (2, 300),
            longest_without_write_ms: Some(45.4),
            linearizability: Verdict::Ok,
            watch_check: Verdict::Ok,
            revisions: Verdict::Ok,
            serializable: Verdict::Ok,
            hashes: Some(HashCheck {
                revision: 9,
                method: HashMethod::HashKv,
                members: vec![MemberHash {
                    endpoint: "m".into(),
                    hash: Ok("ab".into()),
                }],
            }),
            end_error: None,
            capped: false,
            rewritten: None,
            checker: "THE CHECKER'S TEXT".into(),
        }
    }

    #[test]
    fn display_and_markdown() {
        let mut r = report();
        assert!(r.passed());
        let text = r.to_string();
        assert!(
            text.starts_with("recorder run idle: 400 operations in 4.0 s (100/s): 398 ok, 0 failed, 2 unknown; longest without an ok write: 45 ms\n"),
            "{text}"
        );
        assert!(!text.contains("THE CHECKER'S TEXT"), "{text}");
        assert_eq!(
            r.markdown_row(),
            "| idle | 400 | 100 | 398 | 0 | 2 | 45 | ok | ok | ok | ok | equal |\n"
        );
        r.linearizability = Verdict::Violation(1);
        assert!(!r.passed());
        assert!(r.to_string().contains("THE CHECKER'S TEXT"));
        assert!(r.markdown_row().contains("| **VIOLATION (1)** |"));

        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("runs.md");
        r.append_markdown_row(&path).expect("append");
        r.append_markdown_row(&path).expect("append");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.matches("| run |").count(), 1, "{text}");
        assert_eq!(text.lines().count(), 4, "{text}");
    }
}
