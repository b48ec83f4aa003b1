//! Porcupine's linearizability search (anishathalye/porcupine v1.3.1, `checker.go`), in Rust.
//!
//! The history of one partition becomes a doubly linked list of call and return entries in
//! time order (calls first on equal times). The search (Wing & Gong) walks the list from its
//! head: a call whose operation the model accepts from the current state is *lifted* (it and
//! its return leave the list) and pushed on an undo stack with the state before it; reaching a
//! return entry means the operation it closes had to take effect by now and could not, so the
//! last lifted call is put back (*unlifted*) and the walk continues after it. The list empty
//! means every operation was placed: the history is linearizable. The undo stack empty at a
//! return means it is not. Lowe's memoisation: a set of (operations linearized, model state)
//! pairs already explored, so no configuration is explored twice.
//!
//! An operation whose outcome is unknown has no return time (`ret: None`): its return entry
//! sorts after every other entry, so it may take effect at any point after its call, or never
//! (placed last, after everything that was observed).
//!
//! A witness of a violation is the dead end at the latest return the search reached (the
//! history up to there is linearizable, and no linearization gets past that return), with the
//! shortest prefix found there.
//!
//! Bounds: a deadline (checked every [`CHECK_EVERY`] steps) and a cap on the cache's memory;
//! either ends the search as [`Outcome::Undecided`].

use crate::bitset::Bitset;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::time::Instant;

/// A sequential specification: the states of the object and the operations' effect on them.
pub trait Model {
    /// A state of the object.
    type State: Clone + Eq + Hash;
    /// What an operation asked for.
    type Input;
    /// What it was answered.
    type Output;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` answered `output`, applied to `state`; `None` when that answer
    /// is impossible from that state.
    fn step(
        &self,
        state: &Self::State,
        input: &Self::Input,
        output: &Self::Output,
    ) -> Option<Self::State>;

    /// One line describing an operation, e.g. `read() -> 3`.
    fn describe_operation(&self, input: &Self::Input, output: &Self::Output) -> String;

    /// A short description of a state.
    fn describe_state(&self, state: &Self::State) -> String;
}

/// One operation of a history: when it was called and returned, what it asked and was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Operation<I, O> {
    /// The caller's identifier (reported in witnesses).
    pub id: u64,
    /// The client (process) that called it.
    pub client: u64,
    /// When it was called.
    pub call: u64,
    /// When it returned; `None` when its outcome is unknown (infinity).
    pub ret: Option<u64>,
    /// What it asked for.
    pub input: I,
    /// What it was answered.
    pub output: O,
}

/// The default cap on the memoisation cache: 1 GiB.
pub const DEFAULT_MAX_CACHE_BYTES: usize = 1 << 30;

/// How many search steps run between two looks at the clock.
pub const CHECK_EVERY: u64 = 1024;

/// When to give up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Give up at this instant (`None`: never).
    pub deadline: Option<Instant>,
    /// Give up when the cache would hold more than about this many bytes.
    pub max_cache_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            deadline: None,
            max_cache_bytes: DEFAULT_MAX_CACHE_BYTES,
        }
    }
}

/// Why a search ended without a verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Undecided {
    /// The deadline passed.
    Deadline,
    /// The cache reached its cap.
    CacheFull {
        /// Entries it held.
        entries: usize,
        /// Their approximate size.
        bytes: usize,
    },
}

/// An operation that could have been placed next after a witness's prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Its index in the partition's operations.
    pub op: usize,
    /// Whether the model accepts it from the prefix's state (when it does, every way on from
    /// there was explored and failed).
    pub allowed: bool,
}

/// Why a history is not linearizable: the linearizable prefix that reaches furthest in time,
/// and what cannot follow it (Porcupine's "partial linearizations", chosen by time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Witness<S> {
    /// Indices (into the partition's operations) of the prefix, in linearization order. It
    /// holds every operation that returned before `blocking` did (the dead end at the latest
    /// return the search reached), and of such prefixes the shortest found.
    pub prefix: Vec<usize>,
    /// The model's state after that prefix.
    pub state: S,
    /// The operation that had to take effect before its return and could not: every
    /// operation called before that return is in the prefix or in `candidates`.
    pub blocking: usize,
    /// The operations not in the prefix that were called before `blocking` returned (it among
    /// them): one of them had to be next, and none can be.
    pub candidates: Vec<Candidate>,
}

/// The verdict on one partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome<S> {
    /// Linearizable, with one linearization (indices into the partition's operations).
    Linearizable {
        /// The operations in the order they took effect (unknown-outcome operations placed
        /// last took no effect).
        order: Vec<usize>,
    },
    /// Not linearizable.
    Violation(Witness<S>),
    /// No verdict within the limits.
    Undecided(Undecided),
}

/// Figures of one search.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Steps taken (an operation tried, or one undone).
    pub steps: u64,
    /// Configurations in the cache at the end.
    pub cache_entries: usize,
    /// Their approximate size in bytes.
    pub cache_bytes: usize,
}

/// The FxHash mixing function (rustc's): fast, and good enough for these keys.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

const FX_K: u64 = 0x517c_c1b7_2722_0a95;

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(FX_K);
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_i64(&mut self, n: i64) {
        self.write_u64(n as u64);
    }
}

/// The map hasher of already mixed keys: the key itself.
#[derive(Default, Clone, Copy)]
struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// MurmurHash3's 64-bit finalizer: every bit of the key depends on every bit of `h` (the
/// hash table indexes by the low bits, which FxHash leaves weak).
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Lowe's cache: the (linearized set, state) configurations explored, bucketed by hash so a
/// lookup needs no copy of the set.
struct Cache<S> {
    buckets: HashMap<u64, Vec<(Bitset, S)>, BuildHasherDefault<KeyHasher>>,
    entries: usize,
    bytes: usize,
}

impl<S: Eq + Hash + Clone> Cache<S> {
    fn new() -> Cache<S> {
        Cache {
            buckets: HashMap::default(),
            entries: 0,
            bytes: 0,
        }
    }

    /// Adds the configuration; false when it was already there.
    fn insert(&mut self, linearized: &Bitset, state: &S) -> bool {
        let mut h = FxHasher::default();
        state.hash(&mut h);
        let key = fmix64(linearized.hash() ^ h.finish());
        let bucket = self.buckets.entry(key).or_default();
        if bucket.iter().any(|(b, s)| b == linearized && s == state) {
            return false;
        }
        if bucket.is_empty() {
            self.bytes += std::mem::size_of::<(u64, Vec<(Bitset, S)>)>() + 16;
        }
        bucket.push((linearized.clone(), state.clone()));
        self.entries += 1;
        self.bytes += linearized.words() * 8 + std::mem::size_of::<(Bitset, S)>() + 16;
        true
    }
}

const NIL: usize = usize::MAX;
const HEAD: usize = 0;

/// The entry list: node 0 is the head sentinel, then one node per call and per return.
struct EntryList {
    next: Vec<usize>,
    prev: Vec<usize>,
    /// The operation of each node.
    op: Vec<usize>,
    /// For a call node, its return node; `NIL` for return nodes (and the head).
    ret: Vec<usize>,
}

impl EntryList {
    fn new<I, O>(ops: &[Operation<I, O>]) -> EntryList {
        // (time, 0 call / 1 return, op): calls before returns at equal times.
        let mut events: Vec<(u64, u8, usize)> = Vec::with_capacity(ops.len() * 2);
        for (i, o) in ops.iter().enumerate() {
            events.push((o.call, 0, i));
            events.push((o.ret.map_or(u64::MAX, |r| r.max(o.call)), 1, i));
        }
        events.sort_unstable();
        let nodes = events.len() + 1;
        let mut list = EntryList {
            next: (1..=nodes)
                .map(|n| if n == nodes { NIL } else { n })
                .collect(),
            prev: (0..nodes).map(|n| n.wrapping_sub(1)).collect(),
            op: vec![NIL; nodes],
            ret: vec![NIL; nodes],
        };
        let mut call_node = vec![NIL; ops.len()];
        for (k, &(_, kind, i)) in events.iter().enumerate() {
            let node = k + 1;
            list.op[node] = i;
            if kind == 0 {
                call_node[i] = node;
            } else if let Some(&c) = call_node.get(i)
                && c != NIL
            {
                list.ret[c] = node;
            }
        }
        list
    }

    fn is_call(&self, node: usize) -> bool {
        self.ret.get(node).is_some_and(|&r| r != NIL)
    }

    /// Takes a call and its return out of the list.
    fn lift(&mut self, call: usize) {
        let ret = self.ret[call];
        let (p, n) = (self.prev[call], self.next[call]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
        let (p, n) = (self.prev[ret], self.next[ret]);
        self.next[p] = n;
        if n != NIL {
            self.prev[n] = p;
        }
    }

    /// Puts back a call and its return lifted last.
    fn unlift(&mut self, call: usize) {
        let ret = self.ret[call];
        let (p, n) = (self.prev[ret], self.next[ret]);
        self.next[p] = ret;
        if n != NIL {
            self.prev[n] = ret;
        }
        let (p, n) = (self.prev[call], self.next[call]);
        self.next[p] = call;
        if n != NIL {
            self.prev[n] = call;
        }
    }
}

/// Checks one partition's operations against `model`.
pub fn check_partition<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    limits: &Limits,
) -> (Outcome<M::State>, Stats) {
    let mut list = EntryList::new(ops);
    let mut linearized = Bitset::new(ops.len());
    let mut cache: Cache<M::State> = Cache::new();
    let mut calls: Vec<(usize, M::State)> = Vec::new();
    let mut best: Option<DeadEnd<M::State>> = None;
    let mut state = model.init();
    let mut stats = Stats::default();
    let mut entry = list.next[HEAD];

    while list.next[HEAD] != NIL {
        stats.steps += 1;
        if stats.steps % CHECK_EVERY == 0 {
            stats.cache_entries = cache.entries;
            stats.cache_bytes = cache.bytes;
            if limits.deadline.is_some_and(|d| Instant::now() >= d) {
                return (Outcome::Undecided(Undecided::Deadline), stats);
            }
        }
        if list.is_call(entry) {
            let op = list.op[entry];
            let next_state = ops
                .get(op)
                .and_then(|o| model.step(&state, &o.input, &o.output));
            match next_state {
                Some(next_state) => {
                    linearized.set(op);
                    if cache.insert(&linearized, &next_state) {
                        if cache.bytes > limits.max_cache_bytes {
                            stats.cache_entries = cache.entries;
                            stats.cache_bytes = cache.bytes;
                            let full = Undecided::CacheFull {
                                entries: cache.entries,
                                bytes: cache.bytes,
                            };
                            return (Outcome::Undecided(full), stats);
                        }
                        calls.push((entry, std::mem::replace(&mut state, next_state)));
                        list.lift(entry);
                        entry = list.next[HEAD];
                    } else {
                        linearized.clear(op);
                        entry = list.next[entry];
                    }
                }
                None => entry = list.next[entry],
            }
        } else {
            // A return (or, defensively, the list's end): its operation cannot be placed.
            if best
                .as_ref()
                .is_none_or(|b| b.worse_than(entry, calls.len()))
            {
                best = Some(DeadEnd {
                    at: entry,
                    prefix: calls.iter().map(|&(node, _)| list.op[node]).collect(),
                    state: state.clone(),
                });
            }
            let Some((call, previous)) = calls.pop() else {
                stats.cache_entries = cache.entries;
                stats.cache_bytes = cache.bytes;
                let dead_end = best.unwrap_or(DeadEnd {
                    at: entry,
                    prefix: Vec::new(),
                    state,
                });
                return (
                    Outcome::Violation(witness(model, ops, &list, dead_end)),
                    stats,
                );
            };
            state = previous;
            linearized.clear(list.op[call]);
            list.unlift(call);
            entry = list.next[call];
        }
    }
    stats.cache_entries = cache.entries;
    stats.cache_bytes = cache.bytes;
    let order = calls.iter().map(|&(node, _)| list.op[node]).collect();
    (Outcome::Linearizable { order }, stats)
}

/// The dead end a witness is made of: the return reached (its node), the prefix on the undo
/// stack then, and the state after it.
struct DeadEnd<S> {
    at: usize,
    prefix: Vec<usize>,
    state: S,
}

impl<S> DeadEnd<S> {
    /// Whether a dead end at return node `at` with a prefix of `len` operations is a better
    /// witness: a later return (every operation returned before it is in the prefix, so more
    /// of the history is explained), then a shorter prefix (fewer optional operations).
    fn worse_than(&self, at: usize, len: usize) -> bool {
        at > self.at || (at == self.at && len < self.prefix.len())
    }
}

/// The witness of a dead end: its candidates are the operations called before its return
/// (nodes are numbered in time order) and not in its prefix.
fn witness<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    list: &EntryList,
    dead_end: DeadEnd<M::State>,
) -> Witness<M::State> {
    let mut in_prefix = Bitset::new(ops.len());
    for &op in &dead_end.prefix {
        in_prefix.set(op);
    }
    let candidates = (1..dead_end.at.min(list.op.len()))
        .filter(|&node| list.is_call(node))
        .map(|node| list.op[node])
        .filter(|&op| !in_prefix.contains(op))
        .map(|op| Candidate {
            op,
            allowed: ops
                .get(op)
                .is_some_and(|o| model.step(&dead_end.state, &o.input, &o.output).is_some()),
        })
        .collect();
    Witness {
        prefix: dead_end.prefix,
        state: dead_end.state,
        blocking: list.op.get(dead_end.at).copied().unwrap_or(NIL),
        candidates,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A register of integers (0 at first): `Some(v)` writes, `None` reads.
    struct Reg;
    impl Model for Reg {
        type State = i64;
        type Input = Option<i64>;
        type Output = i64;
        fn init(&self) -> i64 {
            0
        }
        fn step(&self, s: &i64, input: &Option<i64>, out: &i64) -> Option<i64> {
            match input {
                Some(v) => Some(*v),
                None => (out == s).then_some(*s),
            }
        }
        fn describe_operation(&self, i: &Option<i64>, o: &i64) -> String {
            match i {
                Some(v) => format!("write({v})"),
                None => format!("read() -> {o}"),
            }
        }
        fn describe_state(&self, s: &i64) -> String {
            s.to_string()
        }
    }

    fn op(
        call: u64,
        ret: Option<u64>,
        input: Option<i64>,
        output: i64,
    ) -> Operation<Option<i64>, i64> {
        Operation {
            id: call,
            client: 0,
            call,
            ret,
            input,
            output,
        }
    }

    #[test]
    fn concurrent_writes_may_be_read_in_either_order() {
        let ops = [
            op(0, Some(10), Some(1), 0),
            op(1, Some(11), Some(2), 0),
            op(12, Some(13), None, 1),
            op(14, Some(15), None, 1),
        ];
        let (out, _) = check_partition(&Reg, &ops, &Limits::default());
        assert_eq!(
            out,
            Outcome::Linearizable {
                order: vec![1, 0, 2, 3]
            }
        );
    }

    #[test]
    fn a_stale_read_is_a_violation_with_a_witness() {
        let ops = [
            op(0, Some(1), Some(1), 0),
            op(2, Some(3), Some(2), 0),
            op(4, Some(5), None, 1),
        ];
        let (out, _) = check_partition(&Reg, &ops, &Limits::default());
        let Outcome::Violation(w) = out else {
            panic!("expected a violation, got {out:?}")
        };
        assert_eq!(w.prefix, vec![0, 1]);
        assert_eq!(w.state, 2);
        assert_eq!(w.blocking, 2);
        assert_eq!(
            w.candidates,
            vec![Candidate {
                op: 2,
                allowed: false
            }]
        );
    }

    #[test]
    fn an_unknown_write_may_take_effect_late_or_never() {
        // Unknown write of 1, then reads 0 and 1 later: it took effect between them.
        let ops = [
            op(0, None, Some(1), 0),
            op(2, Some(3), None, 0),
            op(4, Some(5), None, 1),
        ];
        let (out, _) = check_partition(&Reg, &ops, &Limits::default());
        assert!(matches!(out, Outcome::Linearizable { .. }), "{out:?}");
        // Never seen: it may never have happened.
        let ops = [op(0, None, Some(1), 0), op(2, Some(3), None, 0)];
        let (out, _) = check_partition(&Reg, &ops, &Limits::default());
        assert!(matches!(out, Outcome::Linearizable { .. }), "{out:?}");
        // But not before its call.
        let ops = [op(2, Some(3), None, 1), op(4, None, Some(1), 0)];
        let (out, _) = check_partition(&Reg, &ops, &Limits::default());
        assert!(matches!(out, Outcome::Violation(_)), "{out:?}");
    }

    #[test]
    fn empty_history_is_linearizable() {
        let (out, _) = check_partition(&Reg, &[], &Limits::default());
        assert_eq!(out, Outcome::Linearizable { order: vec![] });
    }

    #[test]
    fn limits_give_up() {
        // Many concurrent writes and one impossible read: the search must explore every subset.
        let mut ops: Vec<_> = (0..40).map(|i| op(0, Some(100), Some(i + 1), 0)).collect();
        ops.push(op(0, Some(100), None, -1));
        let past = Limits {
            deadline: Some(Instant::now()),
            ..Limits::default()
        };
        let (out, _) = check_partition(&Reg, &ops, &past);
        assert_eq!(out, Outcome::Undecided(Undecided::Deadline));
        let tiny = Limits {
            max_cache_bytes: 10_000,
            ..Limits::default()
        };
        let (out, stats) = check_partition(&Reg, &ops, &tiny);
        assert!(
            matches!(out, Outcome::Undecided(Undecided::CacheFull { .. })),
            "{out:?}"
        );
        assert!(stats.cache_bytes > 10_000);
    }
}
