//! The members of the cluster: one client per member, made on first use, and the calls that go
//! to the preferred member and fail over to the next, with one failure naming every member's
//! cause.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use etcd_client::{Client, ConnectOptions, Txn, TxnResponse};
use tokio::sync::OnceCell;

use super::node::Inner;
use crate::backend::BoxFuture;
use crate::error::{FailureKind, NodeFailure};

pub(super) struct Member {
    pub(super) name: String,
    pub(super) url: String,
    pub(super) client: OnceCell<Client>,
}

pub(super) type Op<T> =
    dyn Fn(Client) -> BoxFuture<'static, Result<T, etcd_client::Error>> + Send + Sync;

/// Why one member failed a call.
struct Cause {
    /// The member's index.
    member: usize,
    kind: FailureKind,
    detail: String,
}

impl Inner {
    /// The client of member `i`, made on first use (no I/O but authentication).
    pub(super) async fn client(&self, i: usize) -> Result<Client, etcd_client::Error> {
        let member = &self.members[i];
        let client = member
            .client
            .get_or_try_init(|| async {
                let endpoint = tonic::transport::Endpoint::from_shared(member.url.clone())?
                    .connect_timeout(self.connect_timeout)
                    .timeout(self.response_timeout)
                    .tcp_nodelay(true);
                #[cfg(feature = "tls")]
                let endpoint = if member.url.starts_with("https://") {
                    endpoint.tls_config(self.tls_options(&member.name))?
                } else {
                    endpoint
                };
                let channel = etcd_client::Channel::Tonic(endpoint.connect_lazy());
                let mut options = ConnectOptions::new().with_require_leader(true);
                if let Some((user, password)) = &self.user {
                    options = options
                        .with_user(user.clone(), password.clone())
                        .with_auto_token_refresh(true);
                }
                Client::from_channel(channel, Some(options)).await
            })
            .await?;
        Ok(client.clone())
    }

    /// TLS for the member at `name` (`host:port`): the CA of `tls_root_ca` (else the webpki
    /// roots), the certificate of `tls_client_cert` if set, and `host` as the name the server's
    /// certificate must carry.
    #[cfg(feature = "tls")]
    fn tls_options(&self, name: &str) -> etcd_client::TlsOptions {
        let host = name.rsplit_once(':').map_or("", |(host, _)| host);
        let options = etcd_client::TlsOptions::new().domain_name(host);
        let options = match &self.tls.root_ca {
            Some(pem) => options.ca_certificate(etcd_client::Certificate::from_pem(pem)),
            None => options.with_webpki_roots(),
        };
        match &self.tls.client_cert {
            Some((cert, key)) => options.identity(etcd_client::Identity::from_pem(cert, key)),
            None => options,
        }
    }

    /// Runs `op` on the preferred member, moving on to the next ones while they fail in a way
    /// another member may not (refused, broken, no leader), all within one connect plus one
    /// response timeout.
    ///
    /// The client talks to one member at a time (the last that answered) and moves on to the next
    /// when one refuses, breaks, or has no leader (requests carry etcd's require-leader flag, so a
    /// member cut off from its quorum says so at once instead of hanging); all of it within one
    /// connect plus one response timeout per operation. A failure names every endpoint's cause.
    pub(super) async fn call<T>(&self, what: &str, op: &Op<T>) -> Result<T, NodeFailure> {
        let n = self.members.len();
        let first = self.preferred.load(Ordering::Relaxed) % n;
        let deadline = Instant::now() + self.connect_timeout + self.response_timeout;
        let mut causes: Vec<Cause> = Vec::new();
        for step in 0..n {
            let i = (first + step) % n;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let attempt = async { op(self.client(i).await?).await };
            let (kind, detail) = match tokio::time::timeout(left, attempt).await {
                Ok(Ok(value)) => {
                    if step > 0 {
                        self.preferred.store(i, Ordering::Relaxed);
                    }
                    return Ok(value);
                }
                Ok(Err(err)) => classify(&err),
                Err(_) => (FailureKind::Timeout, format!("no answer to {what} in time")),
            };
            causes.push(Cause {
                member: i,
                kind,
                detail,
            });
            self.preferred.store((i + 1) % n, Ordering::Relaxed);
            if !kind.is_transient() {
                // Authentication and permissions are the cluster's, not one member's.
                break;
            }
        }
        Err(self.failure(what, causes))
    }

    /// One failure for the whole cluster, naming each endpoint's cause.
    fn failure(&self, what: &str, causes: Vec<Cause>) -> NodeFailure {
        if causes.is_empty() {
            return NodeFailure::timeout(&self.addr, what);
        }
        let pick = |k: FailureKind| causes.iter().any(|c| c.kind == k);
        let kind = [
            FailureKind::Auth,
            FailureKind::Permission,
            FailureKind::Response,
            FailureKind::Timeout,
            FailureKind::Io,
            FailureKind::Busy,
        ]
        .into_iter()
        .find(|k| pick(*k))
        .unwrap_or(FailureKind::Refused);
        let detail = causes
            .iter()
            .map(|c| {
                let cause = NodeFailure {
                    node: self.members[c.member].name.clone(),
                    kind: c.kind,
                    detail: c.detail.clone(),
                };
                cause.to_string()
            })
            .collect::<Vec<_>>()
            .join("; ");
        NodeFailure {
            node: self.addr.clone(),
            kind,
            detail: format!("{what}: {detail}"),
        }
    }

    pub(super) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse, NodeFailure> {
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            let txn = txn.clone();
            Box::pin(async move { client.txn(txn).await })
        };
        self.call(what, &op).await
    }

    /// Revokes `lease`; a lease that is gone already counts as revoked.
    pub(super) async fn revoke(&self, lease: i64) -> Result<(), NodeFailure> {
        let op = move |mut client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move {
                match client.lease_revoke(lease).await {
                    Ok(_) => Ok(()),
                    Err(err) if lease_not_found(&err) => Ok(()),
                    Err(err) => Err(err),
                }
            })
        };
        self.call("lease revoke", &op).await
    }

    /// Revokes `lease` in the background (housekeeping: an unrevoked lease expires by its TTL).
    pub(super) fn revoke_later(self: &Arc<Self>, lease: i64) {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let inner = Arc::clone(self);
            runtime.spawn(async move {
                let _ = inner.revoke(lease).await;
            });
        }
    }

    /// One keepalive of `lease`: its TTL counts again from now. `Ok(false)` when it is gone.
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<bool, NodeFailure> {
        let op = move |client: Client| -> BoxFuture<'static, _> {
            Box::pin(async move {
                match client.lease_client().keep_alive(lease).await {
                    Ok(_) => Ok(true),
                    Err(err) if lease_not_found(&err) => Ok(false),
                    Err(err) => Err(err),
                }
            })
        };
        self.call("lease keepalive", &op).await
    }
}

fn lease_not_found(err: &etcd_client::Error) -> bool {
    match err {
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::NotFound || status.message().contains("lease not found")
        }
        _ => false,
    }
}

/// The kind of an etcd client error, and what to say about it (never a password or token: etcd's
/// messages carry neither).
fn classify(err: &etcd_client::Error) -> (FailureKind, String) {
    use etcd_client::Error;
    use tonic::Code;
    let root = root_cause(err);
    let refused = root
        .downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused);
    let kind = match err {
        _ if refused => FailureKind::Refused,
        Error::GRpcStatus(status) => {
            let msg = status.message();
            match status.code() {
                Code::Unavailable if msg.contains("refused") => FailureKind::Refused,
                Code::Unavailable
                    if msg.contains("no leader")
                        || msg.contains("leader changed")
                        || msg.contains("not capable") =>
                {
                    FailureKind::Busy
                }
                Code::Unavailable if msg.contains("timed out") => FailureKind::Timeout,
                Code::Unavailable | Code::Unknown if msg.contains("connect") => FailureKind::Io,
                Code::Unavailable => FailureKind::Io,
                // A connection that broke under the request (reset, closed): tonic reports the
                // transport's failure as `Unknown` with that failure as its source, where a
                // status etcd sent has none. Transient, and the request may have been applied.
                Code::Unknown if std::error::Error::source(status).is_some() => FailureKind::Io,
                Code::DeadlineExceeded | Code::Cancelled => FailureKind::Timeout,
                Code::Unauthenticated => FailureKind::Auth,
                Code::InvalidArgument if msg.contains("auth") => FailureKind::Auth,
                Code::PermissionDenied => FailureKind::Permission,
                Code::ResourceExhausted => FailureKind::Busy,
                _ => FailureKind::Response,
            }
        }
        Error::TransportError(_)
        | Error::IoError(_)
        | Error::LeaseKeepAliveError(_)
        | Error::WatchError(_) => FailureKind::Io,
        _ => FailureKind::Response,
    };
    let mut detail = match err {
        Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    };
    let why = root.to_string();
    if !detail.contains(&why) {
        detail = format!("{detail}: {why}");
    }
    (kind, detail)
}

/// The innermost source of `err` (for a refused connection: the OS error).
fn root_cause(err: &etcd_client::Error) -> &(dyn std::error::Error + 'static) {
    // etcd-client's own error has no `source`: start from what it wraps.
    let mut cause: &(dyn std::error::Error + 'static) = match err {
        etcd_client::Error::GRpcStatus(status) => status,
        etcd_client::Error::TransportError(transport) => transport,
        etcd_client::Error::IoError(io) => io,
        other => other,
    };
    // Bounded: error chains are short, and a cycle would be a bug elsewhere.
    for _ in 0..16 {
        match cause.source() {
            Some(inner) => cause = inner,
            None => break,
        }
    }
    cause
}
