//! Bad input never panics: every truncation and many byte flips of valid inputs either parse
//! (and are checked and reported) or give an input error.

use etcd_lincheck::checks::check_history;
use etcd_lincheck::history::parse_history;
use etcd_lincheck::jepsen::parse_jepsen;
use etcd_lincheck::model::register::RegisterModel;
use etcd_lincheck::report::{render_history, render_jepsen};
use etcd_lincheck::search::{Limits, Stats, check_partition};
use std::time::{Duration, Instant};

const HISTORY: &str = r#"{"kind":"op","id":1,"client":1,"endpoint":"e","call":0,"return":10,"op":{"type":"put","key":"k","value":"a"},"result":{"status":"ok","revision":2}}
{"kind":"op","id":2,"client":2,"endpoint":"e","call":5,"return":null,"op":{"type":"cas","key":"k","expect":"a","value":"b"},"result":{"status":"unknown","error":"x"}}
{"kind":"op","id":3,"client":3,"endpoint":"f","call":20,"return":30,"op":{"type":"get","key":"k","serializable":true},"result":{"status":"ok","revision":3,"value":"b","mod_revision":3}}
{"kind":"op","id":4,"client":3,"endpoint":"f","call":40,"return":50,"op":{"type":"delete","key":"k"},"result":{"status":"ok","revision":4,"deleted":1}}
{"kind":"watch_start","watch":1,"client":9,"endpoint":"e","prefix":"k","start_revision":1,"time":0}
{"kind":"watch_event","watch":1,"time":12,"revision":2,"type":"put","key":"k","value":"a","mod_revision":2}
{"kind":"watch_event","watch":1,"time":25,"revision":3,"type":"put","key":"k","value":"b","mod_revision":3}
{"kind":"watch_end","watch":1,"time":60,"reason":"compacted","compact_revision":9,"error":null}
{"kind":"epoch","time":70,"reason":"recovery"}
{"kind":"op","id":5,"client":3,"endpoint":"f","call":80,"return":90,"op":{"type":"get","key":"k","serializable":false},"result":{"status":"ok","revision":1,"value":null,"mod_revision":null}}
"#;

const JEPSEN: &str = "INFO  jepsen.util - 0\t:invoke\t:write\t1\n\
INFO  jepsen.util - 1\t:invoke\t:cas\t[1 2]\n\
INFO  jepsen.util - 0\t:ok\t:write\t1\n\
INFO  jepsen.util - 2\t:invoke\t:read\tnil\n\
INFO  jepsen.util - 1\t:info\t:cas\t:timed-out\n\
INFO  jepsen.util - 2\t:ok\t:read\t2\n\
INFO  jepsen.util - 3\t:invoke\t:read\tnil\n\
INFO  jepsen.util - 3\t:fail\t:read\t:timed-out\n";

/// Inputs derived from `text`: every prefix, and byte flips from a fixed pseudo-random walk.
fn mutations(text: &str) -> Vec<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out: Vec<Vec<u8>> = (0..=bytes.len()).map(|n| bytes[..n].to_vec()).collect();
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let replacements = b"{}[]\":,0123456789-nulltruefalse \n\t\xff:ok:info:invoke";
    for _ in 0..3000 {
        let mut m = bytes.to_vec();
        for _ in 0..1 + next() % 3 {
            let at = (next() % m.len() as u64) as usize;
            match next() % 3 {
                0 => m[at] = replacements[(next() % replacements.len() as u64) as usize],
                1 => {
                    m.remove(at);
                }
                _ => m.insert(
                    at,
                    replacements[(next() % replacements.len() as u64) as usize],
                ),
            }
        }
        out.push(m);
    }
    out
}

fn limits() -> Limits {
    Limits {
        deadline: Some(Instant::now() + Duration::from_secs(5)),
        ..Limits::default()
    }
}

#[test]
fn mutated_histories_never_panic() {
    let (mut parsed, mut errors) = (0, 0);
    for input in mutations(HISTORY) {
        match parse_history("m.jsonl", &input) {
            Ok(h) => {
                parsed += 1;
                let report = check_history(&h, &limits());
                assert!(!render_history("m.jsonl", &h, &report, 0.0).is_empty());
            }
            Err(e) => {
                errors += 1;
                assert!(e.to_string().starts_with("m.jsonl"), "{e}");
            }
        }
    }
    assert!(
        parsed > 10 && errors > 10,
        "parsed {parsed}, errors {errors}"
    );
}

#[test]
fn mutated_jepsen_logs_never_panic() {
    let (mut parsed, mut errors) = (0, 0);
    for input in mutations(JEPSEN) {
        match parse_jepsen("m.log", &input) {
            Ok(ops) => {
                parsed += 1;
                let (outcome, stats) = check_partition(&RegisterModel, &ops, &limits());
                let _: &Stats = &stats;
                assert!(!render_jepsen("m.log", &ops, &outcome, &stats, 0.0).is_empty());
            }
            Err(e) => {
                errors += 1;
                assert!(e.to_string().starts_with("m.log"), "{e}");
            }
        }
    }
    assert!(
        parsed > 10 && errors > 10,
        "parsed {parsed}, errors {errors}"
    );
}
