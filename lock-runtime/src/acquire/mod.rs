//! Acquiring: attempt -> decide -> wait, all bounded by one deadline.
//!
//! Whatever the servers do (answer slowly, freeze, refuse), an acquire answers within its `wait`
//! plus one request timeout: every request is bounded by the node's own timeout, waiting never
//! sleeps past the deadline, and setting up release notifications never holds up an attempt.

use std::time::{Duration, Instant};

use crate::backend::{Ask, AtOnce, Attempt, Backend, Looked, Mode, Names, Token};
use crate::config::Settings;
use crate::error::{LockError, NodeFailure};
use crate::events::{self, Labels};
use crate::owner::Identity;
use crate::signal::Signal;
use crate::wait::{Backoff, HandOff};

mod waiting;

pub(crate) use waiting::{Held, NotifyOrBackoff, WaitStrategy, Woken, queues_when_starving};
use waiting::{Herd, cap};

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
    // Whether the last pause ran out on its own (see `Ask::pause_ran_out`).
    let mut pause_ran_out = false;
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
            pause_ran_out: std::mem::take(&mut pause_ran_out),
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
                        Woken::Look => {
                            let looked = tokio::select! {
                                looked = look(backend, req, &token) => looked,
                                () = caller_gone.raised() => {
                                    return Ended { result: Err(gone()), unsure: unsure.then_some(token) };
                                }
                            };
                            match looked {
                                // Not handed to it: sleep on, bounded by the holder's time to
                                // live as the look read it, and hear the hand-off now.
                                Some(left) => pttl = left,
                                // Handed to it before it could hear (the attempt that follows at
                                // once takes it: a grant comes from an attempt's answer), or no
                                // look here.
                                None => break None,
                            }
                        }
                        Woken::PauseRanOut => {
                            pause_ran_out = true;
                            break None;
                        }
                        Woken::Attempt | Woken::HandOff(_) => break None,
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
        pause_ran_out: false,
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

/// A queued waiter's look at its lock's key (see [`Woken::Look`]): the holder's time to live
/// when the key does not hold `token` (the waiter sleeps on); `None` when it does (a hand-off it
/// did not hear), when the backend cannot tell by a look, or when the look failed: then the
/// next attempt, at once, takes the lock or finds out.
async fn look(backend: &Backend, req: &Request, token: &Token) -> Option<Option<Duration>> {
    let [name] = &req.names[..] else {
        return None;
    };
    match backend.look(name, token).await? {
        Ok(Looked::Not(left)) => Some(left),
        Ok(Looked::Ours) | Err(_) => None,
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
