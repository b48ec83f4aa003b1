//! Kubernetes status conditions, one way for every kind the controller writes (EtcdCluster,
//! EtcdBackup, EtcdRestore): type, status, reason, message, observedGeneration and a
//! lastTransitionTime that moves only when the status does.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use etcd_shared::types::status::is_unknown_time;

/// A condition with status `True` when `ok`, else `False`, stamped `now`.
pub fn new(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
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
