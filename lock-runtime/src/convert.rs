//! [`LockError`] as the error types services already return, so that `?` and the attribute
//! work in their functions: `std::io::Error`, and behind features `tonic::Status` (gRPC) and
//! axum's responses. Messages name the key, never a token.

use std::io;

use crate::error::{FailureKind, LockError};

/// A lock failure as an I/O error, for `fn job() -> std::io::Result<()>`. The `LockError` is the
/// inner error (`get_ref`, `into_inner`, then `downcast`). The kind says what a caller of an I/O
/// API would do about it:
/// - `Contended`: [`ResourceBusy`](io::ErrorKind::ResourceBusy), someone else holds it;
/// - `Unavailable`: by its first cause, [`TimedOut`](io::ErrorKind::TimedOut),
///   [`ConnectionRefused`](io::ErrorKind::ConnectionRefused) (also an injected outage, feature
///   `testing`),
///   [`ConnectionReset`](io::ErrorKind::ConnectionReset) (a connection broke) or
///   [`PermissionDenied`](io::ErrorKind::PermissionDenied) (authentication, ACL), else
///   [`Other`](io::ErrorKind::Other) (the server answered an error or was busy);
/// - `MaxHoldExceeded`: [`TimedOut`](io::ErrorKind::TimedOut);
/// - `Config`: [`InvalidInput`](io::ErrorKind::InvalidInput);
/// - `Lost` and the rest: [`Other`](io::ErrorKind::Other). No kind means "ownership lost", and
///   [`Interrupted`](io::ErrorKind::Interrupted), the nearest, makes `std`'s own loops retry.
impl From<LockError> for io::Error {
    fn from(err: LockError) -> Self {
        let kind = match &err {
            LockError::Contended { .. } => io::ErrorKind::ResourceBusy,
            LockError::Unavailable { causes, .. } => match causes.first().map(|c| c.kind) {
                Some(FailureKind::Timeout) => io::ErrorKind::TimedOut,
                Some(FailureKind::Refused) => io::ErrorKind::ConnectionRefused,
                #[cfg(feature = "testing")]
                Some(FailureKind::Injected) => io::ErrorKind::ConnectionRefused,
                Some(FailureKind::Io) => io::ErrorKind::ConnectionReset,
                Some(FailureKind::Auth | FailureKind::Permission) => {
                    io::ErrorKind::PermissionDenied
                }
                _ => io::ErrorKind::Other,
            },
            LockError::MaxHoldExceeded { .. } => io::ErrorKind::TimedOut,
            LockError::Config { .. } => io::ErrorKind::InvalidInput,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, err)
    }
}

/// A lock failure as a gRPC status, for a tonic service method (its trait fixes the error type
/// to `Status`). Codes follow gRPC's guidance on which code a client should act on:
/// - `Contended` and `Lost`: `ABORTED` ("typically due to a concurrency issue"; the client may
///   retry the whole sequence);
/// - `Unavailable`: `UNAVAILABLE` (transient, retry with backoff);
/// - `MaxHoldExceeded`: `DEADLINE_EXCEEDED`;
/// - the rest (configuration, initialisation, the library's runtime): `INTERNAL`, nothing the
///   client can fix.
///
/// The message is the error's (it names the key, never a token).
#[cfg(feature = "tonic")]
impl From<LockError> for tonic::Status {
    fn from(err: LockError) -> Self {
        let code = match &err {
            LockError::Contended { .. } | LockError::Lost { .. } => tonic::Code::Aborted,
            LockError::Unavailable { .. } => tonic::Code::Unavailable,
            LockError::MaxHoldExceeded { .. } => tonic::Code::DeadlineExceeded,
            _ => tonic::Code::Internal,
        };
        tonic::Status::new(code, err.to_string())
    }
}

/// A lock failure as an HTTP response, so an axum handler can return
/// `Result<Json<T>, LockError>` or use `?` into it: `Contended` is `409 Conflict`, `Unavailable`
/// `503 Service Unavailable`, `Lost` `409 Conflict` too (the work raced someone else and was not
/// done), `MaxHoldExceeded` `504 Gateway Timeout`, the rest `500`. The body is the error's message
/// as plain text (the key, never a token). No `Retry-After`: the library does not know when a
/// held lock will be free (a holder renews it) nor when servers come back.
#[cfg(feature = "axum")]
impl axum_core::response::IntoResponse for LockError {
    fn into_response(self) -> axum_core::response::Response {
        use http::StatusCode;
        let status = match &self {
            LockError::Contended { .. } | LockError::Lost { .. } => StatusCode::CONFLICT,
            LockError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            LockError::MaxHoldExceeded { .. } => StatusCode::GATEWAY_TIMEOUT,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, self.to_string()).into_response()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::error::NodeFailure;

    fn unavailable(kind: FailureKind) -> LockError {
        LockError::Unavailable {
            key: "k".to_owned(),
            causes: vec![NodeFailure {
                node: "127.0.0.1:1".to_owned(),
                kind,
                detail: String::new(),
            }],
        }
    }

    #[test]
    fn io_errors_carry_the_lock_error_and_a_kind_that_says_what_happened() {
        let contended = LockError::Contended {
            key: "k".to_owned(),
            waited: Duration::ZERO,
        };
        let cases = [
            (contended, io::ErrorKind::ResourceBusy),
            (unavailable(FailureKind::Timeout), io::ErrorKind::TimedOut),
            (
                unavailable(FailureKind::Refused),
                io::ErrorKind::ConnectionRefused,
            ),
            (unavailable(FailureKind::Io), io::ErrorKind::ConnectionReset),
            (
                unavailable(FailureKind::Auth),
                io::ErrorKind::PermissionDenied,
            ),
            (unavailable(FailureKind::Busy), io::ErrorKind::Other),
            (
                LockError::Lost {
                    key: "k".to_owned(),
                },
                io::ErrorKind::Other,
            ),
            (
                LockError::config("ttl", "is zero"),
                io::ErrorKind::InvalidInput,
            ),
        ];
        for (err, kind) in cases {
            let io = io::Error::from(err.clone());
            assert_eq!(io.kind(), kind, "{err:?}");
            assert_eq!(io.to_string(), err.to_string());
            let inner = io.into_inner().and_then(|e| e.downcast::<LockError>().ok());
            assert_eq!(inner.as_deref(), Some(&err));
        }
    }
}
