//! Locks inside this process, with the same contract as Redis: expiry, renewal, fencing and
//! release wake-ups. Nothing is shared with other processes.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{
    Ask, AtOnce, Attempt, Backend, BackendConfig, BackendKind, BoxFuture, ExtendItem,
    ExtendOutcome, Mode, Node, NodeHold, Subscription, Token, ValidBackend,
};
use crate::config::Settings;
use crate::error::{LockError, NodeFailure};
#[cfg(feature = "testing")]
use crate::testing::{Faults, Target};
use crate::wait::WakeRegistry;

/// What [`LockConfig::in_memory`](crate::LockConfig::in_memory) stores: nothing to check.
#[derive(Clone)]
pub(crate) struct InMemory;

impl BackendConfig for InMemory {
    fn validate(&self) -> Result<Box<dyn ValidBackend>, LockError> {
        Ok(Box::new(InMemory))
    }

    fn fmt_redacted(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("in_memory")
    }
}

impl ValidBackend for InMemory {
    fn fencing_free(&self) -> bool {
        true
    }

    fn kind(&self) -> BackendKind {
        BackendKind::Memory
    }

    fn uses_tls(&self) -> bool {
        false
    }

    fn build(&self, settings: &Settings, wakers: Arc<WakeRegistry>) -> Result<Backend, LockError> {
        let node = Arc::new(MemoryNode {
            state: Mutex::new(State::default()),
            wakers,
            #[cfg(feature = "testing")]
            faults: settings.faults.clone(),
        });
        #[cfg(feature = "testing")]
        if let Some(faults) = &node.faults {
            faults.attach(Arc::<MemoryNode>::downgrade(&node));
        }
        #[cfg(not(feature = "testing"))]
        let _ = settings;
        Ok(Backend::One(node))
    }
}

#[derive(Debug)]
pub(crate) struct MemoryNode {
    state: Mutex<State>,
    wakers: Arc<WakeRegistry>,
    /// What tests inject (feature `testing`).
    #[cfg(feature = "testing")]
    faults: Option<Faults>,
}

#[derive(Debug, Default)]
struct State {
    /// Exclusive and fair locks.
    held: HashMap<Arc<str>, Entry>,
    /// Shared locks and semaphores.
    groups: HashMap<Arc<str>, Group>,
    /// Fair locks' waiters.
    queues: HashMap<Arc<str>, VecDeque<Waiter>>,
    /// Fence counters, of the names that are held, shared or queued for, and of those let go since
    /// the last sweep (which drops the rest into `fence_floor`).
    fences: HashMap<Arc<str>, u64>,
    /// The largest counter a sweep dropped: a name's counter made again starts above it, so its
    /// tokens still grow, and a service that locks a name per request keeps no counter per name.
    fence_floor: u64,
    /// The last fair ticket handed out.
    tickets: u64,
    /// [`State::entries`] after the last sweep.
    swept_at: usize,
}

#[derive(Debug)]
struct Entry {
    token: Token,
    expires: Instant,
}

/// The holders of a shared lock or semaphore, each with its own lease.
#[derive(Debug)]
struct Group {
    /// 0: a shared lock.
    permits: u32,
    holders: HashMap<Token, Instant>,
    /// Until when a waiting writer keeps new readers out.
    writer_until: Option<Instant>,
}

impl Group {
    /// Drops the leases and the writer's mark that ran out; answers whether anything is left
    /// (a holder, or a waiting writer's mark that keeps readers out, also once the last reader
    /// left, so that readers woken by that release with the writer do not get in first).
    fn purge(&mut self, now: Instant) -> bool {
        self.holders.retain(|_, expires| *expires > now);
        if self.writer_until.is_some_and(|w| w <= now) {
            self.writer_until = None;
        }
        !self.holders.is_empty() || self.writer_until.is_some()
    }

    /// How long until the first lease runs out.
    fn first_expiry(&self, now: Instant) -> Option<Duration> {
        self.holders
            .values()
            .min()
            .map(|e| e.saturating_duration_since(now))
    }
}

/// A fair lock's waiter: its place (`ticket`) and the expiry of its entry's lease.
#[derive(Debug)]
struct Waiter {
    token: Token,
    ticket: u64,
    expires: Instant,
}

impl State {
    /// The live entry of `name`, dropping it first when it has expired.
    fn live(&mut self, name: &str, now: Instant) -> Option<&mut Entry> {
        if self.held.get(name).is_some_and(|e| e.expires <= now) {
            self.held.remove(name);
        }
        self.held.get_mut(name)
    }

    /// `name`'s shared holders or permits without the leases that ran out: none when nobody
    /// holds it, unless a waiting writer's mark still keeps readers out (then with no holders).
    fn group(&mut self, name: &str, now: Instant) -> Option<&mut Group> {
        if !self.groups.get_mut(name)?.purge(now) {
            self.groups.remove(name);
            return None;
        }
        self.groups.get_mut(name)
    }

    /// Like [`group`](Self::group), but only when someone holds it.
    fn held_group(&mut self, name: &str, now: Instant) -> Option<&mut Group> {
        self.group(name, now).filter(|g| !g.holders.is_empty())
    }

    /// `name`'s queue without the waiters whose lease ran out.
    fn queue(&mut self, name: &str, now: Instant) -> Option<&mut VecDeque<Waiter>> {
        let queue = self.queues.get_mut(name)?;
        queue.retain(|w| w.expires > now);
        if queue.is_empty() {
            self.queues.remove(name);
            return None;
        }
        self.queues.get_mut(name)
    }

    /// Drops expired entries once the tables doubled since the last sweep, so locks that are never
    /// released (crashed holders, in Redis terms) do not accumulate, and the fence counters of
    /// names nobody holds or queues for, keeping the largest in `fence_floor`.
    fn sweep(&mut self, now: Instant) {
        if self.entries() >= 2 * self.swept_at.max(512) {
            self.held.retain(|_, e| e.expires > now);
            self.groups.retain(|_, g| g.purge(now));
            self.queues.retain(|_, q| {
                q.retain(|w| w.expires > now);
                !q.is_empty()
            });
            let (held, groups, queues) = (&self.held, &self.groups, &self.queues);
            let floor = &mut self.fence_floor;
            self.fences.retain(|name, counter| {
                let used = held.contains_key(name)
                    || groups.contains_key(name)
                    || queues.contains_key(name);
                if !used {
                    *floor = (*floor).max(*counter);
                }
                used
            });
            self.swept_at = self.entries();
        }
    }

    /// How many entries the tables hold, fence counters included.
    fn entries(&self) -> usize {
        self.held.len() + self.groups.len() + self.queues.len() + self.fences.len()
    }
}

fn until(now: Instant, ttl: Duration) -> Instant {
    now.checked_add(ttl).unwrap_or(now + lock_rules::MAX_TTL)
}

impl MemoryNode {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cause a request about `names` fails with: an injected outage (feature `testing`).
    #[cfg(feature = "testing")]
    fn injected<S: AsRef<str>>(&self, names: &[S]) -> Result<(), NodeFailure> {
        match self
            .faults
            .as_ref()
            .and_then(|f| f.failure(self.addr(), names))
        {
            Some(failure) => Err(failure),
            None => Ok(()),
        }
    }

    /// Without faults, nothing fails.
    #[cfg(not(feature = "testing"))]
    #[inline]
    fn injected<S: AsRef<str>>(&self, _names: &[S]) -> Result<(), NodeFailure> {
        Ok(())
    }

    /// Deletes `name` whoever holds it, and wakes its waiters: whether it was held.
    fn delete(&self, name: &str) -> bool {
        let held = {
            let mut state = self.state();
            let now = Instant::now();
            let held = state.live(name, now).is_some() || state.held_group(name, now).is_some();
            state.held.remove(name);
            state.groups.remove(name);
            held
        };
        if held {
            self.wakers.notify(name);
        }
        held
    }

    fn extend_now(&self, item: &ExtendItem<'_>) -> ExtendOutcome {
        if let Err(failure) = self.injected(item.names) {
            return ExtendOutcome::Failed(failure);
        }
        let now = Instant::now();
        let mut state = self.state();
        if matches!(item.mode, Mode::Shared | Mode::Permits(_)) {
            let lease = state
                .group(&item.names[0], now)
                .and_then(|g| g.holders.get_mut(item.token));
            return match lease {
                Some(expires) => {
                    *expires = until(now, item.ttl);
                    ExtendOutcome::Extended
                }
                None => ExtendOutcome::NotOwned { index: 0 },
            };
        }
        match expire_in(&mut state, item.names, item.token, item.ttl, now) {
            Ok(()) => ExtendOutcome::Extended,
            Err(index) => ExtendOutcome::NotOwned { index },
        }
    }
}

/// Sets every key of an exclusive lock of `token` to expire `ttl` from `now`, or, when the key at
/// `Err(index)` is not ours, none.
fn expire_in(
    state: &mut State,
    names: &[Arc<str>],
    token: &Token,
    ttl: Duration,
    now: Instant,
) -> Result<(), usize> {
    for (index, name) in names.iter().enumerate() {
        if !state
            .live(name, now)
            .is_some_and(|entry| entry.token == *token)
        {
            return Err(index);
        }
    }
    for name in names {
        if let Some(entry) = state.held.get_mut(&**name) {
            entry.expires = now.checked_add(ttl).unwrap_or(entry.expires);
        }
    }
    Ok(())
}

/// An exclusive lock on every key of `names`, or none.
fn exclusive(
    state: &mut State,
    names: &[Arc<str>],
    token: &Token,
    ask: Ask,
    now: Instant,
) -> Attempt {
    let mut ours = Vec::with_capacity(names.len());
    for (index, name) in names.iter().enumerate() {
        if let Some(group) = state.group(name, now) {
            if group.permits > 0 {
                return Attempt::mismatch(name, ask.mode, i64::from(group.permits));
            }
            if group.holders.is_empty() {
                // Only a writer's mark is left: the lock is free for a writer.
                state.groups.remove(&**name);
            } else {
                // Readers hold it: a writer that waits keeps new readers out meanwhile.
                if ask.queue {
                    let mark = until(now, ask.waits);
                    group.writer_until = Some(group.writer_until.map_or(mark, |w| w.max(mark)));
                }
                let last = group.holders.values().max().copied().unwrap_or(now);
                return Attempt::Held {
                    index,
                    pttl: Some(last.saturating_duration_since(now)),
                    ticket: None,
                    announced: true,
                };
            }
        }
        match state.live(name, now) {
            Some(entry) if entry.token == *token => ours.push(true),
            Some(entry) => {
                return Attempt::Held {
                    index,
                    pttl: Some(entry.expires - now),
                    ticket: None,
                    announced: true,
                };
            }
            None => ours.push(false),
        }
    }
    let expires = until(now, ask.ttl);
    let mut fences = Vec::new();
    for (name, ours) in names.iter().zip(ours) {
        state.held.insert(
            Arc::clone(name),
            Entry {
                token: token.clone(),
                expires,
            },
        );
        if ask.fencing {
            fences.push(next_fence(state, name, !ours));
        }
    }
    Attempt::Acquired { fences }
}

/// A fair lock: granted when free and `token` is first in the queue (or nobody queues), or when
/// a release handed it to `token`; else a waiting caller joins the queue or renews its place.
fn fair(state: &mut State, name: &Arc<str>, token: &Token, ask: Ask, now: Instant) -> Attempt {
    if let Some(group) = state.group(name, now) {
        let permits = i64::from(group.permits);
        return Attempt::mismatch(name, ask.mode, permits);
    }
    let holder = state
        .live(name, now)
        .map(|e| (e.token == *token, e.expires));
    let head_is_us = state
        .queue(name, now)
        .and_then(|q| q.front())
        .is_none_or(|w| w.token == *token);
    if holder.is_some_and(|(ours, _)| ours) || (holder.is_none() && head_is_us) {
        let ours = holder.is_some();
        if let Some(queue) = state.queues.get_mut(&**name) {
            queue.retain(|w| w.token != *token);
        }
        state.held.insert(
            Arc::clone(name),
            Entry {
                token: token.clone(),
                expires: until(now, ask.ttl),
            },
        );
        let fences = if ask.fencing {
            vec![next_fence(state, name, !ours)]
        } else {
            Vec::new()
        };
        return Attempt::Acquired { fences };
    }
    let mut ticket = state
        .queues
        .get(&**name)
        .and_then(|q| q.iter().find(|w| w.token == *token))
        .map(|w| w.ticket);
    if ask.queue {
        let expires = until(now, ask.lease);
        match ticket {
            Some(_) => {
                if let Some(w) = state
                    .queues
                    .get_mut(&**name)
                    .and_then(|q| q.iter_mut().find(|w| w.token == *token))
                {
                    w.expires = expires;
                }
            }
            None => {
                state.tickets += 1;
                let t = state.tickets;
                ticket = Some(t);
                state
                    .queues
                    .entry(Arc::clone(name))
                    .or_default()
                    .push_back(Waiter {
                        token: token.clone(),
                        ticket: t,
                        expires,
                    });
            }
        }
    }
    let pttl = match holder {
        Some((_, expires)) => expires.saturating_duration_since(now),
        None => state
            .queues
            .get(&**name)
            .and_then(|q| q.front())
            .map_or(Duration::ZERO, |w| w.expires.saturating_duration_since(now)),
    };
    Attempt::Held {
        index: 0,
        pttl: Some(pttl),
        ticket,
        announced: true,
    }
}

/// Takes `token` out of `name`'s queue and, when the lock is free, hands it to the first live
/// waiter for the rest of its entry's lease. Returns that waiter's ticket.
fn hand_over(state: &mut State, name: &Arc<str>, token: &Token, now: Instant) -> Option<u64> {
    if let Some(queue) = state.queues.get_mut(&**name) {
        queue.retain(|w| w.token != *token);
    }
    if state.live(name, now).is_some() {
        return None;
    }
    let next = state.queue(name, now)?.pop_front()?;
    state.held.insert(
        Arc::clone(name),
        Entry {
            token: next.token,
            expires: next.expires,
        },
    );
    if state.fences.contains_key(&**name) {
        next_fence(state, name, true);
    }
    Some(next.ticket)
}

/// A shared lock (`permits` 0) or one permit of a semaphore.
fn shared(
    state: &mut State,
    name: &Arc<str>,
    token: &Token,
    ask: Ask,
    permits: u32,
    now: Instant,
) -> Attempt {
    if let Some(entry) = state.live(name, now) {
        if permits > 0 {
            return Attempt::mismatch(name, ask.mode, -1);
        }
        return Attempt::Held {
            index: 0,
            pttl: Some(entry.expires.saturating_duration_since(now)),
            ticket: None,
            announced: true,
        };
    }
    let mut ours = false;
    if let Some(group) = state.group(name, now) {
        if group.permits != permits {
            let theirs = i64::from(group.permits);
            return Attempt::mismatch(name, ask.mode, theirs);
        }
        ours = group.holders.contains_key(token);
        let refused = !ours
            && if permits > 0 {
                group.holders.len() >= permits as usize
            } else {
                group.writer_until.is_some()
            };
        if refused {
            // A writer's mark is worth asking again about when it runs out.
            let pttl = match group.writer_until {
                Some(w) if permits == 0 => Some(w.saturating_duration_since(now)),
                _ => group.first_expiry(now),
            };
            return Attempt::Held {
                index: 0,
                pttl,
                ticket: None,
                announced: true,
            };
        }
    }
    state
        .groups
        .entry(Arc::clone(name))
        .or_insert_with(|| Group {
            permits,
            holders: HashMap::new(),
            writer_until: None,
        })
        .holders
        .insert(token.clone(), until(now, ask.ttl));
    let fences = if ask.fencing {
        vec![next_fence(state, name, !ours)]
    } else {
        Vec::new()
    };
    Attempt::Acquired { fences }
}

/// Like Redis: a new counter starts from the clock in microseconds, so tokens still grow across
/// a restart of the process, and never below a counter a sweep dropped (`State::fence_floor`).
/// `bump` is false for a same-token retry, which answers the current value.
fn next_fence(state: &mut State, name: &str, bump: bool) -> u64 {
    let floor = state.fence_floor;
    let counter = match state.fences.get_mut(name) {
        Some(counter) => counter,
        None => state
            .fences
            .entry(name.into())
            .or_insert_with(|| clock_micros().max(floor)),
    };
    if bump {
        *counter += 1;
    }
    *counter
}

impl Node for MemoryNode {
    fn addr(&self) -> &str {
        "memory"
    }

    fn inspect<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<NodeHold>, NodeFailure>> {
        if let Err(failure) = self.injected(&[name]) {
            return Box::pin(std::future::ready(Err(failure)));
        }
        let now = Instant::now();
        let mut state = self.state();
        let queued = state.queue(name, now).map_or(0, |q| q.len());
        let held = match state.live(name, now) {
            Some(entry) => Some((entry.expires - now, 1, vec![entry.token.owner()])),
            None => state.held_group(name, now).map(|g| {
                let last = g.holders.values().max().copied().unwrap_or(now);
                let owners = g.holders.keys().map(Token::owner).collect();
                (last - now, g.holders.len(), owners)
            }),
        };
        let view = held.map(|(remaining, holders, owners)| NodeHold {
            remaining: Some(remaining),
            fencing_token: state.fences.get(name).copied(),
            holders,
            queued,
            owners,
        });
        Box::pin(std::future::ready(Ok(view)))
    }

    fn force_release<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let released = self.injected(&[name]).map(|()| self.delete(name));
        Box::pin(std::future::ready(released))
    }

    fn acquire<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        ask: Ask,
    ) -> BoxFuture<'a, Result<Attempt, NodeFailure>> {
        let attempt = self
            .injected(names)
            .map(|()| self.acquire_at_once(names, token, ask, Instant::now()));
        Box::pin(std::future::ready(attempt))
    }

    fn extend_many<'a>(&'a self, items: &'a [ExtendItem<'a>]) -> BoxFuture<'a, Vec<ExtendOutcome>> {
        let outcomes = items.iter().map(|item| self.extend_now(item)).collect();
        Box::pin(std::future::ready(outcomes))
    }

    fn release<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        mode: Mode,
        wake: bool,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let ours = self
            .injected(names)
            .map(|()| self.release_at_once(names, token, mode, wake, Instant::now()));
        Box::pin(std::future::ready(ours))
    }

    fn keep<'a>(
        &'a self,
        names: &'a [Arc<str>],
        token: &'a Token,
        left: Duration,
    ) -> BoxFuture<'a, Result<bool, NodeFailure>> {
        let ours = self
            .injected(names)
            .map(|()| self.keep_at_once(names, token, left, Instant::now()));
        Box::pin(std::future::ready(ours))
    }

    fn raise_fences<'a>(
        &'a self,
        names: &'a [Arc<str>],
        fences: &'a [u64],
    ) -> BoxFuture<'a, Result<(), NodeFailure>> {
        let mut state = self.state();
        for (name, fence) in names.iter().zip(fences) {
            let counter = next_fence(&mut state, name, false);
            if counter < *fence {
                state.fences.insert(Arc::clone(name), *fence);
            }
        }
        Box::pin(std::future::ready(Ok(())))
    }

    fn watch(&self, _name: &str, _own: Option<u64>) -> Subscription {
        // Releases notify the client's wake registry directly: nothing to set up.
        Subscription {
            confirmed: Box::pin(std::future::ready(true)),
            keep: None,
        }
    }

    fn at_once(&self) -> Option<&dyn AtOnce> {
        // Requests that answer at once cannot fail: while an outage is injected, every request
        // takes the full path, which can.
        #[cfg(feature = "testing")]
        if self.faults.as_ref().is_some_and(Faults::any_unavailable) {
            return None;
        }
        Some(self)
    }
}

/// A loss injected by [`Faults::lose`]: the key goes, as when it expires or is deleted.
#[cfg(feature = "testing")]
impl Target for MemoryNode {
    fn lose(&self, key: &str) -> bool {
        self.delete(key)
    }
}

impl AtOnce for MemoryNode {
    fn acquire_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        ask: Ask,
        now: Instant,
    ) -> Attempt {
        let mut state = self.state();
        state.sweep(now);
        match ask.mode {
            Mode::Exclusive => exclusive(&mut state, names, token, ask, now),
            Mode::Fair => fair(&mut state, &names[0], token, ask, now),
            Mode::Shared => shared(&mut state, &names[0], token, ask, 0, now),
            Mode::Permits(n) => shared(&mut state, &names[0], token, ask, n, now),
        }
    }

    fn release_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        mode: Mode,
        wake: bool,
        now: Instant,
    ) -> bool {
        let mut released = Vec::with_capacity(names.len());
        // A fair lock handed to its next waiter: wake that one alone.
        let mut handed = None;
        {
            let mut state = self.state();
            match mode {
                Mode::Shared | Mode::Permits(_) => {
                    let name = &names[0];
                    let lease = state
                        .groups
                        .get_mut(&**name)
                        .and_then(|g| g.holders.remove(token));
                    // Drops the group if nothing is left of it.
                    state.group(name, now);
                    if lease.is_some_and(|expires| expires > now) {
                        released.push(name);
                    }
                }
                Mode::Exclusive | Mode::Fair => {
                    for name in names {
                        if state
                            .live(name, now)
                            .is_some_and(|entry| entry.token == *token)
                        {
                            state.held.remove(&**name);
                            released.push(name);
                        }
                    }
                }
            }
            if mode == Mode::Fair {
                handed = hand_over(&mut state, &names[0], token, now);
            }
        }
        match handed {
            Some(ticket) => self.wakers.notify_for(&names[0], ticket, None),
            None if wake || mode == Mode::Fair => {
                for name in &released {
                    self.wakers.notify(name);
                }
            }
            None => {}
        }
        released.len() == names.len()
    }

    fn keep_at_once(
        &self,
        names: &[Arc<str>],
        token: &Token,
        left: Duration,
        now: Instant,
    ) -> bool {
        // Nobody is woken: the key is not free; waiters retry when it expires (their pause is
        // capped by its time to live).
        expire_in(&mut self.state(), names, token, left, now).is_ok()
    }
}

fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A service that locks a name per request leaves no fence counter per name behind: a sweep
    /// drops the counters of names nobody holds, keeps a held name's, and a dropped name's next
    /// token is still larger than its last.
    #[test]
    fn the_fence_counters_of_let_go_names_are_swept_and_their_tokens_still_grow() {
        let mut state = State::default();
        let now = Instant::now();
        let held: Arc<str> = Arc::from("held");
        let token = Token::new(&crate::owner::Identity::new(None), now);
        state.held.insert(
            Arc::clone(&held),
            Entry {
                token,
                expires: now + Duration::from_secs(60),
            },
        );
        let held_fence = next_fence(&mut state, &held, true);
        // A token far ahead of the clock, as a counter raised by a clock step leaves it.
        let first = "name:0";
        let ahead = clock_micros() + 3_600_000_000;
        state.fences.insert(Arc::from(first), ahead);
        for i in 1..10_000 {
            next_fence(&mut state, &format!("name:{i}"), true);
            state.sweep(now);
        }
        assert!(
            state.fences.len() <= 2 * 512,
            "swept: {} counters left",
            state.fences.len()
        );
        assert_eq!(
            state.fences.get(&held).copied(),
            Some(held_fence),
            "the held name keeps its counter"
        );
        assert!(
            !state.fences.contains_key(first),
            "the let-go name's counter was swept"
        );
        let again = next_fence(&mut state, first, true);
        assert!(
            again > ahead,
            "its next token {again} is larger than its last {ahead}"
        );
    }
}
