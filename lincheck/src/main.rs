//! `etcd-lincheck`: checks a recorded history and says so by its exit code.
//!
//! ```text
//! etcd-lincheck --format jepsen-etcd [--timeout 10s] FILE
//! etcd-lincheck --format history [--timeout 10s] FILE
//! ```
//!
//! Exit codes: 0 linearizable (and, for `history`, every other check passed), 1 a violation
//! (the report shows a witness), 2 the input cannot be read (or bad arguments), 3 undecided
//! within the timeout.

use clap::{Parser, ValueEnum};
use etcd_lincheck::checks::check_history;
use etcd_lincheck::duration::parse_duration;
use etcd_lincheck::history::parse_history;
use etcd_lincheck::jepsen::parse_jepsen;
use etcd_lincheck::model::register::RegisterModel;
use etcd_lincheck::report::{render_history, render_jepsen};
use etcd_lincheck::search::{Limits, Outcome, check_partition};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const EXIT_OK: u8 = 0;
const EXIT_VIOLATION: u8 = 1;
const EXIT_INPUT: u8 = 2;
const EXIT_UNDECIDED: u8 = 3;

/// The input formats.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    /// Jepsen's etcd register log (Porcupine's test_data/jepsen/etcd_NNN.log).
    JepsenEtcd,
    /// Our recorder's JSON Lines history.
    History,
}

/// Checks a recorded etcd history: exit 0 linearizable (and every check passed), 1 a
/// violation (with a witness), 2 unreadable input, 3 undecided within the timeout.
#[derive(Debug, Parser)]
#[command(name = "etcd-lincheck", version)]
struct Cli {
    /// The input's format.
    #[arg(long, value_enum)]
    format: Format,
    /// Give up (exit 3) after this long: 10s, 500ms, 2m; 0 for no limit.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    timeout: Duration,
    /// Give up (exit 3) when the search's cache would exceed this many MiB.
    #[arg(long, default_value_t = 1024)]
    max_cache_mib: usize,
    /// The history file.
    file: PathBuf,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_INPUT } else { EXIT_OK });
        }
    };
    ExitCode::from(run(&cli))
}

fn run(cli: &Cli) -> u8 {
    let start = Instant::now();
    let limits = Limits {
        deadline: if cli.timeout.is_zero() {
            None
        } else {
            start.checked_add(cli.timeout)
        },
        max_cache_bytes: cli.max_cache_mib.saturating_mul(1 << 20),
    };
    let name = cli.file.display().to_string();
    let bytes = match std::fs::read(&cli.file) {
        Ok(bytes) => bytes,
        Err(e) => {
            eprintln!("etcd-lincheck: {name}: cannot read: {e}");
            return EXIT_INPUT;
        }
    };
    let elapsed_ms = || start.elapsed().as_secs_f64() * 1e3;
    let (text, code) = match cli.format {
        Format::JepsenEtcd => {
            let ops = match parse_jepsen(&name, &bytes) {
                Ok(ops) => ops,
                Err(e) => {
                    eprintln!("etcd-lincheck: {e}");
                    return EXIT_INPUT;
                }
            };
            let (outcome, stats) = check_partition(&RegisterModel, &ops, &limits);
            let code = match outcome {
                Outcome::Linearizable { .. } => EXIT_OK,
                Outcome::Violation(_) => EXIT_VIOLATION,
                Outcome::Undecided(_) => EXIT_UNDECIDED,
            };
            (
                render_jepsen(&name, &ops, &outcome, &stats, elapsed_ms()),
                code,
            )
        }
        Format::History => {
            let history = match parse_history(&name, &bytes) {
                Ok(history) => history,
                Err(e) => {
                    eprintln!("etcd-lincheck: {e}");
                    return EXIT_INPUT;
                }
            };
            let report = check_history(&history, &limits);
            let code = if report.violations() > 0 {
                EXIT_VIOLATION
            } else if report.undecided() {
                EXIT_UNDECIDED
            } else {
                EXIT_OK
            };
            (render_history(&name, &history, &report, elapsed_ms()), code)
        }
    };
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(text.as_bytes());
    let _ = stdout.flush();
    code
}
