//! The long fuzz run: by default 1,000,000 inputs from the seed corpus through `/validate`
//! and `/mutate`, in-process (`Reviewer::review` and the HTTP router, each call timed), in a
//! release build. It states the bound and fails above it: no call over 50 ms plus 50 ms per MiB
//! of body (250 ms at the default 4 MiB limit; bodies are capped there), 0 panics, 0 internal
//! errors, 0 HTTP 5xx, every answer an AdmissionReview for the request with no echoed value,
//! and every mutate patch applicable to its object. Prints inputs, inputs/s, the failures, and
//! p50/p99/p99.9/p99.99/max latency of both paths and by body size. The
//! short CI run is `tests/fuzz.rs`; the mutations are in `tests/support/fuzz.rs`.
//!
//! ```sh
//! cargo bench -p etcd-webhook --bench fuzz                         # seed 14, 1,000,000 inputs
//! cargo bench -p etcd-webhook --bench fuzz -- --inputs 5000000 --seed 99
//! cargo bench -p etcd-webhook --bench fuzz -- --max-latency-ms 20 --latency-per-mib-ms 40
//! cargo bench -p etcd-webhook --bench fuzz -- --replay FILE       # a saved failing input
//! ```

#[path = "../tests/support/fuzz.rs"]
mod fuzz;

use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    let options = fuzz::Options::from_env_and_args(
        1_000_000,
        Duration::from_millis(50),
        Duration::from_millis(50),
    );
    let (report, options, corpus) = fuzz::Fuzzer::new(options).run();
    print!("{}", report.text(&options, &corpus));
    if report.failed() == 0 {
        println!(
            "fuzz: PASS: 0 panics, 0 5xx, no call over {} ms + {} ms per MiB in {} inputs",
            options.max_latency.as_millis(),
            options.latency_per_mib.as_millis(),
            report.inputs
        );
        ExitCode::SUCCESS
    } else {
        println!("fuzz: FAIL: {} failing calls", report.failed());
        ExitCode::FAILURE
    }
}
