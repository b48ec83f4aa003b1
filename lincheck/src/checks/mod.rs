//! The checks of a recorded [`History`], each a pure function of it:
//!
//! - [`watches`]: each watch's events are ordered, unique, complete (no gap) and agree with
//!   the writes; a `compacted` end is justified; and which unknown-outcome writes a watch saw
//!   (so they are known applied).
//! - [`linearizability`]: per epoch and key, against the key-value model (Porcupine's search).
//! - [`revisions`]: revisions never go back in real time; writes take distinct revisions.
//! - [`serializable`]: serializable reads never go back per endpoint.
//! - [`availability`]: counts, and the longest time without a successful write.

pub mod availability;
pub mod linearizability;
pub mod revisions;
pub mod serializable;
pub mod watches;

use crate::history::History;
use crate::search::Limits;

/// Every check's result on one history.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryReport {
    /// Linearizability per epoch and key.
    pub linearizability: linearizability::LinReport,
    /// Serializable reads per endpoint.
    pub serializable: serializable::SerializableReport,
    /// Revisions in real time.
    pub revisions: revisions::RevisionReport,
    /// Watches.
    pub watches: watches::WatchReport,
    /// Availability figures.
    pub availability: availability::Availability,
}

impl HistoryReport {
    /// The number of violations found by every check.
    pub fn violations(&self) -> usize {
        self.linearizability.violations.len()
            + self.serializable.violations.len()
            + self.revisions.violations.len()
            + self.watches.violations.len()
    }

    /// Whether the linearizability check left a partition undecided.
    pub fn undecided(&self) -> bool {
        !self.linearizability.undecided.is_empty()
    }
}

/// Runs every check on `history`; `limits` bound the linearizability search.
pub fn check_history(history: &History, limits: &Limits) -> HistoryReport {
    let watches = watches::check_watches(history);
    let linearizability =
        linearizability::check_linearizability(history, &watches.resolved, limits);
    HistoryReport {
        linearizability,
        serializable: serializable::check_serializable(history),
        revisions: revisions::check_revisions(history),
        watches,
        availability: availability::measure(history),
    }
}
