//! The reconciler's errors. Each variant has a static label for metrics.

use etcd_shared::names;

/// Why a reconcile failed. All are retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("Kubernetes API {action}: {source}")]
    Kube {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// An etcd member API call failed.
    #[error("etcd {action}: {source}")]
    Etcd {
        /// What was being done.
        action: String,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// etcd refused a call with one of its own errors (told by gRPC code and etcd's error,
    /// never by the text of a transport failure).
    #[error("etcd {action}: {refusal:?}: {source}")]
    EtcdRefused {
        /// What was being done.
        action: String,
        /// Which of etcd's errors.
        refusal: EtcdRefusal,
        /// The client's error.
        #[source]
        source: etcd_client::Error,
    },
    /// The member's etcd does not serve a call (gRPC `Unimplemented`): its release line
    /// predates it (MoveLeader before 3.3, MemberPromote before 3.4). The planner does not plan
    /// such calls; this is the clear error if one is made anyway.
    #[error("etcd {action}: not served by this member's etcd release line ({message})")]
    Unsupported {
        /// What was being done.
        action: String,
        /// etcd's words.
        message: String,
    },
    /// A member could not be reached over TLS: its certificate does not verify against the
    /// operator's CA and the member name, or the handshake failed.
    #[error("etcd over TLS: {source}")]
    EtcdTls {
        /// The member's endpoint.
        endpoint: String,
        /// What failed.
        #[source]
        source: crate::etcd_tls::EtcdTlsError,
    },
    /// The operator could not make a certificate of `spec.TLS.operatorManaged`.
    #[error("certificates: {0}")]
    Certificates(String),
    /// A test killed the controller at a failpoint (see [`crate::failpoints`]).
    #[error(transparent)]
    Failpoint(#[from] crate::failpoints::FailpointHit),
    /// A member that must be called directly has no running pod with an IP.
    #[error("member {0} has no client endpoint (no running pod with an IP)")]
    NoEndpoint(String),
    /// The operator's client certificate Secret is missing or incomplete.
    #[error("operator TLS secret {secret}: {reason}")]
    OperatorTls {
        /// Secret name.
        secret: String,
        /// What is wrong.
        reason: String,
    },
    /// The cluster is to be seeded from a snapshot but the controller has no image for the
    /// seed member's restore steps (`--restore-image`).
    #[error(
        "the cluster is restored from a snapshot, but the controller has no --restore-image for the seed member's restore steps"
    )]
    NoRestoreImage,
    /// The safety backup `spec.safetyBackup` asks for before a change could not be written
    /// (or its retry is not due yet): the change waits.
    #[error("safety backup before {change}: {reason}")]
    SafetyBackup {
        /// The change, e.g. `upgrade to 3.7`.
        change: String,
        /// Why.
        reason: String,
    },
    /// A snapshot streamed from a member is not intact.
    #[error("the snapshot of {endpoint} does not check: {reason}")]
    SnapshotCheck {
        /// The member's endpoint.
        endpoint: String,
        /// What the check found.
        reason: String,
    },
    /// A recovery found nothing to recover from, or could not read it.
    #[error("recovery: {0}")]
    Recovery(String),
    /// An object could not be serialized.
    #[error("serializing {what}: {source}")]
    Serialize {
        /// What.
        what: &'static str,
        /// The error.
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    /// A static label for the `reconcile_errors_total{error}` metric.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube { .. } => "kube",
            Error::EtcdRefused { refusal, .. } => refusal.metric_label(),
            Error::Etcd { .. } => "etcd",
            Error::Unsupported { .. } => "etcd_unsupported",
            Error::EtcdTls { .. } => "etcd_tls",
            Error::NoEndpoint(_) => "no_endpoint",
            Error::OperatorTls { .. } => "operator_tls",
            Error::Serialize { .. } => "serialize",
            Error::NoRestoreImage => "no_restore_image",
            Error::SafetyBackup { .. } => "safety_backup",
            Error::SnapshotCheck { .. } => "snapshot_check",
            Error::Recovery(_) => "recovery",
            Error::Failpoint(_) => "failpoint",
            Error::Certificates(_) => "certificates",
        }
    }

    /// etcd refused a membership change only for now: it wants every voter connected for its
    /// health window (about 5 s after a member joins or is promoted) before adding another
    /// (`unhealthy cluster`), enough started members, a learner to catch up before its
    /// promotion, or the one learner it allows to be promoted first. Such a change is retried
    /// soon, without growing the backoff. So is a leadership handover that raced an election.
    pub fn is_etcd_not_ready(&self) -> bool {
        matches!(self, Error::EtcdRefused { refusal, .. } if refusal.is_for_now())
    }

    /// Which of etcd's errors this is, if it is one.
    pub fn etcd_refusal(&self) -> Option<EtcdRefusal> {
        match self {
            Error::EtcdRefused { refusal, .. } => Some(*refusal),
            _ => None,
        }
    }

    /// Wraps a Kubernetes error with what was being done.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let action = action.into();
        move |source| Error::Kube { action, source }
    }

    /// Wraps an etcd error with what was being done; a call the server does not know
    /// becomes [`Error::Unsupported`].
    pub fn etcd(action: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
        let action = action.into();
        move |source| match source {
            etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unimplemented => {
                Error::Unsupported {
                    action,
                    message: s.message().to_string(),
                }
            }
            etcd_client::Error::GRpcStatus(s) => match EtcdRefusal::of(&s) {
                Some(refusal) => Error::EtcdRefused {
                    action,
                    refusal,
                    source: etcd_client::Error::GRpcStatus(s),
                },
                None => Error::Etcd {
                    action,
                    source: etcd_client::Error::GRpcStatus(s),
                },
            },
            source => Error::Etcd { action, source },
        }
    }
}

/// The errors of etcd's member API the controller tells apart, as etcd's server defines them
/// (`api/v3rpc/rpctypes`): each a gRPC code with a fixed description. The same on every line
/// from 3.2 on (checked against real servers by the `etcd_lines` test).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EtcdRefusal {
    /// `Unavailable`, "etcdserver: unhealthy cluster": a voter is not connected (or not for
    /// the health window) and the change could cost quorum.
    UnhealthyCluster,
    /// `FailedPrecondition`, "etcdserver: re-configuration failed due to not enough started
    /// members".
    NotEnoughStartedMembers,
    /// `FailedPrecondition`, "etcdserver: can only promote a learner member which is in sync
    /// with leader".
    LearnerNotInSync,
    /// `FailedPrecondition`, "etcdserver: too many learner members in cluster".
    TooManyLearners,
    /// `FailedPrecondition`, "etcdserver: not leader".
    NotLeader,
    /// `Unavailable`, "etcdserver: leader changed".
    LeaderChanged,
    /// `NotFound`, "etcdserver: member not found".
    MemberNotFound,
    /// `OutOfRange`, "etcdserver: mvcc: required revision has been compacted": a compaction
    /// to a revision the history is already compacted past.
    Compacted,
    /// `ResourceExhausted`, "etcdserver: mvcc: database space exceeded": the NOSPACE alarm is
    /// raised.
    NoSpace,
}

impl EtcdRefusal {
    /// etcd's table: gRPC code, description, refusal.
    const TABLE: [(tonic::Code, &'static str, EtcdRefusal); 9] = [
        (
            tonic::Code::Unavailable,
            "etcdserver: unhealthy cluster",
            EtcdRefusal::UnhealthyCluster,
        ),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: re-configuration failed due to not enough started members",
            EtcdRefusal::NotEnoughStartedMembers,
        ),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: can only promote a learner member which is in sync with leader",
            EtcdRefusal::LearnerNotInSync,
        ),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: too many learner members in cluster",
            EtcdRefusal::TooManyLearners,
        ),
        (
            tonic::Code::FailedPrecondition,
            "etcdserver: not leader",
            EtcdRefusal::NotLeader,
        ),
        (
            tonic::Code::Unavailable,
            "etcdserver: leader changed",
            EtcdRefusal::LeaderChanged,
        ),
        (
            tonic::Code::NotFound,
            "etcdserver: member not found",
            EtcdRefusal::MemberNotFound,
        ),
        (
            tonic::Code::OutOfRange,
            "etcdserver: mvcc: required revision has been compacted",
            EtcdRefusal::Compacted,
        ),
        (
            tonic::Code::ResourceExhausted,
            "etcdserver: mvcc: database space exceeded",
            EtcdRefusal::NoSpace,
        ),
    ];

    /// The refusal a gRPC status is, by its code and etcd's description.
    pub fn of(status: &tonic::Status) -> Option<EtcdRefusal> {
        Self::TABLE
            .iter()
            .find(|(code, text, _)| *code == status.code() && *text == status.message())
            .map(|(_, _, refusal)| *refusal)
    }

    /// Refused only for now: the same call may succeed soon.
    pub fn is_for_now(self) -> bool {
        !matches!(
            self,
            EtcdRefusal::MemberNotFound | EtcdRefusal::Compacted | EtcdRefusal::NoSpace
        )
    }

    /// The `reconcile_errors_total{error}` label.
    pub fn metric_label(self) -> &'static str {
        match self {
            EtcdRefusal::MemberNotFound => "etcd_member_not_found",
            EtcdRefusal::Compacted => "etcd_compacted",
            EtcdRefusal::NoSpace => "etcd_no_space",
            _ => "etcd_not_ready",
        }
    }
}

/// The field manager of the operator's server-side applies.
pub const FIELD_MANAGER: &str = names::FIELD_MANAGER;

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd_error(code: tonic::Code, message: &str) -> Error {
        Error::etcd("member add")(etcd_client::Error::GRpcStatus(tonic::Status::new(
            code, message,
        )))
    }

    #[test]
    fn etcd_refusals_are_told_by_code_and_etcd_error() {
        use tonic::Code;
        let busy = etcd_error(Code::Unavailable, "etcdserver: unhealthy cluster");
        assert!(busy.is_etcd_not_ready());
        assert_eq!(busy.metric_label(), "etcd_not_ready");
        let behind = etcd_error(
            Code::FailedPrecondition,
            "etcdserver: can only promote a learner member which is in sync with leader",
        );
        assert_eq!(behind.etcd_refusal(), Some(EtcdRefusal::LearnerNotInSync));
        assert!(etcd_error(Code::FailedPrecondition, "etcdserver: not leader").is_etcd_not_ready());
        let gone = etcd_error(Code::NotFound, "etcdserver: member not found");
        assert_eq!(gone.etcd_refusal(), Some(EtcdRefusal::MemberNotFound));
        assert!(!gone.is_etcd_not_ready());
        assert_eq!(gone.metric_label(), "etcd_member_not_found");
        // The words alone are no refusal: a transport error quoting them, or another code.
        let quoted = Error::etcd("member add")(etcd_client::Error::InvalidArgs(
            "etcdserver: unhealthy cluster".into(),
        ));
        assert!(!quoted.is_etcd_not_ready());
        assert_eq!(quoted.metric_label(), "etcd");
        assert!(!etcd_error(Code::Unknown, "etcdserver: unhealthy cluster").is_etcd_not_ready());
    }

    /// What etcd 3.2 answers to MoveLeader (seen on the real 3.2.13 binary).
    #[test]
    fn a_call_the_server_does_not_know_is_unsupported() {
        let status = tonic::Status::unimplemented("unknown method MoveLeader");
        let err = Error::etcd("move leader")(etcd_client::Error::GRpcStatus(status));
        assert_eq!(err.metric_label(), "etcd_unsupported");
        assert!(!err.is_etcd_not_ready());
        assert!(
            err.to_string()
                .contains("not served by this member's etcd release line"),
            "{err}"
        );
    }
}
