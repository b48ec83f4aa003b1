//! Checks recorded etcd client histories.
//!
//! - [`search`]: Porcupine's linearizability checker (Wing & Gong's search with Lowe's
//!   memoisation, P-compositionality), generic over a [`search::Model`], with a deadline and
//!   a bound on its cache, and a witness (the longest linearizable prefix and the operations
//!   that cannot follow it) when a history is not linearizable.
//! - [`model`]: the models: Jepsen's etcd register ([`model::register`]) and etcd's key-value
//!   store per key ([`model::kv`]).
//! - [`jepsen`] and [`history`]: the two input formats (Jepsen's etcd register log, and our
//!   recorder's JSON Lines history).
//! - [`checks`]: the checks of a recorded history (linearizability per epoch and key,
//!   revisions, serializable reads, watches, availability), pure functions.
//! - [`report`]: the text report of those checks.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bitset;
pub mod checks;
pub mod duration;
pub mod error;
pub mod history;
pub mod jepsen;
pub mod model;
pub mod report;
pub mod search;

pub use error::InputError;
pub use search::{Limits, Model, Operation, Outcome};
