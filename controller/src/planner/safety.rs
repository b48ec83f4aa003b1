//! Safety backups (an operator extension, `spec.safetyBackup`) in the plan: before a minor
//! upgrade or a scale-down of a cluster that asks for them, the planner emits
//! [`Step::TakeSafetyBackup`] for the change its next step starts, unless the stored record
//! already holds a fresh snapshot for that change; while a failed snapshot's next attempt is not
//! due, the change is [`Blocked::SafetyBackupFailed`]. The snapshot itself is
//! [`crate::reconcile::safety::take`]'s; once it is recorded, the change is planned again on a
//! fresh observation.

use super::{Blocked, Observed, RemovalReason, Step};
use crate::view::ClusterView;

/// A change `spec.safetyBackup` takes a snapshot before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RiskyChange {
    /// A member moves to another minor line (once per line).
    Upgrade {
        /// The line's major version.
        major: u64,
        /// The line's minor version.
        minor: u64,
    },
    /// A member is removed because the spec asks for fewer.
    ScaleDown {
        /// The size the spec asks for.
        size: usize,
        /// The spec's generation that asks for it.
        generation: i64,
    },
}

impl std::fmt::Display for RiskyChange {
    /// The change in words, as the status records it: `upgrade to 3.7`,
    /// `scale down to 3 (generation 4)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RiskyChange::Upgrade { major, minor } => write!(f, "upgrade to {major}.{minor}"),
            RiskyChange::ScaleDown { size, generation } => {
                write!(f, "scale down to {size} (generation {generation})")
            }
        }
    }
}

impl RiskyChange {
    /// The part of a snapshot's object key that names the change: `upgrade-3.7`,
    /// `scale-down-3`.
    pub fn slug(&self) -> String {
        match self {
            RiskyChange::Upgrade { major, minor } => format!("upgrade-{major}.{minor}"),
            RiskyChange::ScaleDown { size, .. } => format!("scale-down-{size}"),
        }
    }
}

/// The risky change `step` starts, when the cluster asks for safety backups: a member moving
/// to another minor line, or a member removed because the spec asks for fewer. `None` for
/// every other step.
pub fn before(view: &ClusterView, model: &Observed, step: &Step) -> Option<RiskyChange> {
    view.safety_backup.as_ref()?;
    match step {
        Step::UpgradeMember { name, version, .. } => {
            let current = model.pod(name)?.version?;
            ((current.major, current.minor) != (version.major, version.minor)).then_some(
                RiskyChange::Upgrade {
                    major: version.major,
                    minor: version.minor,
                },
            )
        }
        Step::RemoveMember {
            reason: RemovalReason::ScaleDown,
            ..
        } => Some(RiskyChange::ScaleDown {
            size: view.size,
            generation: view.generation.unwrap_or(0),
        }),
        _ => None,
    }
}

/// `step`, or what must come before it: the safety backup of the change it starts, or the
/// refusal to start it while that backup keeps failing.
pub fn guard(view: &ClusterView, obs: &Observed, step: Step) -> Step {
    let Some(change) = before(view, obs, &step) else {
        return step;
    };
    if obs.safety.covered.as_deref() == Some(change.to_string().as_str()) {
        return step;
    }
    match &obs.safety.retry_wait {
        Some(reason) => Step::Blocked(Blocked::SafetyBackupFailed {
            change,
            reason: reason.clone(),
        }),
        None => Step::TakeSafetyBackup {
            change,
            guarded: Box::new(step),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planner::fixtures::{ready_pod, remove_member, upgrade_member};
    use crate::planner::{MemberPlan, PodState, SafetyBackups};
    use crate::view::fixtures::view_of;

    const SAFETY: &str =
        "safetyBackup:\n  storageType: S3\n  s3:\n    path: bkt/demo.db\n    awsSecret: aws\n";

    fn model(versions: &[&str]) -> Observed {
        Observed {
            pods: versions
                .iter()
                .enumerate()
                .map(|(i, v)| ready_pod(u32::try_from(i).unwrap_or(0), v))
                .collect::<Vec<PodState>>(),
            ..Observed::default()
        }
    }

    #[test]
    fn minor_upgrades_and_scale_downs_are_the_risky_changes() {
        let view = view_of(&format!("size: 3\nversion: 3.7.3\n{SAFETY}"));
        let m = model(&["3.6.16", "3.6.16", "3.7.3"]);
        let remove = |reason| remove_member(3, reason);
        let cases: Vec<(&str, Step, Option<&str>)> = vec![
            (
                "a member moves to 3.7",
                upgrade_member(0, "3.7.3"),
                Some("upgrade to 3.7"),
            ),
            (
                "a member already on 3.7 (patch)",
                upgrade_member(2, "3.7.3"),
                None,
            ),
            (
                "scale down",
                remove(RemovalReason::ScaleDown),
                Some("scale down to 3 (generation 1)"),
            ),
            (
                "a replacement is not a scale-down",
                remove(RemovalReason::Replace),
                None,
            ),
            ("nothing risky", Step::Done, None),
            (
                "a new member",
                Step::CreatePod(MemberPlan {
                    name: "demo-3".into(),
                    initial_cluster: vec![],
                    state: crate::planner::InitialState::Existing,
                    version: "3.7.3".parse().expect("v"),
                    token: "demo-uid-1".into(),
                    seed: None,
                }),
                None,
            ),
        ];
        for (name, step, want) in cases {
            let words = before(&view, &m, &step).map(|c| c.to_string());
            assert_eq!(words.as_deref(), want, "{name}");
        }
        let without = view_of("size: 3\nversion: 3.7.3");
        assert_eq!(
            before(&without, &m, &upgrade_member(0, "3.7.3")),
            None,
            "not asked for"
        );
    }

    #[test]
    fn a_risky_change_waits_for_its_snapshot_once_and_a_failing_one_blocks_it() {
        let view = view_of(&format!("size: 3\nversion: 3.7.3\n{SAFETY}"));
        let mut m = model(&["3.6.16", "3.6.16", "3.6.16"]);
        let step = upgrade_member(0, "3.7.3");
        assert_eq!(
            guard(&view, &m, step.clone()),
            Step::TakeSafetyBackup {
                change: RiskyChange::Upgrade { major: 3, minor: 7 },
                guarded: Box::new(step.clone())
            }
        );
        m.safety = SafetyBackups {
            covered: Some("upgrade to 3.7".into()),
            retry_wait: None,
        };
        assert_eq!(
            guard(&view, &m, step.clone()),
            step,
            "covered: the change goes on"
        );
        m.safety = SafetyBackups {
            covered: Some("scale down to 1 (generation 3)".into()),
            retry_wait: Some("store unreachable; next attempt in 20 s".into()),
        };
        assert_eq!(
            guard(&view, &m, step.clone()),
            Step::Blocked(Blocked::SafetyBackupFailed {
                change: RiskyChange::Upgrade { major: 3, minor: 7 },
                reason: "store unreachable; next attempt in 20 s".into()
            })
        );
        assert_eq!(guard(&view, &m, Step::Done), Step::Done, "nothing risky");
        let without = view_of("size: 3\nversion: 3.7.3");
        assert_eq!(guard(&without, &m, step.clone()), step, "not asked for");
    }
}
