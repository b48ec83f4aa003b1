//! etcd's key-value store, one key at a time (the partition of a history by key): put, delete,
//! get, and a compare-and-swap transaction (compare the value, or the key's absence, then put).
//!
//! Values are interned ([`Values`]) so a state is a small number. Nothing relies on values
//! being unique.

use crate::search::Model;
use std::collections::HashMap;

/// The values of a history, each named by a number.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Values {
    names: Vec<String>,
    index: HashMap<String, u32>,
}

impl Values {
    /// The number of `value`, given it if new.
    pub fn intern(&mut self, value: &str) -> u32 {
        if let Some(&n) = self.index.get(value) {
            return n;
        }
        let n = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.names.push(value.to_string());
        self.index.insert(value.to_string(), n);
        n
    }

    /// The value numbered `n`.
    pub fn name(&self, n: u32) -> &str {
        self.names.get(n as usize).map_or("?", String::as_str)
    }
}

/// The state of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvState {
    /// The key does not exist.
    Absent,
    /// The key holds this value.
    Value(u32),
    /// Not known (the start of an epoch after a recovery: any earlier value, or none); the
    /// first read or write fixes it.
    Any,
}

impl KvState {
    fn of(value: Option<u32>) -> KvState {
        value.map_or(KvState::Absent, KvState::Value)
    }
}

/// What an operation on the key asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvInput {
    /// Put a value.
    Put(u32),
    /// Delete the key.
    Delete,
    /// Read the key.
    Get,
    /// If the value is `expect` (`None`: the key is absent), put `value`.
    Cas {
        /// The expected value, or absence.
        expect: Option<u32>,
        /// The value to put.
        value: u32,
    },
}

/// What it was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOutput {
    /// The put was applied.
    Put,
    /// The delete was applied and deleted this many keys (0 or 1).
    Delete {
        /// Keys deleted.
        deleted: i64,
    },
    /// The value read (`None`: absent).
    Get(Option<u32>),
    /// Whether the comparison held (and the put was done).
    Cas {
        /// Whether it held.
        succeeded: bool,
    },
    /// No answer: the operation may have been applied or not.
    Unknown,
}

/// The key-value model of one key.
#[derive(Clone, Copy, Debug)]
pub struct KvModel<'a> {
    /// The key's state at the start (absent at the start of a history, [`KvState::Any`] after
    /// a recovery).
    pub initial: KvState,
    /// The history's values, to describe operations.
    pub values: &'a Values,
}

impl Model for KvModel<'_> {
    type State = KvState;
    type Input = KvInput;
    type Output = KvOutput;

    fn init(&self) -> KvState {
        self.initial
    }

    fn step(&self, state: &KvState, input: &KvInput, output: &KvOutput) -> Option<KvState> {
        use KvState::{Absent, Any};
        let s = *state;
        match (*input, *output) {
            (KvInput::Get, KvOutput::Unknown) => Some(s),
            (KvInput::Get, KvOutput::Get(v)) => {
                let read = KvState::of(v);
                (s == Any || s == read).then_some(read)
            }
            (KvInput::Put(v), KvOutput::Put | KvOutput::Unknown) => Some(KvState::Value(v)),
            (KvInput::Delete, KvOutput::Unknown) => Some(Absent),
            (KvInput::Delete, KvOutput::Delete { deleted }) => match (s, deleted) {
                (Absent | Any, 0) | (KvState::Value(_) | Any, 1) => Some(Absent),
                _ => None,
            },
            (KvInput::Cas { expect, value }, KvOutput::Cas { succeeded }) => {
                if s == Any {
                    // Succeeded: it held `expect`, now `value`. Failed: still unknown (only
                    // "not `expect`" is learnt; kept as Any, which is permissive).
                    return Some(if succeeded {
                        KvState::Value(value)
                    } else {
                        Any
                    });
                }
                let holds = s == KvState::of(expect);
                (holds == succeeded).then_some(if holds { KvState::Value(value) } else { s })
            }
            (KvInput::Cas { expect, value }, KvOutput::Unknown) => Some(match s {
                Any => Any,
                s if s == KvState::of(expect) => KvState::Value(value),
                s => s,
            }),
            _ => None,
        }
    }

    fn describe_operation(&self, input: &KvInput, output: &KvOutput) -> String {
        let v = |n: u32| format!("{:?}", self.values.name(n));
        let opt = |o: Option<u32>| o.map_or_else(|| "absent".to_string(), v);
        let call = match input {
            KvInput::Put(n) => format!("put {}", v(*n)),
            KvInput::Delete => "delete".to_string(),
            KvInput::Get => "get".to_string(),
            KvInput::Cas { expect, value } => {
                format!("cas(if {} then put {})", opt(*expect), v(*value))
            }
        };
        let answer = match output {
            KvOutput::Put => "ok".to_string(),
            KvOutput::Delete { deleted } => format!("deleted {deleted}"),
            KvOutput::Get(value) => opt(*value),
            KvOutput::Cas { succeeded: true } => "succeeded".to_string(),
            KvOutput::Cas { succeeded: false } => "not succeeded".to_string(),
            KvOutput::Unknown => "unknown".to_string(),
        };
        format!("{call} -> {answer}")
    }

    fn describe_state(&self, state: &KvState) -> String {
        match state {
            KvState::Absent => "absent".to_string(),
            KvState::Value(n) => format!("{:?}", self.values.name(*n)),
            KvState::Any => "unknown (any value)".to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use KvState::*;

    #[test]
    fn steps() {
        let mut values = Values::default();
        let (a, b) = (values.intern("a"), values.intern("b"));
        assert_eq!(values.intern("a"), a);
        let m = KvModel {
            initial: Absent,
            values: &values,
        };
        let put = KvInput::Put(a);
        assert_eq!(m.step(&Absent, &put, &KvOutput::Put), Some(Value(a)));
        assert_eq!(
            m.step(&Absent, &KvInput::Get, &KvOutput::Get(None)),
            Some(Absent)
        );
        assert_eq!(
            m.step(&Value(a), &KvInput::Get, &KvOutput::Get(Some(b))),
            None
        );
        assert_eq!(
            m.step(&Any, &KvInput::Get, &KvOutput::Get(Some(b))),
            Some(Value(b))
        );
        let del = |deleted| KvOutput::Delete { deleted };
        assert_eq!(m.step(&Value(a), &KvInput::Delete, &del(1)), Some(Absent));
        assert_eq!(m.step(&Value(a), &KvInput::Delete, &del(0)), None);
        assert_eq!(m.step(&Absent, &KvInput::Delete, &del(1)), None);
        assert_eq!(m.step(&Any, &KvInput::Delete, &del(0)), Some(Absent));
        let cas = KvInput::Cas {
            expect: Some(a),
            value: b,
        };
        let ok = |succeeded| KvOutput::Cas { succeeded };
        assert_eq!(m.step(&Value(a), &cas, &ok(true)), Some(Value(b)));
        assert_eq!(m.step(&Value(a), &cas, &ok(false)), None);
        assert_eq!(m.step(&Absent, &cas, &ok(false)), Some(Absent));
        assert_eq!(m.step(&Absent, &cas, &KvOutput::Unknown), Some(Absent));
        assert_eq!(m.step(&Value(a), &cas, &KvOutput::Unknown), Some(Value(b)));
        assert_eq!(m.step(&Any, &cas, &ok(false)), Some(Any));
        let create = KvInput::Cas {
            expect: None,
            value: a,
        };
        assert_eq!(m.step(&Absent, &create, &ok(true)), Some(Value(a)));
        assert_eq!(m.step(&Absent, &put, &KvOutput::Get(None)), None);
        assert_eq!(
            m.describe_operation(&cas, &ok(true)),
            "cas(if \"a\" then put \"b\") -> succeeded"
        );
        assert_eq!(
            m.describe_operation(&KvInput::Get, &KvOutput::Get(None)),
            "get -> absent"
        );
        assert_eq!(m.describe_state(&Any), "unknown (any value)");
    }
}
