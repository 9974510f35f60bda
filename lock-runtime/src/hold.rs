//! One acquisition's life after the grant: validity, loss, release. This is the one place where
//! its outcome is decided, and every decision is reported to `events.rs`.
//!
//! The rules:
//! - a lock is lost once a server said "not yours", or once its validity deadline passed without a
//!   confirmed renewal, whichever the renewal driver or the holder notices first;
//! - a lost lock stays lost: no later answer (a release that finds the key, a late renewal)
//!   downgrades it, and a body's success never survives it;
//! - a release that cannot reach the servers does not undo a body that finished while the lock was
//!   still valid: it is retried in the background, and the lock expires by its TTL at the latest.

use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::acquire::{Granted, Request};
use crate::atomic_instant::AtomicInstant;
use crate::backend::{AtOnce, Backend, Mode, Names, Token};
use crate::error::{LockError, NodeFailure};
use crate::events::{self, Labels};
use crate::signal::{Raised, Signal};

/// One granted lock (one key or several), shared by its guard and the renewal driver.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) id: u64,
    /// Sorted, without duplicates.
    pub(crate) names: Names,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) mode: Mode,
    /// One per key with fencing, else empty.
    pub(crate) fences: Vec<u64>,
    acquired_at: Instant,
    /// When renewal stops and the body is told to stop (`max_hold`).
    pub(crate) max_hold: Option<Duration>,
    /// How long after the grant the keys stay, even when the holder lets go earlier.
    min_hold: Option<Duration>,
    /// What has happened to it (see [`Facts`]).
    facts: Facts,
    /// The validity deadline: the lock is ours until then, as far as the last confirmed grant or
    /// renewal shows. Only moves forward.
    valid_until: AtomicInstant,
    /// Raised when the lock is declared lost.
    lost: Signal,
    /// The key that was lost (index into `names`), written by whoever sets [`Facts::LOST`].
    lost_key: AtomicUsize,
    /// Raised when the holder must stop: the lock was lost (with `lost`) or `max_hold` passed.
    stop: Signal,
    /// Raised when the holder lets go (release, drop, shutdown): renewal stops, and guards that
    /// joined this hold no longer hold anything.
    released: Signal,
    pub(crate) labels: Labels,
    /// The acquisition's `distributed_lock` span.
    pub(crate) span: tracing::Span,
}

/// What has happened to a hold, one bit per fact in one word. A fact is set once and never
/// cleared; [`set`](Facts::set) says whether this call set it, so exactly one caller acts on it
/// (reports the loss, reports the end). Waking the holder is the [`Signal`]s' job: `lost` and
/// `stop` are raised after the fact is set, `released` stands for the release itself.
#[derive(Debug, Default)]
struct Facts(AtomicU8);

impl Facts {
    /// Declared lost (by the renewal driver, the validity deadline, a release that found the key
    /// taken, or `shutdown`).
    const LOST: u8 = 1;
    /// Declared lost by `shutdown` while it was still valid: its release still keeps the keys for
    /// `min_hold`.
    const KEPT_BY_SHUTDOWN: u8 = 1 << 1;
    /// `max_hold` passed: renewal stops and the body is told to stop.
    const MAX_HOLD_PASSED: u8 = 1 << 2;
    /// The hold's end was reported.
    const ENDED: u8 = 1 << 3;

    /// Sets `fact`; true when it was not set before.
    fn set(&self, fact: u8) -> bool {
        self.0.fetch_or(fact, Ordering::AcqRel) & fact == 0
    }

    fn has(&self, fact: u8) -> bool {
        self.0.load(Ordering::Acquire) & fact != 0
    }
}

impl Hold {
    pub(crate) fn new(req: Request, granted: Granted) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Hold {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            names: req.names,
            token: granted.token,
            ttl: req.ttl,
            mode: req.mode,
            fences: granted.fences,
            acquired_at: granted.at,
            max_hold: req.max_hold,
            min_hold: req.min_hold,
            facts: Facts::default(),
            valid_until: AtomicInstant::new(granted.valid_until),
            stop: Signal::default(),
            lost: Signal::default(),
            lost_key: AtomicUsize::new(0),
            released: Signal::default(),
            labels: req.labels,
            span: req.span,
        }
    }

    /// The first key, in errors about the whole lock.
    pub(crate) fn name(&self) -> &str {
        &self.names[0]
    }

    pub(crate) fn valid_until(&self) -> Instant {
        self.valid_until.load()
    }

    /// When the lock was granted.
    pub(crate) fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// When `max_hold` passes, if set.
    pub(crate) fn max_hold_at(&self) -> Option<Instant> {
        self.max_hold.and_then(|d| self.acquired_at.checked_add(d))
    }

    /// What is left at `now` of `min_hold` since the grant (`None`: nothing, or no `min_hold`).
    /// The grant's instant is when its answer arrived, after the server granted it: the keys
    /// then stay at least `min_hold` after the grant as the server saw it.
    fn min_hold_left(&self, now: Instant) -> Option<Duration> {
        let until = self.acquired_at.checked_add(self.min_hold?)?;
        Some(until.saturating_duration_since(now)).filter(|left| !left.is_zero())
    }

    /// How long a release at `now` leaves the keys: what is left of `min_hold`, unless the lock
    /// was lost before (by anything but [`shut_down`](Self::shut_down)).
    fn keep_for(&self, now: Instant, was_lost: bool) -> Option<Duration> {
        let lost = was_lost && !self.facts.has(Facts::KEPT_BY_SHUTDOWN);
        self.min_hold_left(now).filter(|_| !lost)
    }

    /// `lock_runtime::shutdown` takes the lock back: its holder sees it lost, but unless it was
    /// lost before, its keys are still left for the rest of `min_hold` (a scheduled job that ran
    /// must not run again elsewhere only because this process stopped).
    pub(crate) fn shut_down(&self) {
        if !self.check_lost() {
            self.facts.set(Facts::KEPT_BY_SHUTDOWN);
        }
        self.declare_lost(0, "lock_runtime::shutdown released it");
    }

    /// A renewal sent at some instant was confirmed: the lock is valid until `until`. A
    /// confirmed renewal always counts, even when it arrives after a later one.
    pub(crate) fn confirm(&self, until: Instant) {
        self.valid_until.fetch_max(until);
    }

    /// Whether the lock is lost: declared so, or past its validity deadline (then declared now).
    pub(crate) fn check_lost(&self) -> bool {
        self.check_lost_at(Instant::now())
    }

    fn check_lost_at(&self, now: Instant) -> bool {
        if self.lost.is_raised() {
            return true;
        }
        if now >= self.valid_until() {
            self.declare_lost(0, "validity deadline passed without a confirmed renewal");
            return true;
        }
        false
    }

    /// Declares the lock lost, naming the key at `index` (once; later calls do nothing).
    pub(crate) fn declare_lost(&self, index: usize, why: &str) {
        if self.is_released() || !self.facts.set(Facts::LOST) {
            return;
        }
        self.lost_key.store(index, Ordering::Release);
        // Reported before the holder is told, so the event comes first in any log.
        {
            let _in_span = self.span.enter();
            events::lost(&self.labels, self.lost_name(), why);
        }
        self.raise_lost();
    }

    /// Tells the holder that the lock is lost, which also means it must stop.
    fn raise_lost(&self) {
        self.lost.raise();
        self.stop.raise();
    }

    /// The key named in `Lost`.
    pub(crate) fn lost_name(&self) -> &str {
        let index = self.lost_key.load(Ordering::Acquire);
        self.names.get(index).unwrap_or(&self.names[0])
    }

    /// `max_hold` passed: renewal stops and the body is told to stop.
    pub(crate) fn pass_max_hold(&self) {
        if !self.facts.set(Facts::MAX_HOLD_PASSED) || self.is_released() {
            return;
        }
        self.stop.raise();
        let _in_span = self.span.enter();
        events::max_hold(self.name(), self.max_hold.unwrap_or_default());
    }

    pub(crate) fn max_hold_passed(&self) -> bool {
        self.facts.has(Facts::MAX_HOLD_PASSED)
    }

    pub(crate) fn is_declared_lost(&self) -> bool {
        self.lost.is_raised()
    }

    /// Resolves once the lock is declared lost.
    pub(crate) async fn lost(&self) {
        self.lost.raised().await;
    }

    /// Resolves once the holder must stop: lost, or `max_hold` passed.
    pub(crate) fn stopped(&self) -> Raised<'_> {
        self.stop.raised()
    }

    /// Resolves once the holder let go.
    pub(crate) fn released(&self) -> Raised<'_> {
        self.released.raised()
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.is_raised()
    }

    /// Lets go of the lock at `now`: renewal stops, and a "not yours" caused by this release is
    /// not a loss. Returns whether it was lost before (decided now, before the release request).
    pub(crate) fn let_go_at(&self, now: Instant) -> bool {
        let lost = self.check_lost_at(now);
        self.released.raise();
        lost
    }

    fn lost_error(&self) -> LockError {
        LockError::Lost {
            key: self.lost_name().to_owned(),
        }
    }
}

/// Releases `hold` and decides the outcome. `Err(Lost)` when it was lost before the release or
/// found taken by it; `Err(Unavailable)` when the servers could not be reached while the lock was
/// still valid. Before `min_hold` has passed the keys are not deleted but left to expire when it
/// passes (see [`let_go_request`]).
///
/// Also says whether the keys may still be there for want of an answer: the delete failed in a
/// way a retry may not (a timeout, a refused or broken connection), lost or not. The caller then
/// retries it in the background ([`crate::engine`]'s cleanup): the lock frees once a server
/// answers, not at the end of its TTL (on etcd, a leader change gives the lease its whole TTL
/// again).
pub(crate) async fn release(hold: &Hold, backend: &Backend) -> (Result<(), LockError>, bool) {
    let now = Instant::now();
    let was_lost = hold.let_go_at(now);
    let left = hold.keep_for(now, was_lost);
    let outcome = let_go_request(hold, backend, left).await;
    let unanswered = left.is_none()
        && outcome
            .as_ref()
            .is_err_and(|causes| causes.iter().all(|c| c.kind.is_transient()));
    if was_lost
        && !unanswered
        && let Err(causes) = &outcome
    {
        // Nobody retries it: the keys, if still ours, expire by their ttl.
        events::cleanup_failed(hold.name(), causes);
    }
    (settle(hold, was_lost, outcome), unanswered)
}

/// The request that lets go of the keys: delete them and wake their waiters, or, with `left` of
/// `min_hold`, leave them to expire then (compare the token, set the expiry; nobody is woken:
/// the key is not free, and waiters' pauses are capped by its time to live).
async fn let_go_request(
    hold: &Hold,
    backend: &Backend,
    left: Option<Duration>,
) -> Result<bool, Vec<NodeFailure>> {
    match left {
        Some(left) => {
            events::kept(left);
            backend.keep(&hold.names, &hold.token, left).await
        }
        None => {
            backend
                .release(&hold.names, &hold.token, hold.mode, true)
                .await
        }
    }
}

/// [`release`] on a node that answers at once (in memory), in place.
pub(crate) fn release_at_once(hold: &Hold, node: &dyn AtOnce) -> Result<(), LockError> {
    let now = Instant::now();
    let was_lost = hold.let_go_at(now);
    let ours = match hold.keep_for(now, was_lost) {
        Some(left) => {
            events::kept(left);
            node.keep_at_once(&hold.names, &hold.token, left, now)
        }
        None => node.release_at_once(&hold.names, &hold.token, hold.mode, true, now),
    };
    settle(hold, was_lost, Ok(ours))
}

/// The outcome of a release, given whether the lock was lost before it and what the servers said.
fn settle(
    hold: &Hold,
    was_lost: bool,
    outcome: Result<bool, Vec<NodeFailure>>,
) -> Result<(), LockError> {
    if hold.facts.set(Facts::ENDED) {
        events::ended(&hold.labels, hold.acquired_at);
    }
    match outcome {
        _ if was_lost => Err(hold.lost_error()),
        Ok(true) => {
            events::released(hold.acquired_at);
            Ok(())
        }
        Ok(false) => {
            // Not ours any more when we let go: someone may have held it meanwhile.
            hold.facts.set(Facts::LOST);
            events::lost(
                &hold.labels,
                hold.name(),
                "found taken or expired at release",
            );
            hold.raise_lost();
            Err(hold.lost_error())
        }
        Err(causes) => Err(LockError::Unavailable {
            key: hold.name().to_owned(),
            causes,
        }),
    }
}

/// How a locked body ended, for [`verdict`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// It returned a success.
    Succeeded,
    /// It returned its own error.
    Failed,
    /// It was stopped (dropped at an `.await`) because the lock was lost or `max_hold` passed.
    Stopped,
}

impl Body {
    /// How a body that returned `out` (`None`: it was stopped) ended.
    pub(crate) fn of<R>(out: Option<&R>, is_success: impl FnOnce(&R) -> bool) -> Body {
        match out {
            Some(out) if is_success(out) => Body::Succeeded,
            Some(_) => Body::Failed,
            None => Body::Stopped,
        }
    }
}

/// What a locked call returns, given how its body ended and the release's outcome: the body's
/// result (`Ok`), or the error that replaces it. A success never survives a loss or a passed
/// `max_hold`; the body's own error stays (it says more about what happened).
pub(crate) fn verdict(
    hold: &Hold,
    body: Body,
    released: Result<(), LockError>,
) -> Result<(), LockError> {
    let replaced = body != Body::Failed;
    if hold.max_hold_passed() && replaced {
        return Err(LockError::MaxHoldExceeded {
            key: hold.name().to_owned(),
            max_hold: hold.max_hold.unwrap_or_default(),
        });
    }
    match released {
        Err(lost @ LockError::Lost { .. }) if replaced => Err(lost),
        _ if body == Body::Stopped => Err(hold.lost_error()),
        Ok(()) | Err(LockError::Lost { .. }) => Ok(()),
        Err(err) => {
            events::release_failed(hold.name(), &err);
            Ok(())
        }
    }
}

/// A locked call's result from its [`verdict`] and the body's output (`None`: stopped): the
/// body's, or the error that replaces it.
pub(crate) fn call_result<R>(
    verdict: Result<(), LockError>,
    out: Option<R>,
) -> Result<R, LockError> {
    match (verdict, out) {
        (Ok(()), Some(out)) => Ok(out),
        (Err(err), _) => Err(err),
        // `verdict` answers an error for every stopped body; this is only its fallback.
        (Ok(()), None) => Err(LockError::Runtime {
            reason: "the body was stopped but no loss was recorded".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn hold(max_hold: Option<Duration>) -> Hold {
        let names: Names = vec![Arc::from("a"), Arc::from("b")].into();
        let granted = Granted {
            token: Token::new(&crate::owner::Identity::new(None), Instant::now()),
            fences: vec![1, 2],
            valid_until: Instant::now() + Duration::from_secs(30),
            at: Instant::now(),
        };
        let req = Request {
            names,
            ttl: Duration::from_secs(30),
            asked_at: Instant::now(),
            give_up: None,
            fencing: true,
            mode: Mode::Exclusive,
            max_hold,
            min_hold: None,
            labels: Labels {
                lock: Arc::from("test"),
                backend: crate::backend::BackendKind::Memory,
            },
            span: tracing::Span::none(),
        };
        Hold::new(req, granted)
    }

    fn lost(key: &str) -> Result<(), LockError> {
        Err(LockError::Lost {
            key: key.to_owned(),
        })
    }

    #[test]
    fn a_success_never_survives_a_loss() {
        let h = hold(None);
        assert_eq!(verdict(&h, Body::Succeeded, Ok(())), Ok(()));
        assert_eq!(verdict(&h, Body::Succeeded, lost("b")), lost("b"));
        // The body's own error stays.
        assert_eq!(verdict(&h, Body::Failed, lost("b")), Ok(()));
        // A release that could not reach the servers does not undo a body that finished in time.
        let unavailable = Err(LockError::Unavailable {
            key: "a".to_owned(),
            causes: Vec::new(),
        });
        assert_eq!(verdict(&h, Body::Succeeded, unavailable), Ok(()));
        // Stopped by a loss: `Lost`, naming the lost key.
        h.declare_lost(1, "test");
        assert_eq!(verdict(&h, Body::Stopped, Ok(())), lost("b"));
    }

    #[test]
    fn a_passed_max_hold_replaces_a_success() {
        let h = hold(Some(Duration::from_millis(5)));
        h.pass_max_hold();
        let exceeded = Err(LockError::MaxHoldExceeded {
            key: "a".to_owned(),
            max_hold: Duration::from_millis(5),
        });
        assert_eq!(verdict(&h, Body::Stopped, Ok(())), exceeded);
        assert_eq!(verdict(&h, Body::Succeeded, Ok(())), exceeded);
        assert_eq!(verdict(&h, Body::Failed, Ok(())), Ok(()));
    }

    #[test]
    fn validity_only_moves_forward() {
        let h = hold(None);
        let later = h.valid_until() + Duration::from_secs(5);
        h.confirm(later);
        h.confirm(later - Duration::from_secs(10));
        assert_eq!(h.valid_until(), AtomicInstant::new(later).load());
        assert!(!h.check_lost());
    }
}
