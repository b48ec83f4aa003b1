//! Linearizability of a recorded history against etcd's key-value model, partitioned by epoch
//! and key (P-compositionality: a history is linearizable when each key's is).
//!
//! Left out: serializable reads (they may be stale; [`super::serializable`] checks them),
//! failed operations (not applied) and gets with an unknown outcome (they say nothing). An
//! unknown-outcome write may take effect any time after its call, or never, unless a watch
//! saw it ([`super::watches::Resolved`]): then it took effect, before that watch received it.
//!
//! Each key starts absent in the first epoch; after a recovery (a later epoch) its value is
//! unknown ([`KvState::Any`]): writes acknowledged before may have been lost.

use super::watches::Resolved;
use crate::history::{Answer, History, Op, OpKind, OpResult};
use crate::model::kv::{KvInput, KvModel, KvOutput, KvState, Values};
use crate::search::{Limits, Model, Operation, Outcome, Undecided, check_partition};
use std::collections::BTreeMap;
use std::time::Instant;

/// A key whose history is not linearizable, with the witness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinViolation {
    /// The epoch.
    pub epoch: usize,
    /// The key (the partition).
    pub key: String,
    /// The linearizable prefix reaching furthest in time (indices into the history's ops), in
    /// order: it holds every operation that returned before `blocking`.
    pub prefix: Vec<usize>,
    /// The key's state after it.
    pub state: String,
    /// The operation that had to take effect by its return and could not.
    pub blocking: usize,
    /// The operations that could have come next (it among them), and whether the model
    /// accepts each from `state` (accepted ones lead to dead ends further on).
    pub candidates: Vec<(usize, bool)>,
    /// The time window of the conflict (ns): the earliest call of the candidates that
    /// returned to the blocking operation's return (`None`: unknown).
    pub window: (u64, Option<u64>),
    /// The operations of the key in that epoch (indices into the history's ops).
    pub partition: Vec<usize>,
}

/// A partition left without a verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinUndecided {
    /// The epoch.
    pub epoch: usize,
    /// The key.
    pub key: String,
    /// Why.
    pub reason: Undecided,
    /// Its number of operations.
    pub ops: usize,
}

/// The linearizability check's result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinReport {
    /// Partitions (epoch, key) checked.
    pub partitions: usize,
    /// Operations checked.
    pub ops: usize,
    /// Serializable reads left out.
    pub serializable_reads: usize,
    /// Failed operations and unknown gets left out.
    pub left_out: usize,
    /// Unknown writes known applied from a watch.
    pub resolved: usize,
    /// Search steps, over all partitions.
    pub steps: u64,
    /// The largest operations count of a partition.
    pub largest_partition: usize,
    /// Keys not linearizable.
    pub violations: Vec<LinViolation>,
    /// Partitions without a verdict.
    pub undecided: Vec<LinUndecided>,
}

/// The model's operation for `op`, or `None` when it is left out.
fn operation(
    op: &Op,
    index: usize,
    resolved: Option<&Resolved>,
    values: &mut Values,
) -> Option<Operation<KvInput, KvOutput>> {
    let input = match &op.kind {
        OpKind::Put { value, .. } => KvInput::Put(values.intern(value)),
        OpKind::Delete { .. } => KvInput::Delete,
        OpKind::Get { .. } => KvInput::Get,
        OpKind::Cas { expect, value, .. } => KvInput::Cas {
            expect: expect.as_deref().map(|e| values.intern(e)),
            value: values.intern(value),
        },
    };
    let (output, ret) = match &op.result {
        OpResult::Fail { .. } => return None,
        OpResult::Unknown { .. } => match (resolved, &op.kind) {
            (_, OpKind::Get { .. }) => return None,
            (None, _) => (KvOutput::Unknown, None),
            (Some(r), kind) => {
                let output = match kind {
                    OpKind::Delete { .. } => KvOutput::Delete { deleted: 1 },
                    OpKind::Cas { .. } => KvOutput::Cas { succeeded: true },
                    _ => KvOutput::Put,
                };
                (output, Some(r.time.max(op.call)))
            }
        },
        OpResult::Ok { answer, .. } => {
            let output = match answer {
                Answer::Put => KvOutput::Put,
                Answer::Delete { deleted } => KvOutput::Delete { deleted: *deleted },
                Answer::Get { value, .. } => {
                    KvOutput::Get(value.as_deref().map(|v| values.intern(v)))
                }
                Answer::Cas { succeeded } => KvOutput::Cas {
                    succeeded: *succeeded,
                },
            };
            (output, op.ret)
        }
    };
    Some(Operation {
        id: index as u64,
        client: op.client,
        call: op.call,
        ret,
        input,
        output,
    })
}

/// Checks each (epoch, key) partition of `history`; `resolved` are the unknown writes the
/// watches saw.
pub fn check_linearizability(
    history: &History,
    resolved: &BTreeMap<usize, Resolved>,
    limits: &Limits,
) -> LinReport {
    let mut report = LinReport::default();
    let mut values = Values::default();
    let mut partitions: BTreeMap<(usize, &str), Vec<Operation<KvInput, KvOutput>>> =
        BTreeMap::new();
    for (i, op) in history.ops.iter().enumerate() {
        if op.kind.is_serializable_read() {
            report.serializable_reads += 1;
            continue;
        }
        let r = resolved.get(&i).filter(|_| op.is_unknown());
        match operation(op, i, r, &mut values) {
            Some(o) => {
                report.ops += 1;
                report.resolved += usize::from(r.is_some());
                partitions
                    .entry((history.epoch_of(op.call), op.kind.key()))
                    .or_default()
                    .push(o);
            }
            None => report.left_out += 1,
        }
    }
    report.partitions = partitions.len();
    for ((epoch, key), ops) in &partitions {
        report.largest_partition = report.largest_partition.max(ops.len());
        let undecided = |reason| LinUndecided {
            epoch: *epoch,
            key: key.to_string(),
            reason,
            ops: ops.len(),
        };
        if limits.deadline.is_some_and(|d| Instant::now() >= d) {
            report.undecided.push(undecided(Undecided::Deadline));
            continue;
        }
        let model = KvModel {
            initial: if *epoch == 0 {
                KvState::Absent
            } else {
                KvState::Any
            },
            values: &values,
        };
        let (outcome, stats) = check_partition(&model, ops, limits);
        report.steps += stats.steps;
        let index = |local: usize| ops.get(local).map_or(usize::MAX, |o| o.id as usize);
        match outcome {
            Outcome::Linearizable { .. } => {}
            Outcome::Undecided(reason) => report.undecided.push(undecided(reason)),
            Outcome::Violation(w) => {
                let blocking = ops.get(w.blocking);
                let start = w
                    .candidates
                    .iter()
                    .filter_map(|c| ops.get(c.op).filter(|o| o.ret.is_some()).map(|o| o.call))
                    .chain(blocking.map(|b| b.call))
                    .min()
                    .unwrap_or(0);
                report.violations.push(LinViolation {
                    epoch: *epoch,
                    key: key.to_string(),
                    prefix: w.prefix.iter().map(|&p| index(p)).collect(),
                    state: model.describe_state(&w.state),
                    blocking: index(w.blocking),
                    candidates: w
                        .candidates
                        .iter()
                        .map(|c| (index(c.op), c.allowed))
                        .collect(),
                    window: (start, blocking.and_then(|b| b.ret)),
                    partition: ops.iter().map(|o| o.id as usize).collect(),
                });
            }
        }
    }
    report
}
