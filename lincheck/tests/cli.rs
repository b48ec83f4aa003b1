//! The command-line contract: exit 0 linearizable, 1 violation, 2 unreadable input (naming
//! the file and line), 3 undecided within the timeout.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn write(name: &str, text: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("lincheck-cli");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn run(args: &[&str]) -> (i32, String, String, Duration) {
    let start = Instant::now();
    let Output {
        status,
        stdout,
        stderr,
    } = Command::new(env!("CARGO_BIN_EXE_etcd-lincheck"))
        .args(args)
        .output()
        .unwrap();
    let code = status.code().expect("an exit code, not a signal");
    (
        code,
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
        start.elapsed(),
    )
}

fn jepsen(lines: &[(u32, &str, &str, &str)]) -> String {
    lines
        .iter()
        .map(|(p, t, f, v)| format!("INFO  jepsen.util - {p}\t{t}\t{f}\t{v}\n"))
        .collect()
}

#[test]
fn jepsen_linearizable_is_0_and_violation_is_1() {
    let ok = write(
        "ok.log",
        &jepsen(&[
            (0, ":invoke", ":write", "1"),
            (1, ":invoke", ":read", "nil"),
            (1, ":ok", ":read", "1"),
            (0, ":ok", ":write", "1"),
        ]),
    );
    let (code, out, err, _) = run(&["--format", "jepsen-etcd", ok.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("linearizability: ok"), "{out}");

    let bad = write(
        "bad.log",
        &jepsen(&[
            (0, ":invoke", ":write", "1"),
            (0, ":ok", ":write", "1"),
            (1, ":invoke", ":read", "nil"),
            (1, ":ok", ":read", "nil"),
        ]),
    );
    let (code, out, err, _) = run(&[
        "--format",
        "jepsen-etcd",
        "--timeout",
        "10s",
        bad.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("linearizability: VIOLATION"), "{out}");
    assert!(
        out.contains("process 1   lines 3-4        read() -> nil   <- impossible from this state"),
        "{out}"
    );
}

#[test]
fn history_exit_codes_0_and_1() {
    let line = |id: u32, call: u64, ret: u64, op: &str, result: &str| {
        format!(
            r#"{{"kind":"op","id":{id},"client":1,"endpoint":"e","call":{call},"return":{ret},"op":{op},"result":{result}}}"#
        )
    };
    let put = line(
        1,
        0,
        10,
        r#"{"type":"put","key":"k","value":"a"}"#,
        r#"{"status":"ok","revision":2}"#,
    );
    let good_get = line(
        2,
        20,
        30,
        r#"{"type":"get","key":"k","serializable":false}"#,
        r#"{"status":"ok","revision":2,"value":"a","mod_revision":2}"#,
    );
    let stale_get = line(
        2,
        20,
        30,
        r#"{"type":"get","key":"k","serializable":false}"#,
        r#"{"status":"ok","revision":2,"value":null,"mod_revision":null}"#,
    );
    let ok = write("ok.jsonl", &format!("{put}\n{good_get}\n"));
    let (code, out, err, _) = run(&["--format", "history", ok.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("verdict: ok"), "{out}");
    let bad = write("bad.jsonl", &format!("{put}\n{stale_get}\n"));
    let (code, out, err, _) = run(&["--format", "history", bad.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("verdict: NOT OK: 1 violation(s)"), "{out}");
}

#[test]
fn unreadable_input_is_2_with_file_and_line() {
    let garbage = write(
        "garbage.log",
        "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n\u{1}\u{2} garbage\n",
    );
    let path = garbage.to_str().unwrap();
    let (code, out, err, _) = run(&["--format", "jepsen-etcd", path]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains(&format!("{path}:2: not a line of a Jepsen log")),
        "{err}"
    );

    let garbage = write(
        "garbage.jsonl",
        "{\"kind\":\"epoch\",\"time\":1}\n{\"kind\":\"op\",\"id\":\n",
    );
    let path = garbage.to_str().unwrap();
    let (code, _, err, _) = run(&["--format", "history", path]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{path}:2: EOF while parsing")),
        "{err}"
    );

    let unknown = write("unknown-kind.jsonl", "{\"kind\":\"lease\",\"time\":1}\n");
    let path = unknown.to_str().unwrap();
    let (code, _, err, _) = run(&["--format", "history", path]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&format!("{path}:1: unknown variant `lease`")),
        "{err}"
    );

    let binary = write("binary.jsonl", "{\"kind\":\"epoch\",\"time\":1}\n");
    std::fs::write(&binary, b"\xff\xfe\x00garbage").unwrap();
    let path = binary.to_str().unwrap();
    let (code, _, err, _) = run(&["--format", "history", path]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("{path}:1: not UTF-8 text")), "{err}");

    let (code, _, err, _) = run(&["--format", "history", "/nonexistent/h.jsonl"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/h.jsonl: cannot read"), "{err}");

    let (code, _, err, _) = run(&["--format", "history", "--timeout", "ten", path]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("invalid duration"), "{err}");
    let (code, _, _, _) = run(&["--format", "xml", path]);
    assert_eq!(code, 2);
}

/// 22 concurrent writes and a read of a value never written: the search must try every
/// subset of the writes before it can say no.
fn pathological_jepsen() -> String {
    let mut lines = Vec::new();
    for p in 0..22u32 {
        lines.push((p, ":invoke", ":write", format!("{}", p + 1)));
    }
    lines.push((100, ":invoke", ":read", "nil".to_string()));
    lines.push((100, ":ok", ":read", "999".to_string()));
    for p in 0..22u32 {
        lines.push((p, ":ok", ":write", format!("{}", p + 1)));
    }
    lines
        .iter()
        .map(|(p, t, f, v)| format!("INFO  jepsen.util - {p}\t{t}\t{f}\t{v}\n"))
        .collect()
}

#[test]
fn undecided_within_the_timeout_is_3() {
    let path = write("pathological.log", &pathological_jepsen());
    let (code, out, err, took) = run(&[
        "--format",
        "jepsen-etcd",
        "--timeout",
        "300ms",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("linearizability: UNDECIDED (the timeout passed)"),
        "{out}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");

    // The same in our format: one key, 22 concurrent puts, an impossible get.
    let mut lines = Vec::new();
    for id in 0..22u32 {
        lines.push(format!(
            r#"{{"kind":"op","id":{id},"client":{id},"endpoint":"e","call":1,"return":100,"op":{{"type":"put","key":"k","value":"v{id}"}},"result":{{"status":"ok","revision":{}}}}}"#,
            id + 2
        ));
    }
    lines.push(r#"{"kind":"op","id":99,"client":99,"endpoint":"e","call":2,"return":3,"op":{"type":"get","key":"k","serializable":false},"result":{"status":"ok","revision":1,"value":"never","mod_revision":1}}"#.to_string());
    let path = write("pathological.jsonl", &lines.join("\n"));
    let (code, out, err, took) = run(&[
        "--format",
        "history",
        "--timeout",
        "300ms",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("undecided: epoch 0, key \"k\" (23 operations): the timeout passed"),
        "{out}"
    );
    assert!(out.contains("verdict: UNDECIDED"), "{out}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn the_cache_cap_also_gives_3() {
    let path = write("pathological-cap.log", &pathological_jepsen());
    let (code, out, err, _) = run(&[
        "--format",
        "jepsen-etcd",
        "--timeout",
        "60s",
        "--max-cache-mib",
        "1",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("the search cache reached its cap"), "{out}");
}
