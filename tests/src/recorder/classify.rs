//! What a failed request tells about its effect: definitely not applied (`fail`), or maybe
//! applied (`unknown`). This is the heart of the recorder: calling an applied write `fail`
//! makes the checker report a violation that is not there, calling an unapplied one `unknown`
//! only weakens the check. So `fail` needs proof that etcd refused the request before
//! applying it, or that it was never sent.
//!
//! | error | outcome | why |
//! |---|---|---|
//! | gRPC `InvalidArgument` (`key is not provided`, `too many operations in txn request`, `duplicate key given in txn request`, `request is too large`, ...) | fail | checked before the request is proposed |
//! | `FailedPrecondition` (`etcdserver: not capable`, `not leader` for a leader move, auth management) | fail | refused before proposing |
//! | `PermissionDenied`, `Unauthenticated` | fail | auth is checked before proposing, and again at apply on every member alike: a refused request changes nothing |
//! | `OutOfRange` (`required revision has been compacted`, `is a future revision`) | fail | reads at a revision; nothing to apply |
//! | `NotFound` (`requested lease not found`), `AlreadyExists` | fail | refused by the server |
//! | `Unimplemented` | fail | the server has no such method (e.g. HashKV before 3.3) |
//! | `ResourceExhausted` with `etcdserver: too many requests` | fail | the apply backlog is checked before proposing |
//! | `ResourceExhausted` with `etcdserver: mvcc: database space exceeded` (NOSPACE) | fail, except a write called before the first NOSPACE answer returned: unknown | etcd applies the entry whose apply crosses the quota and answers NOSPACE for it (3.6's `quotaApplierV3`); it raises the alarm before any NOSPACE answer and refuses every entry proposed after (`traffic::Traffic::no_space_effect`) |
//! | `ResourceExhausted`, anything else (e.g. an answer over the client's size limit) | unknown | it may come after the apply |
//! | `Unavailable` caused by a failed connection attempt (tonic's `ConnectError`: refused, connect timeout, no route, a TLS handshake the client ended: the member's certificate expired, untrusted or not for the domain name) | fail | no connection: the request was never sent |
//! | any code (`Unknown: transport error` in practice) caused by a TLS alert the member sent to refuse the handshake (`received fatal alert: UnknownCA`, `CertificateExpired`, `CertificateRequired`, `BadCertificate`, ...: [`REFUSED_HANDSHAKE_ALERTS`]) | fail | TLS 1.3: the client's side of the handshake is over before the member checks the client's certificate, so the request may have been written, but the member refused the connection before reading any of it |
//! | `Unavailable`, anything else (`etcdserver: request timed out`, `leader changed`, `no leader`, `server stopped`, a reset or closed connection, a failed keep-alive) | unknown | the proposal may have been committed |
//! | `DeadlineExceeded`, `Cancelled`, `Unknown`, `Internal`, `Aborted`, `DataLoss`, `Ok` | unknown | nothing says where the request got to |
//! | the recorder's own per-request timeout | unknown | the request may be in flight |
//! | client-side errors before sending (`InvalidArgs`, `InvalidUri`, `InvalidMetadataValue`, `EndpointError`, building the transport) | fail | never sent |
//! | no connection to send it on ([`super::endpoints::NoConnection`]: the client not made, or a new TLS connection's confirming `Status` call failed) | fail | never sent (recorded by the traffic, not classified here) |
//! | any other client error (I/O, watch, internal) | unknown | |
//!
//! A compare that does not hold is not an error at all: the transaction is applied and
//! answers `succeeded: false`.
//!
//! A member refusing the client's certificate most often shows as `Cancelled: operation was
//! canceled` caused by hyper's `connection closed`, with no trace of TLS (the alert was read
//! by the connection, not by the request): nothing tells it from a connection lost after the
//! request went out, so it stays unknown. That is why the clients confirm each new TLS
//! connection before recording a request on it ([`super::endpoints::Pool::client`]); the
//! rows above only meet a handshake refused on one of tonic's own reconnections.

use std::error::Error as StdError;

use tonic::Code;

/// What is known about a failed request's effect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Definitely not applied.
    Fail,
    /// Maybe applied.
    Unknown,
}

/// The messages of `ResourceExhausted` that etcd sends before applying.
const REFUSED_EXHAUSTED: [&str; 2] = [
    "etcdserver: mvcc: database space exceeded",
    "etcdserver: too many requests",
];

/// The TLS alerts a server sends only to refuse a handshake (rustls' `AlertDescription`
/// names): a certificate refused (the client's expired, from an unknown CA, missing,
/// revoked, ...) or the negotiation failed. Go's server (etcd) neither renegotiates nor asks
/// for a certificate after the handshake, so none of them can end a connection the server
/// has read a request from.
pub const REFUSED_HANDSHAKE_ALERTS: [&str; 10] = [
    "HandshakeFailure",
    "NoCertificate",
    "BadCertificate",
    "UnsupportedCertificate",
    "CertificateRevoked",
    "CertificateExpired",
    "CertificateUnknown",
    "UnknownCA",
    "AccessDenied",
    "CertificateRequired",
];

/// The text rustls gives a TLS alert received from the peer, `AlertReceived(alert)`: this
/// prefix, then the alert's name. (The recorder has no rustls dependency of its own to
/// downcast to: the text is matched, on I/O errors of kind `InvalidData` only, which is how
/// tokio-rustls hands rustls' errors on.)
const ALERT_RECEIVED: &str = "received fatal alert: ";

/// The effect of a gRPC status with `code` and `message`; `connect_failed` when its cause is
/// a failed connection attempt (the request was never sent).
pub fn classify_status(code: Code, message: &str, connect_failed: bool) -> Effect {
    match code {
        Code::InvalidArgument
        | Code::FailedPrecondition
        | Code::PermissionDenied
        | Code::Unauthenticated
        | Code::OutOfRange
        | Code::NotFound
        | Code::AlreadyExists
        | Code::Unimplemented => Effect::Fail,
        Code::ResourceExhausted if REFUSED_EXHAUSTED.iter().any(|m| message.contains(m)) => {
            Effect::Fail
        }
        Code::Unavailable if connect_failed => Effect::Fail,
        Code::ResourceExhausted
        | Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Unknown
        | Code::Internal
        | Code::Aborted
        | Code::DataLoss
        | Code::Ok => Effect::Unknown,
    }
}

/// Whether `error`'s source chain holds a failed connection attempt.
fn connect_failed(error: &(dyn StdError + 'static)) -> bool {
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        if e.is::<tonic::ConnectError>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// Whether `error`'s source chain holds a TLS alert the server sent to refuse the handshake
/// (one of [`REFUSED_HANDSHAKE_ALERTS`]).
fn handshake_refused(error: &(dyn StdError + 'static)) -> bool {
    let refusal = |e: &dyn StdError| {
        e.to_string()
            .strip_prefix(ALERT_RECEIVED)
            .is_some_and(|alert| REFUSED_HANDSHAKE_ALERTS.contains(&alert))
    };
    let mut next: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(e) = next {
        // An I/O error's `source` skips the error it carries: look at that one directly.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io.kind() == std::io::ErrorKind::InvalidData
            && io.get_ref().is_some_and(|inner| refusal(inner))
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// The effect of a failed etcd client call, by the table of the module docs.
pub fn classify(error: &etcd_client::Error) -> Effect {
    use etcd_client::Error as E;
    match error {
        E::GRpcStatus(status) if handshake_refused(status) => Effect::Fail,
        E::GRpcStatus(status) => {
            classify_status(status.code(), status.message(), connect_failed(status))
        }
        E::InvalidArgs(_)
        | E::InvalidUri(_)
        | E::InvalidMetadataValue(_)
        | E::EndpointError(_)
        | E::EndpointsNotManaged
        | E::TransportError(_) => Effect::Fail,
        _ => Effect::Unknown,
    }
}

/// A short text for the history: the gRPC code and message, or the client error.
pub fn describe(error: &etcd_client::Error) -> String {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            let mut text = format!("{:?}: {}", status.code(), status.message());
            let mut next = status.source();
            // The cause of a transport failure (e.g. "Connection refused").
            while let Some(e) = next {
                let cause = e.to_string();
                if !text.contains(&cause) {
                    text.push_str(": ");
                    text.push_str(&cause);
                }
                next = e.source();
            }
            text
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table() {
        let cases: [(Code, &str, bool, Effect); 22] = [
            (
                Code::InvalidArgument,
                "etcdserver: key is not provided",
                false,
                Effect::Fail,
            ),
            (
                Code::InvalidArgument,
                "etcdserver: request is too large",
                false,
                Effect::Fail,
            ),
            (
                Code::FailedPrecondition,
                "etcdserver: not capable",
                false,
                Effect::Fail,
            ),
            (
                Code::PermissionDenied,
                "etcdserver: permission denied",
                false,
                Effect::Fail,
            ),
            (
                Code::Unauthenticated,
                "etcdserver: invalid auth token",
                false,
                Effect::Fail,
            ),
            (
                Code::OutOfRange,
                "etcdserver: mvcc: required revision has been compacted",
                false,
                Effect::Fail,
            ),
            (
                Code::NotFound,
                "etcdserver: requested lease not found",
                false,
                Effect::Fail,
            ),
            (
                Code::Unimplemented,
                "unknown method HashKV",
                false,
                Effect::Fail,
            ),
            (
                Code::ResourceExhausted,
                "etcdserver: mvcc: database space exceeded",
                false,
                Effect::Fail,
            ),
            (
                Code::ResourceExhausted,
                "etcdserver: too many requests",
                false,
                Effect::Fail,
            ),
            (
                Code::ResourceExhausted,
                "decoded message length too large",
                false,
                Effect::Unknown,
            ),
            (
                Code::Unavailable,
                "tcp connect error: Connection refused (os error 111)",
                true,
                Effect::Fail,
            ),
            (
                Code::Unavailable,
                "etcdserver: request timed out",
                false,
                Effect::Unknown,
            ),
            (
                Code::Unavailable,
                "etcdserver: leader changed",
                false,
                Effect::Unknown,
            ),
            (
                Code::Unavailable,
                "etcdserver: no leader",
                false,
                Effect::Unknown,
            ),
            (
                Code::Unavailable,
                "error reading a body from connection: connection reset",
                false,
                Effect::Unknown,
            ),
            (
                Code::DeadlineExceeded,
                "context deadline exceeded",
                false,
                Effect::Unknown,
            ),
            (Code::Cancelled, "Timeout expired", false, Effect::Unknown),
            (Code::Unknown, "transport error", false, Effect::Unknown),
            (Code::Internal, "h2 protocol error", false, Effect::Unknown),
            (
                Code::DataLoss,
                "etcdserver: corrupt cluster",
                false,
                Effect::Unknown,
            ),
            (Code::Aborted, "", false, Effect::Unknown),
        ];
        for (code, message, connect, want) in cases {
            assert_eq!(
                classify_status(code, message, connect),
                want,
                "{code:?} {message:?} connect failed: {connect}"
            );
        }
    }

    #[test]
    fn client_errors() {
        assert_eq!(
            classify(&etcd_client::Error::InvalidArgs("empty endpoints".into())),
            Effect::Fail
        );
        assert_eq!(
            classify(&etcd_client::Error::WatchError("closed".into())),
            Effect::Unknown
        );
        assert_eq!(
            classify(&etcd_client::Error::IoError(std::io::Error::other("x"))),
            Effect::Unknown
        );
        let status = tonic::Status::unavailable("etcdserver: request timed out");
        assert_eq!(
            classify(&etcd_client::Error::GRpcStatus(status)),
            Effect::Unknown
        );
    }

    /// A stand-in for an error that carries another as its source (tonic's
    /// `transport::Error` and `hyper::Error` have no public constructors).
    #[derive(Debug)]
    struct Caused(&'static str, Box<dyn StdError + Send + Sync>);

    impl std::fmt::Display for Caused {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl StdError for Caused {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&*self.1)
        }
    }

    /// The chain a member refusing the client's certificate gives when the alert reaches the
    /// request (seen against etcd 3.6 over TLS 1.3, see tests/recorder.rs):
    /// `Status { code: Unknown, message: "transport error", source:
    /// tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData,
    /// error: "received fatal alert: UnknownCA" })) }`.
    fn alert_chain(kind: std::io::ErrorKind, text: &str) -> etcd_client::Error {
        let io = std::io::Error::new(kind, text.to_string());
        let hyper = Caused("connection error", Box::new(io));
        let status =
            tonic::Status::from_error(Box::new(Caused("transport error", Box::new(hyper))));
        etcd_client::Error::GRpcStatus(status)
    }

    #[test]
    fn a_handshake_refused_by_the_member_is_a_fail() {
        use std::io::ErrorKind::{InvalidData, Other};
        for alert in [
            "UnknownCA",
            "CertificateExpired",
            "CertificateRequired",
            "BadCertificate",
        ] {
            let error = alert_chain(InvalidData, &format!("received fatal alert: {alert}"));
            assert!(
                matches!(&error, etcd_client::Error::GRpcStatus(s) if s.code() == Code::Unknown),
                "{error:?}"
            );
            assert_eq!(classify(&error), Effect::Fail, "{alert}");
            assert!(describe(&error).contains(alert), "{}", describe(&error));
        }
        // Alerts that may end an established connection, and look-alikes, are no proof.
        for (kind, text) in [
            (InvalidData, "received fatal alert: DecodeError"),
            (InvalidData, "received fatal alert: BadRecordMac"),
            (InvalidData, "received fatal alert: UnknownCAx"),
            (Other, "received fatal alert: UnknownCA"),
        ] {
            assert_eq!(
                classify(&alert_chain(kind, text)),
                Effect::Unknown,
                "{kind:?} {text}"
            );
        }
        // The usual shape of the same refusal carries no trace of TLS: unknown (the clients
        // confirm new TLS connections for that reason, see `endpoints::Pool::client`).
        let closed = tonic::Status::from_error(Box::new(Caused(
            "transport error",
            Box::new(std::io::Error::other("connection closed")),
        )));
        let cancelled = tonic::Status::cancelled("operation was canceled");
        for status in [closed, cancelled] {
            assert_eq!(
                classify(&etcd_client::Error::GRpcStatus(status)),
                Effect::Unknown
            );
        }
    }

    #[test]
    fn a_connect_error_in_the_chain_is_a_fail() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(refused))));
        assert_eq!(status.code(), Code::Unavailable);
        let error = etcd_client::Error::GRpcStatus(status);
        assert_eq!(classify(&error), Effect::Fail);
        assert!(
            describe(&error).starts_with("Unavailable: "),
            "{}",
            describe(&error)
        );
        // The client refusing the member's certificate ends the handshake in the connector:
        // `Unavailable: invalid peer certificate: UnknownIssuer` (seen against etcd 3.6).
        let untrusted = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let status = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(untrusted))));
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(
            classify(&etcd_client::Error::GRpcStatus(status)),
            Effect::Fail
        );
    }
}
