use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tracing::Instrument as _;

use crate::bridge;
use crate::engine::Engine;
use crate::error::LockError;
use crate::hold::{self, Hold};
use crate::scope::{self, TaskScope};
use crate::signal::Raised;

/// Proof that this process holds a lock. The lock is renewed in the background while the guard
/// lives, and released by [`release`](Self::release), [`release_blocking`](Self::release_blocking),
/// or (as a fallback, without reporting the outcome) when the guard is dropped.
///
/// Dropping never blocks: the release is sent from the runtime that hosts the client, and
/// [`shutdown`](crate::shutdown) waits for it.
#[must_use = "the lock is released when the guard is dropped"]
pub struct LockGuard {
    engine: Arc<Engine>,
    hold: Arc<Hold>,
    /// Set once the release was started (by `release*`, or by the drop).
    released: bool,
    /// A nested call that joined the hold of its task or thread: the outermost guard releases.
    /// Once it did, this guard holds nothing: it reports the lock lost (it may have escaped the
    /// outer call, and someone else may hold the key by now).
    joined: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("keys", &self.hold.names)
            .field("fencing_tokens", &self.hold.fences)
            .field("lost", &self.is_lost())
            .field("joined", &self.joined)
            .finish_non_exhaustive()
    }
}

impl LockGuard {
    pub(crate) fn new(engine: Arc<Engine>, hold: Arc<Hold>) -> Self {
        LockGuard {
            engine,
            hold,
            released: false,
            joined: false,
        }
    }

    /// A guard for a nested call that joins `hold`, held by its task or thread: `Err(Lost)` when
    /// that hold is lost already.
    pub(crate) fn joined(engine: Arc<Engine>, hold: Arc<Hold>) -> Result<Self, LockError> {
        if hold.check_lost() || hold.is_released() {
            return Err(LockError::Lost {
                key: hold.lost_name().to_owned(),
            });
        }
        Ok(LockGuard {
            engine,
            hold,
            released: false,
            joined: true,
        })
    }

    /// The key, as passed to [`Lock::new`](crate::Lock::new) (without the configured prefix);
    /// for a lock over several keys, the first in canonical (sorted) order.
    pub fn key(&self) -> &str {
        self.hold.name()
    }

    /// The keys of this lock, in canonical order: sorted, without duplicates.
    pub fn keys(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.hold.names.iter().map(|name| &**name)
    }

    /// A number that grows with every grant of this key, so a resource can reject writes from a
    /// holder that has been superseded. `None` when fencing is off: by default in Redlock mode, or
    /// when turned off with [`LockConfig::fencing`](crate::LockConfig::fencing). For a lock over
    /// several keys, the first key's; see [`fencing_token_of`](Self::fencing_token_of).
    ///
    /// On Redis no token is below its grant's server clock in microseconds (less 100 ms when
    /// the client took the lock with its one-transaction path), so tokens keep growing across
    /// what loses the counter or its last grants: a restart without the data, an evicted
    /// counter, a failover to a replica that missed grants (Sentinel, Cluster). That holds as
    /// long as the clock does not go back by more than the time between the two grants, less
    /// 100 ms. On etcd the token is the key's revision.
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fences.first().copied()
    }

    /// The fencing token of `key`, one of this lock's keys (`None` for another key, or when
    /// fencing is off).
    pub fn fencing_token_of(&self, key: &str) -> Option<u64> {
        let index = self.hold.names.iter().position(|name| &**name == key)?;
        self.hold.fences.get(index).copied()
    }

    /// True once the lock has been lost: renewal was refused, or its validity ran out before a
    /// renewal was confirmed (checked now, on the monotonic clock). A lost lock stays lost.
    ///
    /// A guard of a nested call that joined an outer hold (see
    /// [`Lock::reentrant`](crate::Lock::reentrant)) is also lost once the outer holder released.
    pub fn is_lost(&self) -> bool {
        self.hold.check_lost() || (self.joined && self.hold.is_released())
    }

    /// Resolves when the lock is declared lost (never, if it is released first while still held),
    /// or, for a guard that joined an outer hold, when the outer holder released.
    #[allow(clippy::manual_async_fn, reason = "the signature promises `Send`")]
    pub fn lost(&self) -> impl Future<Output = ()> + Send + '_ {
        async move {
            if self.joined {
                tokio::select! {
                    () = self.hold.lost() => {}
                    () = self.hold.released() => {}
                }
            } else {
                self.hold.lost().await;
            }
        }
    }

    /// Releases the lock. `Err(Lost)` when it was no longer ours (lost before, or found taken at
    /// release); `Err(Unavailable)` when the servers could not be reached while the lock was still
    /// valid. A release no server answered (a timeout, a refused or broken connection) goes on in
    /// the background until one does, for up to a minute (or the TTL when longer): the lock frees
    /// once the servers are back, or at the latest by its TTL.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.released = true;
        if self.joined {
            return self.joined_outcome();
        }
        if let Some(released) = self.engine.release_at_once(&self.hold) {
            return released;
        }
        let (engine, hold) = (Arc::clone(&self.engine), Arc::clone(&self.hold));
        let span = self.hold.span.clone();
        bridge::run_untold(&self.engine.runtime, move || {
            async move { engine.release(&hold).await }.instrument(span)
        })
        .await?
    }

    /// Releases the lock from sync code (blocks this thread, also inside an async runtime).
    pub fn release_blocking(mut self) -> Result<(), LockError> {
        self.released = true;
        if self.joined {
            return self.joined_outcome();
        }
        if let Some(released) = self.engine.release_at_once(&self.hold) {
            return released;
        }
        let (engine, hold) = (Arc::clone(&self.engine), Arc::clone(&self.hold));
        bridge::run_blocking(
            &self.engine.runtime,
            async move { engine.release(&hold).await },
        )?
    }
}

pin_project_lite::pin_project! {
    /// [`LockGuard::until_stopped`]: the body first, then whether the lock stopped. Only the body
    /// is generic: what wraps it (the scope, the span, the signals) is compiled once, not for
    /// every locked function.
    pub(crate) struct UntilStopped<'a, F> {
        #[pin]
        body: F,
        #[pin]
        stopped: Raised<'a>,
        // A joined hold's: the outer holder let go.
        #[pin]
        released: Option<Raised<'a>>,
        scope: Option<TaskScope>,
        span: Option<tracing::Span>,
    }
}

impl<F: Future> Future for UntilStopped<'_, F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let _in_span = this.span.as_ref().map(tracing::Span::enter);
        let _in_scope = this.scope.as_mut().map(TaskScope::enter);
        if let Poll::Ready(out) = this.body.poll(cx) {
            return Poll::Ready(Some(out));
        }
        stopped(this.stopped, this.released, cx).map(|()| None)
    }
}

/// Whether a body's lock stopped (lost, `max_hold`), or its outer holder let go.
fn stopped(
    stopped: Pin<&mut Raised<'_>>,
    released: Pin<&mut Option<Raised<'_>>>,
    cx: &mut Context<'_>,
) -> Poll<()> {
    if stopped.poll(cx).is_ready() {
        return Poll::Ready(());
    }
    match released.as_pin_mut() {
        Some(released) => released.poll(cx),
        None => Poll::Pending,
    }
}

impl LockGuard {
    /// A joined guard lets go without releasing: the outermost holder releases.
    fn joined_outcome(&self) -> Result<(), LockError> {
        if self.is_lost() {
            Err(LockError::Lost {
                key: self.hold.lost_name().to_owned(),
            })
        } else {
            Ok(())
        }
    }

    /// Runs an async body inside this lock's reentrancy scope until it completes, or until the
    /// lock is lost or `max_hold` passes (then `None`: the body is dropped at its `.await`).
    pub(crate) fn until_stopped<F: Future>(&self, body: F) -> UntilStopped<'_, F> {
        let (scope, span, released) = if self.joined {
            // The outer holder's release ends this hold too; its scope and span are the body's.
            (None, None, Some(self.hold.released()))
        } else {
            (
                Some(TaskScope::new(self.engine.id(), &self.hold)),
                Some(self.hold.span.clone()),
                None,
            )
        };
        UntilStopped {
            body,
            stopped: self.hold.stopped(),
            released,
            scope,
            span,
        }
    }

    /// Runs a sync body inside this lock's reentrancy scope (of this thread).
    pub(crate) fn in_scope_blocking<R>(&self, body: impl FnOnce() -> R) -> R {
        if self.joined {
            body()
        } else {
            let _in_span = self.hold.span.enter();
            scope::enter_blocking(self.engine.id(), &self.hold, body)
        }
    }

    /// Releases after a body and decides what the call returns (see `hold::verdict`).
    pub(crate) async fn finish(self, body: hold::Body) -> Result<(), LockError> {
        let hold = Arc::clone(&self.hold);
        let released = self.release().await;
        hold::verdict(&hold, body, released)
    }

    /// [`finish`](Self::finish) for sync bodies.
    pub(crate) fn finish_blocking(self, body: hold::Body) -> Result<(), LockError> {
        let hold = Arc::clone(&self.hold);
        let released = self.release_blocking();
        hold::verdict(&hold, body, released)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released && !self.joined {
            // Early return, panic, cancelled future: the release runs on the hosting runtime.
            self.engine.release_in_background(&self.hold);
        }
    }
}
