//! What a backup or verify pod reports to the controller: one JSON object, written to the
//! container's termination message (`/dev/termination-log`, at most 4 KiB, which the kubelet
//! copies into the pod's status), read back by the controller from the pod
//! ([`PodOutcome::of`], pure).

use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

/// Longest message a report keeps, bytes: the whole JSON stays under the kubelet's 4 KiB.
const MAX_MESSAGE_BYTES: usize = 2048;

/// The failure reasons a pod may report; anything else reads as [`POD_FAILED`].
pub const KNOWN_REASONS: [&str; 7] = [
    "NotFound",
    "FileFailed",
    "SnapshotFailed",
    "IntegrityCheckFailed",
    "BadMetadata",
    "NoMemberReachable",
    "Timeout",
];

/// The reason of a pod that failed without a report of its own (killed, image missing...).
pub const POD_FAILED: &str = "PodFailed";

/// A pod's report.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// Whether the step succeeded.
    pub ok: bool,
    /// Why it failed (one of [`KNOWN_REASONS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What happened, in words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// Bytes of the snapshot file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// SHA-256 of the snapshot's database, hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// etcd revision of the snapshot, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<i64>,
    /// etcd version that took the snapshot, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_version: Option<String>,
}

impl PodReport {
    /// A failure report.
    pub fn failed(reason: &'static str, message: String) -> Self {
        PodReport {
            ok: false,
            reason: Some(reason.into()),
            message: Some(message),
            ..PodReport::default()
        }
    }

    /// The JSON written as the termination message, the message cut to fit.
    pub fn to_message(&self) -> String {
        let mut report = self.clone();
        if let Some(m) = report.message.take() {
            report.message = Some(etcd_shared::admission::clipped(m, MAX_MESSAGE_BYTES));
        }
        // Serializing strings and numbers cannot fail.
        serde_json::to_string(&report).unwrap_or_default()
    }
}

/// The static reason for a reason a pod reported.
pub fn known_reason(reported: &str) -> &'static str {
    KNOWN_REASONS
        .iter()
        .find(|r| **r == reported)
        .copied()
        .unwrap_or(POD_FAILED)
}

/// Where a pod stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodOutcome {
    /// Not finished.
    Running,
    /// Finished, with its report.
    Succeeded(PodReport),
    /// Finished without success: a static reason and a message.
    Failed(&'static str, String),
}

impl PodOutcome {
    /// The outcome of a backup or verify pod (one container, `restartPolicy: Never`).
    pub fn of(pod: &Pod) -> Self {
        let status = pod.status.as_ref();
        let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        let terminated = status
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|c| c.first())
            .and_then(|c| c.state.as_ref())
            .and_then(|s| s.terminated.as_ref());
        let report = terminated
            .and_then(|t| t.message.as_deref())
            .and_then(|m| serde_json::from_str::<PodReport>(m).ok());
        match phase {
            "Succeeded" => match report {
                Some(report) if report.ok && report.sha256.is_some() => {
                    PodOutcome::Succeeded(report)
                }
                _ => PodOutcome::Failed(
                    POD_FAILED,
                    "the pod completed without reporting a checked snapshot".into(),
                ),
            },
            "Failed" => match report {
                Some(report) if !report.ok => PodOutcome::Failed(
                    known_reason(report.reason.as_deref().unwrap_or_default()),
                    report.message.unwrap_or_default(),
                ),
                _ => {
                    let code = terminated.map_or("none".to_string(), |t| t.exit_code.to_string());
                    let why = status
                        .and_then(|s| s.message.clone().or_else(|| s.reason.clone()))
                        .unwrap_or_default();
                    PodOutcome::Failed(
                        POD_FAILED,
                        format!("the pod failed (exit code {code}) without a report {why}")
                            .trim_end()
                            .to_string(),
                    )
                }
            },
            _ => PodOutcome::Running,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(phase: &str, message: Option<&str>, code: i32) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "status": {
                "phase": phase,
                "containerStatuses": [{
                    "name": "backup", "image": "i", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": {"exitCode": code, "message": message}}
                }]
            }
        }))
        .expect("pod")
    }

    #[test]
    fn outcomes_are_read_from_the_phase_and_the_termination_message() {
        let ok = PodReport {
            ok: true,
            size: Some(544),
            sha256: Some("ab".repeat(32)),
            revision: Some(7),
            etcd_version: Some("3.6.16".into()),
            ..PodReport::default()
        };
        assert_eq!(
            PodOutcome::of(&pod("Succeeded", Some(&ok.to_message()), 0)),
            PodOutcome::Succeeded(ok)
        );
        let bad = PodReport::failed("IntegrityCheckFailed", "mismatch".into());
        assert_eq!(
            PodOutcome::of(&pod("Failed", Some(&bad.to_message()), 1)),
            PodOutcome::Failed("IntegrityCheckFailed", "mismatch".into())
        );
        // An unknown reason is not taken as a label.
        let odd = PodReport::failed("IntegrityCheckFailed", "x".into()).to_message();
        let odd = odd.replace("IntegrityCheckFailed", "Whatever");
        assert!(matches!(
            PodOutcome::of(&pod("Failed", Some(&odd), 1)),
            PodOutcome::Failed(POD_FAILED, _)
        ));
        // Killed without a report; completed without one.
        assert!(matches!(
            PodOutcome::of(&pod("Failed", None, 137)),
            PodOutcome::Failed(POD_FAILED, m) if m.contains("exit code 137")
        ));
        assert!(matches!(
            PodOutcome::of(&pod("Succeeded", Some("garbage"), 0)),
            PodOutcome::Failed(POD_FAILED, _)
        ));
        assert_eq!(
            PodOutcome::of(&pod("Running", None, 0)),
            PodOutcome::Running
        );
        assert_eq!(PodOutcome::of(&Pod::default()), PodOutcome::Running);
    }

    #[test]
    fn long_messages_are_cut_to_fit_the_kubelet_limit() {
        let report = PodReport::failed("FileFailed", "x".repeat(10_000));
        assert!(report.to_message().len() < 4096);
    }
}
