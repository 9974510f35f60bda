//! One acquisition's life after the grant: validity, loss, release. This is the one place where
//! its outcome is decided, and every decision is reported to `events.rs`.
//!
//! The rules:
//! - a lock is lost once a server said "not yours", or once its validity deadline passed without a
//!   confirmed renewal, whichever the renewal driver or the holder notices first;
//! - a lost lock stays lost: no later answer (a release that finds the key, a late renewal)
//!   downgrades it, and a body's success never survives it;
//! - a release that cannot reach the servers does not undo a body that finished while the lock was
//!   still valid: the lock expires by its TTL.

use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Token};
use crate::error::LockError;
use crate::events;

/// The process-wide origin of the atomic deadlines below.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn to_nanos(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

fn from_nanos(nanos: u64) -> Instant {
    *EPOCH + Duration::from_nanos(nanos)
}

/// One granted lock, shared by its guard and the renewal driver.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) id: u64,
    pub(crate) name: std::sync::Arc<str>,
    pub(crate) token: Token,
    pub(crate) ttl: Duration,
    pub(crate) fence: Option<u64>,
    acquired_at: Instant,
    /// The validity deadline: the lock is ours until then, as far as the last confirmed grant or
    /// renewal shows. Only moves forward.
    valid_until: AtomicU64,
    /// Cancelled when the lock is declared lost.
    lost: CancellationToken,
    /// Set when the holder lets go (release, drop, shutdown): renewal stops.
    released: AtomicBool,
}

impl Hold {
    pub(crate) fn new(
        name: std::sync::Arc<str>,
        token: Token,
        ttl: Duration,
        fence: Option<u64>,
        valid_until: Instant,
    ) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        Hold {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name,
            token,
            ttl,
            fence,
            acquired_at: Instant::now(),
            valid_until: AtomicU64::new(to_nanos(valid_until)),
            lost: CancellationToken::new(),
            released: AtomicBool::new(false),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// A renewal sent at some instant was confirmed: the lock is valid until `until`. A
    /// confirmed renewal always counts, even when it arrives after a later one.
    pub(crate) fn confirm(&self, until: Instant) {
        self.valid_until
            .fetch_max(to_nanos(until), Ordering::AcqRel);
    }

    /// Whether the lock is lost: declared so, or past its validity deadline (then declared now).
    pub(crate) fn check_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if Instant::now() >= self.valid_until() {
            self.declare_lost("validity deadline passed without a confirmed renewal");
            return true;
        }
        false
    }

    /// Declares the lock lost (once; later calls do nothing).
    pub(crate) fn declare_lost(&self, why: &str) {
        if self.is_released() || self.lost.is_cancelled() {
            return;
        }
        self.lost.cancel();
        events::lost(&self.name, why);
    }

    pub(crate) fn is_declared_lost(&self) -> bool {
        self.lost.is_cancelled()
    }

    /// Resolves once the lock is declared lost.
    pub(crate) fn lost(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.lost.cancelled()
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Lets go of the lock: renewal stops, and a "not yours" caused by this release is not a loss.
    /// Returns whether it was lost before (decided now, before the release request).
    pub(crate) fn let_go(&self) -> bool {
        let lost = self.check_lost();
        self.released.store(true, Ordering::Release);
        lost
    }
}

/// Releases `hold` and decides the outcome. `Err(Lost)` when it was lost before the release or
/// found taken by it; `Err(Unavailable)` when the servers could not be reached while the lock was
/// still valid (it then expires by its TTL).
pub(crate) async fn release(hold: &Hold, backend: &Backend) -> Result<(), LockError> {
    let was_lost = hold.let_go();
    let outcome = backend.release(&hold.name, &hold.token, true).await;
    let lost = || LockError::Lost {
        key: hold.name.to_string(),
    };
    match outcome {
        _ if was_lost => {
            if let Err(causes) = outcome {
                events::cleanup_failed(&hold.name, &causes);
            }
            Err(lost())
        }
        Ok(true) => {
            events::released(&hold.name, hold.acquired_at.elapsed());
            Ok(())
        }
        Ok(false) => {
            // Not ours any more when we let go: someone may have held it meanwhile.
            hold.lost.cancel();
            events::lost(&hold.name, "found taken or expired at release");
            Err(lost())
        }
        Err(causes) => Err(LockError::Unavailable {
            key: hold.name.to_string(),
            causes,
        }),
    }
}

/// What a locked call returns, given the body's outcome (`None`: cancelled because the lock was
/// lost; `Some(true)` for a success) and the release's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The body's own result.
    Body,
    /// `Err(Lost)`: the body's success (or cancellation) does not survive the loss.
    Lost,
}

pub(crate) fn verdict(
    name: &str,
    body_ok: Option<bool>,
    released: &Result<(), LockError>,
) -> Verdict {
    match (body_ok, released) {
        (None, _) | (Some(true), Err(LockError::Lost { .. })) => Verdict::Lost,
        // The body's own error stays: it says more than "lost" about what happened.
        (Some(false), Err(LockError::Lost { .. })) | (Some(_), Ok(())) => Verdict::Body,
        (Some(_), Err(err)) => {
            events::release_failed(name, err);
            Verdict::Body
        }
    }
}
