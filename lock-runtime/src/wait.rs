//! The pieces of waiting for a held lock: the per-client registry that release notifications wake,
//! and the jittered backoff between attempts. The strategy that combines them is in
//! `acquire/waiting.rs`.

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
    tx: watch::Sender<Release>,
    waiters: usize,
}

/// The releases of a name a [`WakeRegistry`] learnt of: how many so far, and the last few.
#[derive(Debug, Clone, Copy, Default)]
struct Release {
    count: u64,
    /// Release `n` is at `n % RECENT`: a waiter that slept through several still finds its own.
    recent: [Handed; RECENT],
}

/// How many releases of a name a waiter can sleep through and still be told which was its own.
const RECENT: usize = 8;

/// Whom one release was for.
#[derive(Debug, Clone, Copy, Default)]
struct Handed {
    /// The ticket of the fair waiter it was handed to (0: to nobody in particular).
    ticket: u64,
    /// What the release told that waiter, when it did.
    hand_off: Option<HandOff>,
}

impl Release {
    fn next(&mut self, handed: Handed) {
        self.count = self.count.wrapping_add(1);
        self.recent[(self.count % RECENT as u64) as usize] = handed;
    }
}

/// What a fair lock's release tells the waiter it handed the lock to: enough to take it without
/// asking the server again, for the place in line it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandOff {
    /// The place in line the lock was handed to: the lock lives as long as that place's lease
    /// did, so only the answer that renewed that place tells how long it is valid.
    pub(crate) ticket: u64,
    /// The lock's fencing token after the hand-off (0: not known, so the waiter asks).
    pub(crate) fence: u64,
    /// [`Token::digest`](crate::backend::Token::digest) of the new holder's token.
    pub(crate) digest: u64,
}

impl WakeRegistry {
    /// Starts watching `name`: every later [`notify`](Self::notify) of it wakes the handle.
    pub(crate) fn watch(self: &Arc<Self>, name: &str) -> WakeHandle {
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        let slot = names.entry(name.to_owned()).or_insert_with(|| Slot {
            tx: watch::channel(Release::default()).0,
            waiters: 0,
        });
        slot.waiters += 1;
        let rx = slot.tx.subscribe();
        let seen = rx.borrow().count;
        WakeHandle {
            seen,
            rx,
            ticket: None,
            digest: None,
            registry: Arc::clone(self),
            name: name.to_owned(),
        }
    }

    /// `name` was released.
    pub(crate) fn notify(&self, name: &str) {
        self.notify_for(name, 0, None);
    }

    /// `name` was released and handed to the fair waiter holding `ticket` (0: to nobody in
    /// particular, which wakes every waiter), telling it `hand_off` when known.
    pub(crate) fn notify_for(&self, name: &str, ticket: u64, hand_off: Option<HandOff>) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        // Nobody in this client waits for any lock (the uncontended case): skip hashing the name.
        if names.is_empty() {
            return;
        }
        if let Some(slot) = names.get(name) {
            slot.tx.send_modify(|r| r.next(Handed { ticket, hand_off }));
        }
    }

    /// Wakes every waiter, e.g. after a notification connection broke and releases may have been missed.
    pub(crate) fn notify_all(&self) {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        for slot in names.values() {
            slot.tx.send_modify(|r| r.next(Handed::default()));
        }
    }

    /// How many releases of `name` this client heard while someone in it waited for `name`
    /// (0 when nobody does): two readings differ when one was heard in between.
    pub(crate) fn heard(&self, name: &str) -> u64 {
        let names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        names.get(name).map_or(0, |slot| slot.tx.borrow().count)
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
    rx: watch::Receiver<Release>,
    /// The release count at the last `mark_seen` or wake-up.
    seen: u64,
    /// A fair waiter's place in the queue: releases handed to other waiters do not wake it.
    ticket: Option<u64>,
    /// The waiter's [`Token::digest`](crate::backend::Token::digest): a hand-off that names it
    /// is for this waiter, whatever its ticket.
    digest: Option<u64>,
    registry: Arc<WakeRegistry>,
    name: String,
}

impl WakeHandle {
    /// Forget releases seen so far: call right before an attempt, so that a release after the
    /// attempt's answer is seen by [`released`](Self::released).
    pub(crate) fn mark_seen(&mut self) {
        self.seen = self.rx.borrow_and_update().count;
    }

    /// From now on only releases handed to `ticket`, or to nobody in particular, wake this
    /// handle (`None`: every release but those whose message handed the lock to a waiter).
    pub(crate) fn set_ticket(&mut self, ticket: Option<u64>) {
        self.ticket = ticket;
    }

    /// The digest of the waiter's token: from now on a hand-off that names it wakes the handle,
    /// whatever [`set_ticket`](Self::set_ticket) said. Under Redlock each node keeps its own
    /// line, so the ticket of the waiter's last answer may be another node's than the one that
    /// hands it the lock (or missing: the answer came before that node's).
    pub(crate) fn set_digest(&mut self, digest: u64) {
        self.digest = Some(digest);
    }

    /// Resolves at the next release after [`mark_seen`](Self::mark_seen) that is for this
    /// waiter, with what the release said when it was handed to this waiter's ticket. Releases
    /// handed to other tickets are slept through; when more came than it can tell apart, it
    /// wakes (with nothing), since one of them may have been for this waiter.
    pub(crate) async fn released(&mut self) -> Option<HandOff> {
        loop {
            if self.rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            let last = *self.rx.borrow_and_update();
            let new = last.count.wrapping_sub(self.seen);
            let first = self.seen.wrapping_add(1);
            self.seen = last.count;
            if new > RECENT as u64 {
                return None;
            }
            let handed =
                (0..new).map(|i| last.recent[(first.wrapping_add(i) % RECENT as u64) as usize]);
            let mut for_me = false;
            for h in handed {
                if let Some(mine) = h.hand_off.filter(|o| Some(o.digest) == self.digest) {
                    return Some(mine);
                }
                match self.ticket {
                    Some(mine) if h.ticket == mine => return h.hand_off,
                    Some(_) => for_me |= h.ticket == 0,
                    // A lock handed to a waiter (its release said so) is held again: a waiter
                    // without a ticket sleeps through it.
                    None => for_me |= h.hand_off.is_none(),
                }
            }
            if for_me {
                return None;
            }
        }
    }
}

impl Drop for WakeHandle {
    fn drop(&mut self) {
        self.registry.forget(&self.name);
    }
}

/// Delays between attempts while waiting: doubling from `retry_delay`, each jittered. Behind a
/// holder whose release announces nothing (another library's lock on the same key, or a key
/// deleted by hand), never longer than [`longest`](Self::longest) (300 ms by default): the
/// waiter notices such a release within that. Behind a holder whose release tells the waiter
/// ([`next_announced_delay`](Self::next_announced_delay)), the delays are a safety net for a
/// lost message and grow to [`longest_announced`](Self::longest_announced) (1.2 s by default).
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    jitter: f64,
    longest: Duration,
    step: u32,
}

impl Backoff {
    /// How many times the delay doubles behind a holder whose release is announced: up to
    /// 8 x `retry_delay`, jittered.
    const ANNOUNCED_DOUBLINGS: u32 = 3;

    pub(crate) fn new(settings: &Settings) -> Self {
        Backoff {
            base: settings.retry_delay,
            jitter: settings.retry_jitter,
            longest: Self::longest(settings),
            step: 0,
        }
    }

    /// The longest pause between two attempts: `2 x retry_delay x (1 + retry_jitter)`, the
    /// longest jittered second delay.
    fn longest(settings: &Settings) -> Duration {
        Self::jittered(
            settings.retry_delay.saturating_mul(2),
            1.0 + settings.retry_jitter,
        )
    }

    /// The longest pause behind a holder whose release is announced:
    /// `8 x retry_delay x (1 + retry_jitter)`.
    pub(crate) fn longest_announced(&self) -> Duration {
        Self::jittered(
            self.base.saturating_mul(1 << Self::ANNOUNCED_DOUBLINGS),
            1.0 + self.jitter,
        )
    }

    /// The next pause behind a holder whose release announces nothing, or after a failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        self.next(2).min(self.longest)
    }

    /// The next pause behind a holder whose release will tell the waiter.
    pub(crate) fn next_announced_delay(&mut self) -> Duration {
        self.next(Self::ANNOUNCED_DOUBLINGS)
    }

    fn next(&mut self, doublings: u32) -> Duration {
        let nominal = self.base.saturating_mul(1 << self.step.min(doublings));
        self.step = self.step.saturating_add(1);
        Self::jittered(
            nominal,
            1.0 - self.jitter + 2.0 * self.jitter * fastrand::f64(),
        )
    }

    fn jittered(nominal: Duration, factor: f64) -> Duration {
        Duration::try_from_secs_f64(nominal.as_secs_f64() * factor).unwrap_or(nominal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_up_to_the_longest_pause() {
        let settings = Settings::with_retry_delay(Duration::from_millis(100));
        assert_eq!(Backoff::longest(&settings), Duration::from_millis(300));
        let mut backoff = Backoff::new(&settings);
        let delays: Vec<Duration> = (0..20).map(|_| backoff.next_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let nominal = Duration::from_millis(100) * (1 << i.min(2));
            let longest = (nominal * 3 / 2).min(Duration::from_millis(300));
            assert!(*d >= nominal / 2 && *d <= longest, "{i}: {d:?}");
        }
    }

    #[test]
    fn behind_an_announced_release_the_backoff_grows_to_eight_retry_delays() {
        let settings = Settings::with_retry_delay(Duration::from_millis(100));
        let mut backoff = Backoff::new(&settings);
        assert_eq!(backoff.longest_announced(), Duration::from_millis(1200));
        let delays: Vec<Duration> = (0..20).map(|_| backoff.next_announced_delay()).collect();
        for (i, d) in delays.iter().enumerate() {
            let nominal = Duration::from_millis(100) * (1 << i.min(3));
            assert!(*d >= nominal / 2 && *d <= nominal * 3 / 2, "{i}: {d:?}");
        }
        assert!(
            delays.iter().any(|d| *d > Backoff::longest(&settings)),
            "never past the unannounced bound: {delays:?}"
        );
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
        registry.notify_for("f", 3, None);
        // The notification is already there: one poll sees it, and must not wake.
        let early = futures_util::FutureExt::now_or_never(handle.released());
        assert!(early.is_none(), "woken by a hand-off to ticket 3");
        let hand_off = HandOff {
            ticket: 7,
            fence: 12,
            digest: 34,
        };
        registry.notify_for("f", 7, Some(hand_off));
        let told = tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by its own hand-off"));
        assert_eq!(told, Some(hand_off), "what its hand-off said");
        // Its own hand-off among several it slept through: still told.
        handle.mark_seen();
        registry.notify_for("f", 3, None);
        registry.notify_for("f", 7, Some(hand_off));
        registry.notify_for("f", 9, None);
        let told = tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by folded releases"));
        assert_eq!(told, Some(hand_off));
        // More than it can tell apart: woken, told nothing (one may have been its own).
        handle.mark_seen();
        for ticket in 10..=(10 + RECENT as u64) {
            registry.notify_for("f", ticket, None);
        }
        let told = tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by a burst of releases"));
        assert_eq!(told, None);
        // A release for nobody in particular wakes it too.
        handle.mark_seen();
        registry.notify("f");
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by a plain release"));
    }

    #[tokio::test]
    async fn a_hand_off_naming_the_waiters_token_wakes_it_whatever_its_ticket() {
        let registry = Arc::new(WakeRegistry::default());
        let mine = HandOff {
            ticket: 9,
            fence: 5,
            digest: 77,
        };
        for ticket in [None, Some(4)] {
            let mut handle = registry.watch("d");
            handle.set_ticket(ticket);
            handle.set_digest(mine.digest);
            handle.mark_seen();
            // Another waiter's hand-off, by another ticket and digest: slept through.
            registry.notify_for(
                "d",
                8,
                Some(HandOff {
                    ticket: 8,
                    fence: 6,
                    digest: 78,
                }),
            );
            let early = futures_util::FutureExt::now_or_never(handle.released());
            assert!(
                early.is_none(),
                "{ticket:?}: woken by another waiter's hand-off"
            );
            // Its own, by a ticket of another node's line.
            registry.notify_for("d", 9, Some(mine));
            let told = tokio::time::timeout(Duration::from_secs(5), handle.released())
                .await
                .unwrap_or_else(|_| panic!("{ticket:?}: slept through its own hand-off"));
            assert_eq!(told, Some(mine), "{ticket:?}: what its hand-off said");
        }
    }

    #[tokio::test]
    async fn a_waiter_without_a_ticket_sleeps_through_hand_offs() {
        let registry = Arc::new(WakeRegistry::default());
        let mut handle = registry.watch("h");
        handle.mark_seen();
        let hand_off = HandOff {
            ticket: 3,
            fence: 1,
            digest: 2,
        };
        registry.notify_for("h", 3, Some(hand_off));
        let early = futures_util::FutureExt::now_or_never(handle.released());
        assert!(early.is_none(), "woken by a lock handed to ticket 3");
        // A queue's head named without a hand-off (etcd: it may take the lock now) wakes it.
        registry.notify_for("h", 4, None);
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by a new head of the queue"));
        handle.mark_seen();
        registry.notify("h");
        tokio::time::timeout(Duration::from_secs(5), handle.released())
            .await
            .unwrap_or_else(|_| panic!("not woken by a plain release"));
    }
}
