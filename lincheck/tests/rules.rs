//! Tiny hand-written histories, one per rule of the checks.

use etcd_lincheck::checks::revisions::RevisionProblem;
use etcd_lincheck::checks::watches::WatchProblem;
use etcd_lincheck::checks::{HistoryReport, check_history};
use etcd_lincheck::history::{History, parse_history};
use etcd_lincheck::report::render_history;
use etcd_lincheck::search::Limits;

/// Times are given in ms and written in ns.
const MS: u64 = 1_000_000;

fn op(id: u64, call: u64, ret: Option<u64>, op: &str, result: &str) -> String {
    let ret = ret.map_or_else(|| "null".to_string(), |r| (r * MS).to_string());
    format!(
        r#"{{"kind":"op","id":{id},"client":{id},"endpoint":"e{}","call":{},"return":{ret},"op":{op},"result":{result}}}"#,
        id % 2,
        call * MS
    )
}
fn put(key: &str, value: &str) -> String {
    format!(r#"{{"type":"put","key":"{key}","value":"{value}"}}"#)
}
fn get(key: &str) -> String {
    format!(r#"{{"type":"get","key":"{key}","serializable":false}}"#)
}
fn sget(key: &str) -> String {
    format!(r#"{{"type":"get","key":"{key}","serializable":true}}"#)
}
fn del(key: &str) -> String {
    format!(r#"{{"type":"delete","key":"{key}"}}"#)
}
fn cas(key: &str, expect: Option<&str>, value: &str) -> String {
    let expect = expect.map_or_else(|| "null".to_string(), |e| format!("\"{e}\""));
    format!(r#"{{"type":"cas","key":"{key}","expect":{expect},"value":"{value}"}}"#)
}
fn ok(revision: i64) -> String {
    format!(r#"{{"status":"ok","revision":{revision}}}"#)
}
fn read(revision: i64, value: Option<&str>) -> String {
    let value = value.map_or_else(|| "null".to_string(), |v| format!("\"{v}\""));
    format!(r#"{{"status":"ok","revision":{revision},"value":{value},"mod_revision":null}}"#)
}
fn swapped(revision: i64, succeeded: bool) -> String {
    format!(r#"{{"status":"ok","revision":{revision},"succeeded":{succeeded}}}"#)
}
fn deleted(revision: i64, n: i64) -> String {
    format!(r#"{{"status":"ok","revision":{revision},"deleted":{n}}}"#)
}
fn unknown() -> String {
    r#"{"status":"unknown","error":"context deadline exceeded"}"#.to_string()
}
fn failed() -> String {
    r#"{"status":"fail","error":"etcdserver: too many requests"}"#.to_string()
}
fn watch_start(watch: u64, prefix: &str, start: i64, time: u64) -> String {
    format!(
        r#"{{"kind":"watch_start","watch":{watch},"client":9,"endpoint":"e0","prefix":"{prefix}","start_revision":{start},"time":{}}}"#,
        time * MS
    )
}
fn event(watch: u64, time: u64, revision: i64, key: &str, value: Option<&str>) -> String {
    let (kind, value) = match value {
        Some(v) => ("put", format!("\"{v}\"")),
        None => ("delete", "null".to_string()),
    };
    format!(
        r#"{{"kind":"watch_event","watch":{watch},"time":{},"revision":{revision},"type":"{kind}","key":"{key}","value":{value},"mod_revision":{revision}}}"#,
        time * MS
    )
}
fn watch_end(watch: u64, time: u64, reason: &str, compact: Option<i64>) -> String {
    let compact = compact.map_or_else(|| "null".to_string(), |c| c.to_string());
    format!(
        r#"{{"kind":"watch_end","watch":{watch},"time":{},"reason":"{reason}","compact_revision":{compact},"error":null}}"#,
        time * MS
    )
}
fn epoch(time: u64) -> String {
    format!(
        r#"{{"kind":"epoch","time":{},"reason":"recovery"}}"#,
        time * MS
    )
}

fn check(lines: &[String]) -> (History, HistoryReport) {
    let text = lines.join("\n");
    let history = parse_history("t.jsonl", text.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let report = check_history(&history, &Limits::default());
    (history, report)
}

fn text(lines: &[String]) -> String {
    let (h, r) = check(lines);
    render_history("t.jsonl", &h, &r, 0.0)
}

fn lin_keys(r: &HistoryReport) -> Vec<&str> {
    r.linearizability
        .violations
        .iter()
        .map(|v| v.key.as_str())
        .collect()
}

#[test]
fn a_clean_history_passes_every_check() {
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &ok(2)),
        op(2, 5, Some(15), &get("k"), &read(2, Some("a"))),
        op(
            3,
            20,
            Some(30),
            &cas("k", Some("a"), "b"),
            &swapped(3, true),
        ),
        op(
            4,
            40,
            Some(50),
            &cas("k", Some("a"), "c"),
            &swapped(3, false),
        ),
        op(5, 60, Some(70), &del("k"), &deleted(4, 1)),
        op(6, 80, Some(90), &get("k"), &read(4, None)),
        op(7, 80, Some(90), &del("k"), &deleted(4, 0)),
        op(8, 95, Some(99), &sget("k"), &read(4, None)),
        watch_start(1, "k", 1, 0),
        event(1, 12, 2, "k", Some("a")),
        event(1, 32, 3, "k", Some("b")),
        event(1, 72, 4, "k", None),
        watch_end(1, 100, "closed", None),
    ];
    let (_, r) = check(&h);
    assert_eq!(r.violations(), 0, "{}", text(&h));
    assert!(!r.undecided());
    assert_eq!(r.linearizability.ops, 7);
    assert_eq!(r.linearizability.serializable_reads, 1);
    assert_eq!(r.watches.events, 3);
    assert_eq!(r.availability.ok, 8);
    assert_eq!(r.availability.ok_writes, 5);
}

#[test]
fn a_stale_read_is_not_linearizable() {
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &ok(2)),
        op(2, 20, Some(30), &put("k", "b"), &ok(3)),
        op(3, 40, Some(50), &get("k"), &read(3, Some("a"))),
    ];
    let (_, r) = check(&h);
    assert_eq!(lin_keys(&r), vec!["k"]);
    let v = &r.linearizability.violations[0];
    assert_eq!(v.prefix, vec![0, 1]);
    assert_eq!(v.blocking, 2);
    assert_eq!(v.state, "\"b\"");
    let report = text(&h);
    assert!(
        report.contains("linearizability: VIOLATION (1)"),
        "{report}"
    );
    assert!(
        report.contains("get \"k\" -> \"a\", revision 3"),
        "{report}"
    );
    assert!(
        report.contains("the operations of \"k\" overlapping the conflict (40.000 .. 50.000 ms)"),
        "{report}"
    );
}

#[test]
fn a_lost_update_is_not_linearizable() {
    // The put was acknowledged; a read after it finds the key absent.
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &ok(2)),
        op(2, 20, Some(30), &get("k"), &read(2, None)),
        op(3, 0, Some(10), &put("other", "x"), &ok(3)),
    ];
    let (_, r) = check(&h);
    assert_eq!(lin_keys(&r), vec!["k"]);
}

#[test]
fn a_cas_that_succeeded_twice_is_not_linearizable() {
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &ok(2)),
        op(
            2,
            20,
            Some(40),
            &cas("k", Some("a"), "b"),
            &swapped(3, true),
        ),
        op(
            3,
            25,
            Some(45),
            &cas("k", Some("a"), "c"),
            &swapped(4, true),
        ),
    ];
    let (_, r) = check(&h);
    assert_eq!(lin_keys(&r), vec!["k"]);
    // One of them failing is fine.
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &ok(2)),
        op(
            2,
            20,
            Some(40),
            &cas("k", Some("a"), "b"),
            &swapped(3, true),
        ),
        op(
            3,
            25,
            Some(45),
            &cas("k", Some("a"), "c"),
            &swapped(3, false),
        ),
    ];
    assert_eq!(check(&h).1.violations(), 0);
}

#[test]
fn a_create_if_absent_sees_the_key_absent() {
    let h = [
        op(1, 0, Some(10), &cas("k", None, "a"), &swapped(2, true)),
        op(2, 20, Some(30), &cas("k", None, "b"), &swapped(3, true)),
    ];
    assert_eq!(lin_keys(&check(&h).1), vec!["k"]);
}

#[test]
fn a_delete_of_an_absent_key_deletes_nothing() {
    let h = [op(1, 0, Some(10), &del("k"), &deleted(2, 1))];
    assert_eq!(lin_keys(&check(&h).1), vec!["k"]);
}

#[test]
fn an_unknown_put_read_later_is_linearizable() {
    let h = [
        op(1, 0, None, &put("k", "a"), &unknown()),
        op(2, 20, Some(30), &get("k"), &read(1, None)),
        op(3, 40, Some(50), &get("k"), &read(2, Some("a"))),
    ];
    let (_, r) = check(&h);
    assert_eq!(r.violations(), 0, "{}", text(&h));
    assert_eq!(r.availability.unknown, 1);
}

#[test]
fn an_unknown_put_never_seen_is_linearizable() {
    let h = [
        op(1, 0, None, &put("k", "a"), &unknown()),
        op(2, 20, Some(30), &get("k"), &read(1, None)),
        op(3, 40, Some(50), &get("k"), &read(1, None)),
    ];
    assert_eq!(check(&h).1.violations(), 0);
}

#[test]
fn an_unknown_put_is_not_read_before_its_call() {
    let h = [
        op(1, 0, Some(10), &get("k"), &read(1, Some("a"))),
        op(2, 20, None, &put("k", "a"), &unknown()),
    ];
    assert_eq!(lin_keys(&check(&h).1), vec!["k"]);
}

#[test]
fn a_failed_put_is_not_applied() {
    let h = [
        op(1, 0, Some(10), &put("k", "a"), &failed()),
        op(2, 20, Some(30), &get("k"), &read(1, Some("a"))),
    ];
    let (_, r) = check(&h);
    assert_eq!(lin_keys(&r), vec!["k"]);
    assert_eq!(r.availability.failed, 1);
    assert_eq!(r.linearizability.left_out, 1);
}

#[test]
fn an_unknown_put_a_watch_saw_took_effect_before_the_event() {
    // Without the watch, the put may never have happened: linearizable.
    let base = [
        op(1, 0, None, &put("k", "a"), &unknown()),
        op(2, 100, Some(110), &get("k"), &read(2, None)),
    ];
    assert_eq!(lin_keys(&check(&base).1), Vec::<&str>::new());
    // The watch received it at 50 ms: the get after cannot miss it.
    let mut seen = base.to_vec();
    seen.extend([watch_start(1, "k", 1, 0), event(1, 50, 2, "k", Some("a"))]);
    let (_, r) = check(&seen);
    assert_eq!(r.watches.resolved.len(), 1);
    assert_eq!(r.linearizability.resolved, 1);
    assert_eq!(lin_keys(&r), vec!["k"]);
}

#[test]
fn a_watch_gap_is_found() {
    let h = [
        op(1, 0, Some(10), &put("k/a", "1"), &ok(2)),
        op(2, 20, Some(30), &put("k/b", "2"), &ok(3)),
        op(3, 40, Some(50), &put("k/a", "3"), &ok(4)),
        op(4, 40, Some(50), &put("other", "4"), &ok(5)),
        watch_start(1, "k/", 1, 0),
        event(1, 12, 2, "k/a", Some("1")),
        event(1, 52, 4, "k/a", Some("3")),
    ];
    let (_, r) = check(&h);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert_eq!(problems, vec![&WatchProblem::Gap { op: 1 }]);
    let report = text(&h);
    assert!(report.contains("a gap: this change is missing"), "{report}");
    assert!(
        report.contains("put \"k/b\" = \"2\" -> ok, revision 3"),
        "{report}"
    );
}

#[test]
fn a_duplicate_watch_event_is_found() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(2)),
        watch_start(1, "k", 1, 0),
        event(1, 12, 2, "k", Some("1")),
        event(1, 13, 2, "k", Some("1")),
    ];
    let (_, r) = check(&h);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert!(
        matches!(problems[..], [WatchProblem::Duplicate { .. }]),
        "{problems:?}"
    );
}

#[test]
fn a_reordered_watch_is_found() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(2)),
        op(2, 20, Some(30), &put("k", "2"), &ok(3)),
        watch_start(1, "k", 1, 0),
        event(1, 32, 3, "k", Some("2")),
        event(1, 33, 2, "k", Some("1")),
    ];
    let (_, r) = check(&h);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert_eq!(problems, vec![&WatchProblem::Reordered { previous: 3 }]);
}

#[test]
fn a_watch_event_must_match_the_write() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(2)),
        watch_start(1, "k", 1, 0),
        event(1, 12, 2, "k", Some("2")),
        event(1, 13, 3, "k", Some("never written")),
    ];
    let (_, r) = check(&h);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert_eq!(
        problems,
        vec![
            &WatchProblem::Mismatch { op: 0 },
            &WatchProblem::NoWrite { similar: None }
        ]
    );
}

#[test]
fn a_watch_event_below_its_start_or_outside_its_prefix_is_found() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(2)),
        op(2, 20, Some(30), &put("j", "2"), &ok(3)),
        watch_start(1, "k", 3, 0),
        event(1, 12, 2, "k", Some("1")),
        event(1, 32, 3, "j", Some("2")),
    ];
    let (_, r) = check(&h);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert_eq!(
        problems,
        vec![&WatchProblem::BeforeStart, &WatchProblem::OutsidePrefix]
    );
}

#[test]
fn a_compacted_watch_must_have_asked_for_a_compacted_revision() {
    let wrong = [
        op(1, 0, Some(10), &put("k", "1"), &ok(10)),
        watch_start(1, "k", 10, 20),
        watch_end(1, 30, "compacted", Some(5)),
    ];
    let (_, r) = check(&wrong);
    let problems: Vec<_> = r.watches.violations.iter().map(|v| &v.problem).collect();
    assert_eq!(
        problems,
        vec![&WatchProblem::WronglyCompacted {
            needed: 10,
            compact_revision: Some(5)
        }]
    );
    assert!(
        text(&wrong)
            .contains("ended compacted at compact revision 5, but it needed revision 10 next")
    );
    // Asked for 3, compacted at 5: right.
    let right = [
        op(1, 0, Some(10), &put("k", "1"), &ok(10)),
        watch_start(1, "k", 3, 20),
        watch_end(1, 30, "compacted", Some(5)),
    ];
    assert_eq!(check(&right).1.violations(), 0);
    // Having received revision 10 already, a compaction at 5 cannot stop it.
    let late = [
        op(1, 0, Some(10), &put("k", "1"), &ok(10)),
        watch_start(1, "k", 3, 1),
        event(1, 11, 10, "k", Some("1")),
        watch_end(1, 30, "compacted", Some(5)),
    ];
    let problems: Vec<_> = check(&late)
        .1
        .watches
        .violations
        .into_iter()
        .map(|v| v.problem)
        .collect();
    assert_eq!(
        problems,
        vec![WatchProblem::WronglyCompacted {
            needed: 11,
            compact_revision: Some(5)
        }]
    );
}

#[test]
fn a_revision_going_backwards_is_found() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(5)),
        op(2, 20, Some(30), &get("k"), &read(4, Some("1"))),
    ];
    let (_, r) = check(&h);
    assert!(r.linearizability.violations.is_empty());
    assert_eq!(r.revisions.violations.len(), 1);
    assert_eq!(r.revisions.violations[0].op, 1);
    let report = text(&h);
    assert!(
        report.contains("revision 4 is below revision 5, observed before its call"),
        "{report}"
    );
    // Concurrent: no order, no violation.
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(5)),
        op(2, 5, Some(30), &get("k"), &read(4, None)),
    ];
    assert_eq!(check(&h).1.revisions.violations.len(), 0);
}

#[test]
fn a_change_takes_a_new_revision() {
    let h = [
        op(1, 0, Some(10), &put("k", "1"), &ok(5)),
        op(2, 20, Some(30), &put("j", "2"), &ok(5)),
    ];
    let problems: Vec<_> = check(&h)
        .1
        .revisions
        .violations
        .into_iter()
        .map(|v| v.problem)
        .collect();
    assert!(
        problems.contains(&RevisionProblem::Shared { other: 0 }),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| matches!(
            p,
            RevisionProblem::Backwards {
                source_revision: 5,
                ..
            }
        )),
        "{problems:?}"
    );
}

#[test]
fn a_watch_event_is_a_revision_observed() {
    let h = [
        op(1, 0, Some(100), &put("k", "1"), &ok(5)),
        watch_start(1, "k", 1, 0),
        event(1, 10, 5, "k", Some("1")),
        op(2, 20, Some(30), &get("j"), &read(4, None)),
    ];
    let problems: Vec<_> = check(&h)
        .1
        .revisions
        .violations
        .into_iter()
        .map(|v| v.problem)
        .collect();
    assert!(
        matches!(
            problems[..],
            [RevisionProblem::Backwards {
                source_revision: 5,
                ..
            }]
        ),
        "{problems:?}"
    );
}

#[test]
fn serializable_reads_may_be_stale_but_not_go_back_per_endpoint() {
    // Ids 1 and 3 are on endpoint e1, 2 on e0 (id % 2).
    let stale_ok = [
        op(1, 0, Some(10), &put("k", "1"), &ok(5)),
        op(2, 20, Some(30), &sget("k"), &read(4, None)),
    ];
    assert_eq!(check(&stale_ok).1.violations(), 0);
    let back = [
        op(1, 0, Some(10), &sget("k"), &read(5, None)),
        op(3, 20, Some(30), &sget("k"), &read(4, None)),
    ];
    let (_, r) = check(&back);
    assert_eq!(r.serializable.violations.len(), 1);
    assert_eq!(r.serializable.violations[0].earlier, 0);
    let other_endpoint = [
        op(1, 0, Some(10), &sget("k"), &read(5, None)),
        op(2, 20, Some(30), &sget("k"), &read(4, None)),
    ];
    assert_eq!(check(&other_endpoint).1.violations(), 0);
}

#[test]
fn an_epoch_starts_over() {
    // Before the recovery: k = "1" at revision 5. After it, the write was lost and revisions
    // restarted: both fine in a new epoch.
    let body = [
        op(1, 0, Some(10), &put("k", "1"), &ok(5)),
        op(2, 200, Some(210), &get("k"), &read(2, None)),
        op(3, 220, Some(230), &put("k", "2"), &ok(3)),
        op(4, 240, Some(250), &get("k"), &read(3, Some("2"))),
    ];
    let (_, r) = check(&body);
    assert_eq!(lin_keys(&r), vec!["k"]);
    assert!(!r.revisions.violations.is_empty());
    let mut with_epoch = body.to_vec();
    with_epoch.push(epoch(100));
    let (h, r) = check(&with_epoch);
    assert_eq!(h.epoch_count(), 2);
    assert_eq!(r.violations(), 0, "{}", text(&with_epoch));
    assert_eq!(r.linearizability.partitions, 2);
    // Within the new epoch the rules hold again.
    let mut broken = with_epoch.clone();
    broken.push(op(5, 260, Some(270), &get("k"), &read(1, None)));
    let (_, r) = check(&broken);
    assert_eq!(lin_keys(&r), vec!["k"]);
    assert_eq!(r.linearizability.violations[0].epoch, 1);
    assert_eq!(r.revisions.violations.len(), 1);
}

#[test]
fn availability_figures() {
    let h = [
        op(1, 0, Some(10), &get("k"), &read(1, None)),
        op(2, 100, Some(110), &put("k", "1"), &ok(2)),
        op(3, 150, None, &put("k", "2"), &unknown()),
        op(4, 200, Some(210), &put("k", "3"), &failed()),
        op(5, 400, Some(410), &put("k", "4"), &ok(3)),
        op(6, 450, Some(460), &get("k"), &read(3, Some("4"))),
    ];
    let (_, r) = check(&h);
    let a = &r.availability;
    assert_eq!(
        (a.ops, a.ok, a.failed, a.unknown, a.ok_writes),
        (6, 4, 1, 1, 2)
    );
    let gap = a.longest_gap.expect("a gap");
    assert_eq!((gap.from, gap.to, gap.until), (100 * MS, 400 * MS, 4));
    assert_eq!(a.since_last_write, Some(60 * MS));
    assert!(text(&h).contains(
        "longest without an ok write: 300.000 ms (from 100.000 ms to 400.000 ms, the call of #5)"
    ));
}
