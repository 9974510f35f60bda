//! A one-way flag that tasks can wait on, where a cancellation token's tree is not needed: a
//! `tokio_util` `CancellationToken` takes a mutex on every clone and every child, which showed in
//! every acquire and release (two to four tokens per lock).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub(crate) struct Signal {
    raised: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Raises the flag and wakes every waiter. Later calls do nothing.
    pub(crate) fn raise(&self) {
        if !self.raised.swap(true, Ordering::AcqRel) {
            self.notify.notify_waiters();
        }
    }

    pub(crate) fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Resolves once the flag is raised (at once if it is).
    pub(crate) fn raised(&self) -> Raised<'_> {
        Raised {
            signal: self,
            notified: self.notify.notified(),
        }
    }
}

pin_project_lite::pin_project! {
    /// [`Signal::raised`]: a future of a type of its own (not an `async fn`'s), so that futures
    /// that hold one are written out and compiled once, not for every body they wrap.
    #[derive(Debug)]
    pub(crate) struct Raised<'a> {
        signal: &'a Signal,
        #[pin]
        notified: tokio::sync::futures::Notified<'a>,
    }
}

impl Future for Raised<'_> {
    type Output = ();

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        loop {
            // Registered before the check, so a `raise` between the two still wakes it.
            this.notified.as_mut().enable();
            if this.signal.is_raised() {
                return Poll::Ready(());
            }
            std::task::ready!(this.notified.as_mut().poll(cx));
            this.notified.set(this.signal.notify.notified());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Signal;

    #[tokio::test]
    async fn waiters_before_and_after_the_raise_both_resolve() {
        let signal = Arc::new(Signal::default());
        let early = tokio::spawn({
            let signal = Arc::clone(&signal);
            async move { signal.raised().await }
        });
        tokio::task::yield_now().await;
        assert!(!early.is_finished());
        signal.raise();
        let woken = tokio::time::timeout(Duration::from_secs(5), early).await;
        assert!(
            matches!(woken, Ok(Ok(()))),
            "the waiter was not woken: {woken:?}"
        );
        let at_once = tokio::time::timeout(Duration::from_secs(5), signal.raised()).await;
        assert!(at_once.is_ok(), "a raised signal did not resolve at once");
        assert!(signal.is_raised());
    }
}
