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
//! | `Unavailable` caused by a failed connection attempt (tonic's `ConnectError`: refused, connect timeout, no route) | fail | no connection: the request was never sent |
//! | `Unavailable`, anything else (`etcdserver: request timed out`, `leader changed`, `no leader`, `server stopped`, a reset or closed connection, a failed keep-alive) | unknown | the proposal may have been committed |
//! | `DeadlineExceeded`, `Cancelled`, `Unknown`, `Internal`, `Aborted`, `DataLoss`, `Ok` | unknown | nothing says where the request got to |
//! | the recorder's own per-request timeout | unknown | the request may be in flight |
//! | client-side errors before sending (`InvalidArgs`, `InvalidUri`, `InvalidMetadataValue`, `EndpointError`, building the transport) | fail | never sent |
//! | any other client error (I/O, watch, internal) | unknown | |
//!
//! A compare that does not hold is not an error at all: the transaction is applied and
//! answers `succeeded: false`.

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

/// The effect of a failed etcd client call, by the table of the module docs.
pub fn classify(error: &etcd_client::Error) -> Effect {
    use etcd_client::Error as E;
    match error {
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
    }
}
