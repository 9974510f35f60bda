//! Acquiring: attempt -> decide -> wait, all bounded by one deadline.
//!
//! Whatever the servers do (answer slowly, freeze, refuse), an acquire answers within its `wait`
//! plus one request timeout: every request is bounded by the node's own timeout, waiting never
//! sleeps past the deadline, and setting up release notifications never holds up an attempt.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::backend::{
    Ask, AtOnce, Attempt, Backend, BoxFuture, Looked, Mode, Names, Subscription, Token, Watch,
};
use crate::config::Settings;
use crate::error::{LockError, NodeFailure};
use crate::events::{self, Labels};
use crate::owner::Identity;
use crate::signal::Signal;
use crate::wait::{Backoff, HandOff, WakeHandle, WakeRegistry};

/// What one acquisition asks for.
#[derive(Debug)]
pub(crate) struct Request {
    /// Sorted, without duplicates.
    pub(crate) names: Names,
    pub(crate) ttl: Duration,
    /// When the request was made (checked and built).
    pub(crate) asked_at: Instant,
    /// `None`: wait as long as it takes.
    pub(crate) give_up: Option<Instant>,
    pub(crate) fencing: bool,
    pub(crate) mode: Mode,
    pub(crate) max_hold: Option<Duration>,
    /// How long after the grant the keys stay at least (none when zero).
    pub(crate) min_hold: Option<Duration>,
    pub(crate) labels: Labels,
    /// The acquisition's `distributed_lock` span: acquire, body and release run in it.
    pub(crate) span: tracing::Span,
}

/// A grant.
#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) token: Token,
    /// One per key with fencing, else empty.
    pub(crate) fences: Vec<u64>,
    pub(crate) valid_until: Instant,
    /// When the grant was seen (the hold's start).
    pub(crate) at: Instant,
}

/// How an acquisition ended, and whether a grant may sit on a server unseen (an attempt whose
/// answer never came): then the caller must release `token` in the background.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) result: Result<Granted, LockError>,
    pub(crate) unsure: Option<Token>,
}

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
    /// Time for the next attempt: a release for anybody, or the pause's end.
    Attempt,
    /// A release handed the lock to `held.ticket`, and said this.
    HandOff(HandOff),
    /// A waiter with a place in line now hears every release (the subscription to its own
    /// channel is confirmed): a hand-off to it before then went unheard, and the lock's key shows
    /// whether one came (see [`Backend::look`]; where the key is not the server's word, the next
    /// attempt finds out).
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
struct Herd {
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
    const STARVING: Duration = Duration::from_millis(10);
    /// How long the place of a waiter that queues because it starves lives past its last
    /// attempt (at most the ttl), renewed three times as often: a waiter that dies there holds
    /// up the lock at most this long after a release hands it the lock.
    const STARVING_LEASE: Duration = Duration::from_secs(3);

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
                    () = &mut sleep => return Woken::Attempt,
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
fn cap(now: Instant, d: Duration, until: Option<Instant>) -> Instant {
    let at = now.checked_add(d);
    match (at, until) {
        (Some(at), Some(until)) => at.min(until),
        (Some(at), None) => at,
        (None, Some(until)) => until,
        (None, None) => now + Duration::from_secs(3600),
    }
}

/// Acquires `req` on `backend`, waiting with `strategy` while someone else holds it, until
/// `req.give_up` or until `caller_gone` is raised.
pub(crate) async fn acquire(
    backend: &Backend,
    settings: &Settings,
    identity: &Identity,
    req: &Request,
    strategy: &mut dyn WaitStrategy,
    caller_gone: &Signal,
) -> Ended {
    let started = Instant::now();
    let token = Token::new(identity, started);
    let mut attempts = 0u32;
    let mut backoff = Backoff::new(settings);
    // Set once an attempt's outcome is unknown (timeout, broken connection): the lock may be
    // ours on the server, so a failed call must release by token before returning.
    let mut unsure = false;
    // Set once an attempt's outcome was unknown: then the call does not leave a queue it gave
    // up in by itself (the cleanup by token does, in the background, as it deletes a grant).
    let mut unknown = false;
    // Set while the last attempt of unknown outcome is not known to have run: meanwhile the
    // waiter does not queue when it starves (a place that lands after the call gave up and its
    // cleanup ran is handed the lock, which then sits on a dead token until the place's lease
    // ends). The next answer proves it ran: a node runs one connection's requests in order, and
    // a request that timed out stays on its connection (one on a broken connection that the
    // server runs after a reconnect is the documented stale-acquire case, cleaned up by token).
    // Meanwhile the waiter hears every release, as a waiter that never queued does.
    let mut unproven = false;
    let mut final_try = false;
    // The place in a fair queue that the last answer with a ticket renewed: a lock handed to
    // that place lives until the lease that answer gave it ends. A hand-off to any other place
    // (one that lapsed before this answer, while the waiter was paused or its link slow: the
    // lock handed to it may have expired and gone to someone else since) is no grant.
    let mut place = None;
    // Whether a release's message may stand for the grant: it is one node's word, unreplicated.
    // Under Redlock a majority must grant it, with `min_replicas` replicas must acknowledge it,
    // and on Sentinel or Cluster the node that sent it may have been deposed since (see
    // `Node::hand_off_is_a_grant`), so those ask again (the attempt finds the lock theirs).
    let take_word = backend.hand_off_is_a_grant() && settings.min_replicas.is_none();
    let may_queue = queues_when_starving(backend, &req.names, req.mode);
    let past = |now: Instant| req.give_up.is_some_and(|g| now >= g);
    // The promise: an acquire answers within its wait plus one request timeout, whatever the
    // servers do.
    let answer_by = req
        .give_up
        .and_then(|g| g.checked_add(settings.request_timeout()));
    let result = loop {
        strategy.before_attempt();
        attempts += 1;
        // The first attempt starts when the acquire did (one clock read fewer).
        let attempt_start = if attempts == 1 {
            started
        } else {
            Instant::now()
        };
        // Whether it takes a place in the queue once it starves, and whether it starves now.
        let will_queue = may_queue && !unproven;
        let starving =
            will_queue && attempt_start.saturating_duration_since(started) >= Herd::STARVING;
        let ask = Ask {
            ttl: req.ttl,
            fencing: req.fencing,
            mode: req.mode,
            queue: !past(attempt_start),
            waits: req
                .give_up
                .map_or(req.ttl, |g| g.saturating_duration_since(attempt_start))
                .min(req.ttl),
            lease: if starving {
                Herd::STARVING_LEASE.min(req.ttl)
            } else {
                req.ttl
            },
            starving,
            // Refused after a wake-up, a waiter that queues when it starves sleeps until then
            // and hears no release meanwhile (see `Herd`): a mark would only make the next
            // release wake the others, who mostly lose the race to its releaser too.
            marks: starving || !will_queue || !strategy.answers_a_wake_up(),
        };
        // An attempt may take several requests (Redlock's fence write-back, a withdrawal after
        // `min_replicas`, a refused waiter's mark, Cluster's slot groups): it is cut at the
        // bound, and its outcome is then unknown.
        let attempt = match answer_by {
            Some(by) => {
                tokio::time::timeout_at(by.into(), backend.acquire(&req.names, &token, ask))
                    .await
                    .unwrap_or_else(|_| {
                        Err(vec![NodeFailure::timeout(
                            backend.label(),
                            "acquire within wait plus one request timeout",
                        )])
                    })
            }
            None => backend.acquire(&req.names, &token, ask).await,
        };
        let now = Instant::now();
        unproven &= attempt.is_err();
        let failures = match attempt {
            Ok(Attempt::Acquired { fences }) => {
                let valid_until = attempt_start + req.ttl.saturating_sub(settings.drift(req.ttl));
                if valid_until > now {
                    events::acquired(&req.labels, now - started, attempts, &fences);
                    break Ok(Granted {
                        token: token.clone(),
                        fences,
                        valid_until,
                        at: now,
                    });
                }
                // Granted too slowly to be of use: not a success.
                unsure = true;
                vec![NodeFailure::timeout(
                    "quorum",
                    "acquire before the lock's validity ran out",
                )]
            }
            Ok(Attempt::Held {
                index,
                pttl,
                ticket,
                announced,
            }) => {
                // `unsure` stays set: after a reconnect, an earlier attempt may still land
                // behind this answer. A release by token is harmless if it never did.
                // A waiter with a ticket has a place on the server (in a fair queue; on etcd
                // also a semaphore's line or a writer's marks): leaving it takes a release too
                // (which also passes on a lock handed to it meanwhile).
                unsure |= ticket.is_some();
                // An attempt that did not ask to queue (its wait over) is told its place too, but
                // did not renew it: the place's lease runs on from the last attempt that did
                // (the protocol model, `lock-model`, finds two holders otherwise).
                if let Some(ticket) = ticket.filter(|_| ask.queue) {
                    place = Some(Place {
                        ticket,
                        renewed_at: attempt_start,
                        lease: ask.lease,
                    });
                }
                if past(now) {
                    break Err(LockError::Contended {
                        key: req.names.get(index).unwrap_or(&req.names[0]).to_string(),
                        waited: now - started,
                    });
                }
                // A waiter's queue entry or writer mark lives one ttl (or lease) from when the
                // server saw the attempt unless the next attempt renews it: attempt at least
                // three times per lease, counted from this attempt's start (from its answer, a
                // round trip of two thirds of the lease would lose the place every cycle); and
                // once more when the waiter starves, to take its place in the queue.
                let mut until = cap(attempt_start, ask.lease / 3, req.give_up);
                if will_queue && !starving {
                    until = until.min(started + Herd::STARVING);
                }
                let until = Some(until);
                let mut pttl = pttl;
                let granted = loop {
                    let told = tokio::select! {
                        told = strategy.pause(
                            Held { pttl, ticket, announced },
                            &token,
                            will_queue,
                            until,
                        ) => told,
                        () = caller_gone.raised() => {
                            return Ended { result: Err(gone()), unsure: unsure.then_some(token) };
                        }
                    };
                    match told {
                        Woken::HandOff(told) if take_word => {
                            break handed_to_us(req, settings, &token, told, place);
                        }
                        Woken::Look if take_word && !req.fencing => {
                            let looked = tokio::select! {
                                looked = look(backend, settings, req, &token) => looked,
                                () = caller_gone.raised() => {
                                    return Ended { result: Err(gone()), unsure: unsure.then_some(token) };
                                }
                            };
                            match looked {
                                Some(Ok(granted)) => break Some(granted),
                                // Not handed to it: sleep on, bounded by the holder's time to
                                // live as the look read it, and hear the hand-off now.
                                Some(Err(left)) => pttl = left,
                                None => break None,
                            }
                        }
                        _ => break None,
                    }
                };
                if let Some(granted) = granted {
                    events::acquired(&req.labels, started.elapsed(), attempts, &granted.fences);
                    break Ok(granted);
                }
                continue;
            }
            Ok(Attempt::Mismatch { field, reason }) => {
                break Err(LockError::config(field, reason));
            }
            Err(failures) => failures,
        };
        let applied = failures.iter().any(|f| f.kind.may_have_applied());
        unproven |= applied;
        unknown |= applied;
        unsure |= unknown;
        let retry = failures.iter().all(|f| f.kind.is_transient());
        if !retry || final_try {
            break Err(unavailable(&req.names[0], failures));
        }
        if past(now) {
            if !unsure || answer_by.is_some_and(|by| now >= by) {
                break Err(unavailable(&req.names[0], failures));
            }
            // The last outcome is unknown: ask once more with the same token (the acquire
            // script answers "ours" for it) rather than guess, within what is left of the bound.
            final_try = true;
            continue;
        }
        let until = cap(now, backoff.next_delay(), req.give_up);
        tokio::select! {
            () = tokio::time::sleep_until(tokio::time::Instant::from_std(until)) => {}
            () = caller_gone.raised() => {
                return Ended { result: Err(gone()), unsure: unsure.then_some(token) };
            }
        }
    };
    if unsure && !unknown && matches!(result, Err(LockError::Contended { .. })) {
        // A waiter that gives up with a place in a queue (and no attempt of unknown outcome)
        // leaves it before it answers, within its bound: nothing of the call stays behind, and
        // a lock handed to it just now goes on to the next waiter.
        let leave = backend.release(&req.names, &token, req.mode, true);
        let left = match answer_by {
            Some(by) => tokio::time::timeout_at(by.into(), leave).await.ok(),
            None => Some(leave.await),
        };
        if matches!(left, Some(Ok(_))) {
            unsure = false;
        }
    }
    if let Err(err) = &result {
        events::not_acquired(&req.labels, err, attempts);
    }
    let unsure = (result.is_err() && unsure).then_some(token);
    Ended { result, unsure }
}

/// One attempt on a node that answers at once (in memory), made in place by the caller: the
/// grant, or `None` when the lock is not free for it (the full path then asks again, waits and
/// decides). The attempt does not queue, so a refusal leaves nothing behind.
pub(crate) fn acquire_at_once(
    node: &dyn AtOnce,
    settings: &Settings,
    identity: &Identity,
    req: &Request,
) -> Option<Granted> {
    let token = Token::new(identity, req.asked_at);
    // The request was made a moment ago: its clock read stands for the attempt's start (earlier
    // than the real one, so the validity is conservative) and for when the grant was seen.
    let now = req.asked_at;
    let ask = Ask {
        ttl: req.ttl,
        fencing: req.fencing,
        mode: req.mode,
        queue: false,
        waits: Duration::ZERO,
        lease: req.ttl,
        starving: false,
        marks: false,
    };
    let Attempt::Acquired { fences } = node.acquire_at_once(&req.names, &token, ask, now) else {
        return None;
    };
    let valid_until = now + req.ttl.saturating_sub(settings.drift(req.ttl));
    let seen = Instant::now();
    if valid_until <= seen {
        // Granted too slowly to be of use (a ttl shorter than a stall of this thread): give it
        // back; the full path decides.
        node.release_at_once(&req.names, &token, req.mode, true, seen);
        return None;
    }
    let _in_span = req.span.enter();
    events::acquired(&req.labels, Duration::ZERO, 1, &fences);
    Some(Granted {
        token,
        fences,
        valid_until,
        at: now,
    })
}

/// A waiter's place in a fair queue, as the last answer that renewed it said.
#[derive(Debug, Clone, Copy)]
struct Place {
    /// Its ticket (the server's clock when the place was taken): a place that lapses and is
    /// taken again gets another.
    ticket: u64,
    /// When the attempt that renewed it started.
    renewed_at: Instant,
    /// The lease that attempt gave it.
    lease: Duration,
}

/// The lock a fair release handed to us, as its message `told` us, without asking the server
/// again: when the message names our token and the `place` our last answer renewed (a lock
/// handed to that place lives at most until that answer's lease ends), carries the fence we need
/// (when fencing), and that lease is still valid for a while. Otherwise `None`, and the next
/// attempt asks the server, which finds the lock ours if it is.
fn handed_to_us(
    req: &Request,
    settings: &Settings,
    token: &Token,
    told: HandOff,
    place: Option<Place>,
) -> Option<Granted> {
    if told.digest != token.digest() || (req.fencing && told.fence == 0) {
        return None;
    }
    let place = place.filter(|p| p.ticket == told.ticket)?;
    let valid_until = place.renewed_at + place.lease.saturating_sub(settings.drift(place.lease));
    let now = Instant::now();
    (valid_until > now).then(|| Granted {
        token: token.clone(),
        fences: if req.fencing {
            vec![told.fence]
        } else {
            Vec::new()
        },
        valid_until,
        at: now,
    })
}

/// A queued waiter's look at its lock's key (see [`Woken::Look`]): `Ok` when a hand-off made it
/// the holder, valid for the time to live the look read (from when the look was sent);
/// `Err` with the holder's time to live when not; `None` when the backend cannot tell by a look,
/// or the look failed: the next attempt finds out.
async fn look(
    backend: &Backend,
    settings: &Settings,
    req: &Request,
    token: &Token,
) -> Option<Result<Granted, Option<Duration>>> {
    let [name] = &req.names[..] else {
        return None;
    };
    let sent = Instant::now();
    match backend.look(name, token).await? {
        Ok(Looked::Ours(left)) => {
            let valid_until = sent + left.saturating_sub(settings.drift(left));
            let now = Instant::now();
            (valid_until > now).then(|| {
                Ok(Granted {
                    token: token.clone(),
                    fences: Vec::new(),
                    valid_until,
                    at: now,
                })
            })
        }
        Ok(Looked::Not(left)) => Some(Err(left)),
        Err(_) => None,
    }
}

fn gone() -> LockError {
    LockError::Runtime {
        reason: "the caller stopped waiting".to_owned(),
    }
}

fn unavailable(name: &str, causes: Vec<NodeFailure>) -> LockError {
    LockError::Unavailable {
        key: name.to_owned(),
        causes,
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
