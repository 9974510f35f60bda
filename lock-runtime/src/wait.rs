//! The pieces of waiting for a held lock: the per-client registry that release notifications wake,
//! and the jittered backoff between attempts. The strategy that combines them is in `acquire.rs`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Settings;

/// Per client: one wake-up signal per lock name that somebody in this process waits on. Nodes bump
/// a name's signal when they learn of its release (Redis pub/sub, or in memory directly).
#[derive(Debug, Default)]
pub(crate) struct WakeRegistry {
    names: Mutex<HashMap<String, Slot>>,
}

#[derive(Debug)]
struct Slot {
    /// The number of releases so far, and the ticket of the waiter the last one was for (0: for
    /// everyone).
    tx: watch::Sender<(u64, u64)>,
    waiters: usize,
}

impl WakeRegistry {
    /// Starts watching `name`: every later [`notify`](Self::notify) of it wakes the handle.
    pub(crate) fn watch(self: &Arc<Self>, name: &str) -> WakeHandle {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = names.entry(name.to_owned()).or_insert_with(|| Slot {
            tx: watch::channel((0, 0)).0,
            waiters: 0,
        });
        slot.waiters += 1;
        let rx = slot.tx.subscribe();
        let seen = rx.borrow().0;
        WakeHandle {
            seen,
            rx,
            ticket: None,
            registry: Arc::clone(self),
            name: name.to_owned(),
        }
    }

    /// `name` was released.
    pub(crate) fn notify(&self, name: &str) {
        self.notify_for(name, 0);
    }

    /// `name` was released and handed to the fair waiter holding `ticket` (0: to nobody in
    /// particular, which wakes every waiter).
    pub(crate) fn notify_for(&self, name: &str, ticket: u64) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = names.get(name) {
            slot.tx.send_modify(|n| *n = (n.0.wrapping_add(1), ticket));
        }
    }

    /// Wakes every waiter, e.g. after a notification connection broke and releases may have been missed.
    pub(crate) fn notify_all(&self) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        for slot in names.values() {
            slot.tx.send_modify(|n| *n = (n.0.wrapping_add(1), 0));
        }
    }

    fn forget(&self, name: &str) {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(slot) = names.get_mut(name) {
            slot.waiters -= 1;
            if slot.waiters == 0 {
                names.remove(name);
            }
        }
    }
}

/// One waiter's view of a lock's releases. Dropping it stops watching.
#[derive(Debug)]
pub(crate) struct WakeHandle {
    rx: watch::Receiver<(u64, u64)>,
    /// The release count at the last `mark_seen` or wake-up.
    seen: u64,
    /// A fair waiter's place in the queue: releases handed to other waiters do not wake it.
    ticket: Option<u64>,
    registry: Arc<WakeRegistry>,
    name: String,
}

impl WakeHandle {
    /// Forget releases seen so far: call right before an attempt, so that a release after the
    /// attempt's answer is seen by [`released`](Self::released).
    pub(crate) fn mark_seen(&mut self) {
        self.seen = self.rx.borrow_and_update().0;
    }

    /// From now on only releases handed to `ticket`, or to nobody in particular, wake this
    /// handle (`None`: every release).
    pub(crate) fn set_ticket(&mut self, ticket: Option<u64>) {
        self.ticket = ticket;
    }

    /// Resolves at the next release after [`mark_seen`](Self::mark_seen) that is for this
    /// waiter. When several releases came at once and only the last is known, it wakes too: the
    /// one before may have been for this waiter.
    pub(crate) async fn released(&mut self) {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let (count, ticket) = *self.rx.borrow_and_update();
            let missed = count.wrapping_sub(self.seen) > 1;
            self.seen = count;
            if missed || ticket == 0 || self.ticket.is_none_or(|mine| mine == ticket) {
                return;
            }
        }
    }
}

impl Drop for WakeHandle {
    fn drop(&mut self) {
        self.registry.forget(&self.name);
    }
}

/// Delays between attempts while waiting: exponential from `retry_delay` up to 8x, each jittered.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    jitter: f64,
    step: u32,
}

impl Backoff {
    pub(crate) fn new(settings: &Settings) -> Self {
        Backoff {
            base: settings.retry_delay,
            jitter: settings.retry_jitter,
            step: 0,
        }
    }

    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = self.base.saturating_mul(1 << self.step.min(3));
        self.step = self.step.saturating_add(1);
        let factor = 1.0 - self.jitter + 2.0 * self.jitter * fastrand::f64();
        Duration::try_from_secs_f64(nominal.as_secs_f64() * factor).unwrap_or(nominal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_inside_bounds() {
        let settings = Settings::with_retry_delay(Duration::from_millis(100));
        let mut backoff = Backoff::new(&settings);
        let delays: Vec<Duration> = (0..6).map(|_| backoff.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let nominal = Duration::from_millis(100) * (1 << i.min(3));
            assert!(*d >= nominal / 2 && *d <= nominal * 3 / 2, "{i}: {d:?}");
        }
    }

    #[tokio::test]
    async fn a_release_after_mark_seen_wakes_the_waiter() {
        let registry = Arc::new(WakeRegistry::default());
        let mut handle = registry.watch("c");
        registry.notify("c");
        handle.mark_seen();
        registry.notify("c");
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken"));
        drop(handle);
        assert!(registry.names.lock().map(|c| c.is_empty()).unwrap_or(false));
    }

    #[tokio::test]
    async fn a_fair_waiter_sleeps_through_hand_offs_to_others() {
        let registry = Arc::new(WakeRegistry::default());
        let mut handle = registry.watch("f");
        handle.set_ticket(Some(7));
        handle.mark_seen();
        registry.notify_for("f", 3);
        // The notification is already there: one poll sees it, and must not wake.
        let early = futures_util::FutureExt::now_or_never(handle.released());
        assert!(early.is_none(), "woken by a hand-off to ticket 3");
        registry.notify_for("f", 7);
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by its own hand-off"));
        // A release for nobody in particular wakes it too.
        handle.mark_seen();
        registry.notify("f");
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by a plain release"));
    }
}
