//! Waiting between a "held" answer and the next attempt: release notifications, the herd rule
//! for woken waiters, the backoff, and what ended each pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::backend::{Backend, BoxFuture, Mode, Names, Subscription, Token, Watch};
use crate::config::Settings;
use crate::wait::{Backoff, HandOff, WakeHandle, WakeRegistry};

/// How to spend the time between a "held" answer and the next attempt.
pub(crate) trait WaitStrategy: Send {
    /// Called right before each attempt.
    fn before_attempt(&mut self);

    /// Whether the next attempt answers a release's wake-up: refused, it lost the lock to a
    /// faster caller.
    fn answers_a_wake_up(&self) -> bool;

    /// Waits until the next attempt is worth making, but never past `until`. `held` is what the
    /// refusal said; `token` the waiter's; `queues` whether a default lock's waiter takes a place
    /// in the queue when it starves (not while an attempt's outcome is unknown: then it listens
    /// to every release).
    fn pause<'a>(
        &'a mut self,
        held: Held,
        token: &Token,
        queues: bool,
        until: Option<Instant>,
    ) -> BoxFuture<'a, Woken>;
}

/// How a pause ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// Time for the next attempt: a release for anybody, or a subscription confirmed (a
    /// release may have come before it).
    Attempt,
    /// The pause's end: nothing heard, nothing confirmed.
    PauseRanOut,
    /// A release handed the lock to `held.ticket`, and said this.
    HandOff(HandOff),
    /// A waiter with a place in line now hears every release (the subscription to its own
    /// channel is confirmed): a hand-off to it before then went unheard, and the lock's key shows
    /// whether one came (see [`Backend::look`]); the attempt that takes it follows only then
    /// (where there is no look, the next attempt finds out).
    Look,
}

/// What a refusal told the waiter (see [`Attempt::Held`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    /// The holder's remaining time to live, when the server said.
    pub(crate) pttl: Option<Duration>,
    /// A fair waiter's place in the queue: releases handed to other waiters are not worth
    /// waking for.
    pub(crate) ticket: Option<u64>,
    /// Whether the holder's release will tell the waiter by itself: then the waiter does not
    /// poll for it at the short interval a release that announces nothing needs.
    pub(crate) announced: bool,
}

/// The default strategy: subscribe to the release notifications of every key after the first
/// "held" answer, then retry on a release of any of them, once every key's subscription is
/// confirmed (a release may have come before), or after a jittered backoff capped by the holder's
/// remaining TTL.
pub(crate) struct NotifyOrBackoff<'a> {
    backend: &'a Backend,
    wakers: &'a Arc<WakeRegistry>,
    names: &'a Names,
    backoff: Backoff,
    /// Pauses after "free any moment" answers.
    soon: Soon,
    /// Pauses after release wake-ups that other contenders won.
    herd: Herd,
    /// Whether an answer gave the waiter a place in a queue (a ticket): it keeps listening for
    /// the hand-off to itself even after an answer without one (under Redlock, one whose gate did
    /// not answer in time), so its subscriptions change at most twice per wait; unless it no
    /// longer queues (an attempt of unknown outcome): its place lapses, and the releases wake
    /// whoever listens to them.
    queued: bool,
    watch: Option<Watching>,
}

/// The pause before retrying a lock that is about to be free (`pttl` zero: it expires now, or a
/// Redlock vote was split and every contender is withdrawing). Contenders that all retry at once
/// would split the vote again, so each waits a random time in a window that starts at 2 ms and
/// doubles with every such answer in a row, up to the normal retry delay (a holder that somehow
/// keeps answering "about to be free" is then asked no more often than usual).
#[derive(Debug)]
struct Soon {
    window: Duration,
    cap: Duration,
}

impl Soon {
    const FIRST: Duration = Duration::from_millis(2);

    fn new(settings: &Settings) -> Self {
        Soon {
            window: Self::FIRST,
            cap: settings.retry_delay.max(Self::FIRST),
        }
    }

    fn next_delay(&mut self) -> Duration {
        let delay = self.window.mul_f64(fastrand::f64());
        self.window = (self.window * 2).min(self.cap);
        delay
    }

    fn reset(&mut self) {
        self.window = Self::FIRST;
    }
}

/// The pause between a release's wake-up and the next attempt. Every release that frees the lock
/// wakes every waiter of the key that listens for it, and the releaser itself often asks again
/// at once: waiters that all ask at once cost the server an attempt each per release and the
/// lock a round trip per hand-off. So a
/// waiter answers its first wake-up at once (a lone waiter's hand-off costs nothing more), and
/// each wake-up after one it lost doubles a window, from [`Herd::FIRST`] up to [`Herd::CAP`],
/// in which it waits a random time: woken waiters spread out, and the lock mostly stays with
/// whoever asks first, at the rate of a release and a grant. A waiter that has waited for
/// [`Herd::STARVING`] answers every wake-up at once again; where the backend lets it, it also
/// takes a place in the lock's queue, and the next release hands it the lock (as Go's
/// `sync.Mutex` hands the lock to a waiter that waited past a threshold), which keeps its wait
/// bounded. There, once it lost a wake-up it waits for its place without listening to the
/// releases, and the hand-off to it wakes it alone.
#[derive(Debug)]
pub(super) struct Herd {
    window: Duration,
    /// Whether the last pause ended by a release's wake-up (so the attempt after it lost).
    woken: bool,
    /// When the first pause began.
    since: Option<Instant>,
    /// Whether the waiter takes a place in the lock's queue once it starves (see
    /// [`queues_when_starving`]): then, once it lost a wake-up, it waits for that instead. Off
    /// while an attempt's outcome is unknown (see `acquire`).
    queues: bool,
    /// Whether the backend and the lock let it queue at all.
    may_queue: bool,
}

impl Herd {
    const FIRST: Duration = Duration::from_micros(500);
    const CAP: Duration = Duration::from_millis(4);
    pub(super) const STARVING: Duration = Duration::from_millis(10);
    /// How long the place of a waiter that queues because it starves lives past its last
    /// attempt (at most the ttl), renewed three times as often: a waiter that dies there holds
    /// up the lock at most this long after a release hands it the lock.
    pub(super) const STARVING_LEASE: Duration = Duration::from_secs(3);

    fn new(queues: bool) -> Self {
        Herd {
            window: Duration::ZERO,
            woken: false,
            since: None,
            may_queue: queues,
            queues,
        }
    }

    /// How long to wait after the next release's wake-up, for a pause that begins at `now`.
    fn next_delay(&mut self, now: Instant) -> Duration {
        let since = *self.since.get_or_insert(now);
        if std::mem::take(&mut self.woken) {
            self.window = (self.window * 2).clamp(Self::FIRST, Self::CAP);
        }
        if now.saturating_duration_since(since) >= Self::STARVING {
            return Duration::ZERO;
        }
        if self.queues && !self.window.is_zero() {
            // It lost a wake-up to a newcomer: attempts on more wake-ups would mostly lose too
            // (each costs the server a request), while its place in the queue, taken when the
            // pause ends at the threshold, wins for sure.
            return Duration::MAX;
        }
        self.window.mul_f64(fastrand::f64())
    }
}

struct Watching {
    /// The waiter's token digest when it listens only for the hand-off to itself (see
    /// [`Node::watch`](crate::backend::Node::watch)).
    own: Option<u64>,
    /// One per key.
    wakes: Vec<WakeHandle>,
    /// Confirmations still to come.
    pending: FuturesUnordered<BoxFuture<'static, Confirmation>>,
    /// Per key, how many more confirmations make its release impossible to miss.
    needed: Vec<usize>,
    /// Dropped with the strategy: unsubscribes.
    subscriptions: Vec<Option<Box<dyn Send + Sync>>>,
}

/// One subscription's confirmation.
struct Confirmation {
    /// Its key's index.
    index: usize,
    /// Whether it is of the first subscriptions for that key (not of the ones that replaced
    /// them).
    first: bool,
    /// Whether the node confirmed it.
    ok: bool,
}

impl Watching {
    fn start(
        backend: &Backend,
        wakers: &Arc<WakeRegistry>,
        names: &Names,
        own: Option<u64>,
    ) -> Self {
        let mut w = Watching {
            own,
            wakes: names.iter().map(|name| wakers.watch(name)).collect(),
            pending: FuturesUnordered::new(),
            needed: vec![0; names.len()],
            subscriptions: Vec::new(),
        };
        for (index, name) in names.iter().enumerate() {
            w.add(index, true, backend.watch(name, &names[0], own));
        }
        w
    }

    fn add(
        &mut self,
        index: usize,
        first: bool,
        Watch {
            subscriptions,
            needed,
        }: Watch,
    ) {
        self.needed[index] = needed;
        for Subscription {
            confirmed,
            keep: undo,
        } in subscriptions
        {
            let tagged: BoxFuture<'static, Confirmation> = Box::pin(async move {
                Confirmation {
                    index,
                    first,
                    ok: confirmed.await,
                }
            });
            self.pending.push(tagged);
            self.subscriptions.push(undo);
        }
    }

    /// Counts a confirmation; a first subscription that failed is replaced by the backend's
    /// others (Redlock: the nodes other than an unresponsive gate). Answers whether every key's
    /// releases can no longer be missed.
    fn confirmed(
        &mut self,
        backend: &Backend,
        names: &Names,
        Confirmation { index, first, ok }: Confirmation,
    ) -> bool {
        if ok {
            if self.needed[index] == 0 {
                return false;
            }
            self.needed[index] -= 1;
            return self.needed.iter().all(|n| *n == 0);
        }
        if first && let Some(others) = backend.watch_others(&names[index], &names[0], self.own) {
            self.add(index, false, others);
        }
        false
    }
}

impl<'a> NotifyOrBackoff<'a> {
    pub(crate) fn new(
        backend: &'a Backend,
        wakers: &'a Arc<WakeRegistry>,
        names: &'a Names,
        mode: Mode,
        settings: &Settings,
    ) -> Self {
        NotifyOrBackoff {
            backend,
            wakers,
            names,
            backoff: Backoff::new(settings),
            soon: Soon::new(settings),
            herd: Herd::new(queues_when_starving(backend, names, mode)),
            queued: false,
            watch: None,
        }
    }
}

impl WaitStrategy for NotifyOrBackoff<'_> {
    fn answers_a_wake_up(&self) -> bool {
        self.herd.woken
    }

    fn before_attempt(&mut self) {
        if let Some(w) = self.watch.as_mut() {
            for wake in &mut w.wakes {
                wake.mark_seen();
            }
        }
    }

    fn pause<'b>(
        &'b mut self,
        Held {
            pttl,
            ticket,
            announced,
        }: Held,
        token: &Token,
        queues: bool,
        until: Option<Instant>,
    ) -> BoxFuture<'b, Woken> {
        let nap = if pttl == Some(Duration::ZERO) {
            self.soon.next_delay()
        } else {
            self.soon.reset();
            let poll = match (announced, ticket) {
                // A place in line behind a holder of this library: its release hands the lock
                // to the head of the line and tells it, so the waiter asks again when its place
                // needs renewing (`until`), when the holder's key expires, or, a safety net for
                // a lost message, after the longest pause.
                (true, Some(_)) => self.backoff.longest_announced(),
                // Its release publishes to the waiters that marked the lock: the backoff is a
                // safety net, and grows longer.
                (true, None) => self.backoff.next_announced_delay(),
                // A release that announces nothing is noticed only by asking.
                (false, _) => self.backoff.next_delay(),
            };
            poll.min(pttl.map_or(Duration::MAX, |p| p + Duration::from_millis(1)))
        };
        let now = Instant::now();
        let wake_at = cap(now, nap, until);
        if self.herd.queues && !queues {
            // It no longer takes a place (see `acquire`), and the one it had lapses: listen to
            // the releases again, and answer their wake-ups.
            self.queued = false;
        }
        self.herd.queues = self.herd.may_queue && queues;
        // A waiter with a place in the queue answers every wake-up at once: a release that does
        // not name it finds the queue empty, so the lock is free for it.
        let after_wake = if ticket.is_some() {
            Duration::ZERO
        } else {
            self.herd.next_delay(now)
        };
        // A waiter with a place in the queue, or that waits for the moment it takes one (it lost
        // a wake-up: see `Herd`), only needs the hand-off to itself. Where that is told to it
        // alone, it listens for nothing else: the releases meanwhile (a lock its releaser keeps
        // taking again) wake no one but the waiters still racing for it.
        let sleeps_until_starving = after_wake == Duration::MAX;
        self.queued |= ticket.is_some();
        let digest = token.digest();
        let own = ((self.queued || sleeps_until_starving) && self.backend.tells_waiters_alone())
            .then_some(digest);
        let (backend, wakers, names) = (self.backend, self.wakers, self.names);
        if self.watch.as_ref().is_some_and(|w| w.own != own) {
            // The new subscriptions first, then the old ones go: a node that applies both in
            // one round never listens for neither (see `Subscriptions`).
            self.watch = Some(Watching::start(backend, wakers, names, own));
        }
        let w = self
            .watch
            .get_or_insert_with(|| Watching::start(backend, wakers, names, own));
        // Not queued yet, it has no hand-off to miss: a confirmation is no reason to look again.
        let look_again = ticket.is_some() || own.is_none();
        let herd = &mut self.herd;
        for wake in &mut w.wakes {
            wake.set_ticket(ticket);
            wake.set_digest(digest);
        }
        Box::pin(async move {
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(wake_at));
            tokio::pin!(sleep);
            loop {
                let confirming = w.needed.iter().any(|n| *n > 0) && !w.pending.is_empty();
                let confirmation = tokio::select! {
                    () = &mut sleep => return Woken::PauseRanOut,
                    (told, _, _) = futures_util::future::select_all(
                        w.wakes.iter_mut().map(|h| Box::pin(h.released())),
                    ) => {
                        // A hand-off names its waiter: nobody races it.
                        if told.is_none() {
                            herd.woken = true;
                            if !after_wake.is_zero() {
                                // Never past the pause's own end (itself within `until`).
                                let at = cap(Instant::now(), after_wake, Some(wake_at));
                                tokio::time::sleep_until(at.into()).await;
                            }
                        }
                        return told.map_or(Woken::Attempt, Woken::HandOff);
                    }
                    Some(confirmation) = w.pending.next(), if confirming => confirmation,
                };
                // From now on no release can be missed: look again, since one may have
                // happened before; unless the pause ends soon anyway (a waiter's first pause
                // ends at its threshold for queueing), which then bounds what a release missed
                // costs, for a request fewer.
                let ends_soon = wake_at.saturating_duration_since(Instant::now()) <= Herd::STARVING;
                if w.confirmed(backend, names, confirmation) && look_again && !ends_soon {
                    return if ticket.is_some() {
                        Woken::Look
                    } else {
                        Woken::Attempt
                    };
                }
            }
        })
    }
}

/// Whether a waiter for `names` as `mode` takes a place in the lock's fair queue once it waited
/// past [`Herd::STARVING`], and is then handed the lock by its next release (see
/// [`Node::queues_starving_waiters`](crate::backend::Node::queues_starving_waiters)). A waiter
/// of a default (unfair) lock lets newcomers barge in, which keeps a lock that its releaser takes
/// again at the rate of one caller's loop; the queue keeps its wait bounded (as Go's
/// `sync.Mutex` hands the lock to a waiter that waited past a threshold).
pub(crate) fn queues_when_starving(backend: &Backend, names: &Names, mode: Mode) -> bool {
    mode == Mode::Exclusive && names.len() == 1 && backend.queues_starving_waiters()
}

/// `now + d`, but not past `until`, and never overflowing.
pub(super) fn cap(now: Instant, d: Duration, until: Option<Instant>) -> Instant {
    let at = now.checked_add(d);
    match (at, until) {
        (Some(at), Some(until)) => at.min(until),
        (Some(at), None) => at,
        (None, Some(until)) => until,
        (None, None) => now + Duration::from_secs(3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn woken_waiters_answer_at_once_then_spread_out_until_they_starve() {
        let start = Instant::now();
        let mut herd = Herd::new(false);
        assert_eq!(herd.next_delay(start), Duration::ZERO, "a first wake-up");
        // Each wake-up the waiter lost doubles its window, up to the cap.
        let windows = [500, 1000, 2000, 4000, 4000];
        for (i, window) in windows.into_iter().enumerate() {
            herd.woken = true;
            let delay = herd.next_delay(start + Duration::from_millis(1));
            assert_eq!(herd.window, Duration::from_micros(window), "window {i}");
            assert!(delay <= herd.window, "{i}: {delay:?}");
        }
        // Not woken (its pause ran out): the window stays.
        assert!(herd.next_delay(start + Duration::from_millis(2)) <= Herd::CAP);
        assert_eq!(herd.window, Herd::CAP);
        herd.woken = true;
        assert_eq!(
            herd.next_delay(start + Herd::STARVING),
            Duration::ZERO,
            "a starving waiter answers at once"
        );
    }

    #[test]
    fn a_waiter_that_queues_when_starving_stops_answering_wake_ups_once_it_lost_one() {
        let start = Instant::now();
        let mut herd = Herd::new(true);
        assert_eq!(herd.next_delay(start), Duration::ZERO, "a first wake-up");
        herd.woken = true;
        assert_eq!(
            herd.next_delay(start + Duration::from_millis(1)),
            Duration::MAX,
            "after a lost wake-up: until its pause ends at the threshold"
        );
        herd.woken = true;
        assert_eq!(
            herd.next_delay(start + Herd::STARVING),
            Duration::ZERO,
            "a starving waiter answers at once"
        );
    }

    #[test]
    fn soon_pauses_start_short_double_and_stop_at_the_retry_delay() {
        let settings = Settings::with_retry_delay(Duration::from_millis(100));
        let mut soon = Soon::new(&settings);
        let windows = [2, 4, 8, 16, 32, 64, 100, 100];
        for (i, window) in windows.into_iter().enumerate() {
            assert_eq!(soon.window, Duration::from_millis(window), "window {i}");
            let delay = soon.next_delay();
            assert!(delay <= Duration::from_millis(window), "{i}: {delay:?}");
        }
        soon.reset();
        assert_eq!(soon.window, Soon::FIRST);
        // Jittered: a hundred pauses in one window are not all the same.
        let delays: std::collections::HashSet<Duration> = (0..100)
            .map(|_| {
                soon.reset();
                soon.next_delay()
            })
            .collect();
        assert!(delays.len() > 10, "{delays:?}");
    }
}
