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

/// The most bytes of an Event's note the API server takes (events.k8s.io/v1 refuses a longer
/// one, and the Event would be lost); condition messages that carry the same text keep to it.
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `note` on one line (an error's text may hold a store's multi-line answer) and cut to fit
/// [`MAX_MESSAGE_BYTES`] with the cut said: an Event's note or a condition's message.
pub fn bounded_message(note: String) -> String {
    let note = if note.contains(['\n', '\r']) {
        note.split_whitespace().collect::<Vec<_>>().join(" ")
    } else {
        note
    };
    // Room for clipped's "... (N bytes)".
    etcd_shared::admission::clipped(note, MAX_MESSAGE_BYTES - 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_fit_the_api_servers_limit() {
        assert_eq!(
            bounded_message("snapshot written".into()),
            "snapshot written"
        );
        let store = "failed: 404 Not Found: <?xml version=\"1.0\"?>\n<Error>\r\n  <Code>NoSuchBucket</Code></Error>";
        assert_eq!(
            bounded_message(store.into()),
            "failed: 404 Not Found: <?xml version=\"1.0\"?> <Error> <Code>NoSuchBucket</Code></Error>"
        );
        let long = format!("upgrade to 3.7 waits: {}", "é".repeat(4000));
        let note = bounded_message(long);
        assert!(note.len() <= MAX_MESSAGE_BYTES, "{}", note.len());
        assert!(note.starts_with("upgrade to 3.7 waits: é"), "{note}");
        assert!(note.ends_with("(8022 bytes)"), "{note}");
    }
}
