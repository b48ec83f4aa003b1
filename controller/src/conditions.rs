//! Kubernetes status conditions, one way for every kind the controller writes (EtcdCluster,
//! EtcdBackup, EtcdRestore): type, status, reason, message, observedGeneration and a
//! lastTransitionTime that moves only when the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use etcd_shared::types::status::is_unknown_time;

/// What the conditions written at once share: the generation they observed and the time.
#[derive(Debug, Clone)]
pub struct Stamp {
    /// The `metadata.generation` observed.
    pub generation: Option<i64>,
    /// The time of a transition.
    pub now: Time,
}

impl Stamp {
    /// Conditions of `generation` at `now`.
    pub fn new(generation: Option<i64>, now: Timestamp) -> Self {
        Stamp {
            generation,
            now: Time(now),
        }
    }

    /// A condition with status `True` when `ok`, else `False`, stamped.
    pub fn condition(&self, type_: &str, ok: bool, reason: &str, message: String) -> Condition {
        Condition {
            type_: type_.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message,
            observed_generation: self.generation,
            last_transition_time: self.now.clone(),
        }
    }
}

/// Puts `new` in `list` in place of the conditions of the same types (appended, in order),
/// each keeping its old lastTransitionTime as [`carry_transition_times`] says.
pub fn replace(list: &mut Vec<Condition>, mut new: Vec<Condition>) {
    carry_transition_times(&mut new, list);
    list.retain(|c| new.iter().all(|n| n.type_ != c.type_));
    list.extend(new);
}

/// Keeps each condition's lastTransitionTime when its status did not change and the old time
/// is known (a condition CoreOS' operator wrote may have none).
pub fn carry_transition_times(new: &mut [Condition], old: &[Condition]) {
    for c in new {
        if let Some(o) = old.iter().find(|o| o.type_ == c.type_)
            && o.status == c.status
            && !is_unknown_time(&o.last_transition_time)
        {
            c.last_transition_time = o.last_transition_time.clone();
        }
    }
}
