//! Porcupine's own validation data: the 102 Jepsen etcd histories of
//! anishathalye/porcupine v1.3.1 with the verdicts its `porcupine_test.go` expects
//! (`checkJepsen(t, N, true|false)`), run through the binary. Fetched by
//! `ONLY=porcupine hack/build-tools.sh` into `$ETCD_OPERATOR_TOOLS/porcupine/v1.3.1/`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const VERSION: &str = "v1.3.1";

fn porcupine_dir() -> PathBuf {
    let tools = std::env::var_os("ETCD_OPERATOR_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_default();
            home.join(".cache/etcd-operator/tools")
        });
    tools.join("porcupine").join(VERSION)
}

/// The (history number, linearizable) pairs `porcupine_test.go` states.
fn expected_verdicts(test_go: &str) -> Vec<(u32, bool)> {
    let call = "checkJepsen(t, ";
    test_go
        .match_indices(call)
        .filter_map(|(at, _)| {
            let rest = &test_go[at + call.len()..];
            let (args, _) = rest.split_once(')')?;
            let (n, verdict) = args.split_once(',')?;
            let verdict = match verdict.trim() {
                "true" => true,
                "false" => false,
                _ => return None,
            };
            Some((n.trim().parse().ok()?, verdict))
        })
        .collect()
}

#[test]
fn every_porcupine_jepsen_history_gets_porcupines_verdict() {
    let dir = porcupine_dir();
    let test_go = dir.join("porcupine_test.go");
    let Ok(source) = std::fs::read_to_string(&test_go) else {
        panic!(
            "{} is missing: fetch Porcupine's test data with `ONLY=porcupine hack/build-tools.sh` \
             (from the repository root; ETCD_OPERATOR_TOOLS sets the tools directory)",
            test_go.display()
        );
    };
    let expected = expected_verdicts(&source);
    assert!(
        expected.len() >= 100,
        "only {} checkJepsen calls found in {}",
        expected.len(),
        test_go.display()
    );

    let mut timings: Vec<(Duration, u32)> = Vec::new();
    let mut disagreements = Vec::new();
    for &(n, linearizable) in &expected {
        let log = dir.join(format!("test_data/jepsen/etcd_{n:03}.log"));
        assert!(
            log.is_file(),
            "{} is missing (run `ONLY=porcupine hack/build-tools.sh`)",
            log.display()
        );
        let start = Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_etcd-lincheck"))
            .args(["--format", "jepsen-etcd", "--timeout", "60s"])
            .arg(&log)
            .output()
            .unwrap();
        let took = start.elapsed();
        timings.push((took, n));
        let want = if linearizable { 0 } else { 1 };
        if out.status.code() != Some(want) {
            disagreements.push(format!(
                "etcd_{n:03}.log: exit {:?}, Porcupine says {} (exit {want})\n{}{}",
                out.status.code(),
                if linearizable {
                    "linearizable"
                } else {
                    "not linearizable"
                },
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    timings.sort();
    let median = timings[timings.len() / 2].0;
    let (max, slowest) = timings[timings.len() - 1];
    let total: Duration = timings.iter().map(|t| t.0).sum();
    let linearizable = expected.iter().filter(|e| e.1).count();
    println!(
        "{} of {} Porcupine Jepsen histories agree ({linearizable} linearizable, {} not); per history \
         (the binary's whole run, this build's profile): median {median:?}, max {max:?} (etcd_{slowest:03}), total {total:?}",
        expected.len() - disagreements.len(),
        expected.len(),
        expected.len() - linearizable,
    );
    for (t, n) in timings.iter().rev().take(5) {
        println!("  etcd_{n:03}.log {t:?}");
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
    assert!(
        max < Duration::from_secs(30),
        "etcd_{slowest:03}.log took {max:?}"
    );
}

#[test]
fn the_verdict_parser_reads_porcupines_test_file_form() {
    let text = "func checkJepsen(t *testing.T, logNum int, correct bool) {\n\
                func TestEtcdJepsen000(t *testing.T) {\n\tcheckJepsen(t, 0, false)\n}\n\
                // etcd cluster failed to start up in test 95\n\
                func TestEtcdJepsen102(t *testing.T) {\n\tcheckJepsen(t, 102, true)\n}\n";
    assert_eq!(expected_verdicts(text), vec![(0, false), (102, true)]);
}
