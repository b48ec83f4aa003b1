//! Lenient readers of status fields: a value of an unexpected shape reads as absent instead of
//! failing the whole object, so a status written by CoreOS' operator (or by hand) never stops
//! the controller from reading its clusters. Each reads the field as JSON first, so they work
//! with any serde format (JSON from the API server, YAML in tests).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::phase::ClusterPhase;

/// A phase: `""`, `null`, unknown names and non-strings read as none.
pub(super) fn phase<'de, D: Deserializer<'de>>(d: D) -> Result<Option<ClusterPhase>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(value.as_str().and_then(ClusterPhase::from_name))
}

/// A string that is absent when empty (CoreOS' Go structs write `""` for unset strings), null or
/// not a string.
pub(super) fn non_empty<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(value.as_str().filter(|s| !s.is_empty()).map(str::to_string))
}

/// A boolean; anything but `true` reads as false.
pub(super) fn flag<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Value::deserialize(d)? == Value::Bool(true))
}

/// A list of member names; `null` reads as empty and entries that are not strings are dropped.
pub(super) fn names<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// Conditions: each entry in this operator's shape (a Kubernetes [`Condition`]) or in CoreOS'
/// shape; `null` reads as none, and an entry without a `type` and a `status` is dropped.
pub(super) fn conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    let value = Value::deserialize(d)?;
    Ok(value
        .as_array()
        .map(|items| items.iter().filter_map(condition).collect())
        .unwrap_or_default())
}

/// A condition in either shape: `type` and `status`, then everything else optional and of any
/// type (CoreOS wrote `lastUpdateTime`, `lastTransitionTime`, `reason` and `message`, the last
/// three with `omitempty`; this operator writes `observedGeneration` too).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LooseCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    #[serde(default)]
    last_update_time: Option<Value>,
    #[serde(default)]
    last_transition_time: Option<Value>,
    #[serde(default)]
    reason: Option<Value>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    observed_generation: Option<Value>,
}

fn condition(item: &Value) -> Option<Condition> {
    let c = LooseCondition::deserialize(item).ok()?;
    if let Ok(exact) = Condition::deserialize(item) {
        return Some(exact);
    }
    let time = |v: &Option<Value>| {
        v.as_ref()
            .and_then(Value::as_str)
            .and_then(|s| s.parse::<Timestamp>().ok())
            .map(Time)
    };
    let text = |v: &Option<Value>| {
        v.as_ref()
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_default()
    };
    Some(Condition {
        type_: c.type_,
        status: c.status,
        last_transition_time: time(&c.last_transition_time)
            .or_else(|| time(&c.last_update_time))
            .unwrap_or_else(unknown_time),
        reason: text(&c.reason),
        message: text(&c.message),
        observed_generation: c.observed_generation.as_ref().and_then(Value::as_i64),
    })
}

/// The `lastTransitionTime` given to a condition read without one (CoreOS' conditions carry
/// it only optionally): the Unix epoch, which [`is_unknown_time`] recognizes.
pub fn unknown_time() -> Time {
    Time(Timestamp::UNIX_EPOCH)
}

/// Whether a condition's `lastTransitionTime` is [`unknown_time`]: it was read from a
/// condition without one, and says nothing about when the condition changed.
pub fn is_unknown_time(time: &Time) -> bool {
    time.0 == Timestamp::UNIX_EPOCH
}
