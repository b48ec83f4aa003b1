//! The short fuzz run CI does: 4,000 inputs from the seed corpus through `/validate` and
//! `/mutate`, in-process (`Reviewer::review` and the HTTP router), under `cargo test` (a debug
//! build). It fails on any panic, internal error, HTTP 5xx, malformed answer or patch that does
//! not apply, on an echoed value, and on a call over a generous bound (2 s plus 1 s per MiB of
//! body: a debug build on a shared 2-CPU machine, bodies up to the default 4 MiB limit), so it
//! is not flaky; the long run with the real bound is `benches/fuzz.rs`. See
//! `tests/support/fuzz.rs` for the mutations.
//!
//! ```sh
//! cargo test -p etcd-webhook --test fuzz                          # seed 14, 4,000 inputs
//! cargo test -p etcd-webhook --test fuzz -- --seed 7 --inputs 50000
//! cargo test -p etcd-webhook --test fuzz -- --replay FILE         # a saved failing input
//! cargo test -p etcd-webhook --test fuzz -- --seed S --first I --inputs 1   # input I again
//! ```
//!
//! Environment: `FUZZ_SEED`, `FUZZ_INPUTS`, `FUZZ_FIRST`, `FUZZ_MAX_LATENCY_MS`, `FUZZ_OUT`
//! (where failing inputs are written; default `target/tmp/fuzz-failures`).

#[path = "support/fuzz.rs"]
mod fuzz;

use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let options =
        fuzz::Options::from_env_and_args(4_000, Duration::from_secs(2), Duration::from_secs(1));
    let (report, options, corpus) = fuzz::Fuzzer::new(options).run();
    print!("{}", report.text(&options, &corpus));
    if report.failed() == 0 {
        println!("test fuzz ... ok");
        ExitCode::SUCCESS
    } else {
        println!("test fuzz ... FAILED ({} failing calls)", report.failed());
        ExitCode::FAILURE
    }
}
