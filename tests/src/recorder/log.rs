//! The history writer: the records of `etcd_lincheck::history`'s JSON Lines format, written
//! to the history file as they happen (so a crashed run still leaves its history), with a
//! common monotonic clock and caps on what one run may record.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use serde::Serialize;

/// The clock of a history: nanoseconds since its start.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    start: Instant,
}

impl Clock {
    /// A clock starting now.
    pub fn start() -> Self {
        Clock {
            start: Instant::now(),
        }
    }

    /// Nanoseconds since the start.
    pub fn now(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What an operation asked for (the `op` field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpRecord {
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
        /// Whether the read was serializable (as recorded: the stale-read fault records
        /// serializable reads as linearizable).
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

impl OpRecord {
    /// The key.
    pub fn key(&self) -> &str {
        match self {
            OpRecord::Put { key, .. }
            | OpRecord::Delete { key }
            | OpRecord::Get { key, .. }
            | OpRecord::Cas { key, .. } => key,
        }
    }
}

/// What an operation was answered (the `result` field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum ResultRecord {
    /// Done.
    Ok {
        /// The response header's revision.
        revision: i64,
        /// A get's value (`Some(None)`: absent).
        #[serde(skip_serializing_if = "Option::is_none")]
        value: Option<Option<String>>,
        /// A get's mod revision (absent key: none).
        #[serde(skip_serializing_if = "Option::is_none")]
        mod_revision: Option<i64>,
        /// A delete's count.
        #[serde(skip_serializing_if = "Option::is_none")]
        deleted: Option<i64>,
        /// A cas's comparison.
        #[serde(skip_serializing_if = "Option::is_none")]
        succeeded: Option<bool>,
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

/// Why a watch ended (the `reason` field).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndRecord {
    /// The server said the revision it needed was compacted.
    Compacted,
    /// Closed by the recorder.
    Closed,
    /// An error broke the stream.
    Error,
}

/// A watch event's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A put.
    Put,
    /// A delete.
    Delete,
}

/// One line of the history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Record {
    /// A client operation.
    Op {
        /// The recorder's identifier.
        id: u64,
        /// The client.
        client: u64,
        /// The endpoint it was sent to.
        endpoint: String,
        /// Call time (ns).
        call: u64,
        /// Return time (ns); `None` when the outcome is unknown.
        #[serde(rename = "return")]
        ret: Option<u64>,
        /// The request.
        op: OpRecord,
        /// The answer.
        result: ResultRecord,
    },
    /// A watch opened.
    WatchStart {
        /// The recorder's identifier (a resumed watch has a new one).
        watch: u64,
        /// The client.
        client: u64,
        /// The endpoint.
        endpoint: String,
        /// The key prefix.
        prefix: String,
        /// The revision asked for.
        start_revision: Option<i64>,
        /// When (ns).
        time: u64,
    },
    /// A change received.
    WatchEvent {
        /// The watch.
        watch: u64,
        /// When it was received (ns).
        time: u64,
        /// The revision of the change.
        revision: i64,
        /// Put or delete.
        #[serde(rename = "type")]
        kind: EventType,
        /// The key.
        key: String,
        /// The value put (`None` for a delete).
        value: Option<String>,
        /// The key's mod revision.
        mod_revision: Option<i64>,
    },
    /// A watch ended.
    WatchEnd {
        /// The watch.
        watch: u64,
        /// When (ns).
        time: u64,
        /// Why.
        reason: EndRecord,
        /// The compact revision the server reported.
        compact_revision: Option<i64>,
        /// The error, if any.
        error: Option<String>,
    },
    /// An announced recovery.
    Epoch {
        /// When (ns).
        time: u64,
        /// Why.
        reason: String,
    },
}

/// Errors of the history file.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// Creating or writing the file failed.
    #[error("writing the history {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A record did not serialize (cannot happen with these types).
    #[error("serializing a history record: {0}")]
    Json(#[from] serde_json::Error),
}

/// What was written so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Operation records.
    pub ops: u64,
    /// Watch event records.
    pub events: u64,
    /// Records refused because a cap was reached.
    pub dropped: u64,
}

struct Inner {
    out: Option<BufWriter<File>>,
    counts: Counts,
    error: Option<String>,
}

/// The history file, shared by every task of a recorder.
pub struct HistoryLog {
    path: PathBuf,
    clock: Clock,
    max_ops: u64,
    max_events: u64,
    inner: Mutex<Inner>,
}

impl HistoryLog {
    /// Creates `path` (truncated); at most `max_ops` operations and `max_events` watch events
    /// are written.
    pub fn create(path: &Path, max_ops: u64, max_events: u64) -> Result<Self, LogError> {
        let io = |source| LogError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        let file = File::create(path).map_err(io)?;
        Ok(HistoryLog {
            path: path.to_path_buf(),
            clock: Clock::start(),
            max_ops,
            max_events,
            inner: Mutex::new(Inner {
                out: Some(BufWriter::new(file)),
                counts: Counts::default(),
                error: None,
            }),
        })
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Nanoseconds since the history's start.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// Whether another operation may be recorded.
    pub fn ops_room(&self) -> bool {
        self.lock().counts.ops < self.max_ops
    }

    /// Whether another watch event may be recorded.
    pub fn events_room(&self) -> bool {
        self.lock().counts.events < self.max_events
    }

    /// What was written so far.
    pub fn counts(&self) -> Counts {
        self.lock().counts
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends `record`; returns false when a cap refused it. A write error is kept and
    /// returned by [`Self::close`].
    pub fn write(&self, record: &Record) -> bool {
        let line = match serde_json::to_string(record) {
            Ok(line) => line,
            Err(e) => {
                self.lock().error.get_or_insert(e.to_string());
                return false;
            }
        };
        let mut inner = self.lock();
        match record {
            Record::Op { .. } if inner.counts.ops >= self.max_ops => {
                inner.counts.dropped += 1;
                return false;
            }
            Record::WatchEvent { .. } if inner.counts.events >= self.max_events => {
                inner.counts.dropped += 1;
                return false;
            }
            Record::Op { .. } => inner.counts.ops += 1,
            Record::WatchEvent { .. } => inner.counts.events += 1,
            _ => {}
        }
        let Inner { out, error, .. } = &mut *inner;
        if let Some(out) = out.as_mut()
            && let Err(e) = writeln!(out, "{line}")
        {
            error.get_or_insert(e.to_string());
        }
        true
    }

    /// Flushes and closes the file; later writes are counted but go nowhere.
    pub fn close(&self) -> Result<(), LogError> {
        let mut inner = self.lock();
        if let Some(mut out) = inner.out.take()
            && let Err(source) = out.flush()
        {
            return Err(LogError::Io {
                path: self.path.clone(),
                source,
            });
        }
        match inner.error.take() {
            Some(e) => Err(LogError::Io {
                path: self.path.clone(),
                source: std::io::Error::other(e),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_with_the_checker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("h.jsonl");
        let log = HistoryLog::create(&path, 3, 1).expect("create");
        let records = [
            Record::WatchStart {
                watch: 1,
                client: 9,
                endpoint: "e".into(),
                prefix: "/p/".into(),
                start_revision: Some(2),
                time: 1,
            },
            Record::Op {
                id: 1,
                client: 0,
                endpoint: "e".into(),
                call: 10,
                ret: Some(20),
                op: OpRecord::Put {
                    key: "/p/k0".into(),
                    value: "c0-1".into(),
                },
                result: ResultRecord::Ok {
                    revision: 2,
                    value: None,
                    mod_revision: None,
                    deleted: None,
                    succeeded: None,
                },
            },
            Record::WatchEvent {
                watch: 1,
                time: 25,
                revision: 2,
                kind: EventType::Put,
                key: "/p/k0".into(),
                value: Some("c0-1".into()),
                mod_revision: Some(2),
            },
            Record::WatchEvent {
                watch: 1,
                time: 26,
                revision: 3,
                kind: EventType::Delete,
                key: "/p/k0".into(),
                value: None,
                mod_revision: Some(3),
            },
            Record::Op {
                id: 2,
                client: 1,
                endpoint: "e".into(),
                call: 30,
                ret: Some(40),
                op: OpRecord::Get {
                    key: "/p/k0".into(),
                    serializable: false,
                },
                result: ResultRecord::Ok {
                    revision: 2,
                    value: Some(Some("c0-1".into())),
                    mod_revision: Some(2),
                    deleted: None,
                    succeeded: None,
                },
            },
            Record::Op {
                id: 3,
                client: 1,
                endpoint: "e".into(),
                call: 50,
                ret: None,
                op: OpRecord::Cas {
                    key: "/p/k1".into(),
                    expect: None,
                    value: "c1-2".into(),
                },
                result: ResultRecord::Unknown {
                    error: "timeout".into(),
                },
            },
            Record::Op {
                id: 4,
                client: 1,
                endpoint: "e".into(),
                call: 60,
                ret: Some(61),
                op: OpRecord::Delete {
                    key: "/p/k1".into(),
                },
                result: ResultRecord::Fail { error: "x".into() },
            },
            Record::WatchEnd {
                watch: 1,
                time: 70,
                reason: EndRecord::Closed,
                compact_revision: None,
                error: None,
            },
            Record::Epoch {
                time: 80,
                reason: "recovery".into(),
            },
        ];
        let written: Vec<bool> = records.iter().map(|r| log.write(r)).collect();
        assert_eq!(
            written,
            [true, true, true, false, true, true, false, true, true],
            "the caps: 3 ops, 1 event"
        );
        assert_eq!(
            log.counts(),
            Counts {
                ops: 3,
                events: 1,
                dropped: 2
            }
        );
        log.close().expect("close");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(
            text.starts_with(r#"{"kind":"watch_start","watch":1,"client":9,"#),
            "{text}"
        );
        assert!(
            text.contains(r#""op":{"type":"cas","key":"/p/k1","expect":null,"value":"c1-2"},"result":{"status":"unknown","error":"timeout"}"#),
            "{text}"
        );
        let history =
            etcd_lincheck::history::parse_history("h.jsonl", text.as_bytes()).expect("parses");
        assert_eq!(history.ops.len(), 3);
        assert_eq!(history.watches[0].events.len(), 1);
        assert_eq!(history.epochs.len(), 1);
    }
}
