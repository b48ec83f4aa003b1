//! Our recorder's history format: JSON Lines, one record per line, `kind` first.
//!
//! ```text
//! {"kind":"op","id":17,"client":3,"endpoint":"http://10.244.0.5:2379","call":12345,"return":12400,
//!  "op":{"type":"put","key":"k","value":"v"},"result":{"status":"ok","revision":8}}
//! {"kind":"watch_start","watch":1,"client":3,"endpoint":"...","prefix":"/k/","start_revision":5,"time":100}
//! {"kind":"watch_event","watch":1,"time":200,"revision":8,"type":"put","key":"/k/a","value":"v","mod_revision":8}
//! {"kind":"watch_end","watch":1,"time":300,"reason":"compacted","compact_revision":7,"error":null}
//! {"kind":"epoch","time":400,"reason":"recovery"}
//! ```
//!
//! Times are nanoseconds since the history's start. An operation's `op` is a `put`, `delete`,
//! `get` (`serializable` true or false) or `cas` (`expect` null: the key is absent); its
//! `result` is `ok` (with `revision` and, per type: get `value` and `mod_revision`, delete
//! `deleted`, cas `succeeded`), `fail` (definitely not applied) or `unknown` (maybe applied:
//! its return time is taken as infinity). A watch event's `revision` is the revision of the
//! change. Unknown `kind`s are errors; unknown fields are ignored.

use crate::error::{InputError, numbered_lines};
use serde::{Deserialize, Deserializer};
use std::collections::HashMap;

/// A recorded history.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct History {
    /// The operations, in file order.
    pub ops: Vec<Op>,
    /// The watches, in the order they started.
    pub watches: Vec<Watch>,
    /// The announced recoveries from permanent quorum loss, in time order.
    pub epochs: Vec<Epoch>,
}

/// One client operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    /// The recorder's identifier.
    pub id: u64,
    /// The client that called it.
    pub client: u64,
    /// The endpoint it was sent to.
    pub endpoint: String,
    /// When it was called (ns).
    pub call: u64,
    /// When it returned (ns); `None` when its outcome is unknown.
    pub ret: Option<u64>,
    /// What it asked for.
    pub kind: OpKind,
    /// What it was answered.
    pub result: OpResult,
    /// Its line in the input.
    pub line: usize,
}

/// What an operation asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpKind {
    /// Put `value` at `key`.
    Put {
        /// The key.
        key: String,
        /// The value.
        value: String,
    },
    /// Delete `key`.
    Delete {
        /// The key.
        key: String,
    },
    /// Read `key`.
    Get {
        /// The key.
        key: String,
        /// A serializable read (served by one member, may be stale).
        serializable: bool,
    },
    /// If `key` holds `expect` (`None`: is absent), put `value`.
    Cas {
        /// The key.
        key: String,
        /// The expected value, or absence.
        expect: Option<String>,
        /// The value to put.
        value: String,
    },
}

impl OpKind {
    /// The key it is about.
    pub fn key(&self) -> &str {
        match self {
            OpKind::Put { key, .. }
            | OpKind::Delete { key }
            | OpKind::Get { key, .. }
            | OpKind::Cas { key, .. } => key,
        }
    }

    /// Whether it changes the store (put, delete, cas).
    pub fn is_write(&self) -> bool {
        !matches!(self, OpKind::Get { .. })
    }

    /// Whether it is a serializable read.
    pub fn is_serializable_read(&self) -> bool {
        matches!(
            self,
            OpKind::Get {
                serializable: true,
                ..
            }
        )
    }
}

/// What an operation was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpResult {
    /// Done.
    Ok {
        /// The response header's revision.
        revision: i64,
        /// The answer proper.
        answer: Answer,
    },
    /// Definitely not applied.
    Fail {
        /// The error.
        error: String,
    },
    /// Maybe applied.
    Unknown {
        /// The error.
        error: String,
    },
}

impl OpResult {
    /// The revision of an ok answer.
    pub fn revision(&self) -> Option<i64> {
        match self {
            OpResult::Ok { revision, .. } => Some(*revision),
            _ => None,
        }
    }
}

/// The answer of an ok operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// A put.
    Put,
    /// A delete: how many keys it deleted.
    Delete {
        /// Keys deleted.
        deleted: i64,
    },
    /// A get: the value (`None`: absent) and its modification revision.
    Get {
        /// The value read.
        value: Option<String>,
        /// The key's mod revision.
        mod_revision: Option<i64>,
    },
    /// A cas: whether the comparison held.
    Cas {
        /// Whether it held (and the put was done).
        succeeded: bool,
    },
}

impl Op {
    /// Whether it was answered ok.
    pub fn is_ok(&self) -> bool {
        matches!(self.result, OpResult::Ok { .. })
    }

    /// Whether its outcome is unknown.
    pub fn is_unknown(&self) -> bool {
        matches!(self.result, OpResult::Unknown { .. })
    }

    /// The change an ok operation made, as a watch would see it: `Some(Some(value))` for a
    /// put or a cas that succeeded, `Some(None)` for a delete that deleted the key, `None` when
    /// it changed nothing (a get, a cas that failed, a delete of nothing, or not ok).
    pub fn change(&self) -> Option<Option<&str>> {
        let OpResult::Ok { answer, .. } = &self.result else {
            return None;
        };
        match (&self.kind, answer) {
            (OpKind::Put { value, .. }, _) => Some(Some(value)),
            (OpKind::Cas { value, .. }, Answer::Cas { succeeded: true }) => Some(Some(value)),
            (OpKind::Delete { .. }, Answer::Delete { deleted }) if *deleted > 0 => Some(None),
            _ => None,
        }
    }
}

/// A watch, with what it received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// The recorder's identifier.
    pub id: u64,
    /// The client that opened it.
    pub client: u64,
    /// The endpoint it was opened on.
    pub endpoint: String,
    /// The key prefix watched.
    pub prefix: String,
    /// The revision it was asked to start at (`None`: now).
    pub start_revision: Option<i64>,
    /// When it was opened (ns).
    pub time: u64,
    /// The events received, in order.
    pub events: Vec<WatchEvent>,
    /// How it ended, if it did.
    pub end: Option<WatchEnd>,
    /// The line of its `watch_start`.
    pub line: usize,
}

/// A change received by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    /// When it was received (ns).
    pub time: u64,
    /// The revision of the change.
    pub revision: i64,
    /// The key changed.
    pub key: String,
    /// The value put; `None` for a delete.
    pub value: Option<String>,
    /// The key's mod revision as reported.
    pub mod_revision: Option<i64>,
    /// Its line in the input.
    pub line: usize,
}

/// Why a watch ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The server said the start revision was compacted.
    Compacted,
    /// Closed by the client.
    Closed,
    /// An error.
    Error,
}

/// The end of a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEnd {
    /// When (ns).
    pub time: u64,
    /// Why.
    pub reason: EndReason,
    /// The compact revision the server reported.
    pub compact_revision: Option<i64>,
    /// The error, if any.
    pub error: Option<String>,
    /// Its line in the input.
    pub line: usize,
}

/// An announced recovery from permanent quorum loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Epoch {
    /// When (ns).
    pub time: u64,
    /// Why (`recovery`).
    pub reason: String,
    /// Its line in the input.
    pub line: usize,
}

impl History {
    /// The epoch (0 before the first recovery) a time belongs to: an operation belongs to the
    /// epoch of its call.
    pub fn epoch_of(&self, time: u64) -> usize {
        self.epochs.partition_point(|e| e.time <= time)
    }

    /// The number of epochs.
    pub fn epoch_count(&self) -> usize {
        self.epochs.len() + 1
    }
}

// ---- The JSON records ----

fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum RawRecord {
    Op(RawOp),
    WatchStart(RawWatchStart),
    WatchEvent(RawWatchEvent),
    WatchEnd(RawWatchEnd),
    Epoch(RawEpoch),
}

#[derive(Deserialize)]
struct RawOp {
    id: u64,
    client: u64,
    endpoint: String,
    call: u64,
    #[serde(rename = "return")]
    ret: Option<u64>,
    op: RawOpKind,
    result: RawResult,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum RawOpKind {
    Put {
        key: String,
        value: String,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
        #[serde(default)]
        serializable: bool,
    },
    Cas {
        key: String,
        #[serde(default, deserialize_with = "present")]
        expect: Option<Option<String>>,
        value: String,
    },
}

#[derive(Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum RawResult {
    Ok {
        revision: i64,
        #[serde(default, deserialize_with = "present")]
        value: Option<Option<String>>,
        mod_revision: Option<i64>,
        deleted: Option<i64>,
        succeeded: Option<bool>,
    },
    Fail {
        error: Option<String>,
    },
    Unknown {
        error: Option<String>,
    },
}

#[derive(Deserialize)]
struct RawWatchStart {
    watch: u64,
    client: u64,
    endpoint: String,
    prefix: String,
    start_revision: Option<i64>,
    time: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawEventType {
    Put,
    Delete,
}

#[derive(Deserialize)]
struct RawWatchEvent {
    watch: u64,
    time: u64,
    revision: i64,
    #[serde(rename = "type")]
    kind: RawEventType,
    key: String,
    value: Option<String>,
    mod_revision: Option<i64>,
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawEndReason {
    Compacted,
    Closed,
    Error,
}

#[derive(Deserialize)]
struct RawWatchEnd {
    watch: u64,
    time: u64,
    reason: RawEndReason,
    compact_revision: Option<i64>,
    error: Option<String>,
}

#[derive(Deserialize)]
struct RawEpoch {
    time: u64,
    reason: Option<String>,
}

/// serde_json's message without its "at line 1 column N" (every record is line 1 to it).
fn json_message(e: &serde_json::Error) -> String {
    let text = e.to_string();
    let position = format!(" at line {} column {}", e.line(), e.column());
    match text.strip_suffix(&position) {
        Some(message) => format!("{message} (column {})", e.column()),
        None => text,
    }
}

/// Parses a history named `file`.
pub fn parse_history(file: &str, input: &[u8]) -> Result<History, InputError> {
    let mut history = History::default();
    let mut op_lines: HashMap<u64, usize> = HashMap::new();
    let mut watch_index: HashMap<u64, usize> = HashMap::new();
    let mut records = 0usize;
    for line in numbered_lines(file, input) {
        let (n, text) = line?;
        if text.trim().is_empty() {
            continue;
        }
        let err = |message: String| InputError::line(file, n, message);
        let record: RawRecord = serde_json::from_str(text).map_err(|e| err(json_message(&e)))?;
        records += 1;
        match record {
            RawRecord::Op(raw) => {
                if let Some(first) = op_lines.insert(raw.id, n) {
                    return Err(err(format!(
                        "operation id {} was already used on line {first}",
                        raw.id
                    )));
                }
                history.ops.push(op(raw, n).map_err(err)?);
            }
            RawRecord::WatchStart(raw) => {
                if let Some(&i) = watch_index.get(&raw.watch) {
                    let first = history.watches.get(i).map_or(0, |w| w.line);
                    return Err(err(format!(
                        "watch {} was already started on line {first}",
                        raw.watch
                    )));
                }
                watch_index.insert(raw.watch, history.watches.len());
                history.watches.push(Watch {
                    id: raw.watch,
                    client: raw.client,
                    endpoint: raw.endpoint,
                    prefix: raw.prefix,
                    start_revision: raw.start_revision,
                    time: raw.time,
                    events: Vec::new(),
                    end: None,
                    line: n,
                });
            }
            RawRecord::WatchEvent(raw) => {
                let watch = open_watch(&mut history, &watch_index, raw.watch).map_err(err)?;
                let value = match raw.kind {
                    RawEventType::Put => Some(
                        raw.value
                            .ok_or_else(|| err("a put event needs a \"value\"".to_string()))?,
                    ),
                    RawEventType::Delete => None,
                };
                watch.events.push(WatchEvent {
                    time: raw.time,
                    revision: raw.revision,
                    key: raw.key,
                    value,
                    mod_revision: raw.mod_revision,
                    line: n,
                });
            }
            RawRecord::WatchEnd(raw) => {
                let watch = open_watch(&mut history, &watch_index, raw.watch).map_err(err)?;
                watch.end = Some(WatchEnd {
                    time: raw.time,
                    reason: match raw.reason {
                        RawEndReason::Compacted => EndReason::Compacted,
                        RawEndReason::Closed => EndReason::Closed,
                        RawEndReason::Error => EndReason::Error,
                    },
                    compact_revision: raw.compact_revision,
                    error: raw.error,
                    line: n,
                });
            }
            RawRecord::Epoch(raw) => history.epochs.push(Epoch {
                time: raw.time,
                reason: raw.reason.unwrap_or_default(),
                line: n,
            }),
        }
    }
    if records == 0 {
        return Err(InputError::file(file, "no records (an empty history)"));
    }
    history.epochs.sort_by_key(|e| e.time);
    Ok(history)
}

/// The watch `id`, which must have started and not ended.
fn open_watch<'h>(
    history: &'h mut History,
    index: &HashMap<u64, usize>,
    id: u64,
) -> Result<&'h mut Watch, String> {
    let watch = index
        .get(&id)
        .and_then(|&i| history.watches.get_mut(i))
        .ok_or_else(|| format!("watch {id} has no watch_start before this line"))?;
    if let Some(end) = &watch.end {
        return Err(format!("watch {id} already ended on line {}", end.line));
    }
    Ok(watch)
}

fn op(raw: RawOp, line: usize) -> Result<Op, String> {
    let kind = match raw.op {
        RawOpKind::Put { key, value } => OpKind::Put { key, value },
        RawOpKind::Delete { key } => OpKind::Delete { key },
        RawOpKind::Get { key, serializable } => OpKind::Get { key, serializable },
        RawOpKind::Cas { key, expect, value } => OpKind::Cas {
            key,
            expect: expect.ok_or("a cas needs \"expect\" (null: the key is absent)")?,
            value,
        },
    };
    let (result, ret) = match raw.result {
        RawResult::Fail { error } => (
            OpResult::Fail {
                error: error.unwrap_or_default(),
            },
            raw.ret,
        ),
        RawResult::Unknown { error } => (
            OpResult::Unknown {
                error: error.unwrap_or_default(),
            },
            None,
        ),
        RawResult::Ok {
            revision,
            value,
            mod_revision,
            deleted,
            succeeded,
        } => {
            if raw.ret.is_none() {
                return Err("an ok operation needs a \"return\" time".to_string());
            }
            let answer = match &kind {
                OpKind::Put { .. } => Answer::Put,
                OpKind::Delete { .. } => Answer::Delete {
                    deleted: deleted.ok_or("an ok delete needs \"deleted\"")?,
                },
                OpKind::Get { .. } => Answer::Get {
                    value: value.ok_or("an ok get needs \"value\" (null: absent)")?,
                    mod_revision,
                },
                OpKind::Cas { .. } => Answer::Cas {
                    succeeded: succeeded.ok_or("an ok cas needs \"succeeded\"")?,
                },
            };
            (OpResult::Ok { revision, answer }, raw.ret)
        }
    };
    if let Some(r) = ret.filter(|&r| r < raw.call) {
        return Err(format!("returns ({r}) before it is called ({})", raw.call));
    }
    Ok(Op {
        id: raw.id,
        client: raw.client,
        endpoint: raw.endpoint,
        call: raw.call,
        ret,
        kind,
        result,
        line,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<History, String> {
        parse_history("h.jsonl", text.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn reads_every_record() {
        let h = parse(concat!(
            r#"{"kind":"op","id":1,"client":3,"endpoint":"e1","call":10,"return":20,"op":{"type":"put","key":"k","value":"v"},"result":{"status":"ok","revision":5},"extra":1}"#,
            "\n\n",
            r#"{"kind":"op","id":2,"client":3,"endpoint":"e1","call":30,"return":null,"op":{"type":"cas","key":"k","expect":null,"value":"w"},"result":{"status":"unknown","error":"timeout"}}"#,
            "\n",
            r#"{"kind":"op","id":3,"client":4,"endpoint":"e2","call":30,"return":40,"op":{"type":"get","key":"k","serializable":true},"result":{"status":"ok","revision":5,"value":null,"mod_revision":0}}"#,
            "\n",
            r#"{"kind":"watch_start","watch":1,"client":1,"endpoint":"e1","prefix":"k","start_revision":4,"time":1}"#,
            "\n",
            r#"{"kind":"watch_event","watch":1,"time":25,"revision":5,"type":"put","key":"k","value":"v","mod_revision":5}"#,
            "\n",
            r#"{"kind":"watch_end","watch":1,"time":50,"reason":"compacted","compact_revision":3,"error":null}"#,
            "\n",
            r#"{"kind":"epoch","time":60,"reason":"recovery"}"#,
        ))
        .unwrap();
        assert_eq!(h.ops.len(), 3);
        assert_eq!(h.ops[0].change(), Some(Some("v")));
        assert_eq!(h.ops[1].ret, None);
        assert!(h.ops[1].is_unknown());
        assert_eq!(
            h.ops[1].kind,
            OpKind::Cas {
                key: "k".into(),
                expect: None,
                value: "w".into()
            }
        );
        assert!(h.ops[2].kind.is_serializable_read());
        assert_eq!(h.watches[0].events[0].value.as_deref(), Some("v"));
        assert_eq!(
            h.watches[0].end.as_ref().map(|e| e.reason),
            Some(EndReason::Compacted)
        );
        assert_eq!((h.epoch_of(59), h.epoch_of(60), h.epoch_count()), (0, 1, 2));
        assert_eq!(h.ops[2].line, 4);
    }

    #[test]
    fn errors_name_file_and_line() {
        let ok_put = r#"{"kind":"op","id":1,"client":3,"endpoint":"e","call":10,"return":20,"op":{"type":"put","key":"k","value":"v"},"result":{"status":"ok","revision":5}}"#;
        let cases = [
            ("not json", "h.jsonl:1: expected ident (column 2)"),
            (
                r#"{"kind":"nope"}"#,
                "h.jsonl:1: unknown variant `nope`, expected one of `op`, `watch_start`, `watch_event`, `watch_end`, `epoch` (column 14)",
            ),
            (
                &format!("{ok_put}\n{ok_put}"),
                "h.jsonl:2: operation id 1 was already used on line 1",
            ),
            (
                r#"{"kind":"watch_event","watch":9,"time":1,"revision":1,"type":"delete","key":"k"}"#,
                "h.jsonl:1: watch 9 has no watch_start before this line",
            ),
            (
                r#"{"kind":"op","id":1,"client":3,"endpoint":"e","call":10,"return":null,"op":{"type":"put","key":"k","value":"v"},"result":{"status":"ok","revision":5}}"#,
                "h.jsonl:1: an ok operation needs a \"return\" time",
            ),
            (
                r#"{"kind":"op","id":1,"client":3,"endpoint":"e","call":10,"return":5,"op":{"type":"put","key":"k","value":"v"},"result":{"status":"fail","error":"x"}}"#,
                "h.jsonl:1: returns (5) before it is called (10)",
            ),
            (
                r#"{"kind":"op","id":1,"client":3,"endpoint":"e","call":10,"return":20,"op":{"type":"get","key":"k"},"result":{"status":"ok","revision":5}}"#,
                "h.jsonl:1: an ok get needs \"value\" (null: absent)",
            ),
            (
                r#"{"kind":"op","id":1,"client":3,"endpoint":"e","call":10,"return":20,"op":{"type":"cas","key":"k","value":"v"},"result":{"status":"fail"}}"#,
                "h.jsonl:1: a cas needs \"expect\" (null: the key is absent)",
            ),
            ("", "h.jsonl: no records (an empty history)"),
        ];
        for (input, want) in cases {
            assert_eq!(parse(input).unwrap_err(), want, "input {input}");
        }
    }
}
