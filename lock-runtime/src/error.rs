use std::fmt;
use std::time::Duration;

/// Why an operation on a lock failed.
///
/// Contention ([`LockError::Contended`]) and infrastructure failure ([`LockError::Unavailable`]) are
/// never reported as one another: a Redis error, a timeout or a refused connection is `Unavailable`,
/// and only an answer from Redis saying "someone else holds it" is `Contended`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Someone else holds the lock and `wait` ran out.
    #[error("lock `{key}` is held by someone else (waited {waited:?})")]
    Contended {
        /// The lock's key, without the configured prefix.
        key: String,
        /// How long this call waited before giving up.
        waited: Duration,
    },
    /// Redis (or etcd) could not be reached, answered with an error, or (Redlock) too many nodes
    /// failed for a quorum to be possible; etcd also when its cluster has no quorum. Carries each
    /// node's (each etcd endpoint's) cause.
    #[error("lock `{key}`: lock server unavailable: {}", NodeFailures(causes))]
    Unavailable {
        /// The lock's key, without the configured prefix.
        key: String,
        /// One entry per node that failed.
        causes: Vec<NodeFailure>,
    },
    /// The lock was lost while it was held: renewal was refused, the key expired or was deleted or
    /// overwritten by someone else, or renewal could not be confirmed before the validity deadline.
    #[error("lock `{key}` was lost while held")]
    Lost {
        /// The lock's key, without the configured prefix.
        key: String,
    },
    /// The lock was held for its `max_hold`: renewal stopped, an async body was cancelled, a sync
    /// body's result was replaced.
    #[error("lock `{key}` was held for its max_hold ({max_hold:?})")]
    MaxHoldExceeded {
        /// The lock's key (the first, for several), without the configured prefix.
        key: String,
        /// The limit that passed.
        max_hold: Duration,
    },
    /// [`init`](crate::init) was not called before a lock was taken through the global client.
    #[error("lock_runtime::init was not called before using a lock")]
    NotInitialized,
    /// [`init`](crate::init) was called a second time after a successful call.
    #[error("lock_runtime::init was already called")]
    AlreadyInitialized,
    /// What every lock call answers after [`shutdown`](crate::shutdown), and an acquisition
    /// that still waited when it was called; also when the library's background runtime could
    /// not be started, or a runtime stopped before answering (the one given to
    /// [`LockConfig::runtime`](crate::LockConfig::runtime) shut down, say).
    #[error("lock runtime failure: {reason}")]
    Runtime {
        /// What failed.
        reason: String,
    },
    /// A configuration value is invalid.
    #[error("invalid lock configuration: `{field}` {reason}")]
    Config {
        /// The field (builder method, argument or environment variable) that is wrong.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

impl LockError {
    /// The key this error is about, when it is about one lock.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Contended { key, .. }
            | LockError::Unavailable { key, .. }
            | LockError::Lost { key }
            | LockError::MaxHoldExceeded { key, .. } => Some(key),
            _ => None,
        }
    }

    /// True for [`LockError::Contended`].
    pub fn is_contended(&self) -> bool {
        matches!(self, LockError::Contended { .. })
    }

    pub(crate) fn config(field: &'static str, reason: impl Into<String>) -> Self {
        LockError::Config {
            field,
            reason: reason.into(),
        }
    }
}

/// The error types a `#[distributed_lock]` function (or [`Lock::run`](crate::Lock::run)) can
/// return a lock failure in without `map_err`: every `E: From<LockError>`. Implemented for all
/// of them; there is nothing to implement. For an error type that cannot have
/// `From<LockError>` (a foreign type: the orphan rule), name a conversion in the attribute with
/// `map_err = path` (a `fn(LockError) -> E`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot carry a lock failure: it does not implement `From<LockError>`",
    label = "the error type of this locked function",
    note = "implement `From<lock_runtime::LockError>` for `{Self}`, or name a conversion in the attribute with `map_err = path` (a `fn(LockError) -> {Self}`)",
    note = "`std::io::Error`, `anyhow::Error`, `Box<dyn Error + Send + Sync>` and (feature `tonic`) `tonic::Status` have it already"
)]
pub trait FromLockError {
    /// `err` as this error type.
    fn from_lock_error(err: LockError) -> Self;
}

impl<E: From<LockError>> FromLockError for E {
    fn from_lock_error(err: LockError) -> Self {
        E::from(err)
    }
}

/// What went wrong on one Redis node, or on an etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFailure {
    /// The node's address (`host:port`), never with credentials. For etcd, the cluster's
    /// endpoints (`etcd[host:port,...]`), with each endpoint's own cause (kind and message) in
    /// `detail`, and as `kind` the most telling of them (authentication, permission, an error
    /// reply, a timeout, a broken connection, no leader, refused: in that order).
    pub node: String,
    /// The kind of failure.
    pub kind: FailureKind,
    /// Redis's or the OS's message (for [`FailureKind::Protocol`], what is at the address
    /// instead of Redis), never containing tokens or passwords.
    pub detail: String,
}

/// The kind of a [`NodeFailure`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// No answer within the configured response or connect timeout.
    Timeout,
    /// The connection could not be made (nothing was sent).
    Refused,
    /// The connection broke, or another I/O error.
    Io,
    /// Wrong user name or password.
    Auth,
    /// The user lacks a permission (ACL) the lock needs.
    Permission,
    /// The server answered that it cannot serve the request now and did not run it (`LOADING`,
    /// `BUSY`, `TRYAGAIN`, `MASTERDOWN`, `CLUSTERDOWN`, `READONLY`); retried within `wait`.
    Busy,
    /// Redis answered with another error.
    Response,
    /// The answer was not Redis's protocol (RESP): something other than Redis listens at the
    /// address (an HTTP server, say), or a TLS endpoint answered a `redis://` URL (meant:
    /// `rediss://`) with TLS. Not retried: the address will not start speaking Redis. Redis's own
    /// TLS port resets such a connection instead of answering it: [`FailureKind::Io`].
    Protocol,
    /// The master did it, but fewer replicas than `min_replicas` acknowledged it in time (a
    /// grant is then withdrawn; a renewal counts as failed). Retried within `wait`.
    Replication,
    /// A fault injected by [`Faults::unavailable`](crate::testing::Faults::unavailable) (cargo
    /// feature `testing`), treated as a refused connection: retried within `wait`. The detail
    /// names the pattern.
    #[cfg(feature = "testing")]
    Injected,
}

impl FailureKind {
    /// Whether retrying the same operation later may succeed.
    pub(crate) fn is_transient(self) -> bool {
        match self {
            FailureKind::Timeout
            | FailureKind::Refused
            | FailureKind::Io
            | FailureKind::Busy
            | FailureKind::Replication => true,
            // An outage, as a refused connection is.
            #[cfg(feature = "testing")]
            FailureKind::Injected => true,
            FailureKind::Auth
            | FailureKind::Permission
            | FailureKind::Response
            | FailureKind::Protocol => false,
        }
    }

    /// Whether the request may have been carried out although no answer came back.
    pub(crate) fn may_have_applied(self) -> bool {
        matches!(self, FailureKind::Timeout | FailureKind::Io)
    }
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FailureKind::Timeout => "timed out",
            FailureKind::Refused => "connection refused",
            FailureKind::Io => "connection failed",
            FailureKind::Auth => "authentication failed",
            FailureKind::Permission => "permission denied",
            FailureKind::Busy => "server busy",
            FailureKind::Response => "error reply",
            FailureKind::Protocol => "protocol error",
            FailureKind::Replication => "not replicated",
            #[cfg(feature = "testing")]
            FailureKind::Injected => "injected fault",
        };
        write!(f, "{}: {kind}: {}", self.node, self.detail)
    }
}

struct NodeFailures<'a>(&'a [NodeFailure]);

impl fmt::Display for NodeFailures<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            return f.write_str("no node answered");
        }
        for (i, cause) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{cause}")?;
        }
        Ok(())
    }
}

impl NodeFailure {
    pub(crate) fn timeout(node: &str, what: &str) -> Self {
        NodeFailure {
            node: node.to_owned(),
            kind: FailureKind::Timeout,
            detail: format!("no answer to {what} in time"),
        }
    }

    pub(crate) fn response(node: &str, detail: &str) -> Self {
        NodeFailure {
            node: node.to_owned(),
            kind: FailureKind::Response,
            detail: detail.to_owned(),
        }
    }

    pub(crate) fn replication(node: &str, detail: &str) -> Self {
        NodeFailure {
            node: node.to_owned(),
            kind: FailureKind::Replication,
            detail: detail.to_owned(),
        }
    }

    pub(crate) fn from_redis(node: &str, err: &redis::RedisError) -> Self {
        use redis::ErrorKind;
        let kind = if err.is_timeout() {
            FailureKind::Timeout
        } else if err.is_connection_refusal() {
            FailureKind::Refused
        } else if err.is_io_error() || err.is_connection_dropped() {
            FailureKind::Io
        } else {
            match err.kind() {
                ErrorKind::AuthenticationFailed => FailureKind::Auth,
                ErrorKind::Parse if is_unparsable_answer(err) => FailureKind::Protocol,
                _ => match err.code() {
                    Some("NOAUTH" | "WRONGPASS") => FailureKind::Auth,
                    Some("NOPERM") => FailureKind::Permission,
                    // A script's command the ACL refuses (Redis 7.0 answers `ERR`, not `NOPERM`).
                    Some("ERR")
                        if err
                            .detail()
                            .is_some_and(|d| d.contains("can't run this command")) =>
                    {
                        FailureKind::Permission
                    }
                    // READONLY: a demoted master (Sentinel failover); the client finds the new one.
                    Some(
                        "LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "CLUSTERDOWN" | "READONLY",
                    ) => FailureKind::Busy,
                    _ => FailureKind::Response,
                },
            }
        };
        let detail = match kind {
            FailureKind::Protocol => NOT_REDIS.to_owned(),
            _ => err.to_string(),
        };
        NodeFailure {
            node: node.to_owned(),
            kind,
            detail,
        }
    }
}

/// What a [`FailureKind::Protocol`] cause says in place of redis-rs's parse error, which names
/// the unexpected bytes as numbers, one line each (`Unexpected \`72\``): the likely causes.
const NOT_REDIS: &str = "not a Redis server (or a TLS port spoken to in plain text)";

/// Whether `err` (of kind `Parse`) comes from redis-rs's reader, which could not read the bytes
/// the address sent as RESP (an HTTP server's `HTTP/1.1 400`), rather than from converting a
/// reply it did read into a Rust type, which redis-rs also calls `Parse` and words otherwise.
fn is_unparsable_answer(err: &redis::RedisError) -> bool {
    err.detail()
        .is_some_and(|d| d.starts_with("Parse error at"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// redis-rs calls two failures `Parse`: bytes its reader cannot read as RESP, and a reply it
    /// read that does not convert into the type asked for. Only the first says that no Redis
    /// answered.
    #[test]
    fn only_an_unreadable_answer_is_not_a_redis_server() {
        let Err(unreadable) = redis::parse_redis_value(b"HTTP/1.1 400 Bad Request\r\n\r\n") else {
            panic!("an HTTP status line read as RESP");
        };
        assert_eq!(unreadable.kind(), redis::ErrorKind::Parse);
        let failure = NodeFailure::from_redis("127.0.0.1:8080", &unreadable);
        assert_eq!(failure.kind, FailureKind::Protocol);
        assert_eq!(
            failure.to_string(),
            "127.0.0.1:8080: protocol error: not a Redis server (or a TLS port spoken to in plain text)"
        );

        let Err(unconverted) =
            redis::from_redis_value::<u64>(redis::Value::SimpleString("OK".to_owned()))
        else {
            panic!("`OK` converted into a number");
        };
        let unconverted = redis::RedisError::from(unconverted);
        assert_eq!(unconverted.kind(), redis::ErrorKind::Parse);
        let failure = NodeFailure::from_redis("127.0.0.1:6379", &unconverted);
        assert_eq!(failure.kind, FailureKind::Response);
        assert_eq!(failure.detail, unconverted.to_string());
    }
}
