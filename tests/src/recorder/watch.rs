//! Long watches on the key prefix: every event recorded, and how each watch ended. A broken
//! stream is resumed from the last revision received + 1 as a new watch (as clients do), so a
//! resumed watch is checked for gaps too; a compacted one cannot be resumed and stays ended.
//!
//! A watch belongs to the epoch of its start, so at an announced recovery the watches close
//! before the `epoch` record is written (everything they received was written before it) and
//! open again after it, from the recovered cluster's current revision.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use etcd_client::{EventType as EtcdEventType, WatchOptions};
use tokio::sync::watch;

use super::classify::describe;
use super::endpoints::{ClientSpec, Pool, Unusable};
use super::log::{EndRecord, EventType, HistoryLog, Record};

/// How long opening a watch may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a watch got to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchProgress {
    /// The revision of the last event received (0: none).
    pub last_revision: i64,
    /// Watches opened (the first and each resumption).
    pub opened: u64,
    /// Whether it ended for good (stopped, compacted, or the event cap).
    pub done: bool,
    /// The last epoch it closed its watch for (see [`EpochSignal`]).
    pub epoch_closed: u64,
}

/// The epoch protocol between [`super::Recorder::epoch`] and the watches.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochSignal {
    /// Close the watches for this epoch (then report it in [`WatchProgress::epoch_closed`]).
    pub closing: u64,
    /// The `epoch` record of this epoch is written: open again.
    pub written: u64,
}

/// What the watches of a recorder share.
pub struct Watches {
    /// The history.
    pub log: Arc<HistoryLog>,
    /// The key prefix watched.
    pub prefix: String,
    next_id: AtomicU64,
}

impl Watches {
    /// Watches of `prefix` recorded in `log`.
    pub fn new(log: Arc<HistoryLog>, prefix: String) -> Self {
        Watches {
            log,
            prefix,
            next_id: AtomicU64::new(1),
        }
    }

    fn end(
        &self,
        watch: u64,
        reason: EndRecord,
        compact_revision: Option<i64>,
        error: Option<String>,
    ) {
        self.log.write(&Record::WatchEnd {
            watch,
            time: self.log.now(),
            reason,
            compact_revision,
            error,
        });
    }
}

/// How one opened watch ended.
enum Ended {
    /// Stop asked, or it cannot go on: done.
    Done,
    /// Broken: resume.
    Broken,
    /// Closed for a new epoch.
    Epoch,
}

/// What a watch task listens to.
pub struct Signals {
    /// Stop for good.
    pub stop: watch::Receiver<bool>,
    /// Epochs.
    pub epochs: watch::Receiver<EpochSignal>,
}

impl Signals {
    /// Whether a new epoch (above `seen`) asks the watches to close.
    fn epoch_pending(&self, seen: u64) -> bool {
        self.epochs.borrow().closing > seen
    }
}

/// One long watch from `start_revision`, resumed until `signals.stop` turns true; `client`
/// is its client id in the history.
pub async fn run_watch(
    client: u64,
    spec: ClientSpec,
    watches: Arc<Watches>,
    start_revision: i64,
    progress: watch::Sender<WatchProgress>,
    mut signals: Signals,
) {
    // Require a leader: a member cut off from the others ends its watches rather than
    // leaving them silent, as kube-apiserver's watches ask.
    let mut pool = Pool::new(spec, true);
    // `None`: from the current revision (the first watch of a new epoch).
    let mut next_revision = Some(start_revision);
    let mut epoch = 0;
    loop {
        if *signals.stop.borrow() {
            break;
        }
        if signals.epoch_pending(epoch) {
            // Nothing open: acknowledge, wait for the record, start from the current revision.
            epoch = signals.epochs.borrow().closing;
            progress.send_modify(|p| p.epoch_closed = epoch);
            tokio::select! {
                _ = signals.stop.wait_for(|s| *s) => break,
                _ = signals.epochs.wait_for(|e| e.written >= epoch) => {}
            }
            next_revision = None;
            continue;
        }
        let endpoint = match pool.pick() {
            Ok(endpoint) => endpoint,
            Err(Unusable::Empty) => {
                let endpoints = pool.endpoints();
                tokio::select! {
                    _ = signals.stop.wait_for(|s| *s) => break,
                    _ = signals.epochs.wait_for(|e| e.closing > epoch) => continue,
                    _ = endpoints.changed() => continue,
                }
            }
            Err(Unusable::BackingOff(until)) => {
                tokio::select! {
                    _ = signals.stop.wait_for(|s| *s) => break,
                    _ = signals.epochs.wait_for(|e| e.closing > epoch) => continue,
                    () = tokio::time::sleep_until(until) => continue,
                }
            }
        };
        match watch_once(
            client,
            &endpoint,
            &mut pool,
            &watches,
            &mut next_revision,
            &progress,
            &mut signals,
            epoch,
        )
        .await
        {
            Ended::Done => break,
            Ended::Broken => pool.failed(&endpoint),
            Ended::Epoch => {}
        }
    }
    progress.send_modify(|p| p.done = true);
}

/// Opens one watch on `endpoint` from `next_revision` and records it until it ends.
#[allow(clippy::too_many_arguments)]
async fn watch_once(
    client: u64,
    endpoint: &str,
    pool: &mut Pool,
    watches: &Watches,
    next_revision: &mut Option<i64>,
    progress: &watch::Sender<WatchProgress>,
    signals: &mut Signals,
    epoch: u64,
) -> Ended {
    let Ok(mut etcd) = pool.client(endpoint).await else {
        return Ended::Broken;
    };
    let time = watches.log.now();
    let mut options = WatchOptions::new().with_prefix();
    if let Some(revision) = *next_revision {
        options = options.with_start_revision(revision);
    }
    let opened = tokio::time::timeout(
        OPEN_TIMEOUT,
        etcd.watch(watches.prefix.as_str(), Some(options)),
    )
    .await;
    let mut stream = match opened {
        Ok(Ok(stream)) => stream,
        // Never opened: nothing to record.
        Ok(Err(_)) | Err(_) => return Ended::Broken,
    };
    let id = watches.next_id.fetch_add(1, Ordering::Relaxed);
    watches.log.write(&Record::WatchStart {
        watch: id,
        client,
        endpoint: endpoint.to_string(),
        prefix: watches.prefix.clone(),
        start_revision: *next_revision,
        time,
    });
    progress.send_modify(|p| p.opened += 1);
    loop {
        let message = tokio::select! {
            biased;
            _ = signals.stop.wait_for(|s| *s) => {
                watches.end(id, EndRecord::Closed, None, None);
                return Ended::Done;
            }
            _ = signals.epochs.wait_for(|e| e.closing > epoch) => {
                watches.end(id, EndRecord::Closed, None, None);
                return Ended::Epoch;
            }
            message = stream.message() => message,
        };
        let response = match message {
            Ok(Some(response)) => response,
            Ok(None) => {
                watches.end(
                    id,
                    EndRecord::Error,
                    None,
                    Some("the server closed the stream".into()),
                );
                return Ended::Broken;
            }
            Err(e) => {
                watches.end(id, EndRecord::Error, None, Some(describe(&e)));
                return Ended::Broken;
            }
        };
        let time = watches.log.now();
        if next_revision.is_none() {
            // Opened at the current revision: a resumption starts after it.
            *next_revision = response.header().map(|h| h.revision() + 1);
        }
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            let revision = kv.mod_revision();
            let kind = match event.event_type() {
                EtcdEventType::Put => EventType::Put,
                EtcdEventType::Delete => EventType::Delete,
            };
            let written = watches.log.write(&Record::WatchEvent {
                watch: id,
                time,
                revision,
                kind,
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                value: (kind == EventType::Put)
                    .then(|| String::from_utf8_lossy(kv.value()).into_owned()),
                mod_revision: Some(revision),
            });
            if !written {
                watches.end(
                    id,
                    EndRecord::Closed,
                    None,
                    Some("the recorder's cap on watch events".into()),
                );
                return Ended::Done;
            }
            *next_revision = Some(revision + 1);
            progress.send_modify(|p| p.last_revision = p.last_revision.max(revision));
        }
        if response.canceled() {
            if response.compact_revision() > 0 {
                watches.end(
                    id,
                    EndRecord::Compacted,
                    Some(response.compact_revision()),
                    None,
                );
                return Ended::Done;
            }
            let reason = response.cancel_reason();
            watches.end(
                id,
                EndRecord::Error,
                None,
                Some(if reason.is_empty() {
                    "canceled by the server".to_string()
                } else {
                    reason.to_string()
                }),
            );
            return Ended::Broken;
        }
    }
}
