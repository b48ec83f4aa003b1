//! Database maintenance, decided from what the members report (pure functions):
//! - **healing NOSPACE**: etcd refuses every write once a member's backend reaches
//!   `--quota-backend-bytes`. The operator compacts the history to the current revision
//!   (less what `ETCD_AUTO_COMPACTION_RETENTION` keeps in revision mode) **once per alarm
//!   episode** (deletes and lease expiries go on under NOSPACE, so the revision keeps moving:
//!   compacting again whenever it moved would never get past the compaction, and each one
//!   cancels the watchers behind it), defragments the members one at a time (followers first,
//!   the leader last, each healthy again before the next) and disarms the alarm. When,
//!   compacted, the data in use on the fullest member defragmented since (the figures before
//!   are not exact) still fills [`NO_SPACE_FILL`] of the quota, defragmenting the others cannot
//!   make room: it stops and says so, and compacts again (at most
//!   every [`RECOMPACT_EXHAUSTED_AFTER`]) only once the revision moved, so data a human deletes
//!   is freed;
//! - **defragmenting before it hurts**: a member whose file is [`DefragmentationPolicy::ratio`]
//!   times the data it holds and wastes at least [`DefragmentationPolicy::min_reclaim_bytes`]
//!   is defragmented, one member at a time, each member at most once per
//!   [`DefragmentationPolicy::interval`], only while the cluster has nothing else to do.
//!
//! What the operator did is kept in the status ([`record_after`]), so an interrupted heal goes
//! on where it stopped and defragmentations stay spaced across controller restarts.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use etcd_shared::types::{CompactionRecord, DefragmentationRecord, MaintenanceStatus};

use super::model::{AlarmKind, Health, MemberState, Observed};
use super::{Blocked, Step};
use crate::view::ClusterView;

/// Healing NOSPACE stops when the compacted data fills this share of the quota: a member
/// defragmented to that size would raise the alarm again after a few writes.
pub const NO_SPACE_FILL: f64 = 0.8;

/// While the compacted data still fills the quota ([`Blocked::SpaceExhausted`]), the history is
/// compacted again at most this often, and only when the revision moved (someone deleted keys
/// to make room).
pub const RECOMPACT_EXHAUSTED_AFTER: Duration = Duration::from_secs(30);

/// Why a member is defragmented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefragReason {
    /// Part of healing the NOSPACE alarm.
    NoSpace,
    /// Its file holds much more than its data (the periodic policy).
    Fragmented,
}

impl DefragReason {
    /// The `reason` label of the defragmentation metric.
    pub fn label(self) -> &'static str {
        match self {
            DefragReason::NoSpace => "nospace",
            DefragReason::Fragmented => "fragmented",
        }
    }
}

/// When a member is defragmented without an alarm.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DefragmentationPolicy {
    /// Defragment when the file is at least this many times the data in use.
    pub ratio: f64,
    /// ... and the file exceeds the data in use by at least this many bytes.
    pub min_reclaim_bytes: u64,
    /// Each member at most once per this long; `None` turns the policy off (NOSPACE is still
    /// healed).
    pub interval: Option<Duration>,
}

impl Default for DefragmentationPolicy {
    fn default() -> Self {
        DefragmentationPolicy {
            ratio: 2.0,
            min_reclaim_bytes: 64 * 1024 * 1024,
            interval: Some(Duration::from_secs(24 * 3600)),
        }
    }
}

/// The revision a NOSPACE heal compacts to: the current one, less the revisions
/// `ETCD_AUTO_COMPACTION_RETENTION` keeps when `ETCD_AUTO_COMPACTION_MODE=revision` is set in
/// `etcdEnv` (the members' own compaction settings are never changed).
pub fn compaction_target(view: &ClusterView, current: i64) -> i64 {
    let env = |name: &str| {
        view.pod
            .etcd_env
            .iter()
            .find(|e| e.name == name)
            .and_then(|e| e.value.as_deref())
            .map(str::trim)
    };
    let keep = match env("ETCD_AUTO_COMPACTION_MODE") {
        Some("revision") => env("ETCD_AUTO_COMPACTION_RETENTION")
            .and_then(|r| r.parse::<i64>().ok())
            .unwrap_or(0),
        _ => 0,
    };
    current.saturating_sub(keep.max(0))
}

/// Members in the order they are defragmented: followers by name, the leader last.
fn in_defrag_order(members: &[MemberState]) -> Vec<&MemberState> {
    let mut ordered: Vec<&MemberState> = members.iter().collect();
    ordered.sort_by_key(|m| {
        (
            matches!(m.health, Health::Healthy { leader: true, .. }),
            m.name.clone(),
        )
    });
    ordered
}

/// The next step of healing NOSPACE on a cluster whose members are all healthy.
pub fn heal_no_space(view: &ClusterView, obs: &Observed, members: &[MemberState]) -> Step {
    let current = members.iter().map(|m| m.revision).max().unwrap_or(0);
    let target = compaction_target(view, current);
    // The record holds this episode's compaction only (dropped once the alarm is gone).
    let compacted = obs.maintenance.compacted;
    if target > 0 && compacted.is_none() {
        return Step::Compact { revision: target };
    }
    let since_compaction = compacted.map(|(_, ago)| ago);
    let done = |m: &MemberState| {
        obs.maintenance
            .defragmented_ago(&m.name)
            .zip(since_compaction)
            .is_some_and(|(defragmented, compacted)| defragmented <= compacted)
    };
    // The fullest member decides (it raises the alarm again first), judged only on figures that
    // are exact: those of members defragmented since the compaction. Before, a member's size
    // in use can still count the pages the compaction freed: etcd computes it when its next
    // write transaction begins, bbolt releases freed pages only once no older read transaction
    // is open (under client reads, the one begun before the compaction's last commit often
    // still is), and under NOSPACE nothing else commits. So the first member (a follower) is
    // defragmented whatever its figure says, and its exact figure says whether defragmenting
    // the others can help. Lines that do not report the part in use (3.2, 3.3) are judged by
    // the file size once defragmented.
    let in_use = members
        .iter()
        .filter(|m| done(m))
        .map(|m| {
            if m.db.in_use > 0 {
                m.db.in_use
            } else {
                m.db.total
            }
        })
        .max();
    if let Some(in_use) = in_use
        && obs.quota_bytes > 0
        && in_use as f64 >= obs.quota_bytes as f64 * NO_SPACE_FILL
    {
        // Someone deleted keys to make room: their space is freed only by a compaction.
        if let Some((revision, ago)) = compacted
            && revision < target
            && ago >= RECOMPACT_EXHAUSTED_AFTER
        {
            return Step::Compact { revision: target };
        }
        return Step::Blocked(Blocked::SpaceExhausted {
            in_use,
            quota: obs.quota_bytes,
        });
    }
    if let Some(m) = in_defrag_order(members).into_iter().find(|m| !done(m)) {
        return Step::Defragment {
            name: m.name.clone(),
            reason: DefragReason::NoSpace,
        };
    }
    Step::DisarmAlarm(
        obs.alarms
            .iter()
            .filter(|a| a.kind == AlarmKind::NoSpace)
            .cloned()
            .collect(),
    )
}

/// Whether a member's file holds enough more than its data to be defragmented.
fn fragmented(m: &MemberState, policy: &DefragmentationPolicy) -> bool {
    let (total, in_use) = (m.db.total, m.db.in_use);
    in_use > 0
        && total as f64 >= in_use as f64 * policy.ratio
        && total.saturating_sub(in_use) >= policy.min_reclaim_bytes
}

/// The next member to defragment under `policy` on a cluster with nothing else to do (every
/// member healthy and its pod Ready), if any. Never the only member of a one-member cluster:
/// while it defragments, nothing answers (a full outage, taken only to heal NOSPACE).
pub fn defragment_fragmented(
    obs: &Observed,
    members: &[MemberState],
    policy: &DefragmentationPolicy,
) -> Option<Step> {
    let interval = policy.interval?;
    if members.len() < 2 {
        return None;
    }
    let all_ready = members
        .iter()
        .all(|m| m.health.is_healthy() && obs.pod(&m.name).is_some_and(|p| p.ready));
    if !all_ready {
        return None;
    }
    in_defrag_order(members)
        .into_iter()
        .find(|m| {
            fragmented(m, policy)
                && obs
                    .maintenance
                    .defragmented_ago(&m.name)
                    .is_none_or(|ago| ago >= interval)
        })
        .map(|m| Step::Defragment {
            name: m.name.clone(),
            reason: DefragReason::Fragmented,
        })
}

/// The maintenance record after `step` was carried out at `now`: the compaction or the
/// member's defragmentation added, and the records of members no longer in `members` dropped
/// (the record never outgrows the cluster). The compaction belongs to one NOSPACE episode: it
/// is dropped once no alarm is raised (`no_space` false), so the next episode compacts anew.
/// `None` when there is nothing to keep.
pub fn record_after(
    previous: Option<&MaintenanceStatus>,
    step: &Step,
    members: Option<&[String]>,
    no_space: bool,
    now: &Time,
) -> Option<MaintenanceStatus> {
    let mut record = previous.cloned().unwrap_or_default();
    if !no_space {
        record.compaction = None;
    }
    match step {
        Step::Compact { revision } => {
            record.compaction = Some(CompactionRecord {
                revision: *revision,
                time: now.clone(),
            });
        }
        Step::Defragment { name, .. } => {
            record.defragmentations.retain(|d| &d.member != name);
            record.defragmentations.push(DefragmentationRecord {
                member: name.clone(),
                time: now.clone(),
            });
        }
        _ => {}
    }
    if let Some(members) = members {
        record
            .defragmentations
            .retain(|d| members.contains(&d.member));
    }
    record
        .defragmentations
        .sort_by(|a, b| a.member.cmp(&b.member));
    (record != MaintenanceStatus::default()).then_some(record)
}

/// What the planner reads of a maintenance record: times as how long ago, at `now`.
pub fn observed(record: Option<&MaintenanceStatus>, now: &Time) -> super::Maintenance {
    let ago = |t: &Time| {
        let seconds = now.0.as_second().saturating_sub(t.0.as_second()).max(0);
        Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
    };
    let Some(record) = record else {
        return super::Maintenance::default();
    };
    super::Maintenance {
        compacted: record
            .compaction
            .as_ref()
            .map(|c| (c.revision, ago(&c.time))),
        defragmented: record
            .defragmentations
            .iter()
            .map(|d| (d.member.clone(), ago(&d.time)))
            .collect(),
    }
}
