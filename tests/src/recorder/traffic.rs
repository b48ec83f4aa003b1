//! The traffic: clients (tokio tasks) sending puts, deletes, compare-and-swap transactions,
//! linearizable and serializable gets over a small key space at a target rate, one request
//! at a time each, every one recorded with its call and return times, endpoint, revision
//! and result.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};
use tokio::sync::watch;

use super::classify::{Effect, classify, describe};
use super::endpoints::{ClientSpec, NoConnection, Pool, Unusable};
use super::log::{HistoryLog, OpRecord, Record, ResultRecord};

/// The relative weights of the operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mix {
    /// Puts of a unique value.
    pub put: u32,
    /// Deletes.
    pub delete: u32,
    /// Compare-and-swap transactions (value == expected, or absent; then put).
    pub cas: u32,
    /// Linearizable gets.
    pub get: u32,
    /// Serializable gets.
    pub serializable_get: u32,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            put: 30,
            delete: 10,
            cas: 20,
            get: 30,
            serializable_get: 10,
        }
    }
}

/// A deliberate break of the history, to prove that the checks catch one (tests only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Records one linearizable get, the first ok one after `after_ops` operations for which
    /// this is possible, as having read a value that two writes before its call had
    /// replaced: a stale read.
    StaleRead {
        /// Operations recorded before the fault may strike.
        after_ops: u64,
    },
    /// Sends the linearizable gets meant for `endpoint` as serializable reads and records
    /// them as linearizable: a member behind the others answers them stale.
    SerializableAsLinearizable {
        /// The endpoint.
        endpoint: String,
    },
}

/// Live figures of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Operations recorded.
    pub ops: u64,
    /// Requests sent and not answered yet (a paused traffic has none).
    pub in_flight: u64,
    /// Answered ok.
    pub ok: u64,
    /// Definitely not applied.
    pub failed: u64,
    /// Outcome unknown.
    pub unknown: u64,
    /// Writes answered ok.
    pub ok_writes: u64,
    /// The highest revision of an ok change.
    pub max_change_revision: i64,
    /// Whether a cap stopped the traffic.
    pub capped: bool,
    /// The operation the stale-read fault rewrote.
    pub rewritten: Option<u64>,
}

/// An ok change of a key, for the stale-read fault.
#[derive(Clone, Debug)]
struct Change {
    call: u64,
    ret: u64,
    value: Option<String>,
    revision: i64,
}

/// Changes remembered per key for the stale-read fault.
const CHANGES_KEPT: usize = 16;

/// What every client shares.
pub struct Traffic {
    /// The history.
    pub log: Arc<HistoryLog>,
    /// The keys.
    pub keys: Vec<String>,
    /// The mix.
    pub mix: Mix,
    /// The per-request timeout.
    pub timeout: Duration,
    /// The fault, if any.
    pub fault: Option<Fault>,
    next_id: AtomicU64,
    progress: watch::Sender<Progress>,
    changes: Mutex<HashMap<String, Vec<Change>>>,
    /// The earliest return time of a NOSPACE answer (`u64::MAX`: none yet); see
    /// [`Traffic::no_space_effect`].
    first_no_space: AtomicU64,
}

/// What a client sends.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Request {
    Put {
        key: String,
        value: String,
    },
    Delete {
        key: String,
    },
    Get {
        key: String,
        serializable: bool,
    },
    Cas {
        key: String,
        expect: Option<String>,
        value: String,
    },
}

/// What it was answered (before classification).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Answer {
    Put,
    Delete {
        deleted: i64,
    },
    Get {
        value: Option<String>,
        mod_revision: Option<i64>,
    },
    Cas {
        succeeded: bool,
    },
}

/// A small deterministic generator (splitmix64): a run's mix is reproducible from its seed.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
}

/// The kinds of operations, for the choice by weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Put,
    Delete,
    Cas,
    Get,
    SerializableGet,
}

impl Mix {
    fn choose(&self, rng: &mut Rng) -> Kind {
        let weights = [
            (Kind::Put, self.put),
            (Kind::Delete, self.delete),
            (Kind::Cas, self.cas),
            (Kind::Get, self.get),
            (Kind::SerializableGet, self.serializable_get),
        ];
        let total: u64 = weights.iter().map(|&(_, w)| u64::from(w)).sum();
        let mut x = rng.below(total);
        for (kind, w) in weights {
            if x < u64::from(w) {
                return kind;
            }
            x -= u64::from(w);
        }
        Kind::Get
    }
}

impl Traffic {
    /// The shared state of the clients writing to `log`.
    pub fn new(
        log: Arc<HistoryLog>,
        keys: Vec<String>,
        mix: Mix,
        timeout: Duration,
        fault: Option<Fault>,
    ) -> Self {
        Traffic {
            log,
            keys,
            mix,
            timeout,
            fault,
            next_id: AtomicU64::new(1),
            progress: watch::channel(Progress::default()).0,
            changes: Mutex::new(HashMap::new()),
            first_no_space: AtomicU64::new(u64::MAX),
        }
    }

    /// The effect of a write etcd answered with NOSPACE, called at `call` and answered at
    /// `ret`. etcd applies the entry whose apply crosses the quota and answers NOSPACE for it
    /// all the same (3.6's `quotaApplierV3`), and raises the alarm before it sends any NOSPACE
    /// answer; every entry proposed after the alarm is refused. So a write called after some
    /// NOSPACE answer had returned was not applied; one called before the first may have been.
    /// (Answers recorded out of order only lower the earliest return seen: a write then taken
    /// as unknown that was in fact refused is a safe over-approximation.)
    fn no_space_effect(&self, call: u64, ret: u64) -> Effect {
        let first = self
            .first_no_space
            .fetch_min(ret, Ordering::SeqCst)
            .min(ret);
        if call < first {
            Effect::Unknown
        } else {
            Effect::Fail
        }
    }

    /// The live figures.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.progress.subscribe()
    }

    /// Records one operation (a new id) and updates the figures.
    fn record(
        &self,
        client: u64,
        endpoint: &str,
        call: u64,
        ret: Option<u64>,
        op: OpRecord,
        result: ResultRecord,
    ) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let write = !matches!(op, OpRecord::Get { .. });
        let change_revision = match (&op, &result) {
            (OpRecord::Put { .. }, ResultRecord::Ok { revision, .. })
            | (
                OpRecord::Cas { .. },
                ResultRecord::Ok {
                    revision,
                    succeeded: Some(true),
                    ..
                },
            ) => Some(*revision),
            (
                OpRecord::Delete { .. },
                ResultRecord::Ok {
                    revision,
                    deleted: Some(d),
                    ..
                },
            ) if *d > 0 => Some(*revision),
            _ => None,
        };
        let outcome = match &result {
            ResultRecord::Ok { .. } => 0,
            ResultRecord::Fail { .. } => 1,
            ResultRecord::Unknown { .. } => 2,
        };
        let written = self.log.write(&Record::Op {
            id,
            client,
            endpoint: endpoint.to_string(),
            call,
            ret,
            op,
            result,
        });
        self.progress.send_modify(|p| {
            if !written {
                p.capped = true;
                return;
            }
            p.ops += 1;
            match outcome {
                0 => {
                    p.ok += 1;
                    p.ok_writes += u64::from(write);
                }
                1 => p.failed += 1,
                _ => p.unknown += 1,
            }
            if let Some(r) = change_revision {
                p.max_change_revision = p.max_change_revision.max(r);
            }
        });
        id
    }

    /// Remembers an ok change of `key` for the stale-read fault.
    fn remember_change(&self, key: &str, change: Change) {
        if !matches!(self.fault, Some(Fault::StaleRead { .. })) {
            return;
        }
        let mut changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let list = changes.entry(key.to_string()).or_default();
        list.push(change);
        if list.len() > CHANGES_KEPT {
            list.remove(0);
        }
    }

    /// For the stale-read fault: a value of `key` that a later change replaced, both
    /// returned before `call` one after the other, with its revision.
    fn stale_value(&self, key: &str, call: u64) -> Option<(String, i64)> {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        let list = changes.get(key)?;
        let later = list.iter().filter(|c| c.ret < call).max_by_key(|c| c.ret)?;
        list.iter()
            .filter(|c| c.ret < later.call && c.revision < later.revision)
            .find_map(|c| c.value.clone().map(|v| (v, c.revision)))
    }
}

/// A request in flight, counted in [`Progress::in_flight`] while it lives.
struct InFlight<'a>(&'a Traffic);

impl<'a> InFlight<'a> {
    fn new(traffic: &'a Traffic) -> Self {
        traffic.progress.send_modify(|p| p.in_flight += 1);
        InFlight(traffic)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0
            .progress
            .send_modify(|p| p.in_flight = p.in_flight.saturating_sub(1));
    }
}

/// One client: sends requests at `interval` until `stop` turns true or the history is full,
/// none while `pause` is true.
pub async fn run_client(
    id: u64,
    spec: ClientSpec,
    traffic: Arc<Traffic>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
    mut pause: watch::Receiver<bool>,
) {
    let mix = spec.mix.unwrap_or(traffic.mix);
    let mut pool = Pool::new(spec, false);
    let mut rng = Rng::new(0x5EED_0000 + id);
    let mut seq: u64 = 0;
    // The last value this client saw per key (`None`: absent), for its cas expectations.
    let mut known: HashMap<String, Option<String>> = HashMap::new();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        if !traffic.log.ops_room() {
            traffic.progress.send_modify(|p| p.capped = true);
            return;
        }
        let endpoint = match pool.pick() {
            Ok(endpoint) => endpoint,
            Err(Unusable::Empty) => {
                let endpoints = pool.endpoints();
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    _ = endpoints.changed() => continue,
                }
            }
            Err(Unusable::BackingOff(until)) => {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => return,
                    () = tokio::time::sleep_until(until) => continue,
                }
            }
        };
        let Some(key) = traffic
            .keys
            .get(usize::try_from(rng.below(traffic.keys.len() as u64)).unwrap_or(0))
            .cloned()
        else {
            return;
        };
        let request = match mix.choose(&mut rng) {
            Kind::Put => {
                seq += 1;
                Request::Put {
                    key,
                    value: format!("c{id}-{seq}"),
                }
            }
            Kind::Delete => Request::Delete { key },
            Kind::Cas => {
                seq += 1;
                let expect = known.get(&key).cloned().flatten();
                Request::Cas {
                    key,
                    expect,
                    value: format!("c{id}-{seq}"),
                }
            }
            Kind::Get => Request::Get {
                key,
                serializable: false,
            },
            Kind::SerializableGet => Request::Get {
                key,
                serializable: true,
            },
        };
        // Counted before the pause is read: a pause that sees no request in flight sees
        // every later one wait.
        let in_flight = InFlight::new(&traffic);
        if *pause.borrow_and_update() {
            drop(in_flight);
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = pause.wait_for(|p| !*p) => continue,
            }
        }
        send(id, &endpoint, request, &mut pool, &traffic, &mut known).await;
        drop(in_flight);
    }
}

/// Sends one request and records it.
async fn send(
    client_id: u64,
    endpoint: &str,
    request: Request,
    pool: &mut Pool,
    traffic: &Traffic,
    known: &mut HashMap<String, Option<String>>,
) {
    // The stale-read fault on this endpoint: a linearizable get sent serializable.
    let mut sent = request.clone();
    if let (
        Some(Fault::SerializableAsLinearizable { endpoint: faulty }),
        Request::Get { serializable, .. },
    ) = (&traffic.fault, &mut sent)
        && faulty == endpoint
    {
        *serializable = true;
    }
    let op = match &request {
        Request::Put { key, value } => OpRecord::Put {
            key: key.clone(),
            value: value.clone(),
        },
        Request::Delete { key } => OpRecord::Delete { key: key.clone() },
        Request::Get { key, serializable } => OpRecord::Get {
            key: key.clone(),
            serializable: *serializable,
        },
        Request::Cas { key, expect, value } => OpRecord::Cas {
            key: key.clone(),
            expect: expect.clone(),
            value: value.clone(),
        },
    };
    let key = op.key().to_string();
    let call = traffic.log.now();
    let answer = match pool.client(endpoint).await {
        Ok(mut client) => tokio::time::timeout(traffic.timeout, execute(&mut client, &sent))
            .await
            .unwrap_or_else(|_| Err(Outcome::TimedOut)),
        Err(e) => Err(Outcome::NotSent(e)),
    };
    let ret = traffic.log.now();
    match answer {
        Ok((revision, answer)) => {
            pool.succeeded(endpoint);
            let mut result = ok_result(revision, &answer);
            match (&request, &answer) {
                (Request::Put { value, .. }, _)
                | (Request::Cas { value, .. }, Answer::Cas { succeeded: true }) => {
                    known.insert(key.clone(), Some(value.clone()));
                    traffic.remember_change(
                        &key,
                        Change {
                            call,
                            ret,
                            value: Some(value.clone()),
                            revision,
                        },
                    );
                }
                (Request::Delete { .. }, Answer::Delete { deleted }) => {
                    known.insert(key.clone(), None);
                    if *deleted > 0 {
                        traffic.remember_change(
                            &key,
                            Change {
                                call,
                                ret,
                                value: None,
                                revision,
                            },
                        );
                    }
                }
                (Request::Get { .. }, Answer::Get { value, .. }) => {
                    known.insert(key.clone(), value.clone());
                }
                _ => {
                    known.remove(&key);
                }
            }
            let mut rewritten = false;
            if let (
                Some(Fault::StaleRead { after_ops }),
                Request::Get {
                    serializable: false,
                    ..
                },
            ) = (&traffic.fault, &request)
            {
                let p = *traffic.progress.borrow();
                if p.rewritten.is_none()
                    && p.ops >= *after_ops
                    && let Some((stale, stale_revision)) = traffic.stale_value(&key, call)
                    && let ResultRecord::Ok {
                        value,
                        mod_revision,
                        ..
                    } = &mut result
                {
                    *value = Some(Some(stale));
                    *mod_revision = Some(stale_revision);
                    rewritten = true;
                }
            }
            let id = traffic.record(client_id, endpoint, call, Some(ret), op, result);
            if rewritten {
                traffic.progress.send_modify(|p| p.rewritten = Some(id));
            }
        }
        Err(outcome) => {
            known.remove(&key);
            let (effect, error, drop_connection) = match &outcome {
                Outcome::TimedOut => (
                    Effect::Unknown,
                    format!(
                        "no answer within {:?} (the recorder's timeout)",
                        traffic.timeout
                    ),
                    true,
                ),
                Outcome::NoHeader => (Effect::Unknown, "an answer without a header".into(), true),
                // No connection to send it on.
                Outcome::NotSent(e) => (Effect::Fail, e.to_string(), true),
                Outcome::Error(e) => {
                    let effect = match classify(e) {
                        Effect::Fail if is_no_space(e) => traffic.no_space_effect(call, ret),
                        effect => effect,
                    };
                    let broken = match e {
                        etcd_client::Error::GRpcStatus(s) => matches!(
                            s.code(),
                            tonic::Code::Unavailable
                                | tonic::Code::DeadlineExceeded
                                | tonic::Code::Cancelled
                                | tonic::Code::Unknown
                                | tonic::Code::Internal
                        ),
                        _ => true,
                    };
                    (effect, describe(e), broken)
                }
            };
            if drop_connection {
                pool.failed(endpoint);
            }
            let (ret, result) = match effect {
                Effect::Fail => (Some(ret), ResultRecord::Fail { error }),
                Effect::Unknown => (None, ResultRecord::Unknown { error }),
            };
            traffic.record(client_id, endpoint, call, ret, op, result);
        }
    }
}

/// Whether etcd answered `error` with its NOSPACE refusal.
fn is_no_space(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(s)
        if s.code() == tonic::Code::ResourceExhausted
            && s.message().contains("database space exceeded"))
}

/// Why a request got no answer.
enum Outcome {
    /// The recorder's per-request timeout.
    TimedOut,
    /// An answer without a response header (no revision to record).
    NoHeader,
    /// No connection: the request was never sent.
    NotSent(NoConnection),
    /// The client's error.
    Error(etcd_client::Error),
}

impl From<etcd_client::Error> for Outcome {
    fn from(e: etcd_client::Error) -> Self {
        Outcome::Error(e)
    }
}

fn ok_result(revision: i64, answer: &Answer) -> ResultRecord {
    let mut result = ResultRecord::Ok {
        revision,
        value: None,
        mod_revision: None,
        deleted: None,
        succeeded: None,
    };
    if let ResultRecord::Ok {
        value,
        mod_revision: m,
        deleted: d,
        succeeded: s,
        ..
    } = &mut result
    {
        match answer {
            Answer::Put => {}
            Answer::Delete { deleted } => *d = Some(*deleted),
            Answer::Get {
                value: v,
                mod_revision,
            } => {
                *value = Some(v.clone());
                *m = *mod_revision;
            }
            Answer::Cas { succeeded } => *s = Some(*succeeded),
        }
    }
    result
}

/// Sends `request`; the answer with its header's revision.
async fn execute(client: &mut Client, request: &Request) -> Result<(i64, Answer), Outcome> {
    let mut kv = client.kv_client();
    let header = |h: Option<&etcd_client::ResponseHeader>| {
        h.map(etcd_client::ResponseHeader::revision)
            .ok_or(Outcome::NoHeader)
    };
    match request {
        Request::Put { key, value } => {
            let r = kv.put(key.as_str(), value.as_str(), None).await?;
            Ok((header(r.header())?, Answer::Put))
        }
        Request::Delete { key } => {
            let r = kv.delete(key.as_str(), None).await?;
            Ok((
                header(r.header())?,
                Answer::Delete {
                    deleted: r.deleted(),
                },
            ))
        }
        Request::Get { key, serializable } => {
            let options = if *serializable {
                GetOptions::new().with_serializable()
            } else {
                GetOptions::new()
            };
            let r = kv.get(key.as_str(), Some(options)).await?;
            let kv = r.kvs().first();
            Ok((
                header(r.header())?,
                Answer::Get {
                    value: kv.map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
                    mod_revision: kv.map(etcd_client::KeyValue::mod_revision),
                },
            ))
        }
        Request::Cas { key, expect, value } => {
            let compare = match expect {
                Some(expect) => Compare::value(key.as_str(), CompareOp::Equal, expect.as_str()),
                None => Compare::version(key.as_str(), CompareOp::Equal, 0),
            };
            let txn = Txn::new().when([compare]).and_then([TxnOp::put(
                key.as_str(),
                value.as_str(),
                None,
            )]);
            let r = kv.txn(txn).await?;
            Ok((
                header(r.header())?,
                Answer::Cas {
                    succeeded: r.succeeded(),
                },
            ))
        }
    }
}

/// Reads `key` linearizably through `client` (the end of a run): the answer is recorded as
/// an operation of `client_id`. Returns the header's revision when ok.
pub async fn final_read(
    traffic: &Traffic,
    client_id: u64,
    endpoint: &str,
    client: &mut Client,
    key: &str,
) -> Result<i64, String> {
    let request = Request::Get {
        key: key.to_string(),
        serializable: false,
    };
    let call = traffic.log.now();
    let answer = tokio::time::timeout(traffic.timeout, execute(client, &request))
        .await
        .unwrap_or_else(|_| Err(Outcome::TimedOut));
    let ret = traffic.log.now();
    let op = OpRecord::Get {
        key: key.to_string(),
        serializable: false,
    };
    match answer {
        Ok((revision, answer)) => {
            traffic.record(
                client_id,
                endpoint,
                call,
                Some(ret),
                op,
                ok_result(revision, &answer),
            );
            Ok(revision)
        }
        Err(outcome) => {
            let error = match &outcome {
                Outcome::TimedOut => "timed out".to_string(),
                Outcome::NoHeader => "an answer without a header".to_string(),
                Outcome::NotSent(e) => e.to_string(),
                Outcome::Error(e) => describe(e),
            };
            // A get changes nothing: a failed one is recorded as failed.
            traffic.record(
                client_id,
                endpoint,
                call,
                Some(ret),
                op,
                ResultRecord::Fail {
                    error: error.clone(),
                },
            );
            Err(error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_follows_its_weights() {
        let mut rng = Rng::new(1);
        let mix = Mix {
            put: 1,
            delete: 0,
            cas: 0,
            get: 3,
            serializable_get: 0,
        };
        let gets = (0..4000)
            .filter(|_| mix.choose(&mut rng) == Kind::Get)
            .count();
        assert!((2800..3200).contains(&gets), "{gets}");
        let only_puts = Mix {
            put: 1,
            delete: 0,
            cas: 0,
            get: 0,
            serializable_get: 0,
        };
        assert!((0..100).all(|_| only_puts.choose(&mut rng) == Kind::Put));
    }

    #[test]
    fn a_stale_value_is_one_replaced_before_the_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = HistoryLog::create(&dir.path().join("h"), 10, 10).expect("log");
        let traffic = Traffic::new(
            Arc::new(log),
            vec!["k".into()],
            Mix::default(),
            Duration::from_secs(1),
            Some(Fault::StaleRead { after_ops: 0 }),
        );
        let change = |call, ret, value: Option<&str>, revision| Change {
            call,
            ret,
            value: value.map(str::to_string),
            revision,
        };
        traffic.remember_change("k", change(10, 20, Some("a"), 2));
        assert_eq!(traffic.stale_value("k", 100), None, "one change only");
        // Concurrent with "a": not a proof of staleness.
        traffic.remember_change("k", change(15, 30, Some("b"), 3));
        assert_eq!(traffic.stale_value("k", 100), None);
        traffic.remember_change("k", change(40, 50, None, 4));
        assert_eq!(
            traffic.stale_value("k", 45),
            None,
            "the delete had not returned"
        );
        assert_eq!(traffic.stale_value("k", 60), Some(("a".to_string(), 2)));
    }
}
