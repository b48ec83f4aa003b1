//! Failpoints: the places between two calls of one step where the proof suite kills the
//! controller (issue 33), so that a restart goes on from whatever state the cluster was left
//! in: right after a MemberAdd (before the new member's pod exists and before the status says
//! anything), right after a MemberRemove (before the removed member's pod is deleted), right
//! after the first member's image was patched in an upgrade, and right after a recovery's new
//! first member was created (before the status records it).
//!
//! Off unless the environment variable [`FAILPOINTS_ENV`] names them (tests set it); each fires
//! once per process. What "killed" means is the caller's: the controller binary exits at once
//! (as a crash or an OOM kill would), an in-process test controller stops its own loop. A hit
//! also fails the reconcile with [`FailpointHit`], so nothing after the failpoint runs.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

/// The environment variable that enables failpoints: a comma-separated list of their names.
pub const FAILPOINTS_ENV: &str = "ETCD_OPERATOR_FAILPOINTS";

/// A place where the controller can be killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Failpoint {
    /// A member was added through etcd's API; its pod does not exist yet.
    AfterMemberAdd,
    /// A member was removed through etcd's API; its pod still runs.
    AfterMemberRemove,
    /// A member's pod was moved to the new image; the status does not say so yet.
    MidUpgrade,
    /// A recovery's new first member was created; the status does not record it yet.
    MidRecovery,
}

impl Failpoint {
    /// Every failpoint.
    pub const ALL: [Failpoint; 4] = [
        Failpoint::AfterMemberAdd,
        Failpoint::AfterMemberRemove,
        Failpoint::MidUpgrade,
        Failpoint::MidRecovery,
    ];

    /// Its name in [`FAILPOINTS_ENV`].
    pub fn name(self) -> &'static str {
        match self {
            Failpoint::AfterMemberAdd => "after-member-add",
            Failpoint::AfterMemberRemove => "after-member-remove",
            Failpoint::MidUpgrade => "mid-upgrade",
            Failpoint::MidRecovery => "mid-recovery",
        }
    }
}

impl fmt::Display for Failpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failpoint name that is none.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown failpoint {0:?}; known: after-member-add, after-member-remove, mid-upgrade, mid-recovery"
)]
pub struct UnknownFailpoint(pub String);

impl FromStr for Failpoint {
    type Err = UnknownFailpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Failpoint::ALL
            .into_iter()
            .find(|f| f.name() == s.trim())
            .ok_or_else(|| UnknownFailpoint(s.to_string()))
    }
}

/// The environment variable that breaks the operator on purpose (the proof suite's control
/// experiment): the name of one [`Broken`] rule.
pub const BROKEN_ENV: &str = "ETCD_OPERATOR_TEST_BROKEN";

/// A safety rule the operator breaks on purpose, so the proof suite can show that its checks
/// catch an operator that does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// `stuck-is-lost`: the operator before issue 32. It does not ask the members of pods that
    /// are being deleted, counts a member whose pod is stuck terminating past
    /// `--stuck-pod-timeout` as one whose data is gone, whatever its node says, and starts a
    /// recovery even while a member answers with a leader.
    StuckIsLost,
}

impl FromStr for Broken {
    type Err = UnknownFailpoint;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "stuck-is-lost" => Ok(Broken::StuckIsLost),
            other => Err(UnknownFailpoint(other.to_string())),
        }
    }
}

/// The controller was killed at a failpoint (the reconcile stops there).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("killed at failpoint {0}")]
pub struct FailpointHit(pub Failpoint);

/// What a hit does besides failing the reconcile.
pub type OnHit = Arc<dyn Fn(Failpoint) + Send + Sync>;

/// The failpoints enabled, each firing once.
#[derive(Clone, Default)]
pub struct Failpoints {
    armed: Arc<Mutex<BTreeSet<Failpoint>>>,
    on_hit: Option<OnHit>,
}

impl fmt::Debug for Failpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Failpoints")
            .field("armed", &*lock(&self.armed))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Failpoints {
    /// The failpoints `list` names (comma-separated), doing `on_hit` when one fires.
    pub fn parse(list: &str, on_hit: OnHit) -> Result<Self, UnknownFailpoint> {
        let armed = list
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(str::parse)
            .collect::<Result<BTreeSet<Failpoint>, _>>()?;
        Ok(Failpoints {
            armed: Arc::new(Mutex::new(armed)),
            on_hit: Some(on_hit),
        })
    }

    /// Whether any failpoint is still armed.
    pub fn any_armed(&self) -> bool {
        !lock(&self.armed).is_empty()
    }

    /// Passes `point`: when it is armed it fires (once): `on_hit` runs and the reconcile fails.
    pub fn pass(&self, point: Failpoint) -> Result<(), FailpointHit> {
        if !lock(&self.armed).remove(&point) {
            return Ok(());
        }
        tracing::warn!(failpoint = %point, "failpoint hit: the controller is killed here");
        if let Some(on_hit) = &self.on_hit {
            on_hit(point);
        }
        Err(FailpointHit(point))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn failpoints_fire_once_and_only_when_armed() {
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let points = Failpoints::parse(
            "after-member-add, mid-upgrade",
            Arc::new(move |_| {
                counter.fetch_add(1, Ordering::SeqCst);
            }),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(points.pass(Failpoint::AfterMemberRemove), Ok(()));
        assert_eq!(
            points.pass(Failpoint::AfterMemberAdd),
            Err(FailpointHit(Failpoint::AfterMemberAdd))
        );
        assert_eq!(points.pass(Failpoint::AfterMemberAdd), Ok(()), "once");
        assert!(points.any_armed());
        assert!(points.pass(Failpoint::MidUpgrade).is_err());
        assert!(!points.any_armed());
        assert_eq!(hits.load(Ordering::SeqCst), 2);
        assert!(Failpoints::default().pass(Failpoint::MidRecovery).is_ok());
        assert_eq!(
            Failpoints::parse("nope", Arc::new(|_| {})).map(|_| ()),
            Err(UnknownFailpoint("nope".into()))
        );
    }
}
