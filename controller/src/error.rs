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
            Error::Etcd { .. } if self.is_etcd_not_ready() => "etcd_not_ready",
            Error::Etcd { .. } => "etcd",
            Error::Unsupported { .. } => "etcd_unsupported",
            Error::EtcdTls { .. } => "etcd_tls",
            Error::NoEndpoint(_) => "no_endpoint",
            Error::OperatorTls { .. } => "operator_tls",
            Error::Serialize { .. } => "serialize",
        }
    }

    /// etcd refused a membership change only for now: it wants every voter connected for its
    /// health window (about 5 s after a member joins or is promoted) before adding another
    /// (`etcdserver: unhealthy cluster`), or a learner to catch up before its promotion. Such
    /// a change is retried soon, without growing the backoff. So is a leadership handover
    /// that raced an election.
    pub fn is_etcd_not_ready(&self) -> bool {
        const NOT_READY: [&str; 5] = [
            "etcdserver: unhealthy cluster",
            "can only promote a learner member which is in sync with leader",
            "etcdserver: too many learner members in cluster",
            // A leadership handover sent as the leader changed: the next plan sees the new one.
            "etcdserver: not leader",
            "etcdserver: leader changed",
        ];
        match self {
            Error::Etcd { source, .. } => {
                let text = source.to_string();
                NOT_READY.iter().any(|m| text.contains(m))
            }
            _ => false,
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
            source => Error::Etcd { action, source },
        }
    }
}

/// The field manager of the operator's server-side applies.
pub const FIELD_MANAGER: &str = names::FIELD_MANAGER;

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd_error(message: &str) -> Error {
        Error::etcd("member add")(etcd_client::Error::InvalidArgs(message.to_owned()))
    }

    #[test]
    fn etcd_refusals_for_now_are_told_apart_from_failures() {
        let busy = etcd_error("etcdserver: unhealthy cluster");
        assert!(busy.is_etcd_not_ready());
        assert_eq!(busy.metric_label(), "etcd_not_ready");
        let behind = etcd_error(
            "etcdserver: can only promote a learner member which is in sync with leader",
        );
        assert!(behind.is_etcd_not_ready());
        assert!(etcd_error("etcdserver: not leader").is_etcd_not_ready());
        let failed = etcd_error("etcdserver: member not found");
        assert!(!failed.is_etcd_not_ready());
        assert_eq!(failed.metric_label(), "etcd");
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
